"""driver.py: NVML probe (through the real nvidia-ml-py binding and a fake libnvidia-ml built here),
injected NVML modules, static driver files, declared targets; and the markers' predicates over them (markers.py)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pynvml
import pytest

from pytest_cudastack.cuda import driver as drv
from pytest_cudastack.cuda.compat import load_compat
from pytest_cudastack.cuda.driver import (
    NVML_LIBRARY_ENV,
    NVML_REASONS,
    DriverInfo,
    Gpu,
    declared_driver,
    driver_files,
    nvml_reason,
    parse_proc_version,
    probe_driver,
    probe_nvml,
)
from pytest_cudastack.errors import OptionError, RuleError
from pytest_cudastack.markers import cuda_satisfies, driver_satisfies, gpus_satisfy, parse_memory

FAKENVML_C = Path(__file__).parent / "helpers" / "fakenvml" / "fakenvml.c"
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
GiB = 2**30


@pytest.fixture(autouse=True)
def _clear_caches(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probe_nvml.cache_clear()
    load_compat.cache_clear()
    yield
    probe_nvml.cache_clear()


# --------------------------------------------------------------------------------------------- fake NVML (C)


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    out = tmp_path_factory.mktemp("fakenvml") / "libnvidia-ml.so.1"
    subprocess.run(
        ["cc", "-Wall", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(out), str(FAKENVML_C)],
        check=True,
        capture_output=True,
    )
    return out


_PROBE = (
    "import json; from pytest_cudastack.cuda.driver import probe_driver; print(json.dumps(probe_driver().to_json()))"
)


def run_probe(library: Path | str, **env: str) -> DriverInfo:
    """Probe in a child process: pynvml keeps its library handle in module globals, one per process."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAKENVML_") and k != "CUDA_VISIBLE_DEVICES"}
    environ[NVML_LIBRARY_ENV] = str(library)
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=environ, capture_output=True, text=True, check=True, timeout=60
    )
    return DriverInfo.from_json(json.loads(done.stdout.strip().splitlines()[-1]))


TWO_GPUS = "NVIDIA H100 80GB HBM3:9.0:80:mig;NVIDIA A10:8.6:24"


@needs_cc
def test_fake_nvml_full_probe(fake_nvml: Path):
    info = run_probe(fake_nvml, FAKENVML_DRIVER="550.54.15", FAKENVML_CUDA="12040", FAKENVML_GPUS=TWO_GPUS)
    assert info.source == "probed"
    assert info.version == "550.54.15"
    assert info.cuda_version == "12.4"
    assert info.reason is None
    assert info.archs == ("sm_90", "sm_86")
    assert info.arch_source == "probed"
    h100, a10 = info.gpus
    assert h100 == Gpu(
        0, "NVIDIA H100 80GB HBM3", "GPU-00000000-0000-0000-0000-000000000000", "9.0", 80 * GiB, "enabled"
    )
    assert (a10.name, a10.compute_capability, a10.memory_total, a10.mig_mode) == ("NVIDIA A10", "8.6", 24 * GiB, None)
    assert any(NVML_LIBRARY_ENV in note for note in info.notes)


@needs_cc
def test_fake_nvml_cuda_13_driver(fake_nvml: Path):
    info = run_probe(fake_nvml, FAKENVML_DRIVER="580.95.05", FAKENVML_CUDA="13000", FAKENVML_GPUS="Tesla V100:7.0:32")
    assert (info.version, info.cuda_version, info.archs) == ("580.95.05", "13.0", ("sm_70",))


@needs_cc
def test_fake_nvml_cuda_visible_devices(fake_nvml: Path):
    info = run_probe(fake_nvml, FAKENVML_GPUS=TWO_GPUS, CUDA_VISIBLE_DEVICES="1")
    assert [g.name for g in info.gpus] == ["NVIDIA A10"]
    assert info.archs == ("sm_86",)
    assert "CUDA_VISIBLE_DEVICES=1: 1 of 2 GPUs visible" in info.notes


