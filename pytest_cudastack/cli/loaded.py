"""``cudastack loaded MODULE``: which shared objects does importing MODULE map?

The import runs in a child process (``sys.executable``, on purpose: importing may dlopen CUDA libraries,
which the inspecting process must never do). The child lists ``/proc/self/maps`` before and after the
import and prints the new file-backed mappings as JSON; the parent adds each file's soname (``read_elf``)
and owning distribution (``Inventory.owner``). ``--static`` imports nothing: the objects are predicted from
the files (:mod:`pytest_cudastack.checks.process`), each with its route and reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.elf import looks_like_elf, read_elf
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.wheels.inventory import installed_wheels

__all__ = ["LOADED_SCHEMA", "LOADED_VERSION", "LoadedLibrary", "cmd_loaded", "loaded_libraries", "static_document"]

# --json's document: pytest_cudastack/schemas/loaded.schema.json
LOADED_SCHEMA = "pytest-cudastack/loaded"
LOADED_VERSION = 1

logger = logging.getLogger(__name__)

_MARK = "cudastack-loaded:"
# The "before" picture is taken before the child imports anything a module might import (json's _json
# extension among them): until the "after" picture only builtins and the frozen importlib are used.
_CHILD = r"""
import sys

def mapped():
    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                path = parts[5].rstrip("\n")
                if path.endswith(" (deleted)"):
                    continue
                if path not in paths:
                    paths.append(path)
    return paths

before = set(mapped())
error = None
try:
    import importlib
    importlib.import_module(sys.argv[1])
except BaseException as e:  # report, never hide: the parent turns this into exit status 1
    error = f"{type(e).__name__}: {e}"
after = [p for p in mapped() if p not in before]
import json
sys.stdout.write("\ncudastack-loaded:" + json.dumps({"paths": after, "error": error}) + "\n")
"""


@dataclass(frozen=True)
class LoadedLibrary:
    """A shared object mapped by the import: its path, soname (None if it has none) and owner."""

    path: str
    soname: str | None
    provider: str | None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "soname": self.soname, "provider": self.provider}


def _child_mapped(module: str, python: str, timeout: float) -> tuple[list[str], str | None]:
    proc = subprocess.run(
        [python, "-c", _CHILD, module],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    try:
        data = json.loads(lines[-1][len(_MARK) :]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return [], f"the child process failed: {tail[0]}"
    return [str(p) for p in data.get("paths", [])], data.get("error")


def loaded_libraries(
    module: str, python: str | None = None, timeout: float = 300.0, site_paths: Sequence[str] | None = None
) -> tuple[tuple[LoadedLibrary, ...], str | None]:
    """Shared objects mapped by importing ``module`` in a child ``python`` (default: this one), and the
    import error if any. Providers come from the distributions in ``site_paths`` (default: ``sys.path``)."""
    paths, error = _child_mapped(module, python or sys.executable, timeout)
    cache = ElfCache()
    inventory = installed_wheels(site_paths, reader=cache.read)
    cache.flush()
    out: list[LoadedLibrary] = []
    for path in paths:
        if not looks_like_elf(path):
            continue  # data files the import mapped (locale archives, .pyc caches)
        try:
            soname = read_elf(path).soname
        except ElfError as e:
            logger.debug("%s", e)
            soname = None
        out.append(LoadedLibrary(path, soname, inventory.owner(path)))
    return tuple(out), error


def static_document(module: str, site_paths: Sequence[str] | None = None) -> tuple[dict[str, Any], bool]:
    """``loaded MODULE --static --json``'s document (the ``loaded`` schema with ``route`` and ``reason`` per
    library, ``run_time`` and ``missing``), and whether the prediction is clean (module found, nothing
    missing). Predicted by :func:`~pytest_cudastack.checks.process.predict_import` for this interpreter
    with the site directories of ``site_paths`` (default: ``sys.path``); nothing is imported."""
    # lazy: the import model (ast, the resolver) only for --static
    from pytest_cudastack.checks.process import Interpreter, predict_import
    from pytest_cudastack.linker.resolver import Resolver, SearchConfig
    from pytest_cudastack.wheels.sitepaths import owner_index

    cache = ElfCache()
    owners = owner_index(site_paths)  # RECORDs only: no ELF read or flavour rule for the provider column
    resolver = Resolver(SearchConfig.from_environment(), reader=cache.read, owner=owners.owner)
    interp = Interpreter.for_sites(owners.site_dirs)
    process = predict_import(module, interp, resolver, cache.read, owners.owner, cache.read_strings, cache=cache)
    cache.flush()

    def row(o: Any) -> dict[str, Any]:
        return {"path": o.path, "soname": o.soname, "provider": o.provider, "route": o.route, "reason": o.reason}

    data: dict[str, Any] = {
        "schema": LOADED_SCHEMA,
        "version": LOADED_VERSION,
        "module": module,
        "static": True,
        "libraries": [row(o) for o in process.objects],
        "run_time": [row(o) for o in process.run_time],
        "missing": list(process.missing),
    }
    if process.problems:
        data["error"] = "; ".join(process.problems[:4])
    return data, not process.problems and not process.missing


def _print_static(data: dict[str, Any]) -> None:
    libs = data["libraries"]
    print(f"{data['module']}: {len(libs)} shared objects the import would map (predicted, nothing imported)")
    for lib in libs:
        extra = f"  ({lib['provider']})" if lib["provider"] else ""
        print(f"  {lib['soname'] or os.path.basename(lib['path'])} => {lib['path']}{extra}  [{lib['reason']}]")
    if data["run_time"]:
        print(f"later, when used ({len(data['run_time'])} loaded by dlopen):")
        for lib in data["run_time"]:
            print(f"  {lib['soname']} => {lib['path']}  [{lib['reason']}]")
    for soname in data["missing"]:
        print(f"  {soname} => not found", file=sys.stderr)
    if "error" in data:
        print(f"prediction incomplete: {data['error']}", file=sys.stderr)


def _cmd_static(args: argparse.Namespace) -> int:
    doc, clean = static_document(args.module)
    if getattr(args, "json", False):
        print(json.dumps(doc, indent=2))
    else:
        _print_static(doc)
    return 0 if clean else 1


def cmd_loaded(args: argparse.Namespace) -> int:
    """``cudastack loaded MODULE [--static] [--json]``: exit 0, or 1 when the import failed (with
    ``--static``: when the module is not found or a soname would be missing)."""
    if getattr(args, "static", False):
        return _cmd_static(args)
    libs, error = loaded_libraries(args.module)
    if getattr(args, "json", False):
        data: dict[str, Any] = {
            "schema": LOADED_SCHEMA,
            "version": LOADED_VERSION,
            "module": args.module,
            "libraries": [lib.to_json() for lib in libs],
        }
        if error:
            data["error"] = error
        print(json.dumps(data, indent=2))
    else:
        print(f"{args.module}: {len(libs)} shared objects mapped by the import")
        for lib in libs:
            extra = f"  ({lib.provider})" if lib.provider else ""
            print(f"  {lib.soname or os.path.basename(lib.path)} => {lib.path}{extra}")
        if error:
            print(f"import failed: {error}", file=sys.stderr)
    return 1 if error else 0
