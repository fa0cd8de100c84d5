"""Which NVIDIA driver is here (or declared), which CUDA it supports, which GPUs.

:func:`probe_driver` asks NVML (nvidia-ml-py) and looks at the driver's files statically (where libcuda.so.1
and libnvidia-ml.so.1 would load from, the version in their file names, ``/proc/driver/nvidia/version``, a
forward-compatibility libcuda).  It never raises: an absent library, an unloaded driver or a refused
permission is a ``reason`` in the result.  It never dlopens libcuda; NVML (the driver's management library)
is asked once per process (:func:`probe_nvml` is cached), while the file lookups go through the finder each
call hands in (a Stack's own linker search, which the cache must not keep alive).

:func:`declared_driver` builds the deployment target from ``--cuda-driver`` / ``--cuda-arch``; the markers
(:mod:`pytest_cudastack.markers`) and verdicts (:mod:`pytest_cudastack.cuda.verdicts`) are evaluated against
either.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_cudastack._sysio import read_text
from pytest_cudastack.cuda import compat
from pytest_cudastack.cuda.versions import parse_arch, parse_arch_list, parse_driver
from pytest_cudastack.errors import OptionError
from pytest_cudastack.linker.resolver import Resolver

__all__ = [
    "NVML_LIBRARY_ENV",
    "NVML_REASONS",
    "PROBE_TIMEOUT_S",
    "PROC_VERSION_PATH",
    "SYS_MODULE_VERSION_PATH",
    "DriverFiles",
    "DriverInfo",
    "Gpu",
    "declared_driver",
    "driver_files",
    "kernel_module_version",
    "linker_finder",
    "nvml_facts",
    "nvml_reason",
    "parse_proc_version",
    "probe_driver",
    "probe_nvml",
    "visible_gpus",
]

logger = logging.getLogger(__name__)

Finder = Callable[[str], tuple[str | None, str | None]]  # soname -> (path, realpath), as driver_files takes it

NVML_LIBRARY_ENV = "CUDASTACK_NVML_LIBRARY"
PROC_VERSION_PATH = "/proc/driver/nvidia/version"
SYS_MODULE_VERSION_PATH = "/sys/module/nvidia/version"  # the loaded module's MODULE_VERSION, one line

# NVML return codes (nvml.h) -> what they mean for someone reading a skip/fail reason.
NVML_REASONS: Mapping[int, str] = {
    1: "NVML is not initialized",
    2: "invalid argument passed to NVML",
    3: "not supported by this GPU or driver",
    4: "no permission to access the NVIDIA devices (/dev/nvidia*)",
    6: "not found",
    7: "NVML reported an insufficient buffer size",
    9: "the NVIDIA kernel driver is not loaded",
    10: "NVML timed out",
    12: "the NVML library libnvidia-ml.so.1 was not found (no NVIDIA driver installed)",
    13: "a function is missing from the NVML library (NVML older than nvidia-ml-py)",
    14: "a GPU's infoROM is corrupted",
    15: "a GPU has fallen off the bus or is otherwise lost",
    16: "a GPU needs a reset",
    17: "the operating system blocked the NVML request",
    18: "the NVML library and the kernel module have different versions (driver upgraded without reboot?)",
    20: "NVML ran out of memory",
    28: "no GPU found",
    999: "unknown NVML error",
}

_NVML_NAMES: Mapping[int, str] = {
    1: "NVML_ERROR_UNINITIALIZED",
    2: "NVML_ERROR_INVALID_ARGUMENT",
    3: "NVML_ERROR_NOT_SUPPORTED",
    4: "NVML_ERROR_NO_PERMISSION",
    6: "NVML_ERROR_NOT_FOUND",
    7: "NVML_ERROR_INSUFFICIENT_SIZE",
    9: "NVML_ERROR_DRIVER_NOT_LOADED",
    10: "NVML_ERROR_TIMEOUT",
    12: "NVML_ERROR_LIBRARY_NOT_FOUND",
    13: "NVML_ERROR_FUNCTION_NOT_FOUND",
    14: "NVML_ERROR_CORRUPTED_INFOROM",
    15: "NVML_ERROR_GPU_IS_LOST",
    16: "NVML_ERROR_RESET_REQUIRED",
    17: "NVML_ERROR_OPERATING_SYSTEM",
    18: "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    20: "NVML_ERROR_MEMORY",
    28: "NVML_ERROR_GPU_NOT_FOUND",
    999: "NVML_ERROR_UNKNOWN",
}

_NOT_SUPPORTED = 3
_LIBRARY_NOT_FOUND = 12


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML reports it."""

    index: int
    name: str
    uuid: str | None
    compute_capability: str  # "9.0"; "" when NVML could not say
    memory_total: int | None  # bytes
    mig_mode: str | None  # "enabled" / "disabled"; None where MIG is not exposed

    @property
    def arch(self) -> str | None:
        """``sm_90`` for compute capability 9.0, None when unknown."""
        if not self.compute_capability:
            return None
        try:
            return str(parse_arch(self.compute_capability))
        except OptionError:
            return None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "compute_capability": self.compute_capability,
            "memory_total": self.memory_total,
            "mig_mode": self.mig_mode,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Gpu:
        return cls(
            index=int(data["index"]),
            name=str(data["name"]),
            uuid=None if data.get("uuid") is None else str(data["uuid"]),
            compute_capability=str(data.get("compute_capability", "")),
            memory_total=None if data.get("memory_total") is None else int(data["memory_total"]),
            mig_mode=None if data.get("mig_mode") is None else str(data["mig_mode"]),
        )


