"""The JSON values regis stores and queries: image metadata and the values in metadata filters.

One check for both (``check_value``), so the store never holds a value its own queries cannot read and a
filter never sends SQLite a value it cannot bind:

- numbers: integers within 64 bits (SQLite INTEGER, -2**63 .. 2**63 - 1), floats finite (no NaN, no
  Infinity: ``json.dumps`` writes them as bare ``NaN``, which SQLite's JSON functions refuse, and a response
  cannot carry them);
- strings (object keys too): valid Unicode, i.e. no lone surrogate such as ``"\\ud800"`` (it cannot be encoded
  as UTF-8, so no response holding it could be sent);
- nesting: at most ``MAX_DEPTH`` (32) levels of objects and arrays (deeper values overflow recursive code:
  ``copy.deepcopy``, JSON encoders);
- size: at most ``max_bytes`` of compact UTF-8 JSON.

Errors name the path of the first bad value (``metadata.album[2].n``), so a client knows what to fix.
``loads`` parses JSON text under the same rules, refusing text nested too deep before ``json.loads`` recurses.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from regis.errors import ConfigError

MAX_DEPTH = 32  # levels of objects / arrays
MAX_METADATA_BYTES = 64 * 1024  # one image's user metadata, compact UTF-8 JSON
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]")


class InvalidValueError(ConfigError):
    """A JSON value regis does not store or query; ``path`` names it (``metadata.a[2]``)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def key_path(path: str, key: str) -> str:
    """``path.key``, or ``path["key"]`` (JSON-escaped: ASCII, whatever the key holds) for a key that is not a plain
    name."""
    return f"{path}.{key}" if _IDENTIFIER.match(key) else f"{path}[{json.dumps(key)}]"


def _short(path: str, limit: int = 200) -> str:
    return path if len(path) <= limit else f"{path[:limit // 2]}...{path[-limit // 2:]}"


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_scalar(value: Any, path: str) -> Any:
    """``value`` if it is a scalar regis stores and queries: null, a boolean, an integer within 64 bits, a finite
    float or a string of valid Unicode.

    Raises:
        InvalidValueError: anything else (the message names ``path``).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise InvalidValueError(f"{_short(path)}: integers must fit in 64 bits (-2^63 to 2^63-1)", path)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidValueError(f"{_short(path)}: numbers must be finite (not NaN or Infinity)", path)
        return value
    if isinstance(value, str):
        if not _valid_text(value):
            raise InvalidValueError(f"{_short(path)}: strings must be valid Unicode (a lone surrogate such as "
                                    "\\ud800 is not)", path)
        return value
    raise InvalidValueError(f"{_short(path)}: {type(value).__name__} is not a JSON value", path)


def check_value(value: Any, path: str = "$", max_depth: int = MAX_DEPTH, max_bytes: int | None = None) -> Any:
    """``value`` if it is a JSON value regis stores and queries (module docstring); walked without recursion, so
    a value nested thousands deep is refused, not a ``RecursionError``.

    Args:
        value: a JSON value as ``json.loads`` returns it (dict, list, str, int, float, bool, None).
        path: the name of ``value`` in messages (``metadata``, ``filter``).
        max_depth: levels of objects and arrays allowed.
        max_bytes: size allowed as compact UTF-8 JSON, bytes (None: no limit).

    Raises:
        InvalidValueError: the first bad value, by path.
    """
    stack = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= max_depth:
                raise InvalidValueError(f"{_short(where)}: nested deeper than {max_depth} levels", where)
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise InvalidValueError(f"{_short(where)}: object keys must be strings", where)
                    child_path = key_path(where, key)
                    if not _valid_text(key):
                        raise InvalidValueError(f"{_short(where)}: object keys must be valid Unicode (a lone "
                                                "surrogate such as \\ud800 is not)", where)
                    stack.append((child, child_path, depth + 1))
            else:
                stack.extend((child, f"{where}[{n}]", depth + 1) for n, child in enumerate(item))
        else:
            check_scalar(item, where)
    if max_bytes is not None:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        if size > max_bytes:
            raise InvalidValueError(f"{path} is larger than {max_bytes:,} bytes as JSON ({size:,})", path)
    return value


def nesting(text: str) -> int:
    """The deepest nesting of objects and arrays in JSON text (brackets inside strings do not count), computed
    without parsing it."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for ch in brackets:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads(text: str | bytes, path: str = "$", max_depth: int = MAX_DEPTH, max_bytes: int | None = None) -> Any:
    """Parse JSON text and ``check_value`` the result; text nested deeper than ``max_depth`` is refused before
    ``json.loads`` sees it.

    Raises:
        InvalidValueError: not valid JSON, too large, too deep, or a value ``check_value`` refuses.
    """
    if isinstance(text, bytes):
        if max_bytes is not None and len(text) > max_bytes:
            raise InvalidValueError(f"{path} is larger than {max_bytes:,} bytes", path)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidValueError(f"{path} is not UTF-8 text", path) from None
    elif max_bytes is not None and len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise InvalidValueError(f"{path} is larger than {max_bytes:,} bytes", path)
    if nesting(text) > max_depth:
        raise InvalidValueError(f"{path} is nested deeper than {max_depth} levels", path)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: cannot happen after the nesting check; kept as a guard
        raise InvalidValueError(f"{path} is not valid JSON", path) from None
    return check_value(value, path, max_depth, max_bytes)

