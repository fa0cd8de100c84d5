"""Where a framework looks for the driver library itself, outside the dynamic loader, replayed from its own
source (``data/driver_lookups.json`` names the files and the function).

triton does not let the loader find libcuda when it builds a kernel's launcher: its ``libcuda_dirs()`` runs
``/sbin/ldconfig -p``, keeps the directories of the lines naming ``libcuda.so.1``, takes the
``LD_LIBRARY_PATH`` entries holding it only when the cache names none, and asserts that one of them holds
the library (``$TRITON_LIBCUDA_PATH`` replaces all of it, unchecked). So a driver that the loader finds (in
a default directory the cache does not list, after a driver install that did not run ``ldconfig``, in an
image without ``/sbin/ldconfig``) still fails triton's first compile. What the function runs, matches and
asserts is read from the installed file with ``ast`` (the constant list it hands ``subprocess``, the string
it tests ``in line``, the file name it ``os.path.join``s inside its ``assert``, the variables it reads): a
release that changes the rule (triton 2.x matched and asserted the unversioned ``libcuda.so``) is judged by
its own words, and a file that no longer says them is not judged at all.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_cudastack._sysio import read_text
from pytest_cudastack.cuda.datafile import DataShape, check_data, shipped_json
from pytest_cudastack.errors import DataError
from pytest_cudastack.linker.ldcache import LdCache

__all__ = [
    "DRIVER_LOOKUPS_FILE",
    "LookupCode",
    "LookupResult",
    "LookupRow",
    "load_driver_lookups",
    "read_lookup_code",
    "replay_lookup",
    "validate_driver_lookups",
]

DRIVER_LOOKUPS_FILE = "data/driver_lookups.json"
_SHAPE = DataShape("driver_lookups.schema.json", {"lookups": ("framework", "library")})
_MAX_SOURCE = 4 << 20  # a framework's driver module is tens of kB; a larger file is not read
_ENV_READERS = frozenset({"getenv", "get"})  # os.getenv("X"), os.environ.get("X")


@dataclass(frozen=True)
class LookupRow:
    """One framework's lookup: the ``library`` it looks for, the ``files`` (site-relative, newest layout
    first) that may hold ``function``, the ``settings`` files that map its knobs to variables, and ``when``
    it runs."""

    framework: str
    library: str
    files: tuple[str, ...]
    function: str
    settings: tuple[str, ...]
    when: str
    source: str


@dataclass(frozen=True)
class LookupCode:
    """What one installed lookup function does, as its file says it: the program it runs (``argv``), the text
    an output line must hold (``match``), the file a directory must hold (``required``), the variable that
    replaces the lookup (``env``), the path variable searched when the output names nothing (``fallback``,
    for the file ``fallback_file``) and the first line of its assertion's message (``says``)."""

    path: str
    function: str
    argv: tuple[str, ...]
    match: str
    required: str
    env: str | None = None
    fallback: str | None = None
    fallback_file: str | None = None
    says: str = "AssertionError"


@dataclass(frozen=True)
class LookupResult:
    """The lookup replayed: whether it returns (``ok``), ``how`` (``env``, ``cache``, ``fallback``) or why not
    (``no-program``, ``no-cache``, ``not-listed``), the directories it kept, the output lines' paths that
    matched and what the framework raises when it fails (``error``)."""

    ok: bool
    how: str
    dirs: tuple[str, ...] = ()
    listed: tuple[str, ...] = ()
    error: str = ""


def validate_driver_lookups(raw: Any, where: str = DRIVER_LOOKUPS_FILE) -> tuple[LookupRow, ...]:
    """The rows of a parsed data file; ``DataError`` naming the row when one is malformed."""
    data = check_data(raw, where, _SHAPE)
    for i, row in enumerate(data["lookups"]):
        if not row["files"]:
            raise DataError(f"{where}: lookups[{i}]: 'files' names no file")
    return tuple(
        LookupRow(
            framework=row["framework"],
            library=row["library"],
            files=tuple(row["files"]),
            function=row["function"],
            settings=tuple(row["settings"]),
            when=row["when"],
            source=row["source"],
        )
        for row in data["lookups"]
    )


@functools.lru_cache(maxsize=1)
def load_driver_lookups() -> tuple[LookupRow, ...]:
    """The shipped table (cached)."""
    return validate_driver_lookups(shipped_json(DRIVER_LOOKUPS_FILE))


def _parse(path: str) -> ast.Module | None:
    text = read_text(path, _MAX_SOURCE)
    if text is None:
        return None
    try:
        return ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _env_name(call: ast.Call) -> str | None:
    """``X`` of ``os.getenv("X")`` / ``os.environ.get("X")``."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _ENV_READERS and call.args:
        return _const(call.args[0])
    return None


def _knob(node: ast.AST, settings: Sequence[ast.Module]) -> str | None:
    """The variable behind a knob (``knobs.nvidia.libcuda_path``): the string its settings module binds the
    attribute's name with (``libcuda_path: env_opt_str = env_opt_str("TRITON_LIBCUDA_PATH")``)."""
    if not isinstance(node, ast.Attribute):
        return None
    for tree in settings:
        for stmt in ast.walk(tree):
            if isinstance(stmt, ast.AnnAssign | ast.Assign):
                targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else stmt.targets
                value = stmt.value
                named = any(isinstance(t, ast.Name) and t.id == node.attr for t in targets)
                if named and isinstance(value, ast.Call) and value.args and (text := _const(value.args[0])):
                    return text
    return None


