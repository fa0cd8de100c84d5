"""Wheel-wide arch coverage (issue #13): nvcc-built kernels registered as wheels, the stack's CUDA major against
each target GPU, PTX ISA against the driver, fixes that name the package variant, the data file's validation.

nvcc fixtures skip without nvcc (this machine has CUDA 13.0's). The real tier reads the torch venv's own
kernels ($CUDASTACK_TORCH_VENV).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack.checks.arch import arch_findings, stack_cuda_major, summarize, wheel_arch_findings
from pytest_cudastack.cuda.compat import min_driver_for_cuda
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.cuda.gpucode import load_gpu_code, ptx_isa_cuda, validate_gpu_code, variants_for
from pytest_cudastack.errors import DataError, ElfError
from pytest_cudastack.findings import DriverUpgrade, Finding, Rebuild, Severity, UseBuild
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.fatbin import CONTAINER_MAGIC, FatbinEntry, read_fatbin
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import site_packages, write_dist

KERNEL = "__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n"
SO = ("-shared", "-Xcompiler", "-fPIC")

# name -> nvcc arguments after the source
BUILDS: dict[str, tuple[str, ...]] = {
    "sm80": ("-gencode", "arch=compute_80,code=sm_80"),
    "sm80ptx": ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_80,code=compute_80"),
    "sm80_90": ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"),
    "sm90a": ("-gencode", "arch=compute_90a,code=sm_90a"),
    "sm100f": ("-gencode", "arch=compute_100f,code=sm_100f"),
    "compressed": ("-gencode", "arch=compute_80,code=compute_80", "-Xfatbin", "-compress-all"),
    "plainptx": ("-gencode", "arch=compute_80,code=compute_80", "-Xfatbin", "-compress=false"),
}


def _patch_ptx_version(data: bytes, new: bytes) -> bytes:
    old = b".version 9.0"
    assert data.count(old) == 1, "expected one uncompressed PTX text of ISA 9.0"
    return data.replace(old, new)


def _ptx_headers(data: bytes) -> list[int]:
    """Offsets of the PTX entry headers of every container in ``data``."""
    out = []
    magic = struct.pack("<I", CONTAINER_MAGIC)
    pos = data.find(magic)
    while pos != -1:
        _m, _v, header, size = struct.unpack_from("<IHHQ", data, pos)
        q, end = pos + header, pos + header + size
        while q + 0x40 <= end:
            kind, _ev, entry_header, padded = struct.unpack_from("<HHIQ", data, q)
            if kind == 1:
                out.append(q)
            q += entry_header + padded
        pos = data.find(magic, end)
    return out


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    tmp = tmp_path_factory.mktemp("kernels")
    (tmp / "k.cu").write_text(KERNEL)
    (tmp / "empty.cu").write_text("__device__ int counter;\n")
    out: dict[str, bytes] = {}
    for name, args in BUILDS.items():
        lib = tmp / f"lib{name}.so"
        subprocess.run(["nvcc", *SO, "-o", str(lib), str(tmp / "k.cu"), *args], check=True, capture_output=True)
        out[name] = lib.read_bytes()
    lib = tmp / "libempty.so"
    subprocess.run(
        ["nvcc", *SO, "-o", str(lib), str(tmp / "empty.cu"), *BUILDS["sm80"], "-Xfatbin", "-compress=false"],
        check=True,
        capture_output=True,
    )
    out["empty"] = lib.read_bytes()
    out["newptx"] = _patch_ptx_version(out["plainptx"], b".version 9.5")
    header_patched = bytearray(out["compressed"])
    for q in _ptx_headers(out["compressed"]):
        struct.pack_into("<HH", header_patched, q + 0x18, 5, 9)  # minor, major: PTX ISA 9.5
    out["newheader"] = bytes(header_patched)
    return out


def _write(tmp: Path, name: str, data: bytes) -> str:
    path = tmp / name
    path.write_bytes(data)
    return str(path)


# --- fatbin facts ---------------------------------------------------------------------------------------


def test_ptx_isa_from_the_entry_header_of_a_compressed_text(kernels: dict[str, bytes], tmp_path: Path) -> None:
    fat = read_fatbin(_write(tmp_path, "libc.so", kernels["compressed"]))
    (ptx,) = fat.entries
    assert (ptx.kind, ptx.compression, ptx.ptx_isa) == ("ptx", "zstd", "9.0")
    fat = read_fatbin(_write(tmp_path, "libh.so", kernels["newheader"]))
    assert {e.ptx_isa for e in fat.entries} == {"9.5"}  # the header answers; nothing is decompressed


def test_ptx_isa_from_the_text_of_an_uncompressed_entry(kernels: dict[str, bytes], tmp_path: Path) -> None:
    (plain,) = read_fatbin(_write(tmp_path, "libp.so", kernels["plainptx"])).entries
    assert (plain.compression, plain.ptx_isa) == (None, "9.0")
    # the JIT reads the text, so the text wins over a header that still says 9.0
    (patched,) = read_fatbin(_write(tmp_path, "libn.so", kernels["newptx"])).entries
    assert patched.ptx_isa == "9.5"


def test_compressed_text_without_a_header_version_is_unknown(kernels: dict[str, bytes], tmp_path: Path) -> None:
    data = bytearray(kernels["compressed"])
    for q in _ptx_headers(kernels["compressed"]):
        struct.pack_into("<HH", data, q + 0x18, 0, 0)
    (ptx,) = read_fatbin(_write(tmp_path, "libz.so", bytes(data))).entries
    assert ptx.ptx_isa is None


def test_a_cubin_without_kernels_is_no_gpu_code(kernels: dict[str, bytes], tmp_path: Path) -> None:
    # cuFFTW 12 ships such an sm_75 image; it must not fail every other arch
    assert read_fatbin(_write(tmp_path, "libempty.so", kernels["empty"])).entries == ()
    assert read_fatbin(_write(tmp_path, "libsm80.so", kernels["sm80"])).sass == ("sm_80",)


def test_entries_are_distinct(kernels: dict[str, bytes], tmp_path: Path) -> None:
    fat = read_fatbin(_write(tmp_path, "lib.so", kernels["sm80ptx"]))
    assert len(fat.entries) == len(set(fat.entries))


def test_fatbin_facts_are_cached_and_validated(kernels: dict[str, bytes], tmp_path: Path) -> None:
    path = _write(tmp_path, "libk.so", kernels["sm80ptx"])
    cold = ElfCache(str(tmp_path / "cache"), enabled=True)
    first = cold.fatbin(path)
    cold.flush()
    warm = ElfCache(str(tmp_path / "cache"), enabled=True)
    assert warm.fatbin(path) == first
    assert (warm.hits, warm.misses) == (1, 0)
    # a corrupt entry is ignored and re-read, never trusted
    raw = json.loads(Path(warm.file).read_text())
    raw["entries"][f"fatbin-v2:{path}"]["fatbin"]["entries"] = [["sass", "eighty", "", None, None]]
    Path(warm.file).write_text(json.dumps(raw))
    again = ElfCache(str(tmp_path / "cache"), enabled=True)
    assert again.fatbin(path) == first
    assert again.misses == 1
    # ELF facts and fatbin facts of one path live side by side
    assert again.read(path).path == path
    assert again.fatbin(path) == first
    assert again.hits == 1


@pytest.mark.parametrize(
    "raw",
    [
        ["sass", 80, "", None],
        ["vliw", 80, "", None, None],
        ["sass", True, "", None, None],
        ["ptx", 80, "x", None, None],
        ["ptx", 80, "", "gzip", None],
        ["ptx", 80, "", None, "nine"],
    ],
)
def test_malformed_cached_entries_are_rejected(raw: Any) -> None:
    with pytest.raises(ElfError):
        FatbinEntry.from_json(raw)


# --- wheel-wide coverage --------------------------------------------------------------------------------


def _site(tmp_path: Path, kernels: dict[str, bytes], dists: dict[str, tuple[str, list[str]]]) -> Path:
    """``{"name": (version, [kernel names])}`` installed as wheels shipping ``<name>/lib/lib<kernel>.so``."""
    site = site_packages(tmp_path / "venv")
    for name, (version, libs) in dists.items():
        pkg = name.replace("-", "_")
        write_dist(site, name, version, {f"{pkg}/lib/lib{k}.so": kernels[k] for k in libs})
    return site


def _arch(
    site: Path, archs: tuple[str, ...], driver: str = "580.65.06", scan: tuple[str, ...] = ()
) -> tuple[Finding, ...]:
    info = DriverInfo("declared", driver, None, archs=archs, arch_source="declared")
    stack = Stack(
        Settings(cudastack=True, cudastack_scan=scan),
        driver_info=info,
        rootdir=str(site),
        site_paths=(str(site),),
        cache=ElfCache(enabled=False),
    )
    return stack.findings("arch")


def test_every_installed_library_is_checked_per_distribution(kernels: dict[str, bytes], tmp_path: Path) -> None:
    site = _site(tmp_path, kernels, {"gpukernels": ("1.0", ["sm80", "sm90a"]), "other": ("2.0", ["sm80_90"])})
    (finding,) = _arch(site, ("sm_90",))
    assert finding.severity is Severity.ERROR
    assert finding.subject == "gpukernels 1.0"
    assert finding.message.startswith("SASS sm_80\u2013sm_90a, no PTX; sm_90 (declared) cannot run it")
    assert "1 of its 2 libraries with GPU code (libsm80.so)" in finding.cause
    assert "-gencode" not in finding.fix  # an installed wheel is not rebuilt
    assert "gpukernels" in finding.fix
    assert finding.render().startswith("gpukernels 1.0: SASS sm_80\u2013sm_90a, no PTX; sm_90 (declared) cannot run")


def test_a_clean_twin_gives_no_finding(kernels: dict[str, bytes], tmp_path: Path) -> None:
    site = _site(tmp_path, kernels, {"gpukernels": ("1.0", ["sm80_90", "sm80"]), "other": ("2.0", ["sm80ptx"])})
    assert _arch(site, ("sm_80", "sm_86", "sm_89")) == ()


@pytest.mark.parametrize(
    ("lib", "arch", "severity"),
    [
        pytest.param("sm80", "sm_86", None, id="sm_80 runs on 8.6"),
        pytest.param("sm80", "sm_75", Severity.ERROR, id="sm_80 not on 7.5"),
        pytest.param("sm90a", "sm_90", None, id="sm_90a on 9.0"),
        pytest.param("sm90a", "sm_100", Severity.ERROR, id="sm_90a only on 9.0"),
        pytest.param("sm100f", "sm_103", None, id="sm_100f on its family"),
        pytest.param("sm100f", "sm_120", Severity.ERROR, id="sm_100f not on 12.0"),
        pytest.param("sm80ptx", "sm_120", Severity.WARNING, id="PTX JIT on a driver that knows 9.0"),
    ],
)
def test_wheel_verdicts(
    kernels: dict[str, bytes], tmp_path: Path, lib: str, arch: str, severity: Severity | None
) -> None:
    site = _site(tmp_path, kernels, {"gpukernels": ("1.0", [lib])})
    assert [f.severity for f in _arch(site, (arch,))] == ([severity] if severity else [])


def test_ptx_newer_than_the_driver_is_an_error(kernels: dict[str, bytes], tmp_path: Path) -> None:
    site = _site(tmp_path, kernels, {"jitonly": ("1.0", ["compressed"])})
    # CUDA 13's PTX ISA 9.0 at driver 570 (CUDA 12.8): CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    (finding,) = _arch(site, ("sm_90",), driver="570.86.15")
    assert finding.severity is Severity.ERROR
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in finding.message
    assert "PTX ISA 9.0" in finding.message
    assert "570.86.15" in finding.message
    # the same at driver 580 (CUDA 13.0): only the JIT warning, nothing about the PTX ISA
    (finding,) = _arch(site, ("sm_90",), driver="580.65.06")
    assert finding.severity is Severity.WARNING
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" not in finding.message


def test_patched_ptx_version_needs_a_newer_driver(kernels: dict[str, bytes], tmp_path: Path) -> None:
    site = _site(tmp_path, kernels, {"jitonly": ("1.0", ["newptx"])})
    (finding,) = _arch(site, ("sm_90",), driver="580.65.06")
    assert finding.severity is Severity.ERROR
    assert "PTX ISA 9.5" in finding.message
    assert "CUDA 13.5" in finding.message


def test_users_scans_keep_the_rebuild_fix(kernels: dict[str, bytes], tmp_path: Path) -> None:
    site = _site(tmp_path, kernels, {})
    (site / "bin").mkdir()
    (site / "bin" / "libmine.so").write_bytes(kernels["sm80"])
    (finding,) = _arch(site, ("sm_75",), scan=("bin/libmine.so",))
    assert finding.subject == "bin/libmine.so"
    assert "arch=compute_75,code=sm_75" in finding.fix


def test_scanned_ptx_newer_than_the_driver(kernels: dict[str, bytes], tmp_path: Path) -> None:
    path = _write(tmp_path, "libmine.so", kernels["newptx"])
    driver = DriverInfo("declared", "580.65.06", None, archs=("sm_90",), arch_source="declared")
    (finding,) = arch_findings([path], ["sm_90"], driver=driver)
    assert finding.severity is Severity.ERROR
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in finding.message
    (finding,) = arch_findings([path], ["sm_90"])  # no driver facts: the JIT warning only
    assert finding.severity is Severity.WARNING


def test_cuda_13_torch_on_a_pascal_gpu(kernels: dict[str, bytes], tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        kernels,
        {"torch": ("2.9.0+cu130", ["sm80"]), "nvidia-cublas": ("13.1.1.3", ["sm80"])},
    )
    findings = _arch(site, ("sm_60",))
    by_subject = {f.subject: f for f in findings}
    major = by_subject["sm_60"]
    assert major.severity is Severity.ERROR
    assert "CUDA 13" in major.message
    assert "6.0" in major.message
    assert "torch 2.9.0+cu130" in major.cause
    assert "cu126" in major.fix
    torch = by_subject["torch 2.9.0+cu130"]
    assert "sm_60 (declared) cannot run it" in torch.message
    assert "CUDA 13 no longer supports compute capability 6.0" in torch.cause
    assert "cu126" in torch.fix
    assert "download.pytorch.org/whl/cu126" in torch.fix
    cublas = by_subject["nvidia-cublas 13.1.1.3"]
    assert "CUDA 12 build of nvidia-cublas" in cublas.fix
    # the same stack on a GPU CUDA 13 supports: no finding
    assert _arch(site, ("sm_80",)) == ()


def test_stack_cuda_major(tmp_path: Path) -> None:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "nvidia-cublas-cu12", "12.9.1.4")
    write_dist(site, "nvidia-cudnn-cu12", "9.10.2.21")
    write_dist(site, "nvidia-nccl-cu13", "2.30.7")
    major = stack_cuda_major(installed_wheels([str(site)]))
    assert major is not None
    assert major[0] == 12
    write_dist(site, "torch", "2.9.0+cu130")
    major = stack_cuda_major(installed_wheels([str(site)]))
    assert major is not None
    assert major[0] == 13
    assert "torch 2.9.0+cu130" in major[1]
    assert stack_cuda_major(installed_wheels([str(site_packages(tmp_path / "empty"))])) is None


def test_summarize() -> None:
    entries = [
        FatbinEntry("sass", 121, "a", None),
        FatbinEntry("sass", 75, "", None),
        FatbinEntry("sass", 90, "", None),
        FatbinEntry("ptx", 120, "", "zstd", "9.0"),
        FatbinEntry("ptx", 120, "", "zstd", "8.8"),
    ]
    assert summarize(entries) == "SASS sm_75\u2013sm_121a, PTX compute_120"
    assert summarize(entries[1:2]) == "SASS sm_75, no PTX"


def test_without_archs_installed_wheels_are_not_read(tmp_path: Path) -> None:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "broken", "1.0", {"broken/libx.so": b"not an ELF"})
    info = DriverInfo("absent", None, None, reason="no NVML")
    stack = Stack(Settings(cudastack=True), driver_info=info, site_paths=(str(site),), cache=ElfCache(enabled=False))
    assert stack.findings("arch") == ()
    assert wheel_arch_findings(stack.inventory, ("sm_90",)) == ()  # unreadable wheel files: integrity's business


# --- the data file --------------------------------------------------------------------------------------


def test_data_lookups() -> None:
    assert str(ptx_isa_cuda("9.0")) == "13.0"
    assert str(ptx_isa_cuda("8.7")) == "12.8"
    assert ptx_isa_cuda("9.2") is None  # not read first-hand: unknown, never a failure
    assert [v.variant for v in variants_for("torch", 60)] == ["cu126"]
    assert [v.variant for v in variants_for("Torch", 70)] == ["cu129", "cu128", "cu126"]
    assert variants_for("jaxlib", 90) == ()
    data = load_gpu_code()
    assert all(v.source for v in data.variants)


def _raw() -> dict[str, Any]:
    path = Path(__file__).resolve().parent.parent / "pytest_cudastack" / "cuda" / "data" / "gpu_code.json"
    raw: dict[str, Any] = json.loads(path.read_text())
    return raw


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        pytest.param(lambda r: r["ptx_isa"][0].update(source="blog"), "not listed", id="unknown source"),
        pytest.param(lambda r: r["ptx_isa"].reverse(), "must rise", id="unordered ISA rows"),
        pytest.param(lambda r: r["ptx_isa"][0].update(isa="one"), "MAJOR.MINOR", id="bad ISA"),
        pytest.param(lambda r: r["variants"][0].update(sass=["compute_80"]), "sm_XX", id="PTX listed as SASS"),
        pytest.param(lambda r: r["variants"][0].update(sass=["sm_9"]), "invalid GPU arch", id="bad arch"),
        pytest.param(lambda r: r["variants"][0].pop("index"), r"variants\[0\]\.index: missing", id="missing key"),
        pytest.param(
            lambda r: r["variants"][0].update(extra=1), r"variants\[0\]\.extra: not allowed here", id="unknown key"
        ),
        pytest.param(lambda r: r.update(variants=[]), "non-empty list", id="empty table"),
        pytest.param(lambda r: r.update(schema="x"), "unsupported schema 'x'", id="foreign file"),
    ],
)
def test_malformed_data_is_a_data_error(edit: Any, match: str) -> None:
    raw = copy.deepcopy(_raw())
    edit(raw)
    with pytest.raises(DataError, match=match):
        validate_gpu_code(raw, "gpu_code.json")


# --- real tier ------------------------------------------------------------------------------------------


def _torch_site() -> str:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("needs the real torch CUDA venv ($CUDASTACK_TORCH_VENV)")
    found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
    if not found or not os.path.isdir(os.path.join(found[0], "torch")):
        pytest.skip(f"no torch in {venv}")
    return found[0]


def _torch_archs(venv_python: str) -> set[str]:
    """What the build itself says (``torch._C._cuda_getArchFlags()``), read by a child python without a GPU."""
    code = "import torch; print(torch._C._cuda_getArchFlags())"
    out = subprocess.run([venv_python, "-c", code], check=True, capture_output=True, text=True, timeout=300)
    return set(out.stdout.split())


@pytest.mark.real
def test_real_torch_kernels_match_its_arch_flags() -> None:
    site = _torch_site()
    inventory = installed_wheels([site])
    torch = inventory.get("torch")
    assert torch is not None
    own = {e.name for lib in torch.libraries if lib.exists for e in read_fatbin(lib.path).entries if e.kind == "sass"}
    flags = _torch_archs(os.path.join(os.environ["CUDASTACK_TORCH_VENV"], "bin", "python"))
    assert flags == {"sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"}
    assert flags <= own  # its CUTLASS kernels add arch-specific sm_90a, sm_100a, ...


@pytest.mark.real
def test_real_torch_on_sm_60_fails_naming_torch_and_cuda_13(tmp_path: Path) -> None:
    findings = _arch(Path(_torch_site()), ("sm_60",))
    errors = [f for f in findings if f.severity is Severity.ERROR]
    torch = next(f for f in errors if f.subject.startswith("torch "))
    assert "sm_60" in torch.message
    assert "CUDA 13" in torch.cause
    assert "cu126" in torch.fix
    assert any(f.subject == "sm_60" and "CUDA 13" in f.message for f in errors)


@pytest.mark.real
def test_real_torch_on_sm_90_passes(tmp_path: Path) -> None:
    findings = _arch(Path(_torch_site()), ("sm_90",))
    assert [f for f in findings if f.severity is Severity.ERROR] == []


def test_snapshot_carries_each_cuda_wheels_gpu_code(kernels: dict[str, bytes], tmp_path: Path) -> None:
    site = _site(tmp_path, kernels, {"nvidia-kernels-cu12": ("12.9.1", ["sm80ptx", "sm90a", "empty"])})
    info = DriverInfo("absent", None, None)
    stack = Stack(Settings(), driver_info=info, site_paths=(str(site),), cache=ElfCache(enabled=False))
    (wheel,) = stack.to_json()["wheels"]
    assert wheel["gpu_code"] == {"sass": ["sm_80", "sm_90a"], "ptx": ["compute_80"]}


def test_ptx_only_wheel_is_a_warning_whose_fix_asks_nothing_unknown(kernels: dict[str, bytes], tmp_path: Path) -> None:
    """A wheel whose only library carries PTX for the target: its kernels JIT at first launch. The fix says
    nothing is required, and names no build that no data knows of; "its library", not "1 of its 1"."""
    site = _site(tmp_path, kernels, {"ptxonly": ("1.0", ["sm80ptx"])})
    (finding,) = _arch(site, ("sm_90",))
    assert finding.severity is Severity.WARNING
    assert finding.cause.startswith("its library with GPU code (")
    assert finding.fix.startswith("nothing is required: the driver compiles the PTX once per GPU")
    assert finding.fix.endswith("; no build of ptxonly with SASS for sm_90 is known here")
    assert " carries only PTX" in finding.cause


def test_remedies_are_typed_the_build_that_covers_it_or_a_rebuild_with_gencode(
    kernels: dict[str, bytes], tmp_path: Path
) -> None:
    """The arch item's errors carry their remedies as data: a scan is rebuilt with the -gencode flags for the
    arch; an installed wheel names the build that covers it (with the pip command of its index, in its
    environment); PTX the driver cannot JIT names the driver of the CUDA that introduced its ISA."""
    site = _site(tmp_path, kernels, {"torch": ("2.9.0+cu130", ["sm80"]), "jitonly": ("1.0", ["compressed"])})
    (site / "bin").mkdir()
    (site / "bin" / "libmine.so").write_bytes(kernels["sm80"])
    by_subject = {f.subject: f for f in _arch(site, ("sm_60",), scan=("bin/libmine.so",))}
    (rebuild,) = by_subject["bin/libmine.so"].remedies
    assert isinstance(rebuild, Rebuild)
    assert rebuild.flags == ("-gencode", "arch=compute_60,code=sm_60")
    use = by_subject["torch 2.9.0+cu130"].remedies[0]
    assert isinstance(use, UseBuild)
    assert (use.package, use.build) == ("torch", "the cu126 variant (CUDA 12.6)")
    assert use.install is not None
    assert use.install.index_url == "https://download.pytorch.org/whl/cu126"
    assert use.install.specs == ("torch",)
    # CUDA 13's PTX ISA 9.0 at driver 570: the first driver of CUDA 13.0
    (jit,) = _arch(_site(tmp_path / "j", kernels, {"jitonly": ("1.0", ["compressed"])}), ("sm_90",), "570.86.15")
    upgrade = jit.remedies[0]
    assert isinstance(upgrade, DriverUpgrade)
    assert (upgrade.minimum, upgrade.cuda) == (min_driver_for_cuda("13.0"), "13.0")


def test_a_suffixed_arch_is_rebuilt_with_its_own_suffix(kernels: dict[str, bytes], tmp_path: Path) -> None:
    path = _write(tmp_path, "libmine.so", kernels["sm80"])
    (finding,) = arch_findings([path], ["sm_90a"])
    assert finding.remedies == (
        Rebuild(path, ("-gencode", "arch=compute_90a,code=sm_90a"), why=finding.remedies[0].why),
    )
