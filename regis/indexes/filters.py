"""Metadata filters: a small JSON filter language compiled to a SQL ``WHERE`` clause on the image table.

A filter is a JSON object. Each key names a field, each value a condition; several keys must all hold::

    {"album": "trip"}                              equality (strings, numbers, booleans)
    {"year": {"gte": 2020, "lt": 2024}}            ranges: gt, gte, lt, lte (numbers or ISO date strings)
    {"camera": {"in": ["X100V", "GR III"]}}        one of a list (at most 1000 values); on a list-valued field:
                                                   a member is one of them
    {"people": {"contains": "Eileen Collins"}}     a list-valued field has this member (a list: all of them;
                                                   a field holding one value: that value)
    {"album": {"ne": "work"}}                      not equal (images without the field match too)
    {"gps": {"exists": true}}                      the field is present (false: absent)
    {"or": [{"album": "trip"}, {"year": 2023}]}    any of; "and": all of; "not": negation

Fields: the image table's columns ``id``, ``path``, ``sha256``, ``width``, ``height``, ``bytes`` (alias
``size``), ``mtime`` (seconds since the epoch); anything else is a key of the image's JSON metadata, with dots
for nesting (``file.camera``, ``file.taken_at``, ``file.folder``, ``file.ext``: the file facts a build records).
SQLite evaluates it (JSON1 ``json_extract`` / ``json_type`` / ``json_each``), so no Python loop runs over rows. A
string of the form ``key:value[,key:value...]`` is accepted as a shorthand for equalities (values parsed as JSON
when they are, else strings).

A metadata field that no image of the index has is an error (``UnknownFieldError``: a misspelt field would
otherwise match nothing, silently), unless the filter says ``"strict": false`` at its top level
(``filter_options``; ``check_fields`` does the check against a table).

Values are checked as stored metadata is (``regis.indexes.json_values``): integers within 64 bits, finite
numbers, valid Unicode, bounded nesting; anything else is a ``ConfigError`` naming the value's path, never an
error out of SQLite.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from typing import Any, Protocol

from regis.errors import ConfigError
from regis.indexes import json_values

COLUMNS = {"id": "id", "path": "path", "sha256": "sha256", "width": "width", "height": "height", "bytes": "bytes",
           "size": "bytes", "mtime": "mtime"}
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,63}){0,7}$")
_RANGE_OPS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_OPS = {*_RANGE_OPS, "eq", "ne", "in", "contains", "exists"}
STRICT_KEY = "strict"  # top-level option, not a field: false lets fields no image has match nothing
_LOGIC = ("and", "or", "not")
MAX_IN = 1000
MAX_DEPTH = 8
MAX_CONDITIONS = 64


def parse_filter(text: str | None) -> dict | None:
    """A filter from its query-string form: JSON, or the ``key:value,key:value`` shorthand; None if empty.

    Raises:
        ConfigError: neither valid JSON object nor shorthand; a value regis cannot query (``json_values``).
    """
    if text is None or not text.strip():
        return None
    text = text.strip()
    if text.startswith("{"):
        value = json_values.loads(text, "filter")
        if not isinstance(value, dict):
            raise ConfigError("a filter must be a JSON object")
        return value
    out: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, raw = part.partition(":")
        if not sep or not key.strip():
            raise ConfigError(f"filter shorthand must be key:value[,key:value...], got {part[:80]!r}")
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            value = raw
        if isinstance(value, (dict, list)):
            value = raw
        out[key.strip()] = json_values.check_scalar(value, json_values.key_path("filter", key.strip()[:64]))
    return out


def _field(key: str) -> str:
    if not isinstance(key, str) or not _KEY.match(key):
        raise ConfigError(f"invalid filter field {str(key)[:80]!r}: use letters, digits, '_' and '-', with '.' "
                          "between nested keys")
    if key in COLUMNS:
        return COLUMNS[key]
    return "json_extract(metadata, '$." + key + "')"  # the key is checked above: no quote can reach the SQL


def _path(key: str) -> str:
    return "'$." + key + "'"  # the key is checked by _field first: no quote can reach the SQL


def _type_of(key: str) -> str:
    return "(CASE WHEN id IS NULL THEN NULL ELSE 'column' END)" if key in COLUMNS else \
        "json_type(metadata, '$." + key + "')"


def _scalar(value: Any, key: str) -> Any:
    if isinstance(value, bool):
        return int(value)  # JSON true/false come out of json_extract as 1/0
    if value is None or isinstance(value, (int, float, str)):
        if isinstance(value, str) and len(value) > 1000:
            raise ConfigError(f"filter value for {key!r} is longer than 1000 characters")
        return json_values.check_scalar(value, f"filter.{key}")
    raise ConfigError(f"filter value for {key!r} must be a string, number, boolean or null")


class _Compiler:
    def __init__(self):
        self.params: list[Any] = []
        self.conditions = 0

    def node(self, f: Any, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise ConfigError(f"filter is nested deeper than {MAX_DEPTH} levels")
        if not isinstance(f, dict) or not f:
            raise ConfigError("a filter (and each part of and/or/not) must be a non-empty JSON object")
        parts = []
        for key, value in f.items():
            if key in ("and", "or"):
                if not isinstance(value, list) or not value:
                    raise ConfigError(f"'{key}' takes a non-empty list of filters")
                joined = f" {key.upper()} ".join(self.node(v, depth + 1) for v in value)
                parts.append(f"({joined})")
            elif key == "not":
                parts.append(f"(NOT {self.node(value, depth + 1)})")
            else:
                parts.append(self.condition(key, value))
        return "(" + " AND ".join(parts) + ")"

    def condition(self, key: str, cond: Any) -> str:
        self.conditions += 1
        if self.conditions > MAX_CONDITIONS:
            raise ConfigError(f"a filter may hold at most {MAX_CONDITIONS} conditions")
        field = _field(key)
        if not isinstance(cond, dict):
            cond = {"eq": cond}
        if not cond:
            raise ConfigError(f"empty condition for {key!r}")
        parts = []
        for op, value in cond.items():
            if op not in _OPS:
                raise ConfigError(f"unknown filter operator {str(op)[:40]!r} for {key!r}; use eq, ne, in, contains, "
                                  "gt, gte, lt, lte or exists")
            if op == "exists":
                if not isinstance(value, bool):
                    raise ConfigError(f"'exists' for {key!r} takes true or false")
                parts.append(f"({_type_of(key)} IS {'NOT ' if value else ''}NULL)")
            elif op == "in":
                if not isinstance(value, list) or not value or len(value) > MAX_IN:
                    raise ConfigError(f"'in' for {key!r} takes a list of 1 to {MAX_IN} values")
                values = [_scalar(v, key) for v in value]
                marks = ",".join("?" * len(values))
                self.params.extend(values)
                if key in COLUMNS:
                    parts.append(f"({field} IN ({marks}))")
                else:  # the value is one of them, or (a list) one of its members is
                    self.params.extend(values)
                    parts.append(f"({field} IN ({marks}) OR ({_type_of(key)} = 'array' AND EXISTS (SELECT 1 FROM "
                                 f"json_each(metadata, {_path(key)}) WHERE value IN ({marks}))))")
            elif op == "contains":
                if key in COLUMNS:
                    raise ConfigError(f"'contains' is for list-valued metadata fields, not the column {key!r}")
                members = value if isinstance(value, list) else [value]
                if not members or len(members) > MAX_IN:
                    raise ConfigError(f"'contains' for {key!r} takes a value or a list of 1 to {MAX_IN} values")
                for member in members:  # every member: a list holding it, or a field equal to it
                    self.params.append(_scalar(member, key))
                    parts.append(f"({_type_of(key)} NOT IN ('object', 'array') AND {field} IS ? OR "
                                 f"{_type_of(key)} = 'array' AND EXISTS (SELECT 1 FROM json_each(metadata, "
                                 f"{_path(key)}) WHERE value IS ? AND type NOT IN ('object', 'array')))")
                    self.params.append(self.params[-1])
            elif op == "eq":
                if value is None:
                    parts.append(f"({_type_of(key)} = 'null')")
                else:
                    self.params.append(_scalar(value, key))
                    parts.append(f"({field} = ?)")
            elif op == "ne":
                self.params.append(_scalar(value, key))
                parts.append(f"({field} IS NOT ?)")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                    raise ConfigError(f"'{op}' for {key!r} takes a number or a string")
                self.params.append(json_values.check_scalar(value, f"filter.{key}.{op}"))
                parts.append(f"({field} {_RANGE_OPS[op]} ?)")
        return "(" + " AND ".join(parts) + ")"


def compile_filter(f: dict) -> tuple[str, list[Any]]:
    """A filter -> (SQL boolean expression over the ``images`` table, its parameters). A top-level ``"strict"``
    is an option (``filter_options``), not a field.

    Raises:
        ConfigError: a malformed filter (the message names the field or operator), or one holding nothing but
            options.
    """
    f, _ = filter_options(f)
    if f is None:
        raise ConfigError("the filter holds no condition (only options such as 'strict')")
    compiler = _Compiler()
    sql = compiler.node(f, 0)
    return sql, compiler.params


def filter_options(f: dict | None) -> tuple[dict | None, bool]:
    """(the filter without its options, strict): ``strict`` is the top-level ``"strict"`` key (default true:
    fields no image has are an error, ``check_fields``). The filter is None when nothing but options is left.

    Raises:
        ConfigError: ``"strict"`` that is not true or false.
    """
    if not isinstance(f, dict) or STRICT_KEY not in f:
        return f, True
    strict = f[STRICT_KEY]
    if not isinstance(strict, bool):
        raise ConfigError("'strict' (a filter option) takes true or false")
    rest = {k: v for k, v in f.items() if k != STRICT_KEY}
    return rest or None, strict


def filter_fields(f: dict | None) -> list[str]:
    """The metadata fields a filter reads (not the table's columns), in order of appearance, each once."""
    out: dict[str, None] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in _LOGIC:
                    walk(value)
                elif isinstance(key, str) and key not in COLUMNS:
                    out[key] = None

    walk(filter_options(f)[0])
    return list(out)


class FieldTable(Protocol):
    """What ``check_fields`` asks of an image table (``ImageTable``, a sharded collection's table)."""

    def missing_fields(self, fields: list[str]) -> list[str]: ...

    def field_names(self) -> set[str]: ...


class UnknownFieldError(ConfigError):
    """A filter names metadata fields that no image of the index has.

    Attributes:
        fields: the unknown fields.
        suggestions: the nearest known fields (up to 5, best first; ``difflib`` similarity).
    """

    def __init__(self, fields: list[str], known: Iterable[str]):
        known = sorted(set(known))
        self.fields = list(fields)
        near: dict[str, None] = {}
        for name in fields:
            for match in difflib.get_close_matches(name, known, n=5, cutoff=0.5):
                near[match] = None
        self.suggestions = list(near)[:5]
        what = ", ".join(repr(f) for f in fields[:5])
        if self.suggestions:
            tail = "nearest known fields: " + ", ".join(self.suggestions)
        elif known:
            tail = "known fields: " + ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
        else:
            tail = "no image has metadata yet"
        plural = "s" if len(fields) > 1 else ""
        super().__init__(f"no image has the filter field{plural} {what}; {tail} (to let it match nothing, add "
                         '"strict": false to the filter)')


def check_fields(table: FieldTable, f: dict | None) -> None:
    """Refuse a strict filter (``filter_options``) reading metadata fields that no row of ``table`` has.

    Raises:
        UnknownFieldError: such fields (with the nearest known ones).
        ConfigError: a malformed ``"strict"``.
    """
    if f is None:
        return
    compile_filter(f)  # a malformed filter (or field name) is refused before any table sees it
    where, strict = filter_options(f)
    fields = filter_fields(where) if strict else []
    if not fields:
        return
    missing = table.missing_fields(fields)
    if missing:
        raise UnknownFieldError(missing, table.field_names())


def canonical(f: dict) -> str:
    """A stable text form of a filter (a cache key)."""
    return json.dumps(f, sort_keys=True, separators=(",", ":"))
