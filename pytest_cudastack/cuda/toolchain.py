"""Where installed frameworks find the CUDA compiler tools they run, modelled from ``data/toolchain.json``.

jax (XLA) runs ``ptxas``, ``nvlink`` and ``fatbinary``; triton its bundled ``ptxas``; torch's C++ extension
builder and inductor ``nvcc``; cupy ``nvcc`` (its nvcc backend); numba-cuda loads ``libnvvm.so``. A framework
is recognised by its files, not its distribution's name: each row's ``detect`` names a file and the tool name
that the code running the tool holds (``triton/backends/nvidia/compiler.py`` holding ``ptxas``), so a fork or
a renamed build (pytorch-triton, a jaxlib with CUDA) is found and a CPU-only build is not. Each looks in its
own order (the data file cites the code it was read from) and takes the first candidate whose ``--version``
it can read (and, for XLA's ptxas, that is not too old or known bad). This module replays that order over a
given environment, site directories and root without running anything: a candidate's version comes from the
line the tool embeds (``linker.toolversion``, through the ELF cache). The PTX ISA a tool accepts is the
highest ISA whose first CUDA is not newer than the tool's release (``gpu_code.json``'s ``ptx_isa`` table).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_cudastack.cuda.datafile import DataShape, check_data, shipped_json
from pytest_cudastack.cuda.gpucode import load_gpu_code
from pytest_cudastack.errors import DataError
from pytest_cudastack.linker.toolversion import ToolVersion

__all__ = [
    "TOOLCHAIN_FILE",
    "Candidate",
    "Context",
    "Detect",
    "Framework",
    "Lookup",
    "Step",
    "find_tool",
    "load_toolchain",
    "max_ptx_isa",
    "release_key",
    "validate_toolchain",
]

TOOLCHAIN_FILE = "data/toolchain.json"
SHAPE = DataShape("toolchain.schema.json", {"frameworks": ("framework",)})
_DIR_KINDS = ("env", "wheel", "xla_flag", "which", "dir")
_KINDS = (*_DIR_KINDS, "env_file", "path", "bundled", "first_dir_of")
_ACCEPT = ("version", "first")
_RULES = ("ptx-isa", "same-major", "self")
_VERSION = re.compile(r"\d+(\.\d+){0,2}")
_XLA_FLAG = re.compile(r"(--[a-z_]+)=(\S+)")

VersionReader = Callable[[str], ToolVersion | None]
"""The version line of the file at a path (``ElfCache.tool_version``); None when it cannot be read."""


@dataclass(frozen=True)
class Step:
    """One place a framework looks (``kind`` and its ``value``); ``first_dir_of`` holds ``steps`` and ``then``."""

    kind: str
    value: str = ""
    then: str = ""
    steps: tuple[Step, ...] = ()


@dataclass(frozen=True)
class Detect:
    """A file that shows a distribution runs the framework's compiler tools: a RECORD path matching ``path``
    (``fnmatch``: ``*`` crosses ``/``) whose bytes contain ``contains`` (the tool's name, as the code that
    runs it spells it), with the ``source`` it was read from."""

    path: str
    contains: str
    source: str


@dataclass(frozen=True)
class Framework:
    name: str
    distributions: tuple[str, ...]  # the distribution(s) detected as this framework (empty in the data file)
    tools: tuple[str, ...]
    lookup: tuple[Step, ...]
    accept: str  # "version": the first candidate with an acceptable version; "first": the one candidate
    minimum: Mapping[str, tuple[int, ...]]
    excluded: Mapping[str, tuple[tuple[int, ...], ...]]
    rule: str  # "ptx-isa" | "same-major" | "self" (the code it emits follows the tool it finds)
    emits: str  # the distribution whose compiler the stack's code comes from ("" for the tool itself)
    fix_env: str
    source: str
    detect: tuple[Detect, ...] = ()


@dataclass(frozen=True)
class Context:
    """What a lookup reads: the environment, the site directories in import order, each installed
    framework distribution's site directory, and a root the fixed directories are taken under (a test's
    empty root, or an image's, under which the environment's paths are taken too)."""

    environ: Mapping[str, str]
    site_dirs: tuple[str, ...]
    locations: Mapping[str, str]
    root: str = ""
    hidden: frozenset[str] = frozenset()  # paths modelled as removed (a fix's "after" state)
    image: bool = False  # the environment's paths are the image's, under root too (else this machine's)


@dataclass(frozen=True)
class Candidate:
    """One path a framework tried: where it came from (``via``), its version, why it was passed over."""

    path: str
    via: str
    release: str | None = None
    version: str | None = None
    skipped: str | None = None  # None: taken


@dataclass(frozen=True)
class Lookup:
    """The tool a framework would run (``found``, None when none) and every candidate up to it."""

    framework: str
    tool: str
    found: Candidate | None
    candidates: tuple[Candidate, ...]


def _step(raw: Any, where: str) -> Step:
    if not isinstance(raw, dict) or not raw:
        raise DataError(f"{where}: a lookup step must be a non-empty object")
    kind = next(iter(raw))
    if kind not in _KINDS:
        raise DataError(f"{where}: unknown lookup step {kind!r}")
    if kind == "first_dir_of":
        inner = raw[kind]
        if not isinstance(inner, list) or not inner or set(raw) != {kind, "then"}:
            raise DataError(f"{where}: first_dir_of needs a list of steps and 'then'")
        steps = tuple(_step(s, f"{where}.first_dir_of[{i}]") for i, s in enumerate(inner))
        if any(s.kind not in _DIR_KINDS for s in steps):
            raise DataError(f"{where}: first_dir_of takes only {', '.join(_DIR_KINDS)} steps")
        if not isinstance(raw["then"], str):
            raise DataError(f"{where}: 'then' must be a string")
        return Step(kind, then=raw["then"], steps=steps)
    value = raw[kind]
    if len(raw) != 1 or not (value is True or (isinstance(value, str) and value)):
        raise DataError(f"{where}: step {kind!r} takes one non-empty string (or true)")
    return Step(kind, "" if value is True else value)


def _version(text: str, where: str) -> tuple[int, ...]:
    """A dotted version of one to three numbers as a tuple; DataError otherwise."""
    if not _VERSION.fullmatch(text):
        raise DataError(f"{where}: {text!r} is not a version")
    return tuple(int(p) for p in text.split("."))


def _names(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    """The row's list of names at *key* (its schema's: strings), none of them empty, and not empty itself."""
    value: list[str] = raw[key]
    if not value or not all(value):
        raise DataError(f"{where}: {key!r} must be a non-empty list of names")
    return tuple(value)


def validate_toolchain(raw: Any, source: str = TOOLCHAIN_FILE) -> tuple[Framework, ...]:
    """The data file's frameworks; DataError naming the file and row for anything malformed."""
    raw = check_data(raw, source, SHAPE)
    rows = raw["frameworks"]  # a list of objects: its schema's
    if not rows:
        raise DataError(f"{source}: top-level 'frameworks' must be a non-empty list")
    return tuple(_framework(row, f"{source}: frameworks[{i}]", raw["sources"]) for i, row in enumerate(rows))


