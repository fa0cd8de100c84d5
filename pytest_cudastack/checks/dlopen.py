"""Does every library that loads others at run time (dlopen) find them, and the right version?

The callers are every present, RECORD-listed shared library of the inventory. For each, the rows of
``cuda/data/dlopen_targets.json`` whose ``caller`` matches it (:mod:`pytest_cudastack.cuda.dlopen`) give
the names it opens; each is resolved the way that caller would (``Resolver.dlopen``: glibc's search from
the calling object, or the row's explicit paths). Findings, the caller named in each:

* a miss: ERROR for a ``fatal`` row, WARNING for a ``fallback`` row (saying what silently happens
  instead), INFO for an ``optional`` row; a driver soname (``libcuda.so.1``) missing on a machine without
  the driver is INFO, as in the closure check;
* a wrong-version hit: the file found is built for another CUDA major than the caller (its soname or
  DT_NEEDED majors, ``compat.soname_cuda_majors``), at the row's severity;
* library names written in the read-only data (``linker/strings.py``) of a library loaded at import that no
  row, no DT_NEEDED, no driver and no file here accounts for: INFO, one per distribution, "may load at run
  time".

A caller that an extension module's closure maps is resolved with the chain that loaded it (glibc searches
the RPATHs of the loader chain: libnvrtc.so.13, with no RPATH of its own, finds its builtins through
libtorch_cuda.so's); a shipped library that no extension module loads is judged alone, its misses INFO.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from pytest_cudastack.cuda.compat import is_driver_soname
from pytest_cudastack.cuda.dlopen import Miss
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Facts, Finding, Manual, Severity, manual
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.resolver import Resolver
from pytest_cudastack.linker.strings import StringFacts
from pytest_cudastack.model.modules import Caller, ModuleTree, callers
from pytest_cudastack.model.reach import judge_reach
from pytest_cudastack.model.repair import NO_SAFE_REPAIR
from pytest_cudastack.model.runtime import Load, caller_majors, expand_origin, loads_of, read_or_none

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.wheels.inventory import Inventory

__all__ = ["dlopen_findings", "run"]

_SEVERITY: Mapping[Miss, Severity] = MappingProxyType(
    {Miss.FATAL: Severity.ERROR, Miss.FALLBACK: Severity.WARNING, Miss.OPTIONAL: Severity.INFO}
)


def dlopen_findings(
    inv: Inventory,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    strings: Callable[[str], StringFacts],
    trees: Sequence[ModuleTree],
) -> tuple[Finding, ...]:
    """The ``dlopen`` findings for every caller of ``inv`` (module docstring; ``trees``: its module trees). A
    caller no extension module loads is judged alone (its loader chain unknown): its misses are INFO."""
    findings: list[Finding] = []
    unexplained: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for c in callers(inv, trees):
        info = read_or_none(read, c.path)
        if info is None:
            continue
        loads = loads_of(c.path, info, resolver, strings, c.loaded, loaders=c.loaders or ())
        for ld in loads:
            f = _load_finding(ld, info, inv, read)
            if f is not None:
                if c.loaders is None and f.severity is not Severity.INFO:
                    f = replace(
                        f,
                        severity=Severity.INFO,
                        message=f.message + " (judged alone: no extension module loads the caller)",
                    )
                findings.append(f)
        if c.loaders is not None:
            covered = {ld.name for ld in loads}
            notes = _unexplained(c.path, info, covered, resolver, strings, inv, c)
            if notes:
                unexplained.setdefault(c.owner, []).extend(notes)
    for owner, notes in unexplained.items():
        searched: list[str] = []  # where the dynamic linker's search for those names looked, in order
        for _, dirs in notes:
            searched.extend(d for d in dirs if d not in searched)
        findings.append(
            Finding(
                check="dlopen",
                severity=Severity.INFO,
                subject=owner or "unowned libraries",
                message=f"{len(notes)} library name(s) in the read-only data of its libraries loaded at import "
                "may load at run time and are not found here",
                cause="a name written in a library's data is what it can pass to dlopen; no DT_NEEDED lists "
                "it, so only the feature that opens it fails, when used",
                remedies=manual("install the library that provides the name only if you use that feature"),
                where=tuple(searched),
                details=tuple(note for note, _ in notes),  # every one: the text rendering caps, --json keeps all
            )
        )
    return tuple(findings)


def _unexplained(
    path: str,
    info: ElfInfo,
    covered: set[str],
    resolver: Resolver,
    strings: Callable[[str], StringFacts],
    inv: Inventory,
    c: Caller,
) -> list[tuple[str, tuple[str, ...]]]:
    try:
        names = strings(path).names
    except ElfError:
        return []
    skip = covered | set(info.needed) | {info.soname}
    out: list[tuple[str, tuple[str, ...]]] = []
    here = os.path.dirname(path)
    for name in names:
        # cuDNN 9 writes "libcudnn_graph.so" and appends its major: the table's name covers the string
        if name in skip or is_driver_soname(name) or any(t.startswith(name + ".") for t in covered):
            continue
        lib = resolver.dlopen(name, path, c.loaded, c.loaders or ())
        if lib.path is not None:
            continue
        # a versioned file of that name beside the caller: the program may append the version (as cuDNN does)
        try:
            beside = sorted(e for e in os.listdir(here) if e.startswith(name + "."))
        except OSError:
            beside = []
        found = f"not found as written; {beside[0]} is beside it" if beside else "not found"
        out.append((f"{inv.relative(path)} may load {name} ({found})", lib.searched))
    return out


def _load_finding(ld: Load, caller: ElfInfo, inv: Inventory, read: Callable[[str], ElfInfo]) -> Finding | None:
    lib = ld.library
    who = inv.relative(ld.caller)
    severity = _SEVERITY[ld.row.miss]
    source = f"cuda/data/dlopen_targets.json (source {ld.row.source})"
    if lib.path is None:
        if is_driver_soname(ld.name):
            return Finding(
                check="dlopen",
                severity=Severity.INFO,
                subject=ld.name,
                message=f"{ld.name}: loaded at run time by {who}, provided by the NVIDIA driver, not found here",
                cause="no NVIDIA driver is installed on this machine",
                remedies=manual("nothing to do for a build or CI machine; on a GPU machine install the NVIDIA driver"),
                where=lib.searched[:12],
                chain=(who,),
            )
        consequence = {
            Miss.FATAL: "the feature that needs it fails when first used",
            Miss.FALLBACK: f"silent fallback: {ld.row.fallback}",
            Miss.OPTIONAL: "an optional feature is unavailable",
        }[ld.row.miss]
        how = (
            "opened by full path " + ", ".join(os.path.join(expand_origin(d, ld.caller), ld.name) for d in ld.row.paths)
            if ld.row.search == "paths"
            else "searched as glibc's dlopen from the caller does (its RPATH unless RUNPATH, LD_LIBRARY_PATH, its "
            "RUNPATH, ld.so.cache, default directories)"
        )
        shipped = [f"{d.label} ships it at {inv.relative(p)}" for d, p in inv.shipping(ld.name) if os.path.lexists(p)]
        return Finding(
            check="dlopen",
            severity=severity,
            subject=ld.name,
            message=f"{ld.name} is not found: loaded at run time (dlopen) by {who}; {consequence}",
            cause=f"{how}; no file of that name is there"
            + (f" ({'; '.join(shipped)}, outside that search)" if shipped else "")
            + (f"; {ld.row.note}" if ld.row.note else ""),
            remedies=manual(
                f"{NO_SAFE_REPAIR}: nothing installed here provides it to check. By hand: install the library "
                f"that provides {ld.name} where {who} looks for it"
                + (
                    " (its own directory)"
                    if ld.row.search == "paths"
                    else " (a wheel on its RPATH/RUNPATH, or ld.so.cache)"
                )
            ),
            where=lib.searched[:12] or tuple(os.path.dirname(t) for t in lib.tried[:12]),
            facts=Facts(required=ld.name, sonames=(ld.name,), objects=(ld.caller,), tried=lib.tried),
            chain=(who,),
            details=(f"the table row: {source}",),
        )
    want = caller_majors(caller)
    got_info = read_or_none(read, lib.path)
    got = caller_majors(got_info) if got_info is not None else frozenset()
    if want and got and not want & got:
        return Finding(
            check="dlopen",
            severity=severity,
            subject=ld.name,
            message=f"{ld.name} loaded at run time by {who} is built for CUDA {'/'.join(map(str, sorted(got)))}; "
            f"{who} is built for CUDA {'/'.join(map(str, sorted(want)))}",
            cause=f"found at {lib.path} ({lib.route.value}{': ' + lib.route_detail if lib.route_detail else ''}), "
            "the first match of the caller's search, from another CUDA release",
            remedies=(
                Manual(
                    (
                        f"install {ld.name} of CUDA {'/'.join(map(str, sorted(want)))} where {who} finds it first",
                        f"or remove {lib.path} from its search",
                    ),
                    why=f"{NO_SAFE_REPAIR}: the right build is not installed here to check",
                ),
            ),
            where=(os.path.dirname(lib.path),),
            facts=Facts(sonames=(ld.name,), objects=(ld.caller, lib.path), tried=lib.tried),
            chain=(who, lib.path),
            details=(f"the table row: {source}",),
        )
    return None


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``dlopen`` item: the run-time loads of every shipped library of the stack's inventory. A fatal miss
    is an ERROR when an import that will happen loads its caller, else a WARNING naming the import after
    which the feature would fail (:func:`~pytest_cudastack.model.reach.judge_reach`)."""
    trees = stack.module_trees
    found = dlopen_findings(stack.inventory, stack.resolver, stack.cache.read, stack.cache.read_strings, trees)
    return judge_reach(
        found, stack.reachability, trees, lambda f: f.facts.objects[:1], lead=lambda name: f"after `import {name}`"
    )
