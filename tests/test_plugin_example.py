"""example_project/ run the way its README says, with stub CUDA libraries built by its build.sh --stubs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.cuda.driver import NVML_LIBRARY_ENV
from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import needs_cc

EXAMPLE = Path(__file__).resolve().parent.parent / "example_project"


@pytest.fixture
def example(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    # the example runs as on its CI runner, without a GPU, whatever this host has: NVML cannot load (the
    # run's subprocess probes afresh), so no GPU meets requires_gpu and no probed arch turns GPU code on
    monkeypatch.setenv(NVML_LIBRARY_ENV, str(pytester.path / "no-libnvidia-ml.so.1"))
    for item in ("pyproject.toml", "build.sh", "src", "tests", ".github"):
        src = EXAMPLE / item
        if src.is_dir():
            shutil.copytree(src, pytester.path / item)
        else:
            shutil.copy2(src, pytester.path / item)
    return pytester


def build(pt: pytest.Pytester, *args: str) -> None:
    subprocess.run(["bash", str(pt.path / "build.sh"), "--stubs", *args], check=True, capture_output=True)


def run(pt: pytest.Pytester, *args: str) -> pytest.RunResult:
    # PYTHONPATH-free subprocess: the example's own pyproject.toml (cuda_max, cudastack_scan) is the ini file
    return pt.runpytest_subprocess("-p", "pytest_cudastack.plugin", "-p", "no:cacheprovider", *args)


@needs_cc
def test_example_clean_build_passes(example):
    build(example)
    result = run(example, "--cuda-driver=550.54.15", "--cudastack-unmet=skip", "-v")
    result.assert_outcomes(passed=6, skipped=3)  # cuda-max, driver (turned on by --cuda-driver), scan, 3 tests
    result.stdout.fnmatch_lines(
        [
            "cudastack: driver 550.54.15 (declared) | CUDA <= 12.4 | * | --cuda-max=12.9 (from ini) | scan: 1 file",
            "cudastack::cuda-max PASSED*",
            "cudastack::driver PASSED*",
            "cudastack::scan[[]bin/train_ppo] PASSED*",
        ],
        consecutive=False,
    )


@needs_cc
def test_example_cuda13_binary_fails_ci(example):
    build(example, "--with-cuda13")
    result = run(example, "--cuda-driver=550.54.15", "--cudastack-unmet=skip")
    result.assert_outcomes(passed=5, failed=2, skipped=3)  # cuda-max and driver: CUDA 13 needs driver >= 580
    result.stdout.fnmatch_lines(["*bin/train_tft: links libcublas.so.13 (CUDA 13.x) but --cuda-max=12.9 (from ini)"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@needs_cc
def test_example_unmet_markers_fail_by_default(example):
    build(example)
    result = run(example, "--cuda-driver=550.54.15", "-k", "not cudastack")
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines(
        ["*requires_gpu(count=2, arch='>=8.0', memory='40GiB') unmet: *requires 2 GPUs, arch >=8.0*"]
    )
