"""``cudastack tree``: the resolver's load closures for humans and scripts.

``tree PATH...`` prints, for each file, the whole closure the dynamic linker would load (not the file itself,
not the vDSO; the program interpreter is listed when something needs it, as ``ldd`` lists it), with each
library's route, owning distribution and every place tried for a missing one; with ``--gpu-code``, the GPU
code of each library that carries some (``{SASS ...; PTX ...}``; ``--no-gpu-code``, the default, leaves it
out). ``--json`` prints design.md's list
``[{"path", "libraries": [{"soname", "path", "needed_by", "provider"}]}]`` (with ``--gpu-code`` each library
also has ``"gpu_code"``, ``{"sass": [...], "ptx": [...]}`` as ``report --json`` and the snapshot list it, null
for a library not found) as the ``"trees"`` of
``{"schema": "pytest-cudastack/tree", "version": 1, "trees": [...]}`` (``schemas/tree.schema.json``; a constant
prefix and suffix, so cached rows are still written verbatim). ``tree --site DIR...`` takes owners from those
directories instead of the site directories the closures touch.
Exit status: 0 when everything resolves, 1 when something is missing or unreadable.
"""

from __future__ import annotations

import io
import json
import os
import sys

# Everything else is imported in the function that needs it: a warm `tree --json` (answered from the closure
# cache) must import no resolver, ELF reader, dataclasses, typing or logging (tests/test_treeview.py).
from pytest_cudastack._sysio import open_regular  # loaded with elfcache anyway
from pytest_cudastack.errors import ElfError, UnreadableFile  # loaded with elfcache anyway
from pytest_cudastack.escape import printable
from pytest_cudastack.linker.elfcache import ElfCache

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~5 ms) on tree's warm path
if TYPE_CHECKING:
    import argparse
    import logging
    from collections.abc import Callable, Sequence
    from typing import Any, TextIO

    from pytest_cudastack.linker.fatbin import Fatbin
    from pytest_cudastack.linker.resolver import Library, Tree

__all__ = ["TREE_SCHEMA", "TREE_VERSION", "cmd_tree", "render_tree"]

TREE_SCHEMA = "pytest-cudastack/tree"
TREE_VERSION = 1


def _log() -> logging.Logger:
    """This module's logger, imported when first needed (``tree --json``'s warm path never logs)."""
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    import logging

    return logging.getLogger(__name__)


def _site_dirs_for(paths: Sequence[str]) -> list[str]:
    """site-packages directories holding *paths* (so a venv's files get their owners)."""
    out: list[str] = []
    heads: dict[str, None] = {}
    for p in dict.fromkeys(paths):
        head, sep, base = p.rpartition("/")
        # the directory of a plain last component is its head: one abspath per directory, not per file
        heads["d" + (head or "/") if sep and base not in (".", "..") else "f" + p] = None
    parents = (os.path.abspath(h[1:]) if h[0] == "d" else os.path.dirname(os.path.abspath(h[1:])) for h in heads)
    for parent in dict.fromkeys(parents):
        parts = parent.split(os.sep)
        for i in range(len(parts) - 1, 0, -1):
            if parts[i] in ("site-packages", "dist-packages"):
                d = os.sep.join(parts[: i + 1])
                if d not in out:
                    out.append(d)
                break
    return out


def _owner_index(site: Sequence[str]) -> Any | None:
    """A path -> owner index over *site* (RECORD files only: no ELF reads, no flavour rules); None when
    unavailable."""
    try:
        # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
        from pytest_cudastack.wheels.sitepaths import owner_index
    except ImportError:
        return None
    try:
        return owner_index(list(site))
    except Exception as e:  # the inventory must never break tree
        _log().warning("cannot read installed distributions: %s", e)
        return None


_OWNERS_KEY = "treeview-owners"
_OWNERS_KEPT = 8  # site-directory sets remembered in the cache