H100 = Gpu(0, "H100", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "9.0", None, None)
A10 = Gpu(1, "A10", "GPU-11112222-d72c-4106-c12f-20bd9faed9f6", "8.6", None, None)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (None, ["H100", "A10"]),
        ("", []),
        ("0", ["H100"]),
        ("1,0", ["A10", "H100"]),
        ("GPU-1111", ["A10"]),
        ("0,7,1", ["H100"]),  # CUDA stops at the first invalid entry
        ("-1", []),
        ("MIG-abcd", ["H100", "A10"]),
    ],
)
def test_visible_gpus(value: str | None, names: list[str]):
    assert [g.name for g in drv.visible_gpus((H100, A10), value)] == names


@needs_cc
def test_fake_nvml_no_gpu(fake_nvml: Path):
    info = run_probe(fake_nvml, FAKENVML_GPUS="")
    assert info.source == "probed"
    assert info.gpus == ()
    assert info.arch_source is None
    assert "NVML sees no GPU" in info.notes


# every NVML failure is a reason (or a note), never an exception
@needs_cc
@pytest.mark.parametrize(
    ("env", "source", "field", "text"),
    [
        pytest.param(
            {"FAKENVML_FAIL_INIT": "9"},
            "absent",
            "reason",
            "nvmlInit: the NVIDIA kernel driver is not loaded (NVML_ERROR_DRIVER_NOT_LOADED)",
            id="driver not loaded",
        ),
        pytest.param(
            {"FAKENVML_FAIL_INIT": "4"},
            "absent",
            "reason",
            "no permission to access the NVIDIA devices (/dev/nvidia*) (NVML_ERROR_NO_PERMISSION)",
            id="no permission",
        ),
        pytest.param(
            {"FAKENVML_FAIL_INIT": "12"}, "absent", "reason", "(NVML_ERROR_LIBRARY_NOT_FOUND)", id="library not found"
        ),
        pytest.param(
            {"FAKENVML_FAIL_INIT": "18"}, "absent", "reason", "NVML_ERROR_LIB_RM_VERSION_MISMATCH", id="rm mismatch"
        ),
        pytest.param(
            {"FAKENVML_FAIL_INIT": "999"}, "absent", "reason", "unknown NVML error (NVML_ERROR_UNKNOWN)", id="unknown"
        ),
        pytest.param(
            {"FAKENVML_FAIL_INIT": "77"},
            "absent",
            "reason",
            "nvmlInit: fake NVML error 77 (NVML error 77)",
            id="unlisted code uses nvmlErrorString",
        ),
        pytest.param(
            {"FAKENVML_DRIVER": "5" * 100},
            "probed",
            "reason",
            "nvmlSystemGetDriverVersion: NVML reported an insufficient buffer size (NVML_ERROR_INSUFFICIENT_SIZE)",
            id="insufficient size",
        ),
        pytest.param(
            {"FAKENVML_FAIL_CUDA_V2": "12"},
            "probed",
            "notes",
            "nvmlSystemGetCudaDriverVersion_v2: NVML could not load libcuda.so.1",
            id="v2 fails, v1 used",
        ),
        pytest.param(
            {"FAKENVML_FAIL_CUDA_V2": "12", "FAKENVML_FAIL_CUDA_V1": "12"},
            "probed",
            "notes",
            "CUDA version 12.4 taken from the driver branch table for 550.54.15",
            id="both fail: table",
        ),
        pytest.param(
            {"FAKENVML_FAIL_CUDA_V2": "12", "FAKENVML_FAIL_CUDA_V1": "12"},
            "probed",
            "reason",
            "nvmlSystemGetCudaDriverVersion_v2: NVML could not load libcuda.so.1",
            id="both fail: reason",
        ),
        pytest.param(
            {"FAKENVML_FAIL_COUNT": "15"},
            "probed",
            "reason",
            "nvmlDeviceGetCount: a GPU has fallen off the bus",
            id="gpu lost",
        ),
        pytest.param(
            {"FAKENVML_FAIL_HANDLE": "4"},
            "probed",
            "notes",
            "nvmlDeviceGetHandleByIndex(0): no permission",
            id="handle",
        ),
        pytest.param(
            {"FAKENVML_FAIL_CC": "3"},
            "probed",
            "notes",
            "nvmlDeviceGetCudaComputeCapability(GPU 0): not supported",
            id="cc not supported",
        ),
        pytest.param({"FAKENVML_FAIL_NAME": "999"}, "probed", "notes", "nvmlDeviceGetName(GPU 0): unknown", id="name"),
        pytest.param(
            {"FAKENVML_FAIL_MEMORY": "2"}, "probed", "notes", "nvmlDeviceGetMemoryInfo(GPU 0): invalid", id="memory"
        ),
        pytest.param(
            {"FAKENVML_FAIL_MIG": "4"}, "probed", "notes", "nvmlDeviceGetMigMode(GPU 0): no permission", id="mig"
        ),
        pytest.param({"FAKENVML_FAIL_SHUTDOWN": "999"}, "probed", "reason", None, id="shutdown failure ignored"),
    ],
)
def test_fake_nvml_failures(fake_nvml: Path, env: dict[str, str], source: str, field: str, text: str | None):
    info = run_probe(fake_nvml, FAKENVML_GPUS="NVIDIA A10:8.6:24", **env)
    assert info.source == source
    if text is None:
        assert info.reason is None
        return
    value = info.reason if field == "reason" else " | ".join(info.notes)
    assert value is not None
    assert text in value


