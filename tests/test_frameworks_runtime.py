"""checks/frameworks.py's file-judged rules on gcc-built fixtures: cupy >= 14 loads cuBLAS and NVRTC by name
(``loads_by_name``: the CUDA major of its package name against the sonames installed wheels ship), and
onnxruntime-gpu's CUDA execution provider, dlopened at session creation (``provider``: its own closure);
broken states and clean twins, with the host's ld.so.cache and default directories kept out (and ldd as the
oracle for the provider's missing sonames)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.checks.frameworks import framework_findings
from pytest_cudastack.cuda.frameworks import judge, load_rules
from pytest_cudastack.findings import Severity
from pytest_cudastack.stack import Stack
from tests.helpers.elfbuild import needs_ldd
from tests.helpers.sitebuild import HAVE_CC, compile_so, isolate_search, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
WHEEL_JSON = '{\n    "cuda": "12.x",\n    "packaging": "pip"\n}\n'


@pytest.fixture(autouse=True)
def system_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The host's ld.so.cache and default directories replaced by one empty directory (``system``)."""
    return isolate_search(monkeypatch, tmp_path)


def cuda13_wheels(site: Path) -> None:
    write_dist(site, "nvidia-cublas", "13.1.1.3", {"nvidia/cu13/lib/libcublas.so.13": compile_so("libcublas.so.13")})
    write_dist(site, "nvidia-cuda-nvrtc", "13.0.88", {"nvidia/cu13/lib/libnvrtc.so.13": compile_so("libnvrtc.so.13")})


def cupy(site: Path, name: str, version: str = "14.0.1") -> None:
    write_dist(site, name, version, {"cupy/.data/_wheel.json": WHEEL_JSON.replace("12", name[9:11])})


def run(site: Path):
    return framework_findings(Stack(site_paths=(str(site),)))


# ------------------------------------------------------------------------------------------------------- cupy


def test_cupy_for_cuda_12_among_cuda_13_wheels(tmp_path):
    site = site_packages(tmp_path / "v")
    cuda13_wheels(site)
    cupy(site, "cupy-cuda12x")
    found = run(site)
    assert [f.subject for f in found] == ["cupy-cuda12x cuBLAS", "cupy-cuda12x NVRTC"]
    blas = found[0]
    assert blas.severity is Severity.WARNING
    assert blas.message == (
        "cupy-cuda12x 14.0.1 is built for CUDA 12 and loads libcublas.so.12 by name, which no installed wheel "
        "ships: the installed cuBLAS is libcublas.so.13 (nvidia-cublas 13.1.1.3)"
    )
    assert "(CUDA 12); its _wheel.json says cuda 12.x;" in blas.cause
    assert (
        "cuda-pathfinder (NVIDIA wheels in site-packages, then the OS loader, then CUDA_HOME/CUDA_PATH)" in blas.cause
    )
    assert '"ImportError: cuda.pathfinder found no libcublas.so.12' in blas.cause
    assert blas.fix.startswith("no safe automatic repair is known. By hand: install the cupy package built for")
    assert "cupy-cuda12x[ctk]" in blas.fix
    assert "cupy-pathfinder: https://github.com/cupy/cupy/blob/v14.0.0/" in blas.details[0]


def test_cupy_for_the_installed_major_is_clean(tmp_path):
    site = site_packages(tmp_path / "v")
    cuda13_wheels(site)
    cupy(site, "cupy-cuda13x")
    assert run(site) == ()


def test_a_cuda_12_wheel_beside_the_cuda_13_ones_is_enough(tmp_path):
    site = site_packages(tmp_path / "v")
    cuda13_wheels(site)
    write_dist(
        site, "nvidia-cublas-cu12", "12.9.1.4", {"nvidia/cublas/lib/libcublas.so.12": compile_so("libcublas.so.12")}
    )
    cupy(site, "cupy-cuda12x")
    assert [f.subject for f in run(site)] == ["cupy-cuda12x NVRTC"]


