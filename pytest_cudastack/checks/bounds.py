"""Which CUDA version does a binary or a wheel require? Evidence-based, never guessed.

A binary's requirement comes from the sonames in its load closure that belong to one CUDA major
(``libcublas.so.13`` -> 13.x; ``compat.soname_cuda_majors``). A soname shared by several majors
(``libcurand.so.10``, ``libcusparse.so.12``) is decided by the file it resolves to: its owning wheel's
version, else that library's own unambiguous NEEDED; otherwise it stays undecided. A wheel's requirement
comes from its CUDA flavour and version (``flavour.wheel_cuda_requirement``).

``bound_findings`` compares requirements with ``--cuda-max`` / ``--cuda-min``: a requirement known only
as a major (13.x) violates max 12.9; 12.x against max 12.4 is undecidable, a warning, not a failure.
``group_by_requirer`` then makes the violating wheels one violating distribution pulls in (Requires-Dist) one
finding about that distribution: torch's CUDA 13 build, not 17 wheels.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from pytest_cudastack.cuda.compat import is_driver_soname, load_compat, mvc_floor
from pytest_cudastack.cuda.versions import parse_cuda
from pytest_cudastack.findings import DriverUpgrade, Facts, Finding, Manual, Pip, Rebuild, Remedy, Severity, UseBuild
from pytest_cudastack.model.needs import CudaNeed, Inference
from pytest_cudastack.model.torchindex import index_for
from pytest_cudastack.wheels.ownership import Requirer, active_requirements, pip_python
from pytest_cudastack.wheels.requirements import Requirements

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = [
    "bound_findings",
    "group_by_requirer",
    "run_max",
    "run_min",
]

logger = logging.getLogger(__name__)

_BUILTINS_RE = re.compile(r"libnvrtc-builtins(?:\.alt)?\.so\.(\d+)\.(\d+)")


def _bound_remedy(
    inf: Inference, kind: str, bound: str, need: CudaNeed, wheels: _Wheels | None = None
) -> tuple[Remedy, ...]:
    """A wheel: use its build for the bound (the pip spec of it where the wheel's version tracks its CUDA and
    ``wheels`` gives the installed distribution: :func:`_within_bound`); a binary: rebuild it with a toolkit
    within the bound."""
    word = "<=" if kind == "max" else ">="
    side = "newer" if kind == "max" else "older"
    if inf.distribution is not None:
        dist = wheels.inventory.get(inf.distribution) if wheels is not None else None
        if wheels is not None and dist is not None:
            return _within_bound(dist, kind, bound, need, wheels)
        why = f"this build requires a CUDA {side} than {bound}"
        return (UseBuild(inf.distribution, f"a build for CUDA {word} {bound}", why=why),)
    why = f"it links the libraries of a CUDA {side} than {bound}"
    return (Rebuild(inf.subject, (f"a CUDA {bound} toolkit",), why=why),)


@dataclass(frozen=True)
class _Wheels:
    """The installed distributions and who requires each (active Requires-Dist): what a wheel's remedy within
    the bound must satisfy."""

    inventory: Inventory
    required: dict[str, list[Requirer]]


def _within_bound(dist: Distribution, kind: str, bound: str, need: CudaNeed, wheels: _Wheels) -> tuple[Remedy, ...]:
    """The remedies of a wheel whose build needs a CUDA beyond the bound: its build within the bound
    (:func:`_build_within`), and, where true, that it needs only a driver (:func:`_driver_only`)."""
    word = "<=" if kind == "max" else ">="
    side = "newer" if kind == "max" else "older"
    build = _build_within(dist, kind, bound, need, wheels) or UseBuild(
        dist.key, f"a build for CUDA {word} {bound}", why=f"this build requires a CUDA {side} than {bound}"
    )
    driver = _driver_only(dist, kind, bound, need)
    return (build,) if driver is None else (build, driver)


def _build_within(dist: Distribution, kind: str, bound: str, need: CudaNeed, wheels: _Wheels) -> Remedy | None:
    """The wheel's build within the bound as a pip spec, where its version tracks the CUDA it needs (its
    ``major.minor`` is that CUDA's, which is how the need was read: ``nvidia-nvjitlink`` 13.5.37 -> 13.5) and
    the need is of the bound's major: the releases ``>=M.0,<M.(m+1)`` (max) or ``>=M.m,<(M+1)`` (min),
    narrowed by every installed requirer's specifier. pip picks the release, so it is a step by hand naming
    the exact spec. Requirers whose specifiers admit none of those releases are named instead (their own
    builds must change first). None: the version does not track CUDA, or another major is needed."""
    limit = parse_cuda(bound)
    if need.minor is None or limit.minor is None or need.major != limit.major:
        return None
    with contextlib.suppress(InvalidVersion):
        if Version(dist.version).release[:2] != (need.major, need.minor):
            return None
    word = "<=" if kind == "max" else ">="
    if kind == "max":
        own = SpecifierSet(f">={limit.major}.0,<{limit.major}.{limit.minor + 1}")
    else:
        own = SpecifierSet(f">={limit.major}.{limit.minor},<{limit.major + 1}")
    requirers = list(
        {
            (r.dist.key, str(r.requirement.specifier)): r
            for r in wheels.required.get(dist.key, ())
            if r.dist.key != dist.key
        }.values()
    )
    spec = own
    for r in requirers:
        spec &= r.requirement.specifier
    spec = _tightest(spec)
    said = f"{dist.label} needs CUDA {need.version}; its releases {_tightest(own)} are CUDA {word} {bound}"
    if _admits_some(spec):
        pinned = [r for r in requirers if r.requirement.specifier]
        accepted = "; ".join(f"{r.dist.label} requires {r.text}" for r in pinned) or "no installed requirer pins it"
        get = Pip("install", (f"{dist.name}{spec}",), pip_python(dist), why=accepted)
        return UseBuild(dist.name, f"its build for CUDA {word} {bound}", get, why=f"{said}; {accepted}")
    refusing = [r for r in requirers if not _admits_some(own & r.requirement.specifier)]
    return Manual(
        (
            f"use the builds of {', '.join(r.dist.name for r in refusing)} for CUDA {word} {bound}, then "
            f"install {dist.name}{_tightest(own)}",
        ),
        why=f"{said}; "
        + "; ".join(f"{r.dist.label} requires {r.text}" for r in refusing)
        + ", which admits none of them",
    )


def _driver_only(dist: Distribution, kind: str, bound: str, need: CudaNeed) -> Remedy | None:
    """That the wheel needs only a driver, where true (``--cuda-max`` only): it brings its own CUDA library (a
    RECORD-listed shared library, not the driver's), it needs a newer minor of the bound's major, and CUDA
    minor-version compatibility lets any driver of that major's branch (``compat.mvc_floor``) run it."""
    limit = parse_cuda(bound)
    floor = mvc_floor(need.major) if kind == "max" and need.major == limit.major else None
    libs = [
        os.path.basename(lib.path)
        for lib in dist.libraries
        if lib.exists and lib.soname and not is_driver_soname(lib.soname)
    ]
    if floor is None or not libs:
        return None
    return DriverUpgrade(
        floor,
        f"{need.major}.x",
        rule=f"CUDA minor-version compatibility: a driver of the CUDA {need.major} branch runs a library built "
        f"with any CUDA {need.major}.x, except PTX it JIT-compiles newer than the driver",
        why=f"{dist.label} brings its own library ({', '.join(libs[:3])}): where it runs it needs only that "
        f"driver, not CUDA {need.version}; if --cuda-max={bound} stands for the deployment driver's CUDA, it runs "
        "there as it is",
    )


def _tightest(spec: SpecifierSet) -> SpecifierSet:
    """``spec`` without the clauses another clause implies: of the lower bounds (``>=``, ``>``) the highest,
    of the upper bounds (``<``, ``<=``) the lowest; other clauses kept."""
    lower = [c for c in spec if c.operator in (">=", ">")]
    upper = [c for c in spec if c.operator in ("<", "<=")]
    kept = [c for c in spec if c.operator not in (">=", ">", "<", "<=")]
    with contextlib.suppress(InvalidVersion):
        if lower:
            kept.append(max(lower, key=lambda c: (Version(c.version), c.operator == ">")))
        if upper:
            kept.append(min(upper, key=lambda c: (Version(c.version), c.operator == "<=")))
        return SpecifierSet(",".join(str(c) for c in kept))
    return spec


def _admits_some(spec: SpecifierSet) -> bool:
    """Whether some release satisfies ``spec``: one of the versions its own clauses name (a wildcard's
    prefix as ``.0``) does; False also when none of them does (then which releases exist decides, unknown)."""
    candidates = []
    for clause in spec:
        text = clause.version.removesuffix(".*")
        with contextlib.suppress(InvalidVersion):
            candidates.append(Version(text))
    return any(spec.contains(v, prereleases=True) for v in candidates)


def _last_minor(major: int) -> int | None:
    """Last minor of a closed CUDA series (a newer major exists in the toolkit table): 12 -> 9; else None."""
    releases = [row.toolkit.release for row in load_compat().toolkits]
    if not any(r[0] > major for r in releases):
        return None
    minors = [r[1] if len(r) > 1 else 0 for r in releases if r[0] == major]
    return max(minors) if minors else None


def _exceeds(need: CudaNeed, bound: tuple[int, int | None], kind: str) -> bool | None:
    """True: violates the bound; False: within; None: undecidable (minor unknown on the bound's major)."""
    major, minor = bound
    if need.major != major:
        return need.major > major if kind == "max" else need.major < major
    if minor is None:
        return False
    if need.minor is None:
        if kind == "max":
            last = _last_minor(major)
            return None if last is None or last > minor else False
        return None if minor > 0 else False
    return need.minor > minor if kind == "max" else need.minor < minor


def bound_findings(
    kind: str,
    bound: str,
    inferences: Iterable[Inference],
    option: str | None = None,
    inventory: Inventory | None = None,
    reqs: Requirements | None = None,
) -> tuple[Finding, ...]:
    """Findings for ``--cuda-max`` (``kind="max"``) or ``--cuda-min`` against every inference.

    One ERROR per violating subject (naming every piece of evidence), one WARNING per undecidable
    version (listing the subjects), INFO for ambiguous sonames no evidence decides. ``inventory`` (and the
    run's requirement facts ``reqs``): the installed distributions, for a wheel's remedies within the bound
    (:func:`_within_bound`).
    """
    wheels = _Wheels(inventory, active_requirements(inventory, reqs)) if inventory is not None else None
    check = f"cuda-{kind}"
    label = option or f"--cuda-{kind}={bound}"
    parsed = parse_cuda(bound)
    limit = parsed.major, parsed.minor
    out: list[Finding] = []
    word = "newer" if kind == "max" else "older"
    undecidable: dict[str, list[CudaNeed]] = {}  # version -> one need per subject
    for inf in inferences:
        verdicts = [(n, _exceeds(n, limit, kind)) for n in inf.needs]
        bad = [n for n, v in verdicts if v]
        unsure = [n for n, v in verdicts if v is None]
        if bad:
            worst = max(bad, key=_key) if kind == "max" else min(bad, key=_key)
            out.append(
                Finding(
                    check,
                    Severity.ERROR,
                    inf.subject,
                    f"{worst.evidence.split(' via ')[0]} but {label}",
                    cause=f"it requires CUDA {worst.version}; {label} forbids anything {word} than {bound}",
                    facts=Facts(
                        required=label, found=worst.evidence.split(" via ")[0], bound=bound, consumer=inf.distribution
                    ),
                    distributions=(inf.distribution,) if inf.distribution else (),
                    remedies=_bound_remedy(inf, kind, bound, worst, wheels),
                    details=tuple(f"evidence: {n.evidence}" for n in bad),
                )
            )
        elif unsure:
            undecidable.setdefault(unsure[0].version, []).append(unsure[0])
        if not inf.needs:
            out.extend(
                Finding(check, Severity.INFO, inf.subject, f"CUDA version undecidable: {u}") for u in inf.undecided
            )
    for version, needs in sorted(undecidable.items()):
        out.append(
            Finding(
                check,
                Severity.WARNING,
                needs[0].subject if len(needs) == 1 else f"{len(needs)} components",
                f"require CUDA {version}: cannot tell whether that is within {label}",
                cause="only the CUDA major is known (from sonames or the wheel's name), not the minor",
                details=tuple(f"{n.subject}: {n.evidence}" for n in needs),
            )
        )
    return tuple(out)


def _key(need: CudaNeed) -> tuple[int, int]:
    return need.key


def group_by_requirer(
    findings: Sequence[Finding], inventory: Inventory, kind: str, bound: str, reqs: Requirements | None = None
) -> tuple[Finding, ...]:
    """One ERROR per root cause: a violating distribution and the violating wheels it pulls in.

    A wheel is pulled by a distribution whose Requires-Dist names it, directly or through other violating
    wheels (torch -> ``cuda-toolkit[cublas]`` -> nvidia-cublas); the root is the violating distribution no
    other violating one requires. Its finding names every wheel under it, and its fix is the root's build for
    the bound (``torch``: PyTorch's index for that CUDA, ``torchindex``): the wheels go with it. Findings
    about anything else (binaries, unrequired wheels) are kept as they are, in their order.
    """
    by_label = {d.label: d for d in inventory.distributions}
    bad = {by_label[f.subject].key: f for f in findings if f.failing and f.subject in by_label}
    if len(bad) < 2:
        return tuple(findings)
    required = active_requirements(inventory, reqs)
    parents: dict[str, list[str]] = {}  # key -> the violating distributions that require it
    for key in bad:
        for r in required.get(key, ()):
            if r.dist.key in bad and r.dist.key != key:
                parents.setdefault(key, []).append(r.dist.key)

    def root(key: str) -> tuple[str, tuple[str, ...]]:
        path: list[str] = []
        seen = {key}
        while parents.get(key):
            up = next((k for k in parents[key] if k not in seen), "")
            if not up:
                break
            path.append(up)
            seen.add(up)
            key = up
        return key, tuple(path)

    groups: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for key in bad:
        top, via = root(key)
        if top != key:
            groups.setdefault(top, []).append((key, via))
    out: list[Finding] = []
    grouped = {k for members in groups.values() for k, _ in members}
    for f in findings:
        dist = by_label.get(f.subject)
        if dist is None or dist.key not in bad:
            out.append(f)
        elif dist.key in groups:
            out.append(
                _group_finding(
                    dist, f, [(by_label[bad[k].subject], bad[k], v) for k, v in groups[dist.key]], kind, bound
                )
            )
        elif dist.key not in grouped:
            out.append(f)
    return tuple(out)


def _group_finding(
    root: Distribution,
    own: Finding,
    members: Sequence[tuple[Distribution, Finding, tuple[str, ...]]],
    kind: str,
    bound: str,
) -> Finding:
    majors = sorted({m.cuda_major for m, _, _ in members if m.cuda_major is not None})
    major = majors[-1] if kind == "max" and majors else (majors[0] if majors else None)
    cuda = f"CUDA {major}" if major is not None else "CUDA"
    names = [m.name for m, _, _ in members]
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    label = own.facts.required  # the bound as the user gave it ("--cuda-max=12.9 (from ini)")
    word = "<=" if kind == "max" else ">="
    drop = Pip("uninstall", (root.name, *names), pip_python(root), ("-y",), why=f"{root.name} and the wheels it pulled")
    index = index_for(kind, bound, major) if root.key == "torch" and major is not None else None
    build = f"a build for CUDA {word} {bound}"
    if index is not None:
        release = root.version.split("+")[0]
        why = f"{index.guess(release)}; source: {index.source}"
        get = Pip("install", (f"{root.name}=={release}",), pip_python(root), index_url=index.url, why=why)
        fix: tuple[Remedy, ...] = (drop, UseBuild(root.name, build, get, why="its CUDA wheels follow it"))
    else:
        fix = (drop, UseBuild(root.name, build, why="its CUDA wheels follow it"))
    details = [f"{root.label}: {own.facts.found}"]
    for dist, f, via in members:
        chain = " -> ".join((*reversed(via), dist.name))
        details.append(f"{dist.label} ({chain}): {f.facts.found}")
    return Finding(
        own.check,
        Severity.ERROR,
        root.label,
        f"{root.label} is a {cuda} build; it pulls {len(members)} {cuda} wheel(s): {shown}, but {label}",
        cause=f"{root.name} requires each of them (Requires-Dist, directly or through the others): they are "
        f"one cause, said once here for {root.name} and its {len(members)} wheel(s); {own.cause}",
        remedies=fix,
        facts=Facts(bound=bound, consumer=root.key, versions=tuple((m.name, m.version) for m, _, _ in members)),
        details=tuple(details),
        distributions=(root.key, *(m.key for m, _, _ in members)),
    )


def run_max(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``cuda-max`` item: ``--cuda-max`` against every inference of the stack."""
    bound = stack.settings.cuda_max
    if bound is None:
        raise ValueError("cudastack check 'cuda-max' needs --cuda-max")
    found = bound_findings(
        "max", bound, stack.inferences, stack.settings.describe("cuda_max"), stack.inventory, stack.requirements
    )
    return group_by_requirer(found, stack.inventory, "max", bound, stack.requirements)


def run_min(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``cuda-min`` item: ``--cuda-min`` against every inference of the stack."""
    bound = stack.settings.cuda_min
    if bound is None:
        raise ValueError("cudastack check 'cuda-min' needs --cuda-min")
    found = bound_findings(
        "min", bound, stack.inferences, stack.settings.describe("cuda_min"), stack.inventory, stack.requirements
    )
    return group_by_requirer(found, stack.inventory, "min", bound, stack.requirements)
