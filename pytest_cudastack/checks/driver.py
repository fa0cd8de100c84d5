"""The driver check: does the NVIDIA driver run the CUDA every component of the stack requires?"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from pytest_cudastack.cuda.compat import min_driver_for_cuda, mvc_floor
from pytest_cudastack.cuda.verdicts import driver_verdict
from pytest_cudastack.findings import DriverUpgrade, Facts, Finding, Pip, Rebuild, Remedy, Severity, UseBuild, manual
from pytest_cudastack.model.needs import CudaNeed, Inference
from pytest_cudastack.model.torchindex import index_for

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.driver import DriverInfo

__all__ = ["driver_findings", "mismatch_findings", "nothing_to_check", "run"]


def driver_findings(inferences: Iterable[Inference], driver: DriverInfo) -> tuple[Finding, ...]:
    """Each distinct CUDA requirement of the stack against the driver (``verdicts.driver_verdict``).

    compatible: nothing; minor-version compatibility: WARNING; unknown: one INFO; incompatible: ONE ERROR for
    every requirement the driver cannot run (one cause: the driver), with its remedies as data: a driver at
    least the one the highest requirement needs, and each component's build for the driver's CUDA (torch's
    from PyTorch's index, which the repair plan verifies like a ``--cuda-max`` rebuild: ``facts.bound``).
    """
    groups: dict[str, list[tuple[CudaNeed, Inference]]] = {}
    for inf in inferences:
        if not inf.needs:
            continue
        need = max(inf.needs, key=lambda n: n.key)
        required = f"{need.major}.{need.minor}" if need.minor is not None else str(need.major)
        groups.setdefault(required, []).append((need, inf))
    out: list[Finding] = []
    unknown: list[tuple[str, list[CudaNeed], str]] = []
    incompatible: list[tuple[str, list[tuple[CudaNeed, Inference]], str]] = []
    for required, members in sorted(groups.items(), key=lambda g: g[1][0][0].key):
        needs = [n for n, _ in members]
        subject = needs[0].subject if len(needs) == 1 else f"{len(needs)} components"
        verdict = driver_verdict(required, driver)  # the finding's subject names who needs it
        if verdict.status == "compatible":
            continue
        if verdict.status == "incompatible":
            incompatible.append((required, members, verdict.message))
        elif verdict.status == "mvc":
            out.append(_mvc_finding(subject, required, verdict.message, needs))
        else:
            unknown.append((required, needs, verdict.message))
    if incompatible:
        out.insert(0, _incompatible_finding(incompatible, driver))
    if unknown:
        out.append(_unknown_finding(unknown, driver))
    return tuple(out)


def _mvc_finding(subject: str, required: str, message: str, needs: Sequence[CudaNeed]) -> Finding:
    """A WARNING: within one CUDA major the driver runs a newer minor through minor-version compatibility."""
    return Finding(
        "driver",
        Severity.WARNING,
        subject,
        message,
        cause=(
            f"{subject} is built for CUDA {required}, newer than the driver's; within one CUDA major the driver "
            "runs it through minor-version compatibility"
        ),
        remedies=manual(
            f"nothing, unless it JIT-compiles PTX newer than the driver or calls an API added after the "
            f"driver's CUDA: then use a driver that supports CUDA {required}"
        ),
        facts=Facts(required=f"CUDA {required}"),
        details=tuple(f"{n.subject}: {n.evidence}" for n in needs),
    )


def _incompatible_finding(
    groups: Sequence[tuple[str, Sequence[tuple[CudaNeed, Inference]], str]], driver: DriverInfo
) -> Finding:
    """The one ERROR for every requirement the driver cannot run: the highest requirement's message, every
    component in the details, and the remedies (a driver for the highest; each wheel's build for the
    driver's CUDA; each binary rebuilt)."""
    members = [m for _, group, _ in groups for m in group]
    highest, _, message = groups[-1]
    subject = members[0][0].subject if len(members) == 1 else f"{len(members)} components"
    native = driver.cuda_version
    remedies: list[Remedy] = []
    minimum = min_driver_for_cuda(highest)
    if minimum is not None:
        remedies.append(DriverUpgrade(minimum, highest, why=f"the first driver that runs CUDA {highest}"))
    elif (floor := mvc_floor(major := members[-1][0].major)) is not None:  # no toolkit row for that minor
        why = f"the first driver of the CUDA {major} branch: it runs {highest} through minor-version compatibility"
        remedies.append(DriverUpgrade(floor, f"{major}.x", why=why))
    keys = [inf.distribution for _, inf in members if inf.distribution is not None]
    if native is not None:
        remedies.extend(_builds_for(members, keys, native))
    required = ", ".join(r for r, _, _ in groups)
    more = len(members) - len(groups[-1][1])
    others = ", ".join(r for r, _, _ in groups[:-1])
    return Finding(
        "driver",
        Severity.ERROR,
        subject,
        message if more == 0 else f"{message}; {more} more component(s) need CUDA {others}",
        cause=(
            f"the driver runs CUDA <= {native or '?'}; the stack requires CUDA {required}: a CUDA major newer than "
            "the driver's does not run (no minor-version compatibility across majors)"
        ),
        remedies=tuple(remedies),
        facts=Facts(required=f"CUDA {highest}", found=f"driver {driver.version or '?'}", bound=native),
        distributions=tuple(dict.fromkeys(sorted(keys, key=lambda k: k != "torch"))),
        details=tuple(f"{n.subject}: {n.evidence}" for n, _ in members),
    )


def _builds_for(members: Sequence[tuple[CudaNeed, Inference]], keys: Sequence[str], native: str) -> list[Remedy]:
    """torch's build for the driver's CUDA from PyTorch's index (its CUDA wheels follow it), else each wheel's
    build for it; each binary rebuilt with that toolkit."""
    out: list[Remedy] = []
    if "torch" in keys:
        major = next((n.major for n, inf in members if inf.distribution == "torch"), None)
        index = index_for("max", native, major) if major is not None else None
        if index is not None:
            why = f"PyTorch's build for CUDA {index.cuda[0]}.{index.cuda[1]}, which this driver runs ({index.source})"
            get = Pip("install", ("torch",), index_url=index.url, why=why)
            out.append(
                UseBuild(
                    "torch", f"the CUDA {index.cuda[0]}.{index.cuda[1]} build", get, why="its CUDA wheels follow it"
                )
            )
    for need, inf in members:
        if inf.distribution is None:
            out.append(Rebuild(inf.subject, (f"a CUDA {native} toolkit",), why=f"it links CUDA {need.version}"))
        elif "torch" not in keys:
            out.append(UseBuild(inf.distribution, f"a build for CUDA <= {native}", why=f"it needs CUDA {need.version}"))
    return out


def _unknown_finding(unknown: Sequence[tuple[str, Sequence[CudaNeed], str]], driver: DriverInfo) -> Finding:
    """No driver facts: one cause, one INFO (the highest requirement's message decides)."""
    needs = [n for _, group, _ in unknown for n in group]
    message = unknown[-1][2]
    subject = needs[0].subject if len(needs) == 1 else f"{len(needs)} components"
    return Finding(
        "driver",
        Severity.INFO,
        subject,
        message,
        cause=f"the stack requires CUDA {', '.join(r for r, _, _ in unknown)} (the highest decides)",
        remedies=manual("pass --cuda-driver=VER to check a deployment target" if not driver.version else ""),
        details=tuple(f"{n.subject}: {n.evidence}" for n in needs),
    )


def mismatch_findings(driver: DriverInfo) -> tuple[Finding, ...]:
    """One ERROR when the user-space driver libraries the linker would load are not the loaded kernel
    module's version (``DriverInfo.mismatched_libraries``): NVML fails with "Driver/library version
    mismatch" and cuInit with a system driver mismatch, so every process loses the GPU until the versions
    agree again."""
    libraries = driver.mismatched_libraries()
    if not libraries:
        return ()
    kernel = driver.kernel_module or "?"
    found = ", ".join(f"{soname} {version}" for soname, version in libraries)
    versions = sorted({v for _, v in libraries})
    return (
        Finding(
            "driver",
            Severity.ERROR,
            "the NVIDIA driver",
            f"the kernel module is {kernel} but the user-space driver libraries are {found}",
            cause=(
                "the user-space driver and the loaded kernel module are different versions (a driver installed "
                "or upgraded without a reboot, or a libcuda/libnvidia-ml from another driver on the search path): "
                "NVML fails with 'Driver/library version mismatch' and CUDA cannot initialise"
            ),
            remedies=manual(
                f"reboot (or unload and reload the nvidia kernel modules) so that the module of the installed "
                f"user-space driver {', '.join(versions)} is loaded",
                f"or reinstall the user-space driver {kernel} that matches the loaded kernel module",
                why="the kernel module and the user-space libraries must be the same driver version",
            ),
            facts=Facts(required=f"driver libraries {kernel}", found=found),
            details=tuple(f"{soname}: {version}" for soname, version in libraries),
        ),
    )


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``driver`` item: the user-space driver against the kernel module, then every inference of the
    stack against the driver."""
    return mismatch_findings(stack.driver) + driver_findings(stack.inferences, stack.driver)


def nothing_to_check(stack: StackView, target: Target | None = None) -> str | None:
    """Why the ``driver`` item is skipped: no driver version known (none probed, none declared), or no
    component of the stack names the CUDA it requires. A driver whose libraries do not match its kernel
    module is always checked."""
    if stack.driver.mismatched_libraries():
        return None
    if not stack.driver.version and not stack.driver.cuda_version:
        return "no driver known: pass --cuda-driver=VER to check a deployment target"
    if not any(inf.needs for inf in stack.inferences):
        return "nothing in the stack names the CUDA version it requires"
    return None
