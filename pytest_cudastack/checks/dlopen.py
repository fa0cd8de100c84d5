"""Does every library that loads others at run time (dlopen) find them, and the right copy?

The callers are every present, RECORD-listed shared library of the inventory, and every object their run-time
loads map, transitively (:func:`~pytest_cudastack.model.runtime.run_time_chain`: a library a load finds
brings its DT_NEEDED and its own run-time loads, judged from it in its caller's process: cuDNN 8's
``libcudnn.so.8`` opens ``libcudnn_cnn_infer.so.8``, which opens ``libnvrtc.so``). What a caller may open:
the rows of ``cuda/data/dlopen_targets.json`` whose ``caller`` matches it and the library names in its
read-only data (``linker/strings.py``), each resolved as glibc's dlopen from that caller does
(``Resolver.dlopen``). Names are judged by library family (the file name before ``.so``): a caller that
holds several names of one family (``libnvrtc.so.13`` and ``libnvrtc.so``) tries them in turn, so a family
fails only when none of its names resolves, and is on a wrong copy only when none resolves to a right one.

* resolves nowhere while the family is installed (a wheel's RECORD or ld.so.cache) where the caller's search
  does not reach it, or only under another name or major: ERROR for a table row (the load fails, or the
  framework silently drops the GPU), naming where the family is, why the search misses it, and the remedy
  (that directory on ``LD_LIBRARY_PATH`` where the name itself is there). For names found only in the data,
  a WARNING (evidence, not proof: only the feature that opens it fails, if used), and only when the data
  says which library: that very name is installed, or a versioned name's family at another version (an
  unversioned development name such as ``libudev.so`` is a fallback candidate: a note);
* names found only in the data are no finding at all while an object of their family built for the
  caller's CUDA major is mapped in the caller's process (CUPTI's ``libcupti.so.12`` names ``libcudart.so``
  beside the ``libcudart.so.12`` torch's import maps);
* resolves nowhere and the family is not installed at all: the row's severity for a table row (``fatal``
  ERROR, ``fallback`` WARNING, ``optional`` INFO; the driver's ``libcuda.so.1`` INFO), an INFO for a name
  found in the data, one per distribution, "may load at run time" (an optional feature);
* resolves to a copy built for another CUDA major than the caller (``compat.soname_cuda_majors``; a WARNING
  at most for a name found only in the data, such as a host toolkit's copy through ld.so.cache), or to a
  copy of another version than the one the caller's own distribution, or a distribution it requires, ships
  under that name (another wheel, ``LD_LIBRARY_PATH``, ld.so.cache, a default directory): ERROR naming both
  copies, both versions and the route for a table row (a WARNING when the version of the copy found is
  unknown: no distribution here owns it and its file name stops at the soname, as another venv's wheel; none
  when its bytes are the caller's own copy's), INFO for a name found in the data (it may be opened by a full
  path instead);
* an object a run-time load maps whose own DT_NEEDED are missing: its load fails, at that load's severity
  (INFO for a name found in the data).

A caller that an extension module's closure maps is resolved with the chain that loaded it (glibc searches
the RPATHs of the loader chain), in the process of the import that loads the module, as the import model
predicts it once that import is complete (``Stack.import_scopes``): every object it mapped satisfies a
``dlopen`` of one of its names before any search (glibc's ``_dl_map_object``), so torch's preload of
``libnvrtc.so.12`` is what cuDNN's engines and cuBLASLt open later; a shipped library that neither an
import nor a run-time load maps is judged alone, its findings INFO. Errors are judged by reachability
(:func:`~pytest_cudastack.model.reach.judge_reach` on the first object of ``chain``, the one an import
maps): a WARNING naming the import when none that will happen loads it.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement

from pytest_cudastack._sysio import open_span
from pytest_cudastack.cuda.compat import is_driver_soname
from pytest_cudastack.cuda.dlopen import Miss, load_features
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Facts, Finding, Manual, Remedy, SearchPath, Severity, manual
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.resolver import Library, Resolver, Route, Tree
from pytest_cudastack.linker.strings import StringFacts
from pytest_cudastack.model.modules import ModuleTree, callers
from pytest_cudastack.model.reach import judge_reach
from pytest_cudastack.model.repair import NO_SAFE_REPAIR
from pytest_cudastack.model.runtime import (
    Context,
    Reached,
    Want,
    caller_majors,
    expand_origin,
    family,
    read_or_none,
    run_time_chain,
)

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.model.process import ImportScope
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = ["dlopen_findings", "run"]

_SEVERITY: Mapping[Miss, Severity] = MappingProxyType(
    {Miss.FATAL: Severity.ERROR, Miss.FALLBACK: Severity.WARNING, Miss.OPTIONAL: Severity.INFO}
)


@dataclass(frozen=True)
class _Copy:
    """An installed library of a family: its path, the name it is known by (file name or ld.so.cache key)
    and the distribution shipping it (None: an ld.so.cache entry)."""

    path: str
    name: str
    dist: Distribution | None


class _Installed:
    """The families installed in the stack: every present RECORD-listed library of the inventory, then the
    ld.so.cache entries, by family (built once per run)."""

    def __init__(self, inv: Inventory, resolver: Resolver) -> None:
        self._by: dict[str, list[_Copy]] = {}
        for d in inv.distributions:
            for lib in d.libraries:
                if lib.exists:
                    for n in dict.fromkeys((os.path.basename(lib.path), lib.soname)):
                        if n:
                            self._by.setdefault(family(n), []).append(_Copy(lib.path, n, d))
        self._cached: dict[str, list[str]] = {}  # the ld.so.cache's entries by family, their keys in cache order
        cache = resolver.config.ld_cache
        for e in cache.entries if cache is not None else ():
            self._cached.setdefault(family(e.soname), []).append(e.soname)
        self._cache = cache
        self._root = resolver.config.root.rstrip("/")

    def of(self, fam: str) -> list[_Copy]:
        """The family's copies: the wheels' first, then each ld.so.cache entry whose file exists."""
        out = list(self._by.get(fam, ()))
        if self._cache is not None:
            for key in dict.fromkeys(self._cached.get(fam, ())):
                for e in self._cache.candidates(key):
                    if os.path.exists(self._root + e.path):
                        out.append(_Copy(e.path, e.soname, None))
        return out


def dlopen_findings(
    inv: Inventory,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    strings: Callable[[str], StringFacts],
    trees: Sequence[ModuleTree],
    scopes: Callable[[Sequence[str]], Mapping[str, ImportScope]] | None = None,
) -> tuple[Finding, ...]:
    """The ``dlopen`` findings for every caller of ``inv`` and the objects its run-time loads map (module
    docstring; ``trees``: its module trees). A caller neither an import nor a run-time load maps is judged
    alone (its loader chain unknown): its findings are INFO.

    ``scopes`` gives the import model's process for extension modules (``Stack.import_scopes``): the state
    once the import loading a module is complete is where its closure's run-time loads happen. It is asked
    only for the modules whose callers fail when judged with their module's closure alone (what that import
    maps beyond the closure can only satisfy a load by name), and everything is judged again in those
    processes: the import model reads every Python file an import runs, which a clean stack need not pay."""
    first = _all_findings(inv, resolver, read, strings, trees, {})
    needy = {m for m, found in first.items() if m and any(f and f.severity is not Severity.INFO for f, _, _ in found)}
    if scopes is None or not needy:
        return _flat(inv, first)
    processes = _processes([mt for mt in trees if mt.module.path in needy], scopes)
    return _flat(inv, _all_findings(inv, resolver, read, strings, trees, processes))


_Process = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]
_Notes = list[tuple[str, tuple[str, ...]]]


def _all_findings(
    inv: Inventory,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    strings: Callable[[str], StringFacts],
    trees: Sequence[ModuleTree],
    processes: Mapping[str, _Process],
) -> dict[str, list[tuple[Finding | None, str, _Notes]]]:
    """Every caller's findings (and its data's unexplained names, by owner), keyed by the extension module
    whose import maps it ("" for a caller judged alone); each caller's loads judged in ``processes`` (what
    is mapped and by which names, by module), else with its module's closure."""
    installed = _Installed(inv, resolver)
    reported = frozenset(x.soname for mt in trees for x in mt.tree.missing)  # the closure item names these
    out: dict[str, list[tuple[Finding | None, str, _Notes]]] = {}
    closures = _processes(trees, lambda mods: {})
    every = callers(inv, trees)
    seen = {os.path.realpath(c.path) for c in every if c.loaders is not None}
    for c in every:
        alone = c.loaders is None
        if alone and os.path.realpath(c.path) in seen:
            continue  # a run-time load maps it: judged in that process
        info = read_or_none(read, c.path)
        if info is None:
            continue
        # c.loaded: its module, then the closure; the run-time loads happen once that module's import is done
        module = c.loaded[0] if c.loaded and not alone else ""
        loaded, names = processes.get(module) or closures.get(module, (c.loaded, ()))
        start = Reached(c.path, info, Context(c.loaders or (), loaded, names, (c.path,)))
        into = out.setdefault(module, [])
        # alone, its findings are infos: the names in its data (a scan of every shipped library) add nothing
        for r, wants in run_time_chain(start, resolver, read, strings, seen, data_names=not alone):
            found, notes = _judge(r, wants, inv, read, installed, reported)
            owner = inv.owner(r.path) or c.owner
            into.extend((_alone(f) if alone else f, owner, []) for f in found)
            if notes and not alone:
                into.append((None, owner, notes))
    return out


