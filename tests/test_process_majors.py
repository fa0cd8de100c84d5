"""Mixed CUDA majors (checks/majors.py, findings of the closure item), judged from what each consumer
resolves: runtimes of different sonames side by side are an INFO; one soname needed from two majors and a
library of another major are ERRORs naming both sides, the soname and the other build. Every ERROR has a
clean twin below."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from pytest_cudastack.checks.majors import file_majors, majors_findings, stack_major
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.modules import module_trees
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

TORCH_RPATH = "$ORIGIN/../nvidia/cu13/lib:$ORIGIN/../nvidia/nccl/lib:$ORIGIN/../nvidia/cusparse/lib"


def _torch13(site: Path, needed: tuple[str, ...] = ("libcudart.so.13", "libnccl.so.2")) -> None:
    """A CUDA 13 torch-like stack: torch/_C needs its runtime and NCCL from the CUDA 13 wheels."""
    write_dist(
        site,
        "torch",
        "2.9.0+cu130",
        {"torch/_C.abi3.so": compile_so(None, pyinit="_C", needed=needed, rpath=TORCH_RPATH)},
    )
    write_dist(
        site, "nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": compile_so("libcudart.so.13")}
    )
    write_dist(site, "nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2")})


def _kernel(site: Path, name: str, needed: tuple[str, ...], rpath: str) -> None:
    write_dist(
        site, name, "0.3.0", {"kernelish/_ops.abi3.so": compile_so(None, pyinit="_ops", needed=needed, rpath=rpath)}
    )


def _lib(site: Path, dist: str, version: str, files: Mapping[str, str]) -> None:
    """An NVIDIA library wheel: RECORD path -> soname."""
    write_dist(site, dist, version, {rel: compile_so(soname, payload=dist) for rel, soname in files.items()})


def _run(site: Path) -> tuple[Inventory, tuple[Finding, ...]]:
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner)
    trees = module_trees(inv, resolver)
    return inv, majors_findings(inv, read_elf, inv.relative, trees, resolver)


def _loud(found: tuple[Finding, ...]) -> list[Finding]:
    return [f for f in found if f.severity in (Severity.ERROR, Severity.WARNING)]


CU12_RUNTIME = {"nvidia/cuda_runtime/lib/libcudart.so.12": "libcudart.so.12"}
K_RPATH = "$ORIGIN/../nvidia/cuda_runtime/lib"


# ----------------------------------------------------------------------------------- side by side: INFO


def test_cuda12_package_with_its_own_runtime_beside_cuda13_torch_is_an_info(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    _torch13(site)
    _lib(site, "nvidia-cuda-runtime-cu12", "12.9.79", CU12_RUNTIME)
    _kernel(site, "kernelish-cu12", ("libcudart.so.12",), K_RPATH)
    inv, found = _run(site)
    assert stack_major(inv) == (13, "torch 2.9.0+cu130 is built for CUDA 13")
    assert _loud(found) == []
    (info,) = found
    assert info.severity is Severity.INFO
    assert info.subject == "kernelish-cu12 0.3.0"
    assert info.message == (
        "kernelish-cu12 0.3.0 is built for CUDA 12 beside the stack's CUDA 13: two CUDA runtimes load side by side"
    )
    assert "the driver item judges whether the driver runs the newer CUDA" in info.fix
    assert info.details == ("kernelish/_ops.abi3.so links libcudart.so.12",)


def test_cuda13_package_in_a_cuda13_stack_says_nothing(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    _torch13(site)
    _kernel(
        site,
        "kernelish-cu13",
        ("libcudart.so.13", "libnccl.so.2"),
        "$ORIGIN/../nvidia/cu13/lib:$ORIGIN/../nvidia/nccl/lib",
    )
    assert _run(site)[1] == ()


def test_no_stack_major_no_info(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "plain", "1.0", {"plain/_m.abi3.so": compile_so(None, pyinit="_m", needed=["libcudart.so.12"])})
    inv, found = _run(site)
    assert stack_major(inv)[0] is None
    assert found == ()


# ----------------------------------------------------------------------- (a) one soname from two majors


def _shared_nccl(tmp_path: Path, kernel: str, runtime: str, runtime_wheel: tuple[str, str, dict[str, str]]) -> Path:
    site = site_packages(tmp_path / "venv")
    _torch13(site)
    _lib(site, *runtime_wheel)
    _kernel(site, kernel, (runtime, "libnccl.so.2"), f"{K_RPATH}:$ORIGIN/../nvidia/cu13/lib:$ORIGIN/../nvidia/nccl/lib")
    return site


def test_one_nccl_file_needed_by_cuda12_and_cuda13_is_an_error_naming_both(tmp_path: Path):
    site = _shared_nccl(
        tmp_path, "kernelish-cu12", "libcudart.so.12", ("nvidia-cuda-runtime-cu12", "12.9.79", CU12_RUNTIME)
    )
    (err,) = _loud(_run(site)[1])
    assert err.failing
    assert err.check == "closure"
    assert err.subject == "libnccl.so.2"
    assert err.message == (
        "libnccl.so.2 is needed by consumers of CUDA 12 (kernelish/_ops.abi3.so (kernelish-cu12 0.3.0)) and "
        "CUDA 13 (torch/_C.abi3.so (torch 2.9.0+cu130)); it resolves to one file, nvidia/nccl/lib/libnccl.so.2 "
        "(nvidia-nccl-cu13 2.30.7)"
    )
    assert "the process loads one object of that soname, the CUDA 13 build" in err.cause
    assert err.fix.startswith("no safe automatic repair is known: the other build is not installed here")
    assert "install kernelish-cu13 (the CUDA 13 build of kernelish-cu12) in its place" in err.fix
    assert "nvidia-nccl-cu12" not in err.fix  # it installs the same path: the CUDA 13 consumers would lose theirs
    assert err.details == ("CUDA 12: kernelish/_ops.abi3.so", "CUDA 13: torch/_C.abi3.so")
    assert [r.kind for r in err.remedies] == ["manual"]  # advice: the other build is not here to verify
    assert err.facts.sonames == ("libnccl.so.2",)
    assert err.facts.required == "CUDA 12 and CUDA 13"
    assert err.facts.objects[0] == f"{site}/nvidia/nccl/lib/libnccl.so.2"
    assert err.chain == ("kernelish/_ops.abi3.so", "nvidia/nccl/lib/libnccl.so.2")


def test_clean_twin_the_cuda13_build_shares_nccl(tmp_path: Path):
    site = _shared_nccl(
        tmp_path, "kernelish-cu13", "libcudart.so.13", ("nvidia-cuda-runtime-cu12", "12.9.79", CU12_RUNTIME)
    )
    assert _run(site)[1] == ()


def test_cuda11_and_cuda12_share_one_cudnn8(tmp_path: Path):
    """Other names and majors: a CUDA 12 torch and a CUDA 11 package both need libcudnn.so.8 (its soname
    allows CUDA 11 and 12), found once, in nvidia-cudnn-cu12."""
    site = site_packages(tmp_path / "venv")
    rpath = "$ORIGIN/../nvidia/cudnn/lib:$ORIGIN/../nvidia/cuda_runtime/lib"
    write_dist(
        site,
        "torch",
        "2.5.1+cu121",
        {"torch/_C.abi3.so": compile_so(None, pyinit="_C", needed=["libcudart.so.12", "libcudnn.so.8"], rpath=rpath)},
    )
    _lib(site, "nvidia-cudnn-cu12", "8.9.2.26", {"nvidia/cudnn/lib/libcudnn.so.8": "libcudnn.so.8"})
    _lib(site, "nvidia-cuda-runtime-cu12", "12.1.105", CU12_RUNTIME)
    _lib(
        site, "nvidia-cuda-runtime-cu11", "11.8.89", {"nvidia/cuda_runtime/lib/libcudart.so.11.0": "libcudart.so.11.0"}
    )
    for needed, expected in (
        (("libcudart.so.11.0", "libcudnn.so.8"), ["libcudnn.so.8"]),
        (("libcudart.so.11.0",), []),  # the clean twin: the CUDA 11 runtime side by side, an INFO
    ):
        _kernel(site, "oldkern-cu11", needed, rpath)
        found = _run(site)[1]
        assert [f.subject for f in _loud(found)] == expected
        if expected:
            assert "consumers of CUDA 11 (kernelish/_ops.abi3.so (oldkern-cu11 0.3.0)) and CUDA 12" in found[0].message
            assert "install oldkern-cu12 (the CUDA 12 build of oldkern-cu11) in its place" in found[0].fix
        else:
            assert [f.severity for f in found] == [Severity.INFO]


# ------------------------------------------------------------------- (b) a library of another major


def _cusparse(tmp_path: Path, kernel_dir: str, wheel: str, version: str, rel: str) -> Path:
    site = site_packages(tmp_path / "venv")
    _torch13(site)
    _lib(site, "nvidia-cuda-runtime-cu12", "12.9.79", CU12_RUNTIME)
    _lib(site, wheel, version, {rel: "libcusparse.so.12"})
    _kernel(site, "kernelish-cu12", ("libcudart.so.12", "libcusparse.so.12"), f"{K_RPATH}:$ORIGIN/../{kernel_dir}")
    return site


def test_cuda12_consumer_resolving_the_cuda13_wheels_cusparse_is_an_error(tmp_path: Path):
    site = _cusparse(tmp_path, "nvidia/cu13/lib", "nvidia-cusparse", "12.6.3.3", "nvidia/cu13/lib/libcusparse.so.12")
    inv, found = _run(site)
    assert file_majors(f"{site}/nvidia/cu13/lib/libcusparse.so.12", read_elf, inv) == {13}
    (err,) = _loud(found)
    assert err.failing
    assert err.subject == "libcusparse.so.12"
    assert err.message == (
        "kernelish/_ops.abi3.so (kernelish-cu12 0.3.0), built for CUDA 12, resolves libcusparse.so.12 to "
        "nvidia/cu13/lib/libcusparse.so.12 (nvidia-cusparse 12.6.3.3), a CUDA 13 library"
    )
    assert "install kernelish-cu13 (the CUDA 13 build of kernelish-cu12) in its place" in err.fix
    assert err.fix.startswith("no safe automatic repair is known")
    assert err.facts.found == "CUDA 13"
    assert err.facts.consumer == "kernelish-cu12"  # a distribution key: the consumer file is in objects
    assert f"{site}/kernelish/_ops.abi3.so" in err.facts.objects


def test_clean_twin_the_cuda12_consumer_finds_its_own_cusparse(tmp_path: Path):
    site = _cusparse(
        tmp_path, "nvidia/cusparse/lib", "nvidia-cusparse-cu12", "12.5.8.93", "nvidia/cusparse/lib/libcusparse.so.12"
    )
    found = _run(site)[1]
    assert _loud(found) == []
    assert [f.subject for f in found] == ["kernelish-cu12 0.3.0"]  # the side-by-side INFO


@pytest.mark.parametrize(
    ("wheel", "errors"), [("nvidia-cusparse-cu12", ["libcusparse.so.12"]), ("nvidia-cusparse-cu13", [])]
)
def test_cuda13_torch_resolving_a_cuda12_cusparse(tmp_path: Path, wheel: str, errors: list[str]):
    """The mirror: torch (CUDA 13) finds the CUDA 12 wheel's libcusparse.so.12; the twin finds the CUDA 13 one."""
    site = site_packages(tmp_path / "venv")
    _torch13(site, ("libcudart.so.13", "libcusparse.so.12"))
    _lib(site, wheel, "12.5.8.93", {"nvidia/cusparse/lib/libcusparse.so.12": "libcusparse.so.12"})
    found = _run(site)[1]
    assert [f.subject for f in found if f.failing] == errors
    if errors:
        assert "torch/_C.abi3.so (torch 2.9.0+cu130), built for CUDA 13, resolves libcusparse.so.12" in found[0].message
        assert (
            "install nvidia-cusparse-cu13 (the CUDA 13 build of nvidia-cusparse-cu12) where the consumer finds it"
            in found[0].fix
        )