@needs_cc
def test_fake_nvml_partial_gpu_facts(fake_nvml: Path):
    info = run_probe(
        fake_nvml,
        FAKENVML_GPUS="NVIDIA A10:8.6:24",
        FAKENVML_FAIL_CC="3",
        FAKENVML_FAIL_NAME="3",
        FAKENVML_FAIL_UUID="3",
    )
    (gpu,) = info.gpus
    assert (gpu.name, gpu.uuid, gpu.compute_capability, gpu.arch) == ("GPU 0", None, "", None)
    assert info.archs == ()


def test_nvml_absent_library(tmp_path: Path):
    info = run_probe(tmp_path / "nonexistent" / "libnvidia-ml.so.1")
    assert info.source == "absent"
    assert info.version is None
    assert info.reason is not None
    assert "could not be loaded" in info.reason
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in info.reason


def test_probe_keeps_nvml_out_of_this_process(fake_nvml: Path):
    code = (
        "from pytest_cudastack.cuda.driver import probe_driver; info = probe_driver(); "
        "maps = open('/proc/self/maps').read(); "
        "print(info.version, 'libnvidia-ml' in maps or 'libcuda.so' in maps)"
    )
    environ = dict(os.environ, **{NVML_LIBRARY_ENV: str(fake_nvml), "FAKENVML_GPUS": TWO_GPUS})
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "550.54.15 False"


@pytest.mark.parametrize(
    ("code", "timeout", "text"),
    [
        pytest.param("import time; time.sleep(30)", 0.5, "did not finish within 0.5 s", id="hang"),
        pytest.param("import sys; sys.exit('NVML exploded')", 30, "exited 1: NVML exploded", id="exit"),
        pytest.param(
            "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", 30, "died from signal 11", id="segfault"
        ),
        pytest.param("print('not json')", 30, "unreadable output", id="garbage"),
        pytest.param("pass", 30, "exited 0: no output", id="silent"),
    ],
)
def test_probe_child_failures_are_reasons(monkeypatch: pytest.MonkeyPatch, code: str, timeout: float, text: str):
    monkeypatch.setattr(drv, "_CHILD_CODE", code)
    monkeypatch.setattr(drv, "PROBE_TIMEOUT_S", timeout)
    monkeypatch.setattr(drv, "driver_files", lambda find=None, root="/": drv.DriverFiles())
    info = drv._nvml_facts_in_child(timeout)
    assert info.source == "absent"
    assert info.reason is not None
    assert text in info.reason
    combined = probe_driver()
    assert combined.source == "absent"
    assert combined.reason is not None
    assert text in combined.reason


# --------------------------------------------------------------------------------------------- injected NVML


