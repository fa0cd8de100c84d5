"""One repair plan per environment: the pip commands that repair what the findings report, in the venv's own
interpreter, each claim checked against a model of the files after the commands.

The model follows pip's own behaviour (pip ``uninstall`` deletes every file its RECORD lists, whoever wrote
it; ``install --force-reinstall --no-deps X==V`` writes X's files again, replacing whatever is there), applied
to the RECORD-listed shared libraries of the inventory: for each path, whose bytes it holds (or none). A
distribution not installed (torch pins ``nvidia-cudnn-cu13`` after it was uninstalled) is modelled with the
paths of its installed CUDA variant (``integrity.variant_sibling``: the -cu12 and -cu13 wheels of cuDNN, NCCL,
cuSPARSELt and NVSHMEM install the same paths), and only then.

The plan, for the distributions of one installation prefix:

1. ``pip uninstall -y`` the strays: a distribution in a failing finding that nothing installed requires,
   whose CUDA variant (or the other distribution of an overlap) something does require;
2. ``pip install --force-reinstall --no-deps`` every distribution (at its pinned, else installed, version)
   that a failing finding names and whose files the model does not find intact after step 1, and every
   pinned variant that is not installed;
3. for a grouped ``cuda-max`` / ``cuda-min`` finding about torch (``bounds.group_by_requirer``): uninstall
   torch and the wheels it pulled, then install torch from PyTorch's index for the bound.

A finding is claimed as fixed only when the model after the plan has no error for it: every file of the
distributions it names is present with their own bytes, no two installed distributions list one path with
different bytes (the overlap ``integrity`` flags), and nothing removed is required by what stays. What the plan
cannot model (binaries, the driver, GPU code) stays in ``unresolved``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from pytest_cudastack.checks.torchindex import index_for
from pytest_cudastack.findings import Finding
from pytest_cudastack.wheels.integrity import Requirer, active_requirements, exact_pin, pip_command, variant_sibling
from pytest_cudastack.wheels.inventory import Distribution, Inventory
from pytest_cudastack.wheels.sitepaths import install_prefix

__all__ = ["RepairPlan", "RepairStep", "plan_repairs", "render_plans"]

_BOUND = re.compile(r"--cuda-(?:max|min)=([0-9][0-9.]*)")  # the bound a cuda-max/min message names
_MODELLED = ("integrity", "closure", "cuda-max", "cuda-min")


@dataclass(frozen=True)
class RepairStep:
    """One command (``argv``) and why it is in the plan."""

    argv: tuple[str, ...]
    why: str

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class RepairPlan:
    """The steps for one environment (``environment``: its installation prefix), in order; ``fixes``: the
    findings (``check: subject``) the model says they repair; ``unresolved``: the failing findings they do
    not; ``notes``: what the model takes on trust (an index that is a guess)."""

    environment: str
    steps: tuple[RepairStep, ...]
    fixes: tuple[str, ...]
    unresolved: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def command(self) -> str:
        """The whole plan as one shell command line."""
        return " && ".join(step.command for step in self.steps)

    def render(self) -> str:
        lines = [f"repair plan for {self.environment} (fixes {len(self.fixes)} finding(s)):"]
        lines.extend(f"  {step.command}" for step in self.steps)
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.unresolved:
            lines.append(f"  not repaired by it: {', '.join(self.unresolved)}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "steps": [{"argv": list(s.argv), "command": s.command, "why": s.why} for s in self.steps],
            "command": self.command,
            "fixes": list(self.fixes),
            "unresolved": list(self.unresolved),
            "notes": list(self.notes),
        }


def render_plans(plans: Sequence[RepairPlan]) -> str:
    """The plans with steps, one block each; "" when there is nothing to run."""
    return "\n".join(p.render() for p in plans if p.steps)


def _sonames(f: Finding) -> list[str]:
    """The sonames a closure finding is about (a grouped one lists several, ``", "``-separated)."""
    return f.subject.split(", ")


def _key(f: Finding) -> str:
    return f"{f.check}: {f.subject}"


@dataclass
class _Model:
    """Installed distributions (key -> RECORD-listed library paths) and whose bytes each path holds."""

    libs: dict[str, tuple[str, ...]]
    rows: dict[str, dict[str, tuple[str | None, int | None]]]  # key -> path -> (hash, size) of its RECORD row
    on_disk: dict[str, str | None]  # path -> key whose bytes are there, None: missing or nobody's

    def uninstall(self, key: str) -> None:
        for path in self.libs.pop(key, ()):
            self.on_disk[path] = None
        self.rows.pop(key, None)

    def install(self, key: str, paths: tuple[str, ...], rows: dict[str, tuple[str | None, int | None]]) -> None:
        self.libs[key] = paths
        self.rows[key] = rows
        for path in paths:
            self.on_disk[path] = key

    def intact(self, key: str) -> bool:
        return key in self.libs and all(self.on_disk.get(p) == key for p in self.libs[key])

    def overlapping(self) -> set[str]:
        """Installed keys that list a path another installed key lists with another RECORD row."""
        by_path: dict[str, list[str]] = {}
        for key, paths in self.libs.items():
            for p in paths:
                by_path.setdefault(p, []).append(key)
        out: set[str] = set()
        for p, keys in by_path.items():
            if len(keys) > 1 and len({self.rows[k][p] for k in keys}) > 1:
                out.update(keys)
        return out


def _model(dists: Sequence[Distribution]) -> _Model:
    libs: dict[str, tuple[str, ...]] = {}
    rows: dict[str, dict[str, tuple[str | None, int | None]]] = {}
    owners: dict[str, list[Distribution]] = {}
    for d in dists:
        listed = tuple(lib.path for lib in d.libraries if lib.record is not None)
        libs[d.key] = listed
        rows[d.key] = {lib.path: (lib.record.hash, lib.record.size) for lib in d.libraries if lib.record is not None}
        for p in listed:
            owners.setdefault(p, []).append(d)
    on_disk: dict[str, str | None] = {}
    for p, ds in owners.items():
        size = _size(p)
        # bytes attributed by RECORD size, as integrity does when sizes decide; an owner listing no size loses
        match = [d for d in ds if size is not None and rows[d.key][p][1] == size]
        on_disk[p] = match[-1].key if match else None
    return _Model(libs, rows, on_disk)


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


def _named(f: Finding, inv: Inventory) -> set[str]:
    """Keys of the installed distributions a finding is about: its ``distributions``, the requirement of a
    broken pin (``torch -> nvidia-cudnn-cu13==9.24.0.43``), the claimers of a missing soname."""
    keys = set(f.distributions)
    if f.check == "integrity" and " -> " in f.subject:
        with contextlib.suppress(InvalidRequirement):
            keys.add(canonicalize_name(Requirement(f.subject.partition(" -> ")[2]).name))
        keys.discard(f.distributions[0] if f.distributions else "")
    if f.check == "closure":
        keys.update(d.key for soname in _sonames(f) for d, _ in inv.shipping(soname))
    return {k for k in keys if inv.get(k) is not None}


def plan_repairs(findings: Iterable[Finding], inventory: Inventory) -> tuple[RepairPlan, ...]:
    """One plan per installation prefix that has failing findings (none when nothing fails)."""
    failing = [f for f in findings if f.failing]
    if not failing:
        return ()
    envs: dict[str, list[Distribution]] = {}
    for d in inventory.distributions:
        envs.setdefault(_environment(d), []).append(d)
    by_env: dict[str, list[Finding]] = {}
    orphan: list[Finding] = []
    for f in failing:
        keys = _named(f, inventory)
        env = next((_environment(dist) for k in sorted(keys) if (dist := inventory.get(k)) is not None), None)
        if env is None or f.check not in _MODELLED:
            orphan.append(f)
        else:
            by_env.setdefault(env, []).append(f)
    plans = [_plan(env, envs[env], fs, inventory) for env, fs in by_env.items()]
    if orphan:
        if plans:
            first = plans[0]
            plans[0] = RepairPlan(
                first.environment,
                first.steps,
                first.fixes,
                first.unresolved + tuple(_key(f) for f in orphan),
                first.notes,
            )
        else:
            plans.append(RepairPlan("this machine", (), (), tuple(_key(f) for f in orphan)))
    return tuple(plans)


def _plan(env: str, dists: Sequence[Distribution], findings: Sequence[Finding], inv: Inventory) -> RepairPlan:
    required = active_requirements(inv)
    by_key = {d.key: d for d in dists}
    named = {id(f): _named(f, inv) for f in findings}
    touched = set().union(*named.values()) if named else set()

    def needed_by(key: str, gone: set[str]) -> list[Requirer]:
        return [r for r in required.get(key, ()) if r.dist.key != key and r.dist.key not in gone]

    # 3. a torch built for the wrong CUDA major: the whole group goes, torch comes back from the right index
    drop: set[str] = set()
    torch_step: RepairStep | None = None
    notes: list[str] = []
    torch_fixes: list[Finding] = []
    for f in findings:
        if f.check in ("cuda-max", "cuda-min") and f.distributions and f.distributions[0] == "torch":
            torch = by_key.get("torch")
            majors = [d.cuda_major for k in f.distributions if (d := by_key.get(k)) is not None and d.cuda_major]
            kind = f.check.rpartition("-")[2]
            bound = _BOUND.search(f.message)
            try:
                index = index_for(kind, bound.group(1), max(majors)) if torch and majors and bound else None
            except ValueError:
                index = None
            group = {k for k in f.distributions if k in by_key}
            outside = [r for k in group for r in needed_by(k, group)]
            # a variant that stays would share its paths with the one the new build pulls: an overlap
            clash = [k for k in by_key if k not in group and variant_sibling(k) is not None]
            if torch is None or index is None or outside or clash:
                continue
            drop |= group
            release = torch.version.split("+")[0]
            torch_step = RepairStep(
                (*_pip(torch), "install", f"torch=={release}", "--index-url", index.url),
                f"torch {release} built for CUDA {index.cuda[0]}.{index.cuda[1]}",
            )
            notes.append(f"{index.guess(release)} (source: {index.source})")
            torch_fixes.append(f)

    # 1. strays: unrequired, while their variant or their overlap partner is required
    installs: dict[str, Distribution] = {}  # absent pinned variant -> the installed sibling whose paths it takes
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

    model = _model(dists)
    dropped_paths = {p for k in drop for p in model.libs.get(k, ())}
    for k in sorted(drop):
        model.uninstall(k)

    # 2. reinstall what the findings name and the model does not find intact, plus the absent pinned variants
    reinstall: list[tuple[str, str]] = []  # (name, version)
    for d in dists:
        if d.key in drop or d.key not in touched:
            continue
        if not model.intact(d.key):
            reinstall.append((d.name, _version_for(d, needed_by(d.key, drop))))
            model.install(d.key, model.libs.get(d.key, ()), model.rows.get(d.key, {}))
    for d in dists:  # a kept distribution sharing a path with a dropped one lost that file to the uninstall
        if d.key not in drop and not model.intact(d.key) and dropped_paths.intersection(model.libs[d.key]):
            reinstall.append((d.name, _version_for(d, needed_by(d.key, drop))))
            model.install(d.key, model.libs[d.key], model.rows[d.key])
    for name, sib in sorted(installs.items()):
        pins = [v for r in needed_by(name, drop) if (v := exact_pin(r)) is not None]
        if not pins:
            continue
        reinstall.append((name, pins[0]))
        sib_rows: dict[str, tuple[str | None, int | None]] = {
            lib.path: (None, None) for lib in sib.libraries if lib.record is not None
        }
        model.install(name, tuple(sib_rows), sib_rows)

    # verify every claim against the model
    overlapping = model.overlapping()
    fixed: list[Finding] = []
    unresolved: list[Finding] = []
    for f in findings:
        if f in torch_fixes:
            fixed.append(f)
            continue
        ok = f.check in ("integrity", "closure") and _repaired(f, named[id(f)], model, drop, inv)
        ok = ok and not (named[id(f)] & overlapping) and not any(needed_by(k, drop) for k in drop & named[id(f)])
        (fixed if ok else unresolved).append(f)

    steps: list[RepairStep] = []
    if fixed:
        anchor = by_key.get("torch") or dists[0]
        if drop:
            steps.append(
                RepairStep(
                    (*_pip(anchor), "uninstall", "-y", *sorted(by_key[k].name for k in drop)),
                    "remove what nothing needs and what a rebuild replaces",
                )
            )
        if reinstall:
            specs = [f"{n}=={v}" for n, v in reinstall if canonicalize_name(n) not in drop]
            if specs:
                steps.append(
                    RepairStep(
                        (*_pip(anchor), "install", "--force-reinstall", "--no-deps", *specs),
                        "write the RECORD-listed files of what stays again",
                    )
                )
        if torch_step is not None:
            steps.append(torch_step)
    return RepairPlan(
        env,
        tuple(steps),
        tuple(_key(f) for f in fixed) if steps else (),
        tuple(_key(f) for f in (unresolved if steps else findings)),
        tuple(notes) if torch_step is not None and steps else (),
    )


def _repaired(f: Finding, keys: set[str], model: _Model, gone: set[str], inv: Inventory) -> bool:
    if f.check == "closure":
        for soname in _sonames(f):
            claims = inv.shipping(soname)
            if not claims or any(os.path.lexists(p) for _, p in claims):
                return False  # not a gone file: the search path, not the files, is what is wrong
            if not any(model.on_disk.get(p) in model.libs for _, p in claims):
                return False
        return True
    if not keys:
        return False
    return all(model.intact(k) if k in model.libs else k in gone for k in keys)


def _pip(d: Distribution) -> tuple[str, ...]:
    return tuple(shlex.split(pip_command(d)))
