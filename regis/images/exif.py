"""File facts for the image table's metadata: EXIF capture date and camera, read from the header only."""

from __future__ import annotations

import io
from pathlib import PurePosixPath

FACTS_KEY = "file"  # an image record's metadata holds the file facts under this key (a build adds them)
_DATETIME_ORIGINAL = 0x9003
_SUBSEC_ORIGINAL = 0x9291
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


def _subsec(value) -> str:
    """EXIF sub-seconds ("120", "05 ") -> their digits ("120"; "" when absent or not digits)."""
    text = _text(value)
    return text[:9] if text and text.isdigit() else ""


def exif_facts(data: bytes) -> dict:
    """File facts from an image's EXIF, keys only where present:

    - ``taken_at``: ISO-8601 capture time (DateTimeOriginal, else the file's DateTime), to the second;
    - ``captured_at``: the exposure, DateTimeOriginal with its sub-seconds (SubSecTimeOriginal) when the camera
      wrote them ("2024-05-01T10:00:00.120"); absent without DateTimeOriginal (an editor's DateTime says when a
      file was changed, not which exposure it shows). Two images with different ``captured_at`` are two shots
      (``regis.duplicates``: never edited copies of one photo);
    - ``camera``: "Make Model".

    Never raises: an image without (or with broken) EXIF gives {}.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            exif = img.getexif()
            if not exif:
                return {}
            sub = exif.get_ifd(_EXIF_IFD)
            original = _iso_date(sub.get(_DATETIME_ORIGINAL))
            taken = original or _iso_date(exif.get(_DATETIME))
            subsec = _subsec(sub.get(_SUBSEC_ORIGINAL))
            make, model = _text(exif.get(_MAKE)), _text(exif.get(_MODEL))
    except Exception:  # any malformed header: no facts
        return {}
    out = {}
    if taken:
        out["taken_at"] = taken
    if original:
        out["captured_at"] = f"{original}.{subsec}" if subsec else original
    if model and make and not model.lower().startswith(make.lower().split()[0]):
        out["camera"] = f"{make} {model}"
    elif model or make:
        out["camera"] = model or make
    return out


def captured_at(metadata: dict) -> str | None:
    """An image record's ``captured_at`` file fact (``exif_facts``), None when it has none."""
    facts = metadata.get(FACTS_KEY) if isinstance(metadata, dict) else None
    value = facts.get("captured_at") if isinstance(facts, dict) else None
    return value if isinstance(value, str) else None


def path_facts(path: str) -> dict:
    """{"folder", "name", "ext"} of an image table path ("trips/2024/a.JPG" -> "trips/2024", "a.JPG", "jpg")."""
    p = PurePosixPath(path)
    folder = p.parent.as_posix()
    return {"folder": "" if folder == "." else folder, "name": p.name, "ext": p.suffix.lower().lstrip(".")}
