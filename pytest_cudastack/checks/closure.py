"""Does every Python extension module of every installed distribution resolve all its libraries?

An extension module is a RECORD-listed shared object that exports ``PyInit_<name>`` (``ElfInfo.pyinit``);
the ``.so`` suffix alone does not make one (nvidia's ``libcheckpoint.so``, triton's test plugins). Each
module is the root of one :meth:`Resolver.tree`; one Resolver serves them all, so directory listings and ELF
facts are read once.

Findings:

* one ERROR per missing soname (all of them, from one run), with the chain from the first module that needs
  it, how many modules need it, and which distribution's RECORD claims the file ("nvidia-nccl-cu13 2.30.7
  lists nvidia/nccl/lib/libnccl.so.2 but the file is gone");
  the missing sonames whose every claiming RECORD lists a file that is gone share that cause: two or more
  of them are one ERROR naming each (its chain and claim in ``details``) with one fix, the repair plan's
  command when ``repair.plan_repairs`` models it as repairing them all;
* a missing soname installed where its needer's RUNPATH points, but in the other one of two different site
  directories (platlib ``lib64/`` vs purelib ``lib/``, a RHEL-family system Python): the entry, where it
  points, where the library is, and an LD_LIBRARY_PATH fix the resolver confirms;
* a missing soname that installed wheels ship, every claimed file present, in directories outside the
  needers' search (cupy-cuda13x's modules beside the CUDA 13 wheels' ``nvidia/cu13/lib``): an LD_LIBRARY_PATH
  entry naming them, offered when the resolver, searching again with it, finds the soname there and moves no
  library any extension module loads now (its severity is reachability's, as for any missing soname);
* every other fix is the repair model's verified one (``repair.verified_fixes``);
* driver-provided sonames (``compat.is_driver_soname``: libcuda.so.1, libnvidia-ml.so.1, ...) missing on a
  machine without a driver: one INFO fact, not a failure;
* shipped libraries no extension module reaches (optional plugins such as NVSHMEM transports needing
  libfabric, triton's test plugins) whose own closure misses something: INFO, one per distribution;
* modules the inspected interpreter never imports (another CPython ABI or platform:
  ``modules.foreign_modules``): one INFO naming them; their closures are not judged.

Chains and details name files relative to their site directory (the site directory is in ``where``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pytest_cudastack._sysio import real_path
from pytest_cudastack.checks.majors import majors_findings
from pytest_cudastack.checks.requirements import requirement_for_soname
from pytest_cudastack.cuda.compat import is_driver_soname
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Facts, Finding, Manual, Pip, Remedy, SearchPath, Severity, manual
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Library, Resolver
from pytest_cudastack.model.modules import ForeignModule, ModuleTree, foreign_modules, module_trees
from pytest_cudastack.model.reach import judge_reach
from pytest_cudastack.model.repair import NO_SAFE_REPAIR, load_facts, plan_repairs, predict, verified_fixes
from pytest_cudastack.wheels.inventory import Distribution, Inventory
from pytest_cudastack.wheels.ownership import FORCE, pip_python, reinstall
from pytest_cudastack.wheels.requirements import Requirements, requirement_facts
from pytest_cudastack.wheels.sitepaths import split_site_dirs

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target

__all__ = ["extension_closures", "run"]

logger = logging.getLogger(__name__)


@dataclass
class _Missing:
    soname: str
    needers: list[ModuleTree]
    libs: list[Library]


def _claims(inv: Inventory, soname: str) -> tuple[list[str], list[str], list[Distribution]]:
    """(gone, present-elsewhere, claiming distributions) for a missing soname."""
    gone: list[str] = []
    present: list[str] = []
    dists: list[Distribution] = []
    for dist, path in inv.shipping(soname):
        if not any(d is dist for d in dists):
            dists.append(dist)
        rel = inv.relative(path)
        if os.path.lexists(path):
            present.append(f"{dist.label} ships it at {rel}, but that directory is not on the search path")
        else:
            gone.append(f"{dist.label} lists {rel} but the file is gone")
    return gone, present, dists


def extension_closures(
    inv: Inventory,
    resolver: Resolver,
    *,
    trees: Sequence[ModuleTree] | None = None,
    reqs: Requirements | None = None,
) -> tuple[Finding, ...]:
    """Closure findings for every extension module of every distribution in ``inv``.

    ``trees`` and ``reqs``: the run's module trees and requirement facts (``Stack``); built here when not given.
    """
    mts = tuple(trees) if trees is not None else module_trees(inv, resolver)
    reqs = reqs if reqs is not None else requirement_facts(inv)
    missing: dict[str, _Missing] = {}
    reached: set[str] = set()
    dirs: dict[str, str] = {}
    findings: list[Finding] = []
    for mt in mts:
        reached.add(real_path(mt.module.path, dirs))
        for lib in mt.tree.libraries:
            if lib.path is not None:
                reached.add(lib.realpath or real_path(lib.path, dirs))
        for lib in mt.tree.missing:
            m = missing.setdefault(lib.soname, _Missing(lib.soname, [], []))
            m.needers.append(mt)
            m.libs.append(lib)
        for problem in mt.tree.problems:
            findings.append(
                Finding(
                    check="closure",
                    severity=Severity.WARNING,
                    subject=inv.relative(mt.module.path),
                    message=problem,
                    where=(mt.dist.location,),
                )
            )
    driver_missing: list[_Missing] = []
    verified: list[Finding] = []  # fixes verified by resolution (the split site dirs), kept as they are
    gone: list[Finding] = []  # sonames whose every claiming RECORD lists a file that is gone: one cause
    for soname in sorted(missing):
        m = missing[soname]
        if is_driver_soname(soname):
            driver_missing.append(m)
            continue
        finding = _missing_finding(inv, m, reqs)
        split = _split_site_finding(inv, resolver, m, finding) or _elsewhere_finding(inv, resolver, m, finding, mts)
        if split is not None:
            finding = split
            verified.append(split)
        else:
            finding = _required_install(inv, m, finding, verified, reqs)
        claims = inv.shipping(soname)
        if claims and not any(os.path.lexists(p) for _, p in claims):
            gone.append(finding)
        else:
            findings.append(finding)
    if len(gone) > 1:
        findings.insert(0, _gone_finding(inv, gone, reqs))
    else:
        findings[0:0] = gone
    if driver_missing:
        names = ", ".join(m.soname for m in driver_missing)
        count = len({id(mt) for m in driver_missing for mt in m.needers})
        findings.append(
            Finding(
                check="closure",
                severity=Severity.INFO,
                subject=names,
                message=f"{names}: provided by the NVIDIA driver, not found here; {count} extension module(s) need it",
                cause="no NVIDIA driver is installed on this machine (no wheel ships the driver's libraries)",
                remedies=manual("nothing to do for a build or CI machine; on a GPU machine install the NVIDIA driver"),
                facts=Facts(sonames=tuple(m.soname for m in driver_missing)),
                chain=tuple(inv.relative(p) for p in _best_chain(driver_missing[0])),
                where=driver_missing[0].libs[0].searched[:12],
            )
        )
    reported = set(missing)
    findings.extend(_unreachable(inv, resolver, reached, lambda s: is_driver_soname(s) or s in reported, dirs))
    if not any(f.failing for f in findings):
        return tuple(findings)
    return verified_fixes(findings, inv, facts=load_facts(mt.tree for mt in mts), keep=verified, reqs=reqs)


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``closure`` item: every extension module of the stack's inventory through its resolver, each in
        its import context, and the mixed CUDA majors (:mod:`~pytest_cudastack.checks.majors`). A missing soname
    is an ERROR when an import that will happen loads a module needing it, else a WARNING naming the import
    that would fail (:func:`~pytest_cudastack.model.reach.judge_reach`)."""
    inv = stack.inventory
    trees = stack.module_trees
    mixed = majors_findings(inv, stack.cache.read, lambda p: inv.relative(p), trees, stack.resolver)
    closures = judge_reach(
        extension_closures(inv, stack.resolver, trees=trees, reqs=stack.requirements), stack.reachability, trees
    )
    return (*mixed, *closures, *_foreign_finding(inv, foreign_modules(inv)))


