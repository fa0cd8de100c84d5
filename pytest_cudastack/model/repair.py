"""One repair plan per environment: the pip commands that repair what the findings report, in the venv's own
interpreter, each claim checked against a model of the files after the commands.

The model follows pip's own behaviour (pip ``uninstall`` deletes every file its RECORD lists, whoever wrote
it; ``install --force-reinstall --no-deps X==V`` writes X's files again, replacing whatever is there), applied
to the RECORD-listed shared libraries of the inventory: for each path, whose bytes it holds (or none). A
distribution not installed (torch pins ``nvidia-cudnn-cu13`` after it was uninstalled) is modelled with the
paths of its installed CUDA variant (``ownership.variant_sibling``: the -cu12 and -cu13 wheels of cuDNN, NCCL,
cuSPARSELt and NVSHMEM install the same paths), and only then.

The plan, for the distributions of one installation prefix:

1. ``pip uninstall -y`` the strays: a distribution in a failing finding that nothing installed requires,
   whose CUDA variant (or the other distribution of an overlap) something does require;
2. ``pip install --force-reinstall --no-deps`` every distribution (at its pinned, else installed, version)
   that a failing finding names and whose files the model does not find intact after step 1, and every
   pinned variant that is not installed;
3. for a grouped ``cuda-max`` / ``cuda-min`` finding about torch (``bounds.group_by_requirer``): uninstall
   torch and the wheels it pulled, then install torch from PyTorch's index for the bound.

Verification (``_Model.errors``, run on the state before and after the steps): the checks the steps can
affect, re-run over the modelled file set: integrity (a RECORD-listed library gone, or holding another
distribution's bytes; two installed distributions listing one path with different bytes), requirements (every
active Requires-Dist of what stays installed, at the version installed or reinstalled: a reinstall of a version
not on disk takes its version from the requirer's pin, its RECORD rows as unknown) and closure resolution (a
library an extension module loads must stay on disk; a missing soname must appear at one of the paths the
linker tried: :class:`LoadFacts`). Steps that create an error, or leave one about what they act on (a
distribution, its CUDA variant, a library whose bytes they change), are not proposed (``refused`` says why);
a finding is claimed as fixed only when no error about it is left. What the plan cannot model (binaries, the
driver, GPU code, a shadowed copy on the search path) stays in ``unresolved``; a requirements finding (an
unmet or absent pin, a framework rule on a pinned library) is claimed when the steps act on a distribution it
names and the model leaves no error about those. A dlopen finding is claimed when, over the predicted files,
its caller's own search (the paths it tried, in order: ``Facts.tried``) first meets the library, of the
caller's CUDA major where both are known (``_Model.loads_again``); otherwise its manual step stays.

:func:`verified_fixes` gives the integrity and closure findings their fix from the same model: the plan's
command where it repairs them, else "no safe automatic repair is known" with the model's reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pytest_cudastack.cuda.compat import soname_cuda_majors
from pytest_cudastack.cuda.flavour import wheel_cuda_flavour
from pytest_cudastack.cuda.frameworks import load_rules
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.escape import printable
from pytest_cudastack.findings import Finding, Manual, Pip, Remedy, UseBuild
from pytest_cudastack.linker.resolver import Tree
from pytest_cudastack.model.system import by_hand_instead, externally_managed_env
from pytest_cudastack.model.torchindex import index_for
from pytest_cudastack.wheels.inventory import Distribution, Inventory
from pytest_cudastack.wheels.ownership import (
    FORCE,
    Requirer,
    active_requirements,
    bytes_on_disk,
    exact_pin,
    pip_python,
    variant_sibling,
)
from pytest_cudastack.wheels.requirements import Requirements, requirement_facts
from pytest_cudastack.wheels.sitepaths import install_prefix

__all__ = [
    "NO_SAFE_REPAIR",
    "LoadFacts",
    "PlanStep",
    "RepairPlan",
    "load_facts",
    "plan_repairs",
    "plan_step",
    "predict",
    "render_plans",
    "verified_fixes",
]

_MODELLED = ("integrity", "closure", "requirements", "cuda-max", "cuda-min", "driver", "symbols", "dlopen")
# the checks whose findings bound the CUDA a torch build may need (facts.bound), and which way: the driver's
# CUDA bounds it from above as --cuda-max does
_BOUNDED = {"cuda-max": "max", "cuda-min": "min", "driver": "max"}
# the checks whose findings are a soname some load misses: the distributions whose RECORDs list it are theirs
_LOADS = ("closure", "dlopen")


@dataclass(frozen=True)
class PlanStep:
    """One step of a plan: ``automatic`` (a pip command the model verified: applied to the modelled state it
    leaves none of the errors it claims and no new one) or ``manual`` (an exact step by hand, a structured
    :data:`~pytest_cudastack.findings.Remedy`), the findings (ids) it resolves and why."""

    kind: str  # "automatic" | "manual"
    action: Remedy
    resolves: tuple[str, ...]
    why: str = ""

    @property
    def argv(self) -> tuple[str, ...] | None:
        """The command line of an automatic step (None for a manual one)."""
        return self.action.argv if self.kind == "automatic" and isinstance(self.action, Pip) else None

    @property
    def command(self) -> str:
        return self.action.render()

    def to_json(self) -> dict[str, Any]:
        argv = self.argv
        return {
            "kind": self.kind,
            "argv": list(argv) if argv is not None else None,
            "command": self.command,
            "action": self.action.to_json(),
            "resolves": list(self.resolves),
            "why": self.why,
        }


@dataclass(frozen=True)
class RepairPlan:
    """The steps for one environment (``environment``: its installation prefix, or what the run judges:
    "this machine", an image), in order:
    the automatic ones first, then the manual ones, so that every failing finding is covered. ``fixes``: the
    findings (ids) the automatic steps repair; ``unresolved``: those they do not (each covered by a manual
    step); ``notes``: what the model takes on trust (an index that is a guess); ``refused``: the errors the
    model predicts after a candidate it did not propose; ``chose``: what the plan chose over what."""

    environment: str
    steps: tuple[PlanStep, ...]
    fixes: tuple[str, ...]
    unresolved: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    refused: tuple[str, ...] = field(default=())
    chose: tuple[str, ...] = field(default=())

    @property
    def automatic(self) -> tuple[PlanStep, ...]:
        return tuple(s for s in self.steps if s.kind == "automatic")

    @property
    def remedies(self) -> tuple[Remedy, ...]:
        """The automatic steps' pip commands, in order (what a finding the plan repairs carries as its fix)."""
        return tuple(s.action for s in self.automatic)

    @property
    def command(self) -> str:
        """The automatic steps as one shell command line ("" when there are none)."""
        return " && ".join(step.command for step in self.automatic)

    def render(self, cause: str = "") -> str:
        """The plan as text: ``cause`` (one line: what the first error it repairs says), then each step,
        numbered, with what it resolves and why."""
        lines = [f"repair plan for {self.environment}:"]
        if cause:
            lines.append(f"  cause: {cause}")
        for i, step in enumerate(self.steps, 1):
            label = "run" if step.kind == "automatic" else "by hand"
            lines.append(f"  {i}. [{label}] {step.command}")
            if step.why:
                lines.append(f"     why: {step.why}")
            lines.append(f"     resolves: {', '.join(step.resolves)}")
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  chose: {c}" for c in self.chose)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "steps": [s.to_json() for s in self.steps],
            "command": self.command,
            "fixes": list(self.fixes),
            "unresolved": list(self.unresolved),
            "notes": list(self.notes),
            "chose": list(self.chose),
        }

    def step_of(self, finding_id: str) -> int | None:
        """The number (from 1) of the first step that resolves ``finding_id``, else None."""
        return next((i for i, s in enumerate(self.steps, 1) if finding_id in s.resolves), None)


