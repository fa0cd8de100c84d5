"""``cudastack report``: the installed wheels (inventory + integrity + closure, the ``Stack``'s items) on one
screen, findings first,
then each distribution's GPU code (the SASS and PTX its libraries carry, as the snapshot and ``tree`` list it).

The site directories are :func:`pytest_cudastack.cli.sites.site_dirs_from`'s.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from pytest_cudastack.checks.arch import dist_gpu_code
from pytest_cudastack.cli.colour import Painter, painter_for
from pytest_cudastack.cli.sites import site_dirs_from
from pytest_cudastack.cuda.gpucode import gpu_code_text
from pytest_cudastack.escape import printable
from pytest_cudastack.findings import Finding, Severity, most_severe_first
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.model.repair import RepairPlan, plan_repairs, plan_step, render_plans
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from pytest_cudastack.wheels.inventory import Inventory

__all__ = [
    "REPORT_SCHEMA",
    "REPORT_VERSION",
    "WheelReport",
    "cmd_report",
    "render_report",
    "wheel_findings",
    "wheel_report",
]

REPORT_SCHEMA = "pytest-cudastack/report"  # ``report --json``'s document: schemas/report.schema.json
REPORT_VERSION = 1

logger = logging.getLogger(__name__)


def wheel_findings(stack: Stack) -> tuple[Finding, ...]:
    """The stack's integrity and closure items' findings (inventory problems included; fixes verified by the
    repair model, as ``cudastack check`` prints them), errors first (stable within a severity)."""
    return most_severe_first((*stack.findings("integrity"), *stack.findings("closure")))


@dataclass(frozen=True)
class WheelReport:
    inventory: Inventory
    findings: tuple[Finding, ...]
    modules: int  # extension modules whose closure was resolved
    seconds: float
    gpu_code: Mapping[str, dict[str, list[str]]] = field(default_factory=dict)  # by distribution label
    plans: tuple[RepairPlan, ...] = ()  # the verified repair plan over ``findings``

    @property
    def failing(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.failing)

    def flavours(self) -> dict[str, list[str]]:
        """``"13"`` / ``"12"`` / ... -> ["name version", ...] of the CUDA wheels."""
        out: dict[str, list[str]] = {}
        for d in self.inventory.distributions:
            if d.cuda_major is not None:
                out.setdefault(str(d.cuda_major), []).append(d.label)
        return dict(sorted(out.items(), reverse=True))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "version": REPORT_VERSION,
            "site_dirs": list(self.inventory.site_dirs),
            "ok": not self.failing,
            "findings": [f.to_json() for f in self.findings],
            "cuda_wheels": self.flavours(),
            "distributions": [
                {
                    "name": d.name,
                    "version": d.version,
                    "location": d.location,
                    "cuda_major": d.cuda_major,
                    "cuda_evidence": d.cuda_evidence,
                    "libraries": len(d.libraries),
                    "extension_modules": sum(1 for lib in d.libraries if lib.pyinit),
                    "gpu_code": self.gpu_code.get(d.label, {"sass": [], "ptx": []}),
                }
                for d in self.inventory.distributions
            ],
            "extension_modules": self.modules,
            "seconds": round(self.seconds, 3),
        }


def wheel_report(paths: Sequence[str] | None = None, cache: ElfCache | None = None) -> WheelReport:
    """Inventory + integrity + closure of ``paths`` (default: this interpreter's site directories), read from
    one :class:`~pytest_cudastack.stack.Stack`, the composition root ``check``, ``snapshot`` and the plugin use:
    the same facts, computed once, and the same verified fixes and plan.

    ``cache``: the run's ELF cache, flushed by its owner; default: one for this environment, flushed here.
    """
    t0 = time.perf_counter()
    stack = Stack(Settings(), cache=cache, site_paths=tuple(paths) if paths is not None else None)
    try:
        findings = wheel_findings(stack)
        inv = stack.inventory
        gpu = {d.label: dist_gpu_code(d, stack.fatbin) for d in inv.distributions}
        place = stack.image.image_path if stack.image is not None else None
        plans = plan_repairs(findings, inv, reqs=stack.requirements, machine=stack.environment, place=place)
        modules = len(stack.module_trees)
    finally:
        if cache is None:
            stack.flush_cache()
    return WheelReport(inv, findings, modules, time.perf_counter() - t0, gpu, plans)


def render_report(rep: WheelReport, *, verbose: bool = False, paint: Painter | None = None) -> str:
    """The repair plan first (each command once), then the findings (errors and warnings in full, each
    pointing at its plan step; INFO one line each), then CUDA wheels by flavour; ``paint`` colours the
    severity labels."""
    paint = paint or Painter(False)
    lines: list[str] = []
    errors = [f for f in rep.findings if f.severity is Severity.ERROR]
    warnings = [f for f in rep.findings if f.severity is Severity.WARNING]
    infos = [f for f in rep.findings if f.severity is Severity.INFO]
    plan = render_plans(rep.plans, rep.findings)
    if plan:  # the plan first: the cause and the commands on the first screen, each command once
        lines.extend([plan, ""])
    for title, group in (("ERROR", errors), ("WARNING", warnings)):
        for f in group:
            step = plan_step(rep.plans, f) if f.failing else None
            lines.append(f"{paint.severity(title, title)} [{f.check}] " + f.render(compact=not verbose, plan_step=step))
            lines.append("")
    for f in infos:
        lines.append(printable(f"info [{f.check}] {f.subject}: {f.message}"))
        if verbose:
            lines.extend("  " + printable(d) for d in f.details)
    if infos:
        lines.append("")
    dists = rep.inventory.distributions
    first_plain = len(lines)
    lines.append(
        f"wheels: {len(dists)} distributions in {', '.join(rep.inventory.site_dirs) or '(no site directory)'}; "
        f"{rep.modules} extension modules resolved in {rep.seconds:.2f}s"
    )
    flavours = rep.flavours()
    if flavours:
        for major, labels in flavours.items():
            shown = ", ".join(labels if verbose else labels[:8])
            more = "" if verbose or len(labels) <= 8 else f" and {len(labels) - 8} more"
            lines.append(f"  CUDA {major}: {len(labels)} wheel(s): {shown}{more}")
        if len(flavours) > 1:
            lines.append(f"  note: wheels for {len(flavours)} CUDA majors are installed together")
    else:
        lines.append("  no CUDA wheels")
    coded = [(label, text) for label, code in rep.gpu_code.items() if (text := gpu_code_text(code))]
    if coded:
        lines.append(f"GPU code: {len(coded)} distribution(s) carry device code")
        lines.extend(f"  {label}: {text}" for label, text in coded)
    status = f"{len(errors)} error(s), {len(warnings)} warning(s), {len(infos)} info" if rep.findings else "no findings"
    lines.append(f"wheels: {status}")
    head, tail = lines[:first_plain], lines[first_plain:]  # distribution labels and paths below: from files
    return "\n".join([*head, *(printable(line) for line in tail)])


def _emit(text: str, out: TextIO | None) -> None:
    (out or sys.stdout).write(text if text.endswith("\n") else text + "\n")


def cmd_report(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``cudastack report``: the wheels on one screen, findings first. Exit 0 clean, 1 on failing findings."""
    rep = wheel_report(site_dirs_from(args))
    if getattr(args, "json", False):
        _emit(json.dumps(rep.to_json(), indent=2), out)
    else:
        paint = painter_for(getattr(args, "color", None), out or sys.stdout)
        _emit(render_report(rep, verbose=bool(getattr(args, "verbose", False)), paint=paint), out)
    return 1 if rep.failing else 0
