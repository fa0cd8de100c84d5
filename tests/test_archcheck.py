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
