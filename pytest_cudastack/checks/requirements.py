"""The ``requirements`` item: Requires-Dist present and pins met, framework version rules, shadowed copies.

One item (design.md's ``cudastack::requirements``) over three concerns, each its own module: this one
(requirements as pip's resolver evaluates them, :mod:`pytest_cudastack.wheels.requirements`),
:mod:`~pytest_cudastack.checks.frameworks` (how each framework judges the libraries it loads) and
:mod:`~pytest_cudastack.checks.shadow` (a copy other than the one the consumer's own wheel provides wins).

A requirement *matters for the CUDA stack* (:func:`cuda_relevant`) when the required distribution is a CUDA
wheel (by its name and the version the requirement names: an exact pin, a wildcard's release or a bound, as
cuda-toolkit's ``nvidia-cuda-nvrtc==13.0.88.*``; :mod:`pytest_cudastack.cuda.flavour`, or by the installed
copy), or when a CUDA distribution requires a distribution that ships shared libraries (torch and triton).
Findings:

* a CUDA requirement unmet: ERROR, one per required distribution whose version is wrong ("torch 2.14.1
  requires nvidia-nccl-cu13==2.30.7; 2.28.9 is installed"), one per requirer for those missing (all of them
  at once), each saying what it means for the libraries the wheel ships; a CUDA library wheel newer (or older)
  than every release the requirement accepts, in the same major, that no framework check of the requirer's
  refuses, is a WARNING (:func:`_side_in_its_major`: nothing fails to load for its version itself, a symbol
  it lacks is the symbols item's; pip check still objects);
* a missing CUDA meta package (cuda_compat.json's ``meta_packages``: cuda-toolkit, which ships no library): WARNING
  (nothing loads from it; what its requirements ship is the closure and dlopen items'); its fix keeps the extras
  asked for;
* a missing requirement of a distribution nothing uses (no extension module, nothing requires it: a
  library wheel installed with ``--no-deps``): WARNING;
* every other unmet requirement (what ``pip check`` would also print, or an unparsable Requires-Dist), and
  any through an extra that counts as installed only because its requirements all are (inferred, see
  wheels/requirements.py: the user may never have asked for it, and an unmet pin of it is evidence that pip
  never resolved it, as faiss-gpu-cu12's ``[fix-cuda]`` beside newer CUDA 12 wheels; ``pip check`` is
  silent): one INFO, all of them listed.

A fix is given only when one version satisfies every requirement on that distribution (a pin of one of
them); otherwise the finding says no safe automatic repair is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from packaging.version import Version

from pytest_cudastack.checks.frameworks import framework_findings
from pytest_cudastack.checks.shadow import shadow_findings
from pytest_cudastack.cuda.compat import load_compat, soname_cuda_majors
from pytest_cudastack.cuda.flavour import wheel_cuda_flavour
from pytest_cudastack.cuda.frameworks import LibraryRow, framework_says, load_rules, reported_version
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import Facts, Finding, Pip, Remedy, Severity, manual
from pytest_cudastack.model.repair import verified_fixes
from pytest_cudastack.wheels.inventory import Distribution, Inventory
from pytest_cudastack.wheels.ownership import pip_python
from pytest_cudastack.wheels.requirements import RequirementFact, Requirements, Status, requirement_facts

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target

__all__ = [
    "cuda_relevant",
    "library_of",
    "nothing_to_check",
    "repair_version",
    "requirement_findings",
    "requirement_for_soname",
    "run",
    "used",
]

_CHECK = "requirements"


def library_of(name: str) -> LibraryRow | None:
    """The CUDA library a wheel of this name ships (framework_rules.json's ``libraries``), if known."""
    try:
        return load_rules().library_for_wheel(name)
    except CudaStackError:
        return None


def _named_version(fact: RequirementFact) -> str:
    """The release a requirement names: its exact pin, else a wildcard pin's release (cuda-toolkit's
    ``nvidia-cuda-nvrtc==13.0.88.*``), else a bound's version (``nvidia-nvjitlink<14,>=13.0.88``); "" for
    none. The unsuffixed CUDA 13 wheels say their CUDA only by their version, so a requirement without an
    exact pin still says which CUDA it asks for through the release it names."""
    if fact.pin is not None:
        return fact.pin
    specs = sorted(fact.requirement.specifier, key=lambda s: (s.operator != "==", s.operator not in (">=", ">")))
    return next((s.version.removesuffix(".*") for s in specs if s.operator not in ("!=", "<", "<=")), "")


def cuda_relevant(fact: RequirementFact) -> bool:
    """Does this requirement matter for the CUDA stack (see the module docstring)?"""
    if fact.installed is not None and fact.installed.cuda_major is not None:
        return True
    try:
        major, _ = wheel_cuda_flavour(fact.requirement.name, _named_version(fact), (), ())
    except CudaStackError:
        major = None
    if major is not None:
        return True
    requirer = fact.requirer
    return (
        requirer is not None
        and requirer.cuda_major is not None
        and fact.installed is not None
        and bool(fact.installed.libraries)
    )


def repair_version(reqs: Requirements, name: str) -> tuple[str | None, list[RequirementFact]]:
    """A specifier naming one release that every certain requirement on ``name`` accepts (``==2.30.7``,
    an exact pin one of them states, else ``==13.1.1.3.*``, a wildcard pin whose release they all accept),
    and those requirements; None when no pin satisfies them all (or none pins)."""
    on = [f for f in reqs.on(name) if not f.inferred]
    candidates: dict[str, str] = {}
    for f in on:
        if f.pin is not None:
            candidates.setdefault(f"=={f.pin}", f.pin)
    for f in on:
        for spec in f.requirement.specifier:
            if spec.operator == "==" and spec.version.endswith(".*"):
                candidates.setdefault(f"=={spec.version}", spec.version[:-2])
    for text, release in candidates.items():
        try:
            version = Version(release)
        except ValueError:  # InvalidVersion, or a number over the digit limit
            continue
        if all(f.requirement.specifier.contains(version, prereleases=True) for f in on):
            return text, on
    return None, on


def used(dist: Distribution, reqs: Requirements) -> bool:
    """Is ``dist`` used by something? Not when it is a CUDA library wheel (framework_rules.json's
    ``libraries``: nvidia-cudnn-cu12) without an extension module that no installed distribution requires:
    a stray installed with ``--no-deps``, whose libraries only a program loading them itself would use."""
    if library_of(dist.name) is None or any(lib.pyinit for lib in dist.libraries):
        return True
    return any(not f.inferred for f in reqs.on(dist.name))


def _shipped(lib: LibraryRow) -> str:
    return f"the {lib.name} libraries ({', '.join(s + '.so.*' for s in lib.sonames)})"


def _framework_verdict(fact: RequirementFact, lib: LibraryRow | None) -> str:
    """The requirer's own failing check on the installed version of a pinned library wheel, quoted."""
    if lib is None or fact.requirer is None or fact.installed is None or fact.pin is None:
        return ""
    try:
        data = load_rules()
    except CudaStackError:
        return ""
    build, runtime = reported_version(lib, fact.pin), reported_version(lib, fact.installed.version)
    return framework_says(data, fact.requirer.name, fact.requirer.version, lib.library, build, runtime)


def _side_in_its_major(fact: RequirementFact) -> str:
    """``"newer"`` or ``"older"`` when the installed release of a CUDA library wheel misses the requirement on
    that one side only, in the same major release (its first component: ``nvidia-cusparse`` 12.9.4.2 for
    ``==12.6.3.3.*``), with no failing check of the requirer's own on it; "" otherwise (another major, both
    sides, ``!=``, ``===``, an unknown library or version). Then nothing fails for the version itself: the
    sonames are the major's, a symbol the release lacks is the symbols item's to find (it reads every
    reference and definition from the files), and the requirer's own version check (framework_rules.json:
    torch's cuDNN, its NCCL floor, JAX's floors) accepts it; only ``pip check`` objects."""
    lib = library_of(fact.name)
    if lib is None or fact.installed is None or _framework_verdict(fact, lib):
        return ""
    try:
        have = Version(fact.installed.version)
        failing = [s for s in fact.requirement.specifier if not s.contains(have, prereleases=True)]
        bounds = [Version(s.version.removesuffix(".*")) for s in failing]
    except ValueError:  # InvalidVersion, or a number over the digit limit
        return ""
    sides: set[str] = set()
    for spec, bound in zip(failing, bounds, strict=True):
        if bound.release[:1] != have.release[:1] or spec.operator in ("!=", "==="):
            return ""
        if spec.operator in ("<", "<="):
            sides.add("newer")
        elif spec.operator in (">", ">="):
            sides.add("older")
        else:  # == (exact or a wildcard's prefix), ~=: which side of the release it names
            sides.add("newer" if have.release[: len(bound.release)] > bound.release else "older")
    return sides.pop() if len(sides) == 1 else ""


def _version_finding(fact: RequirementFact, reqs: Requirements, severity: Severity, *, side: str = "") -> Finding:
    installed = fact.installed
    requirer = fact.requirer
    if installed is None or requirer is None:
        raise ValueError(f"not an installed version of a stated requirement: {fact}")
    lib = library_of(fact.name)
    who = requirer.name
    if lib is not None and side:
        cause = (
            f"{lib.name} {installed.version} is {side} than {fact.text} accepts, in the same major release (the "
            f"same sonames): what would fail at load is a symbol it lacks (the symbols item reads them from the "
            f"files and lists any) or a framework's own version check (none refuses it); pip check reports the "
            f"conflict, and pip's next resolve of {who} replaces it"
        )
    elif lib is not None:
        cause = (
            f"{who} was built against {lib.name} {fact.pin or fact.requirement.specifier} and loads {lib.name} "
            f"{installed.version} instead: a release older than its build can lack symbols {who} binds (an "
            f"ImportError or undefined symbol at import), a different one can fail {who}'s own version check "
            "at first use"
        )
    else:
        cause = (
            f"{who}'s binaries were built and tested with {fact.text}; {installed.label} may not provide the "
            "interface they call"
        )
    verdict = _framework_verdict(fact, lib)
    if verdict:
        cause += f'; {who}\'s own check says: "{verdict}"'
    if fact.inferred:
        cause += (
            f" (this requirement comes from {requirer.name}'s extra {fact.extra!r}, counted as installed "
            "because all its requirements are; ignore it if you never installed that extra)"
        )
    version, on = repair_version(reqs, fact.name)
    fix: tuple[Remedy, ...] = ()
    if version is not None:
        fix = (Pip("install", (f"{installed.name}{version}",), pip_python(installed), ("--no-deps",), why=cause),)
    else:
        asks = "; ".join(f"{f.requester} requires {f.text}" for f in on)
        cause += f"; no release is pinned that every requirement accepts ({asks}): no safe automatic repair is known"
    return Finding(
        check=_CHECK,
        severity=severity,
        subject=installed.name,
        message=f"{fact.requester} requires {fact.text}; {installed.version} is installed",
        cause=cause,
        remedies=fix,
        facts=Facts(
            required=fact.text,
            found=f"{installed.name} {installed.version}",
            versions=((installed.name, installed.version),),
            consumer=requirer.key,
        ),
        where=(installed.dist_info, requirer.dist_info),
        distributions=(installed.key, requirer.key),
    )


def _meta_packages() -> frozenset[str]:
    """The CUDA meta packages (cuda_compat.json's ``meta_packages``: cuda-toolkit), none when it cannot load."""
    try:
        return frozenset(load_compat().meta_packages)
    except CudaStackError:
        return frozenset()


def _missing_finding(requirer: Distribution, facts: Sequence[RequirementFact], reqs: Requirements) -> Finding:
    texts = [f.text for f in facts]
    libs = [lib for f in facts if (lib := library_of(f.name)) is not None]
    if len(facts) == 1:
        message = f"{facts[0].requester} requires {texts[0]}, which is not installed"
    else:
        message = f"{requirer.label} requires {len(facts)} distributions that are not installed: {', '.join(texts)}"
    if libs:
        shipped = "; ".join(_shipped(lib) for lib in libs)
        users = (
            f"{requirer.name}'s extension modules that link them fail to import (the closure item lists the sonames)"
            if any(lib.pyinit for lib in requirer.libraries)
            else f"{requirer.name}'s libraries that use them fail when they load them"
        )
        cause = f"nothing installs what they ship ({shipped}): {users}"
    else:
        cause = f"{requirer.name} needs them at import or at first use; pip would have installed them with it"
    specs: list[str] = []
    unresolved: list[str] = []
    for f in facts:
        version, on = repair_version(reqs, f.name)
        # the extras asked for come with the name: pip installs their requirements too
        extras = f"[{','.join(sorted(f.requirement.extras))}]" if f.requirement.extras else ""
        if version is not None:
            specs.append(f"{f.requirement.name}{extras}{version}")
        elif all(g.pin is None for g in on):
            joined = ",".join(sorted({str(s) for g in on for s in g.requirement.specifier}))
            specs.append(f"{f.requirement.name}{extras}{joined}")
        else:
            unresolved.append(f.text)
    why = f"{requirer.label} requires them"
    fix = (Pip("install", tuple(specs), pip_python(requirer), why=why),) if specs else ()
    severity = Severity.ERROR
    metas = _meta_packages()
    if all(f.name in metas for f in facts):
        # cuda-toolkit installs no file of its own: its absence fails no load (what its requirements ship, the
        # closure and dlopen items check), only pip check and the next resolve see it
        severity = Severity.WARNING
        cause = (
            f"{', '.join(sorted({f.requirement.name for f in facts}))}: a meta package that ships no library, only "
            f"requirements on the library wheels; {requirer.name} loads nothing from it, and the libraries those "
            "requirements name are the closure and dlopen items' to find (pip check reports it; pip's next resolve "
            f"of {requirer.name} reinstalls it)"
        )
    elif not used(requirer, reqs):
        severity = Severity.WARNING
        cause += (
            f"; nothing installed requires {requirer.name} and it has no extension module (installed with "
            "--no-deps?): this matters only to a program that loads its libraries itself"
        )
    if unresolved:
        cause += (
            f"; no version satisfies every requirement on {', '.join(unresolved)}: no safe automatic repair is known"
        )
    return Finding(
        check=_CHECK,
        severity=severity,
        subject=requirer.label,
        message=message,
        cause=cause,
        remedies=fix,
        facts=Facts(required=", ".join(texts), consumer=requirer.key),
        where=(requirer.dist_info,),
        distributions=(requirer.key, *sorted({f.name for f in facts})),  # the repair plan matches these
    )


def requirement_findings(inv: Inventory, reqs: Requirements | None = None) -> tuple[Finding, ...]:
    """The requirement findings of ``inv`` (see the module docstring)."""
    reqs = reqs if reqs is not None else requirement_facts(inv)
    findings: list[Finding] = []
    others: list[str] = []
    missing: dict[int, tuple[Distribution, list[RequirementFact]]] = {}
    said: set[tuple[str, str, str]] = set()
    for fact in reqs.unmet:
        requirer = fact.requirer
        # cuda-toolkit states nvidia-cublas==13.1.1.3.* under its cublas and its cusolver extras: once
        said_key = (requirer.key if requirer else "", fact.name, str(fact.requirement.specifier))
        if requirer is None or said_key in said:
            continue
        said.add(said_key)
        if not cuda_relevant(fact) or fact.inferred:
            # an extra counted only because its requirements are installed is a guess, and an unmet pin of
            # it is evidence against it (a resolver satisfies the extras it installs): pip check is silent
            found = "not installed" if fact.installed is None else f"{fact.installed.version} is installed"
            guess = " (an extra counted as installed only because its requirements are)" if fact.inferred else ""
            others.append(f"{fact.requester} requires {fact.text}; {found}{guess}")
        elif fact.status is Status.VERSION:
            side = _side_in_its_major(fact)
            severity = Severity.WARNING if side else Severity.ERROR
            findings.append(_version_finding(fact, reqs, severity, side=side))
        else:
            missing.setdefault(id(requirer), (requirer, []))[1].append(fact)
    findings[0:0] = [_missing_finding(d, facts, reqs) for d, facts in missing.values()]
    others += [f"{d.label}: unparsable Requires-Dist {text!r} ({err})" for d, text, err in reqs.unparsable]
    if others:
        findings.append(
            Finding(
                check=_CHECK,
                severity=Severity.INFO,
                subject="requirements",
                message=f"{len(others)} requirement(s) unmet outside the CUDA stack or through an extra only inferred",
                cause="they do not change which CUDA libraries load, or come from an extra nobody is known to have "
                "asked for; the distributions may still fail when used",
                remedies=manual("pip install the versions named, if you use those distributions"),
                details=tuple(others[:24]) + ((f"... and {len(others) - 24} more",) if len(others) > 24 else ()),
            )
        )
    return tuple(findings)


def _required_closure(reqs: Requirements, keys: set[str]) -> set[str]:
    """``keys`` and every distribution their met requirements install, transitively (pip's resolve: torch's
    ``cuda-toolkit[nvrtc,...]==13.0.3`` brings ``nvidia-cuda-nvrtc==13.0.88.*``, so the wheel that ships
    torch's ``libnvrtc.so.13`` is torch's requirement through cuda-toolkit's requested extra)."""
    if not keys:
        return keys
    out = set(keys)
    grown = True
    while grown:
        grown = False
        for f in reqs.facts:
            got = f.installed
            if f.met and got is not None and f.requirer is not None and f.requirer.key in out and got.key not in out:
                out.add(got.key)
                grown = True
    return out


def requirement_for_soname(
    inv: Inventory, soname: str, requirers: Sequence[Distribution] = (), reqs: Requirements | None = None
) -> RequirementFact | None:
    """The missing requirement of one of ``requirers`` (any distribution when empty) whose wheel would ship
    ``soname`` (``libcublas.so.11`` -> torch's ``nvidia-cublas-cu11==11.10.3.66``), else None. Among several,
    the one whose CUDA major is the soname's."""
    try:
        lib = load_rules().library_for_soname(soname)
        majors = soname_cuda_majors(soname) or frozenset()
    except CudaStackError:
        return None
    if lib is None:
        return None
    reqs = reqs if reqs is not None else requirement_facts(inv)
    keys = _required_closure(reqs, {d.key for d in requirers})
    hits = [
        f
        for f in reqs.unmet
        if f.status is Status.MISSING
        and not f.inferred
        and lib.matches_wheel(f.name)
        and (not keys or (f.requirer is not None and f.requirer.key in keys))
    ]
    if not hits:
        return None

    def major(f: RequirementFact) -> int | None:
        try:
            return wheel_cuda_flavour(f.requirement.name, _named_version(f), (), ())[0]
        except CudaStackError:
            return None

    return next((f for f in hits if major(f) in majors), hits[0])


def nothing_to_check(stack: StackView, target: Target | None = None) -> str | None:
    """Why the ``requirements`` item is skipped: no installed distribution states a requirement."""
    if not any(d.requires for d in stack.inventory.distributions):
        return "no installed distribution states a requirement (Requires-Dist)"
    return None


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``requirements`` item: requirements, framework rules and shadowed copies of the stack."""
    reqs = stack.requirements
    found = requirement_findings(stack.inventory, reqs) + framework_findings(stack) + shadow_findings(stack)
    # the integrity item's failing findings join the model's plan (a stray variant's uninstall is what meets a
    # pin whose files it overwrote), so both items print the one command; only this item's findings return
    context = tuple(f for f in stack.integrity if f.failing)
    return verified_fixes(found + context, stack.inventory, reqs=reqs)[: len(found)]
