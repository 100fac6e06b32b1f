"""Response models of the HTTP API (they also document it in the OpenAPI page)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from regis.api.explain import Explanation, QueryTokens
from regis.jobs.model import JobInfo
from regis.settings_types import FrameName, IndexLayoutName, QueryLayoutName


class SearchHit(BaseModel):
    """One ranked image."""

    rank: int = Field(description="1-based rank")
    id: int = Field(description="stable image id")
    score: float = Field(description="MaxSim score: sum over the query tokens of their best cosine, at most the "
                                       "answer's max_score (the better framing's MaxSim over its m / 2 query "
                                       "tokens on an index of two framings scored apart: 15 for new CNN "
                                       "indexes; else all m: 10 for single-framing ones)")
    path: str | None = Field(description="path relative to the indexed folder")
    width: int | None = None
    height: int | None = None
    metadata: dict = Field(default_factory=dict)
    explanation: Explanation | None = Field(
        default=None, description="with explain=true: the score term by term, which result token each query "
                                  "token matched and where (null otherwise)")


class Timings(BaseModel):
    """Per-stage wall time of one query, milliseconds (with explain=true also ``explain``: building the
    explanations)."""

    model_config = ConfigDict(extra="allow")

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
    max_score: float | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the score of a perfect match (an identical image): the query's tokens per scored framing, "
                    "m / 2 on an index of two framings with framing_score best (15 for new CNN indexes; 10 for "
                    "/similar, which queries with the 20 stored tokens), else all m query tokens "
                    "(regis.scores.framings.perfect_score). A result's similarity is score / max_score (1 for an "
                    "identical image). Absent from an answer with no published index (no encoder config to read)")
    results: list[SearchHit]
    query: QueryTokens | None = Field(default=None, description="with explain=true: the query's tokens and the "
                                                                "boxes of its ROI tokens (null otherwise)")
    timings_ms: Timings
    partial: bool | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="sharded collections only, and only when shards did not answer in time with "
                    "REGIS_RAY_ON_MISSING_SHARDS=partial: true, and the images of `missing_shards` are absent from "
                    "the ranking (by default such a query is a 503 shards_unavailable instead); absent otherwise")
    missing_shards: list[int] | None = Field(default=None, exclude_if=lambda v: v is None,
                                             description="with partial: the shards that did not answer")




class Health(BaseModel):
    """Liveness and what is being served (the last three only with keys off or a valid key)."""

    status: str
    index_version: int | None = None
    images: int | None = None
    backbone: str | None = None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every 4xx/5xx response has this body."""

    error: ErrorDetail


class ShardState(BaseModel):
    """One shard of a sharded collection as served: its index version, image count and whether it answers."""

    shard: int
    version: int | None
    images: int
    state: str = Field(description='"ok", "unavailable" (did not answer; images: its last count) or "unknown"')


class Readiness(BaseModel):
    """Readiness: ``checks`` says what is ok and what is missing (``index``, ``shards`` for a sharded collection,
    ``redis`` when configured); ``images``: the image count served; ``shards``: each shard's state."""

    ready: bool
    index_version: int | None
    checks: dict[str, str]
    images: int | None = None
    shards: list[ShardState] | None = None
    error: ErrorDetail | None = None


# "" or "." (the root), or a path none of whose parts starts with "." (hidden folders and ".." are refused).
VISIBLE_FOLDER = r"^\s*(?:\.\s*|(?!\.)(?![^\x00]*/\.)[^\x00]*)$"


class IndexJobRequest(BaseModel):
    """A folder to index, relative to the service's images root ("" or "." = the root itself)."""

    folder: str = Field(
        default="", max_length=4096, json_schema_extra={"pattern": VISIBLE_FOLDER},  # checked by resolve_folder
        description="folder under the images root, e.g. 'cats/2024'; no hidden names (starting with '.'), no '..'",
    )


class JobList(BaseModel):
    """Recent jobs, newest first."""

    jobs: list[JobInfo]


