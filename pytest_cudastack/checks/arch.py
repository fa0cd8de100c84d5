"""Arch coverage: does every file's GPU code run on the GPUs we deploy on?"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pytest_cudastack.cuda.versions import parse_arch
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.linker.fatbin import Fatbin, read_fatbin, runs_on

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.driver import DriverInfo

__all__ = ["arch_coverage", "arch_findings", "nothing_to_check", "run"]


def _describe(fat: Fatbin) -> str:
    parts = []
    if fat.sass:
        parts.append("SASS " + ", ".join(fat.sass))
    if fat.ptx:
        parts.append("PTX " + ", ".join(fat.ptx))
    return " and ".join(parts)


def arch_findings(paths: Iterable[str], archs: Sequence[str], source: str = "declared") -> tuple[Finding, ...]:
    """For each file with GPU code, one finding per target arch that none of its entries runs on.

    SASS that runs directly is fine; PTX alone is a warning (JIT-compiled at first launch, slow and only
    with a driver that knows that PTX ISA); nothing at all is an error ("no kernel image is available").
    Files without GPU code say nothing about archs and give no finding.  A malformed arch raises OptionError.
    """
    targets = [(arch, parse_arch(arch).number) for arch in archs]
    findings: list[Finding] = []
    for path in paths:
        try:
            fat = read_fatbin(path)
        except ElfError as e:
            findings.append(Finding("arch", Severity.WARNING, path, f"cannot read GPU code: {e}"))
            continue
        findings.extend(
            Finding("arch", Severity.WARNING, path, f"malformed fatbin: {problem}") for problem in fat.problems
        )
        if not fat.entries:
            continue
        for name, cc in targets:
            sass = [e for e in fat.entries if e.kind == "sass" and runs_on(e, cc)]
            if sass:
                continue
            ptx = [e for e in fat.entries if e.kind == "ptx" and runs_on(e, cc)]
            carries = _describe(fat)
            if ptx:
                findings.append(
                    Finding(
                        "arch",
                        Severity.WARNING,
                        path,
                        f"no SASS for {name} ({source}); only PTX {ptx[0].name} can be JIT-compiled for it",
                        cause=f"the file carries {carries}",
                        fix=f"rebuild with -gencode arch=compute_{cc},code=sm_{cc} to avoid JIT at first launch",
                    )
                )
                continue
            findings.append(
                Finding(
                    "arch",
                    Severity.ERROR,
                    path,
                    f"no GPU code runs on {name} ({source}): kernels will fail with "
                    "'no kernel image is available for execution on the device'",
                    cause=f"the file carries {carries}; none of it runs on compute capability {cc // 10}.{cc % 10}",
                    fix=f"rebuild with -gencode arch=compute_{cc},code=sm_{cc} (or add PTX for an older arch)",
                )
            )
    return tuple(findings)


def arch_coverage(paths: Sequence[str], driver: DriverInfo) -> tuple[Finding, ...]:
    """GPU code of ``paths`` against the probed or declared archs (``arch_findings``)."""
    if not paths:
        return ()
    if not driver.archs:
        why = driver.reason or "no GPU found"
        return (
            Finding(
                "arch",
                Severity.INFO,
                "archs",
                f"no target GPU architecture known ({why}); pass --cuda-arch=sm_XX to check coverage",
            ),
        )
    return arch_findings(paths, driver.archs, driver.arch_source or driver.source)


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``arch`` item: the scanned files that exist against the driver's archs, named as in the scan."""
    names = {path: name for name, path in stack.scan_targets if os.path.isfile(path)}
    found = arch_coverage(tuple(names), stack.driver)
    return tuple(replace(f, subject=names.get(f.subject, f.subject)) for f in found)


def nothing_to_check(stack: StackView, target: Target | None = None) -> str | None:
    """Why the ``arch`` item is skipped: no target arch (none probed, no --cuda-arch), or no scanned file."""
    if not stack.driver.archs:
        return "no GPU arch known: pass --cuda-arch=sm_XX"
    if not any(os.path.isfile(path) for _, path in stack.scan_targets):
        return "no scanned file to check: pass --cudastack-scan=PATH"
    return None