def _foreign_finding(inv: Inventory, foreign: Sequence[ForeignModule]) -> tuple[Finding, ...]:
    """One INFO naming the extension modules the inspected interpreter never imports (none: nothing)."""
    if not foreign:
        return ()
    first = foreign[0]
    who = first.abi.label if first.abi is not None else "this interpreter"
    names = [inv.relative(fm.module.path) for fm in foreign]
    dists = sorted({fm.dist.label for fm in foreign})
    return (
        Finding(
            check="closure",
            severity=Severity.INFO,
            subject=", ".join(dists),
            message=f"{len(names)} extension module(s) that {who} never imports: {', '.join(names[:4])}"
            + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            + "; their libraries are not checked",
            cause=f"{who} imports extension modules named with the suffixes {', '.join(first.suffixes)} only; "
            "these are built for another Python ABI or platform (a wheel that ships builds for several)",
            remedies=manual(
                f"nothing to do for this environment; to use them, install the build of {', '.join(dists)} for {who}"
            ),
            facts=Facts(objects=tuple(fm.module.path for fm in foreign), found=", ".join(first.suffixes)),
            where=tuple(dict.fromkeys(fm.dist.location for fm in foreign)),
            details=tuple(f"module: {n}" for n in names),
        ),
    )


def _best_chain(m: _Missing) -> tuple[str, ...]:
    chains = [mt.tree.chain(m.soname) for mt in m.needers]
    chains = [c for c in chains if c] or [(m.needers[0].module.path,)]
    return min(chains, key=len)