def _flat(inv: Inventory, by_module: Mapping[str, Sequence[tuple[Finding | None, str, _Notes]]]) -> tuple[Finding, ...]:
    """The findings in the order judged, then one INFO per owner for the names of its data found nowhere."""
    findings: list[Finding] = []
    unexplained: dict[str, _Notes] = {}
    for entries in by_module.values():
        for f, owner, notes in entries:
            if f is not None:
                findings.append(f)
            unexplained.setdefault(owner, []).extend(notes)
    findings.extend(_unexplained_info(owner, notes) for owner, notes in unexplained.items() if notes)
    return tuple(findings)


def _when_data(r: Reached, who: str) -> str:
    """What fails when a name found only in ``r``'s data does not load: the feature the data table's
    ``features`` names for the caller (CUPTI: a profiler session), else the caller's feature that opens it."""
    row = next((f for f in load_features() if f.matches(r.info.soname, os.path.basename(r.path))), None)
    why = "(the name is in its data, not a load it must make)"
    if row is None:
        return f"only the feature of {who} that opens it fails, if it is used {why}"
    return f"only {row.when} is affected: {who} opens it then, if at all {why}"


def _processes(
    trees: Sequence[ModuleTree], scopes: Callable[[Sequence[str]], Mapping[str, ImportScope]]
) -> dict[str, _Process]:
    """For each extension module of ``trees``, the process its closure's run-time loads happen in: what is
    mapped (in load order) and the names objects were opened as (glibc's ``_dl_map_object`` matches a
    ``dlopen`` against both before any search). That is the state once the import loading the module is
    complete (``scopes``: torch's preloads of NVRTC, made by its ``__init__``, are mapped when cuDNN's
    engines open ``libnvrtc.so.12``), with the module's own closure; the closure alone where the model has
    no process."""
    known = scopes([mt.module.path for mt in trees])
    out: dict[str, _Process] = {}
    for mt in trees:
        closure = tuple(x.path for x in mt.tree.libraries if x.path is not None)
        names = tuple((x.soname, x.path) for x in mt.tree.libraries if x.path is not None)
        scope = known.get(mt.module.path)
        after = scope.after if scope is not None else ()
        loaded = (*after, *(p for p in (mt.module.path, *closure) if p not in set(after)))
        out[mt.module.path] = (loaded, (*(scope.after_names if scope is not None else ()), *names))
    return out


