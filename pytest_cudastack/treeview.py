"""``cudastack tree`` and ``cudastack why``: the resolver's answers for humans and scripts.

``tree PATH...`` prints, for each file, the whole closure the dynamic linker would load (not the file itself,
not the vDSO; the program interpreter is listed when something needs it, as ``ldd`` lists it), with each
library's route, owning distribution, and every place tried for a missing one. ``--json`` prints design.md's
list ``[{"path", "libraries": [{"soname", "path", "needed_by", "provider"}]}]``. ``why SONAME`` says where a
program started from this interpreter would find SONAME and which installed distributions ship it (those of
``--site DIR...`` when given, else this interpreter's). ``tree --site DIR...`` takes owners from those
directories instead of the site directories the closures touch.
Exit status: 0 when everything resolves, 1 when something is missing or unreadable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from .resolver import Library, Resolver, Route, SearchConfig, Tree

__all__ = ["cmd_tree", "cmd_why", "render_tree", "render_why"]

log = logging.getLogger(__name__)


def _site_dirs_for(paths: Sequence[str]) -> list[str]:
    """site-packages directories holding *paths* (so a venv's files get their owners)."""
    out: list[str] = []
    for parent in dict.fromkeys(os.path.dirname(os.path.abspath(p)) for p in paths):
        parts = parent.split(os.sep)
        for i in range(len(parts) - 1, 0, -1):
            if parts[i] in ("site-packages", "dist-packages"):
                d = os.sep.join(parts[: i + 1])
                if d not in out:
                    out.append(d)
                break
    return out


def _inventory(site: Sequence[str] | None = None) -> Any | None:
    """The wheels inventory of *site* (site directories or venv prefixes; None: this interpreter's);
    lazily imported and guarded: None when unavailable or broken."""
    try:
        from . import inventory
    except ImportError:
        return None
    try:
        return inventory.installed_wheels(list(site) if site is not None else None)
    except Exception as e:  # the inventory must never break tree/why
        log.warning("cannot read installed distributions: %s", e)
        return None


def _owner_index(site: Sequence[str]) -> Any | None:
    """A path -> owner index over *site* (RECORD files only: no ELF reads, no flavour rules); None when
    unavailable."""
    try:
        from .sitepaths import owner_index
    except ImportError:
        return None
    try:
        return owner_index(list(site))
    except Exception as e:  # the inventory must never break tree
        log.warning("cannot read installed distributions: %s", e)
        return None


_OWNERS_KEY = "treeview-owners"
_OWNERS_KEPT = 8  # site-directory sets remembered in the cache


class _Providers:
    """The owner of each library path (callable), from an owner index, with answers kept in the ELF cache
    file under the stamp of the RECORD/METADATA files they came from: a warm run reads no RECORD while none
    changed."""

    def __init__(self, index: Any | None, cache: Any | None) -> None:
        self.index = index
        self.cache = cache
        self.stamp: Any = None
        self.saved: dict[str, Any] = {}
        self.answers: dict[str, Any] = {}
        self.new: dict[str, str | None] = {}
        self.key = ""
        if index is None:
            return
        try:
            self.stamp = index.stamp()
        except Exception as e:  # an inventory bug must not break tree
            log.debug("owner stamp failed: %s", e)
            return
        self.key = "\0".join(index.site_dirs)
        saved = cache.get_extra(_OWNERS_KEY) if cache is not None else None
        self.saved = saved if isinstance(saved, dict) else {}
        entry = self.saved.get(self.key)
        if isinstance(entry, dict) and entry.get("stamp") == self.stamp and isinstance(entry.get("answers"), dict):
            self.answers = entry["answers"]

    def __call__(self, path: str | None) -> str | None:
        if path is None or self.index is None:
            return None
        hit = self.answers.get(path, False)
        if hit is False:
            hit = self.new.get(path, False)
        if hit is False:
            try:
                hit = self.index.owner(path)
            except Exception as e:  # an inventory bug must not break tree
                log.debug("owner(%s) failed: %s", path, e)
                hit = None
            self.new[path] = hit
        return hit if isinstance(hit, str) else None

    def save(self) -> None:
        """Put new answers into the cache (written by the next flush)."""
        if not self.new or self.cache is None or self.stamp is None:
            return
        kept = {k: v for k, v in self.saved.items() if k != self.key}
        while len(kept) >= _OWNERS_KEPT:
            kept.pop(next(iter(kept)))
        kept[self.key] = {"stamp": self.stamp, "answers": {**self.answers, **self.new}}
        self.cache.put_extra(_OWNERS_KEY, kept)


def _providers(trees: list[Tree], site: Sequence[str] | None) -> _Providers:
    """Owners from the RECORDs of *site*, else of the site directories the closures touch (a file outside
    every site directory has no wheel owner, so system-only closures read no RECORD)."""
    if site is None:
        touched = [t.path for t in trees] + [x.path for t in trees for x in t.libraries if x.path]
        site = _site_dirs_for(touched)
    index = _owner_index(site) if site else None
    return _Providers(index, _cache() if index is not None else None)


def _with_providers(trees: list[Tree], prov: Callable[[str | None], str | None]) -> list[Tree]:
    """*trees* with Library.provider filled (for the human view)."""
    return [
        dataclasses.replace(t, libraries=tuple(dataclasses.replace(x, provider=prov(x.path)) for x in t.libraries))
        for t in trees
    ]


def _owner(inv: Any | None) -> Callable[[str], str | None] | None:
    if inv is None:
        return None
    owner: Callable[[str], str | None] = inv.owner
    return owner


def _tag(lib: Library) -> str:
    if lib.route in (Route.RPATH, Route.RUNPATH) and lib.route_detail:
        return lib.route_detail
    if lib.route == Route.ALREADY_LOADED:
        return "already loaded" + (f": {lib.route_detail}" if lib.route_detail.startswith("the ") else "")
    return str(lib.route.value)


def render_tree(tree: Tree, out: TextIO) -> None:
    """The human view: an indented tree, one line per library, missing ones marked, with tried paths."""
    out.write(f"{tree.path}\n")
    for p in tree.problems:
        out.write(f"  ! {p}\n")
    children: dict[str, list[Library]] = {}
    for lib in tree.libraries:
        for parent in lib.needed_by:
            children.setdefault(parent, []).append(lib)
    expanded: set[str] = set()

    def walk(parent: str, prefix: str) -> None:
        kids = children.get(parent, [])
        for i, lib in enumerate(kids):
            last = i == len(kids) - 1
            branch = "└── " if last else "├── "
            more = "    " if last else "│   "
            if lib.path is None:
                out.write(f"{prefix}{branch}{lib.soname} => NOT FOUND\n")
                if lib.problem:
                    out.write(f"{prefix}{more}  problem: {lib.problem}\n")
                if lib.tried:
                    tried = list(dict.fromkeys(lib.tried))  # ld.so retries a directory on two lists
                    out.write(f"{prefix}{more}  tried: {', '.join(tried)}\n")
                continue
            owner = f" ({lib.provider})" if lib.provider else ""
            seen = lib.path in expanded
            note = " (see above)" if seen and lib.route != Route.ALREADY_LOADED else ""
            out.write(f"{prefix}{branch}{lib.soname} => {lib.path} [{_tag(lib)}]{owner}{note}\n")
            if lib.problem:
                out.write(f"{prefix}{more}  note: {lib.problem}\n")
            if not seen and lib.route != Route.ALREADY_LOADED:
                expanded.add(lib.path)
                walk(lib.path, prefix + more)

    walk(tree.path, "")
    missing = tree.missing
    if missing:
        out.write(f"  {len(missing)} missing: {', '.join(m.soname for m in missing)}\n")


def cmd_tree(args: argparse.Namespace) -> int:
    """``cudastack tree PATH... [--json] [--site DIR]``."""
    paths: list[str] = list(args.paths)
    site: Sequence[str] | None = getattr(args, "site", None)
    resolver = Resolver(SearchConfig.from_environment())
    trees = [resolver.tree(p) for p in paths]
    prov = _providers(trees, site)
    if getattr(args, "json", False):
        data = []
        for t in trees:
            d = t.to_json()
            for lib in d["libraries"]:
                lib["provider"] = prov(lib["path"])
            data.append(d)
        prov.save()
        _flush_cache()
        # compact unless a human is watching: the C encoder is only used without indent
        indent = 1 if sys.stdout.isatty() else None
        sys.stdout.write(json.dumps(data, indent=indent))
        sys.stdout.write("\n")
    else:
        trees = _with_providers(trees, prov)
        prov.save()
        _flush_cache()
        for t in trees:
            render_tree(t, sys.stdout)
    return 1 if any(t.missing or t.problems for t in trees) else 0


def _why_data(soname: str, lib: Library, inv: Any | None) -> dict[str, Any]:
    shipped: list[dict[str, Any]] = []
    if inv is not None:
        try:
            for dist, path in inv.shipping(soname):
                shipped.append({"distribution": str(dist.label), "path": path, "exists": os.path.exists(path)})
        except Exception as e:  # pragma: no cover - inventory bug
            log.warning("inventory.shipping(%s) failed: %s", soname, e)
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
    """``cudastack why SONAME [--json]``: exit 1 when the dynamic linker would not find it."""
    inv = _inventory(getattr(args, "site", None))
    resolver = Resolver(SearchConfig.from_environment(), owner=_owner(inv))
    lib = resolver.find(args.soname)
    _flush_cache()
    data = _why_data(args.soname, lib, inv)
    if getattr(args, "json", False):
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        render_why(data, sys.stdout)
    return 0 if lib.path is not None else 1


def _cache() -> Any | None:
    """The process-wide ELF cache (None when the core lacks it)."""
    try:
        from .elfcache import default_cache
    except ImportError:  # pragma: no cover
        return None
    return default_cache()


def _flush_cache() -> None:
    cache = _cache()
    if cache is not None:
        cache.flush()