@dataclass(frozen=True)
class DriverInfo:
    """The driver the checks evaluate against: probed here, declared (deployment target) or absent."""

    source: str  # "probed" | "declared" | "absent"
    version: str | None  # "550.54.15"
    cuda_version: str | None  # "12.4": highest CUDA the driver supports natively
    gpus: tuple[Gpu, ...] = ()
    archs: tuple[str, ...] = ()  # "sm_90", ...
    arch_source: str | None = None  # "probed" | "declared" | None
    reason: str | None = None  # why a fact is absent
    notes: tuple[str, ...] = ()  # libcuda path, /proc version, forward-compat observations
    libcuda: str | None = None  # where libcuda.so.1 would load from (static resolution)
    kernel_module: str | None = None  # version in /proc/driver/nvidia/version
    forward_compat: str | None = None  # version of a cuda-compat libcuda newer than the kernel module
    libcuda_version: str | None = None  # from the name of the file libcuda.so.1 would load (libcuda.so.550.54.15)
    nvml_version: str | None = None  # likewise for libnvidia-ml.so.1

    @property
    def present(self) -> bool:
        return self.version is not None or self.cuda_version is not None

    def summary(self) -> str:
        """One line for headers: "driver 550.54.15 (CUDA 12.4, declared)" or "no driver (reason)"."""
        if not self.present:
            return f"no driver ({self.reason or 'unknown'})"
        text = f"driver {self.version or '?'} (CUDA {self.cuda_version or '?'}, {self.source})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "version": self.version,
            "cuda_version": self.cuda_version,
            "gpus": [g.to_json() for g in self.gpus],
            "archs": list(self.archs),
            "arch_source": self.arch_source,
            "reason": self.reason,
            "notes": list(self.notes),
            "libcuda": self.libcuda,
            "kernel_module": self.kernel_module,
            "forward_compat": self.forward_compat,
            "libcuda_version": self.libcuda_version,
            "nvml_version": self.nvml_version,
        }

    def mismatched_libraries(self) -> tuple[tuple[str, str], ...]:
        """The user-space driver libraries whose version differs from the loaded kernel module's, as
        (soname, version): every such libnvidia-ml (NVML refuses: "Driver/library version mismatch",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH), and a libcuda older than the module (cuInit fails with
        cudaErrorSystemDriverMismatch) or newer while NVML is of that same newer version (the whole
        user-space driver was replaced: an upgrade not followed by a reboot). A libcuda newer than the module
        beside an NVML of the module's version is a forward-compatibility libcuda (cuda-compat ships libcuda,
        not NVML): not a mismatch here. Empty when a version is unknown or the driver is declared."""
        kernel = self.kernel_module
        if self.source != "probed" or not kernel:
            return ()
        out: list[tuple[str, str]] = []
        cuda, nvml = self.libcuda_version, self.nvml_version
        if cuda and cuda != kernel:
            try:
                older = parse_driver(cuda) < parse_driver(kernel)
            except OptionError:
                older = False
            if older or (nvml is not None and nvml == cuda):
                out.append(("libcuda.so.1", cuda))
        if nvml and nvml != kernel:
            out.append(("libnvidia-ml.so.1", nvml))
        return tuple(out)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DriverInfo:
        def opt(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        return cls(
            source=str(data.get("source", "absent")),
            version=opt("version"),
            cuda_version=opt("cuda_version"),
            gpus=tuple(Gpu.from_json(g) for g in data.get("gpus", ())),
            archs=tuple(str(a) for a in data.get("archs", ())),
            arch_source=opt("arch_source"),
            reason=opt("reason"),
            notes=tuple(str(n) for n in data.get("notes", ())),
            libcuda=opt("libcuda"),
            kernel_module=opt("kernel_module"),
            forward_compat=opt("forward_compat"),
            libcuda_version=opt("libcuda_version"),
            nvml_version=opt("nvml_version"),
        )


@dataclass(frozen=True)
class DriverFiles:
    """What the file system says about the driver, without loading anything."""

    libcuda: str | None = None  # path the linker would open for libcuda.so.1
    libcuda_version: str | None = None  # from the real file name (libcuda.so.550.54.15)
    nvml: str | None = None
    nvml_version: str | None = None
    kernel_module: str | None = None  # /proc/driver/nvidia/version
    forward_compat: str | None = None  # libcuda version when it differs from (is newer than) the kernel module
    notes: tuple[str, ...] = field(default=())


# --------------------------------------------------------------------------------------------- static facts

_SO_VERSION_RE = re.compile(r"\.so\.(?P<version>[0-9]{3,4}(?:\.[0-9]+){1,3})$")
_PROC_RE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(?P<version>[0-9]{3,4}(?:\.[0-9]+){1,3})\b")


def _version_in_name(path: str | None) -> str | None:
    if not path:
        return None
    m = _SO_VERSION_RE.search(os.path.basename(path))
    return m["version"] if m else None


def parse_proc_version(text: str) -> str | None:
    """Kernel module version from /proc/driver/nvidia/version text, e.g.
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024" -> "550.54.15"
    (also the "Open Kernel Module" spelling)."""
    m = _PROC_RE.search(text)
    return m["version"] if m else None


def kernel_module_version(root: str = "/") -> tuple[str | None, str | None]:
    """The loaded NVIDIA kernel module's version and the file it was read from, under ``root`` (``/``; tests
    pass a fake root): ``proc/driver/nvidia/version`` (the NVRM line), else ``sys/module/nvidia/version`` (the
    module's MODULE_VERSION, which also exists where /proc/driver/nvidia is hidden, as in some containers).
    (None, None) when the module is not loaded or neither file reads; never raises."""
    proc = os.path.join(root, PROC_VERSION_PATH.lstrip("/"))
    text = read_text(proc, limit=65536)
    version = parse_proc_version(text) if text else None
    if version:
        return version, proc
    sys_path = os.path.join(root, SYS_MODULE_VERSION_PATH.lstrip("/"))
    text = read_text(sys_path, limit=4096)
    if text:
        m = re.fullmatch(r"\s*([0-9]{3,4}(?:\.[0-9]+){1,3})\s*", text)
        if m:
            return m[1], sys_path
    return None, None


def linker_finder(resolver: Resolver) -> Finder:
    """*resolver*'s :meth:`~pytest_cudastack.linker.resolver.Resolver.find` as a :func:`driver_files`
    finder: soname -> (path, realpath), searched as a DT_NEEDED of the Python executable."""

    def find(soname: str) -> tuple[str | None, str | None]:
        lib = resolver.find(soname)
        return lib.path, lib.realpath

    return find


def _default_finder() -> Finder | None:
    """A fresh resolver of this process's configuration, reading ELF files uncached (a Stack hands down a
    finder over its own resolver and cache instead); None when it cannot start."""
    try:
        resolver = Resolver()
    except Exception as e:  # never raise out of a probe
        logger.debug("resolver unavailable: %s", e)
        return None
    return linker_finder(resolver)


def driver_files(
    find: Finder | None = None,
    root: str = "/",
) -> DriverFiles:
    """Static driver facts: where libcuda.so.1 / libnvidia-ml.so.1 would load from (``find`` maps a soname to
    (path, realpath); default: a fresh resolver, reading uncached), their versions, the kernel module's version
    (:func:`kernel_module_version` under ``root``), and a forward-compatibility libcuda.  Never raises."""
    notes: list[str] = []
    finder = find if find is not None else _default_finder()
    found: dict[str, tuple[str | None, str | None]] = {}
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        if finder is None:
            found[soname] = (None, None)
            continue
        try:
            found[soname] = finder(soname)
        except Exception as e:  # never raise out of a probe
            logger.debug("resolving %s failed: %s", soname, e)
            notes.append(f"{soname}: could not resolve ({e})")
            found[soname] = (None, None)
    if finder is None:
        notes.append("library resolution unavailable (the resolver could not start)")
    libcuda, libcuda_real = found["libcuda.so.1"]
    nvml, nvml_real = found["libnvidia-ml.so.1"]
    libcuda_version = _version_in_name(libcuda_real) or _version_in_name(libcuda)
    nvml_version = _version_in_name(nvml_real) or _version_in_name(nvml)
    if finder is not None:
        for soname, path, real, version in (
            ("libcuda.so.1", libcuda, libcuda_real, libcuda_version),
            ("libnvidia-ml.so.1", nvml, nvml_real, nvml_version),
        ):
            if path is None:
                notes.append(f"{soname}: not found by the linker search")
            else:
                shown = path if real in (None, path) else f"{path} -> {real}"
                notes.append(f"{soname}: {shown}" + (f" (driver {version})" if version else ""))
    kernel, source = kernel_module_version(root)
    if kernel:
        notes.append(f"kernel module {kernel} ({source})")
    forward = None
    if libcuda_version and kernel and libcuda_version != kernel:
        try:
            newer = parse_driver(libcuda_version) > parse_driver(kernel)
        except OptionError:
            newer = False
        rule = compat.load_compat().forward_compat_rule if _data_ok() else ""
        if newer and nvml_version == libcuda_version:
            notes.append(
                f"libcuda {libcuda_version} and libnvidia-ml {nvml_version} are newer than the kernel module "
                f"{kernel}: the user-space driver was replaced and the module not reloaded (reboot)"
            )
        elif newer:
            forward = libcuda_version
            notes.append(
                f"forward-compatibility libcuda {libcuda_version} ({libcuda_real or libcuda}) is newer than the "
                f"kernel module {kernel}: {rule}"
            )
        else:
            notes.append(
                f"libcuda {libcuda_version} ({libcuda_real or libcuda}) is older than the kernel module {kernel}: "
                "a user-mode driver older than the kernel driver fails (cudaErrorSystemDriverMismatch, 803); "
                "cuda-compat is meant for old drivers, not new ones"
            )
    return DriverFiles(libcuda, libcuda_version, nvml, nvml_version, kernel, forward, tuple(notes))


def _data_ok() -> bool:
    try:
        compat.load_compat()
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------------------------- NVML probe


def _error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def nvml_reason(call: str, exc: BaseException) -> str:
    """A reason for a failed NVML call: "nvmlInit: the NVIDIA kernel driver is not loaded
    (NVML_ERROR_DRIVER_NOT_LOADED)"."""
    code = _error_code(exc)
    if code is None:
        return f"{call}: {type(exc).__name__}: {exc}"
    meaning = NVML_REASONS.get(code)
    if code == _LIBRARY_NOT_FOUND and call.startswith("nvmlSystemGetCudaDriverVersion"):
        meaning = "NVML could not load libcuda.so.1 (the CUDA driver library is absent or unloadable)"
    name = _NVML_NAMES.get(code, f"NVML error {code}")
    if meaning is None:
        try:
            meaning = str(exc)
        except Exception:
            meaning = "unrecognised NVML error"
    return f"{call}: {meaning} ({name})"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _load_nvml_override(nvml: Any) -> str | None:
    """Point pynvml at ``$CUDASTACK_NVML_LIBRARY`` (tests' fake NVML). Returns a reason when that fails."""
    path = os.environ.get(NVML_LIBRARY_ENV)
    if not path:
        return None
    if getattr(nvml, "nvmlLib", None) is not None:
        return None  # already loaded; pynvml keeps one handle per process
    try:
        handle = ctypes.CDLL(path)
    except OSError as e:
        return (
            f"nvmlInit: the NVML library {path} (from ${NVML_LIBRARY_ENV}) could not be loaded: {e} "
            "(NVML_ERROR_LIBRARY_NOT_FOUND)"
        )
    nvml.nvmlLib = handle
    logger.debug("NVML loaded from %s ($%s)", path, NVML_LIBRARY_ENV)
    return None


def _import_pynvml() -> Any:
    return importlib.import_module("pynvml")  # lazy: NVML stays out of import time


@functools.lru_cache(maxsize=8)
def probe_nvml(nvml: Any | None = None) -> DriverInfo:
    """What NVML says, asked once per process: by default in a short-lived child process
    (``sys.executable``), so neither libnvidia-ml nor the libcuda that ``nvmlSystemGetCudaDriverVersion_v2``
    loads ever enters the test process, and a crash or hang in the driver stack becomes a reason; an injected
    ``nvml`` (a pynvml-like module, for tests) is asked in-process.  Never raises; cached per ``nvml`` (None in
    production): ``probe_nvml.cache_clear()`` to ask again."""
    try:
        return nvml_facts(nvml) if nvml is not None else _nvml_facts_in_child()
    except Exception as e:  # pragma: no cover - neither raises, belt and braces
        logger.debug("NVML probe failed", exc_info=True)
        return DriverInfo("absent", None, None, reason=f"driver probe failed: {type(e).__name__}: {e}")


def probe_driver(nvml: Any | None = None, find: Finder | None = None, root: str = "/") -> DriverInfo:
    """Probe the driver: NVML's facts (:func:`probe_nvml`, cached per process) plus static file facts
    (:func:`driver_files` with ``find``, looked up on every call: ``find`` is the caller's, typically a
    Stack's linker search over its own ELF cache, and is neither a cache key nor kept).  Never raises.
    """
    try:
        files = driver_files(find, root)
    except Exception as e:  # pragma: no cover - driver_files never raises, belt and braces
        files = DriverFiles(notes=(f"static driver facts unavailable: {e}",))
    try:
        return _combine(probe_nvml(nvml), files)
    except Exception as e:  # never raise out of the probe
        logger.debug("driver probe failed", exc_info=True)
        return DriverInfo(
            "absent",
            None,
            None,
            reason=f"driver probe failed: {type(e).__name__}: {e}",
            notes=files.notes,
            libcuda=files.libcuda,
            kernel_module=files.kernel_module,
            forward_compat=files.forward_compat,
            libcuda_version=files.libcuda_version,
            nvml_version=files.nvml_version,
        )


_CHILD_CODE = (
    "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "from pytest_cudastack.cuda.driver import _nvml_child_main; _nvml_child_main()"
)
PROBE_TIMEOUT_S = 60.0


def _nvml_child_main() -> None:
    """Entry point of the probe child: NVML facts as one JSON line on stdout."""
    sys.stdout.write(json.dumps(nvml_facts().to_json()) + "\n")
    sys.stdout.flush()


def _nvml_facts_in_child(timeout: float | None = None) -> DriverInfo:
    """Run :func:`nvml_facts` in a child Python process; every failure of the child is a reason."""
    if timeout is None:
        timeout = PROBE_TIMEOUT_S
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD_CODE],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return DriverInfo("absent", None, None, reason=f"the NVML probe did not finish within {timeout:g} s")
    except OSError as e:
        return DriverInfo("absent", None, None, reason=f"the NVML probe could not start {sys.executable}: {e}")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        how = f"died from signal {-done.returncode}" if done.returncode < 0 else f"exited {done.returncode}"
        return DriverInfo("absent", None, None, reason=f"the NVML probe process {how}: {tail}")
    try:
        return DriverInfo.from_json(json.loads(lines[-1]))
    except (ValueError, KeyError, TypeError) as e:
        return DriverInfo("absent", None, None, reason=f"the NVML probe returned unreadable output: {e}")