def _needed_by(inv: Inventory, needer: str, modules: Sequence[str]) -> str:
    """``needer (from N extension module(s) of DIST, ...)``: the object that needs a soname (as shown) and the
    extension modules that load it (paths), counted, with their distributions."""
    dists = sorted({d.label for path in modules for d in inv.owners(path)})
    return f"{needer} (from {len(set(modules))} extension module(s) of {', '.join(dists) or 'no distribution'})"


def _missing_finding(inv: Inventory, m: _Missing, reqs: Requirements) -> Finding:
    chain = _best_chain(m)
    modules = sorted({inv.relative(mt.module.path) for mt in m.needers})
    objects = tuple(mt.module.path for mt in m.needers)
    gone, present, claimers = _claims(inv, m.soname)
    needer = inv.relative(chain[-1]) if chain else modules[0]
    message = f"{m.soname} is not found: needed by {_needed_by(inv, needer, objects)}"
    if gone or present:
        cause = "; ".join(gone + present)
    else:
        cause = (
            "no installed distribution ships it, and the dynamic linker's search (RPATH, LD_LIBRARY_PATH, "
            "RUNPATH, ld.so.cache, default directories) finds no file of that name"
        )
    wanted = None if claimers else requirement_for_soname(inv, m.soname, [mt.dist for mt in m.needers], reqs)
    if wanted is not None:  # the requirement that would have installed it (requirements.py)
        cause = f"{wanted.requester} requires {wanted.text}, which is not installed; {cause}"
    fix: tuple[Remedy, ...]
    if claimers:
        fix = tuple(reinstall(d, why=f"its RECORD lists {m.soname}") for d in claimers)
    elif wanted is not None and wanted.requirer is not None:
        why = f"{wanted.requester} requires it"
        fix = (Pip("install", (wanted.text,), pip_python(wanted.requirer), why=why),)
    else:
        fix = manual(f"install the package that provides {m.soname} (a wheel or a system package)")
    tried: list[str] = []  # directories searched that exist (nonexistent RPATH entries are noise)
    for lib in m.libs:
        for t in lib.tried:
            d = os.path.dirname(os.path.normpath(t))
            r = inv.relative(d)
            if r not in tried and os.path.isdir(d):
                tried.append(r)
    details = tuple(f"module: {x}" for x in modules[:8]) + (
        (f"... and {len(modules) - 8} more module(s)",) if len(modules) > 8 else ()
    )
    return Finding(
        check="closure",
        severity=Severity.ERROR,
        subject=m.soname,
        message=message,
        cause=cause,
        remedies=fix,
        facts=Facts(
            required=m.soname,
            sonames=(m.soname,),
            objects=objects,
            tried=tuple(dict.fromkeys(os.path.normpath(t) for lib in m.libs for t in lib.tried)),
            consumer=next((d.key for d in inv.owners(chain[-1])), m.needers[0].dist.key) if chain else None,
        ),
        where=tuple(tried[:16]),
        chain=tuple(inv.relative(p) for p in chain),
        details=details,
    )


