"""``cudastack why SONAME``: where SONAME would be loaded from on this machine, and which installed
distributions ship it (those of ``--site DIR...`` when given, else this interpreter's).

The answer is the one a real load gives: SONAME resolved as a DT_NEEDED of each installed consumer (an
extension module or library in the inventory whose DT_NEEDED names it: torch's ``libtorch_cuda.so`` finds
``libcudnn.so.9`` through its RUNPATH), and of the Python executable (a program or ``ctypes.CDLL`` started
from this interpreter). When two distributions' RECORDs list the path it loads from, the bytes on disk are
attributed as the integrity check attributes them (:func:`pytest_cudastack.wheels.ownership.bytes_on_disk`).

Exit status: 0 when some load on this machine would find it, 1 when none would (NOT FOUND), 2 for a path
(``why`` takes a soname; ``cudastack tree PATH`` gives a file's closure).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from pytest_cudastack.cli.colour import Painter, painter_for
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.escape import printable_data
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Library, Resolver, SearchConfig
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from pytest_cudastack.wheels.ownership import bytes_on_disk

__all__ = ["WHY_SCHEMA", "WHY_VERSION", "cmd_why", "consumers_of", "render_why"]

WHY_SCHEMA = "pytest-cudastack/why"  # ``why --json``'s document: schemas/why.schema.json
WHY_VERSION = 1

logger = logging.getLogger(__name__)


def _inventory(site: Sequence[str] | None, reader: Callable[[str], ElfInfo]) -> Inventory | None:
    """The wheels inventory of *site* (site directories or venv prefixes; None: this interpreter's), its ELF
    files parsed with *reader*; None when it cannot be read."""
    try:
        return installed_wheels(list(site) if site is not None else None, reader=reader)
    except Exception as e:  # the inventory must never break why
        logger.warning("cannot read installed distributions: %s", e)
        return None


def consumers_of(soname: str, inv: Inventory | None, reader: Callable[[str], ElfInfo]) -> tuple[str, ...]:
    """The installed files (RECORD-listed, on disk) whose DT_NEEDED names ``soname``, in inventory order."""
    out: list[str] = []
    for dist in getattr(inv, "distributions", ()):
        for lib in dist.libraries:
            if not lib.exists or lib.path in out:
                continue
            try:
                needed = reader(lib.path).needed
            except Exception as e:  # an unreadable file needs nothing we can name
                logger.debug("%s: %s", lib.path, e)
                continue
            if soname in needed:
                out.append(lib.path)
    return tuple(out)


def _on_disk(inv: Inventory | None, path: str | None) -> dict[str, Any] | None:
    """Whose bytes are at ``path`` when two or more distributions' RECORDs list it; None otherwise."""
    if inv is None or path is None or not hasattr(inv, "owners"):
        return None
    try:
        claimed = inv.owners(path)
        if len(claimed) < 2:
            return None
        real = os.path.realpath(path)
        whose, undecided = bytes_on_disk(inv, real)
        if not whose and not undecided and real != os.path.normpath(path):
            whose, undecided = bytes_on_disk(inv, os.path.normpath(path))
    except Exception as e:  # pragma: no cover - inventory bug
        logger.warning("bytes on disk of %s: %s", path, e)
        return None
    return {
        "claimed_by": [d.label for d in claimed],
        "bytes_of": [d.label for d in whose],
        "undecided": undecided,
    }


def _answer(lib: Library, inv: Inventory | None, owner: Callable[[str | None], str | None]) -> dict[str, Any]:
    data = lib.to_json()
    data["tried"] = list(lib.searched)  # directories, not the candidate file names
    data["needed_by_providers"] = [owner(p) for p in lib.needed_by]
    data["on_disk"] = _on_disk(inv, lib.path)
    return data


def _why_data(soname: str, executable: Library, consumers: Sequence[Library], inv: Inventory | None) -> dict[str, Any]:
    def owner(path: str | None) -> str | None:
        try:
            return inv.owner(path) if inv is not None and path is not None else None
        except Exception:  # pragma: no cover - inventory bug
            return None

    shipped: list[dict[str, Any]] = []
    if inv is not None:
        try:
            for dist, path in inv.shipping(soname):
                shipped.append({"distribution": str(dist.label), "path": path, "exists": os.path.exists(path)})
        except Exception as e:  # pragma: no cover - inventory bug
            logger.warning("inventory.shipping(%s) failed: %s", soname, e)
    # one answer per place it loads from (consumers that find it the same way are one answer)
    answers: list[dict[str, Any]] = []
    for lib in consumers:
        data = _answer(lib, inv, owner)
        found = data["path"] is not None
        same = next((a for a in answers if a["path"] == data["path"] and (found or a["tried"] == data["tried"])), None)
        if same is not None:
            same["needed_by"].extend(data["needed_by"])
            same["needed_by_providers"].extend(data["needed_by_providers"])
        else:
            answers.append(data)
    answers.sort(key=lambda a: a["path"] is None)  # what loads first, then what each failing consumer tried
    exe = _answer(executable, inv, owner)
    best = next((a for a in answers if a["path"] is not None), None)
    if best is None:
        best = exe if exe["path"] is not None or not answers else answers[0]
    return {
        "schema": WHY_SCHEMA,
        "version": WHY_VERSION,
        **best,
        "soname": soname,
        "found": any(a["path"] is not None for a in (*answers, exe)),
        "consumers": answers,
        "executable": exe,
        "shipped_by": shipped,
    }


def _render_answer(a: dict[str, Any], out: TextIO, paint: Painter, label: str) -> None:
    soname = a["soname"]
    if a["path"]:
        owner = f" ({a['provider']})" if a["provider"] else ""
        detail = a["route_detail"] or a["route"]
        out.write(f"{soname} => {a['path']} [{detail}]{owner}{label}\n")
        if a["realpath"] and a["realpath"] != a["path"]:
            out.write(f"  realpath: {a['realpath']}\n")
    else:
        out.write(f"{soname} => {paint('NOT FOUND', 'red')}{label}\n")
    if a["problem"]:
        out.write(f"  problem: {a['problem']}\n")
    disk = a.get("on_disk")
    if disk:
        if disk["bytes_of"]:
            whose = " / ".join(disk["bytes_of"])
            out.write(f"  bytes on disk: {whose}'s (the path is listed by {', '.join(disk['claimed_by'])})\n")
        else:
            state = "not attributable without a hash" if disk["undecided"] else "matching no RECORD"
            out.write(f"  bytes on disk: {state} (the path is listed by {', '.join(disk['claimed_by'])})\n")
    if a["path"] is None and a["tried"]:
        out.write("  tried:\n")
        for t in a["tried"]:
            out.write(f"    {t}\n")


def render_why(data: dict[str, Any], out: TextIO, paint: Painter | None = None) -> None:
    """The human view: each consumer's answer (who needs it, from where it loads, whose bytes), then the
    Python executable's own search, then who ships it."""
    paint = paint or Painter(False)
    for a in data["consumers"]:
        _render_answer(a, out, paint, "")
        needers = list(zip(a["needed_by"], a["needed_by_providers"], strict=True))
        shown = [path + (f" ({owner})" if owner else "") for path, owner in needers[:3]]
        more = f", and {len(needers) - 3} more" if len(needers) > 3 else ""
        out.write(f"  needed by: {', '.join(shown)}{more}\n")
    exe = data["executable"]
    loader = exe["needed_by"][0] if exe["needed_by"] else "?"
    if data["consumers"]:
        if exe["path"] != next((a["path"] for a in data["consumers"] if a["path"]), None):
            found = exe["path"] or "NOT FOUND"
            out.write(f"as a DT_NEEDED of the Python executable ({loader}): {found}\n")
    else:
        _render_answer(exe, out, paint, "" if exe["path"] else f" by the dynamic linker (loader: {loader})")
    if data["shipped_by"]:
        out.write("shipped by:\n")
        for s in data["shipped_by"]:
            state = "" if s["exists"] else "  (listed in RECORD but MISSING on disk)"
            out.write(f"  {s['distribution']}: {s['path']}{state}\n")
    else:
        out.write("shipped by: no installed distribution\n")


def _in_image(args: argparse.Namespace) -> tuple[Library, list[Library], Inventory | None]:
    """``why --image``: the soname searched as the image's program and each consumer in the image's wheels
    needs it, by the image's search."""
    # lazy: only an image's why opens an image
    from pytest_cudastack.cli.image import image_stack

    stack = image_stack(args)
    try:
        inv = stack.inventory
        executable = stack.find(args.soname)
        loaders = consumers_of(args.soname, inv, stack.cache.read)
        consumers = [stack.resolver.find(args.soname, loader=stack.resolver.logical(p)) for p in loaders]
    finally:
        stack.flush_cache()
    return executable, consumers, inv


def cmd_why(args: argparse.Namespace) -> int:
    """``cudastack why SONAME [--json] [--site DIR | --image IMAGE]``: exit 1 when no load on this machine (or
    in the image) would find it, 2 for a path: a file's own closure is ``cudastack tree PATH``'s answer (a soname
    never holds a ``/``)."""
    if "/" in args.soname:
        print(
            f"cudastack why: error: {args.soname}: a path; why takes a soname (libcudnn.so.9) and says where it "
            f"loads from: for the libraries this file loads, run: cudastack tree {args.soname}",
            file=sys.stderr,
        )
        return 2
    if getattr(args, "image", None):
        inv: Inventory | None
        try:
            executable, consumers, inv = _in_image(args)
        except CudaStackError as e:
            print(f"cudastack why: error: {e}", file=sys.stderr)
            return 2
    else:
        cache = ElfCache()
        inv = _inventory(getattr(args, "site", None), cache.read)
        resolver = Resolver(
            SearchConfig.from_environment(), reader=cache.read, owner=inv.owner if inv is not None else None
        )
        executable = resolver.find(args.soname)
        consumers = [resolver.find(args.soname, loader=p) for p in consumers_of(args.soname, inv, cache.read)]
        cache.flush()
    data = _why_data(args.soname, executable, consumers, inv)
    if getattr(args, "json", False):
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        render_why(printable_data(data), sys.stdout, painter_for(getattr(args, "color", None), sys.stdout))
    return 0 if data["found"] else 1