def _alone(f: Finding) -> Finding:
    if f.severity is Severity.INFO:
        return f
    return replace(
        f, severity=Severity.INFO, message=f.message + " (judged alone: no extension module loads the caller)"
    )


def _unexplained_info(owner: str, notes: list[tuple[str, tuple[str, ...]]]) -> Finding:
    searched: list[str] = []  # where the dynamic linker's search for those names looked, in order
    for _, dirs in notes:
        searched.extend(d for d in dirs if d not in searched)
    return Finding(
        check="dlopen",
        severity=Severity.INFO,
        subject=owner or "unowned libraries",
        message=f"{len(notes)} library name(s) in the read-only data of its libraries loaded at import "
        "may load at run time and are not found here",
        cause="a name written in a library's data is what it can pass to dlopen; no DT_NEEDED lists "
        "it and no library of its family is installed, so only the feature that opens it fails, when used",
        remedies=manual("install the library that provides the name only if you use that feature"),
        where=tuple(searched),
        details=tuple(note for note, _ in notes),  # every one: the text rendering caps, --json keeps all
    )


def _judge(
    r: Reached,
    wants: Sequence[Want],
    inv: Inventory,
    read: Callable[[str], ElfInfo],
    installed: _Installed,
    reported: frozenset[str],
) -> tuple[list[Finding], list[tuple[str, tuple[str, ...]]]]:
    """The findings of one caller's run-time loads, by family, and the notes on its data's names that
    resolve nowhere while their family is not installed (``reported``: sonames the import closures already
    miss, which the closure item reports)."""
    out: list[Finding] = []
    notes: list[tuple[str, tuple[str, ...]]] = []
    if r.opened is not None and r.by is not None:
        out.extend(_opened_missing(r, r.opened, r.by, inv, reported))
    groups: dict[str, list[Want]] = {}
    for w in wants:
        groups.setdefault(family(w.name), []).append(w)
    for fam, group in groups.items():
        rows = [w for w in group if w.row is not None]
        if not rows and _family_mapped(fam, r, read) is not None:
            continue  # names in its data only, while its family's right build is in the process: evidence
        hits = [w for w in group if w.library.path is not None]
        if hits:
            wrong = [_copy_finding(w, r, inv, read) for w in hits]
            if all(f is not None for f in wrong):
                out.append(next(f for f in wrong if f is not None))
            continue
        copies = [c for c in installed.of(fam) if not is_driver_soname(c.name)]
        for w in rows:
            out.append(_miss_finding(w, r, inv, copies))
        if rows:
            continue
        w = group[0]
        sibling = _versioned_sibling(w, r, copies)
        if sibling is None and _claims(group, copies):
            out.append(_miss_finding(w, r, inv, copies))
        else:
            note = f"not found as written; {sibling} is beside it" if sibling else "not found"
            notes.append((f"{inv.relative(r.path)} may load {w.name} ({note})", w.library.searched))
    return out, notes