class _Providers:
    """The owner of each library path (callable), from an owner index, with answers kept in the ELF cache
    file under the stamp of the RECORD/METADATA files they came from: a warm run reads no RECORD while none
    changed. Each answer is kept with the real path of the normalised absolute path it was given (the owner
    index falls back to it when the path is in no RECORD) and reused only while that is unchanged."""

    def __init__(self, index: Any | None, cache: ElfCache | None) -> None:
        self.index = index
        self.cache = cache
        self.stamp: Any = None
        self.saved: dict[str, Any] = {}
        self.answers: dict[str, Any] = {}
        self.new: dict[str, list[str | None]] = {}
        self.key = ""
        self._dirs: dict[str, str] = {}
        if index is None:
            return
        try:
            self.stamp = index.stamp()
        except Exception as e:  # an inventory bug must not break tree
            _log().debug("owner stamp failed: %s", e)
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
        new = self.new.get(path)
        if new is not None:
            return new[0]
        # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
        from pytest_cudastack.linker.treecache import dep_value

        real = dep_value("r" + path, self._dirs)
        hit = self.answers.get(path)
        if isinstance(hit, list) and len(hit) == 2 and hit[1] == real and (hit[0] is None or isinstance(hit[0], str)):
            owner: str | None = hit[0]
        else:
            try:
                got = self.index.owner(path)
            except Exception as e:  # an inventory bug must not break tree
                _log().debug("owner(%s) failed: %s", path, e)
                got = None
            owner = got if isinstance(got, str) else None
        self.new[path] = [owner, real]
        return owner

    def save(self) -> None:
        """Put new answers into the cache (written by the next flush)."""
        if not self.new or self.cache is None or self.stamp is None:
            return
        kept = {k: v for k, v in self.saved.items() if k != self.key}
        while len(kept) >= _OWNERS_KEPT:
            kept.pop(next(iter(kept)))
        kept[self.key] = {"stamp": self.stamp, "answers": {**self.answers, **self.new}}
        self.cache.put_extra(_OWNERS_KEY, kept)


def _providers(trees: list[Tree], site: Sequence[str] | None, cache: ElfCache) -> _Providers:
    """Owners from the RECORDs of *site*, else of the site directories the closures touch (a file outside
    every site directory has no wheel owner, so system-only closures read no RECORD)."""
    if site is None:
        touched = [t.path for t in trees] + [x.path for t in trees for x in t.libraries if x.path]
        site = _site_dirs_for(touched)
    index = _owner_index(site) if site else None
    return _Providers(index, cache if index is not None else None)


def _with_providers(trees: list[Tree], prov: Callable[[str | None], str | None]) -> list[Tree]:
    """*trees* with Library.provider filled (for the human view)."""
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    import dataclasses

    return [
        dataclasses.replace(t, libraries=tuple(dataclasses.replace(x, provider=prov(x.path)) for x in t.libraries))
        for t in trees
    ]


def _memo_fatbin(cache: ElfCache) -> Callable[[str], Fatbin]:
    """``cache.fatbin`` answered once per path in this run: closures share most libraries, and each cache
    hit re-stats the file and decodes its entry."""
    memo: dict[str, Fatbin | ElfError] = {}

    def read(path: str) -> Fatbin:
        got = memo.get(path)
        if got is None:
            try:
                got = memo[path] = cache.fatbin(path)
            except ElfError as e:
                got = memo[path] = e
        if isinstance(got, ElfError):
            raise got
        return got

    return read


def _gpu_text(cache: ElfCache) -> Callable[[str], str]:
    """The text ``tree --gpu-code`` shows after a library: "SASS sm_80; PTX compute_80", "" for none."""
    # lazy: only `tree --gpu-code` reads GPU code
    from pytest_cudastack.cuda.gpucode import gpu_code_text, path_gpu_code

    fatbins = _memo_fatbin(cache)

    def code(path: str) -> str:
        got = path_gpu_code(path, fatbins)
        return gpu_code_text(got) if got is not None else ""

    return code


def _tag(lib: Library) -> str:
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    from pytest_cudastack.linker.resolver import Route

    if lib.route in (Route.RPATH, Route.RUNPATH) and lib.route_detail:
        return lib.route_detail
    if lib.route == Route.ALREADY_LOADED:
        return "already loaded" + (f": {lib.route_detail}" if lib.route_detail.startswith("the ") else "")
    return str(lib.route.value)


