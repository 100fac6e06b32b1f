"""Sharded collections: one collection split into S shards by image id, each shard an ordinary regis index
(same manifest, versions and atomic swap). ``layout``: the collection file and the id rule; ``write``: a
transaction over every shard; ``search``: fan-out of the query tokens to every shard and the exact merge of their
MaxSim top-k.
"""