def _family_mapped(fam: str, r: Reached, read: Callable[[str], ElfInfo]) -> str | None:
    """An object of family ``fam`` mapped in the caller's process (itself included) built for a CUDA major
    the caller is built for (any, where either says none), else None. A name the caller's data holds beside
    such a library is a fallback candidate it does not reach: CUPTI's ``libcupti.so.12`` writes
    ``libcudart.so`` while the process has ``libcudart.so.12`` mapped."""
    want = caller_majors(r.info)
    for path in (*r.context.loaded, r.path):
        if family(path) != fam:
            continue
        info = read_or_none(read, path)
        got = caller_majors(info) if info is not None else frozenset()
        if not (want and got) or want & got:
            return path
    return None


def _claims(group: Sequence[Want], copies: Sequence[_Copy]) -> bool:
    """Whether names found only in a caller's data say which library it needs: one of them is installed
    under that very name (out of the caller's reach), or is versioned (``libfoo.so.3``) while its family is
    installed at another version. An unversioned development name (``libudev.so``, ``libcublas.so``) is a
    fallback candidate programs list beside the versioned names they try, which wheels and distributions
    never ship: not a claim (the note says so)."""
    for w in group:
        if any(c.name == w.name or os.path.basename(c.path) == w.name for c in copies):
            return True
        if copies and not w.name.endswith(".so"):
            return True
    return False