class FakeNvml:
    """A pynvml stand-in; ``fail`` maps a function name to an NVML error code (raised as pynvml.NVMLError)."""

    def __init__(
        self,
        gpus: list[tuple[str, tuple[int, int], int]] | None = None,
        fail: dict[str, Any] | None = None,
        driver: Any = "535.104.05",
        cuda: int = 12020,
    ) -> None:
        self.gpus = gpus if gpus is not None else [("NVIDIA A100-SXM4-40GB", (8, 0), 40 * GiB)]
        self.fail = fail or {}
        self.driver = driver
        self.cuda = cuda
        self.calls: list[str] = []

    def _check(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            error = self.fail[name]
            raise error if isinstance(error, BaseException) else pynvml.NVMLError(error)

    def nvmlInit(self) -> None:
        self._check("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> Any:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        self._check("nvmlDeviceGetName")
        return self.gpus[handle][0].encode()

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._check("nvmlDeviceGetUUID")
        return f"GPU-{handle}"

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability")
        return self.gpus[handle][1]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._check("nvmlDeviceGetMemoryInfo")
        return type("Mem", (), {"total": self.gpus[handle][2]})()

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        self._check("nvmlDeviceGetMigMode")
        return [0, 0]


def test_injected_nvml_probe():
    nvml = FakeNvml(driver=b"535.104.05")
    info = probe_driver(nvml)
    assert (info.source, info.version, info.cuda_version) == ("probed", "535.104.05", "12.2")
    (gpu,) = info.gpus
    assert gpu == Gpu(0, "NVIDIA A100-SXM4-40GB", "GPU-0", "8.0", 40 * GiB, "disabled")
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls[-1] == "nvmlShutdown"


def test_probe_is_cached():
    nvml = FakeNvml()
    first = probe_driver(nvml)
    assert probe_driver(nvml) == first
    assert nvml.calls.count("nvmlInit") == 1


def test_stacks_ask_nvml_once_and_the_cache_keeps_no_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Stack hands the probe a finder over its own resolver: NVML is still asked once per process, and
    no resolver outlives its Stack in the probe's cache (the cache was keyed on the per-Stack finder)."""
    from pytest_cudastack import stack as stack_mod
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.linker.resolver import Resolver
    from pytest_cudastack.settings import Settings

    asked: list[int] = []

    def child() -> DriverInfo:
        asked.append(1)
        return DriverInfo("absent", None, None, reason="no NVML in this test")

    monkeypatch.setattr(drv, "_nvml_facts_in_child", child)
    resolvers: list[weakref.ref[Resolver]] = []

    def recording(*args: Any, **kwargs: Any) -> Resolver:
        resolver = Resolver(*args, **kwargs)
        resolvers.append(weakref.ref(resolver))
        return resolver

    monkeypatch.setattr(stack_mod, "Resolver", recording)
    for _ in range(2):
        stack = stack_mod.Stack(Settings(), probe=lambda: None, cache=ElfCache(enabled=False))
        assert any(n.startswith("libcuda.so.1") for n in stack.driver.notes)  # the stack's finder ran
        del stack
    gc.collect()
    assert len(asked) == 1
    assert len(resolvers) == 2
    assert [r() for r in resolvers] == [None, None]


@pytest.mark.parametrize("code", sorted(NVML_REASONS), ids=[f"code {c}" for c in sorted(NVML_REASONS)])
def test_every_nvml_error_code_is_a_reason(code: int):
    info = probe_driver(FakeNvml(fail={"nvmlInit": code}))
    assert info.source == "absent"
    assert info.reason == nvml_reason("nvmlInit", pynvml.NVMLError(code))
    assert NVML_REASONS[code] in info.reason


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (RuntimeError("boom"), "nvmlInit: RuntimeError: boom"),
        (OSError("libnvidia-ml.so.1: cannot open"), "nvmlInit: OSError: libnvidia-ml.so.1: cannot open"),
        (pynvml.NVMLError_LibraryNotFound(), "NVML_ERROR_LIBRARY_NOT_FOUND"),
    ],
)
def test_non_nvml_exceptions_become_reasons(error: BaseException, text: str):
    info = probe_driver(FakeNvml(fail={"nvmlInit": error}))
    assert info.reason is not None
    assert text in info.reason


def test_mig_not_supported_is_quiet():
    info = probe_driver(FakeNvml(fail={"nvmlDeviceGetMigMode": 3}))
    assert info.gpus[0].mig_mode is None
    assert not any("MigMode" in n for n in info.notes)


def test_broken_module_never_raises():
    info = probe_driver(object())  # no nvml functions at all
    assert info.source == "absent"
    assert info.reason is not None
    assert "AttributeError" in info.reason


