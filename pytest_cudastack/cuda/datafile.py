"""What every shipped data file (``cuda/data/*.json``, ``checks/data/*.json``) shares, checked by one rule.

Each file's shape is a JSON schema in ``cuda/data/schemas/`` (checked by :mod:`pytest_cudastack.schemacheck`),
and :func:`check_data` applies the one header rule to all of them: a top-level object with only the keys its
schema lists and its ``schema`` value; ``sources`` (id -> ``url``, ``retrieved`` date and, where a file asks
for them, the quoted words ``says``) non-empty with each entry a full citation; every row of the file's row
tables citing a listed source; no two rows with the same key. Each file's validator then checks only what a
schema cannot say (versions, regexes, rows that must rise), and every check names the file and the offending
entry the same way (``DataError``)."""

from __future__ import annotations

import functools
import json
import re
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pytest_cudastack.errors import DataError
from pytest_cudastack.schemacheck import first_error

__all__ = [
    "DataShape",
    "check_data",
    "check_header",
    "check_row",
    "check_sources",
    "check_template",
    "cited",
    "shipped_json",
]

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def shipped_json(name: str, package: str = "pytest_cudastack.cuda") -> Any:
    """The parsed JSON of the data file ``data/NAME`` shipped in ``package``; ``DataError`` naming it when it
    cannot be read or parsed (a broken installation), before any validator sees it."""
    ref = resources.files(package).joinpath(name)
    try:
        return json.loads(ref.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise DataError(f"{name}: cannot read: {e}") from e


def check_header(raw: Any, source: str, top_keys: frozenset[str] | set[str], *, says: bool = False) -> dict[str, Any]:
    """``raw`` as the data file's top-level object (schema 1, only ``top_keys``, valid ``sources``);
    ``DataError`` naming ``source`` otherwise."""
    if not isinstance(raw, dict):
        raise DataError(f"{source}: top level must be an object")
    unknown = set(raw) - set(top_keys)
    if unknown:
        raise DataError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    if raw.get("schema") != 1:
        raise DataError(f"{source}: unsupported schema {raw.get('schema')!r} (expected 1)")
    check_sources(raw.get("sources"), source, says=says)
    return raw


def check_sources(sources: Any, source: str, *, says: bool = False) -> Mapping[str, Any]:
    """``sources`` as a non-empty object of id -> {url, retrieved (YYYY-MM-DD)[, says]}."""
    if not isinstance(sources, dict) or not sources:
        raise DataError(f"{source}: 'sources' must be a non-empty object")
    for sid, entry in sources.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("url"), str)
            or not isinstance(entry.get("retrieved"), str)
            or not _DATE.fullmatch(entry["retrieved"])
            or (says and not (isinstance(entry.get("says"), str) and entry["says"]))
        ):
            needs = "'url', 'retrieved' (YYYY-MM-DD) and 'says'" if says else "'url' and 'retrieved' (YYYY-MM-DD)"
            raise DataError(f"{source}: sources[{sid!r}] needs {needs}")
    return sources


def cited(row: Mapping[str, Any], sources: Mapping[str, Any], where: str) -> str:
    """The source id ``row`` cites; ``DataError`` naming ``where`` when it is not a listed id (a list or an
    object there is not an id either: never a TypeError from hashing it)."""
    src = row.get("source")
    if not isinstance(src, str) or src not in sources:
        raise DataError(f"{where}: source {src!r} is not listed in 'sources'")
    return src