def render_tree(tree: Tree, out: TextIO, gpu_code: Callable[[str], str] | None = None) -> None:
    """The human view: an indented tree, one line per library, missing ones marked, with tried paths.

    Depth-first with an explicit stack of (children, next index, prefix) frames, not recursion: a chain of
    thousands of libraries renders line by line (a 1,000-deep chain overflowed Python's recursion limit).
    ``gpu_code`` gives the text shown after a library that carries device code ("SASS sm_80, sm_90; PTX
    compute_90"), "" for none."""
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    from pytest_cudastack.linker.resolver import Route

    out.write(f"{tree.path}\n")
    for p in tree.problems:
        out.write(f"  ! {p}\n")
    root_code = gpu_code(tree.path) if gpu_code is not None else ""
    if root_code:
        out.write(f"  GPU code: {root_code}\n")
    children: dict[str, list[Library]] = {}
    for lib in tree.libraries:
        for parent in lib.needed_by:
            children.setdefault(parent, []).append(lib)
    expanded: set[str] = set()
    frames: list[tuple[list[Library], int, str]] = [(children.get(tree.path, []), 0, "")]
    while frames:
        kids, i, prefix = frames[-1]
        if i == len(kids):
            frames.pop()
            continue
        frames[-1] = (kids, i + 1, prefix)
        lib = kids[i]
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
        code = gpu_code(lib.path) if gpu_code is not None and not seen else ""
        code = f" {{{code}}}" if code else ""
        out.write(f"{prefix}{branch}{lib.soname} => {lib.path} [{_tag(lib)}]{owner}{note}{code}\n")
        if lib.problem:
            out.write(f"{prefix}{more}  note: {lib.problem}\n")
        if not seen and lib.route != Route.ALREADY_LOADED:
            expanded.add(lib.path)
            frames.append((children.get(lib.path, []), 0, prefix + more))
    missing = tree.missing
    if missing:
        out.write(f"  {len(missing)} missing: {', '.join(m.soname for m in missing)}\n")


def cmd_tree(args: argparse.Namespace) -> int:
    """``cudastack tree PATH... [--json] [--site DIR]``."""
    paths: list[str] = list(args.paths)
    site: Sequence[str] | None = getattr(args, "site", None)
    # opt-in: even read header to header, the fatbins of the torch venv's CUDA libraries (cuFFT's 24,000
    # containers, cuBLASLt's) double a cold run, past its target of 0.25x ldd; the facts are cached like the
    # ELF facts. `--no-gpu-code` is accepted too, for scripts that say what they want
    gpu: bool = getattr(args, "gpu_code", False)
    if getattr(args, "image", None):
        return _image_trees(args, paths, gpu)
    # a PATH that cannot be opened is the README's "unreadable input" (exit 2), not a finding about a file:
    # its tree is still printed, with why, among the others
    unreadable = [why for why in map(_unreadable, dict.fromkeys(paths)) if why is not None]
    code = _tree_json(paths, site, gpu) if getattr(args, "json", False) else _tree_text(paths, site, gpu)
    for why in unreadable:
        sys.stderr.write(f"cudastack tree: error: {why}\n")
    return 2 if unreadable else code


def _unreadable(path: str) -> str | None:
    """Why ``path`` cannot be read as a file (missing, unreadable, a directory, a FIFO), or None."""
    try:
        fd, _st = open_regular(path, UnreadableFile, fill=False)
    except UnreadableFile as e:
        return str(e)
    os.close(fd)
    return None


def _tree_text(paths: list[str], site: Sequence[str] | None, gpu: bool) -> int:
    """``tree PATH...``: each tree rendered as text; 1 when a library is missing or a file has a problem."""
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    from pytest_cudastack.linker.resolver import Resolver, SearchConfig

    cache = ElfCache()
    resolver = Resolver(SearchConfig.from_environment(), reader=cache.read)
    trees = [resolver.tree(p) for p in paths]
    prov = _providers(trees, site, cache)
    trees = _with_providers(trees, prov)
    prov.save()
    texts = []
    code = _gpu_text(cache) if gpu else None
    for t in trees:
        buf = io.StringIO()
        render_tree(t, buf, code)
        texts.append(buf.getvalue())
    cache.flush()  # after the fatbin reads: they are cached too
    for text in texts:
        sys.stdout.write(printable(text, newlines=True))
    return 1 if any(t.missing or t.problems for t in trees) else 0


def _image_trees(args: argparse.Namespace, paths: list[str], gpu: bool) -> int:
    """``tree --image IMAGE PATH...``: each PATH (a path in the image) resolved by the image's search, owners
    from its wheels; no closure cache (the image's root is its own cache entry)."""
    # lazy: only an image's tree opens an image (and its GPU code, with --gpu-code)
    from pytest_cudastack.cli.image import image_stack
    from pytest_cudastack.cuda.gpucode import with_gpu_code
    from pytest_cudastack.errors import CudaStackError

    stack = image_stack(args)
    try:
        trees = [stack.tree(p if p.startswith("/") else "/" + p) for p in paths]
        code = _gpu_text(stack.cache) if gpu else None
        if getattr(args, "json", False):
            fatbins = _memo_fatbin(stack.cache)
            rows = []
            for t in trees:
                d = t.to_json()
                if gpu:
                    with_gpu_code(d, fatbins)
                rows.append(json.dumps(d))
            _write_trees(rows)
        else:
            for t in trees:
                render_tree(t, sys.stdout, code)
    except CudaStackError as e:
        print(f"cudastack tree: error: {e}", file=sys.stderr)
        return 2
    finally:
        stack.flush_cache()
    return 1 if any(t.missing or t.problems for t in trees) else 0


