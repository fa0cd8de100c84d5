"""Which installed distributions run a CUDA compiler tool, decided from their files (toolchain.json's ``detect``
rows: a file of theirs that holds the tool's name as the code running it spells it), never from the
distribution's name: fake installs of each framework (the jax CUDA plugin, a CUDA jaxlib, triton and a fork of
it under another name, torch's extension builder and inductor, cupy's nvcc backend, numba-cuda's NVVM), and
clean twins (CPU-only builds lacking those files) that are not detected; the lookups of the two new rows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_cudastack.checks.toolchain import detect, framework_lookups, nothing_to_check, toolchain_findings
from pytest_cudastack.cuda.toolchain import load_toolchain
from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import site_packages, write_dist

ROWS = {f.name: f for f in load_toolchain()}
PLUGIN_SO = b"\x7fELF-not-really\0FindCudaExecutable\0ptxas\0nvlink\0"


def _detected(site: Path) -> dict[str, tuple[str, str]]:
    inv = installed_wheels([str(site)])
    out = {}
    for name, row in ROWS.items():
        got = detect(row, inv)
        if got is not None:
            out[name] = (got[0].label, str(Path(got[1]).relative_to(site)))
    return out


@pytest.mark.parametrize(
    ("dist", "version", "files", "framework", "shown"),
    [
        pytest.param(
            "jax-cuda12-pjrt",
            "0.6.2",
            {"jax_plugins/xla_cuda12/__init__.py": "", "jax_plugins/xla_cuda12/xla_cuda_plugin.so": PLUGIN_SO},
            "jax",
            "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            id="jax CUDA plugin",
        ),
        pytest.param(
            "jaxlib",
            "0.4.13+cuda12.cudnn89",
            {"jaxlib/xla_extension.so": PLUGIN_SO},
            "jax",
            "jaxlib/xla_extension.so",
            id="CUDA jaxlib",
        ),
        pytest.param(
            "pytorch-triton",
            "3.1.0+cf34004b8a",
            {"triton/backends/nvidia/compiler.py": "from triton import knobs\nptxas = knobs.nvidia.ptxas\n"},
            "triton",
            "triton/backends/nvidia/compiler.py",
            id="a triton fork",
        ),
        pytest.param(
            "torch",
            "2.14.1",
            {"torch/_inductor/codecache.py": "nvcc = cuda_compile_utils._cuda_compiler()\n"},
            "torch",
            "torch/_inductor/codecache.py",
            id="torch inductor",
        ),
        pytest.param(
            "cupy-cuda13x",
            "14.2.0",
            {"cupy/cuda/compiler.py": "def compile_using_nvcc(source): ...\n"},
            "cupy",
            "cupy/cuda/compiler.py",
            id="cupy nvcc backend",
        ),
        pytest.param(
            "numba-cuda",
            "0.20.0",
            {"numba_cuda/numba/cuda/cuda_paths.py": 'platform_map = {"linux": ("lib64", "libnvvm.so")}\n'},
            "numba-cuda",
            "numba_cuda/numba/cuda/cuda_paths.py",
            id="numba-cuda NVVM",
        ),
    ],
)
def test_detected_by_its_files(tmp_path, dist, version, files, framework, shown):
    site = site_packages(tmp_path / "v")
    write_dist(site, dist, version, files)
    assert _detected(site) == {framework: (f"{dist} {version}", shown)}


@pytest.mark.parametrize(
    ("dist", "files"),
    [
        pytest.param("jaxlib", {"jaxlib/xla_extension.so": b"\x7fELF-cpu-only\0xla_cpu\0"}, id="CPU jaxlib"),
        pytest.param("jax", {"jax/_src/lib/__init__.py": "def _cuda_path(): ...\n"}, id="jax alone"),
        pytest.param("triton", {"triton/__init__.py": "", "triton/backends/amd/compiler.py": "ld.lld\n"}, id="ROCm"),
        pytest.param("torch", {"torch/__init__.py": "", "torch/utils/cpp_extension.py": "ROCM_HOME\n"}, id="torch"),
        pytest.param("cupy-rocm-5-0", {"cupy/cuda/compiler.py": "hipcc = 'hipcc'\n"}, id="cupy ROCm"),
    ],
)
def test_a_build_without_those_files_is_not_detected(tmp_path, dist, files):
    # the clean twins: names that used to be enough, without the code that runs a CUDA tool
    site = site_packages(tmp_path / "v")
    write_dist(site, dist, "1.0", files)
    assert _detected(site) == {}
    reason = nothing_to_check(SimpleNamespace(inventory=installed_wheels([str(site)])))  # type: ignore[arg-type]
    assert reason is not None
    assert "recognised by their files" in reason


def test_an_unreadable_detect_file_detects_nothing(tmp_path):
    site = site_packages(tmp_path / "v")
    write_dist(site, "triton", "3.8.0", {"triton/backends/nvidia/compiler.py": "ptxas\n"})
    path = site / "triton" / "backends" / "nvidia" / "compiler.py"
    path.unlink()
    path.mkdir()  # a directory where the file was: not read, no crash
    assert _detected(site) == {}


def _tool(path: Path, version: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {version[:4]}, V{version}'\n")
    path.chmod(0o755)


def test_cupy_nvcc_lookup_env_then_wheels_then_cuda_path(tmp_path):
    site = site_packages(tmp_path / "v")
    write_dist(site, "cupy-cuda13x", "14.2.0", {"cupy/cuda/compiler.py": "nvcc\n"})
    _tool(site / "nvidia" / "cu13" / "bin" / "nvcc", "13.0.88")
    _tool(tmp_path / "cuda" / "bin" / "nvcc", "12.9.86")
    c = ElfCache(enabled=False)
    inv = installed_wheels([str(site)], reader=c.read)

    def found(env):
        (lk,) = [lk for d, lk in framework_lookups(inv, env, c.tool_version) if lk.framework == "cupy"]
        return lk.found

    got = found({"CUDA_PATH": str(tmp_path / "cuda")})
    assert got is not None
    assert got.via == "the nvidia/cu13/bin wheel directory"
    assert got.release == "13.0"
    got = found({"NVCC": str(tmp_path / "cuda" / "bin" / "nvcc")})
    assert got is not None
    assert got.via == "$NVCC"
    assert got.release == "12.9"
    # a listing only: cupy compares no nvcc version with anything
    info = [f for f in toolchain_findings(inv, {}, c.tool_version) if f.subject == "cupy-cuda13x 14.2.0"]
    assert [f.severity for f in info] == [Severity.INFO]
    assert info[0].message.startswith("cupy runs nvcc 13.0.88")


def test_numba_cuda_nvvm_from_the_nvcc_wheel_before_cuda_home(tmp_path):
    site = site_packages(tmp_path / "v")
    write_dist(site, "numba-cuda", "0.20.0", {"numba_cuda/numba/cuda/cuda_paths.py": "libnvvm.so\n"})
    line = b"\0Cuda compilation tools, release 12.6, V12.6.85\0"  # the library is loaded, never run
    write_dist(site, "nvidia-cuda-nvcc-cu12", "12.6.85", {"nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so": line})
    home = tmp_path / "home" / "nvvm" / "lib64"
    home.mkdir(parents=True)
    (home / "libnvvm.so").write_bytes(b"\0Cuda compilation tools, release 12.2, V12.2.140\0")
    c = ElfCache(enabled=False)
    inv = installed_wheels([str(site)], reader=c.read)
    (lk,) = [lk for d, lk in framework_lookups(inv, {"CUDA_HOME": str(tmp_path / "home")}, c.tool_version)]
    assert lk.framework == "numba-cuda"
    assert lk.found is not None
    assert lk.found.path == str(site / "nvidia" / "cuda_nvcc" / "nvvm" / "lib64" / "libnvvm.so")
    # without the wheel, CUDA_HOME's copy (not executable: a library, loaded)
    bare = site_packages(tmp_path / "w")
    write_dist(bare, "numba-cuda", "0.20.0", {"numba_cuda/numba/cuda/cuda_paths.py": "libnvvm.so\n"})
    inv = installed_wheels([str(bare)], reader=c.read)
    (lk,) = [lk for d, lk in framework_lookups(inv, {"CUDA_HOME": str(tmp_path / "home")}, c.tool_version)]
    assert lk.found is not None
    assert lk.found.via == "$CUDA_HOME"
    assert lk.found.release == "12.2"


@pytest.mark.parametrize(
    "pattern",
    [
        "pkg/a1/x.so",
        "pkg/a*/x.so",
        "*a2/x.so",
        "pkg/[ab]*/x.so",
        "pkg/a?/x.so",
        "pkg/*[.]so",
        "pkg/[*]x.so",
        "*",
        "pkg/a*",
        "pkg/nothing*.so",
        "[",
    ],
)
def test_a_detect_pattern_matches_as_fnmatch_does_in_record_order(tmp_path, pattern):
    # detection skips paths that lack a pattern's literal head or tail before matching: whatever the pattern's
    # shape, it must find the first RECORD path that fnmatchcase matches and whose bytes hold the tool name
    import fnmatch
    from dataclasses import replace

    files = {
        "pkg/b1/x.so": "no",
        "pkg/a1/x.so": "no",
        "pkg/a2/x.so": "ptxas",
        "pkg/a22/x.so": "ptxas",
        "pkg/*x.so": "ptxas",
        "pkg/ab/y.so": "ptxas",
        "[": "ptxas",
    }
    site = site_packages(tmp_path)
    write_dist(site, "pkg", "1.0", files)
    inv = installed_wheels([str(site)])
    row = ROWS["triton"]
    probe = replace(row, detect=(replace(row.detect[0], path=pattern, contains="ptxas"),))
    got = detect(probe, inv)
    dist = inv.get("pkg")
    assert dist is not None
    expected = next((p for p in dist.plain_rows if fnmatch.fnmatchcase(p, pattern) and files.get(p) == "ptxas"), None)
    assert (None if got is None else str(Path(got[1]).relative_to(site))) == expected
