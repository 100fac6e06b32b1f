"""File facts for the image table's metadata: EXIF capture date and camera, read from the header only."""

from __future__ import annotations

import io
from pathlib import PurePosixPath

_DATETIME_ORIGINAL = 0x9003
_DATETIME = 0x0132
_MAKE = 0x010F
_MODEL = 0x0110
_EXIF_IFD = 0x8769


def _text(value) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    value = value.strip("\x00 ").strip()
    return value[:200] or None


def _iso_date(value) -> str | None:
    """EXIF "YYYY:MM:DD HH:MM:SS" -> ISO-8601 "YYYY-MM-DDTHH:MM:SS" (None if it is not that)."""
    text = _text(value)
    if text is None or len(text) < 19 or text[4] != ":" or text[7] != ":":
        return None
    date, time = text[:10].replace(":", "-"), text[11:19]
    if not (date.replace("-", "").isdigit() and time.replace(":", "").isdigit()) or date.startswith("0000"):
        return None
    return f"{date}T{time}"


def exif_facts(data: bytes) -> dict:
    """{"taken_at": ISO-8601 capture time, "camera": "Make Model"} from an image's EXIF, keys only where present.

    Never raises: an image without (or with broken) EXIF gives {}.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            exif = img.getexif()
            if not exif:
                return {}
            sub = exif.get_ifd(_EXIF_IFD)
            taken = _iso_date(sub.get(_DATETIME_ORIGINAL)) or _iso_date(exif.get(_DATETIME))
            make, model = _text(exif.get(_MAKE)), _text(exif.get(_MODEL))
    except Exception:  # any malformed header: no facts
        return {}
    out = {}
    if taken:
        out["taken_at"] = taken
    if model and make and not model.lower().startswith(make.lower().split()[0]):
        out["camera"] = f"{make} {model}"
    elif model or make:
        out["camera"] = model or make
    return out


def path_facts(path: str) -> dict:
    """{"folder", "name", "ext"} of an image table path ("trips/2024/a.JPG" -> "trips/2024", "a.JPG", "jpg")."""
    p = PurePosixPath(path)
    folder = p.parent.as_posix()
    return {"folder": "" if folder == "." else folder, "name": p.name, "ext": p.suffix.lower().lstrip(".")}