def _fallback(files: DriverFiles, reason: str, notes: list[str]) -> DriverInfo:
    """NVML failed: use the kernel module version when the driver is loaded, else report it absent."""
    if files.kernel_module:
        cuda = compat.cuda_for_driver(files.kernel_module) if _data_ok() else None
        notes.append(f"CUDA version taken from the driver branch table for {files.kernel_module}")
        return DriverInfo(
            "probed",
            files.kernel_module,
            str(cuda) if cuda is not None else None,
            reason=reason,
            notes=tuple(notes),
            libcuda=files.libcuda,
            kernel_module=files.kernel_module,
            forward_compat=files.forward_compat,
            libcuda_version=files.libcuda_version,
            nvml_version=files.nvml_version,
        )
    return DriverInfo(
        "absent",
        None,
        None,
        reason=reason,
        notes=tuple(notes),
        libcuda=files.libcuda,
        kernel_module=files.kernel_module,
        forward_compat=files.forward_compat,
        libcuda_version=files.libcuda_version,
        nvml_version=files.nvml_version,
    )


def _combine(raw: DriverInfo, files: DriverFiles) -> DriverInfo:
    """Merge NVML's facts with the static ones (kernel module, libcuda, forward compatibility)."""
    notes = list(files.notes) + list(raw.notes)
    if raw.source != "probed":
        return _fallback(files, raw.reason or "NVML unavailable", notes)
    reasons = [raw.reason] if raw.reason else []
    version = raw.version or files.kernel_module
    cuda = raw.cuda_version
    if cuda is None:
        table = compat.cuda_for_driver(version) if version and _data_ok() else None
        if table is not None:
            cuda = str(table)
            notes.append(f"CUDA version {cuda} taken from the driver branch table for {version}")
        else:
            reasons.append("the CUDA version the driver supports is unknown")
    if raw.version and files.kernel_module and raw.version != files.kernel_module:
        notes.append(f"NVML reports driver {raw.version} but the kernel module is {files.kernel_module}")
    forward = files.forward_compat
    if forward is None and version and not files.kernel_module and files.libcuda_version:
        forward = _newer_libcuda(files, version, notes)
    gpus = visible_gpus(raw.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), notes)
    archs = tuple(dict.fromkeys(a for a in (g.arch for g in gpus) if a))
    return DriverInfo(
        "probed",
        version,
        cuda,
        gpus,
        archs,
        "probed" if gpus else None,
        reason="; ".join(reasons) or None,
        notes=tuple(notes),
        libcuda=files.libcuda,
        kernel_module=files.kernel_module,
        forward_compat=forward,
        libcuda_version=files.libcuda_version,
        nvml_version=files.nvml_version,
    )