def _first_env(body: ast.AST, settings: Sequence[ast.Module]) -> str | None:
    """The variable the function returns early on: its first test (``if X := ...:`` / ``if X:``) that reads
    the environment, directly or through a knob."""
    for node in ast.walk(body):
        if not isinstance(node, ast.If):
            continue
        test = node.test.value if isinstance(node.test, ast.NamedExpr) else node.test
        if isinstance(test, ast.Call) and (name := _env_name(test)) and name != "LD_LIBRARY_PATH":
            return name
        if (name := _knob(test, settings)) is not None:
            return name
        if isinstance(test, ast.Name):  # env_libcuda_path = os.getenv(...); if env_libcuda_path:
            bound = _bound_env(body, test.id)
            if bound is not None and bound != "LD_LIBRARY_PATH":
                return bound
    return None


def _bound_env(body: ast.AST, name: str) -> str | None:
    """The variable read into ``name`` (``name = os.getenv("X")``)."""
    for node in ast.walk(body):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return _env_name(node.value)
    return None


def _joined_name(node: ast.AST) -> str | None:
    """``NAME`` of the first ``os.path.join(x, "NAME")`` under ``node``."""
    for sub in ast.walk(node):
        if not (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "join"):
            continue
        if len(sub.args) == 2 and (text := _const(sub.args[1])):
            return text
    return None


def _facts(func: ast.FunctionDef, settings: Sequence[ast.Module]) -> dict[str, Any]:
    """What the function's statements say: its program, the tested text, the asserted file, its message."""
    facts: dict[str, Any] = {"env": _first_env(func, settings)}
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "check_output":
            args = node.args[0] if node.args else None
            if isinstance(args, ast.List) and args.elts and all(_const(e) for e in args.elts):
                facts.setdefault("argv", tuple(_const(e) for e in args.elts))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In):
            if (text := _const(node.left)) and isinstance(node.comparators[0], ast.Name):
                facts.setdefault("match", text)
        elif isinstance(node, ast.Assert):
            facts.setdefault("required", _joined_name(node.test))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "msg" for t in node.targets):
            if text := _const(node.value):
                facts.setdefault("says", "AssertionError: " + text.strip().splitlines()[0])
        elif isinstance(node, ast.Call) and _env_name(node) == "LD_LIBRARY_PATH":
            facts["fallback"] = "LD_LIBRARY_PATH"
        elif isinstance(node, ast.ListComp) and facts.get("fallback") and "fallback_file" not in facts:
            facts["fallback_file"] = _joined_name(node)
    return facts


def read_lookup_code(site: str, row: LookupRow) -> LookupCode | None:
    """The lookup ``row`` names, as the first of its files found under ``site`` says it; None when no file
    holds the function or the function no longer says what it runs, matches and asserts (not judged)."""
    for rel in row.files:
        path = os.path.join(site, rel)
        tree = _parse(path) if os.path.isfile(path) else None
        func = next(
            (n for n in (tree.body if tree else ()) if isinstance(n, ast.FunctionDef) and n.name == row.function),
            None,
        )
        if func is None:
            continue
        top = rel.split("/", 1)[0]
        settings = [t for s in row.settings if s.split("/", 1)[0] == top and (t := _parse(os.path.join(site, s)))]
        facts = _facts(func, settings)
        if not (facts.get("argv") and facts.get("match") and facts.get("required")):
            return None
        return LookupCode(
            path=path,
            function=row.function,
            argv=facts["argv"],
            match=facts["match"],
            required=facts["required"],
            env=facts.get("env"),
            fallback=facts.get("fallback"),
            fallback_file=facts.get("fallback_file") or facts["required"],
            says=facts.get("says", "AssertionError"),
        )
    return None


def replay_lookup(
    code: LookupCode,
    environ: Mapping[str, str],
    cache: LdCache | None,
    exists: Callable[[str], bool],
) -> LookupResult:
    """``code`` run against a machine: its ``environ``, the ``ld.so.cache`` its program prints (None: there
    is none, and ``ldconfig -p`` exits 1) and ``exists`` (a path of that machine exists, links followed).
    The output lines are ``ldconfig -p``'s: ``KEY (FLAGS) => PATH`` for every entry, other ABIs' included."""
    if code.env and environ.get(code.env):
        return LookupResult(True, "env", (environ[code.env],))
    program = code.argv[0]
    if not exists(program):
        error = f"FileNotFoundError: [Errno 2] No such file or directory: {program!r}"
        return LookupResult(False, "no-program", error=error)
    if cache is None:
        argv = "[" + ", ".join(repr(a) for a in code.argv) + "]"
        error = f"subprocess.CalledProcessError: Command '{argv}' returned non-zero exit status 1."
        return LookupResult(False, "no-cache", error=error)
    listed = tuple(e.path for e in cache.entries if code.match in e.soname or code.match in e.path)
    dirs = tuple(os.path.dirname(p) for p in listed)
    how = "cache"
    if not dirs and code.fallback and environ.get(code.fallback):
        entries = environ[code.fallback].split(":")
        dirs = tuple(d for d in entries if exists(os.path.join(d, code.fallback_file or code.required)))
        how = "fallback"
    if any(exists(os.path.join(d, code.required)) for d in dirs):
        return LookupResult(True, how, dirs, listed)
    return LookupResult(False, "not-listed", dirs, listed, error=code.says)
