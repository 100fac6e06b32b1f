"""Validated setting types shared by the service's and the worker's pydantic settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator

from regis.errors import ConfigError


def _check_device(value: str) -> str:
    if value != "cpu" and not value.startswith("cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {value!r}")
    return value


def _check_redis_url(value: str) -> str:
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("must be a redis://, rediss:// or unix:// URL")
    return value


def _check_redis_prefix(value: str) -> str:
    from regis.jobs.names import check_prefix

    try:
        return check_prefix(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


TorchDevice = Annotated[str, AfterValidator(_check_device)]
"""A torch device name: "cpu" or "cuda[:N]"."""

RedisURL = Annotated[str, AfterValidator(_check_redis_url)]
"""A redis://, rediss:// or unix:// URL."""

RedisPrefix = Annotated[str, AfterValidator(_check_redis_prefix)]
"""The prefix of every Redis key, queue and channel of one deployment (``regis.jobs.names.check_prefix``)."""

QueryRuntime = Literal["auto", "onnx", "torch"]
# the encoder's frame and query layout (``regis.models.encoder.FRAMES``, ``QUERY_LAYOUTS``) as settings and fields
FrameName = Literal["center-crop", "squash", "pad", "aspect", "center-crop+aspect"]
QueryLayoutName = Literal["tokens", "tokens+roi-cues"]
"""How CNN queries are encoded on CPU (``regis.models.inference``): ONNX Runtime when installed ("auto"), ONNX
Runtime ("onnx") or the folded torch copy ("torch")."""
# a collection's index layout (``regis.indexes.collections.CollectionConfig.layout``; docs/SCALE.md section 0)
IndexLayoutName = Literal["default", "compact"]
