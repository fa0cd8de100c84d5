"""Verdicts over the compatibility data: can this driver run code built for that CUDA; does that CUDA still
support this GPU.

The rules are NVIDIA's CUDA compatibility guide: a driver runs every CUDA up to the one its branch ships
natively; minor-version compatibility (from the major's MVC floor driver on) runs newer minors of a major with
a limited feature set; a forward-compatibility libcuda (cuda-compat) lifts the limit on data-center GPUs only.
The facts are :mod:`pytest_cudastack.cuda.compat`'s tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_cudastack.cuda.compat import arch_cuda_range, beyond_data, cuda_for_driver, mvc_floor_row
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.cuda.versions import CudaVersion, DriverVersion, parse_arch, parse_cuda, parse_driver
from pytest_cudastack.errors import OptionError, RuleError

__all__ = ["VERDICT_STATUSES", "DriverVerdict", "VerdictStatus", "driver_verdict", "gpu_verdict"]

VERDICT_STATUSES = ("compatible", "mvc", "incompatible", "unknown")
VerdictStatus = Literal["compatible", "mvc", "incompatible", "unknown"]


@dataclass(frozen=True)
class DriverVerdict:
    """Outcome of checking a CUDA requirement (or a GPU) against a driver.

    ``status``: "compatible"; "mvc" (works with a caveat: minor-version or forward compatibility; a
    warning); "incompatible" (a failure); "unknown" (no facts; ``message`` says why).
    """

    status: VerdictStatus
    message: str
    via: str | None = None  # "minor-version compatibility" / "forward compatibility" when status == "mvc"

    @property
    def failing(self) -> bool:
        return self.status == "incompatible"


def _fmt_mm(version: CudaVersion) -> str:
    return "{}.{}".format(*version.mm)


def _driver_label(driver: DriverInfo) -> str:
    who = f"driver {driver.version}" if driver.version else "the driver"
    return f"{who} ({driver.source})" if driver.source in ("declared", "probed") else who


def _native_cuda(driver: DriverInfo) -> CudaVersion | None:
    if driver.forward_compat and driver.version:
        # NVML reports the CUDA version of the libcuda it loaded, i.e. the forward-compatibility one; what the
        # kernel driver itself supports comes from its branch
        kernel = cuda_for_driver(driver.version)
        if kernel is not None:
            return kernel
    if driver.cuda_version:
        try:
            return parse_cuda(driver.cuda_version)
        except OptionError:
            pass
    if driver.version:
        return cuda_for_driver(driver.version)
    return None


def _driver_version(driver: DriverInfo) -> DriverVersion | None:
    if not driver.version:
        return None
    try:
        return parse_driver(driver.version)
    except OptionError:
        return None


def _floor(cuda_major: int) -> DriverVersion | None:
    row = mvc_floor_row(cuda_major)
    return row.driver if row is not None else None


def _support_phrase(driver: DriverInfo, native: CudaVersion) -> str:
    text = f"{_driver_label(driver)} supports CUDA ≤ {_fmt_mm(native)}"
    dv = _driver_version(driver)
    floor = _floor(native.major)
    if dv is not None and floor is not None and dv >= floor:
        text += f" ({native.major}.x via minor-version compatibility)"
    return text


def driver_verdict(required_cuda: str | CudaVersion, driver: DriverInfo, *, subject: str = "") -> DriverVerdict:
    """Can ``driver`` run code built for CUDA ``required_cuda`` ("13.0", "12", "12.9.1")?

    ``subject`` names what needs it ("torch 2.14.1+cu130") in the message.  A declared branch without a minor
    (``--cuda-driver=R450``) whose major's MVC floor lies inside that branch (450.80.02) gives "unknown" for
    the minors that need the floor.  Raises RuleError for a malformed ``required_cuda``.
    """
    required = parse_cuda(required_cuda, error=RuleError)
    req_major = required.major
    req_text = str(required) if len(required.release) > 1 else f"{req_major}"
    needs = f"{subject} needs CUDA {req_text}" if subject else f"CUDA {req_text} is required"
    native = _native_cuda(driver)
    dv = _driver_version(driver)
    if native is None:
        why = driver.reason or (
            f"driver {driver.version} is not in the compatibility data" if driver.version else "no driver facts"
        )
        return DriverVerdict("unknown", f"{needs}; cannot tell whether the driver supports it: {why}")
    support = _support_phrase(driver, native)
    if required.mm <= native.mm:
        return DriverVerdict("compatible", f"{needs}; {support}")
    floor = _floor(req_major)
    fwd = _forward_compat(driver, required)
    if req_major == native.major or (dv is not None and floor is not None and dv >= floor):
        if dv is not None and floor is not None and dv < floor:
            if dv.branch_only and dv.branch == floor.branch and fwd is None:
                return DriverVerdict(
                    "unknown",
                    f"{needs}; {support}; minor-version compatibility needs driver ≥ {floor}, and the minor "
                    f"version of branch R{dv.branch} is not known; cannot tell",
                )
            # below the MVC floor of its own major (e.g. 450.51 with 11.x): fall through
        else:
            return DriverVerdict(
                "mvc",
                f"{needs}; {support}: it runs through minor-version compatibility with a limited feature set; "
                f"PTX newer than the driver (CUDA {_fmt_mm(native)}) cannot be JIT-compiled "
                "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION), and APIs needing a newer driver fail",
                via="minor-version compatibility",
            )
    if fwd is not None:
        return fwd
    if dv is not None and beyond_data(dv) and floor is None:
        return DriverVerdict(
            "unknown",
            f"{needs}; {_driver_label(driver)} is newer than the compatibility data "
            f"(known to support CUDA ≥ {_fmt_mm(native)}); cannot tell",
        )
    if floor is not None:
        hint = f"CUDA {req_major} needs driver ≥ {floor}"
    else:
        hint = f"no driver in the compatibility data supports CUDA {req_major}"
    return DriverVerdict("incompatible", f"{needs}; {support}; {hint}")


def _forward_compat(driver: DriverInfo, required: CudaVersion) -> DriverVerdict | None:
    """A forward-compatibility libcuda (cuda-compat) newer than the kernel driver can lift the limit."""
    compat_version = driver.forward_compat
    if not compat_version:
        return None
    compat_cuda = cuda_for_driver(compat_version)
    if compat_cuda is None or compat_cuda.mm < required.mm:
        return None
    if driver.gpus and all("geforce" in gpu.name.lower() for gpu in driver.gpus):
        return DriverVerdict(
            "incompatible",
            f"CUDA {required} is beyond {_driver_label(driver)}; the forward-compatibility libcuda "
            f"{compat_version} does not help on GeForce GPUs ({', '.join(g.name for g in driver.gpus)}): "
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804)",
        )
    return DriverVerdict(
        "mvc",
        f"CUDA {required} is beyond {_driver_label(driver)}, but a forward-compatibility libcuda "
        f"{compat_version} (CUDA {_fmt_mm(compat_cuda)}) is on the library path: this works only on "
        "data-center GPUs (and select NGC-Server-Ready RTX / Jetson), not GeForce "
        "(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, error 804)",
        via="forward compatibility",
    )


def gpu_verdict(cc: str, cuda_major: int) -> DriverVerdict:
    """Does CUDA ``cuda_major`` still support a GPU of compute capability ``cc`` ("7.0" or "sm_70")?

    V100 (7.0) with CUDA 13 is "incompatible"; an arch newer than the major's first release is too.
    Raises RuleError for a malformed ``cc``.
    """
    arch = parse_arch(cc, error=RuleError)
    key = arch.cc
    span = arch_cuda_range(key)
    if span is None:
        return DriverVerdict("unknown", f"compute capability {key} ({arch}) is not in the compatibility data")
    first, last = span
    if last is not None and cuda_major > last:
        return DriverVerdict(
            "incompatible",
            f"CUDA {cuda_major} no longer supports compute capability {key} ({arch}); the last CUDA major "
            f"supporting it is {last}",
        )
    if cuda_major < first:
        return DriverVerdict(
            "incompatible", f"compute capability {key} ({arch}) needs CUDA ≥ {first}; the stack has CUDA {cuda_major}"
        )
    return DriverVerdict("compatible", f"CUDA {cuda_major} supports compute capability {key} ({arch})")
