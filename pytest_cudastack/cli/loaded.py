"""``cudastack loaded MODULE``: which shared objects does importing MODULE map?

The import runs in a child process (``sys.executable``, on purpose: importing may dlopen CUDA libraries,
which the inspecting process must never do). The child lists ``/proc/self/maps`` before and after the
import and prints the new file-backed mappings as JSON; the parent adds each file's soname (``read_elf``)
and owning distribution (``Inventory.owner``).
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

__all__ = ["LOADED_SCHEMA", "LOADED_VERSION", "LoadedLibrary", "cmd_loaded", "loaded_libraries"]

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


def cmd_loaded(args: argparse.Namespace) -> int:
    """``cudastack loaded MODULE [--json]``: exit 0, or 1 when the import failed."""
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
