"""The manifest: everything needed to read an index and to check it against an encoder."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from regis.errors import IndexFormatError
from regis.indexes.layout import MANIFEST_FILE
from regis.models.config import EncoderConfig, WeightsInfo

FORMAT_VERSION = 1


class SegmentInfo(BaseModel):
    """One immutable token segment: ``rows`` images x T tokens x D float16 values."""

    model_config = ConfigDict(frozen=True)

    file: str
    rows: int


class FaissInfo(BaseModel):
    """The FAISS token index: its factory spec (metric inner product), size and default search depth.

    Attributes:
        spec: FAISS index_factory string ("Flat", "IVF1024,Flat", "IVF4096,SQ8", ...).
        ntotal: token vectors in the index (live images x T).
        nprobe: default IVF lists probed per query token (search calls may pass another).
        auto: True when regis chose the spec from the collection size (it may change it as the index grows).
        depth: default candidate depth k' (FAISS neighbours per query token) of an ANN search; 64 in indexes
            written before it was recorded.
        candidates: candidate method of an ANN search (``regis.retrieve.candidates``): "bounded" (default, also
            for indexes written before it was recorded: it needs nothing new on disk) or "depth" (before issue 15).
        k_factor: FAISS returns ``k_factor x depth`` neighbours per query token, and the compressed token store's
            codes re-rank them to the best ``depth`` (``Searcher``): for FAISS codes coarser than the store's
            (``faiss_index.default_k_factor``). 1 (FAISS's own similarities) in indexes written before it was recorded.
        codec: the vector codec regis sizes an auto spec with (``IndexWriter(faiss_codec=)``, e.g. ``PQ32x4fsr`` for
            the compact layout), kept while the index is still ``Flat``; None: the codec of the spec it grew into,
            else ``faiss_index.default_codec``.
    """

    spec: str
    ntotal: int
    nprobe: int = 32
    auto: bool = True
    depth: int = 64
    candidates: Literal["depth", "bounded"] = "bounded"
    k_factor: int = Field(default=1, ge=1)
    codec: str | None = None


class TokenStoreInfo(BaseModel):
    """What the ANN rerank reads: the float16 segments, or FAISS codes of them (``regis.indexes.codes``).

    Attributes:
        spec: "float16", or the FAISS codec spec of the compressed store ("SQ4", "PQ96", "OPQ96,PQ96", "SQ8", ...).
        code_size: bytes per token of the codes (None for float16).
        refine: compressed store: at least the best ``refine x k`` candidates by their codes are re-scored exactly
            on the float16 tokens (``regis.retrieve.searcher``); 4 in indexes written before it was recorded.
        refine_share: compressed store: and at least this share (0..1) of the query's candidates, so that the
            re-scored rows follow the candidate count as the collection grows (``Searcher.refine_rows``); 0.0 in
            indexes written before it was recorded (they re-score ``refine x k`` at every size).
        rule: "compact" when regis picks ``spec`` by the collection's size at every write
            (``regis.indexes.codes.compact_store``), else None (the spec stays as written).
    """

    spec: str = "float16"
    code_size: int | None = None
    refine: int = 4
    refine_share: float = Field(default=0.0, ge=0.0, le=1.0)
    rule: Literal["compact"] | None = None


class BuddyInfo(BaseModel):
    """Each image's buddy patches (``buddies.npy``): where its ROI tokens' windows lie, for match explanations.

    Attributes:
        file: the array's file name in the version directory: int16 (next_id, R + 1), row = image id, column =
            cue (0 = CLS, 1..R = registers), value = row-major patch index on ``grid``, -1 where unknown (an
            image written by a caller that gave no buddies, a deleted id).
        grid: (h, w), the encoder's patch grid the indices refer to.
    """

    model_config = ConfigDict(frozen=True)

    file: str
    grid: tuple[int, int]


class Manifest(BaseModel):
    """Index manifest (``manifest.json`` of a version directory).

    Attributes:
        format_version: on-disk format version (``FORMAT_VERSION``).
        version: index version number, +1 per committed change.
        parent_version: the version this one was derived from, None for the first.
        created_at: ISO-8601 UTC creation time.
        encoder: the encoder configuration (backbone, R, N, image size, normalisation, D, token set).
        weights: weights source and SHA-256 checksum.
        tokens_per_image: T.
        dim: D.
        token_dtype: dtype of the stored tokens ("float16").
        faiss: the token index.
        num_images: live images.
        next_id: the next image id to hand out (ids are never reused).
        segments: token segments referenced by ``locations.npy``.
        images_root: absolute path of the indexed folder (None for an index fed only by uploads).
        token_store: the store the ANN rerank reads (float16 segments unless a compressed one was asked for).
        buddies: the images' buddy patches (None in versions written before they were stored).
    """

    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    version: int
    parent_version: int | None = None
    created_at: str
    encoder: EncoderConfig
    weights: WeightsInfo
    tokens_per_image: int
    dim: int
    token_dtype: str = "float16"
    faiss: FaissInfo
    num_images: int
    next_id: int
    segments: list[SegmentInfo]
    images_root: str | None = None
    token_store: TokenStoreInfo = TokenStoreInfo()
    buddies: BuddyInfo | None = None

    @staticmethod
    def now() -> str:
        """Current UTC time, ISO-8601 with seconds."""
        return datetime.now(timezone.utc).isoformat(timespec="seconds")

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return json.loads(self.model_dump_json())


def read_manifest(version_dir: Path) -> Manifest:
    """Read and validate ``manifest.json`` of a version directory.

    Raises:
        IndexFormatError: missing, unparsable, or of another format version.
    """
    path = Path(version_dir) / MANIFEST_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{path} is missing: not a regis index version") from exc
    except json.JSONDecodeError as exc:
        raise IndexFormatError(f"{path} is not valid JSON") from exc
    if raw.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path} has format version {raw.get('format_version')!r}; this regis reads version {FORMAT_VERSION}"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise IndexFormatError(f"{path} is not a valid manifest: {exc.error_count()} invalid fields") from exc