def test_a_copy_on_the_linkers_search_path_is_what_pathfinder_falls_back_to(tmp_path, system_dir):
    site = site_packages(tmp_path / "v")
    cuda13_wheels(site)
    cupy(site, "cupy-cuda12x")
    (system_dir / "libcublas.so.12").write_bytes(compile_so("libcublas.so.12"))
    (system_dir / "libnvrtc.so.12").write_bytes(compile_so("libnvrtc.so.12"))
    assert run(site) == ()


def test_no_wheel_of_the_library_at_all_is_not_judged(tmp_path):
    site = site_packages(tmp_path / "v")
    cupy(site, "cupy-cuda12x")
    (f,) = run(site)
    assert f.severity is Severity.INFO
    assert f.details[0] == (
        "cuBLAS: libcublas.so.12 is in no installed wheel and not on the linker's search path; whether "
        "CUDA_HOME/CUDA_PATH holds it (cuda-pathfinder's last step) is not judged here"
    )


def test_cupy_before_14_is_not_judged_by_these_rules(tmp_path):
    # cupy 13 links its CUDA libraries (the closure item's concern); the by-name loading is cupy >= 14's
    site = site_packages(tmp_path / "v")
    cuda13_wheels(site)
    cupy(site, "cupy-cuda12x", "13.6.0")
    assert run(site) == ()


# ------------------------------------------------------------------------------------------ onnxruntime-gpu


def ort(site: Path, needed: list[str], runpath: str | None) -> Path:
    provider = compile_so("libonnxruntime_providers_cuda.so", needed=needed, runpath=runpath)
    write_dist(site, "onnxruntime-gpu", "1.20.1", {PROVIDER: provider, "onnxruntime/__init__.py": ""})
    return site / PROVIDER


def test_onnxruntime_providers_linking_cuda_12_among_cuda_13_wheels(tmp_path):
    site = site_packages(tmp_path / "v")
    cuda13_wheels(site)
    write_dist(
        site,
        "nvidia-cublas",
        "13.1.1.3",
        {
            "nvidia/cu13/lib/libcublas.so.13": compile_so("libcublas.so.13"),
            "nvidia/cu13/lib/libcublasLt.so.13": compile_so("libcublasLt.so.13"),
        },
    )
    path = ort(site, ["libcublasLt.so.12", "libcublas.so.12"], "$ORIGIN/../../nvidia/cu13/lib")
    (f,) = run(site)
    assert f.severity is Severity.WARNING
    assert f.subject == "onnxruntime-gpu libonnxruntime_providers_cuda.so"
    assert f.message == (
        "onnxruntime-gpu 1.20.1's libonnxruntime_providers_cuda.so needs libcublasLt.so.12, libcublas.so.12, which "
        "the linker does not find; installed instead: libcublas.so.13 (nvidia-cublas 13.1.1.3), libcublasLt.so.13 "
        "(nvidia-cublas 13.1.1.3)"
    )
    assert '"Failed to create CUDAExecutionProvider. Require cuDNN 9.* and CUDA 12.*' in f.cause
    assert "the model runs, on the CPU, without an error" in f.cause
    assert f.fix.startswith("no safe automatic repair is known")  # a manual step stated as prose
    assert f.where[0] == str(path)


def test_onnxruntime_providers_whose_libraries_wheels_ship_outside_the_search_path(tmp_path):
    # onnxruntime-gpu[cuda] 1.24: its provider has no RPATH to the nvidia wheels it installs; they load only
    # once preloaded (onnxruntime.preload_dlls()) or on LD_LIBRARY_PATH: "install them" would be untrue
    site = site_packages(tmp_path / "v")
    write_dist(
        site, "nvidia-cublas-cu12", "12.9.3.13", {"nvidia/cublas/lib/libcublas.so.12": compile_so("libcublas.so.12")}
    )
    ort(site, ["libcublas.so.12"], None)
    (f,) = run(site)
    assert f.severity is Severity.WARNING
    assert f.message == (
        "onnxruntime-gpu 1.20.1's libonnxruntime_providers_cuda.so needs libcublas.so.12, which the linker does "
        "not find; installed wheels ship them, outside its search path: libcublas.so.12 (nvidia-cublas-cu12 12.9.3.13)"
    )
    assert "onnxruntime.preload_dlls()" in f.fix
    assert f.fix.endswith(f"on LD_LIBRARY_PATH ({site}/nvidia/cublas/lib)")