def _versioned_sibling(w: Want, r: Reached, copies: Sequence[_Copy]) -> str | None:
    """A versioned file of the unversioned name ``w.name`` beside the caller (the program may append its
    version, as cuDNN does: ``libcudnn_graph.so`` + ``.9``), else None."""
    if not w.name.endswith(".so"):
        return None
    here = os.path.dirname(r.path)
    beside = sorted(
        os.path.basename(c.path)
        for c in copies
        if os.path.dirname(c.path) == here and os.path.basename(c.path).startswith(w.name + ".")
    )
    if not beside:
        try:
            beside = sorted(e for e in os.listdir(here) if e.startswith(w.name + "."))
        except OSError:
            beside = []
    return beside[0] if beside else None


def _who(r: Reached, inv: Inventory) -> str:
    return inv.relative(r.path)


def _chain(r: Reached) -> tuple[str, ...]:
    """The load chain, root first (the object an import maps), absolute: judge_reach reads its first."""
    return r.context.via or (r.path,)


def _opened_missing(r: Reached, opened: Tree, by: Want, inv: Inventory, reported: frozenset[str]) -> list[Finding]:
    """An object a run-time load (``by``) maps whose DT_NEEDED (``opened``) are missing: that dlopen fails
    (a soname of ``reported`` is the import's own miss, reported by the closure item)."""
    missing = [x.soname for x in opened.missing if not is_driver_soname(x.soname) and x.soname not in reported]
    if not missing:
        return []
    # a name found only in the data is an optional feature as far as the files say
    severity = _SEVERITY[by.row.miss] if by.row is not None else Severity.INFO
    caller = inv.relative(by.caller)
    return [
        Finding(
            check="dlopen",
            severity=severity,
            subject=os.path.basename(r.path),
            message=f"{by.name} loaded at run time (dlopen) by {caller} cannot be loaded: it needs "
            f"{', '.join(missing)}, not found",
            cause=f"dlopen maps {r.path} with its DT_NEEDED, each searched from it and then from {caller}'s "
            "loader chain; a missing one makes the whole dlopen fail",
            remedies=manual(
                f"{NO_SAFE_REPAIR}: install the libraries that provide {', '.join(missing)} where {_who(r, inv)} "
                "or its loaders search"
            ),
            # the library that fails to load first, then where its dependencies were looked for
            where=(r.path, *dict.fromkeys(d for x in opened.missing for d in x.searched))[:12],
            facts=Facts(
                required=missing[0],
                sonames=tuple(missing),
                objects=(by.caller, r.path),
                tried=tuple(t for x in opened.missing if x.soname in missing for t in x.tried),
            ),
            chain=_chain(r),
        )
    ]


def _how(w: Want) -> str:
    row = w.row
    if row is not None and row.search == "paths":
        return "opened by full path " + ", ".join(os.path.join(expand_origin(d, w.caller), w.name) for d in row.paths)
    return (
        "searched as glibc's dlopen from the caller does (its RPATH and its loaders' unless it has a RUNPATH, "
        "LD_LIBRARY_PATH, its RUNPATH, ld.so.cache by that exact name, the default directories)"
    )


