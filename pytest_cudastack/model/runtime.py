"""Run-time loads: the libraries a loaded library opens with dlopen, resolved the way that caller would.

The names come from the rows of ``cuda/data/dlopen_targets.json`` whose ``caller`` matches the library
(:mod:`pytest_cudastack.cuda.dlopen`); each is resolved by ``Resolver.dlopen`` (glibc's search from the
calling object, its loaders' RPATHs included) or by the row's explicit paths. The callers are listed by
:func:`pytest_cudastack.model.modules.callers`. The dlopen check judges these loads; the import model lists
them as ``Process.run_time``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pytest_cudastack.cuda.compat import soname_cuda_majors
from pytest_cudastack.cuda.dlopen import DlopenRow, load_dlopen_targets
from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.resolver import Library, Resolver
from pytest_cudastack.linker.strings import StringFacts

__all__ = ["Load", "caller_majors", "expand_origin", "loads_of", "read_or_none"]


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
) -> tuple[Load, ...]:
    """The run-time loads the data table gives ``path`` (``info`` its ELF facts), each resolved as that
    caller would with ``loaded`` already in the process and ``loaders`` the objects that loaded it (nearest
    first: their RPATHs are searched); ``strings`` reads its read-only data (the run's
    ``ElfCache.read_strings``), only for a row that names targets by pattern."""
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
                    resolver.dlopen(os.path.join(expand_origin(d, path), name), path, loaded, loaders)
                    for d in row.paths
                ]
                hit = next((t for t in tries if t.path is not None), tries[-1])  # paths: non-empty (validated)
                lib = replace(hit, soname=name, tried=tuple(x for t in tries for x in t.tried))
            else:
                lib = resolver.dlopen(name, path, loaded, loaders)
            out.append(Load(path, row, name, lib))
    return tuple(out)


def read_or_none(resolver_read: Callable[[str], ElfInfo], path: str) -> ElfInfo | None:
    try:
        return resolver_read(path)
    except ElfError:
        return None
