"""Run-time loads: the libraries a loaded library opens with dlopen, resolved the way that caller would.

The names come from the rows of ``cuda/data/dlopen_targets.json`` whose ``caller`` matches the library
(:mod:`pytest_cudastack.cuda.dlopen`) and from the library names in the caller's read-only data
(:mod:`pytest_cudastack.linker.strings`); each is resolved by ``Resolver.dlopen`` (glibc's search from the
calling object, its loaders' RPATHs included) or by the row's explicit paths. The callers are listed by
:func:`pytest_cudastack.model.modules.callers`. The dlopen check judges these loads; the import model lists
them as ``Process.run_time``.

Chains (:func:`run_time_chain`): an object a run-time load maps brings its own DT_NEEDED
(``Resolver.opened_tree``: searched from it; glibc gives it no loader, so the caller's RPATHs do not
apply) and its own run-time loads, judged from it in the same process (what is loaded by then),
transitively: cuDNN 8's ``libcudnn.so.8`` opens ``libcudnn_cnn_infer.so.8``, which opens ``libnvrtc.so``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from pytest_cudastack.cuda.compat import is_driver_soname, soname_cuda_majors
from pytest_cudastack.cuda.dlopen import DlopenRow, load_dlopen_targets
from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.resolver import Library, Resolver, Route, Tree
from pytest_cudastack.linker.strings import StringFacts

__all__ = [
    "MAX_REACHED",
    "Context",
    "Load",
    "Reached",
    "Want",
    "caller_majors",
    "expand_origin",
    "family",
    "loads_of",
    "read_or_none",
    "run_time_chain",
    "wants_of",
]

MAX_REACHED = 4096  # objects one chain walk judges at most: a hostile table of names cannot make it endless


@dataclass(frozen=True)
class Load:
    """One run-time load a caller performs: the row that says so, the name opened and where it resolves."""

    caller: str
    row: DlopenRow
    name: str
    library: Library


def caller_majors(info: ElfInfo) -> frozenset[int]:
    """The CUDA majors a file is built for: those its soname and its DT_NEEDED sonames all allow (cuDNN 8's
    soname allows CUDA 11 and 12; its libcublas.so.11 decides), or all they name when they disagree."""
    sets = [m for name in (info.soname, *info.needed) if name and (m := soname_cuda_majors(name))]
    if not sets:
        return frozenset()
    common = frozenset.intersection(*sets)
    return common or frozenset().union(*sets)


def expand_origin(directory: str, caller: str) -> str:
    origin = os.path.dirname(caller) or "."
    return directory.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)


def loads_of(
    path: str,
    info: ElfInfo,
    resolver: Resolver,
    strings: Callable[[str], StringFacts],
    loaded: Sequence[str] = (),
    rows: Sequence[DlopenRow] | None = None,
    loaders: Sequence[str] = (),
    names: Mapping[str, str] | None = None,
) -> tuple[Load, ...]:
    """The run-time loads the data table gives ``path`` (``info`` its ELF facts), each resolved as that
    caller would with ``loaded`` already in the process (``names``: the names they were opened as) and
    ``loaders`` the objects that loaded it (nearest first: their RPATHs are searched); ``strings`` reads its
    read-only data (the run's ``ElfCache.read_strings``), only for a row that names targets by pattern."""
    out: list[Load] = []
    for row in load_dlopen_targets() if rows is None else rows:
        m = row.match(info.soname, os.path.basename(path))
        if m is None:
            continue
        found: Sequence[str] = ()
        if row.strings is not None:
            try:
                found = strings(path).names
            except ElfError:
                found = ()
        for name in row.targets(m, found):
            if row.search == "paths":
                tries = [
                    resolver.dlopen(os.path.join(expand_origin(d, path), name), path, loaded, loaders, names=names)
                    for d in row.paths
                ]
                hit = next((t for t in tries if t.path is not None), tries[-1])  # paths: non-empty (validated)
                lib = replace(hit, soname=name, tried=tuple(x for t in tries for x in t.tried))
            else:
                lib = resolver.dlopen(name, path, loaded, loaders, names=names)
            out.append(Load(path, row, name, lib))
    return tuple(out)


def read_or_none(resolver_read: Callable[[str], ElfInfo], path: str) -> ElfInfo | None:
    try:
        return resolver_read(path)
    except ElfError:
        return None


def family(name: str) -> str:
    """A library's family: its file name before ``.so`` (``libcudnn_graph.so.9`` and ``libcudnn_graph.so``
    are ``libcudnn_graph``; ``libnvrtc-builtins.so.13.0`` is ``libnvrtc-builtins``, not ``libnvrtc``)."""
    base = os.path.basename(name)
    i = base.find(".so")
    return base[:i] if i > 0 else base


@dataclass(frozen=True)
class Context:
    """The process a caller runs in: the objects that loaded it (nearest first: their RPATHs are searched),
    what is loaded (paths, in load order), the names they were opened as (``(name, path)``), and ``via``:
    the objects from the one an import maps to the caller, root first, the caller last."""

    loaders: tuple[str, ...] = ()
    loaded: tuple[str, ...] = ()
    names: tuple[tuple[str, str], ...] = ()
    via: tuple[str, ...] = ()


@dataclass(frozen=True)
class Want:
    """A name ``caller`` may open at run time and where it resolves: a table row's (``row``) or one written
    in its read-only data (``row`` None)."""

    caller: str
    name: str
    library: Library
    row: DlopenRow | None


@dataclass(frozen=True)
class Reached:
    """A caller in a process: its path, ELF facts and context; ``opened``: its own DT_NEEDED closure when a
    run-time load mapped it (None for one an import maps), ``by``: that load."""

    path: str
    info: ElfInfo
    context: Context
    opened: Tree | None = None
    by: Want | None = None


def wants_of(
    path: str,
    info: ElfInfo,
    resolver: Resolver,
    strings: Callable[[str], StringFacts],
    ctx: Context,
    rows: Sequence[DlopenRow] | None = None,
    data_names: bool = True,
) -> tuple[Want, ...]:
    """Every name ``path`` may open at run time, resolved in ``ctx``: the table's loads, then (``data_names``)
    the library names in its read-only data that are not its own soname, its DT_NEEDED, a table target or
    the driver's."""
    names = dict(ctx.names)
    out = [
        Want(path, ld.name, ld.library, ld.row)
        for ld in loads_of(path, info, resolver, strings, ctx.loaded, rows, ctx.loaders, names)
    ]
    if not data_names:
        return tuple(out)
    try:
        found = strings(path).names
    except ElfError:
        found = ()
    skip = {w.name for w in out} | set(info.needed) | {info.soname}
    for name in found:
        if name in skip or is_driver_soname(name):
            continue
        skip.add(name)
        out.append(Want(path, name, resolver.dlopen(name, path, ctx.loaded, ctx.loaders, names=names), None))
    return tuple(out)


def run_time_chain(
    start: Reached,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    strings: Callable[[str], StringFacts],
    seen: set[str],
    rows: Sequence[DlopenRow] | None = None,
    data_names: bool = True,
) -> list[tuple[Reached, tuple[Want, ...]]]:
    """``start`` and every object its run-time loads map, transitively, each with what it may open: an
    object a load finds (not one already loaded) is mapped with its DT_NEEDED closure in the caller's
    process (``Resolver.opened_tree``), and it and the objects of that closure are callers in turn, their
    loader chains ending at the object opened (which has no loader). ``seen`` (real paths) holds the
    objects judged already, by this walk or another (each is judged once, in the first context that maps
    it); at most :data:`MAX_REACHED`.
    ``data_names``: whether the names in each object's read-only data count (:func:`wants_of`)."""
    out: list[tuple[Reached, tuple[Want, ...]]] = []
    queue = [start]
    seen.add(os.path.realpath(start.path))
    while queue and len(out) < MAX_REACHED:
        r = queue.pop(0)
        wants = wants_of(r.path, r.info, resolver, strings, r.context, rows, data_names)
        out.append((r, wants))
        loaded = list(r.context.loaded)
        names = list(r.context.names)
        for w in wants:
            lib = w.library
            if lib.path is None or lib.route is Route.ALREADY_LOADED:
                continue
            key = lib.realpath or os.path.realpath(lib.path)
            if key in seen:
                continue
            seen.add(key)
            tree = resolver.opened_tree(lib.path, loaded, names=dict(names))
            loaded.append(lib.path)
            names.append((w.name, lib.path))
            fresh = [x for x in tree.libraries if x.path is not None and x.route is not Route.ALREADY_LOADED]
            loaded.extend(x.path for x in fresh if x.path is not None)
            names.extend((x.soname, x.path) for x in fresh if x.path is not None)
            # the object opened has no loader (glibc drops the caller after the search: __RTLD_CALLMAP), so
            # its own loads search its RPATH, then the program's; its dependencies', up to it
            ctx = Context((), tuple(loaded), tuple(names), (*r.context.via, lib.path))
            info = read_or_none(read, lib.path)
            if info is None:
                continue
            queue.append(Reached(lib.path, info, ctx, tree, w))
            for x in fresh:
                k = x.realpath or os.path.realpath(x.path or "")
                xi = read_or_none(read, x.path) if x.path is not None and k not in seen else None
                if x.path is None or xi is None:
                    continue
                seen.add(k)
                chain = tuple(reversed(tree.chain(x.soname)))
                queue.append(Reached(x.path, xi, replace(ctx, loaders=chain, via=(*ctx.via, x.path))))
    return out
