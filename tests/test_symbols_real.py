"""The symbols check on the real torch CUDA venv ($CUDASTACK_TORCH_VENV), tier ``real``.

The venv itself is never modified: the broken state is made in a hard-linked copy (``cp -al``) in which pip
replaces files by unlinking them, as tests/test_real_wheels.py does. The nccl wheel comes from
$CUDASTACK_WHEELS (default /opt/cudastack-wheels); the test skips without it.
"""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.checks.symbols import extension_symbol_findings
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.realenv import torch_site, torch_venv

pytestmark = [pytest.mark.real, pytest.mark.xdist_group("torch-venv")]

NCCL11 = "nvidia_nccl_cu11-2.14.3-*.whl"


def _findings(venv: Path, cache_dir: Path):
    cache = ElfCache(str(cache_dir))
    inv = installed_wheels([torch_site(venv)], reader=cache.read)
    resolver = Resolver(SearchConfig.from_environment({}), reader=cache.read, owner=inv.owner)
    return extension_symbol_findings(inv, resolver, cache.read_symbols, interpreter=str(venv / "bin/python"))


def test_clean_torch_venv_binds_every_symbol(tmp_path: Path):
    findings = _findings(torch_venv(), tmp_path)
    assert findings == (), "\n\n".join(f.render() for f in findings)


def test_older_nccl_than_torch_pins_names_symbol_soname_and_wheel(tmp_path: Path):
    venv = torch_venv()
    wheels = sorted(glob.glob(os.path.join(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels"), NCCL11)))
    if not wheels:
        pytest.skip(f"no {NCCL11} in $CUDASTACK_WHEELS")
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(venv), str(copy)], check=True)
    subprocess.run(
        [str(copy / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheels[-1]],
        check=True,
        capture_output=True,
    )
    findings = _findings(copy, tmp_path / "cache")
    assert findings
    assert all(f.failing for f in findings)
    nccl = [f for f in findings if "libnccl.so.2 " in f.message]
    assert nccl, "\n\n".join(f.render() for f in findings)
    assert any("undefined symbol: ncclCommResume" in d for f in nccl for d in f.details)
    assert all("nvidia-nccl-cu11 2.14.3" in f.message for f in nccl)
