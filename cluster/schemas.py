"""Response of the Ray ingress: the ``regis serve`` search response plus what a sharded answer adds."""

from __future__ import annotations

from pydantic import Field

from service.schemas import SearchResponse


class ShardedSearchResponse(SearchResponse):
    """Ranked results of a query over a sharded collection (``index_version``: the highest shard version)."""

    partial: bool = Field(default=False, description="true when some shards did not answer in time (their images "
                                                     "are missing from the ranking); only with "
                                                     "REGIS_RAY_ON_MISSING_SHARDS=partial, else such a query is a 503")
    missing_shards: list[int] = Field(default_factory=list, description="shards that did not answer")
    shard_versions: list[int | None] = Field(default_factory=list, description="index version of each shard")
