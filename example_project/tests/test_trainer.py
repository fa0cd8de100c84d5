"""The trainer's GPU tests. Each says which part of the CUDA stack it needs; on a machine without it the
test fails with the reason (CI), or is skipped with `pytest --cudastack-unmet=skip` (a laptop)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack import requires_soname

BIN = Path(__file__).resolve().parent.parent / "bin"


@requires_soname("libcudart.so.12", "libcublas.so.12")
def test_cublas_gemm_smoke():
    # would run a tiny GEMM through the CUDA 12 runtime; it needs both libraries to load
    subprocess.run([BIN / "train_ppo"], check=False)


@pytest.mark.requires_wheel("nvidia-cudnn-cu12>=9", "nvidia-nccl-cu12>=2.20")
def test_cudnn_conv_and_nccl_allreduce():
    import torch  # noqa: F401  (only reached when the wheels are installed and intact)


@pytest.mark.requires_driver(">=550")
@pytest.mark.requires_cuda(">=12.4")
def test_bf16_autocast():
    pass


@pytest.mark.requires_gpu(count=2, arch=">=8.0", memory="40GiB")
def test_two_gpu_training_step():
    pass


def test_stack_facts_are_recorded(cuda_driver, cuda_libs, cuda_wheels, cuda_stack, tmp_path):
    # the fixtures work on any machine: facts, not requirements
    assert cuda_libs.resolve("libc.so.6").path is not None
    for dist in cuda_wheels:
        assert dist.cuda_major in (11, 12, 13), dist.name
    if cuda_driver.version is not None:
        assert cuda_driver.cuda_version is not None
    (tmp_path / "stack.json").write_text(json.dumps(cuda_stack.to_json()))


def test_train_binaries_exist():
    assert (BIN / "train_ppo").exists(), "run ./build.sh first"