def visible_gpus(
    gpus: Sequence[Gpu], cuda_visible_devices: str | None, notes: list[str] | None = None
) -> tuple[Gpu, ...]:
    """The GPUs a CUDA process would see under ``CUDA_VISIBLE_DEVICES`` (NVML always lists all of them).

    Entries are NVML indices or (prefixes of) UUIDs; as in CUDA, the list ends at the first entry that names
    no GPU, and an empty value hides every GPU.  MIG entries are not resolved (the GPUs are kept).
    """
    if cuda_visible_devices is None:
        return tuple(gpus)
    entries = [e.strip() for e in cuda_visible_devices.split(",")]
    if any(e.upper().startswith("MIG-") for e in entries):
        if notes is not None:
            notes.append(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices} names MIG instances; all GPUs kept")
        return tuple(gpus)
    chosen: list[Gpu] = []
    for entry in entries:
        match = None
        if entry.isdigit():
            match = next((g for g in gpus if g.index == int(entry)), None)
        elif entry:
            match = next((g for g in gpus if g.uuid and g.uuid.lower().startswith(entry.lower())), None)
        if match is None:
            break
        if match not in chosen:
            chosen.append(match)
    if notes is not None and len(chosen) != len(gpus):
        notes.append(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices}: {len(chosen)} of {len(gpus)} GPUs visible")
    return tuple(chosen)