def test_onnxruntime_providers_finding_their_libraries_are_clean(tmp_path):
    site = site_packages(tmp_path / "v")
    write_dist(
        site,
        "nvidia-cublas",
        "13.1.1.3",
        {
            "nvidia/cu13/lib/libcublas.so.13": compile_so("libcublas.so.13"),
            "nvidia/cu13/lib/libcublasLt.so.13": compile_so("libcublasLt.so.13"),
        },
    )
    ort(site, ["libcublasLt.so.13", "libcublas.so.13"], "$ORIGIN/../../nvidia/cu13/lib")
    assert run(site) == ()


def test_a_cpu_only_onnxruntime_gpu_without_its_provider_is_not_judged(tmp_path):
    site = site_packages(tmp_path / "v")
    write_dist(site, "onnxruntime-gpu", "1.20.1", {"onnxruntime/__init__.py": ""})
    assert run(site) == ()


def test_a_missing_non_cuda_library_of_the_provider_is_not_this_rules(tmp_path):
    site = site_packages(tmp_path / "v")
    ort(site, ["libsomething_else.so.1"], None)
    assert run(site) == ()


@needs_ldd
def test_ldd_misses_what_the_provider_finding_names(tmp_path):
    site = site_packages(tmp_path / "v")
    cuda13_wheels(site)
    path = ort(site, ["libcublasLt.so.12"], "$ORIGIN/../../nvidia/cu13/lib")
    (f,) = run(site)
    ldd = shutil.which("ldd")
    assert ldd is not None
    out = subprocess.run([ldd, str(path)], env={}, capture_output=True, text=True).stdout
    assert "libcublasLt.so.12 => not found" in out
    assert "needs libcublasLt.so.12," in f.message


def test_file_judged_rules_are_never_judged_on_versions():
    # a shadowed cuBLAS in cupy's closure must not take a version verdict from a loads_by_name rule
    for rule in load_rules().rules:
        if rule.kind in ("loads_by_name", "provider"):
            verdict = judge(rule, (12, 0, 0), (13, 0, 0))
            assert verdict.ok is None
            assert verdict.text == f"a {rule.kind} rule is judged on the installed files, not on versions"


def test_the_requirements_item_says_each_once(tmp_path):
    # through the registered item, with Requires-Dist as the real wheels state them (numpy left out: one INFO)
    site = site_packages(tmp_path / "v")
    cuda13_wheels(site)
    write_dist(
        site,
        "cupy-cuda12x",
        "14.0.1",
        {"cupy/.data/_wheel.json": WHEEL_JSON},
        requires=["numpy<2.6,>=2.0", "cuda-pathfinder<2.0,>=1.3.3"],
    )
    write_dist(site, "cuda-pathfinder", "1.9.1")
    ort(site, ["libcublasLt.so.12"], "$ORIGIN/../../nvidia/cu13/lib")
    found = Stack(site_paths=(str(site),)).findings("requirements")
    assert sorted((f.severity.name, f.subject) for f in found if f.severity is not Severity.INFO) == [
        ("WARNING", "cupy-cuda12x NVRTC"),
        ("WARNING", "cupy-cuda12x cuBLAS"),
        ("WARNING", "onnxruntime-gpu libonnxruntime_providers_cuda.so"),
    ]
    assert not [f for f in found if f.failing]