def render_plans(plans: Sequence[RepairPlan], findings: Iterable[Finding] = ()) -> str:
    """The plans with steps, one block each, each opening with its cause: the message of the first of
    ``findings`` it resolves (one line); "" when there is nothing to do."""
    by_id = {f.id: f for f in findings}
    blocks = []
    for p in plans:
        if not p.steps:
            continue
        first = next((by_id[i] for s in p.steps for i in s.resolves if i in by_id), None)
        cause = first.message.splitlines()[0] if first is not None else ""
        blocks.append(p.render(_one_line(cause)))
    return printable("\n".join(blocks), newlines=True)  # names, versions and paths from files


def plan_step(plans: Sequence[RepairPlan], finding: Finding) -> str | None:
    """``step 2 of the repair plan for ENV`` (each step that resolves ``finding``), None when no plan does."""
    for p in plans:
        steps = [str(i) for i, s in enumerate(p.steps, 1) if finding.id in s.resolves]
        if steps:
            word = "step" if len(steps) == 1 else "steps"
            return f"{word} {', '.join(steps)} of the repair plan for {p.environment}"
    return None


def _one_line(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _sonames(f: Finding) -> tuple[str, ...]:
    """The sonames a finding is about (its facts)."""
    return f.facts.sonames


def _key(f: Finding) -> str:
    return f.id


_Row = tuple[str | None, int | None]  # (hash, size) of a RECORD row; (None, None): not known (not on disk)


@dataclass(frozen=True)
class LoadFacts:
    """What the extension modules' closures load now (``loaded``: soname, path) and what they miss
    (``missing``: soname, every path the linker tried for it), for the model's closure check
    (:func:`load_facts`)."""

    loaded: tuple[tuple[str, str], ...] = ()
    missing: tuple[tuple[str, tuple[str, ...]], ...] = ()


def load_facts(trees: Iterable[Tree]) -> LoadFacts:
    """The :class:`LoadFacts` of resolved closures (``modules.module_trees``' trees)."""
    loaded: dict[tuple[str, str], None] = {}
    missing: dict[str, dict[str, None]] = {}
    for tree in trees:
        for lib in tree.libraries:
            if lib.path is not None:
                loaded[(lib.soname, os.path.normpath(lib.path))] = None
            else:
                missing.setdefault(lib.soname, {}).update(dict.fromkeys(os.path.normpath(t) for t in lib.tried))
    return LoadFacts(tuple(loaded), tuple((s, tuple(t)) for s, t in missing.items()))


@dataclass(frozen=True)
class _Err:
    """One error the model finds; equal when ``kind`` and ``subject`` are (``about``: the distribution keys
    and ``so:<soname>`` tokens it concerns)."""

    kind: str
    subject: str
    about: frozenset[str] = field(compare=False)
    text: str = field(compare=False)


@dataclass
class _Model:
    """Installed distributions (key -> RECORD-listed library paths, name, version, active requirements) and
    whose bytes each path holds: what pip's uninstall / ``install --force-reinstall --no-deps`` change."""

    libs: dict[str, tuple[str, ...]]
    rows: dict[str, dict[str, _Row]]  # key -> path -> its RECORD row
    on_disk: dict[str, str | None]  # path -> key whose bytes are there, None: missing or nobody's
    names: dict[str, str]
    versions: dict[str, str]
    requires: dict[str, tuple[Requirement, ...]]
    sonames: dict[str, str]  # path -> the soname (else file name) of the library at it
    # key of a distribution installed from the index (no files of it here) -> the sonames its library ships,
    # as the library table and its CUDA flavour say (``shipped_by``): what the install adds to the search
    added: dict[str, Callable[[str], bool]] = field(default_factory=dict)

    def copy(self) -> _Model:
        return _Model(
            dict(self.libs),
            {k: dict(v) for k, v in self.rows.items()},
            dict(self.on_disk),
            dict(self.names),
            dict(self.versions),
            dict(self.requires),
            self.sonames,
            dict(self.added),
        )

    def uninstall(self, key: str) -> None:
        for path in self.libs.pop(key, ()):
            self.on_disk[path] = None
        for table in (self.rows, self.names, self.versions, self.requires):
            table.pop(key, None)

    def install(
        self,
        key: str,
        paths: tuple[str, ...],
        rows: dict[str, _Row],
        name: str | None = None,
        version: str | None = None,
        requires: tuple[Requirement, ...] | None = None,
    ) -> None:
        """``pip install --force-reinstall --no-deps name==version``: its files written over whatever is there
        (an already installed key keeps its name and requirements unless given)."""
        self.libs[key] = paths
        self.rows[key] = rows
        self.names[key] = name or self.names.get(key, key)
        if version is not None:
            self.versions[key] = version
        self.requires[key] = requires if requires is not None else self.requires.get(key, ())
        for path in paths:
            self.on_disk[path] = key

    def intact(self, key: str) -> bool:
        return key in self.libs and all(self.on_disk.get(p) == key for p in self.libs[key])

    def label(self, key: str) -> str:
        return f"{self.names.get(key, key)} {self.versions.get(key, '?')}"

    def errors(self, facts: LoadFacts) -> set[_Err]:
        """What integrity, the requirements and closure resolution would report on this state."""
        out: set[_Err] = set()
        by_path: dict[str, list[str]] = {}
        for key, paths in self.libs.items():
            for p in paths:
                by_path.setdefault(p, []).append(key)
                holder = self.on_disk.get(p)
                so = f"so:{self.sonames.get(p, os.path.basename(p))}"
                if holder is None:
                    out.add(_Err("gone", f"{key}:{p}", frozenset((key, so)), f"{self.label(key)} lists {p}, gone"))
                elif holder != key and self.rows[key].get(p) != self.rows.get(holder, {}).get(p):
                    text = f"{p} holds {self.label(holder)}'s bytes, not {self.label(key)}'s"
                    out.add(_Err("foreign", f"{key}:{p}", frozenset((key, holder, so)), text))
        for p, keys in by_path.items():
            if len(keys) > 1 and len({self.rows[k].get(p) for k in keys}) > 1:
                text = f"{' and '.join(self.label(k) for k in keys)} install {p} with other bytes"
                out.add(_Err("overlap", p, frozenset(keys), text))
        for key, reqs in self.requires.items():
            for r in reqs:
                want = canonicalize_name(r.name)
                if want == key:
                    continue
                have = self.versions.get(want)
                if have is None:
                    text = f"{self.label(key)} requires {r.name}{r.specifier}, which would not be installed"
                    sibling = variant_sibling(want)
                    if sibling is not None and sibling in self.versions:
                        # the variants install the same paths: what it would load is the sibling's build
                        text += f" (it would load {self.label(sibling)}'s files from the same paths)"
                    out.add(_Err("absent", f"{key}->{want}", frozenset((want,)), text))
                elif r.specifier and not r.specifier.contains(have, prereleases=True):
                    text = f"{self.label(key)} requires {r.name}{r.specifier}, {have} would be installed"
                    out.add(_Err("unmet", f"{key}->{want}", frozenset((want,)), text))
        for soname, path in facts.loaded:
            if path in self.on_disk and self.on_disk[path] is None:
                text = f"{soname} would be gone from {path}, where an extension module loads it"
                out.add(_Err("unloadable", soname, frozenset((f"so:{soname}",)), text))
        for soname, tried in facts.missing:
            if not any(self.present(t) for t in tried) and not any(ships(soname) for ships in self.added.values()):
                text = f"{soname} would still not be found (tried {len(tried)} path(s))"
                out.add(_Err("not-found", soname, frozenset((f"so:{soname}",)), text))
        return out

    def present(self, path: str) -> bool:
        """Whether a file is at ``path`` in this state (a path no modelled distribution lists: as on disk)."""
        path = os.path.normpath(path)
        if path in self.on_disk:
            return self.on_disk[path] is not None
        return os.path.lexists(path)

    def major(self, path: str) -> int | None:
        """The CUDA major of the distribution whose bytes are at ``path`` in this state (its flavour), None
        when no modelled distribution's are or its flavour is unknown."""
        key = self.on_disk.get(os.path.normpath(path))
        if key is None:
            return None
        return wheel_cuda_flavour(self.names.get(key, key), self.versions.get(key, ""), (), ())[0]

    def loads_again(self, f: Finding) -> bool:
        """Whether the run-time load a dlopen finding reports succeeds in this state: its caller
        (``objects[0]``) is present and, for each soname it reports, the caller's search (``facts.tried``, in
        order: the same search, over this state's files; the paths ending in that name) first meets a file, of
        the caller's CUDA major where both majors are known, or a wheel installed from the index ships the name
        (what the install adds to the search, as for closure). A load on a copy of another major (``found``)
        needs the copy it now meets held by a known distribution of the caller's major; a load on another copy
        than its own (``required``: its own copy's path) is repaired when its own copy comes first."""
        if not f.facts.objects or not self.present(f.facts.objects[0]):
            return False
        caller, tried = f.facts.objects[0], f.facts.tried
        if f.facts.found and os.path.isabs(f.facts.required or ""):
            first = next((t for t in tried if self.present(t)), None)
            return first is not None and os.path.normpath(first) == os.path.normpath(f.facts.required or "")
        for soname in f.facts.sonames or (f.facts.required or "",):
            paths = [t for t in tried if os.path.basename(t) == soname] or list(tried)
            first = next((t for t in paths if self.present(t)), None)
            if first is None:
                if not any(ships(soname) for ships in self.added.values()):
                    return False
                continue
            want, got = self.major(caller), self.major(first)
            if f.facts.found and (want is None or got is None):
                return False
            if want is not None and got is not None and want != got:
                return False
        return True


def _model(dists: Sequence[Distribution], required: dict[str, list[Requirer]], inv: Inventory) -> _Model:
    libs: dict[str, tuple[str, ...]] = {}
    rows: dict[str, dict[str, _Row]] = {}
    owners: dict[str, list[Distribution]] = {}
    sonames: dict[str, str] = {}
    requires: dict[str, list[Requirement]] = {d.key: [] for d in dists}
    for d in dists:
        listed = tuple(lib.path for lib in d.libraries if lib.record is not None)
        libs[d.key] = listed
        rows[d.key] = {lib.path: (lib.record.hash, lib.record.size) for lib in d.libraries if lib.record is not None}
        for lib in d.libraries:
            sonames[lib.path] = lib.soname or os.path.basename(lib.path)
        for p in listed:
            owners.setdefault(p, []).append(d)
    mine = {id(d) for d in dists}
    for rs in required.values():
        for r in rs:
            if id(r.dist) in mine:
                requires[r.dist.key].append(r.requirement)
    on_disk: dict[str, str | None] = {}
    for p, ds in owners.items():
        size = _size(p)
        # bytes attributed by RECORD size, as integrity does when sizes decide; an owner listing no size loses
        match = [d for d in ds if size is not None and rows[d.key][p][1] == size]
        if len({rows[d.key][p] for d in match}) > 1:  # sizes cannot decide: integrity's own attribution
            matched, _undecided = bytes_on_disk(inv, p)
            match = [d for d in match if any(m is d for m in matched)]
        on_disk[p] = match[-1].key if match else None
    return _Model(
        libs,
        rows,
        on_disk,
        {d.key: d.name for d in dists},
        {d.key: d.version for d in dists},
        {k: tuple(v) for k, v in requires.items()},
        sonames,
    )


def _unknown_rows(paths: Iterable[str]) -> dict[str, _Row]:
    """RECORD rows of a version not on disk: not known, so unequal to any known row."""
    return {p: (None, None) for p in paths}


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _environment(d: Distribution) -> str:
    return install_prefix(d.location)


def _version_for(d: Distribution, requirers: Sequence[Requirer]) -> str:
    for r in requirers:
        pin = exact_pin(r)
        if pin is not None:
            return pin
    return d.version


def shipped_by(name: str) -> Callable[[str], bool] | None:
    """Which sonames a wheel of ``name`` that is not on disk ships: its library's soname stems (the library
    table, ``framework_rules.json``) at its CUDA flavour's major (``nvidia-cublas-cu11`` ships
    ``libcublas.so.11``, not ``.so.12``); None when the table does not know the wheel. The model holds no
    files of such a wheel; this is what an install of it adds to the linker's search (the requirer's RPATH
    reaches the wheel's directory: where its pinned wheels install)."""
    try:
        row = load_rules().library_for_wheel(name)
        major, _ = wheel_cuda_flavour(name, "", (), ())
    except CudaStackError:
        return None
    if row is None:
        return None

    def ships(soname: str) -> bool:
        majors = soname_cuda_majors(soname)
        return row.matches_soname(soname) and (major is None or not majors or major in majors)

    return ships


def _named(f: Finding, inv: Inventory) -> set[str]:
    """Keys of the installed distributions a finding is about: its ``distributions``, the requirement of a
    broken pin (its facts: ``required`` by ``consumer``), the claimers of a missing soname."""
    keys = set(f.distributions)
    if f.check == "integrity" and f.facts.required and f.facts.consumer:
        with contextlib.suppress(ValueError):
            keys.add(canonicalize_name(Requirement(f.facts.required).name))
        keys.discard(f.facts.consumer)
    if f.check in _LOADS:
        keys.update(d.key for soname in _sonames(f) for d, _ in inv.shipping(soname))
    return {k for k in keys if inv.get(k) is not None}


def plan_repairs(
    findings: Iterable[Finding],
    inventory: Inventory,
    *,
    facts: LoadFacts | None = None,
    reqs: Requirements | None = None,
    machine: str = "this machine",
    place: Callable[[str], str | None] | None = None,
) -> tuple[RepairPlan, ...]:
    """One plan per installation prefix that has failing findings (none when nothing fails), covering every
    failing finding: the model's verified pip steps first, then each finding's own pip remedy where the model
    verifies it, then a manual step for every finding left (its structured remedies, or what to do by hand
    when it has none). Findings about no installed distribution (the driver, GPU code, a binary) go to a plan
    for ``machine``: what the run judges (the Stack's :attr:`~pytest_cudastack.stack.Stack.environment`:
    "this machine", or the image). ``place``, for an image: its path of a host path under its root; each
    environment is then named as the image's (``/usr/local in the image REF``) and its pip steps become steps of
    the image's build (:func:`_in_image`), never commands run here. ``facts``: the extension modules' closures
    (:func:`load_facts`) for the model's closure check (without them: the conservative
    :func:`_fallback_facts`); ``reqs``: the run's requirement facts (computed when not given)."""
    failing = [f for f in findings if f.failing]
    if not failing:
        return ()
    reqs = reqs if reqs is not None else requirement_facts(inventory)
    required = active_requirements(inventory, reqs)
    envs: dict[str, list[Distribution]] = {}
    for d in inventory.distributions:
        envs.setdefault(_environment(d), []).append(d)
    by_env: dict[str, list[Finding]] = {}
    orphan: list[Finding] = []
    for f in failing:
        env = _env_of(f, inventory)
        if env is None:
            orphan.append(f)
        else:
            by_env.setdefault(env, []).append(f)
    plans = []
    for env, fs in by_env.items():
        modelled = [f for f in fs if f.check in _MODELLED]
        plan = _plan(env, envs[env], modelled, inventory, facts, required) if modelled else RepairPlan(env, (), ())
        plans.append(_where_pip_may_not(_covered(plan, fs, inventory, facts, reqs), envs[env], fs))
    if place is not None:
        plans = [_in_image(p, by_env[p.environment], machine, place) for p in plans]
    if orphan:
        plans.append(_covered(RepairPlan(machine, (), ()), orphan, inventory, facts, reqs))
    return tuple(plans)


def _in_image(
    plan: RepairPlan, findings: Sequence[Finding], image: str, place: Callable[[str], str | None]
) -> RepairPlan:
    """``plan`` for an environment of an image: named by its path in the image, each pip step (automatic or
    a pip remedy by hand) a manual step of the image's build in the image's own interpreter (a ``RUN`` line:
    the image's Python is not run here, and what a container changes is lost when it stops); the findings
    they served are then unresolved."""
    steps: list[PlanStep] = []
    for step in plan.steps:
        pip = step.action
        if not isinstance(pip, Pip):
            steps.append(step)
            continue
        inside = replace(pip, python=place(pip.python) or pip.python)
        why = f"{pip.why}; in the image's build, after the step that installs what it changes".lstrip("; ")
        steps.append(PlanStep("manual", Manual((f"RUN {inside.render()}",), why=why), step.resolves, why))
    fixed = {i for s in steps if s.kind == "automatic" for i in s.resolves}
    return replace(
        plan,
        environment=f"{place(plan.environment) or plan.environment} in {image}",
        steps=tuple(steps),
        fixes=tuple(i for i in plan.fixes if i in fixed),
        unresolved=tuple(f.id for f in findings if f.id not in fixed),
    )


def _env_of(f: Finding, inv: Inventory) -> str | None:
    """The environment a finding's plan is for: that of the distributions it is about, else of the owners of
    the objects it names (a module missing a soname no wheel ships), else of its consumer; None: none."""
    for name in (*sorted(_named(f, inv)), f.facts.consumer or ""):
        dist = inv.get(name) if name else None
        if dist is not None:
            return _environment(dist)
    owners = (d for path in f.facts.objects for d in inv.owners(path))
    return next((_environment(d) for d in owners), None)


def _where_pip_may_not(plan: RepairPlan, dists: Sequence[Distribution], findings: Sequence[Finding]) -> RepairPlan:
    """``plan`` with each automatic pip step that pip must not run in this environment (PEP 668's
    externally managed one, an OS package's files: :func:`~pytest_cudastack.model.system.by_hand_instead`)
    made the step by hand that replaces it, beside the manual remedies of the findings it served; those
    findings are then unresolved."""
    marker = externally_managed_env(dists)
    automatic: list[PlanStep] = []
    manual: dict[Remedy, list[str]] = {}
    for step in plan.steps:
        instead = by_hand_instead(step.action, dists, marker) if isinstance(step.action, Pip) else None
        if step.kind == "automatic" and instead is None:
            automatic.append(step)
            continue
        served = [f for f in findings if f.id in step.resolves] if instead is not None else []
        own = [r for f in served for r in f.remedies if isinstance(r, Manual)]
        if instead is None or all(r.render() != instead.render() for r in own):
            manual.setdefault(instead or step.action, []).extend(step.resolves)
        for r in own:
            manual.setdefault(r, []).extend(f.id for f in served if r in f.remedies)
    if len(automatic) == len(plan.automatic):
        return plan
    fixed = {i for s in automatic for i in s.resolves}
    steps = [*automatic, *(PlanStep("manual", a, tuple(dict.fromkeys(ids)), a.why) for a, ids in manual.items())]
    left = tuple(f.id for f in findings if f.id not in fixed)
    return replace(plan, steps=tuple(steps), fixes=tuple(i for i in plan.fixes if i in fixed), unresolved=left)


def _covered(
    plan: RepairPlan, findings: Sequence[Finding], inv: Inventory, facts: LoadFacts | None, reqs: Requirements
) -> RepairPlan:
    """``plan`` with a step for every finding its automatic steps do not repair: the finding's own pip remedy
    when the model verifies it (with the plan's steps before it: no error about the finding left, none
    created), else manual steps from its other remedies, else "no safe automatic repair is known" with the
    model's reason. Equal actions are one step resolving each finding they serve."""
    cover = _Cover({s.action: list(s.resolves) for s in plan.automatic}, {}, list(plan.fixes))
    cover.prior = _actions(r for r in plan.remedies if isinstance(r, Pip))
    done = set(plan.fixes)
    # the widest pip remedies first: a finding whose own commands the steps already run (a closure finding's
    # install of the wheel its requirer pins, after the requirements finding's install of every pin) adds none
    for f in sorted(findings, key=lambda f: -len(_actions(f.pip))):
        if f.id not in done and not cover.automatically(f, inv, facts, reqs):
            by_hand = [r for r in f.remedies if not isinstance(r, Pip)]
            for step in by_hand or [_no_safe_repair(f, plan.refused, inv, facts, reqs)]:
                cover.manual.setdefault(step, []).append(f.id)
    steps = [PlanStep("automatic", a, tuple(ids), a.why) for a, ids in cover.automatic.items()]
    steps += [PlanStep("manual", a, tuple(ids), a.why) for a, ids in cover.manual.items()]
    left = set(cover.fixed)
    unresolved = tuple(f.id for f in findings if f.id not in left)
    chose = (*plan.chose, *_alternatives(findings, left))
    fixes = tuple(dict.fromkeys(cover.fixed))
    return replace(plan, steps=tuple(steps), fixes=fixes, unresolved=unresolved, chose=chose)


@dataclass
class _Cover:
    """The steps a plan is growing: automatic actions and manual remedies -> the finding ids each resolves,
    the ids repaired automatically, and the pip actions taken so far (what each next claim is verified with)."""

    automatic: dict[Remedy, list[str]]
    manual: dict[Remedy, list[str]]
    fixed: list[str]
    prior: list[_Action] = field(default_factory=list)

    def automatically(self, f: Finding, inv: Inventory, facts: LoadFacts | None, reqs: Requirements) -> bool:
        """Claim ``f`` for pip steps the model verifies, adding its own when they are needed; False: none."""
        own = f.pip if all(_exact(p) for p in f.pip) else ()  # the model holds one version per install
        wanted = _actions(own)
        prior = self.prior
        if own and set(wanted) <= set(prior) and not predict(prior, inv, facts=facts, findings=[f], reqs=reqs):
            self._resolve(f, lambda step: bool(set(_actions([step])) & set(wanted)))
        elif own and not predict([*prior, *wanted], inv, facts=facts, findings=[f], reqs=reqs):
            for r in own:
                self.automatic.setdefault(r, []).append(f.id)
            self.prior = [*prior, *wanted]
            self.fixed.append(f.id)
        elif not own and prior and f.check in _AFTER and _AFTER[f.check](f, prior, inv, facts, reqs):
            self._resolve(f, lambda step: step.verb == "install")
        else:
            return False
        return True

    def _resolve(self, f: Finding, serves: Callable[[Pip], bool]) -> None:
        """``f`` is repaired by the automatic steps already taken that ``serves`` picks."""
        for step, ids in self.automatic.items():
            if isinstance(step, Pip) and serves(step):
                ids.append(f.id)
        self.fixed.append(f.id)


def _rebinds(f: Finding, prior: Sequence[_Action], inv: Inventory, facts: LoadFacts | None, reqs: Requirements) -> bool:
    """Whether the plan's pip steps repair a symbols finding: they write other bytes (the pinned release, the
    owner's own build) at the library that was to define its symbols, and leave no error about it."""
    provider = {os.path.normpath(o) for o in f.facts.objects[1:]}
    return bool(provider & rewritten(prior, inv, reqs)) and not predict(
        prior, inv, facts=facts, findings=[f], reqs=reqs
    )


def _reloads(f: Finding, prior: Sequence[_Action], inv: Inventory, facts: LoadFacts | None, reqs: Requirements) -> bool:
    """Whether the plan's pip steps repair a dlopen finding: after them its caller's search finds the library
    (:meth:`_Model.loads_again`) and the model leaves no error about it."""
    _before, after = _apply(prior, inv, active_requirements(inv, reqs))
    return after.loads_again(f) and not predict(prior, inv, facts=facts, findings=[f], reqs=reqs)


# the findings the steps already taken repair, not their own commands: what each check's claim asks of them
_AFTER: Mapping[str, Callable[[Finding, Sequence[_Action], Inventory, LoadFacts | None, Requirements], bool]] = (
    MappingProxyType({"symbols": _rebinds, "dlopen": _reloads})
)


def _alternatives(findings: Sequence[Finding], fixed: set[str]) -> list[str]:
    """What the plan chose over what: for a finding its pip steps repair, the other remedies it has (a newer
    driver, a rebuild, a search-path change): the pip steps change only this environment."""
    out = []
    for f in findings:
        others = [r.render() for r in f.remedies if f.id in fixed and not isinstance(r, (Pip, UseBuild, Manual))]
        if others:
            out.append(f"the pip steps (they change only this environment) over: {'; or '.join(others)} ({f.id})")
    return out


def _plan(
    env: str,
    dists: Sequence[Distribution],
    findings: Sequence[Finding],
    inv: Inventory,
    facts: LoadFacts | None,
    required: dict[str, list[Requirer]],
) -> RepairPlan:
    """The model's own plan for the modelled findings of one environment (module docstring: strays out,
    what stays written again, torch from the right index), each claim verified against the model."""
    by_key = {d.key: d for d in dists}
    named = {id(f): _named(f, inv) for f in findings}
    touched = set().union(*named.values()) if named else set()

    def needed_by(key: str, gone: set[str]) -> list[Requirer]:
        return [r for r in required.get(key, ()) if r.dist.key != key and r.dist.key not in gone]

    rebuild = _torch_rebuild(findings, by_key, needed_by)
    drop = set(rebuild.drop)
    installs = _strays(findings, named, by_key, drop, needed_by, inv)
    before = _model(dists, required, inv)
    model = before.copy()
    reinstall = _writes(before, model, dists, drop, touched, installs, needed_by)
    acted = drop | {canonicalize_name(n) for n, _ in reinstall}
    bad, remaining = _verdict(before, model, acted, facts or _fallback_facts(findings, inv, before))
    changed = _rewritten(before, model)
    fixed, unresolved = _claims(findings, named, rebuild.fixes, acted, changed, bad, remaining, model)
    refused = tuple(e.text for e in sorted(bad, key=lambda e: (e.kind, e.subject)))
    steps = _steps(by_key, dists, drop, reinstall, rebuild.step, fixed) if fixed else []
    resolved = tuple(_key(f) for f in fixed) if steps else ()
    return RepairPlan(
        env,
        tuple(PlanStep("automatic", a, resolved, a.why) for a in steps),
        resolved,
        tuple(_key(f) for f in (unresolved if steps else findings)),
        rebuild.notes if rebuild.step is not None and steps else (),
        refused=refused if not steps else (),
    )


@dataclass(frozen=True)
class _Rebuild:
    """Step 3 of the plan: torch built for the wrong CUDA major goes with the wheels it pulled, and comes back
    from PyTorch's index for the bound."""

    drop: frozenset[str] = frozenset()
    step: Pip | None = None
    notes: tuple[str, ...] = ()
    fixes: tuple[Finding, ...] = ()


def _torch_rebuild(
    findings: Sequence[Finding], by_key: dict[str, Distribution], needed_by: Callable[[str, set[str]], list[Requirer]]
) -> _Rebuild:
    """The torch rebuild of a grouped cuda-max / cuda-min finding about torch (its bound in the facts), when
    PyTorch serves a build for the bound and nothing outside the group needs what goes."""
    out = _Rebuild()
    for f in findings:
        if f.check not in _BOUNDED or not f.distributions or f.distributions[0] != "torch":
            continue
        torch = by_key.get("torch")
        majors = [d.cuda_major for k in f.distributions if (d := by_key.get(k)) is not None and d.cuda_major]
        kind = _BOUNDED[f.check]
        try:
            index = index_for(kind, f.facts.bound, max(majors)) if torch and majors and f.facts.bound else None
        except ValueError:
            index = None
        group = {k for k in f.distributions if k in by_key}
        outside = [r for k in group for r in needed_by(k, group)]
        # a variant that stays would share its paths with the one the new build pulls: an overlap
        clash = [k for k in by_key if k not in group and variant_sibling(k) is not None]
        if torch is None or index is None or outside or clash:
            continue
        release = torch.version.split("+")[0]
        why = f"torch {release} built for CUDA {index.cuda[0]}.{index.cuda[1]}"
        step = Pip("install", (f"torch=={release}",), pip_python(torch), index_url=index.url, why=why)
        out = _Rebuild(
            out.drop | group,
            step,
            (*out.notes, f"{index.guess(release)} (source: {index.source})"),
            (*out.fixes, f),
        )
    return out


def _strays(
    findings: Sequence[Finding],
    named: dict[int, set[str]],
    by_key: dict[str, Distribution],
    drop: set[str],
    needed_by: Callable[[str, set[str]], list[Requirer]],
    inv: Inventory,
) -> dict[str, Distribution]:
    """Step 1: the strays (unrequired, while their CUDA variant or their overlap partner is required) join
    ``drop``; returns the absent pinned variants -> the installed sibling whose paths they take."""
    installs: dict[str, Distribution] = {}
    for f in findings:
        if f.check not in ("integrity", "closure"):
            continue
        keys = named[id(f)]
        for k in sorted(keys):
            d = by_key.get(k)
            if d is None or k in drop or needed_by(k, drop):
                continue
            sibling = variant_sibling(k)
            overlap = f.check == "integrity" and len(f.distributions) > 1
            partners = [p for p in keys if p != k and needed_by(p, drop)] if overlap else []
            if sibling is not None and needed_by(sibling, drop):
                drop.add(k)
                if inv.get(sibling) is None:
                    installs[sibling] = d
            elif partners:
                drop.add(k)
    return installs


def _writes(
    before: _Model,
    model: _Model,
    dists: Sequence[Distribution],
    drop: set[str],
    touched: set[str],
    installs: dict[str, Distribution],
    needed_by: Callable[[str, set[str]], list[Requirer]],
) -> list[tuple[str, str]]:
    """Steps 1 and 2 applied to ``model``: the strays uninstalled, then (name, version) of everything written
    again: what the findings name and the model does not find intact, what lost a file to the uninstall, and
    the absent pinned variants."""
    dropped_paths = {p for k in drop for p in model.libs.get(k, ())}
    for k in sorted(drop):
        model.uninstall(k)
    reinstall: list[tuple[str, str]] = []

    def put_back(d: Distribution) -> None:
        version = _version_for(d, needed_by(d.key, drop))
        reinstall.append((d.name, version))
        paths = before.libs.get(d.key, ())
        # another version than the one on disk: its RECORD rows are not known here
        rows = before.rows.get(d.key, {}) if version == d.version else _unknown_rows(paths)
        model.install(d.key, paths, rows, version=version)

    for d in dists:
        if d.key not in drop and d.key in touched and not model.intact(d.key):
            put_back(d)
    for d in dists:  # a kept distribution sharing a path with a dropped one lost that file to the uninstall
        if d.key not in drop and not model.intact(d.key) and dropped_paths.intersection(model.libs[d.key]):
            put_back(d)
    for name, sib in sorted(installs.items()):
        pins = [v for r in needed_by(name, drop) if (v := exact_pin(r)) is not None]
        if not pins:
            continue
        reinstall.append((name, pins[0]))
        sib_rows: dict[str, _Row] = {lib.path: (None, None) for lib in sib.libraries if lib.record is not None}
        model.install(name, tuple(sib_rows), sib_rows, name=name, version=pins[0], requires=())
    return reinstall


def _claims(
    findings: Sequence[Finding],
    named: dict[int, set[str]],
    rebuilt: Sequence[Finding],
    acted: set[str],
    changed: set[str],
    bad: set[_Err],
    remaining: set[_Err],
    after: _Model,
) -> tuple[list[Finding], list[Finding]]:
    """(findings the steps repair, those they do not): no error about a finding left in the model. A symbols
    finding is repaired when the steps put a distribution's own bytes back at the library that was to
    define its symbols (another build of that soname was there: a cu11 NCCL over torch's cu13 one); a dlopen
    finding when its caller's search, over the files ``after`` the steps, finds the library
    (:meth:`_Model.loads_again`)."""
    fixed: list[Finding] = []
    unresolved: list[Finding] = []
    for f in findings:
        if f in rebuilt:
            fixed.append(f)
            continue
        about = _about(f, named[id(f)])
        if f.check == "requirements":
            # a pin or framework rule is met once the model meets the pins it names (its distributions, the
            # absent ones included) and leaves no error about them; a shadowed copy (about a soname) depends on
            # the search path, which the model does not hold
            about |= set(f.distributions)
            ok = not f.facts.sonames and not bad and bool(acted & set(f.distributions))
        elif f.check == "symbols":
            ok = not bad and bool({os.path.normpath(o) for o in f.facts.objects[1:]} & changed)
        elif f.check == "dlopen":  # its run-time load re-resolved over the predicted files
            ok = not bad and bool(acted) and after.loads_again(f)
        else:
            ok = f.check in ("integrity", "closure") and not bad and bool(acted)
        ok = ok and not any(e.about & about for e in remaining)
        (fixed if ok else unresolved).append(f)
    return fixed, unresolved


def _steps(
    by_key: dict[str, Distribution],
    dists: Sequence[Distribution],
    drop: set[str],
    reinstall: Sequence[tuple[str, str]],
    torch: Pip | None,
    fixed: Sequence[Finding],
) -> list[Pip]:
    """The plan's pip commands, in the environment's interpreter: uninstall, write again, rebuild."""
    anchor = by_key.get("torch") or dists[0]
    python = pip_python(anchor)
    steps: list[Pip] = []
    if drop:
        names = tuple(sorted(by_key[k].name for k in drop))
        steps.append(
            Pip("uninstall", names, python, ("-y",), why="remove what nothing needs and what a rebuild replaces")
        )
    specs = tuple(f"{n}=={v}" for n, v in reinstall if canonicalize_name(n) not in drop)
    if specs:
        steps.append(Pip("install", specs, python, FORCE, why="write the RECORD-listed files of what stays again"))
    if torch is not None:
        steps.append(torch)
    return steps


def _about(f: Finding, keys: set[str]) -> frozenset[str]:
    """The keys and ``so:<soname>`` tokens whose errors in the model mean that ``f`` is not repaired."""
    about = set(keys)
    if f.check in _LOADS:
        about.update(f"so:{s}" for s in _sonames(f))
    return frozenset(about)


def _fallback_facts(findings: Sequence[Finding], inv: Inventory, model: _Model) -> LoadFacts:
    """Without resolved trees: a closure finding's soname is found at a path its search tried (the finding's
    ``facts.tried``, a single-soname finding's), else where a RECORD lists it only if that file was gone (a
    present one is not on the search path); every present library may be loaded by someone (an uninstall
    that deletes one without writing it again is not claimed as safe)."""
    missing: dict[str, tuple[str, ...]] = {}
    for f in findings:
        if f.check != "closure" or not f.failing:
            continue
        for soname in _sonames(f):
            claims = [p for _, p in inv.shipping(soname)]
            if f.facts.tried and len(_sonames(f)) == 1:
                missing[soname] = tuple(os.path.normpath(t) for t in f.facts.tried)
            else:
                missing[soname] = () if any(os.path.lexists(p) for p in claims) else tuple(claims)
    loaded = tuple((model.sonames.get(p, os.path.basename(p)), p) for p, k in model.on_disk.items() if k is not None)
    return LoadFacts(loaded, tuple(missing.items()))


def _verdict(before: _Model, after: _Model, acted: set[str], facts: LoadFacts) -> tuple[set[_Err], set[_Err]]:
    """(errors that make the steps unsafe, every error left after them). Unsafe: an error the steps create,
    or one left about what they act on (a distribution, its CUDA variant, a library whose bytes they change)."""
    old = before.errors(facts)
    new = after.errors(facts)
    affected = set(acted) | {s for k in acted if (s := variant_sibling(k)) is not None}
    for p in set(before.on_disk) | set(after.on_disk):
        if before.on_disk.get(p) != after.on_disk.get(p):
            affected.add(f"so:{before.sonames.get(p, os.path.basename(p))}")
            affected.update(k for k in (before.on_disk.get(p), after.on_disk.get(p)) if k is not None)
    bad = {e for e in new if e not in old or e.about & affected}
    return bad, new


# --------------------------------------------------------------------------------------------------------------
# each finding's own fix, verified


def verified_fixes(
    findings: Sequence[Finding],
    inventory: Inventory,
    *,
    facts: LoadFacts | None = None,
    keep: Sequence[Finding] = (),
    reqs: Requirements | None = None,
) -> tuple[Finding, ...]:
    """``findings`` with the remedies of each failing integrity / closure / requirements (pip) finding
    replaced by ones the model verifies (a requirements finding keeps its own pip remedy when the model finds
    no error after it): the automatic steps of the plan over all of them when it repairs that finding (one
    command for the item, as in the run's plan), else of the plan for the finding alone, else "no safe
    automatic repair is known" with the reason the model gives (what the finding's own suggestion would
    leave) and what to do by hand. ``keep``: findings whose remedies the caller verified otherwise (by
    resolution), left as they are."""
    kept = {id(f) for f in keep}
    failing = [f for f in findings if f.failing and _verifiable(f) and id(f) not in kept]
    if not failing:
        return tuple(findings)
    reqs = reqs if reqs is not None else requirement_facts(inventory)  # once for every plan below
    modelled = [f for f in failing if f.check in _MODELLED]
    plans = [
        _plan(e, ds, fs, inventory, facts, active_requirements(inventory, reqs))
        for e, ds, fs in _by_env(modelled, inventory)
    ]
    by_key = {k: p for p in plans if p.steps for k in p.fixes}
    chosen: dict[int, tuple[Remedy, ...]] = {}
    for f in failing:
        plan = by_key.get(_key(f))
        refused: tuple[str, ...] = ()
        if plan is None and f.check == "requirements":
            own = f.pip
            if not own or not predict(_actions(own), inventory, facts=facts, findings=[f], reqs=reqs):
                continue  # no fix of its own (a plan that claims it gives one), or one that leaves no error
        if plan is None:
            alone = [
                _plan(e, ds, fs, inventory, facts, active_requirements(inventory, reqs))
                for e, ds, fs in _by_env([f], inventory)
            ]
            plan = next((p for p in alone if p.steps and _key(f) in p.fixes), None)
            refused = tuple(r for p in alone for r in p.refused)
        chosen[id(f)] = plan.remedies if plan is not None else (_no_safe_repair(f, refused, inventory, facts, reqs),)
    return tuple(replace(f, remedies=chosen[id(f)]) if id(f) in chosen else f for f in findings)


def _by_env(findings: Sequence[Finding], inv: Inventory) -> list[tuple[str, list[Distribution], list[Finding]]]:
    """(environment, its distributions, its findings) for the findings about an installed distribution."""
    envs: dict[str, list[Distribution]] = {}
    for d in inv.distributions:
        envs.setdefault(_environment(d), []).append(d)
    out: dict[str, list[Finding]] = {}
    for f in findings:
        keys = _named(f, inv)
        env = next((_environment(dist) for k in sorted(keys) if (dist := inv.get(k)) is not None), None)
        if env is not None:
            out.setdefault(env, []).append(f)
    return [(env, envs[env], fs) for env, fs in out.items()]


NO_SAFE_REPAIR = "no safe automatic repair is known"


def _verifiable(f: Finding) -> bool:
    """Findings whose remedies the model checks: integrity's and closure's, and the requirements item's pip
    remedies or missing ones (a remedy on the search path, such as a shadowed copy's, is not a pip command: the
    model does not hold it)."""
    if f.check in ("integrity", "closure"):
        return True
    return f.check == "requirements" and (not f.remedies or bool(f.pip))


def _no_safe_repair(
    f: Finding, refused: Sequence[str], inv: Inventory, facts: LoadFacts | None, reqs: Requirements
) -> Manual:
    """The manual step for a finding no verified pip command repairs: the model's reason, and what to do."""
    own = f.pip
    reason = ""
    if own and not all(_exact(p) for p in own):
        # the model applies exact versions only; a range or wildcard is pip's pick from the index, so the
        # command itself is the step, by hand (predicting it as "not installed" would be untrue)
        shown = " && ".join(r.render() for r in own)
        why = f"{NO_SAFE_REPAIR}: the model checks pip commands of exact versions only (a range's pick is pip's)"
        return Manual((f"run {shown} (pip picks the release), then re-run cudastack check",), why=why)
    if own:
        left = predict(_actions(own), inv, facts=facts, findings=[f], reqs=reqs)
        if left:
            shown = " && ".join(r.render() for r in own)
            reason = f"the model predicts that {shown} would leave: {'; '.join(left[:2])}"
    if not reason and refused:
        reason = f"the model predicts that its candidate repair would leave: {'; '.join(refused[:2])}"
    if not reason:
        reason = "no pip command the model knows (uninstall, force-reinstall) repairs it"
    others = tuple(step for r in f.remedies if isinstance(r, Manual) for step in r.steps)
    steps = others or (
        "decide which of the distributions named above the software you run needs, uninstall the others, "
        "force-reinstall what stays with --no-deps at the versions its dependents pin, then re-run "
        "cudastack check",
    )
    return Manual(steps, why=f"{NO_SAFE_REPAIR}: {reason}")


_Action = tuple[str, str, str | None]  # ("uninstall" | "install", canonical name, version or None)


def _exact(pip: Pip) -> bool:
    """Whether the model can apply ``pip``: an uninstall, or an install of exact ``==`` versions only (which
    release a range or a wildcard gets is the index's choice, not the model's)."""
    return pip.verb == "uninstall" or all(a[2] is not None for a in _actions([pip]))


def _actions(pips: Iterable[Pip]) -> list[_Action]:
    """The model's actions for pip commands: each spec's canonical name and ``==`` version, in order."""
    out: list[_Action] = []
    for pip in pips:
        for spec in pip.specs:
            try:
                req = Requirement(spec)
            except ValueError:  # InvalidRequirement, or a version over the digit limit
                continue
            pins = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
            out.append((pip.verb, canonicalize_name(req.name), pins[0] if pins else None))
    return out


def predict(
    actions: Sequence[_Action],
    inventory: Inventory,
    *,
    facts: LoadFacts | None = None,
    findings: Sequence[Finding] = (),
    reqs: Requirements | None = None,
) -> list[str]:
    """What the model finds wrong after pip ``actions`` (in order, each ``(verb, name, version)``):
    the errors they create or leave about what they act on, plus those left about ``findings``; [] when
    none. An install of a version not on disk takes the installed version's paths (or, for an absent CUDA
    variant, its installed sibling's) with unknown RECORD rows."""
    before, after = _apply(actions, inventory, active_requirements(inventory, reqs))
    keys = {k for _, k, _ in actions}
    f_facts = facts or _fallback_facts(findings, inventory, before)
    bad, remaining = _verdict(before, after, keys, f_facts)
    about = frozenset().union(*(_about(f, _named(f, inventory)) for f in findings)) if findings else frozenset()
    left = bad | {e for e in remaining if e.about & about}
    return [e.text for e in sorted(left, key=lambda e: (e.kind, e.subject))]


def rewritten(actions: Sequence[_Action], inventory: Inventory, reqs: Requirements | None = None) -> set[str]:
    """The library paths whose bytes pip ``actions`` replace (:func:`_rewritten`)."""
    return _rewritten(*_apply(actions, inventory, active_requirements(inventory, reqs)))


def _apply(
    actions: Sequence[_Action], inventory: Inventory, required: dict[str, list[Requirer]]
) -> tuple[_Model, _Model]:
    """The model of the actions' environment before and after them."""
    keys = {k for _, k, _ in actions}
    env = next((_environment(d) for k in sorted(keys) if (d := inventory.get(k)) is not None), None)
    dists = [d for d in inventory.distributions if env is None or _environment(d) == env]
    before = _model(dists, required, inventory)
    after = before.copy()
    for verb, key, version in actions:
        if verb == "uninstall":
            after.uninstall(key)
            continue
        d = inventory.get(key)
        source = d if d is not None else inventory.get(variant_sibling(key) or "")
        if source is None:
            after.install(key, (), {}, name=key, version=version, requires=())
            ships = shipped_by(key)
            if ships is not None:
                after.added[key] = ships
            continue
        paths = before.libs.get(source.key, ())
        same = d is not None and (version is None or version == d.version)
        rows = before.rows.get(source.key, {}) if same else _unknown_rows(paths)
        stated = before.requires.get(key) if d is not None else ()
        after.install(
            key, paths, rows, name=source.name if d else key, version=version or source.version, requires=stated
        )
    return before, after


def _rewritten(before: _Model, after: _Model) -> set[str]:
    """Paths that hold other bytes after than before: another distribution's, or another release of the
    same (its RECORD rows differ, or are not known here)."""
    out = set()
    for path, key in after.on_disk.items():
        if key is None:
            continue
        same_holder = before.on_disk.get(path) == key
        same_row = after.rows.get(key, {}).get(path) == before.rows.get(key, {}).get(path)
        if not (same_holder and same_row and after.versions.get(key) == before.versions.get(key)):
            out.add(path)
    return out
