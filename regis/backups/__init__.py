"""Snapshots of an index or a sharded collection: one published state as a tar file (``snapshot``), taken while
writes go on, and a new index or collection from one (``restore``)."""
