"""regis on Ray (optional extra: ``pip install 'regis[ray]'``): ``serve`` (Ray Serve application: encoder
deployment with ``@serve.batch``, one deployment per shard, REST ingress with the API of ``regis serve``),
``build`` (Ray Data indexing of a folder into a sharded collection), ``local`` (a local Ray cluster for tests
and benchmarks), ``settings``. Nothing here is imported by the layers below; importing this package does not
import Ray."""