def _provider_context(index: Any | None, since_ns: int) -> tuple[str, bool]:
    """(the context providers are computed under, whether rows may be stored with it): the site directories
    and the stamp of their RECORD/METADATA files; "" without an owner index (every provider None). Not
    storable while a stamped file's mtime is within the racy window of the run's start."""
    if index is None:
        return "", True
    try:
        stamp = index.stamp()
        dirs = list(index.site_dirs)
    except Exception as e:  # an inventory bug must not break tree
        _log().debug("owner stamp failed: %s", e)
        return "?", False
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    from pytest_cudastack.linker import treecache

    fresh = True
    for row in stamp if isinstance(stamp, list) else ():
        for x in row if isinstance(row, list) else ():
            if isinstance(x, list) and len(x) == 3 and isinstance(x[2], int) and x[2] + treecache.RACY_NS > since_ns:
                fresh = False
    return json.dumps([dirs, stamp], separators=(",", ":")), fresh


def _tree_json(paths: list[str], site: Sequence[str] | None, gpu: bool = False) -> int:
    """``tree --json``: rows from the closure cache where every file and directory they were read from is
    unchanged (see :mod:`pytest_cudastack.linker.treecache`), the resolver for the rest."""
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    import time

    since = time.time_ns()  # before anything is read: the racy window is measured from here
    cache = ElfCache()  # parses nothing until asked: the warm path never loads it
    store = _closure_store(cache, since, gpu)
    hits: dict[str, dict[str, Any]] = store.lookup(paths) if store is not None else {}
    fatbins = _memo_fatbin(cache)
    fresh, cacheable = _resolve_rest([p for p in dict.fromkeys(paths) if p not in hits], cache)
    libpaths = _library_paths(store, hits, fresh)
    index = _owners(paths, site, libpaths)
    ctx, ctx_storable = _provider_context(index, since)
    rows = _JsonRows(cache, store if cacheable else None, index, fatbins if gpu else None, since)
    for p in paths:
        entry = hits.get(p)
        if entry is not None and store.ctx_of(entry) == ctx:
            rows.add_cached(entry)
        else:
            rows.add(p, entry, fresh, libpaths[p], ctx if ctx_storable else None)
    _save(rows, cache, store)
    _write_trees(rows.rows)
    return 1 if rows.fail else 0


def _owners(paths: list[str], site: Sequence[str] | None, libpaths: dict[str, list[str]]) -> Any | None:
    """The owner index over *site*, or (None given) over the site directories holding the files and their
    libraries; None when there is none."""
    if site is None:
        site = _site_dirs_for(list(paths) + [x for p in dict.fromkeys(paths) for x in libpaths[p]])
    return _owner_index(site) if site else None


def _save(rows: _JsonRows, cache: ElfCache, store: Any) -> None:
    """Write what the run learnt: the providers' answers, the ELF cache, the closure cache (a failure to
    write that one is a warning)."""
    if rows.prov is not None:
        rows.prov.save()
    cache.flush()  # a no-op when nothing was parsed or stored
    if store is not None and (error := store.flush()) is not None:
        _log().warning("cannot write closure cache %s: %s", store.file, error)


def _closure_store(cache: ElfCache, since: int, gpu: bool) -> Any:
    """The closure cache of this run (None while the ELF cache is off); not writable in the racy window."""
    if not cache.enabled:
        return None
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    from pytest_cudastack.linker.treecache import TreeCache, environment_key, racy

    key, ldcache = environment_key()
    # no ld.so.cache: the answers come from ld.so.conf and its includes, which are not tracked
    # rows with GPU code are another bucket: a row of one kind is never printed for the other
    store = TreeCache(cache.directory, key + (" gpu_code" if gpu else ""), enabled=isinstance(ldcache, list))
    store.writable = not racy(ldcache, since)
    if store.refused is not None:
        cache.refuse(store.refused)  # off for the run, with the one warning
    return store


