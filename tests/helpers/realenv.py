"""The real-environment tier's torch CUDA venv ($CUDASTACK_TORCH_VENV, built by .ci/run): skip when absent."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

__all__ = ["torch_site", "torch_venv"]


def torch_venv() -> Path:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("CUDASTACK_TORCH_VENV unset or absent")
    return Path(venv)


def torch_site(venv: Path) -> str:
    """The venv's site-packages directory."""
    sites = sorted(glob.glob(str(venv / "lib/python3*/site-packages")))
    if not sites:
        pytest.skip(f"no site-packages in {venv}")
    return sites[0]