def test_nvml_failure_falls_back_to_kernel_module(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(
        drv, "driver_files", lambda find=None, root="/": drv.DriverFiles(kernel_module="570.124.06", notes=("k",))
    )
    info = probe_driver(FakeNvml(fail={"nvmlInit": 4}))
    assert (info.source, info.version, info.cuda_version) == ("probed", "570.124.06", "12.8")
    assert info.reason is not None
    assert "NVML_ERROR_NO_PERMISSION" in info.reason


# --------------------------------------------------------------------------------------------- static files


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            "550.54.15",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)\n",
            "580.95.05",
        ),
        ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.104.05  Sat Aug 19 01:13:15 UTC 2023", "535.104.05"),
        ("garbage", None),
    ],
)
def test_parse_proc_version(text: str, version: str | None):
    assert parse_proc_version(text) == version


def _finder(mapping: dict[str, tuple[str | None, str | None]]):
    return lambda soname: mapping.get(soname, (None, None))


def _proc_root(tmp_path: Path, text: str) -> str:
    """A fake root whose /proc/driver/nvidia/version holds ``text``."""
    proc = tmp_path / "proc" / "driver" / "nvidia" / "version"
    proc.parent.mkdir(parents=True, exist_ok=True)
    proc.write_text(text)
    return str(tmp_path)


def test_driver_files_forward_compat(tmp_path: Path):
    root = _proc_root(
        tmp_path, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    )
    files = driver_files(
        _finder(
            {
                "libcuda.so.1": (
                    "/usr/local/cuda-13.0/compat/libcuda.so.1",
                    "/usr/local/cuda-13.0/compat/libcuda.so.580.65.06",
                ),
                "libnvidia-ml.so.1": (
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15",
                ),
            }
        ),
        root,
    )
    assert (files.libcuda_version, files.nvml_version, files.kernel_module) == ("580.65.06", "550.54.15", "550.54.15")
    assert files.forward_compat == "580.65.06"
    text = " | ".join(files.notes)
    assert "forward-compatibility libcuda 580.65.06" in text
    assert "data-center GPUs" in text
    assert "not GeForce" in text


