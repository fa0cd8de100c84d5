"""Mixed CUDA majors, judged from what each consumer resolves (findings of the closure item).

Two CUDA runtimes of different sonames (``libcudart.so.12`` and ``libcudart.so.13``, ``libcublas.so.12`` and
``.so.13``) are different objects: they load side by side in one process. So a package built for CUDA 12
inside a CUDA 13 torch venv, whose CUDA 12 libraries resolve from their own wheels, is an INFO (the driver
item judges whether the driver runs the newer). What breaks is a *file* of one major serving a consumer of
another, because glibc loads one object per soname (``_dl_map_object`` matches a request against the names
of the objects already loaded):

* **one soname needed from two majors** (ERROR): cuDNN's ``libcudnn.so.9``, NCCL's ``libnccl.so.2``,
  ``libcusparse.so.12``, ``libcurand.so.10`` ... exist in CUDA 12 and CUDA 13 wheels under the same name;
  consumers of both majors need it and it resolves to one file, which cannot serve both. When each side
  resolves a file of its own major, the first loaded serves both once both are imported into one process:
  a WARNING;
* **a library of another major** (ERROR): a consumer of one major resolves a library of the other (a CUDA 12
  extension whose ``libcusparse.so.12`` is the CUDA 13 wheel's file).

The CUDA major of a file (consumer or library): the flavour of the wheel whose RECORD lists it
(``Distribution.cuda_major``: ``nvidia-nccl-cu13``'s ``libnccl.so.2`` is CUDA 13) when its sonames allow it,
else what its own soname and DT_NEEDED CUDA sonames allow (:func:`~pytest_cudastack.model.runtime.caller_majors`,
:func:`~pytest_cudastack.cuda.compat.soname_cuda_majors`); a verdict needs one major on the library's side.
The consumers are every object of every module tree (:mod:`~pytest_cudastack.model.modules`, each in its
import context) and every library of a non-NVIDIA distribution no module loads (a provider such as ONNX
Runtime's ``libonnxruntime_providers_cuda.so``, loaded at run time), with its own closure.

The stack's major (torch's flavour, else the major most CUDA wheels are built for; none on a tie) names the
INFO's other side. Always on with ``--cudastack``: no ``--cuda-min``/``--cuda-max`` is needed.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from pytest_cudastack._sysio import real_path
from pytest_cudastack.cuda.compat import soname_cuda_majors
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Facts, Finding, Remedy, Severity, manual
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.resolver import Resolver, Tree
from pytest_cudastack.model.modules import ModuleTree
from pytest_cudastack.model.repair import NO_SAFE_REPAIR
from pytest_cudastack.model.runtime import caller_majors
from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = ["file_majors", "linked_majors", "majors_findings", "stack_major"]

_SUFFIX = re.compile(r"(cu(?:da)?)(\d+)")  # -cu12, cupy-cuda12x, jax-cuda12-plugin
_LOCAL = re.compile(r"\+cu(\d+)")


def stack_major(inv: Inventory) -> tuple[int | None, str]:
    """(the stack's CUDA major, the evidence): torch's flavour, else the majority of CUDA wheels."""
    for d in inv.distributions:
        if canonicalize_name(d.name) == "torch" and d.cuda_major is not None:
            return d.cuda_major, f"{d.label} is built for CUDA {d.cuda_major}"
    counts = Counter(d.cuda_major for d in inv.distributions if d.cuda_major is not None)
    ranked = counts.most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None, "no torch and no majority of CUDA wheels"
    major, n = ranked[0]
    return major, f"{n} of {sum(counts.values())} CUDA wheels are built for CUDA {major}"


def linked_majors(info: ElfInfo) -> tuple[frozenset[int], tuple[str, ...]]:
    """The CUDA majors a file's DT_NEEDED CUDA sonames all allow (all they name when they disagree), and
    those sonames."""
    named = [(n, m) for n in info.needed if (m := soname_cuda_majors(n))]
    if not named:
        return frozenset(), ()
    common = frozenset.intersection(*(m for _, m in named))
    return common or frozenset().union(*(m for _, m in named)), tuple(n for n, _ in named)


def file_majors(path: str, read: Callable[[str], ElfInfo], inv: Inventory) -> frozenset[int]:
    """The CUDA major(s) the file at ``path`` is built for (module docstring): its wheel's flavour when its
    sonames allow it (all owners agreeing), else what its sonames allow; empty when nothing says."""
    try:
        named = caller_majors(read(path))
    except ElfError:
        named = frozenset()
    wheels = {d.cuda_major for d in inv.owners(path) if d.cuda_major is not None}
    if len(wheels) == 1 and (not named or wheels <= named):
        return frozenset(wheels)
    return named


def _other_build(d: Distribution, want: int) -> str:
    """What to install instead, by hand: the model holds no file of a build that is not installed, so this is
    never a verified command."""
    m = _SUFFIX.search(d.name)
    if m:
        other = d.name[: m.start()] + f"{m.group(1)}{want}" + d.name[m.end() :]
        return f"install {other} (the CUDA {want} build of {d.name}) in its place"
    if _LOCAL.search(d.version):
        return f"install {d.name} {_LOCAL.sub('', d.version)} from its CUDA {want} index (+cu{want}X) in its place"
    return f"install the build of {d.name} for CUDA {want} in its place"


def _majors_text(majors: frozenset[int]) -> str:
    return "/".join(map(str, sorted(majors)))


# --------------------------------------------------------------------------------------------- the edges


@dataclass(frozen=True)
class _Edge:
    """One consumer's DT_NEEDED request for a CUDA soname, and the file it resolves to."""

    needer: str
    needer_majors: frozenset[int]
    soname: str
    path: str


@dataclass
class _Facts:
    inv: Inventory
    read: Callable[[str], ElfInfo]
    memo: dict[str, frozenset[int]] = field(default_factory=dict)
    dirs: dict[str, str] = field(default_factory=dict)

    def majors(self, path: str) -> frozenset[int]:
        key = real_path(path, self.dirs)
        if key not in self.memo:
            self.memo[key] = file_majors(path, self.read, self.inv)
        return self.memo[key]


def _edges(facts: _Facts, trees: Sequence[Tree]) -> list[_Edge]:
    """Every (consumer, CUDA soname, resolved file) of ``trees``, once each, consumers of a known major."""
    seen: set[tuple[str, str, str]] = set()
    out: list[_Edge] = []
    for tree in trees:
        for lib in tree.libraries:
            if lib.path is None or soname_cuda_majors(lib.soname) is None:
                continue
            for needer in lib.needed_by:
                key = (needer, lib.soname, lib.path)
                majors = facts.majors(needer)
                if key not in seen and majors:
                    seen.add(key)
                    out.append(_Edge(needer, majors, lib.soname, lib.path))
    return out


def _provider_trees(
    inv: Inventory, resolver: Resolver, trees: Sequence[ModuleTree], dirs: dict[str, str]
) -> list[Tree]:
    """The closures of the present libraries of non-NVIDIA distributions that no module tree maps."""
    reached = {real_path(mt.module.path, dirs) for mt in trees}
    reached |= {lib.realpath or real_path(lib.path, dirs) for mt in trees for lib in mt.tree.libraries if lib.path}
    out: list[Tree] = []
    for d in inv.distributions:
        if canonicalize_name(d.name).startswith("nvidia-"):
            continue  # the CUDA libraries themselves: reached through their consumers
        for lib in d.libraries:
            if lib.exists and not lib.pyinit and not lib.problem and real_path(lib.path, dirs) not in reached:
                out.append(resolver.tree(lib.path))
    return out


# --------------------------------------------------------------------------------------------- the findings


@dataclass(frozen=True)
class _Side:
    """The consumers of one major that resolve one soname to one file."""

    major: int
    needers: tuple[str, ...]


def _label(inv: Inventory, path: str, rel: Callable[[str], str]) -> str:
    owners = inv.owners(path)
    return f"{rel(path)} ({owners[0].label})" if owners else rel(path)


def _dist_of(inv: Inventory, path: str) -> Distribution | None:
    owners = inv.owners(path)
    return owners[0] if owners else None


def _sides(facts: _Facts, edges: Sequence[_Edge]) -> list[_Side]:
    """The consumers of ``edges`` grouped by their one major (those of several majors left out)."""
    by: dict[int, list[str]] = {}
    for e in edges:
        if len(e.needer_majors) == 1:
            by.setdefault(next(iter(e.needer_majors)), []).append(e.needer)
    return [_Side(m, tuple(dict.fromkeys(by[m]))) for m in sorted(by)]


def _by_hand(
    facts: _Facts, wrong: _Side, file_major: int | None, lib_path: str, library: bool = True, when: str = ""
) -> tuple[Remedy, ...]:
    """The remedies, said as advice: the other build of the consumer, and (``library``: no consumer of the
    file's own major needs it) the consumer's build of the library."""
    ways: list[str] = []
    consumer = _dist_of(facts.inv, wrong.needers[0])
    if consumer is not None and file_major is not None:
        ways.append(_other_build(consumer, file_major))
    owner = _dist_of(facts.inv, lib_path) if library else None
    if owner is not None and owner.cuda_major not in (None, wrong.major):
        ways.append(_other_build(owner, wrong.major).replace(" in its place", " where the consumer finds it"))
    if not ways:
        ways.append("install the builds of one CUDA major for every package that needs it")
    return manual(
        f"{NO_SAFE_REPAIR}: the other build is not installed here to check. By hand: " + ", or ".join(ways) + when
    )


def _facts(inv: Inventory, soname: str, path: str, sides: Sequence[_Side], found: str = "") -> Facts:
    """The finding's data: the soname, the file it resolves to and its consumers (``objects``, after the file),
    what they need; ``consumer``: the distribution of the one side's first consumer (None for two sides)."""
    owner = _dist_of(inv, sides[-1].needers[0]) if len(sides) == 1 else None
    return Facts(
        required=" and ".join(f"CUDA {s.major}" for s in sides),
        found=found,
        sonames=(soname,),
        objects=tuple(os.path.normpath(p) for p in (path, *(n for s in sides for n in s.needers))),
        consumer=owner.key if owner is not None else None,
    )


def _shared_finding(
    facts: _Facts, soname: str, path: str, sides: Sequence[_Side], rel: Callable[[str], str]
) -> Finding:
    """Rule (a): consumers of two majors need ``soname`` and it resolves to one file."""
    fmaj = facts.majors(path)
    file_major = next(iter(fmaj)) if len(fmaj) == 1 else None
    wrong = next((s for s in sides if s.major != file_major), sides[-1])
    names = " and ".join(f"CUDA {s.major} ({_label(facts.inv, s.needers[0], rel)})" for s in sides)
    built = f"the CUDA {file_major} build" if file_major is not None else "a build of one CUDA major"
    return Finding(
        check="closure",
        severity=Severity.ERROR,
        subject=soname,
        message=f"{soname} is needed by consumers of {names}; it resolves to one file, {_label(facts.inv, path, rel)}",
        cause=f"{soname} has the same name in the CUDA {' and '.join(str(s.major) for s in sides)} wheels; the "
        f"process loads one object of that soname, {built}, and it cannot serve the consumers of CUDA "
        f"{wrong.major}: their import fails or the library misbehaves",
        remedies=_by_hand(facts, wrong, file_major, path, library=file_major is None),
        facts=_facts(facts.inv, soname, path, sides),
        where=(os.path.dirname(os.path.normpath(path)),),
        chain=(rel(wrong.needers[0]), rel(path)),
        details=tuple(f"CUDA {s.major}: {rel(n)}" for s in sides for n in s.needers),
    )


def _other_major_finding(
    facts: _Facts, soname: str, path: str, side: _Side, file_major: int, rel: Callable[[str], str]
) -> Finding:
    """Rule (b): consumers of one major resolve ``soname`` to a library of another."""
    first = _label(facts.inv, side.needers[0], rel)
    more = f" and {len(side.needers) - 1} more" if len(side.needers) > 1 else ""
    return Finding(
        check="closure",
        severity=Severity.ERROR,
        subject=soname,
        message=f"{first}{more}, built for CUDA {side.major}, resolves {soname} to "
        f"{_label(facts.inv, path, rel)}, a CUDA {file_major} library",
        cause=f"{soname} has the same name in CUDA {side.major} and CUDA {file_major} builds; the file found "
        f"first is the CUDA {file_major} one, whose API and own dependencies are CUDA {file_major}'s: the "
        "import fails or the library misbehaves",
        remedies=_by_hand(facts, side, file_major, path),
        facts=_facts(facts.inv, soname, path, [side], found=f"CUDA {file_major}"),
        where=(os.path.dirname(os.path.normpath(path)),),
        chain=(rel(side.needers[0]), rel(path)),
        details=tuple(f"CUDA {side.major}: {rel(n)}" for n in side.needers),
    )


def _two_files_finding(
    facts: _Facts, soname: str, files: Sequence[tuple[str, _Side]], rel: Callable[[str], str]
) -> Finding:
    """Each major's consumers resolve ``soname`` to a file of their own major: fine apart, one of them wrong
    once both are imported into one process (the first loaded serves every later request by soname)."""
    names = " and ".join(f"CUDA {s.major} ({_label(facts.inv, p, rel)})" for p, s in files)
    return Finding(
        check="closure",
        severity=Severity.WARNING,
        subject=soname,
        message=f"{soname} resolves to files of {names} for their consumers",
        cause="the dynamic linker loads one object per soname: once both are imported into one process the "
        f"first loaded {soname} serves the consumers of the other major too",
        remedies=_by_hand(
            facts,
            files[-1][1],
            files[0][1].major,
            files[0][0],
            library=False,
            when=" (if both are imported into one process)",
        ),
        facts=Facts(sonames=(soname,), objects=tuple(os.path.normpath(p) for p, _ in files)),
        where=tuple(dict.fromkeys(os.path.dirname(os.path.normpath(p)) for p, _ in files)),
        details=tuple(f"CUDA {s.major}: {rel(n)} -> {rel(p)}" for p, s in files for n in s.needers),
    )


def _conflicts(facts: _Facts, edges: Sequence[_Edge], rel: Callable[[str], str]) -> tuple[list[Finding], set[str]]:
    """The ERRORs and WARNINGs of rules (a) and (b), and the consumers they name."""
    by_soname: dict[str, dict[str, list[_Edge]]] = {}
    for e in edges:
        by_soname.setdefault(e.soname, {}).setdefault(real_path(e.path, facts.dirs), []).append(e)
    out: list[Finding] = []
    named: set[str] = set()
    for soname in sorted(by_soname):
        judged: list[tuple[str, _Side]] = []  # (file, side) pairs of single-major files, for the two-file rule
        for group in by_soname[soname].values():
            path = group[0].path
            sides = _sides(facts, group)
            fmaj = facts.majors(path)
            wrong = [s for s in sides if len(fmaj) == 1 and s.major not in fmaj]
            if len(sides) > 1:
                out.append(_shared_finding(facts, soname, path, sides, rel))
            elif wrong:
                out.append(_other_major_finding(facts, soname, path, wrong[0], next(iter(fmaj)), rel))
            else:
                judged.extend((path, s) for s in sides)
                continue
            named.update(n for s in sides for n in s.needers)
        if len({s.major for _, s in judged}) > 1:
            out.append(_two_files_finding(facts, soname, judged, rel))
    return out, named


def _side_by_side(facts: _Facts, trees: Sequence[Tree], named: set[str], rel: Callable[[str], str]) -> list[Finding]:
    """One INFO per non-NVIDIA distribution whose files are built for another major than the stack's and
    that no ERROR names: two runtimes of different sonames load side by side."""
    want, evidence = stack_major(facts.inv)
    if want is None:
        return []
    notes: dict[str, tuple[Distribution, list[str], set[int]]] = {}
    mapped = {real_path(t.path, facts.dirs) for t in trees}  # what a load maps (not a foreign module)
    mapped |= {lib.realpath or real_path(lib.path, facts.dirs) for t in trees for lib in t.libraries if lib.path}
    for d in facts.inv.distributions:
        if canonicalize_name(d.name).startswith("nvidia-"):
            continue
        for lib in d.libraries:
            if not lib.exists or lib.problem or lib.path in named or real_path(lib.path, facts.dirs) not in mapped:
                continue
            got = facts.majors(lib.path)
            if got and want not in got:
                try:
                    sonames = linked_majors(facts.read(lib.path))[1]
                except ElfError:
                    sonames = ()
                entry = notes.setdefault(d.key, (d, [], set()))
                entry[1].append(f"{rel(lib.path)} links {', '.join(sonames) or 'CUDA ' + _majors_text(got)}")
                entry[2].update(got)
    out: list[Finding] = []
    for d, details, majors in notes.values():
        other = _majors_text(frozenset(majors))
        out.append(
            Finding(
                check="closure",
                severity=Severity.INFO,
                subject=d.label,
                message=f"{d.label} is built for CUDA {other} beside the stack's CUDA {want}: two CUDA runtimes "
                "load side by side",
                cause=f"{evidence}; CUDA libraries of different sonames (libcudart.so.{other} and "
                f"libcudart.so.{want}) are different objects in one process, and no library it needs resolves "
                "to a file of another major",
                remedies=manual("nothing to do here; the driver item judges whether the driver runs the newer CUDA"),
                facts=Facts(required=f"CUDA {other}", found=f"CUDA {want}", consumer=d.key),
                where=(d.location,),
                details=tuple(details),
            )
        )
    return out


def majors_findings(
    inv: Inventory,
    read: Callable[[str], ElfInfo],
    rel: Callable[[str], str],
    trees: Sequence[ModuleTree],
    resolver: Resolver,
) -> tuple[Finding, ...]:
    """The mixed-major findings of ``inv`` (module docstring): ``trees`` its module trees, ``resolver`` the
    run's (for the providers' closures); ``rel`` names files relative to their site."""
    facts = _Facts(inv, read)
    closures = [mt.tree for mt in trees] + _provider_trees(inv, resolver, trees, facts.dirs)
    found, named = _conflicts(facts, _edges(facts, closures), rel)
    return (*found, *_side_by_side(facts, closures, named, rel))