def _detect(raw: list[dict[str, str]], where: str, sources: Mapping[str, Any]) -> tuple[Detect, ...]:
    """A row's ``detect`` list (its schema's objects of strings): each path relative, below the site directory,
    each ``contains`` non-empty, each source listed."""
    if not raw:
        raise DataError(f"{where}: 'detect' must name at least one file")
    out = []
    for j, d in enumerate(raw):
        path, contains, src = d["path"], d["contains"], d["source"]
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise DataError(f"{where}.detect[{j}]: 'path' must be a pattern inside the site directory, got {path!r}")
        if not contains:
            raise DataError(f"{where}.detect[{j}]: 'contains' must be a non-empty string")
        if src not in sources:
            raise DataError(f"{where}.detect[{j}]: source {src!r} is not listed in 'sources'")
        out.append(Detect(path, contains, src))
    return tuple(out)


# Each row's keys and types (only the keys its schema lists, all but 'note' required; framework, emits, fix_env
# strings; tools a list of strings; detect a list of {path, contains, source} strings; lookup a list of
# objects; accept and rule one of theirs;
# minimum and excluded objects of version strings, lists of them) are its schema's, checked by check_data with
# each row's source before any row is read: the row checks are what a schema cannot say.
def _framework(row: dict[str, Any], where: str, sources: Mapping[str, Any]) -> Framework:
    """One row of the frameworks table; DataError naming it where a rule its schema cannot say fails."""
    if not row["framework"]:
        raise DataError(f"{where}: 'framework' must be a non-empty string")
    if not row["fix_env"]:
        raise DataError(f"{where}: 'fix_env' must be a non-empty string")
    lookup = row["lookup"]
    if not lookup:
        raise DataError(f"{where}: 'lookup' must be a non-empty list of steps")
    tools = _names(row, "tools", where)
    minimum, excluded = row["minimum"], row["excluded"]
    if not set(minimum) | set(excluded) <= set(tools):
        raise DataError(f"{where}: 'minimum' and 'excluded' map tools of 'tools' to versions")
    return Framework(
        name=row["framework"],
        distributions=(),
        tools=tools,
        lookup=tuple(_step(s, f"{where}.lookup[{j}]") for j, s in enumerate(lookup)),
        accept=row["accept"],
        minimum={k: _version(v, f"{where}.minimum") for k, v in minimum.items()},
        excluded={k: tuple(_version(x, f"{where}.excluded") for x in v) for k, v in excluded.items()},
        rule=row["rule"],
        emits=row["emits"],
        fix_env=row["fix_env"],
        source=row["source"],
        detect=_detect(row["detect"], where, sources),
    )


