"""Mixed CUDA majors (checks/majors.py, errors of the closure item), always on: a CUDA 12 module or
provider in a CUDA 13 torch stack is an ERROR naming both sides and the fix; the clean twin has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.checks.majors import majors_findings, stack_major
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


def _site(tmp_path: Path, kernel_cuda: int, provider_cuda: int) -> Path:
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "torch",
        "2.9.0+cu130",
        {"torch/_C.abi3.so": compile_so(None, pyinit="_C", needed=["libcudart.so.13"])},
    )
    write_dist(
        site,
        "kernelish-cu13" if kernel_cuda == 13 else "kernelish-cu12",
        "0.3.0",
        {"kernelish/_ops.abi3.so": compile_so(None, pyinit="_ops", needed=[f"libcudart.so.{kernel_cuda}"])},
    )
    write_dist(
        site,
        "ortish-gpu",
        "1.22.0",
        {
            "ortish/capi/libortish_providers_cuda.so": compile_so(
                None, needed=[f"libcublasLt.so.{provider_cuda}", "libcudnn.so.9"]
            )
        },
    )
    return site


def _findings(site: Path):
    inv = installed_wheels([str(site)], reader=read_elf)
    return inv, majors_findings(inv, read_elf, lambda p: p.split("site-packages/")[-1])


def test_clean_twin_has_no_mixed_major(tmp_path: Path):
    inv, found = _findings(_site(tmp_path, 13, 13))
    assert stack_major(inv) == (13, "torch 2.9.0+cu130 is built for CUDA 13")
    assert found == ()


def test_cuda12_module_and_provider_in_a_cuda13_stack(tmp_path: Path):
    _, found = _findings(_site(tmp_path, 12, 12))
    assert [f.subject for f in found] == ["kernelish/_ops.abi3.so", "ortish/capi/libortish_providers_cuda.so"]
    kernel, provider = found
    assert all(f.failing and f.check == "closure" for f in found)
    assert kernel.message == (
        "kernelish/_ops.abi3.so (extension module of kernelish-cu12 0.3.0) is built for CUDA 12; the stack is CUDA 13"
    )
    assert "torch 2.9.0+cu130 is built for CUDA 13" in kernel.cause
    # the other build is not on disk: advice by hand, never a command offered as verified
    assert kernel.fix.startswith("no safe automatic repair is known: the other build is not installed here")
    assert "install kernelish-cu13 (the CUDA 13 build of kernelish-cu12) in its place" in kernel.fix
    assert kernel.fix.endswith("or a torch built for CUDA 12")
    assert "links libcublasLt.so.12" in provider.details  # libcudnn.so.9 allows both: libcublasLt decides
    assert "install the build of ortish-gpu for CUDA 13" in provider.fix


def test_no_stack_major_no_verdict(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "plain", "1.0", {"plain/_m.abi3.so": compile_so(None, pyinit="_m", needed=["libcudart.so.12"])})
    inv, found = _findings(site)
    assert stack_major(inv)[0] is None
    assert found == ()


def test_the_closure_item_reports_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    driver = DriverInfo("declared", "580.65.06", "13.0", archs=("sm_90",), arch_source="declared")
    for kernel, expected in ((13, []), (12, ["kernelish/_ops.abi3.so"])):
        site = _site(tmp_path / str(kernel), kernel, 13)
        stack = Stack(Settings(cudastack=True), driver_info=driver, rootdir=str(tmp_path), site_paths=(str(site),))
        mixed = [f.subject for f in stack.findings("closure") if f.failing and "is built for CUDA" in f.message]
        assert mixed == expected


def test_the_other_build_keeps_the_package_s_own_spelling(tmp_path: Path):
    """cupy-cuda12x's other build is cupy-cuda13x (the -cudaNNx spelling, not -cuNN)."""
    site = _site(tmp_path, 13, 13)
    write_dist(
        site,
        "cupy-cuda12x",
        "14.0.1",
        {"cupy_backends/cuda/api/runtime.abi3.so": compile_so(None, pyinit="runtime", needed=["libcudart.so.12"])},
    )
    (f,) = _findings(site)[1]
    assert "install cupy-cuda13x (the CUDA 13 build of cupy-cuda12x) in its place" in f.fix