def _required_install(
    inv: Inventory, m: _Missing, finding: Finding, verified: list[Finding], reqs: Requirements
) -> Finding:
    """A missing soname that a missing requirement's wheel would ship: its fix installs that requirement,
    kept (``verified``) when the repair model predicts the install breaks nothing installed. The model holds
    no files of a wheel that is not on disk, so that the wheel ships the soname rests on the requirer's pin
    and the library table (``framework_rules.json``); the fix says so."""
    if inv.shipping(m.soname):
        return finding
    wanted = requirement_for_soname(inv, m.soname, [mt.dist for mt in m.needers], reqs)
    if wanted is None or wanted.requirer is None or wanted.pin is None:
        return finding
    if predict([("install", wanted.name, wanted.pin)], inv, reqs=reqs):
        return finding
    why = (
        f"checked: it changes no installed file; {wanted.name} {wanted.pin} is the wheel {wanted.requester} pins "
        f"for {m.soname}"
    )
    fixed = replace(finding, remedies=tuple(replace(r, why=why) for r in finding.remedies))
    verified.append(fixed)
    return fixed


def _gone_finding(inv: Inventory, gone: Sequence[Finding], reqs: Requirements) -> Finding:
    """The missing sonames whose files the installed RECORDs list but are gone, as one finding with one fix:
    the repair plan's command when its model repairs them all (``repair.plan_repairs``), else one pip
    command reinstalling every claimer."""
    names = [f.subject for f in gone]
    first = gone[0]
    details = tuple(f"{f.subject}: needed by {' -> '.join(f.chain) or '?'}; {f.cause}" for f in gone)
    modules = sorted({d for f in gone for d in f.details if d.startswith("module: ")})
    grouped = Finding(
        check="closure",
        severity=Severity.ERROR,
        subject=", ".join(names),
        message=f"{len(names)} sonames are not found: {', '.join(names)}; the first needed by "
        + _needed_by(inv, first.chain[-1] if first.chain else "?", first.facts.objects),
        cause="the files the installed distributions' RECORDs list for them are gone (deleted by hand, or by "
        "uninstalling another distribution that installs the same paths); the loader would report only the "
        "first of them",
        where=tuple(dict.fromkeys(w for f in gone for w in f.where))[:16],
        chain=first.chain,
        details=details
        + tuple(modules[:8])
        + ((f"... and {len(modules) - 8} more module(s)",) if len(modules) > 8 else ()),
        facts=Facts(sonames=tuple(names), objects=tuple(o for f in gone for o in f.facts.objects)),
    )
    plans = plan_repairs([grouped], inv, reqs=reqs)
    if len(plans) == 1 and plans[0].steps and not plans[0].unresolved:
        fix = plans[0].remedies
    else:
        claimers = list(dict.fromkeys(d for n in names for d, _ in inv.shipping(n)))
        specs = tuple(f"{d.name}=={d.version}" for d in claimers)
        fix = (Pip("install", specs, pip_python(claimers[0]), FORCE, why="their RECORDs list the files"),)
    return replace(grouped, remedies=fix)


def _shipped_note(inv: Inventory, soname: str) -> str:
    present = [(d, p) for d, p in inv.shipping(soname) if os.path.lexists(p)]
    if not present:
        return soname
    d, p = present[0]
    return f"{soname} (shipped by {d.label} at {inv.relative(p)}, found only when already loaded)"


def _unreachable(
    inv: Inventory, resolver: Resolver, reached: set[str], skip: Callable[[str], bool], dirs: dict[str, str]
) -> list[Finding]:
    findings: list[Finding] = []
    for d in inv.distributions:
        notes: list[str] = []
        searched: list[str] = []
        unshipped = False
        for lib in d.libraries:
            if not lib.exists or lib.pyinit or lib.problem or real_path(lib.path, dirs) in reached:
                continue
            tree = resolver.tree(lib.path)
            absent = [x for x in tree.missing if not skip(x.soname)]
            if absent:
                notes.append(
                    f"{inv.relative(lib.path)} needs {', '.join(_shipped_note(inv, a.soname) for a in absent)}"
                )
                unshipped = unshipped or any(not _shipped_present(inv, a.soname) for a in absent)
                searched.extend(w for a in absent for w in a.searched if w not in searched)
        if notes:
            n = len(notes)
            libraries = f"{n} optional librar{'y' if n == 1 else 'ies'} (loaded by no extension module)"
            if unshipped:
                message = f"{libraries} need{'s' if n == 1 else ''} sonames not found here"
                fix = manual("install the missing libraries only if you use that feature")
            else:  # every one is installed: the search finds it once what ships it is loaded
                message = (
                    f"{libraries} need{'s' if n == 1 else ''} sonames that their own search does not find; "
                    "each is installed here and is found when what ships it is already loaded"
                )
                fix = manual("nothing to install; load the library that ships it first (as its users do)")
            findings.append(
                Finding(
                    check="closure",
                    severity=Severity.INFO,
                    subject=d.label,
                    message=message,
                    cause="loaded only on demand (dlopen) when the feature is used; not needed to import anything",
                    remedies=fix,
                    where=tuple(searched) or (d.location,),
                    details=tuple(notes),
                )
            )
    return findings