@functools.lru_cache(maxsize=1)
def load_toolchain() -> tuple[Framework, ...]:
    """Load and validate the shipped data file (cached)."""
    raw = shipped_json(TOOLCHAIN_FILE)
    return validate_toolchain(raw, TOOLCHAIN_FILE)


def release_key(release: str) -> tuple[int, int]:
    """``"12.6"`` -> ``(12, 6)`` (a release ``linker.toolversion`` or a wheel version gave)."""
    parts = release.split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def max_ptx_isa(release: str) -> str | None:
    """The newest PTX ISA a tool of CUDA ``release`` accepts ("12.2" -> "8.2", "12.6" -> "8.5"); None when
    the release is older than every row."""
    key = release_key(release)
    best = None
    for isa, cuda in load_gpu_code().ptx_isa:
        if cuda.mm <= key:
            best = isa
    return None if best is None else f"{best[0]}.{best[1]}"


def _tool_name(tool: str) -> str:
    return tool.upper().replace("-", "_")


def _rooted(root: str, path: str) -> str:
    """A path of the modelled system (a fixed directory, an image's environment) as its host path under
    ``root``; one already under it (a site directory, a modelled fix's value) as it is."""
    if not root or path == root or path.startswith(root.rstrip("/") + "/"):
        return path
    return os.path.join(root, path.lstrip("/"))


def _env_path(ctx: Context, path: str) -> str:
    """A path the environment names: the image's under its root, this machine's as it is."""
    return _rooted(ctx.root, path) if ctx.image else path


def _wheel_dir(rel: str, ctx: Context) -> str | None:
    for site in ctx.site_dirs:
        d = os.path.join(site, rel)
        if os.path.isdir(d):
            return d
    return None


def _xla_flag(flag: str, ctx: Context) -> str | None:
    # XLA parses XLA_FLAGS left to right; a flag given twice takes its last value
    found = [v for k, v in _XLA_FLAG.findall(ctx.environ.get("XLA_FLAGS", "")) if k == flag]
    return found[-1] if found else None