def test_driver_files_older_libcuda(tmp_path: Path):
    root = _proc_root(tmp_path, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  x\n")
    files = driver_files(_finder({"libcuda.so.1": ("/c/libcuda.so.1", "/c/libcuda.so.570.124.06")}), root)
    assert files.forward_compat is None
    assert any("older than the kernel module" in n for n in files.notes)


def test_driver_files_nothing_here(tmp_path: Path):
    files = driver_files(_finder({}), str(tmp_path / "missing"))
    assert files == drv.DriverFiles(
        notes=("libcuda.so.1: not found by the linker search", "libnvidia-ml.so.1: not found by the linker search")
    )


def test_driver_files_resolver_error_is_a_note(tmp_path: Path):
    def boom(soname: str) -> tuple[str | None, str | None]:
        raise RuntimeError("resolver broke")

    files = driver_files(boom, str(tmp_path / "missing"))
    assert any("could not resolve (resolver broke)" in n for n in files.notes)


def test_driver_files_never_blocks_on_a_fifo(tmp_path: Path):
    fifo = tmp_path / "proc" / "driver" / "nvidia" / "version"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    assert driver_files(_finder({}), str(tmp_path)).kernel_module is None


# --------------------------------------------------------------------------------------------- declared


PROBED = DriverInfo(
    "probed",
    "580.95.05",
    "13.0",
    (Gpu(0, "NVIDIA H100", "GPU-1", "9.0", 80 * GiB, "disabled"),),
    ("sm_90",),
    "probed",
    None,
    ("libcuda.so.1: /usr/lib/libcuda.so.1",),
)


@pytest.mark.parametrize(
    ("version", "archs", "probed", "expected"),
    [
        pytest.param("550.54.15", (), None, ("declared", "550.54.15", "12.4", (), None), id="driver only"),
        pytest.param("550", (), None, ("declared", "550", "12.4", (), None), id="branch only"),
        pytest.param("565.57.01", (), None, ("declared", "565.57.01", "12.7", (), None), id="R565 -> 12.7"),
        pytest.param("R580", (), None, ("declared", "580", "13.0", (), None), id="R580 spelling"),
        pytest.param(" 450.80.02 ", (), None, ("declared", "450.80.02", "11.0", (), None), id="kept as written"),
        pytest.param(
            "550.54.15", "sm_86", None, ("declared", "550.54.15", "12.4", ("sm_86",), "declared"), id="driver and arch"
        ),
        pytest.param(
            "550.54.15",
            ["sm_86,sm_90", "8.0"],
            None,
            ("declared", "550.54.15", "12.4", ("sm_86", "sm_90", "sm_80"), "declared"),
            id="arch list",
        ),
        pytest.param(
            "550.54.15",
            (),
            PROBED,
            ("declared", "550.54.15", "12.4", ("sm_90",), "probed"),
            id="driver declared, GPUs probed",
        ),
        pytest.param(
            None,
            "sm_86",
            PROBED,
            ("probed", "580.95.05", "13.0", ("sm_86",), "declared"),
            id="arch declared, driver probed",
        ),
        pytest.param(None, (), PROBED, ("probed", "580.95.05", "13.0", ("sm_90",), "probed"), id="nothing declared"),
        pytest.param("", (), None, ("absent", None, None, (), None), id="empty string is not declared"),
    ],
)
def test_declared_driver(version: str | None, archs: Any, probed: DriverInfo | None, expected: tuple[Any, ...]):
    info = declared_driver(version, archs, probed)
    assert (info.source, info.version, info.cuda_version, info.archs, info.arch_source) == expected
    if info.arch_source == "declared":
        assert info.gpus == ()


def test_declared_driver_mentions_the_probe():
    info = declared_driver("550.54.15", (), PROBED)
    assert "probed here: driver 580.95.05 (CUDA 13.0, probed)" in info.notes
    assert info.gpus == PROBED.gpus


def test_declared_branch_notes_its_unknown_minor():
    info = declared_driver("R575")
    assert (info.version, info.cuda_version) == ("575", "12.9")
    assert any("declared driver branch R575: its minor version is unknown" in n for n in info.notes)
    assert not any("minor version" in n for n in declared_driver("575.57.08").notes)


@pytest.mark.parametrize(
    ("archs", "declared"),
    [
        pytest.param("sm_100f", ("sm_100f",), id="family-specific"),
        pytest.param("compute_80", ("sm_80",), id="compute"),
        pytest.param(("sm_90", "9.0", "sm_90a"), ("sm_90", "sm_90a"), id="deduplicated"),
    ],
)
def test_declared_archs_normalised(archs: Any, declared: tuple[str, ...]):
    assert declared_driver(None, archs).archs == declared


def test_declared_unconfirmed_branch_noted():
    info = declared_driver("615.71.09")
    assert info.cuda_version == "13.3"
    assert any("unconfirmed" in n for n in info.notes)


def test_declared_ancient_driver_has_reason():
    info = declared_driver("390.1")
    assert info.cuda_version is None
    assert info.reason is not None
    assert "older than every branch" in info.reason


@pytest.mark.parametrize("bad", ["five-fifty", "550.x", "55", "550.54.15.1.2", "v550", "-550", "12.9.1", "R580.65"])
def test_declared_bad_driver_version(bad: str):
    with pytest.raises(OptionError, match="invalid NVIDIA driver version") as info:
        declared_driver(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", ["sm86x", "ampere", "sm_", "sm_9", "sm_8", "sm_86,volta"])
def test_declared_bad_arch(bad: str):
    with pytest.raises(OptionError, match="invalid GPU architecture"):
        declared_driver("550.54.15", bad)


def test_driver_info_json_round_trip():
    info = PROBED
    assert DriverInfo.from_json(json.loads(json.dumps(info.to_json()))) == info
    declared = declared_driver("550.54.15", "sm_86", PROBED)
    assert DriverInfo.from_json(declared.to_json()) == declared
    assert DriverInfo.from_json({}) == DriverInfo("absent", None, None)


def test_summary():
    assert PROBED.summary() == "driver 580.95.05 (CUDA 13.0, probed)"
    assert DriverInfo("absent", None, None, reason="no NVML").summary() == "no driver (no NVML)"


# --------------------------------------------------------------------------------------------- markers

D535 = declared_driver("535.104.05")
ABSENT = DriverInfo("absent", None, None, reason="nvmlInit: the NVIDIA kernel driver is not loaded")


@pytest.mark.parametrize(
    ("spec", "driver", "ok", "reason"),
    [
        (">=550", declared_driver("550.54.15"), True, "driver 550.54.15 (declared); requires >=550"),
        (">=550", D535, False, "driver 535.104.05 (declared); requires >=550"),
        ("550", D535, False, "requires >=550"),
        (">=535.104", D535, True, ""),
        ("==535.*", D535, True, ""),
        ("<580", PROBED, False, "driver 580.95.05 (probed); requires <580"),
        (">=550", ABSENT, False, "no driver (nvmlInit: the NVIDIA kernel driver is not loaded); requires driver >=550"),
    ],
)
def test_driver_satisfies(spec: str, driver: DriverInfo, ok: bool, reason: str):
    result = driver_satisfies(spec, driver)
    assert result[0] is ok
    assert reason in result[1]


R580 = declared_driver("R580")


@pytest.mark.parametrize(
    ("spec", "ok", "reason"),
    [
        pytest.param(">=550", True, "driver branch R580 (declared); requires >=550", id="older floor"),
        pytest.param(">=580", True, "", id="the branch itself"),
        pytest.param("R580", True, "", id="bare R branch"),
        pytest.param("==580.*", True, "", id="branch wildcard"),
        pytest.param("~=580.0", True, "", id="compatible release of the branch"),
        pytest.param(">=550,<590", True, "", id="range around the branch"),
        pytest.param("<580", False, "driver branch R580 (declared); requires <580", id="below the branch"),
        pytest.param(">=590", False, "requires >=590", id="newer branch"),
        pytest.param("!=580.*", False, "", id="not the branch"),
        pytest.param(">=580.65", False, "minor version unknown: cannot tell whether it meets >=580.65", id="minor"),
        pytest.param("!=580.65.06", False, "minor version unknown", id="one driver of the branch"),
        pytest.param("==580.95.*", False, "minor version unknown", id="minor wildcard"),
        pytest.param(">=550,<580.65", False, "minor version unknown", id="range ending inside"),
        pytest.param(">=590,<580.65", False, "requires <580.65,>=590", id="a false clause decides"),
    ],
)
def test_driver_satisfies_a_declared_branch(spec: str, ok: bool, reason: str):
    """--cuda-driver=R580: met when every 580.x meets the spec, unmet (minor unknown) when only some do."""
    assert (R580.version, R580.cuda_version) == ("580", "13.0")
    result = driver_satisfies(spec, R580)
    assert result[0] is ok, result[1]
    assert reason in result[1]


@pytest.mark.parametrize(
    ("spec", "driver", "ok", "reason"),
    [
        (">=12.4", D535, False, "driver 535.104.05 (declared) supports CUDA <= 12.2; requires >=12.4"),
        (">=12.0", D535, True, ""),
        ("12.2", D535, True, ""),
        (">=13", PROBED, True, "driver 580.95.05 (probed) supports CUDA <= 13.0; requires >=13"),
        (">=12.4", ABSENT, False, "CUDA version unknown"),
    ],
)
def test_cuda_satisfies(spec: str, driver: DriverInfo, ok: bool, reason: str):
    result = cuda_satisfies(spec, driver)
    assert result[0] is ok
    assert reason in result[1]


@pytest.mark.parametrize("bad", ["", "=>550", "~~12", ">=twelve", "===550", "v550"])
def test_bad_specs_raise_rule_error(bad: str):
    with pytest.raises(RuleError):
        driver_satisfies(bad, D535)
    with pytest.raises(RuleError):
        cuda_satisfies(bad, D535)


TWO = DriverInfo(
    "probed",
    "580.95.05",
    "13.0",
    (
        Gpu(0, "Tesla T4", None, "7.5", 15 * GiB, None),
        Gpu(1, "NVIDIA H100 80GB HBM3", None, "9.0", 81559 * 2**20, "disabled"),
    ),
    ("sm_75", "sm_90"),
    "probed",
)
DECLARED_86 = declared_driver("550.54.15", "sm_86")


@pytest.mark.parametrize(
    ("kwargs", "driver", "ok", "reason"),
    [
        ({}, TWO, True, "2 of 2 GPUs (probed) match"),
        ({"count": 2}, TWO, True, ""),
        ({"count": 3}, TWO, False, "requires 3 GPUs"),
        ({"arch": ">=8.0"}, TWO, True, "1 of 2 GPUs (probed) match"),
        ({"arch": ">=8.0", "count": 2}, TWO, False, "requires 2 GPUs, arch >=8.0"),
        ({"arch": "sm_90"}, TWO, True, ""),
        ({"arch": "sm_80,sm_86"}, TWO, False, "arch sm_80,sm_86"),
        ({"arch": "7.5"}, TWO, True, ""),
        ({"arch": ">=sm_80"}, TWO, True, "1 of 2 GPUs (probed) match"),
        ({"arch": "==9.*"}, TWO, True, "arch ==9.*"),
        ({"arch": "sm_90a"}, TWO, True, ""),  # the suffix does not change the compute capability
        ({"arch": ">=sm_100"}, DECLARED_86, False, "arch >=10.0"),
        ({"arch": "sm_86"}, declared_driver(None, "sm_86a,sm_90"), True, "declared archs sm_86a,sm_90"),
        ({"memory": "80GB"}, TWO, True, ""),  # an 80 GB H100 reports 79.6 GiB
        ({"memory": "80GiB"}, TWO, False, "memory >= 80.0 GiB"),
        ({"memory": 17 * 10**9, "count": 2}, TWO, False, "1 of 2 GPUs"),
        ({"arch": ">=8.0"}, DECLARED_86, True, "declared archs sm_86"),
        ({"arch": "sm_90"}, DECLARED_86, False, "declared archs sm_86; requires 1 GPU, arch sm_90"),
        ({"count": 2}, DECLARED_86, False, "GPU count unknown"),
        ({"memory": "40GiB"}, DECLARED_86, False, "GPU memory unknown"),
        ({}, ABSENT, False, "no GPU (nvmlInit: the NVIDIA kernel driver is not loaded); requires 1 GPU"),
        ({"count": 0}, ABSENT, True, ""),
    ],
)
def test_gpus_satisfy(kwargs: dict[str, Any], driver: DriverInfo, ok: bool, reason: str):
    result = gpus_satisfy(driver=driver, **kwargs)
    assert result[0] is ok, result[1]
    assert reason in result[1]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"count": -1},
        {"count": True},
        {"count": "2"},
        {"arch": "volta"},
        {"arch": ">=eight"},
        {"arch": ">=8"},
        {"arch": "sm_9"},
        {"arch": ""},
        {"memory": "lots"},
        {"memory": -5},
        {"memory": "40XB"},
    ],
)
def test_gpus_satisfy_bad_arguments(kwargs: dict[str, Any]):
    with pytest.raises(RuleError):
        gpus_satisfy(driver=TWO, **kwargs)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, 1024),
        ("40GiB", 40 * GiB),
        ("40Gi", 40 * GiB),
        ("80GB", 80 * 10**9),
        ("80G", 80 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5 TiB", int(1.5 * 2**40)),
        ("100", 100),
        ("16gb", 16 * 10**9),
    ],
)
def test_parse_memory(value: int | str, expected: int):
    assert parse_memory(value) == expected


# --------------------------------------------------------------------------------------------- real GPU


@pytest.mark.gpu
def test_real_gpu_probe():
    info = probe_driver()
    if info.source == "absent" or "nvmlInit" in (info.reason or ""):
        pytest.skip(f"NVML cannot initialise here: {info.reason}")
    assert info.source == "probed"
    assert info.version
    assert info.cuda_version
    assert len(info.gpus) >= 1
    for gpu in info.gpus:
        assert gpu.compute_capability
        assert gpu.arch is not None
        assert gpu.memory_total


def test_forward_compat_without_proc(monkeypatch: pytest.MonkeyPatch):
    files = drv.DriverFiles(
        libcuda="/usr/local/cuda-13.0/compat/libcuda.so.1", libcuda_version="580.65.06", notes=("libcuda",)
    )
    monkeypatch.setattr(drv, "driver_files", lambda find=None, root="/": files)
    info = probe_driver(FakeNvml(driver="550.54.15", cuda=13000))
    assert info.forward_compat == "580.65.06"
    assert any("forward-compatibility libcuda 580.65.06" in n for n in info.notes)


def test_import_is_lazy():
    code = "import sys, pytest_cudastack.cuda.driver, pytest_cudastack.cuda.compat; print('pynvml' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