def nvml_facts(nvml: Any | None = None) -> DriverInfo:
    """What NVML alone says, in this process (``nvml``: pynvml or a stand-in; default: pynvml, whose library
    ``$CUDASTACK_NVML_LIBRARY`` overrides).  ``source`` is "absent" when NVML cannot initialise.  Never raises.
    """
    notes: list[str] = []
    try:
        if nvml is None:
            try:
                nvml = _import_pynvml()
            except ImportError as e:
                return DriverInfo("absent", None, None, reason=f"nvidia-ml-py (pynvml) is not installed: {e}")
            problem = _load_nvml_override(nvml)
            if problem is not None:
                return DriverInfo("absent", None, None, reason=problem)
            if os.environ.get(NVML_LIBRARY_ENV):
                notes.append(f"NVML library from ${NVML_LIBRARY_ENV}: {os.environ[NVML_LIBRARY_ENV]}")
        try:
            nvml.nvmlInit()
        except Exception as e:
            return DriverInfo("absent", None, None, reason=nvml_reason("nvmlInit", e), notes=tuple(notes))
        try:
            return _nvml_initialised(nvml, notes)
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception as e:
                logger.debug("nvmlShutdown failed: %s", e)
    except Exception as e:  # never raise out of the probe
        return DriverInfo("absent", None, None, reason=f"NVML probe failed: {type(e).__name__}: {e}")


