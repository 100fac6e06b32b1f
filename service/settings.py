"""Service settings: environment variables prefixed ``REGIS_`` (or constructor arguments); bad values are refused."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Configuration of the regis service.

    Attributes:
        index_dir: the index to serve (REGIS_INDEX_DIR).
        weights: weights path overriding the index manifest's file source (same checksum required).
        device: torch device for encoding and rerank.
        images_root: folder the index's relative paths resolve against (default: the manifest's).
        max_upload_bytes: largest accepted upload, bytes.
        max_pixels: largest accepted image, pixels (decompression-bomb guard).
        default_k, max_k: results per query by default and at most.
        default_depth, max_depth: candidate depth k' (FAISS neighbours per query token) by default (None: the index
            manifest's tuned default) and at most.
        torch_threads: torch intra-op threads (None: torch's default).
    """

    model_config = SettingsConfigDict(env_prefix="REGIS_", extra="ignore")

    index_dir: Path
    weights: Path | None = None
    device: str = "cpu"
    images_root: Path | None = None
    max_upload_bytes: int = Field(default=20 * 1024 * 1024, ge=1024, le=1024**3)
    max_pixels: int = Field(default=64_000_000, ge=10_000)
    default_k: int = Field(default=10, ge=1, le=1000)
    max_k: int = Field(default=100, ge=1, le=1000)
    default_depth: int | None = Field(default=None, ge=1, le=4096)
    max_depth: int = Field(default=1024, ge=1, le=4096)
    torch_threads: int | None = Field(default=None, ge=1)

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v != "cpu" and not v.startswith("cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {v!r}")
        return v

    @field_validator("max_k")
    @classmethod
    def _max_k(cls, v: int, info) -> int:
        default = info.data.get("default_k", 10)
        if v < default:
            raise ValueError(f"max_k ({v}) must be >= default_k ({default})")
        return v