def check_template(text: str, fields: frozenset[str] | set[str], where: str) -> str:
    """``text`` as a ``str.format`` template naming only ``fields`` (``{build}``, ``{folder}``, ...); a lone
    brace, a positional ``{}`` or another name is a ``DataError`` on load, never a KeyError at run time."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as e:
        raise DataError(f"{where}: {text!r} is not a template: {e}") from None
    unknown = names - set(fields)
    if unknown:
        allowed = ", ".join("{" + f + "}" for f in sorted(fields)) or "none"
        raise DataError(f"{where}: {text!r} names {sorted(unknown)}; allowed fields: {allowed}")
    return text


def check_row(
    raw: Any, where: str, allowed: frozenset[str], strings: tuple[str, ...], sources: Mapping[str, Any]
) -> dict[str, Any]:
    """``raw`` as one row: an object with only ``allowed`` keys, each of ``strings`` a non-empty string, and a
    listed ``source``; ``DataError`` naming ``where`` otherwise."""
    if not isinstance(raw, dict):
        raise DataError(f"{where}: must be an object")
    unknown = set(raw) - allowed
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in strings:
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise DataError(f"{where}: '{key}' must be a non-empty string")
    cited(raw, sources, where)
    return raw


@dataclass(frozen=True)
class DataShape:
    """What the header rule needs of one data file beside its schema: the schema's file name (in
    ``cuda/data/schemas/``), its row tables (a dotted path such as ``wheels.unsuffixed`` -> the fields whose
    values key a row; ``()``: the whole row), the single objects that cite a source as rows do
    (``forward_compat``), whether rows cite ids of ``sources`` and whether each source quotes its words
    (``says``)."""

    schema: str
    tables: Mapping[str, tuple[str, ...]]
    objects: tuple[str, ...] = ()
    cites: bool = True
    says: bool = False


@functools.cache
def _schema(name: str) -> Mapping[str, Any]:
    """The shipped schema ``cuda/data/schemas/NAME`` (read once, on the first check of its file)."""
    schema: Mapping[str, Any] = shipped_json(f"data/schemas/{name}")
    return schema


def check_data(raw: Any, source: str, shape: DataShape) -> dict[str, Any]:
    """``raw`` as a data file of ``shape``: the header rule (known top-level keys, its ``schema``, cited
    sources, rows citing them, no duplicate rows), then the rest of its schema; ``DataError`` naming ``source``
    and the row or field otherwise."""
    schema = _schema(shape.schema)
    data = _check_top(raw, source, schema)
    sources = check_sources(data.get("sources"), source, says=shape.says) if shape.cites else {}
    for table, keys in shape.tables.items():
        _check_rows(_rows_at(data, table, list), f"{source}: {table}", keys, sources if shape.cites else None)
    for table in shape.objects:
        _check_rows(_rows_at(data, table, dict), f"{source}: {table}", (), sources)
    error = first_error(data, schema)
    if error is not None:
        raise DataError(f"{source}: {error.removeprefix('$.')}")
    return data


def _check_top(raw: Any, source: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` as an object of only the top-level keys ``schema`` lists, with the ``schema`` value it fixes."""
    if not isinstance(raw, dict):
        raise DataError(f"{source}: top level must be an object")
    unknown = set(raw) - set(schema["properties"])
    if unknown:
        raise DataError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    expected = schema["properties"]["schema"]["const"]
    if raw.get("schema") != expected:
        raise DataError(f"{source}: unsupported schema {raw.get('schema')!r} (expected {expected!r})")
    return raw


def _rows_at(raw: Mapping[str, Any], table: str, kind: type) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """The object rows (with their index) of the list at dotted path ``table`` (``kind`` list), or the one
    object there (``kind`` dict, index None); none where the path leads elsewhere (the schema names what is
    missing or mistyped there)."""
    node: Any = raw
    for part in table.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if kind is dict and isinstance(node, dict):
        yield None, node
    elif kind is list and isinstance(node, list):
        yield from ((i, row) for i, row in enumerate(node) if isinstance(row, dict))


def _check_rows(
    rows: Iterator[tuple[int | None, dict[str, Any]]],
    where: str,
    keys: tuple[str, ...],
    sources: Mapping[str, Any] | None,
) -> None:
    """Each row citing a listed source (when ``sources`` is given) and none repeating an earlier row's key."""
    seen: dict[str, int | None] = {}
    for i, row in rows:
        at = where if i is None else f"{where}[{i}]"
        if sources is not None:
            cited(row, sources, at)
        key = json.dumps([row.get(k) for k in keys] if keys else row, sort_keys=True)
        if key in seen:
            raise DataError(f"{at}: duplicate row {key} (as {where.rpartition(': ')[2]}[{seen[key]}])")
        seen[key] = i