class UploadedImage(BaseModel):
    """What became of one uploaded file."""

    filename: str
    sha256: str = Field(description="SHA-256 of the file's bytes: the same bytes are one image")
    id: int | None = Field(default=None, description="image id (None while pending, or when skipped)")
    status: str = Field(description="added, exists (same bytes already indexed), skipped, or pending")
    reason: str | None = None


class UploadResponse(BaseModel):
    """The result of POST /v1/images: 201 once indexed, 202 while the job is still running."""

    job_id: str
    state: str
    index_version: int | None = Field(description="the version that answers searches now")
    images: list[UploadedImage]


class DeleteResponse(BaseModel):
    """The result of DELETE /v1/images/{id}: 200 once removed, 202 while the job is still running."""

    id: int
    job_id: str
    state: str
    deleted: bool
    index_version: int | None


class CollectionCreate(BaseModel):
    """A new collection: its name and the encoder it embeds with."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", description="a-z, 0-9, '_', '-'; 1-63 characters")
    backbone: str | None = Field(default=None, max_length=100,
                                 description="registered backbone (GET /docs: regis backbones); default "
                                             "efficientnet-lite0-regis (EfficientNet-Lite0 + regis's trained "
                                             "token head, 256-d tokens)")
    random_init: bool = Field(default=False, description="random weights (tests only)")
    frame: FrameName | None = Field(
        default=None, description="how an image becomes the encoder's input: center-crop (the central square; the "
                                  "default for ViTs), pad, squash, aspect (CNNs: the whole image, aspect ratio kept; "
                                  "ViTs: pad), or center-crop+aspect (the default for CNNs: both framings' tokens "
                                  "per image, each image scored by its better framing; twice the tokens and encoder "
                                  "time). The index records it; its queries use it.")
    query_layout: QueryLayoutName | None = Field(
        default=None, description="a query's tokens: tokens (the indexed ones) or tokens+roi-cues (CNN with a ROI "
                                  "pass; the default for new CNN collections). The index records it.")
    description: str = Field(default="", max_length=1000)
    layout: IndexLayoutName = Field(
        default="default", description="how the index is stored: default (~4 KB resident per image at 256-d) or "
                                       "compact (~1.1-1.2 KB per image, lower recall: FAISS codes of D/16 bytes "
                                       "per token and a compact rerank store, as regis index build --compact; "
                                       "docs/SCALE.md section 0). Fixed when the collection is created.")


class CollectionInfo(BaseModel):
    """A collection as the service sees it."""

    name: str
    default: bool = Field(description="the collection the routes without /collections/{name} answer for")
    loaded: bool = Field(description="its index is open in this service")
    index_version: int | None
    images: int
    backbone: str | None
    layout: IndexLayoutName = Field(default="default", description="its index layout (POST /v1/collections)")
    config: dict = Field(default_factory=dict)


class CollectionList(BaseModel):
    """Every collection of the deployment."""

    collections: list[CollectionInfo]


class ImageRow(BaseModel):
    """An indexed image's table row (as GET /v1/images/{id}, without the index version)."""

    id: int
    path: str
    sha256: str
    width: int
    height: int
    bytes: int
    mtime: float
    metadata: dict = Field(default_factory=dict)


class ImageInfo(ImageRow):
    """An indexed image's table row, with the index version that answered."""

    index_version: int


class ImageList(BaseModel):
    """A page of GET /v1/images."""

    index_version: int
    total: int = Field(description="images matching the filter (all images without one)")
    offset: int
    limit: int
    images: list[ImageRow]


class MetadataPatchResponse(BaseModel):
    """The result of PATCH /v1/images/{id}: 200 once the new version is served, 202 while the job runs."""

    id: int
    job_id: str
    state: str
    index_version: int | None
    metadata: dict | None = None


class BatchSearchResponse(BaseModel):
    """Results of several query images, in the order they were sent."""

    results: list[SearchResponse]
