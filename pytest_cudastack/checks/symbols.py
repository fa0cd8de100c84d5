"""Does every undefined dynamic symbol bind, with its version, before anything is imported or run?

Lookup scopes are built as glibc builds them (2.36):

* ``elf/rtld.c`` / ``elf/dl-deps.c`` (``_dl_map_object_deps``): a program's global scope is the program,
  then its dependencies breadth-first in load order (the resolver's :class:`~pytest_cudastack.linker.resolver.Tree`
  order). A scanned binary is looked up in that scope alone.
* ``elf/dl-open.c`` (``dl_open_worker``, ``add_to_global``): ``dlopen`` gives every object it loads the
  lookup scopes [global scope, the opened object's own search list (itself, then its dependencies
  breadth-first)]; ``RTLD_GLOBAL`` appends the opened object's search list to the global scope. Python loads
  an extension module with ``dlopen(RTLD_NOW)`` (``Python/dynload_shlib.c``), so every reference of the
  module and of what it loads must bind at import time. The interpreter's global scope is the python
  executable and its dependencies (libpython when it is shared), plus what imports load ``RTLD_GLOBAL``
  first: torch/__init__.py's ``_load_global_deps`` loads ``torch/lib/libtorch_global_deps.so`` with
  ``ctypes.RTLD_GLOBAL`` (``GLOBAL_PRELOADS``).
* ``elf/dl-lookup.c`` (``_dl_lookup_symbol_x``, ``do_lookup_x``, ``check_match``) and ``elf/dl-version.c``
  decide what binds: :mod:`pytest_cudastack.linker.symbols`.

**In import context.** A module whose references do not all bind in those scopes is checked again in the
scopes its import gives it (:func:`~pytest_cudastack.model.process.import_scopes`): the global scope is the
executable's closure plus what RTLD_GLOBAL loads (torch's global deps, cupy's cuda-pathfinder loads) mapped
before the module, nothing an RTLD_LOCAL load mapped (an earlier extension module never provides a symbol
to a later one); its own search list is its closure with the objects already loaded matched by SONAME,
each followed by its own dependencies (``_dl_map_object_deps`` walks the DT_NEEDED of every object of the
list, loaded or not). The reference is reported only when it binds there neither (the context only adds
scopes: a module its own package does not import after torch keeps torch's global deps, as before).

An object loaded by several extension modules is relocated once, by the first import that loads it, in that
module's scopes; the import order is not known statically, so a reference is reported only when it binds
in none of the scopes of the modules that load the object. A reference whose version is required from a
soname the resolver does not find, and unversioned references of objects whose scope misses a library, are
left to the ``closure`` check (which reports the missing file): what a missing file would define is
unknown.

Findings: one ERROR per (needing object, providing file), all at once: the unbound symbols and the version
nodes the providing file lacks ("version `GLIBCXX_3.4.32' not found (required by X)"), where the soname
resolved to and by which route, and the way out when an installed wheel ships a copy that has them.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pytest_cudastack._sysio import real_path
from pytest_cudastack.cuda.compat import min_driver_for_cuda
from pytest_cudastack.cuda.driversyms import driver_entry_points
from pytest_cudastack.errors import CudaStackError, ElfError
from pytest_cudastack.findings import DriverUpgrade, Facts, Finding, Remedy, Severity, UseBuild, manual
from pytest_cudastack.linker.elf import ElfInfo, read_elf
from pytest_cudastack.linker.lookups import cached_lookups
from pytest_cudastack.linker.resolver import Library, Resolver, Route, Tree
from pytest_cudastack.linker.symbols import ScopeIndex, SymbolFacts, relocation_order
from pytest_cudastack.model.process import ImportScope, Interpreter, Process, import_scopes
from pytest_cudastack.wheels.inventory import Inventory

if TYPE_CHECKING:  # annotations only: `loaded --static` imports this module for its binding check alone
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.model.modules import ModuleTree

__all__ = [
    "GLOBAL_PRELOADS",
    "Scope",
    "binary_symbol_findings",
    "extension_symbol_findings",
    "loader_message",
    "process_symbol_findings",
    "run",
]

SymbolReader = Callable[[str], SymbolFacts]


class VerdictStore(Protocol):
    """Where verdicts are kept between runs (``ElfCache.get_extra`` / ``put_extra``; ``file_slot``: the name
    of a file's facts; ``in_root``: the file a path names, under an image's root for an image's path)."""

    def get_extra(self, key: str) -> Any: ...

    def put_extra(self, key: str, value: Any) -> None: ...

    def file_slot(self, host: str) -> str: ...

    def in_root(self, path: str) -> str: ...


GLOBAL_PRELOADS: tuple[str, ...] = ("torch/lib/libtorch_global_deps.so",)
"""Files (relative to a site directory) that an import loads ``RTLD_GLOBAL`` before any extension module of
its package: torch/__init__.py ``_load_global_deps`` (``ctypes.CDLL(..., mode=ctypes.RTLD_GLOBAL)``)."""

_MAX_DETAILS = 40


@dataclass(frozen=True)
class Scope:
    """The objects one lookup walks, in order (real paths), and how each needed soname resolved."""

    objects: tuple[str, ...]
    sonames: dict[str, Library] = field(compare=False, hash=False)
    missing: frozenset[str] = frozenset()
    needs: dict[str, tuple[Library, ...]] = field(default_factory=dict, compare=False, hash=False)

    def positions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i, p in enumerate(self.objects):
            out.setdefault(p, i)
        return out


def _scope(trees: Iterable[Tree], dirs: dict[str, str]) -> Scope:
    """The roots and their libraries in load order (real paths, each once), with soname -> Library, the
    sonames not found and each object's direct DT_NEEDED libraries."""
    objects: list[str] = []
    seen: set[str] = set()
    sonames: dict[str, Library] = {}
    missing: set[str] = set()
    needs: dict[str, list[Library]] = {}
    for tree in trees:
        root = real_path(tree.path, dirs)
        if root not in seen:
            seen.add(root)
            objects.append(root)
        for lib in tree.libraries:
            for needer in lib.needed_by:
                needs.setdefault(real_path(needer, dirs), []).append(lib)
            if lib.path is None:
                missing.add(lib.soname)
                continue
            real = lib.realpath or real_path(lib.path, dirs)
            sonames.setdefault(lib.soname, lib)
            if real not in seen:
                seen.add(real)
                objects.append(real)
    return Scope(tuple(objects), sonames, frozenset(missing - set(sonames)), {k: tuple(v) for k, v in needs.items()})


@dataclass
class _Problem:
    """What one needing object lacks from one providing file (None: from no known file)."""

    needer: str
    provider: Library | None
    symbols: set[tuple[str, str | None]] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)
    lazy_only: bool = True
    guessed: bool = False  # unversioned references: the provider is the needed library nearest by name
    needs: tuple[Library, ...] = ()  # the needing object's DT_NEEDED (shown when no provider is known)