def _shipped_present(inv: Inventory, soname: str) -> bool:
    return any(os.path.lexists(p) for _, p in inv.shipping(soname))


# --------------------------------------------------------------------------------------------------------------
# purelib != platlib


@dataclass(frozen=True)
class _Split:
    needer: str  # the object whose RUNPATH / RPATH entry is searched
    entry: str  # that entry, as written
    points_to: str  # the directory it names (in one site directory)
    found: str  # where the library is (the same relative path in the other site directory)
    dist: Distribution  # who installed it there
    needer_site: str
    lib_site: str


def _site_of(path: str, inv: Inventory) -> str | None:
    p = os.path.normpath(path)
    for site in inv.site_dirs:
        s = os.path.normpath(site)
        if p.startswith(s.rstrip(os.sep) + os.sep):
            return s
    return None


def _splits(inv: Inventory, m: _Missing) -> list[_Split]:
    """The tried directories of ``m`` that are the library's directory spelt in the other site directory of
    a purelib / platlib pair, with the search-path entry of the needing object that names them."""
    present = [(d, os.path.normpath(p)) for d, p in inv.shipping(m.soname) if os.path.lexists(p)]
    out: list[_Split] = []
    for lib in m.libs:
        for t in lib.tried:
            tried_dir = os.path.dirname(os.path.normpath(t))
            t_site = _site_of(tried_dir, inv)
            for dist, path in present:
                p_site = _site_of(path, inv)
                if t_site is None or p_site is None or not split_site_dirs(t_site, p_site):
                    continue
                if os.path.relpath(tried_dir, t_site) != os.path.relpath(os.path.dirname(path), p_site):
                    continue
                for needer in lib.needed_by:
                    entry = _entry_naming(needer, tried_dir)
                    if entry is not None and not any(s.found == path for s in out):
                        out.append(_Split(needer, entry, tried_dir, path, dist, t_site, p_site))
    return out


def _entry_naming(needer: str, directory: str) -> str | None:
    """The DT_RUNPATH (else DT_RPATH) entry of ``needer`` that names ``directory`` ($ORIGIN expanded)."""
    try:
        info = read_elf(needer)
    except (ElfError, OSError):
        return None
    origin = os.path.dirname(needer)
    for entry in (*info.runpath, *info.rpath):
        expanded = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
        if os.path.normpath(expanded) == os.path.normpath(directory):
            kind = "RUNPATH" if entry in info.runpath else "RPATH"
            return f"{kind} entry {entry}"
    return None


def _split_site_finding(inv: Inventory, resolver: Resolver, m: _Missing, finding: Finding) -> Finding | None:
    """A missing soname that is installed, at the path its needer's RUNPATH names but in the other one of
    two different site directories (platlib ``lib64/`` vs purelib ``lib/``): that cause, and the repair the
    resolver confirms (LD_LIBRARY_PATH naming the directories where the libraries are), else None.

    Why LD_LIBRARY_PATH and not pip: a force-reinstall writes the same purelib paths again; pip has no
    option that installs a purelib wheel into platlib except ``--target``, which skips (or, with
    ``--upgrade``, replaces whole) the shared ``nvidia/`` directory; LD_LIBRARY_PATH changes no file, is
    searched before RUNPATH, and its effect is what the resolver computes."""
    splits = _splits(inv, m)
    if not splits:
        return None
    first = splits[0]
    dirs = list(dict.fromkeys(os.path.dirname(s.found) for s in splits))
    cause = (
        f"the {first.entry} of {inv.relative(first.needer)} points to {first.points_to}, which does not hold it; "
        f"{first.dist.label} installed it at {first.found}: this interpreter's platlib and purelib are "
        f"different directories ({first.needer_site} and {first.lib_site}, as on a RHEL-family system Python), "
        f"so wheels with compiled code land in one and the wheels marked Root-Is-Purelib in the other, and a "
        f"RUNPATH relative to one never reaches the other. Reinstalling {first.dist.name} writes the same "
        "paths again"
    )
    llp = os.pathsep.join(dirs)
    venv = Manual(
        ("install into a virtual environment (python3 -m venv: one site directory, its lib64 a link to lib)",)
    )
    fix: tuple[Remedy, ...]
    if not _resolves_with(inv, resolver, m, dirs):
        why = f"{NO_SAFE_REPAIR}: the resolver still misses {m.soname} with LD_LIBRARY_PATH={llp}"
        fix = (replace(venv, why=why),)
    else:
        checked = "checked: the linker then finds it there, before starting Python"
        fix = (SearchPath(llp, op="prepend", why=checked), replace(venv, why="the lasting alternative"))
    return replace(finding, cause=cause, remedies=fix)