def _miss_finding(w: Want, r: Reached, inv: Inventory, copies: Sequence[_Copy]) -> Finding:
    """A name that resolves nowhere: ERROR when its family is installed where the search misses it (with
    where, why and the remedy), else the row's severity (module docstring)."""
    who = _who(r, inv)
    if is_driver_soname(w.name):
        return Finding(
            check="dlopen",
            severity=Severity.INFO,
            subject=w.name,
            message=f"{w.name}: loaded at run time by {who}, provided by the NVIDIA driver, not found here",
            cause="no NVIDIA driver is installed on this machine",
            remedies=manual("nothing to do for a build or CI machine; on a GPU machine install the NVIDIA driver"),
            where=w.library.searched[:12],
            chain=_chain(r),
        )
    row = w.row
    if row is not None:
        severity = Severity.ERROR if copies else _SEVERITY[row.miss]
        consequence = {
            Miss.FATAL: "the feature that needs it fails when first used",
            Miss.FALLBACK: f"silent fallback: {row.fallback}",
            Miss.OPTIONAL: "an optional feature is unavailable",
        }[row.miss]
    else:  # a name in the data is evidence, not proof
        severity = Severity.WARNING if copies else Severity.INFO
        consequence = _when_data(r, who)
    same = [c for c in copies if c.name == w.name or os.path.basename(c.path) == w.name]
    # a file of that very name beside an installed copy (a development link no RECORD lists)
    beside = dict.fromkeys(os.path.join(os.path.dirname(c.path), w.name) for c in copies if c not in same)
    same += [_Copy(p, w.name, None) for p in beside if os.path.exists(p) and p not in {c.path for c in same}]
    family_note = _family_note(w, copies, same, inv)
    details = (f"the table row: cuda/data/dlopen_targets.json (source {row.source})",) if row is not None else ()
    return Finding(
        check="dlopen",
        severity=severity,
        subject=w.name,
        message=f"{w.name} is not found: loaded at run time (dlopen) by {who}; {consequence}",
        cause=f"{_how(w)}; no file of that name is there"
        + (f"; {family_note}" if family_note else "")
        + (f"; {row.note}" if row is not None and row.note else ""),
        remedies=_miss_remedies(w, who, same, copies),
        where=w.library.searched[:12] or tuple(os.path.dirname(t) for t in w.library.tried[:12]),
        facts=Facts(
            required=w.name,
            sonames=(w.name,),
            objects=(w.caller, *(c.path for c in copies)),
            versions=tuple((c.path, c.dist.version) for c in copies if c.dist is not None),
            consumer=inv.owner(w.caller),
            tried=w.library.tried,
        ),
        chain=_chain(r),
        details=details,
    )


def _family_note(w: Want, copies: Sequence[_Copy], same: Sequence[_Copy], inv: Inventory) -> str:
    """Where the family is installed and why the caller's search misses it."""
    if not copies:
        return ""
    parts = []
    for c in same[:4]:
        owner = f" ({c.dist.label})" if c.dist is not None else ""
        parts.append(f"{inv.relative(c.path)}{owner} has that name, in a directory the caller's search does not reach")
    others = [c for c in copies if c.path not in {x.path for x in same}]
    for c in others[:4]:
        owner = f" ({c.dist.label})" if c.dist is not None else " (ld.so.cache)"
        parts.append(f"{inv.relative(c.path)}{owner} is {family(w.name)} as {c.name}, not the name {w.name} opened")
    return f"{family(w.name)} is installed: " + "; ".join(parts)


def _miss_remedies(w: Want, who: str, same: Sequence[_Copy], copies: Sequence[_Copy]) -> tuple[Remedy, ...]:
    if same and (w.row is None or w.row.search == "dlopen"):
        d = os.path.dirname(same[0].path)
        return (
            SearchPath(
                d,
                "LD_LIBRARY_PATH",
                "prepend",
                why=f"LD_LIBRARY_PATH is searched for {who}'s dlopen after its RPATH chain, which misses {w.name}",
            ),
        )
    if copies:
        c = copies[0]
        return (
            Manual(
                (
                    f"install {w.name} (the {family(w.name)} build {who} was made for) where {who} searches",
                    f"or, where {c.path} is that build, make {w.name} name it in a directory {who} searches",
                ),
                why=f"{NO_SAFE_REPAIR}: {family(w.name)} is installed only under other names or majors",
            ),
        )
    where = " (its own directory)" if w.row is not None and w.row.search == "paths" else ""
    return manual(
        f"{NO_SAFE_REPAIR}: nothing installed here provides it to check. By hand: install the library "
        f"that provides {w.name} where {who} looks for it"
        + (where or " (a wheel on its RPATH/RUNPATH, or ld.so.cache)")
    )