def _cuda_from_int(value: int) -> str:
    return f"{value // 1000}.{(value % 1000) // 10}"


def _nvml_initialised(nvml: Any, notes: list[str]) -> DriverInfo:
    reasons: list[str] = []
    version: str | None = None
    try:
        version = _text(nvml.nvmlSystemGetDriverVersion()).strip() or None
    except Exception as e:
        reasons.append(nvml_reason("nvmlSystemGetDriverVersion", e))
    cuda: str | None = None
    try:
        cuda = _cuda_from_int(int(nvml.nvmlSystemGetCudaDriverVersion_v2()))
    except Exception as e:
        first = nvml_reason("nvmlSystemGetCudaDriverVersion_v2", e)
        try:
            cuda = _cuda_from_int(int(nvml.nvmlSystemGetCudaDriverVersion()))
            notes.append(f"{first}; used nvmlSystemGetCudaDriverVersion instead")
        except Exception as e2:
            # NVML cannot tell the CUDA version (typically libcuda.so.1 is absent); the table may estimate it
            reasons.append(f"{first}; {nvml_reason('nvmlSystemGetCudaDriverVersion', e2)}")
    gpus: list[Gpu] = []
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as e:
        reasons.append(nvml_reason("nvmlDeviceGetCount", e))
        count = 0
    for index in range(count):
        gpu = _probe_gpu(nvml, index, notes)
        if gpu is not None:
            gpus.append(gpu)
    archs = tuple(dict.fromkeys(a for a in (g.arch for g in gpus) if a))
    if count == 0 and not reasons:
        notes.append("NVML sees no GPU")
    return DriverInfo(
        "probed",
        version,
        cuda,
        tuple(gpus),
        archs,
        "probed" if gpus else None,
        reason="; ".join(reasons) or None,
        notes=tuple(notes),
    )


