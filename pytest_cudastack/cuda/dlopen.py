"""Which libraries load which others at run time (dlopen), from ``data/dlopen_targets.json`` (validated on load).

No DT_NEEDED shows these loads: cuDNN 9's shim opens its sub-libraries by soname, libcudart opens the
driver's ``libcuda.so.1``, libnvrtc its ``libnvrtc-builtins.so.MAJOR.MINOR``, ONNX Runtime its CUDA provider
by full path. Each row of the data file says, for the callers whose soname (or file name, for a module
without one) matches ``caller``:

* the names it opens: ``names`` (templates; ``{group}`` is a named group of the ``caller`` match, e.g. the
  caller's own major) and/or ``strings`` (a regex over the strings of the caller's read-only data: the
  names it was built with, such as ``libnvrtc-builtins.so.13.0``; a named group it shares with ``caller``
  must capture the same text);
* how it searches: ``"dlopen"`` (glibc's search from the calling object, ``Resolver.dlopen``) or
  ``"paths"`` (the name opened as ``DIR/name`` for each of ``paths``, with ``$ORIGIN`` the caller's
  directory: a full path, no search);
* what a miss costs: ``fatal`` (the feature fails), ``fallback`` (it silently does something else, which
  ``fallback`` says), ``optional`` (nothing is lost that was used).

Every row cites a source listed in the file's ``sources``.

The file's ``preloads`` table lists what a package's ``__init__`` loads by path before its extension
modules (:class:`Preload`): torch's ``_load_global_deps`` maps ``lib/libtorch_global_deps.so`` with
RTLD_GLOBAL, then, once libcudart is mapped, the first match of each nvidia library's glob under the first
``sys.path`` entry that has one. ``at`` names the call in the module's top-level code that performs it;
a row with ``before_import`` runs instead right before one of those modules is imported (cupy's
``cupy_backends.cuda.libs.__getattr__`` has cuda-pathfinder load the CUDA library of the submodule it is
about to import; jax's CUDA plugin ``initialize`` loads the nvidia wheels' libraries, then imports its
``cuda_plugin_extension``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any

from pytest_cudastack.cuda.datafile import DataShape, check_data, check_row, check_template, cited, shipped_json
from pytest_cudastack.errors import DataError

__all__ = [
    "DATA_FILE",
    "DlopenRow",
    "Feature",
    "Miss",
    "Preload",
    "load_dlopen_targets",
    "load_features",
    "load_preloads",
    "validate_dlopen_targets",
    "validate_features",
    "validate_preloads",
]

DATA_FILE = "data/dlopen_targets.json"
_TEMPLATE_FIELD = re.compile(r"\{([^{}]*)\}")
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
SHAPE = DataShape(
    "dlopen_targets.schema.json", {"targets": ("caller",), "preloads": (), "features": ("caller",)}, says=True
)


class Miss(str, Enum):
    """What a load that finds nothing costs."""

    FATAL = "fatal"
    FALLBACK = "fallback"
    OPTIONAL = "optional"


@dataclass(frozen=True)
class DlopenRow:
    """One caller pattern and what it loads at run time; see the module docstring."""

    caller: re.Pattern[str]
    names: tuple[str, ...]
    strings: re.Pattern[str] | None
    search: str  # "dlopen" | "paths"
    paths: tuple[str, ...]
    miss: Miss
    fallback: str
    source: str
    note: str = ""

    def match(self, *names: str | None) -> re.Match[str] | None:
        """The ``caller`` match of the first of ``names`` (soname, file name) it matches, else None."""
        for name in names:
            if name:
                m = self.caller.search(name)
                if m is not None:
                    return m
        return None

    def targets(self, caller: re.Match[str], strings: Sequence[str] = ()) -> tuple[str, ...]:
        """The names this row's caller (its ``caller`` match) opens: the templates filled from the match,
        then the caller's read-only ``strings`` that ``strings`` matches (shared groups equal), in order."""
        groups = {k: v for k, v in caller.groupdict().items() if v is not None}
        out = []
        for t in self.names:
            try:
                out.append(t.format_map(groups))
            except KeyError:  # an optional group of the caller did not take part: that name is not opened
                continue
        if self.strings is not None:
            for s in strings:
                m = self.strings.search(s)
                if m is None:
                    continue
                if any(groups.get(k) not in (None, v) for k, v in m.groupdict().items()):
                    continue
                out.append(s)
        return tuple(dict.fromkeys(out))


def _where(source: str, i: int) -> str:
    return f"{source}: targets[{i}]"


def _regex(where: str, key: str, value: str) -> re.Pattern[str]:
    """*value* compiled (a non-empty string: its schema says it is a string); DataError otherwise."""
    if not value:
        raise DataError(f"{where}: {key!r} must be a non-empty regex string")
    try:
        return re.compile(value)
    except re.error as e:
        raise DataError(f"{where}: {key!r} is not a valid regex: {e}") from e


