"""What every data file in ``cuda/data/`` shares: a JSON object with a ``schema`` number, no unknown top-level
key, and ``sources`` (id -> ``url``, ``retrieved`` date and, where a file asks for them, the quoted words
``says``) that each row cites by id. One check of that header, so each file's validator checks only its rows
and every one names the file and the offending entry the same way (``DataError``)."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from importlib import resources
from typing import Any

from pytest_cudastack.errors import DataError

__all__ = ["check_header", "check_row", "check_sources", "check_template", "cited", "shipped_json"]

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