@dataclass
class _Run:
    """One symbol check over some scopes: the facts read, the index, the problems found."""

    read: SymbolReader
    facts: dict[str, SymbolFacts | None] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _sorted: dict[str, list[str]] = field(default_factory=dict)

    def sorted_names(self, facts: SymbolFacts) -> list[str]:
        hit = self._sorted.get(facts.path)
        if hit is None:
            hit = self._sorted[facts.path] = sorted(facts.def_names)
        return hit

    def get(self, path: str) -> SymbolFacts | None:
        if path not in self.facts:
            try:
                self.facts[path] = self.read(path)
            except ElfError as e:
                self.facts[path] = None
                self.errors.append(str(e))
        return self.facts[path]


def _unbound(
    run: _Run,
    index: ScopeIndex,
    obj: str,
    scopes: Sequence[Scope],
    positions: dict[int, dict[str, int]],
) -> dict[tuple[str, str | None, str | None], bool]:
    """(name, version, file) -> lazily bound function? for every reference of *obj* no scope binds."""
    facts = run.get(obj)
    if facts is None:
        return {}
    out: dict[tuple[str, str | None, str | None], bool] = {}
    for ref in facts.references():
        if ref.weak:
            continue
        for scope in scopes:
            if ref.file is not None and ref.file in scope.missing:
                break  # the closure check reports the missing file
            if ref.file is None and scope.missing:
                break
            if index.lookup(ref.name, ref.version, positions[id(scope)], ref.hidden) is not None:
                break
        else:
            out[(ref.name, ref.version, ref.file)] = ref.type in ("FUNC", "NOTYPE", "IFUNC")
    return out


