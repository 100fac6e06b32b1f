"""Response models of the HTTP API (they also document it in the OpenAPI page)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SearchHit(BaseModel):
    """One ranked image."""

    rank: int = Field(description="1-based rank")
    id: int = Field(description="stable image id")
    score: float = Field(description="MaxSim score: sum over query tokens of the best cosine, in [-T, T]")
    path: str | None = Field(description="path relative to the indexed folder")
    width: int | None = None
    height: int | None = None
    metadata: dict = Field(default_factory=dict)


class Timings(BaseModel):
    """Per-stage wall time of one query, milliseconds."""

    decode: float
    encode: float
    candidates: float
    rerank: float
    total: float


class SearchResponse(BaseModel):
    """Ranked results of a query-by-image."""

    index_version: int
    mode: str
    k: int
    depth: int
    num_candidates: int = Field(description="images scored exactly with MaxSim")
    results: list[SearchHit]
    timings_ms: Timings


class ImageInfo(BaseModel):
    """An indexed image's table row."""

    id: int
    path: str
    sha256: str
    width: int
    height: int
    bytes: int
    mtime: float
    metadata: dict = Field(default_factory=dict)
    index_version: int


class Health(BaseModel):
    """Liveness and what is being served."""

    status: str
    index_version: int | None
    images: int | None
    backbone: str | None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every 4xx/5xx response has this body."""

    error: ErrorDetail
