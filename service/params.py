"""Typed request parameters shared by routes: what the OpenAPI schema promises is exactly what is accepted."""

from __future__ import annotations

from typing import Annotated

from fastapi import Form, Path
from pydantic import BeforeValidator

MAX_IMAGE_ID = 2**63 - 1  # image ids are SQLite INTEGERs (signed 64-bit)


def _decimal_digits(value: object) -> object:
    """Refuse anything but plain decimal digits in a path segment ("1.0", "+1", " 1", "1e3", "١" included):
    pydantic's lax int parsing would turn "1.0" into 1, and ``DELETE /v1/images/1.0`` must not delete image 1."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be a non-negative decimal integer")
    return value


ImageId = Annotated[
    int,
    Path(ge=0, le=MAX_IMAGE_ID, description="image id: a non-negative 64-bit integer"),
    BeforeValidator(_decimal_digits),
]
ImageIdForm = Annotated[
    int,
    Form(ge=0, le=MAX_IMAGE_ID, description="image id: a non-negative 64-bit integer"),
    BeforeValidator(_decimal_digits),
]
"""An image id in a form field (POST /v1/explain's ``id``): the same digits-only rule as ``ImageId``, so
``id=1.0`` is refused rather than read as 1."""