def _common(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _nearest(run: _Run, name: str, needed: Sequence[Library]) -> str | None:
    """The library among *needed* whose definitions share the longest prefix (4 characters at least, and
    longer than any other library's) with *name*: an unversioned reference does not say which file it
    expects, but a library that lost a symbol still defines its neighbours (``ncclCommRegister`` next to
    ``ncclCommDeregister``)."""
    scores: dict[str, int] = {}
    for lib in needed:
        if lib.path is None or lib.soname in scores:
            continue
        facts = run.get(lib.realpath or lib.path)
        if facts is None or not facts.def_names:
            continue
        names = run.sorted_names(facts)
        i = bisect.bisect_left(names, name)
        scores[lib.soname] = max((_common(names[j], name) for j in (i - 1, i) if 0 <= j < len(names)), default=0)
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    if not ranked or ranked[0][1] < 4 or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    return ranked[0][0]


def _version_gaps(run: _Run, obj: str, scope: Scope) -> dict[str, list[str]]:
    """Provider soname -> versions its file lacks, for every non-weak verneed of *obj* (dl-version.c)."""
    facts = run.get(obj)
    out: dict[str, list[str]] = {}
    if facts is None:
        return out
    for need in facts.verneeds:
        lib = scope.sonames.get(need.file)
        if need.weak or lib is None or lib.path is None:
            continue
        prov = run.get(lib.realpath or lib.path)
        if prov is None or not prov.verdefs:
            continue  # "no version information available": not fatal
        if need.name not in prov.defined_versions():
            out.setdefault(need.file, []).append(need.name)
    return out


def _check(
    run: _Run,
    plans: Sequence[tuple[str, Sequence[Scope], bool]],
) -> tuple[dict[tuple[str, str | None], _Problem], ScopeIndex]:
    """Problems of every ``(object, its scopes, bound at load time?)`` of *plans*, grouped per
    (needing object, providing soname)."""
    wanted: set[str] = set()
    for obj, _scopes, _now in plans:
        f = run.get(obj)
        if f is not None:
            wanted.update(f.ref_names)
    index = ScopeIndex(wanted)
    all_scopes: dict[int, Scope] = {}
    for _obj, scopes, _now in plans:
        for s in scopes:
            all_scopes[id(s)] = s
    for s in all_scopes.values():
        for path in s.objects:
            f = run.get(path)
            if f is not None:
                index.add(f)
    positions = {k: s.positions() for k, s in all_scopes.items()}
    problems: dict[tuple[str, str | None], _Problem] = {}
    for obj, scopes, now in plans:
        first = scopes[0]
        for (name, version, ref_file), func in _unbound(run, index, obj, scopes, positions).items():
            file = ref_file
            if file is None:  # its own DT_NEEDED first, then everything its scope resolved
                file = _nearest(run, name, first.needs.get(obj, ())) or _nearest(
                    run, name, tuple(first.sonames.values())
                )
            lib = first.sonames.get(file) if file is not None else None
            p = problems.setdefault(
                (obj, file), _Problem(obj, lib, guessed=ref_file is None, needs=first.needs.get(obj, ()))
            )
            p.symbols.add((name, version))
            facts = run.get(obj)
            p.lazy_only &= func and not now and not (facts is not None and facts.bind_now)
        for file, versions in _version_gaps(run, obj, first).items():
            p = problems.setdefault((obj, file), _Problem(obj, first.sonames.get(file)))
            p.versions.update(versions)
            p.lazy_only = False
    return problems, index


_LIBCUDA = "libcuda.so.1"


def _driver_findings(
    run: _Run,
    index: ScopeIndex,
    plans: Sequence[tuple[str, Sequence[Scope], bool]],
    driver: DriverInfo | None,
    display: Callable[[str], str],
) -> list[Finding]:
    """Without a libcuda.so.1 here, references to driver entry points newer than the declared or probed
    driver's CUDA (``cuda/data/driver_symbols.json``, from cudaTypedefs.h) are errors: the deployment host's
    libcuda.so.1 will not define them. A libcuda.so.1 that is found is checked like any library: its own
    dynamic symbol table is the truth."""
    if driver is None or not driver.present or driver.cuda_version is None:
        return []
    try:
        have = tuple(int(x) for x in driver.cuda_version.split(".")[:2])
    except ValueError:
        return []
    table = driver_entry_points()
    label = f"{driver.source} {driver.version}" if driver.version else driver.source
    out: list[Finding] = []
    for obj, scopes, _now in plans:
        first = scopes[0]
        if not any(n.soname == _LIBCUDA and n.path is None for n in first.needs.get(obj, ())):
            continue
        facts = run.get(obj)
        if facts is None:
            continue
        positions = first.positions()
        lines: list[str] = []
        newest: tuple[int, int] = (0, 0)
        for ref in facts.references():
            entry = table.get(ref.name)
            if ref.weak or entry is None or entry.cuda <= have:
                continue
            if index.lookup(ref.name, ref.version, positions, ref.hidden) is not None:
                continue
            newest = max(newest, entry.cuda)
            lines.append(
                f"{ref.name} needs a driver for CUDA >= {entry.cuda_text}; {label} supports <= "
                f"{driver.cuda_version} ({entry.source} in cudaTypedefs.h)"
            )
        if lines:
            out.append(
                Finding(
                    check="symbols",
                    severity=Severity.ERROR,
                    subject=display(obj),
                    message=f"{len(lines)} driver entry point(s) needed by {display(obj)} are newer than the "
                    f"driver: {lines[0]}",
                    cause=f"{_LIBCUDA} comes with the driver; the one for CUDA {driver.cuda_version} does not "
                    "define them, so loading fails with 'undefined symbol'",
                    remedies=driver_remedies(
                        newest, f"or install a build of {display(obj)} for CUDA {driver.cuda_version}"
                    ),
                    facts=Facts(
                        required=f"CUDA {newest[0]}.{newest[1]}",
                        found=f"driver {driver.version or '?'}",
                        sonames=(_LIBCUDA,),
                        objects=(os.path.normpath(obj),),
                        bound=driver.cuda_version,
                    ),
                    details=tuple(sorted(lines)),
                )
            )
    return out


_PER_ENTRY = ("cuGetProcAddress", "cudaGetDriverEntryPoint")


def driver_remedies(cuda: tuple[int, int], instead: str) -> tuple[Remedy, ...]:
    """The remedies of driver entry points the driver lacks: a driver at least the first one for ``cuda`` (the
    newest CUDA that introduced one of them: ``compat.min_driver_for_cuda``; not the major's minor-version
    compatibility floor, which runs newer minors but does not define their entry points), then ``instead`` by
    hand (what else works: a build for the driver's CUDA)."""
    text = f"{cuda[0]}.{cuda[1]}"
    why = f"{_LIBCUDA} comes with the driver; the first driver for CUDA {text} defines every entry point named"
    try:
        minimum = min_driver_for_cuda(text)
    except CudaStackError:  # a CUDA the compatibility table cannot parse: say it by hand
        minimum = None
    if minimum is None:
        return manual(f"run on a driver for CUDA >= {text}", instead, why=why)
    return (DriverUpgrade(minimum, text, why=why), *manual(instead))


def _driver_cuda(driver: DriverInfo | None) -> tuple[tuple[int, ...], str] | None:
    """The driver's CUDA version as numbers and its label, when a driver is known."""
    if driver is None or not driver.present or driver.cuda_version is None:
        return None
    try:
        have = tuple(int(x) for x in driver.cuda_version.split(".")[:2])
    except ValueError:
        return None
    return have, f"{driver.source} {driver.version}" if driver.version else driver.source


def _runtime_driver_findings(
    run: _Run,
    objects: Iterable[str],
    driver: DriverInfo | None,
    display: Callable[[str], str],
    store: VerdictStore | None,
) -> list[Finding]:
    """Driver entry points an object obtains at run time (``dlsym`` on libcuda.so.1 or ``cuGetProcAddress``:
    the ``cu*`` names in its read-only data, :mod:`pytest_cudastack.linker.lookups`) newer than the declared or
    probed driver's CUDA (the link-time table, ``cuda/data/driver_symbols.json``), one finding per object.
    Never an error: a name in its data is a possible lookup, not a certain one, and the load itself never
    fails. A WARNING when the object looks names up with ``dlsym`` only (a missing name is a NULL pointer the
    caller may not check); an INFO when it uses a per-entry lookup: ``cuGetProcAddress`` named in its data,
    or ``cuGetProcAddress*``/``cudaGetDriverEntryPoint*`` imported (they report a missing entry point per
    call, with the version it needs: the CUDA runtime, statically linked into most CUDA libraries, the
    language bindings and torch's c10 turn that into an error of the one API that needs it). Names the object also
    references at link time are the link-time check's, and names it defines itself (libcuda.so.1) are no
    lookups."""
    known = _driver_cuda(driver)
    if known is None or driver is None:
        return []
    have, label = known
    table = driver_entry_points()
    out: list[Finding] = []
    for obj in dict.fromkeys(objects):
        try:
            found = cached_lookups(obj, store, modules=False)
        except ElfError:
            continue  # unreadable files are reported by the symbol reader
        facts = run.get(obj)
        own = set(facts.def_names) | set(facts.ref_names) if facts is not None else set()
        newer = [(table[n].cuda, n) for n in found.driver if n in table and table[n].cuda > have and n not in own]
        if not newer:
            continue
        newer.sort(key=lambda e: (e[0], e[1]))
        lines = [
            f"{n} was introduced in CUDA {table[n].cuda_text} ({table[n].source} in cudaTypedefs.h)" for _v, n in newer
        ]
        # the per-entry lookups, by name in the data (a dlsym of cuGetProcAddress) or imported (the runtime's
        # cudaGetDriverEntryPoint*, itself a cuGetProcAddress); else the names go to dlsym on libcuda.so.1
        refs = sorted(facts.ref_names) if facts is not None else []
        imported = next((n for n in refs if n.startswith(_PER_ENTRY)), None)
        how = imported or ("cuGetProcAddress" if found.proc_address else "dlsym")
        per_entry = how != "dlsym"
        last = newer[-1][1]
        out.append(
            Finding(
                check="symbols",
                severity=Severity.INFO if per_entry else Severity.WARNING,
                subject=display(obj),
                message=f"{len(newer)} driver entry point(s) {display(obj)} may obtain at run time ({how}) are "
                f"newer than the driver ({label}, CUDA {driver.cuda_version}): {newer[0][1]} (CUDA "
                f"{table[newer[0][1]].cuda_text}) ... {last} (CUDA {table[last].cuda_text})",
                cause=f"{display(obj)} names them in its read-only data; {_LIBCUDA} for CUDA "
                f"{driver.cuda_version} does not define them, so the lookup returns NULL and whatever needs "
                "them fails when used (the load itself succeeds)",
                remedies=manual(
                    f"run on a driver for CUDA >= {table[last].cuda_text} where these features are used, or "
                    f"install a build for CUDA {driver.cuda_version}"
                ),
                facts=Facts(
                    required=" ".join(n for _v, n in newer)[:2000],
                    found=str(driver.cuda_version),
                    objects=(os.path.normpath(obj),),
                ),
                details=tuple(lines[:_MAX_DETAILS])
                + ((f"... and {len(lines) - _MAX_DETAILS} more",) if len(lines) > _MAX_DETAILS else ()),
            )
        )
    return out


def _route(lib: Library, display: Callable[[str], str] = str) -> str:
    """``runpath, runpath of torch/lib/libtorch_cuda.so``: the route, with the requester's path displayed."""
    detail = lib.route_detail
    head, sep, path = detail.partition(" of ")
    if sep and path.startswith("/"):
        detail = f"{head} of {display(path)}"
    if lib.route is Route.ALREADY_LOADED:
        return f"already loaded ({detail})" if detail else "already loaded"
    return f"{lib.route.value}, {detail}" if detail else lib.route.value


def _way_out(
    run: _Run, problem: _Problem, inventory: Inventory | None, display: Callable[[str], str]
) -> tuple[str, tuple[str, ...]]:
    """A fix naming an installed wheel's copy of the provider that has everything missing, if there is one."""
    lib = problem.provider
    if lib is None or inventory is None or lib.path is None:
        return "", ()
    here = lib.realpath or lib.path
    notes: list[str] = []
    for dist, path in inventory.shipping(lib.soname):
        if not os.path.isfile(path) or os.path.realpath(path) == here:
            continue
        facts = run.get(os.path.realpath(path))
        if facts is None:
            continue
        index = ScopeIndex(n for n, _v in problem.symbols)
        index.add(facts)
        has_syms = all(index.definers(n, v) for n, v in problem.symbols)
        has_vers = problem.versions <= facts.defined_versions()
        if has_syms and has_vers:
            where = os.path.dirname(lib.path)
            how = {
                Route.LD_LIBRARY_PATH: f"remove {where} from LD_LIBRARY_PATH",
                Route.RPATH: f"{lib.route_detail} puts {where} first",
                Route.LD_CACHE: f"ld.so.cache gives {lib.path} first",
                Route.DEFAULT: f"{where} is a default directory searched first",
            }.get(lib.route, f"{display(lib.path)} is found first ({_route(lib, display)})")
            return f"{how}: {dist.label}'s copy at {display(path)} defines it", tuple(notes)
        notes.append(f"{dist.label}'s copy at {display(path)} lacks it too")
    return "", tuple(notes)


def _findings(
    check: str,
    run: _Run,
    problems: dict[tuple[str, str | None], _Problem],
    index: ScopeIndex,
    inventory: Inventory | None,
    display: Callable[[str], str],
    context: str,
) -> list[Finding]:
    """One ERROR per (needing object, library that was to define its symbols), then a WARNING per file whose
    symbols could not be read."""
    out = [
        _problem_finding(check, run, obj, file, p, index, inventory, display, context)
        for (obj, file), p in sorted(problems.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
    ]
    for e in run.errors:
        out.append(Finding(check, Severity.WARNING, e.split(":", 1)[0], f"symbols not read: {e}"))
    return out


def _loader_order(obj: str, p: _Problem) -> list[tuple[str, str | None]]:
    """``p``'s symbols in the order ld.so's relocation of ``obj`` looks them up (the first is the one an
    RTLD_NOW load reports); by name when the relocation records cannot be read."""
    named = sorted(p.symbols, key=lambda s: (s[0], s[1] or ""))
    try:
        order = relocation_order(obj, [n for n, _ in named])
    except ElfError:
        return named
    rank = {n: i for i, n in enumerate(order)}
    return sorted(named, key=lambda s: rank.get(s[0], len(rank)))


def loader_message(finding: Finding) -> str | None:
    """The error ld.so prints for the first unbound reference a symbols finding describes (its first detail),
    as ``FILE: undefined symbol: NAME`` or ``version `V' not found (required by FILE)``; None for another
    finding."""
    if finding.check != "symbols" or not finding.details or not finding.facts.objects:
        return None
    head = finding.details[0]
    if head.startswith("undefined symbol: "):
        return f"{finding.facts.objects[0]}: {head.split(' (defined by ', 1)[0]}"
    if head.startswith("version `"):
        return head
    return None


def _problem_finding(
    check: str,
    run: _Run,
    obj: str,
    file: str | None,
    p: _Problem,
    index: ScopeIndex,
    inventory: Inventory | None,
    display: Callable[[str], str],
    context: str,
) -> Finding:
    """The ERROR for ``obj``'s references that ``file`` (or nothing in its scope) does not define; its
    symbols in relocation order, the one the loader reports first."""
    lib = p.provider
    needer = display(obj)
    what = [f"{len(p.versions)} version node(s)"] if p.versions else []
    if p.symbols:
        what.append(f"{len(p.symbols)} symbol(s)")
    fix, notes = _way_out(run, p, inventory, display)
    table = driver_entry_points()
    entries = [table[n].cuda for n, _ in p.symbols if n in table]
    remedies: tuple[Remedy, ...] = ()
    driver = file == _LIBCUDA or (file is None and any(n.soname == _LIBCUDA for n in p.needs))
    if not fix and driver and not p.versions and entries and len(entries) == len(p.symbols):
        # the driver's own library lacks entry points: the fix is the driver that introduced them
        remedies = driver_remedies(max(entries), f"or rebuild {needer} against the CUDA of the driver here")
    ordered = _loader_order(obj, p)
    if not fix and not remedies:
        remedies = _rebind_remedies(obj, file, p, ordered, inventory, needer)
    if not fix:
        fix = (
            f"install a {file} that defines them (the version the needing object was built against)"
            if file
            else "load the library that defines them, or rebuild the needing object against what is installed"
        )
    if p.lazy_only:
        when = "each fails at its first call (lazy binding, no BIND_NOW)"
    elif p.versions:
        when = f"{context} fails to load with the first of them (version `{sorted(p.versions)[0]}' not found)"
    else:
        when = f"{context} fails to load with the first of them in relocation order (undefined symbol: {ordered[0][0]})"
    found = (lib.path,) if lib is not None and lib.path else ()
    return Finding(
        check=check,
        severity=Severity.ERROR,
        subject=needer,
        message=f"{' and '.join(what)} needed by {needer} are not defined: {_target(file, p, display)}",
        cause=f"the dynamic linker binds every reference at load time; {when}",
        remedies=remedies or manual(fix),
        facts=Facts(
            required=" ".join([*sorted(p.versions), *dict.fromkeys(name for name, _ in ordered)])[:2000],
            sonames=(file,) if file else (),
            objects=tuple(os.path.normpath(o) for o in (obj, *found)),
        ),
        details=(*_problem_details(needer, p, ordered, index, display), *notes),
        where=tuple(display(f) for f in found),
    )


def _rebind_remedies(
    obj: str,
    file: str | None,
    p: _Problem,
    ordered: Sequence[tuple[str, str | None]],
    inventory: Inventory | None,
    needer: str,
) -> tuple[Remedy, ...]:
    """Where the library that was to define them is an installed wheel's: that wheel's release the needing
    object was built against (by hand: no file states which), or the needing object's own distribution in a
    build against the installed one. None when no wheel ships the library."""
    lib = p.provider
    if inventory is None or lib is None or lib.path is None or file is None:
        return ()
    providers = inventory.owners(lib.realpath or lib.path)
    if not providers:
        return ()
    prov = providers[0]
    first = f"version `{sorted(p.versions)[0]}'" if p.versions else ordered[0][0]
    out = manual(
        f"install the release of {prov.name} whose {file} defines {first}: the one {needer} was built against "
        f"({prov.label} is installed)",
        why=f"{prov.label}'s {file} lacks {first}",
    )
    needers = inventory.owners(obj)
    if needers and needers[0].key != prov.key:
        build = f"a release built against {prov.label}"
        out += (UseBuild(needers[0].name, build, why=f"or: {needers[0].label} was built against another {file}"),)
    return out


def _target(file: str | None, p: _Problem, display: Callable[[str], str]) -> str:
    """Where the references were to bind: the needed library and where it resolved, or no object at all."""
    lib = p.provider
    if lib is None or lib.path is None:
        return "no object in its lookup scope defines them"
    owner = f", from {lib.provider}" if lib.provider else ""
    if p.guessed:
        return (
            f"{file} (the needed library defining their nearest names) resolved to {display(lib.path)} "
            f"({_route(lib, display)}{owner})"
        )
    return f"{file} resolved to {display(lib.path)} ({_route(lib, display)}{owner})"


def _problem_details(
    needer: str,
    p: _Problem,
    ordered: Sequence[tuple[str, str | None]],
    index: ScopeIndex,
    display: Callable[[str], str],
) -> list[str]:
    """Each missing version node (dl-version.c checks them before any relocation), then each symbol in
    relocation order (with who defines it outside the scope), capped."""
    details = [f"version `{v}' not found (required by {needer})" for v in sorted(p.versions)]
    for name, version in ordered:
        details.append(f"undefined symbol: {name}" + (f", version {version}" if version else ""))
        others = [display(x) for x in index.definers(name, version)]
        if others and p.provider is None:
            details[-1] += f" (defined by {', '.join(others[:3])}, outside its lookup scope)"
    if p.provider is None:
        details.extend(
            f"it needs {n.soname}: {display(n.path)} ({_route(n, display)})" for n in p.needs[:8] if n.path is not None
        )
    if len(details) > _MAX_DETAILS:
        details = [*details[:_MAX_DETAILS], f"... and {len(details) - _MAX_DETAILS} more"]
    return details


def _display(inventory: Inventory | None) -> Callable[[str], str]:
    sites = tuple(os.path.normpath(s).rstrip(os.sep) + os.sep for s in (inventory.site_dirs if inventory else ()))

    def show(path: str) -> str:
        p = os.path.normpath(path)
        for s in sites:
            if p.startswith(s):
                return p[len(s) :]
        return p

    return show


def _global_scope(
    inv: Inventory, resolver: Resolver, itree: Tree, dirs: dict[str, str]
) -> tuple[Scope, frozenset[str]]:
    """The interpreter's global scope after the known RTLD_GLOBAL preloads, and the objects of the
    interpreter's own closure (it runs: they bound)."""
    trees = [itree]
    started = frozenset(_scope(trees, dirs).objects)
    for site in inv.site_dirs:
        for rel in GLOBAL_PRELOADS:
            path = os.path.join(site, rel)
            if os.path.isfile(path):
                trees.append(resolver.tree(path))
    return _scope(trees, dirs), started


def extension_symbol_findings(
    inv: Inventory,
    resolver: Resolver,
    read: SymbolReader,
    *,
    interpreter: str | None = None,
    trees: Sequence[ModuleTree] | None = None,
    verdicts: VerdictStore | None = None,
    driver: DriverInfo | None = None,
    elf_read: Callable[[str], ElfInfo] | None = None,
    pycache: ElfCache | None = None,
) -> tuple[Finding, ...]:
    """Symbol findings for every extension module of *inv*, imported by *interpreter* (default: this
    process's executable, resolved as /proc/self/exe is); ``read`` gives a file's symbols (the run's
    ``ElfCache.read_symbols``); ``verdicts`` (the run's ElfCache) remembers the findings of these scopes
    with the status of every file they were computed from (:func:`_recall`); ``driver`` (declared or
    probed) judges references to a libcuda.so.1 that is not here (:func:`_driver_findings`); ``elf_read``
    and ``pycache`` (the run's ``ElfCache.read`` and the cache itself) serve the import model, which gives
    the modules with unbound references their import context (module docstring)."""
    exe = os.path.realpath(interpreter if interpreter is not None else sys.executable)
    dirs: dict[str, str] = {}
    itree = resolver.tree(exe)
    if itree.info is None:  # without the interpreter's C API in scope every module would look broken
        why = "; ".join(itree.problems) or "not an ELF file"
        return (Finding("symbols", Severity.WARNING, exe, f"symbols not checked: cannot read the interpreter ({why})"),)
    glob, started = _global_scope(inv, resolver, itree, dirs)
    in_global = set(glob.objects)
    run = _Run(read)
    scopes_of: dict[str, list[Scope]] = {}
    for obj in glob.objects:  # the preloads' closures: ctypes.CDLL adds RTLD_NOW; scope [global]
        if obj not in started:
            scopes_of.setdefault(obj, []).append(glob)
    loaders: dict[str, list[ModuleTree]] = {}  # object -> the modules whose import loads it
    if trees is None:
        from pytest_cudastack.model.modules import module_trees  # lazy: see TYPE_CHECKING above

        trees = module_trees(inv, resolver)
    for mt in trees:
        local = _scope(_with_loaded_closures(mt.tree, resolver), dirs)
        both = Scope(
            glob.objects + local.objects,
            {**local.sonames, **glob.sonames},
            glob.missing | local.missing,
            {**glob.needs, **local.needs},
        )
        for obj in local.objects:
            if obj not in in_global:
                scopes_of.setdefault(obj, []).append(both)
                loaders.setdefault(obj, []).append(mt)
    plans = [(obj, scopes, True) for obj, scopes in scopes_of.items()]
    labels = [d.label for d in inv.distributions]
    head: list[Any] = ["extensions", *_named(verdicts, [exe, *inv.site_dirs]), labels, _driver_key(driver)]
    key = _plan_key(head, plans)
    hit = _recall(verdicts, key)
    if hit is not None:
        return hit
    problems, index = _check(run, plans)
    display = _display(inv)
    found_here = _findings("symbols", run, problems, index, inv, display, "the import")
    needy = {p.needer for p in problems.values()} & set(loaders)
    if needy:
        interp_scope = _scope([itree], dirs)
        interp = Interpreter.for_sites(inv.site_dirs, exe, root=inv.root)
        read_info = elf_read or read_elf
        again = _in_context(needy, loaders, scopes_of, inv, resolver, interp, interp_scope, dirs, read_info, pycache)
        if again:
            key = _plan_key([*head, "in import context"], [*plans, *again])
            hit = _recall(verdicts, key)
            if hit is not None:
                return hit
            kept = {k: v for k, v in problems.items() if v.needer not in {obj for obj, _, _ in again}}
            problems2, index2 = _check(run, again)
            found_here = [
                *_findings("symbols", run, kept, index, inv, display, "the import"),
                *_findings("symbols", run, problems2, index2, inv, display, "the import"),
            ]
    found = (
        *found_here,
        *_driver_findings(run, index, plans, driver, display),
        *_runtime_driver_findings(run, (obj for obj, _s, _n in plans), driver, display, verdicts),
    )
    _remember(verdicts, key, run, found)
    return found


def _in_context(
    needy: set[str],
    loaders: dict[str, list[ModuleTree]],
    scopes_of: dict[str, list[Scope]],
    inv: Inventory,
    resolver: Resolver,
    interp: Interpreter,
    interp_scope: Scope,
    dirs: dict[str, str],
    elf_read: Callable[[str], ElfInfo],
    pycache: ElfCache | None,
) -> list[tuple[str, Sequence[Scope], bool]]:
    """Plans for the ``needy`` objects with the scopes their loading modules' imports give them (module
    docstring) added to those of ``scopes_of``; an object none of whose modules the model can import has
    no plan (it stays judged as before)."""
    modules = sorted({mt.module.path for obj in needy for mt in loaders[obj]})
    contexts = import_scopes(modules, interp, resolver, elf_read, inv.owner, pycache)
    scope_of: dict[str, Scope] = {}
    for path in modules:
        ctx = contexts.get(path)
        if ctx is not None:
            scope_of[path] = _context_scope(path, ctx, resolver, interp_scope, dirs)
    out: list[tuple[str, Sequence[Scope], bool]] = []
    for obj in sorted(needy):
        extra = [scope_of[mt.module.path] for mt in loaders[obj] if mt.module.path in scope_of]
        if extra:  # the scopes judged before stay: the import context only ever adds a way to bind
            out.append((obj, [*scopes_of[obj], *extra], True))
    return out


def _with_loaded_closures(tree: Tree, resolver: Resolver, loaded: Sequence[str] = ()) -> list[Tree]:
    """``tree`` and the closure of each library it finds already loaded: an already-loaded dependency brings
    its own dependencies into the search list, as the dlopen that mapped it mapped them (cupy's
    cuda-pathfinder opens libcusparse.so.12 by path before the module that needs it: libcusparse's
    libnvJitLink.so.12 is in that module's scope, and where it lacks a symbol it is the library to name)."""
    out = [tree]
    for lib in tree.libraries:
        if lib.route is Route.ALREADY_LOADED and lib.path is not None:
            out.append(resolver.tree(lib.path, loaded=loaded))
    return out


def _context_scope(path: str, ctx: ImportScope, resolver: Resolver, interp_scope: Scope, dirs: dict[str, str]) -> Scope:
    """[global scope when the module is opened] + its own search list (dl_open_worker's lookup scopes)."""
    return _context_scopes(path, ctx, resolver, interp_scope, dirs)[0]


def _context_scopes(
    path: str, ctx: ImportScope, resolver: Resolver, interp_scope: Scope, dirs: dict[str, str]
) -> tuple[Scope, Scope]:
    """:func:`_context_scope`, and the opened object's own search list alone (``l_searchlist``)."""
    local = _scope(_with_loaded_closures(resolver.tree(path, loaded=ctx.loaded), resolver, ctx.loaded), dirs)
    head = tuple(dict.fromkeys(real_path(g, dirs) for g in ctx.global_scope))
    both = Scope(
        head + local.objects,
        {**local.sonames, **interp_scope.sonames},
        interp_scope.missing | local.missing,
        {**interp_scope.needs, **local.needs},
    )
    return both, local


def _relocation_sequence(local: Scope, new: set[str], dirs: dict[str, str]) -> list[str]:
    """The objects of ``new`` in the order one ``dlopen`` relocates them. ``_dl_map_object_deps`` sorts the
    search list into ``l_initfini`` (``elf/dl-sort-maps.c``, the default DFS algorithm of glibc >= 2.35:
    each object of the list, last first, is walked depth first through its DT_NEEDED in order, and placed
    after its dependencies, in reverse postorder), and ``dl_open_worker`` relocates ``l_initfini`` from its
    end: the DFS postorder, dependencies before what needs them, the opened object last."""
    order: list[str] = []
    visited: set[str] = set()

    def deps(obj: str) -> list[str]:
        return [lib.realpath or real_path(lib.path, dirs) for lib in local.needs.get(obj, ()) if lib.path is not None]

    for start in reversed(local.objects):
        if start in visited:
            continue
        visited.add(start)
        stack = [(start, iter(deps(start)))]
        while stack:  # iterative: a long DT_NEEDED chain must not hit Python's recursion limit
            obj, it = stack[-1]
            for dep in it:
                if dep not in visited:
                    visited.add(dep)
                    stack.append((dep, iter(deps(dep))))
                    break
            else:
                stack.pop()
                order.append(obj)
    rest = [o for o in local.objects if o in new and o not in order]
    return [o for o in order if o in new] + rest


def process_symbol_findings(
    process: Process,
    resolver: Resolver,
    read: SymbolReader,
    inventory: Inventory | None = None,
    verdicts: VerdictStore | None = None,
) -> tuple[Finding, ...]:
    """The binding check over a predicted import (``Process.loads``, each ``dlopen`` with RTLD_NOW in the
    scopes it finds: the global scope then, and its own search list), in the order the loader meets the
    failures: load by load (the first failing ``dlopen`` ends the import); within a load the missing version
    nodes first (``_dl_check_map_versions`` runs over the search list before any relocation), then the
    objects in relocation order (:func:`_relocation_sequence`), each object's symbols in its relocation
    records' order. So the first finding's first detail is what the import's error names
    (:func:`loader_message`)."""
    labels = [d.label for d in inventory.distributions] if inventory else []
    cfg = resolver.config
    # the scopes follow from the loads (each with what it found loaded) and the search configuration: a key
    # of those recalls a verdict without resolving any scope (the files it was computed from are checked)
    body = [
        # whether there is an image root, not its directory (it moves when the top layer changes): the status of
        # the files the verdict was computed from tells one image's from another's
        ["process", process.executable, process.module, labels, cfg.root not in ("", "/"), list(cfg.ld_library_path)],
        [[ld.path, ld.first, list(ld.scope.loaded), list(ld.scope.global_scope)] for ld in process.loads],
        [o.realpath for o in process.objects],
    ]
    key = _VERDICT_PREFIX + hashlib.sha256(json.dumps(body).encode()).hexdigest()
    hit = _recall(verdicts, key)
    if hit is not None:
        return hit
    dirs: dict[str, str] = {}
    interp_scope = _scope([resolver.tree(process.executable)], dirs) if process.executable else _scope([], dirs)
    plans: list[tuple[str, Sequence[Scope], bool]] = []
    rank: dict[str, tuple[int, int, int]] = {}
    loads = process.loads
    for i, load in enumerate(loads):
        end = loads[i + 1].first if i + 1 < len(loads) else len(process.objects)
        new = {o.realpath for o in process.objects[load.first : end]}
        both, local = _context_scopes(load.path, load.scope, resolver, interp_scope, dirs)
        searched = {o: k for k, o in enumerate(local.objects)}
        for j, obj in enumerate(_relocation_sequence(local, new, dirs)):
            rank[obj] = (i, searched.get(obj, 0), j)
            plans.append((obj, [both], True))
    run = _Run(read)
    problems, index = _check(run, plans)
    display = _display(inventory)

    def order(item: tuple[tuple[str, str | None], _Problem]) -> tuple[int, int, int, str]:
        (obj, file), p = item
        load, searched, reloc = rank.get(obj, (len(loads), 0, 0))
        return (load, 0 if p.versions else 1, searched if p.versions else reloc, file or "")

    found: list[Finding] = [
        _problem_finding("symbols", run, obj, file, p, index, inventory, display, "the import")
        for (obj, file), p in sorted(problems.items(), key=order)
    ]
    found.extend(Finding("symbols", Severity.WARNING, e.split(":", 1)[0], f"symbols not read: {e}") for e in run.errors)
    out = tuple(found)
    _remember(verdicts, key, run, out)
    return out


def binary_symbol_findings(
    tree: Tree,
    subject: str,
    read: SymbolReader,
    inventory: Inventory | None = None,
    verdicts: VerdictStore | None = None,
    driver: DriverInfo | None = None,
) -> tuple[Finding, ...]:
    """Symbol findings for one program (or library) and its closure, in its global scope; the other
    arguments as for :func:`extension_symbol_findings`."""
    dirs: dict[str, str] = {}
    scope = _scope([tree], dirs)
    run = _Run(read)
    plans = [(obj, [scope], False) for obj in scope.objects]
    labels = [d.label for d in inventory.distributions] if inventory else []
    sites = _named(verdicts, list(inventory.site_dirs) if inventory else [])
    key = _plan_key(["binary", subject, sites, labels, _driver_key(driver)], plans)
    hit = _recall(verdicts, key)
    if hit is not None:
        return hit
    problems, index = _check(run, plans)
    display = _display(inventory)
    found = (
        *_findings("symbols", run, problems, index, inventory, display, subject),
        *_driver_findings(run, index, plans, driver, display),
        *_runtime_driver_findings(run, (obj for obj, _s, _n in plans), driver, display, verdicts),
    )
    _remember(verdicts, key, run, found)
    return found


_VERDICT_PREFIX = "symbols-verdict:"


def _driver_key(driver: DriverInfo | None) -> list[str | None]:
    return [] if driver is None else [driver.source, driver.version, driver.cuda_version]


def _named(verdicts: VerdictStore | None, paths: list[str]) -> list[str]:
    """``paths`` as the verdicts name them: an image's file by its image path (``VerdictStore.file_slot``),
    not by the directory its root lies in, which an image whose top layer changed does not share."""
    return paths if verdicts is None else [verdicts.file_slot(p) for p in paths]


def _plan_key(head: list[Any], plans: Sequence[tuple[str, Sequence[Scope], bool]]) -> str:
    """A digest of what is checked: every object with its scopes (their objects, in order)."""
    body = [head, [[obj, now, [list(s.objects) for s in scopes]] for obj, scopes, now in plans]]
    return _VERDICT_PREFIX + hashlib.sha256(json.dumps(body).encode()).hexdigest()


def _status(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _recall(verdicts: VerdictStore | None, key: str) -> tuple[Finding, ...] | None:
    """The findings remembered for these scopes when every file they were computed from is unchanged
    (same status as the ELF cache keys its entries by); None otherwise or on a malformed entry."""
    if verdicts is None:
        return None
    hit = verdicts.get_extra(key)
    try:
        if not isinstance(hit, dict) or not isinstance(hit["files"], list) or not isinstance(hit["findings"], list):
            return None
        for path, status in hit["files"]:
            if _status(verdicts.in_root(str(path))) != status:
                return None
        return tuple(Finding.from_json(f) for f in hit["findings"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _remember(verdicts: VerdictStore | None, key: str, run: _Run, found: tuple[Finding, ...]) -> None:
    if verdicts is not None:
        files = [[p, _status(verdicts.in_root(p))] for p in sorted(run.facts)]
        verdicts.put_extra(key, {"files": files, "findings": [f.to_json() for f in found]})


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``symbols`` item: every extension module of the inventory, and every scanned binary. An extension
    module's unbound reference is an ERROR when an import that will happen loads it, else a WARNING
    (:func:`~pytest_cudastack.model.reach.judge_reach`)."""
    cache = stack.cache
    driver = stack.driver
    # an image's files are named by their image paths; the cache stats them under the root (the remembered
    # verdicts of an image whose top layer changed hold while the files they were computed from are the same
    # inodes, unchanged, as the ELF facts do)
    verdicts = cache
    found: tuple[Finding, ...] = ()
    if stack.image is None or stack.interpreter is not None:  # an image without a Python imports nothing
        found = extension_symbol_findings(
            stack.inventory,
            stack.resolver,
            cache.read_symbols,
            interpreter=stack.interpreter,
            verdicts=verdicts,
            driver=driver,
            elf_read=cache.read,
            pycache=cache,
            trees=stack.module_trees,
        )
    from pytest_cudastack.model.reach import judge_reach  # lazy: see TYPE_CHECKING above

    # an unbound reference is an ERROR when an import that will happen loads its needer (facts.objects[0])
    out = list(judge_reach(found, stack.reachability, stack.module_trees, lambda f: f.facts.objects[:1]))
    for name, path in stack.scan_targets:
        if os.path.lexists(path):
            tree = stack.tree(path)
            out.extend(binary_symbol_findings(tree, name, cache.read_symbols, stack.inventory, verdicts, driver))
    return tuple(out)