# Each row's types (an object; caller, strings, search, miss, fallback, note strings; names and paths lists of
# strings) are its schema's, checked by check_data before any row is read: the row checks are what it cannot say.
def _row(source: str, i: int, row: dict[str, Any], sources: Mapping[str, Any]) -> DlopenRow:
    """One row of the targets table; DataError naming it where a rule its schema cannot say fails."""
    where = _where(source, i)
    src = cited(row, sources, where)
    caller = _regex(where, "caller", row["caller"])
    names = _names(where, row.get("names", []), caller)
    strings = _regex(where, "strings", row["strings"]) if "strings" in row else None
    if not names and strings is None:
        raise DataError(f"{where}: needs 'names' or 'strings'")
    search = row["search"]
    paths = _search_paths(where, search, row.get("paths"))
    miss = _miss(where, row["miss"])
    fallback = row.get("fallback", "")
    if (miss is Miss.FALLBACK) != bool(fallback):
        raise DataError(f"{where}: 'fallback' (what happens instead) is required with miss 'fallback', and only then")
    return DlopenRow(caller, names, strings, search, paths, miss, fallback, src, row.get("note", ""))


def _names(where: str, names: list[str], caller: re.Pattern[str]) -> tuple[str, ...]:
    """The row's library file names: non-empty, no '/' or space, each ``{field}`` a named group of *caller*."""
    if not all(names):
        raise DataError(f"{where}: 'names' must be a list of non-empty strings")
    for name in names:
        for field in _TEMPLATE_FIELD.findall(name):
            if field not in caller.groupindex:
                raise DataError(f"{where}: name {name!r} uses {{{field}}}, not a named group of 'caller'")
        if not _NAME.fullmatch(_TEMPLATE_FIELD.sub("0", name)):
            raise DataError(f"{where}: name {name!r} is not a library file name (no '/', no spaces)")
    return tuple(names)


def _search_paths(where: str, search: str, paths: list[str] | None) -> tuple[str, ...]:
    """The directories of a search "paths" row (a non-empty list of them); none, and no list, for "dlopen"."""
    if search == "dlopen":
        if paths is not None:
            raise DataError(f"{where}: 'paths' is only for search 'paths'")
        return ()
    if search != "paths":
        raise DataError(f"{where}: 'search' must be 'dlopen' or 'paths', not {search!r}")
    if not paths or not all(paths):
        raise DataError(f"{where}: search 'paths' needs 'paths', a non-empty list of directories")
    return tuple(paths)


def _miss(where: str, miss: str) -> Miss:
    """The row's ``miss`` as a :class:`Miss`; DataError for another word."""
    try:
        return Miss(miss)
    except ValueError:
        raise DataError(f"{where}: 'miss' must be one of fatal, fallback, optional, not {miss!r}") from None


def validate_dlopen_targets(raw: Any, source: str = DATA_FILE) -> tuple[DlopenRow, ...]:
    """The rows of a dlopen-targets document; DataError naming ``source`` and the offending row otherwise
    (unknown keys, a row citing an unlisted source, a bad regex, a template naming a group the caller
    pattern lacks, a search without its paths, a fallback row that does not say what happens instead)."""
    raw = check_data(raw, source, SHAPE)
    sources = raw["sources"]
    table = raw["targets"]  # a list of objects: its schema's
    if not table:
        raise DataError(f"{source}: top-level 'targets' must be a non-empty list")
    return tuple(_row(source, i, row, sources) for i, row in enumerate(table))  # duplicates: check_data's


@dataclass(frozen=True)
class Preload:
    """One load by path a package's ``__init__`` performs when its top-level code calls ``at``.

    ``kind`` "path": ``path`` relative to the top-level package's directory. ``kind`` "sys_path": only once an object
    whose soname starts with ``when_mapped`` is mapped; for each ``(folder, glob)`` of ``libraries``, the
    matches of ``dirs`` (``{folder}``, ``{cuda_major}`` filled in; ``cuda_major`` read from the package's
    ``FILE:NAME`` assignment) under each ``sys.path`` entry in order, the first entry with a match winning
    (``order`` "dirs": each of ``dirs`` over every entry before the next one, cuda-pathfinder's order).
    ``before_import``: the modules before whose import the row runs (instead of at the call ``at``);
    ``unless_loaded``: a library whose soname is already mapped is not loaded again (pathfinder's
    ``RTLD_NOLOAD`` check by soname).
    """

    module: str
    at: str
    kind: str
    flags: str
    source: str
    path: str = ""
    when_mapped: str = ""
    cuda_major: str = ""
    dirs: tuple[str, ...] = ()
    libraries: tuple[tuple[str, str], ...] = ()
    note: str = ""
    before_import: tuple[str, ...] = ()
    order: str = "entries"
    unless_loaded: bool = False


_PRELOAD_KEYS = frozenset(
    {
        "module",
        "at",
        "kind",
        "flags",
        "source",
        "path",
        "when_mapped",
        "cuda_major",
        "dirs",
        "libraries",
        "note",
        "before_import",
        "order",
        "unless_loaded",
    }
)