def _newer_libcuda(files: DriverFiles, driver_version: str, notes: list[str]) -> str | None:
    """Without /proc (containers), compare libcuda's file-name version with the driver NVML reports."""
    libcuda_version = files.libcuda_version
    if not libcuda_version or libcuda_version == driver_version:
        return None
    try:
        newer = parse_driver(libcuda_version) > parse_driver(driver_version)
    except OptionError:
        return None
    if not newer:
        return None
    rule = compat.load_compat().forward_compat_rule if _data_ok() else ""
    notes.append(
        f"forward-compatibility libcuda {libcuda_version} ({files.libcuda}) is newer than the driver "
        f"{driver_version} NVML reports: {rule}"
    )
    return libcuda_version


def _probe_gpu(nvml: Any, index: int, notes: list[str]) -> Gpu | None:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as e:
        notes.append(nvml_reason(f"nvmlDeviceGetHandleByIndex({index})", e))
        return None

    def ask(call: str, fn: Callable[[], Any], quiet_not_supported: bool = False) -> Any:
        try:
            return fn()
        except Exception as e:
            if not (quiet_not_supported and _error_code(e) == _NOT_SUPPORTED):
                notes.append(nvml_reason(f"{call}(GPU {index})", e))
            return None

    name = ask("nvmlDeviceGetName", lambda: nvml.nvmlDeviceGetName(handle))
    uuid = ask("nvmlDeviceGetUUID", lambda: nvml.nvmlDeviceGetUUID(handle))
    cc = ask("nvmlDeviceGetCudaComputeCapability", lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    memory = ask("nvmlDeviceGetMemoryInfo", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    mig = ask("nvmlDeviceGetMigMode", lambda: nvml.nvmlDeviceGetMigMode(handle), quiet_not_supported=True)
    compute = ""
    if cc is not None:
        try:
            compute = f"{int(cc[0])}.{int(cc[1])}"
        except (TypeError, ValueError, IndexError):
            notes.append(f"GPU {index}: unexpected compute capability {cc!r}")
    total = getattr(memory, "total", None) if memory is not None else None
    mig_mode = None
    if mig is not None:
        try:
            mig_mode = "enabled" if int(mig[0]) == 1 else "disabled"
        except (TypeError, ValueError, IndexError):
            mig_mode = None
    return Gpu(
        index=index,
        name=_text(name) if name is not None else f"GPU {index}",
        uuid=_text(uuid) if uuid is not None else None,
        compute_capability=compute,
        memory_total=int(total) if total is not None else None,
        mig_mode=mig_mode,
    )


# --------------------------------------------------------------------------------------------- declared


def declared_driver(
    version: str | None, archs: Sequence[str] | str = (), probed: DriverInfo | None = None
) -> DriverInfo:
    """The driver to evaluate against: ``version`` (``--cuda-driver``) replaces the probed driver (its CUDA
    version comes from the branch table); ``archs`` (``--cuda-arch``, "sm_86" or "sm_86,sm_90") replace the
    probed GPU list.  Whatever is not declared comes from ``probed`` (absent when None).

    A branch alone (``580``, ``R580``) is declared as version "580", with a note that its minor is unknown.
    Raises OptionError naming a bad version or arch.
    """
    base = probed if probed is not None else DriverInfo("absent", None, None, reason="driver not probed")
    declared_archs: tuple[str, ...] = ()
    if archs and (not isinstance(archs, str) or archs.strip()):
        declared_archs = tuple(str(a) for a in parse_arch_list(archs))
    if version is not None and str(version).strip() == "":
        version = None
    notes = list(base.notes)
    if version is None:
        if not declared_archs:
            return base
        return DriverInfo(
            base.source,
            base.version,
            base.cuda_version,
            (),
            declared_archs,
            "declared",
            base.reason,
            tuple(notes),
            base.libcuda,
            base.kernel_module,
            base.forward_compat,
        )
    parsed = parse_driver(version)
    cuda = compat.cuda_for_driver(parsed)
    notes = []  # the probed notes describe this machine, not the deployment target
    reason = None
    if cuda is None:
        reason = f"driver {parsed} is older than every branch in the compatibility data"
    elif compat.beyond_data(parsed):
        notes.append(f"declared driver {parsed} is newer than the compatibility data; CUDA {cuda} is a lower bound")
    if parsed.branch_only:
        notes.append(
            f"declared driver branch R{parsed.branch}: its minor version is unknown, so requires_driver is met only "
            f"when every {parsed.branch}.x meets it"
        )
    for row in compat.load_compat().branches:
        if row.unconfirmed and row.branch == parsed.branch:
            notes.append(f"R{parsed.branch} reportedly supports CUDA {row.cuda} (unconfirmed; not used)")
    if probed is not None and probed.present:
        notes.append(f"probed here: {probed.summary()}")
    return DriverInfo(
        "declared",
        str(parsed),
        str(cuda) if cuda is not None else None,
        () if declared_archs else base.gpus,
        declared_archs or base.archs,
        "declared" if declared_archs else base.arch_source,
        reason,
        tuple(notes),
    )