_FILE_VERSION = re.compile(r"\.so\.([0-9]+(?:\.[0-9]+)*)$")


def _version(path: str, inv: Inventory) -> tuple[str | None, Distribution | None]:
    """A copy's version: its distribution's, else the numbers after ``.so.`` in its real file name when they
    name a release (``libcudnn_graph.so.9.19.0``); a file named by its soname alone (``.so.9``, as every wheel
    ships it: another venv's cuDNN on LD_LIBRARY_PATH) says its major, not its release: None."""
    owners = inv.owners(path)
    if owners:
        return owners[0].version, owners[0]
    m = _FILE_VERSION.search(os.path.basename(os.path.realpath(path)))
    return (m.group(1) if m and "." in m.group(1) else None), None


def _same_bytes(a: str, b: str) -> bool:
    """Whether two files hold the same bytes (sizes first; read in blocks, stopping at the first difference):
    another path to an identical copy is not another library."""
    try:
        if os.path.getsize(a) != os.path.getsize(b):
            return False
        fa, _sa = open_span(a)
    except (OSError, ElfError):
        return False
    try:
        fb, _sb = open_span(b)
    except ElfError:
        fa.close()
        return False
    try:
        return all(x == y for x, y in itertools.zip_longest(fa.chunks(), fb.chunks()))
    except OSError:
        return False
    finally:
        fa.close()
        fb.close()


def _same_version(a: str, b: str) -> bool:
    """Versions that agree on every component both give (9.24.0.43 and 9.24.0)."""
    pa, pb = a.split("."), b.split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def _expected(caller: str, name: str, inv: Inventory) -> list[str]:
    """The copies of ``name`` the caller's own distribution ships, or a distribution it requires (its pin)."""
    own = list(inv.owners(caller))
    dists = list(own)
    for d in own:
        for text in d.requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            got = inv.get(req.name)
            if got is not None and got not in dists:
                dists.append(got)
    return [
        lib.path
        for d in dists
        for lib in d.libraries
        if lib.exists and (lib.soname == name or os.path.basename(lib.path) == name)
    ]


def _copy_finding(w: Want, r: Reached, inv: Inventory, read: Callable[[str], ElfInfo]) -> Finding | None:
    """A name found, but a copy for another CUDA major than the caller, or of another version than the copy
    its own distribution or pin ships; None when it is the right one (or already loaded)."""
    lib = w.library
    if lib.path is None or lib.route is Route.ALREADY_LOADED:
        return None
    major = _major_finding(w, r, inv, read)
    if major is not None:
        return major
    expected = _expected(w.caller, w.name, inv)
    real = lib.realpath or os.path.realpath(lib.path)
    if not expected or any(os.path.realpath(e) == real for e in expected):
        return None
    exp = expected[0]
    v_found, d_found = _version(lib.path, inv)
    v_exp, d_exp = _version(exp, inv)
    other_major = d_found is not None and d_exp is not None and d_found.cuda_major != d_exp.cuda_major
    if v_found is not None and v_exp is not None and _same_version(v_found, v_exp) and not other_major:
        return None
    if v_found is None and _same_bytes(real, os.path.realpath(exp)):
        return None
    return _wrong_copy(w, r, inv, (lib, lib.path, v_found, d_found), (exp, v_exp, d_exp))