def _which(tool: str, ctx: Context) -> str | None:
    """``shutil.which``'s answer over the context's PATH (an executable regular file; one a modelled fix
    removed, ``ctx.hidden``, is not there)."""
    for d in ctx.environ.get("PATH", "").split(os.pathsep):
        p = os.path.join(_env_path(ctx, d), tool)
        if d and p not in ctx.hidden and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _dir_of(step: Step, tool: str, ctx: Context) -> tuple[str, str] | None:
    """(directory, how it was chosen) for one step of ``first_dir_of``, None when it gives none."""
    if step.kind == "env":
        value = ctx.environ.get(step.value)
        return (_env_path(ctx, value), f"${step.value}") if value else None
    if step.kind == "wheel":
        d = _wheel_dir(step.value, ctx)
        return (d, f"the {step.value} wheel directory") if d is not None else None
    if step.kind == "xla_flag":
        value = _xla_flag(step.value, ctx)
        return (_env_path(ctx, value), f"XLA_FLAGS {step.value}") if value else None
    if step.kind == "which":
        found = _which(tool, ctx)
        return (os.path.dirname(os.path.dirname(found)), "PATH") if found is not None else None
    d = _rooted(ctx.root, step.value)
    return (d, d) if os.path.isdir(d) else None


def _paths(framework: Framework, tool: str, ctx: Context) -> list[tuple[str, str]]:
    """Every candidate path of ``tool`` in the framework's order: ``(path, via)``."""
    out: list[tuple[str, str]] = []
    for step in framework.lookup:
        if step.kind == "first_dir_of":
            for inner in step.steps:
                got = _dir_of(inner, tool, ctx)
                if got is not None:
                    out.append((os.path.join(got[0], step.then, tool), got[1]))
                    break
        elif step.kind == "env_file":
            name = step.value.replace("{TOOL}", _tool_name(tool))
            value = ctx.environ.get(name)
            if value:
                out.append((_env_path(ctx, value), f"${name}"))
        elif step.kind == "path":
            dirs = ctx.environ.get("PATH", "").split(os.pathsep)
            out.extend((os.path.join(_env_path(ctx, d), tool), "PATH") for d in dirs if d)
        elif step.kind == "bundled":
            for dist in framework.distributions:
                location = ctx.locations.get(dist)
                if location is not None:
                    out.append((os.path.join(location, step.value, tool), f"{dist}'s bundled copy"))
                    break
        elif step.kind == "wheel":
            d = _wheel_dir(step.value, ctx)
            if d is not None:
                out.append((os.path.join(d, tool), f"the {step.value} wheel directory"))
        else:  # "dir"
            d = _rooted(ctx.root, step.value)
            out.append((os.path.join(d, tool), d))
    return out


def _verdict(
    framework: Framework, tool: str, path: str, ctx: Context, read: VersionReader
) -> tuple[ToolVersion | None, str | None]:
    """(the version read, why the framework would pass this candidate over, None: it takes it)."""
    if path in ctx.hidden or not os.path.isfile(path):
        return None, "missing"
    if not tool.endswith(".so") and not os.access(path, os.X_OK):  # a library (libnvvm.so) is loaded, not run
        return None, "not executable"
    got = read(path)
    if got is None:
        return None, "unreadable"
    if framework.accept == "first":
        return got, None
    if got.version is None:
        return got, "states no version"
    full = tuple(int(p) for p in got.version.split("."))
    least = framework.minimum.get(tool)
    if least is not None and full < least:
        return got, f"older than {'.'.join(map(str, least))}"
    if full in framework.excluded.get(tool, ()):
        return got, f"version {got.version} is excluded"
    return got, None


def find_tool(framework: Framework, tool: str, ctx: Context, read: VersionReader) -> Lookup:
    """The ``tool`` ``framework`` would run in ``ctx``: its candidates in order, up to the one it takes.

    ``accept == "first"`` (torch): the first candidate is the one, whatever it is; else the first whose
    version line reads and meets the framework's minimum and exclusions. Never runs a candidate."""
    tried: list[Candidate] = []
    for path, via in dict.fromkeys(_paths(framework, tool, ctx)):
        got, skipped = _verdict(framework, tool, path, ctx, read)
        release = got.release if got is not None else None
        version = got.version if got is not None else None
        cand = Candidate(path, via, release, version, skipped)
        tried.append(cand)
        if skipped is None:
            return Lookup(framework.name, tool, cand, tuple(tried))
        if framework.accept == "first":
            break
    return Lookup(framework.name, tool, None, tuple(tried))
