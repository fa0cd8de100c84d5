"""The driver check: does the NVIDIA driver run the CUDA every component of the stack requires?"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pytest_cudastack.cuda.verdicts import driver_verdict
from pytest_cudastack.findings import Finding, Severity, manual
from pytest_cudastack.model.needs import CudaNeed, Inference

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.driver import DriverInfo

__all__ = ["driver_findings", "nothing_to_check", "run"]


def driver_findings(inferences: Iterable[Inference], driver: DriverInfo) -> tuple[Finding, ...]:
    """Each distinct CUDA requirement of the stack against the driver (``verdicts.driver_verdict``).

    compatible: nothing; minor-version compatibility: WARNING; incompatible: ERROR; unknown: INFO.
    """
    groups: dict[str, list[CudaNeed]] = {}
    for inf in inferences:
        if not inf.needs:
            continue
        need = max(inf.needs, key=lambda n: n.key)
        required = f"{need.major}.{need.minor}" if need.minor is not None else str(need.major)
        groups.setdefault(required, []).append(need)
    out: list[Finding] = []
    severity = {"compatible": None, "mvc": Severity.WARNING, "incompatible": Severity.ERROR}
    unknown: list[tuple[str, list[CudaNeed], str]] = []
    for required, needs in sorted(groups.items(), key=lambda g: g[1][0].key):
        subject = needs[0].subject if len(needs) == 1 else f"{len(needs)} components"
        verdict = driver_verdict(required, driver)  # the finding's subject names who needs it
        sev = severity.get(verdict.status, Severity.INFO)
        if sev is None:
            continue
        if verdict.status not in severity:
            unknown.append((required, needs, verdict.message))
            continue
        cause = fix = ""
        if sev is Severity.ERROR:
            fix = f"use a driver that supports CUDA {required}, or rebuild for the driver's CUDA"
        elif verdict.status == "mvc":
            cause = (
                f"{subject} is built for CUDA {required}, newer than the driver's; within one CUDA major the driver "
                "runs it through minor-version compatibility"
            )
            fix = (
                f"nothing, unless it JIT-compiles PTX newer than the driver or calls an API added after the "
                f"driver's CUDA: then use a driver that supports CUDA {required}"
            )
        out.append(
            Finding(
                "driver",
                sev,
                subject,
                verdict.message,
                cause=cause,
                remedies=manual(fix),
                details=tuple(f"{n.subject}: {n.evidence}" for n in needs),
            )
        )
    if unknown:
        # one cause (the driver's CUDA is not known): one finding, the highest requirement's message decides
        needs = [n for _, group, _ in unknown for n in group]
        message = unknown[-1][2]
        subject = needs[0].subject if len(needs) == 1 else f"{len(needs)} components"
        out.append(
            Finding(
                "driver",
                Severity.INFO,
                subject,
                message,
                cause=f"the stack requires CUDA {', '.join(r for r, _, _ in unknown)} (the highest decides)",
                remedies=manual("pass --cuda-driver=VER to check a deployment target" if not driver.version else ""),
                details=tuple(f"{n.subject}: {n.evidence}" for n in needs),
            )
        )
    return tuple(out)


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``driver`` item: every inference of the stack against its driver."""
    return driver_findings(stack.inferences, stack.driver)


def nothing_to_check(stack: StackView, target: Target | None = None) -> str | None:
    """Why the ``driver`` item is skipped: no driver version known (none probed, none declared), or no
    component of the stack names the CUDA it requires."""
    if not stack.driver.version and not stack.driver.cuda_version:
        return "no driver known: pass --cuda-driver=VER to check a deployment target"
    if not any(inf.needs for inf in stack.inferences):
        return "nothing in the stack names the CUDA version it requires"
    return None
