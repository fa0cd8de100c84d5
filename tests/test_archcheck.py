from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.checks.arch import arch_findings
from pytest_cudastack.errors import OptionError
from pytest_cudastack.findings import Severity


@pytest.fixture(scope="module")
def libk(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    tmp = tmp_path_factory.mktemp("arch")
    (tmp / "k.cu").write_text("__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    out = tmp / "libk.so"
    subprocess.run(
        [
            "nvcc",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-o",
            str(out),
            str(tmp / "k.cu"),
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90,code=compute_90",
        ],
        check=True,
        capture_output=True,
    )
    return str(out)


@pytest.mark.parametrize(
    ("arch", "severity"),
    [
        pytest.param("sm_80", None, id="exact SASS"),
        pytest.param("sm_86", None, id="SASS of the same major"),
        pytest.param("sm_120", Severity.WARNING, id="only PTX covers it"),
        pytest.param("sm_75", Severity.ERROR, id="nothing runs"),
    ],
)
def test_coverage_verdicts(libk: str, arch: str, severity: Severity | None) -> None:
    findings = arch_findings([libk], [arch])
    assert [f.severity for f in findings] == ([severity] if severity else [])


def test_error_names_what_the_file_carries_and_the_fix(libk: str) -> None:
    (finding,) = arch_findings([libk], ["sm_75"], source="declared")
    assert "sm_75 (declared)" in finding.message
    assert "SASS sm_80 and PTX compute_90" in finding.cause
    assert "arch=compute_75,code=sm_75" in finding.fix


def test_host_only_files_and_unreadable_files(tmp_path: Path) -> None:
    assert arch_findings(["/bin/sh"], ["sm_90"]) == ()
    (finding,) = arch_findings([str(tmp_path / "gone.so")], ["sm_90"])
    assert finding.severity is Severity.WARNING
    assert "gone.so" in finding.message


@pytest.mark.parametrize("bad", ["twelve", "sm_", "9.10", "", "sm_9"])
def test_bad_arch_is_an_option_error(bad: str) -> None:
    with pytest.raises(OptionError, match="invalid GPU arch"):
        arch_findings(["/bin/sh"], [bad])


# -- real tier: torch 2.14.1+cu130 through `cudastack check`, as a user runs it --------------------------------
def _check_json(site: str, *options: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict]:
    import contextlib
    import io
    import json

    from pytest_cudastack.cli import main

    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # no configuration file of this repository
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["check", "--json", "--cudastack", "--cuda-driver=580.65.06", *options, "--site", site])
    return rc, json.loads(buf.getvalue())


@pytest.mark.real
def test_real_check_cuda_arch_sm_60_fails_naming_torch_sm_60_and_cuda_13(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers.realenv import torch_site, torch_venv

    rc, doc = _check_json(torch_site(torch_venv()), "--cuda-arch=sm_60", tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert rc == 1
    errors = [f for f in doc["items"]["arch"] if f["severity"] == "error"]
    torch = next(f for f in errors if f["subject"].startswith("torch 2.14.1"))
    assert "sm_60" in torch["message"]
    assert "SASS sm_75" in torch["message"]
    assert "CUDA 13" in torch["cause"]
    assert any(f["subject"] == "sm_60" and "CUDA 13" in f["message"] for f in errors)


@pytest.mark.real
def test_real_check_cuda_arch_sm_90_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.realenv import torch_site, torch_venv

    rc, doc = _check_json(torch_site(torch_venv()), "--cuda-arch=sm_90", tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert [f for f in doc["items"]["arch"] if f["severity"] == "error"] == []
    assert rc == 0, [f for found in doc["items"].values() for f in found if f["severity"] == "error"]
    assert [f for f in doc["items"]["toolchain"] if f["severity"] == "error"] == []


@pytest.mark.real
def test_real_toolchain_reads_tritons_bundled_ptxas_versions() -> None:
    import os

    from pytest_cudastack.checks.toolchain import framework_lookups
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.wheels.inventory import installed_wheels
    from tests.helpers.realenv import torch_site, torch_venv

    site = torch_site(torch_venv())
    cache = ElfCache(enabled=False)
    inv = installed_wheels([site], reader=cache.read)
    env = {"PATH": "/usr/bin:/bin"}
    lookups = {(d.name, lk.tool): lk for d, lk in framework_lookups(inv, env, cache.tool_version)}
    for tool in ("ptxas", "ptxas-blackwell"):
        found = lookups[("triton", tool)].found
        assert found is not None
        assert found.path == os.path.join(site, "triton", "backends", "nvidia", "bin", tool)
        oracle = subprocess.run([found.path, "--version"], capture_output=True, text=True, check=True).stdout
        assert f"V{found.version}" in oracle  # the test oracle runs it; the check never does