# --------------------------------------------------------------------------------------------------------------
# installed outside the search


def _elsewhere_finding(
    inv: Inventory, resolver: Resolver, m: _Missing, finding: Finding, mts: Sequence[ModuleTree]
) -> Finding | None:
    """A missing soname that installed wheels ship, every claimed file present, in directories outside the
    needing objects' search (cupy-cuda13x's ``cufft`` module beside the CUDA 13 wheels' ``nvidia/cu13/lib``):
    the repair is a search-path change, kept only when the resolver, searching again with those directories
    first on LD_LIBRARY_PATH, finds the soname there for every module that needs it and moves no library any
    module tree loads now (:func:`_moves_nothing`), and no copy is of another CUDA major than a needing
    module's distribution; else None (the generic advice stays). Not pip: the files
    are installed, and a reinstall writes the same paths again."""
    claims = inv.shipping(m.soname)
    if not claims or not all(os.path.lexists(p) for _, p in claims):
        return None
    # a copy of another CUDA major than a needer's would load where it is found: the mixed-majors error
    needed = {mt.dist.cuda_major for mt in m.needers} - {None}
    if any(d.cuda_major is not None and needed - {d.cuda_major} for d, _ in claims):
        return None
    dirs = list(dict.fromkeys(os.path.dirname(os.path.normpath(p)) for _, p in claims))
    if not _resolves_with(inv, resolver, m, dirs) or not _moves_nothing(inv, resolver, mts, dirs, m.soname):
        return None
    checked = (
        f"checked: the linker then finds {m.soname} there for every module that needs it, and every other "
        "library each extension module loads stays where it loads it now"
    )
    return replace(finding, remedies=(SearchPath(os.pathsep.join(dirs), op="prepend", why=checked),))


def _moves_nothing(
    inv: Inventory, resolver: Resolver, mts: Sequence[ModuleTree], dirs: Sequence[str], soname: str
) -> bool:
    """With ``dirs`` first on LD_LIBRARY_PATH, does every extension module still load each library it loads
    now from the same file? Only the modules needing a name that some file in ``dirs`` has can change."""
    names: set[str] = set()
    for d in dirs:
        with contextlib.suppress(OSError):
            names.update(os.listdir(d))
    config = replace(resolver.config, ld_library_path=(*dirs, *resolver.config.ld_library_path))
    again = Resolver(config, owner=inv.owner)
    for mt in mts:
        if not any(lib.soname in names and lib.soname != soname for lib in mt.tree.libraries):
            continue
        now = {lib.soname: lib.path for lib in again.tree(mt.module.path).libraries}
        for lib in mt.tree.libraries:
            if lib.path is not None and lib.soname != soname and not _same_file(now.get(lib.soname), lib.path):
                return False
    return True


def _same_file(a: str | None, b: str) -> bool:
    return a is not None and (os.path.normpath(a) == os.path.normpath(b) or real_path(a, {}) == real_path(b, {}))


def _resolves_with(inv: Inventory, resolver: Resolver, m: _Missing, dirs: Sequence[str]) -> bool:
    """With ``dirs`` first on LD_LIBRARY_PATH, does every module needing ``m.soname`` find it in ``dirs``,
    and load everything else from where it loads it now (nothing shadowed)?"""
    config = replace(resolver.config, ld_library_path=(*dirs, *resolver.config.ld_library_path))
    again = Resolver(config, owner=inv.owner)
    for mt in m.needers:
        before = {lib.soname: lib.path for lib in mt.tree.libraries if lib.path is not None}
        for lib in again.tree(mt.module.path).libraries:
            if lib.soname == m.soname:
                if lib.path is None or os.path.dirname(os.path.normpath(lib.path)) not in dirs:
                    return False
            elif lib.soname in before and lib.path != before[lib.soname]:
                return False
    return True