def _resolve_rest(todo: list[str], cache: ElfCache) -> tuple[dict[str, tuple[Tree, frozenset[str]]], bool]:
    """The trees (and dependencies) of the files the closure cache did not answer, and whether they may be
    stored: only answers from the host's ld.so.cache under the real root are."""
    fresh: dict[str, tuple[Tree, frozenset[str]]] = {}
    if not todo:
        return fresh, True
    # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
    from pytest_cudastack.linker.resolver import Resolver, SearchConfig

    resolver = Resolver(SearchConfig.from_environment(), reader=cache.read)
    cacheable = resolver.config.ld_cache is not None and resolver.config.root in ("", "/")
    for p in todo:
        fresh[p] = resolver.tree_deps(p)
    return fresh, cacheable


def _library_paths(
    store: Any, hits: dict[str, dict[str, Any]], fresh: dict[str, tuple[Tree, frozenset[str]]]
) -> dict[str, list[str]]:
    """The found library paths of each tree, in load order, from its cached row or its fresh tree."""
    libpaths: dict[str, list[str]] = {p: store.paths_of(e) for p, e in hits.items()}
    for p, (t, _deps) in fresh.items():
        libpaths[p] = list(dict.fromkeys(x.path for x in t.libraries if x.path is not None))
    return libpaths


class _JsonRows:
    """The rows of one ``tree --json`` run, and whether any tree failed; *store* is None where rows are
    not to be stored, *fatbins* None without ``--gpu-code``."""

    def __init__(
        self, cache: ElfCache, store: Any | None, index: Any | None, fatbins: Callable[[str], Fatbin] | None, since: int
    ) -> None:
        self.cache = cache
        self.store = store
        self.index = index
        self.fatbins = fatbins
        self.since = since
        self.prov: _Providers | None = None
        self.rows: list[str] = []
        self.fail = False

    def add_cached(self, entry: dict[str, Any]) -> None:
        """A cached row whose providers were found under the same site directories: printed as stored."""
        self.rows.append(entry["row"])
        self.fail = self.fail or entry["fail"]

    def add(
        self,
        p: str,
        entry: dict[str, Any] | None,
        fresh: dict[str, tuple[Tree, frozenset[str]]],
        libpaths: list[str],
        ctx: str | None,
    ) -> None:
        """The row of *p* made anew, from its cached closure (found under other site directories) or its
        fresh tree, with GPU code (fresh trees only) and providers; stored under *ctx* where allowed."""
        d, bad, deps = _row_source(p, entry, fresh, self.store)
        if self.prov is None:
            self.prov = _Providers(self.index, self.cache if self.index is not None else None)
        if self.fatbins is not None and entry is None:  # a cached row already holds its files' GPU code
            # lazy: a warm `tree --json` imports no resolver, ELF reader, dataclasses or logging
            from pytest_cudastack.cuda.gpucode import with_gpu_code

            with_gpu_code(d, self.fatbins)
        prov = self.prov
        for lib in d["libraries"]:
            lib["provider"] = prov(lib["path"])
        text = json.dumps(d)
        self.rows.append(text)
        self.fail = self.fail or bad
        if self.store is not None:
            # an owner is looked up by realpath when the path is not in a RECORD
            deps.update("r" + x for x in libpaths)
            self.store.store(p, text, bad, libpaths, deps, ctx, self.since)


def _row_source(
    p: str, entry: dict[str, Any] | None, fresh: dict[str, tuple[Tree, frozenset[str]]], store: Any | None
) -> tuple[dict[str, Any], bool, set[str]]:
    """The JSON mapping of *p*'s row, whether it fails, and what it depends on (keys, empty where nothing
    is stored): from its cached entry, else from its fresh tree."""
    if entry is not None:
        bad: bool = entry["fail"]
        return json.loads(entry["row"]), bad, store.deps_of(entry) if store is not None else set()
    tree, got = fresh[p]
    return tree.to_json(), bool(tree.missing or tree.problems), set(got)


def _write_trees(rows: list[str]) -> None:
    """Print the rows as one ``tree --json`` document: indented for a terminal, compact otherwise."""
    head = f'{{"schema": "{TREE_SCHEMA}", "version": {TREE_VERSION}, "trees": ['
    if sys.stdout.isatty():  # a human is watching: indented (the compact form needs no re-encoding)
        sys.stdout.write(json.dumps(json.loads(head + ", ".join(rows) + "]}"), indent=1))
    else:
        sys.stdout.write(head + ", ".join(rows) + "]}")
    sys.stdout.write("\n")
