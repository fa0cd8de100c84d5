"""The seed-1 incident end to end with the real NVIDIA libraries (tier ``real``).

Binaries are linked by gcc against the real ``libcublas.so.13`` (CUDA 13 wheels of the torch venv,
$CUDASTACK_TORCH_VENV) and the real ``libcudart.so.12`` (unzipped from the nvidia-cuda-runtime-cu12 wheel in
$CUDASTACK_WHEELS, default /opt/cudastack-wheels). The same scenario with gcc-built stubs runs in the plain
tier (tests/test_plugin.py::test_seed_*).
"""

from __future__ import annotations

import glob
import os
import zipfile
from pathlib import Path

import pytest

from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import build_exe, needs_cc

pytestmark = [pytest.mark.real, needs_cc]


def _cu13_lib_dir() -> Path:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("needs the real torch CUDA venv ($CUDASTACK_TORCH_VENV)")
    found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "cu13", "lib"))
    if not found or not os.path.exists(os.path.join(found[0], "libcublas.so.13")):
        pytest.skip(f"no nvidia/cu13/lib/libcublas.so.13 in {venv}")
    return Path(found[0])


@pytest.fixture(scope="module")
def cudart12(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")
    found = sorted(glob.glob(os.path.join(wheels, "nvidia_cuda_runtime_cu12-*.whl")))
    if not found:
        pytest.skip(f"no nvidia-cuda-runtime-cu12 wheel in {wheels}")
    out = tmp_path_factory.mktemp("cu12")
    with zipfile.ZipFile(found[-1]) as whl:
        member = next(n for n in whl.namelist() if n.endswith("/lib/libcudart.so.12"))
        (out / "libcudart.so.12").write_bytes(whl.read(member))
    return out / "libcudart.so.12"


@pytest.fixture
def seed_real(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cudart12: Path) -> pytest.Pytester:
    cu13 = _cu13_lib_dir()
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    bin_dir = pytester.path / "bin"
    build_exe(
        bin_dir / "train_tft_parquet", needed=[cu13 / "libcublas.so.13", cu13 / "libcudart.so.13"], runpath=str(cu13)
    )
    build_exe(bin_dir / "train_ppo", needed=[cudart12], runpath=str(cudart12.parent))
    pytester.makepyfile("def test_x(): pass")
    return pytester


def run(pt: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pt.runpytest("-p", "pytest_cudastack.plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def test_real_cuda_max_12_9_fails_on_the_cuda13_binary_only(seed_real):
    result = run(seed_real, "--cuda-max=12.9", "--cudastack-scan=bin", "-v")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "cudastack::cuda-max FAILED*",
            "cudastack::scan[[]bin/train_ppo] PASSED*",
            "cudastack::scan[[]bin/train_tft_parquet] PASSED*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(
        ["*[[]error] bin/train_tft_parquet: links libcublas.so.13 (CUDA 13.x) but --cuda-max=12.9"]
    )
    assert "train_ppo:" not in result.stdout.str()


def test_real_cuda_max_13_0_passes(seed_real):
    run(seed_real, "--cuda-max=13.0", "--cudastack-scan=bin").assert_outcomes(passed=4)


def test_real_driver_550_cannot_run_the_cuda13_binary(seed_real):
    result = run(
        seed_real, "--cudastack", "--cudastack-scan=bin", "--cuda-driver=550.54.15", "-k", "driver and not test_x"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*bin/train_tft_parquet: CUDA 13 is required; driver 550.54.15 (declared)*CUDA 13 needs driver*"]
    )