def _path_preload(row: dict[str, Any], where: str) -> dict[str, Any]:
    """The fields of a kind ``path`` row: its ``path``, relative to the top-level package of ``module`` and
    inside it."""
    path = row.get("path")
    if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
        raise DataError(f"{where}: kind 'path' needs 'path', relative to the top-level package, inside it")
    return {"path": path}


def _sys_path_preload(row: dict[str, Any], where: str) -> dict[str, Any]:
    """The fields of a kind ``sys_path`` row: ``dirs`` templates, ``[folder, glob]`` libraries, ``cuda_major``."""
    dirs = row.get("dirs")
    libs = row.get("libraries")
    if not isinstance(dirs, list) or not dirs or not all(isinstance(d, str) and d for d in dirs):
        raise DataError(f"{where}: kind 'sys_path' needs 'dirs', a non-empty list")
    for d in dirs:
        check_template(d, {"folder", "cuda_major"}, f"{where}: 'dirs'")
    if (
        not isinstance(libs, list)
        or not libs
        or not all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) and y for y in x) for x in libs)
    ):
        raise DataError(f"{where}: 'libraries' must be a non-empty list of [folder, glob] pairs")
    major = row.get("cuda_major", "")
    if not isinstance(major, str) or (major and major.count(":") != 1):
        raise DataError(f"{where}: 'cuda_major' must be FILE:NAME")
    if any("{cuda_major}" in d for d in dirs) and not major:
        raise DataError(f"{where}: 'dirs' use {{cuda_major}} but 'cuda_major' is not given")
    return {
        "when_mapped": str(row.get("when_mapped", "")),
        "cuda_major": major,
        "dirs": tuple(dirs),
        "libraries": tuple((a, b) for a, b in libs),
        "order": row.get("order", "entries"),
    }


_PRELOAD_KINDS: Mapping[str, Callable[[dict[str, Any], str], dict[str, Any]]] = MappingProxyType(
    {"path": _path_preload, "sys_path": _sys_path_preload}
)


def _preload(row: Any, where: str, sources: Mapping[str, Any]) -> Preload:
    """One preload row: the fields every kind has, then its kind's own."""
    row = check_row(row, where, _PRELOAD_KEYS, ("module", "at", "kind", "flags"), sources)
    before = row.get("before_import", [])  # flags, order and the types: the schema's
    if not all(_MODULE.fullmatch(m) for m in before):
        raise DataError(f"{where}: 'before_import' must be a list of dotted module names")
    unless = bool(row.get("unless_loaded", False))
    kind = row["kind"]
    if kind not in _PRELOAD_KINDS:
        raise DataError(f"{where}: 'kind' must be 'path' or 'sys_path', not {kind!r}")
    return Preload(
        row["module"],
        row["at"],
        kind,
        row["flags"],
        row["source"],
        note=str(row.get("note", "")),
        before_import=tuple(before),
        unless_loaded=unless,
        **_PRELOAD_KINDS[kind](row, where),
    )


def validate_preloads(raw: Any, source: str = DATA_FILE) -> tuple[Preload, ...]:
    """The ``preloads`` rows of a dlopen-targets document (none when absent); DataError naming ``source``
    and the row otherwise."""
    raw = check_data(raw, source, SHAPE)
    sources = raw["sources"]
    return tuple(_preload(row, f"{source}: preloads[{i}]", sources) for i, row in enumerate(raw.get("preloads", [])))


@dataclass(frozen=True)
class Feature:
    """When a library's own loads happen (``features`` rows): for a caller whose soname (or file name)
    ``caller`` matches, ``when`` names the feature that makes it open what its read-only data names
    (CUPTI: a profiler session). A finding made from such a name alone says so."""

    caller: re.Pattern[str]
    when: str
    source: str

    def matches(self, *names: str | None) -> bool:
        return any(name and self.caller.search(name) for name in names)


def validate_features(raw: Any, source: str = DATA_FILE) -> tuple[Feature, ...]:
    """The ``features`` rows of a dlopen-targets document (none when absent); DataError naming ``source``
    and the row otherwise (a bad regex, an empty ``when``, an unlisted source)."""
    raw = check_data(raw, source, SHAPE)
    out = []
    for i, row in enumerate(raw.get("features", [])):
        where = f"{source}: features[{i}]"
        if not row["when"].strip():
            raise DataError(f"{where}: 'when' must say which feature makes the caller load")
        out.append(Feature(_regex(where, "caller", row["caller"]), row["when"], cited(row, raw["sources"], where)))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _shipped() -> Any:
    return shipped_json(DATA_FILE)


@functools.lru_cache(maxsize=1)
def load_dlopen_targets() -> tuple[DlopenRow, ...]:
    """The shipped table, validated (cached)."""
    return validate_dlopen_targets(_shipped(), DATA_FILE)


@functools.lru_cache(maxsize=1)
def load_features() -> tuple[Feature, ...]:
    """The shipped file's features, validated (cached)."""
    return validate_features(_shipped(), DATA_FILE)


@functools.lru_cache(maxsize=1)
def load_preloads() -> tuple[Preload, ...]:
    """The shipped file's preloads, validated (cached)."""
    return validate_preloads(_shipped(), DATA_FILE)