def test_the_other_build_keeps_the_package_s_own_spelling(tmp_path: Path):
    """cupy-cuda12x's other build is cupy-cuda13x (the -cudaNNx spelling, not -cuNN)."""
    site = _shared_nccl(
        tmp_path, "cupy-cuda12x", "libcudart.so.12", ("nvidia-cuda-runtime-cu12", "12.9.79", CU12_RUNTIME)
    )
    (err,) = _loud(_run(site)[1])
    assert "install cupy-cuda13x (the CUDA 13 build of cupy-cuda12x) in its place" in err.fix


# ------------------------------------------------------------ two files of one soname: WARNING


def test_each_major_finding_its_own_nccl_warns_about_one_process(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    _torch13(site)
    _lib(site, "nvidia-cuda-runtime-cu12", "12.9.79", CU12_RUNTIME)
    _lib(site, "nvidia-nccl-cu12", "2.27.3", {"nvidia/nccl12/lib/libnccl.so.2": "libnccl.so.2"})
    _kernel(site, "kernelish-cu12", ("libcudart.so.12", "libnccl.so.2"), f"{K_RPATH}:$ORIGIN/../nvidia/nccl12/lib")
    found = _run(site)[1]
    assert not any(f.failing for f in found)
    (warn,) = _loud(found)
    assert warn.severity is Severity.WARNING
    assert warn.subject == "libnccl.so.2"
    assert "the first loaded libnccl.so.2 serves the consumers of the other major too" in warn.cause


# ---------------------------------------------------------------------------- providers and the item


def test_provider_loaded_at_run_time_is_judged_by_its_closure(tmp_path: Path):
    """ONNX Runtime's CUDA provider, loaded by no module: libcublasLt.so.12 from its own CUDA 12 wheel is
    the side-by-side INFO; the same provider resolving a CUDA 13 libcusparse.so.12 is the ERROR."""
    site = site_packages(tmp_path / "venv")
    _torch13(site)
    _lib(site, "nvidia-cublas-cu12", "12.9.1.4", {"nvidia/cublas/lib/libcublasLt.so.12": "libcublasLt.so.12"})
    _lib(site, "nvidia-cusparse", "12.6.3.3", {"nvidia/cu13/lib/libcusparse.so.12": "libcusparse.so.12"})
    for needed, errors in (
        (("libcublasLt.so.12",), []),
        (("libcublasLt.so.12", "libcusparse.so.12"), ["libcusparse.so.12"]),
    ):
        provider = compile_so(
            None, needed=needed, rpath="$ORIGIN/../../nvidia/cublas/lib:$ORIGIN/../../nvidia/cu13/lib"
        )
        write_dist(site, "ortish-gpu", "1.22.0", {"ortish/capi/libortish_providers_cuda.so": provider})
        found = _run(site)[1]
        assert [f.subject for f in found if f.failing] == errors
        if not errors:
            assert [f.subject for f in found] == ["ortish-gpu 1.22.0"]


def test_the_closure_item_reports_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    driver = DriverInfo("declared", "580.65.06", "13.0", archs=("sm_90",), arch_source="declared")
    for kernel, expected in (("kernelish-cu13", []), ("kernelish-cu12", ["libnccl.so.2"])):
        runtime = "libcudart.so.12" if kernel.endswith("12") else "libcudart.so.13"
        site = _shared_nccl(tmp_path / kernel, kernel, runtime, ("nvidia-cuda-runtime-cu12", "12.9.79", CU12_RUNTIME))
        stack = Stack(Settings(cudastack=True), driver_info=driver, rootdir=str(tmp_path), site_paths=(str(site),))
        assert [f.subject for f in stack.findings("closure") if f.failing] == expected