def _wrong_copy(
    w: Want,
    r: Reached,
    inv: Inventory,
    found: tuple[Library, str, str | None, Distribution | None],
    expected: tuple[str, str | None, Distribution | None],
) -> Finding:
    """The finding for a load on another copy than its own (``found``: the library, its path, version and
    distribution; ``expected``: the same of the caller's own copy)."""
    lib, path, v_found, d_found = found
    exp, v_exp, d_exp = expected
    who = _who(r, inv)
    route = lib.route.value + (f": {lib.route_detail}" if lib.route_detail else "")
    label_found = d_found.label if d_found is not None else f"version {v_found or 'unknown'}"
    label_exp = d_exp.label if d_exp is not None else f"version {v_exp or 'unknown'}"
    remedy: Remedy
    if lib.route is Route.LD_LIBRARY_PATH:
        remedy = SearchPath(os.path.dirname(path), why=f"it puts {path} before {exp} for {who}")
    elif lib.route in (Route.LD_CACHE, Route.DEFAULT):
        remedy = SearchPath(
            os.path.dirname(exp), op="prepend", why=f"LD_LIBRARY_PATH comes before {lib.route.value} in {who}'s search"
        )
    else:
        remedy = Manual((f"make {exp} the first {w.name} on {who}'s search",), why=NO_SAFE_REPAIR)
    # a table row says the caller opens that name; a name in its data may be opened by a full path instead
    # (triton's proton opens its own libcupti.so so): there the other copy is a fact, not a failure
    severity = Severity.INFO if w.row is None else (Severity.ERROR if v_found is not None else Severity.WARNING)
    return Finding(
        check="dlopen",
        severity=severity,
        subject=w.name,
        message=f"{w.name} loaded at run time (dlopen) by {who} is {path} ({label_found}), not "
        f"{inv.relative(exp)} ({label_exp}) that its own distribution or pin provides",
        cause=f"found by {route}, before the caller's own copy; a library and its run-time parts from "
        "different releases fail their version checks or misbehave",
        remedies=(remedy,),
        where=(os.path.dirname(path), os.path.dirname(exp)),
        facts=Facts(
            required=exp,
            found=path,
            sonames=(w.name,),
            objects=(w.caller, path, exp),
            versions=((path, v_found or ""), (exp, v_exp or "")),
            consumer=inv.owner(w.caller),
            tried=lib.tried,
        ),
        chain=_chain(r),
    )


def _major_finding(w: Want, r: Reached, inv: Inventory, read: Callable[[str], ElfInfo]) -> Finding | None:
    lib = w.library
    if lib.path is None:
        return None
    who = _who(r, inv)
    want = caller_majors(r.info)
    got_info = read_or_none(read, lib.path)
    got = caller_majors(got_info) if got_info is not None else frozenset()
    if not (want and got and not want & got):
        return None
    # a name in the data is evidence, not proof: the feature that opens it, if any, is a guess
    severity = _SEVERITY[w.row.miss] if w.row is not None else Severity.WARNING
    return Finding(
        check="dlopen",
        severity=severity,
        subject=w.name,
        message=f"{w.name} loaded at run time by {who} is built for CUDA {'/'.join(map(str, sorted(got)))}; "
        f"{who} is built for CUDA {'/'.join(map(str, sorted(want)))}"
        + ("" if w.row is not None else f"; {_when_data(r, who)}"),
        cause=f"found at {lib.path} ({lib.route.value}{': ' + lib.route_detail if lib.route_detail else ''}), "
        "the first match of the caller's search, from another CUDA release",
        remedies=(
            Manual(
                (
                    f"install {w.name} of CUDA {'/'.join(map(str, sorted(want)))} where {who} finds it first",
                    f"or remove {lib.path} from its search",
                ),
                why=f"{NO_SAFE_REPAIR}: the right build is not installed here to check",
            ),
        ),
        where=(os.path.dirname(lib.path),),
        facts=Facts(required=w.name, found=lib.path, sonames=(w.name,), objects=(w.caller, lib.path), tried=lib.tried),
        chain=_chain(r),
        details=(f"the table row: cuda/data/dlopen_targets.json (source {w.row.source})",) if w.row else (),
    )


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``dlopen`` item: the run-time loads of every shipped library of the stack's inventory and of what
    they map. An error is kept when an import that will happen maps the first object of its chain, else a
    WARNING naming the import after which the feature would fail
    (:func:`~pytest_cudastack.model.reach.judge_reach`)."""
    trees = stack.module_trees
    found = dlopen_findings(
        stack.inventory, stack.resolver, stack.cache.read, stack.cache.read_strings, trees, stack.import_scopes
    )
    return judge_reach(
        found, stack.reachability, trees, lambda f: f.chain[:1], lead=lambda name: f"after `import {name}`"
    )
