"""Indexing jobs shared by the service (which submits them) and the worker (which runs them).

- ``regis.jobs.model``: the job spec and the job state clients see (``JobSpec``, ``JobInfo``).
- ``regis.jobs.names``: Redis key, queue and pub/sub channel names (``RedisNames``).
- ``regis.jobs.folders``: checking a requested folder against the allowed images root.
- ``regis.jobs.local``: the embedded queue (a background thread of the API, no Redis).
- ``regis.jobs.rq_queue``: the Redis queue (RQ), used by the API and by ``regis worker``.
- ``regis.jobs.cache``: the query-result cache in Redis.

Nothing here imports torch; the RQ and redis imports happen in the modules that need them.
"""
