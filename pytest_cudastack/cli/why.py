"""``cudastack why SONAME``: where a program started from this interpreter would find SONAME, and which
installed distributions ship it (those of ``--site DIR...`` when given, else this interpreter's).

Exit status: 0 when the dynamic linker would find it, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Library, Resolver, SearchConfig
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels

__all__ = ["cmd_why", "render_why"]

logger = logging.getLogger(__name__)


def _inventory(site: Sequence[str] | None, reader: Callable[[str], ElfInfo]) -> Inventory | None:
    """The wheels inventory of *site* (site directories or venv prefixes; None: this interpreter's), its ELF
    files parsed with *reader*; None when it cannot be read."""
    try:
        return installed_wheels(list(site) if site is not None else None, reader=reader)
    except Exception as e:  # the inventory must never break why
        logger.warning("cannot read installed distributions: %s", e)
        return None


def _why_data(soname: str, lib: Library, inv: Inventory | None) -> dict[str, Any]:
    shipped: list[dict[str, Any]] = []
    if inv is not None:
        try:
            for dist, path in inv.shipping(soname):
                shipped.append({"distribution": str(dist.label), "path": path, "exists": os.path.exists(path)})
        except Exception as e:  # pragma: no cover - inventory bug
            logger.warning("inventory.shipping(%s) failed: %s", soname, e)
    data = lib.to_json()
    data["shipped_by"] = shipped
    return data


def render_why(data: dict[str, Any], out: TextIO) -> None:
    soname = data["soname"]
    if data["path"]:
        owner = f" ({data['provider']})" if data["provider"] else ""
        detail = data["route_detail"] or data["route"]
        out.write(f"{soname} => {data['path']} [{detail}]{owner}\n")
        if data["realpath"] and data["realpath"] != data["path"]:
            out.write(f"  realpath: {data['realpath']}\n")
    else:
        out.write(f"{soname} => NOT FOUND by the dynamic linker (loader: {data['needed_by'][0]})\n")
    if data["problem"]:
        out.write(f"  problem: {data['problem']}\n")
    if data["tried"]:
        out.write("  tried:\n")
        for t in data["tried"]:
            out.write(f"    {t}\n")
    if data["shipped_by"]:
        out.write("shipped by:\n")
        for s in data["shipped_by"]:
            state = "" if s["exists"] else "  (listed in RECORD but MISSING on disk)"
            out.write(f"  {s['distribution']}: {s['path']}{state}\n")
    else:
        out.write("shipped by: no installed distribution\n")


def cmd_why(args: argparse.Namespace) -> int:
    """``cudastack why SONAME [--json] [--site DIR]``: exit 1 when the dynamic linker would not find it."""
    cache = ElfCache()
    inv = _inventory(getattr(args, "site", None), cache.read)
    resolver = Resolver(
        SearchConfig.from_environment(), reader=cache.read, owner=inv.owner if inv is not None else None
    )
    lib = resolver.find(args.soname)
    cache.flush()
    data = _why_data(args.soname, lib, inv)
    if getattr(args, "json", False):
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        render_why(data, sys.stdout)
    return 0 if lib.path is not None else 1
