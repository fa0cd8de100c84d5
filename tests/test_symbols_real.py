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


def _cu11_nccl_copy(tmp_path: Path) -> Path:
    """A ``cp -al`` copy of the torch venv with nvidia-nccl-cu11 installed over torch's cu13 NCCL (--no-deps)."""
    wheels = sorted(glob.glob(os.path.join(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels"), NCCL11)))
    if not wheels:
        pytest.skip(f"no {NCCL11} in $CUDASTACK_WHEELS")
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(torch_venv()), str(copy)], check=True)
    pip = [str(copy / "bin/python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", wheels[-1]], check=True, capture_output=True)
    return copy


def test_older_nccl_than_torch_pins_names_symbol_soname_and_wheel(tmp_path: Path):
    copy = _cu11_nccl_copy(tmp_path)
    findings = _findings(copy, tmp_path / "cache")
    assert findings
    assert all(f.failing for f in findings)
    nccl = [f for f in findings if "libnccl.so.2 " in f.message]
    assert nccl, "\n\n".join(f.render() for f in findings)
    assert any("undefined symbol: ncclCommResume" in d for f in nccl for d in f.details)
    assert all("nvidia-nccl-cu11 2.14.3" in f.message for f in nccl)


def test_the_plan_for_a_cu11_nccl_over_cu13_claims_the_symbol_errors_and_repairs_them(tmp_path: Path):
    """The round-2 plan's two commands repaired the symbol errors too, yet said "not repaired by it: symbols":
    the model now sees that they put nvidia-nccl-cu13's own bytes back at the libnccl.so.2 the symbols were to
    come from. Applied to the copy with its own pip, offline, the re-run is clean."""
    from pytest_cudastack.settings import Settings
    from pytest_cudastack.stack import Stack

    copy = _cu11_nccl_copy(tmp_path)
    stack = Stack(Settings(cudastack=True), site_paths=(torch_site(copy),))
    found = [f for name in ("integrity", "closure", "symbols") for f in stack.findings(name)]
    from pytest_cudastack.model.repair import plan_repairs

    (plan,) = [p for p in plan_repairs(found, stack.inventory, reqs=stack.requirements) if p.steps]
    symbols = [f.id for f in found if f.check == "symbols" and f.failing]
    assert symbols
    assert set(symbols) <= set(plan.fixes), plan.render()
    assert plan.unresolved == ()
    for step in plan.automatic:
        argv = list(step.argv or ())
        if argv[3] == "install":  # offline: the wheels of the pins are in $CUDASTACK_WHEELS or pip's cache
            argv[4:4] = ["--no-index", "--find-links", os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")]
        subprocess.run(argv, check=True, capture_output=True)
    again = Stack(Settings(cudastack=True), site_paths=(torch_site(copy),))
    left = [f for name in ("integrity", "closure", "symbols") for f in again.findings(name) if f.failing]
    assert left == [], "\n\n".join(f.render() for f in left)


def test_static_prediction_of_the_cu11_nccl_import_names_the_symbol_the_loader_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """T4's case: ``import torch`` fails with ``undefined symbol: ncclCommResume``; ``loaded torch --static``
    fails too, naming that symbol first (the first unbound reference in libtorch_cuda.so's relocation order,
    not the first by name), and the symbols item's finding leads with it."""
    from pytest_cudastack.checks.symbols import loader_message
    from pytest_cudastack.cli.loaded import loaded_libraries, static_document

    copy = _cu11_nccl_copy(tmp_path)
    site = torch_site(copy)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    _libs, error = loaded_libraries("torch", python=str(copy / "bin/python"), site_paths=[site])
    assert error is not None
    real = error.split("undefined symbol: ", 1)[1].split()[0]
    doc, clean = static_document("torch", [site])
    assert not clean
    assert doc["error"].split("undefined symbol: ", 1)[1].split()[0] == real
    assert os.path.basename(doc["error"].split(":", 1)[0]) == os.path.basename(error.split(":")[1].strip())
    cuda = [f for f in _findings(copy, tmp_path / "cache2") if f.subject.endswith("libtorch_cuda.so")]
    assert cuda
    assert cuda[0].details[0] == f"undefined symbol: {real}"
    assert (loader_message(cuda[0]) or "").endswith(f"undefined symbol: {real}")


def test_cusparse_cu12_over_an_older_nvjitlink_names_the_nvjitlink_wheel(tmp_path: Path):
    # pip resolving nvidia-nvjitlink-cu12 older than nvidia-cusparse-cu12 needs (NVIDIA/cuvs#1794, pytorch#111469)
    # beside cupy-cuda12x, whose cuda-pathfinder opens libcusparse.so.12 by path: the real import fails with
    # "undefined symbol: __nvJitLinkGetErrorLogSize_12_9, version libnvJitLink.so.12"
    healthy = Path(os.environ.get("CUDASTACK_HEALTHY", "/opt/cudastack-healthy")) / "cupy12"
    wheels = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels"))
    found = [
        sorted(wheels.glob(g))
        for g in ("nvidia_cusparse_cu12-12.5.10.65-*.whl", "nvidia_nvjitlink_cu12-12.1.105-*.whl")
    ]
    if not (healthy / "bin/python").exists() or not all(found):
        pytest.skip(f"needs {healthy} and the nvidia-cusparse-cu12 12.5.10.65 / nvidia-nvjitlink-cu12 12.1.105 wheels")
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(healthy), str(copy)], check=True)
    pip = [str(copy / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*pip, str(found[0][0]), str(found[1][0])], check=True, capture_output=True)
    code = "import cupy\nfrom cupy_backends.cuda.libs import cusparse\n"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    run = subprocess.run([str(copy / "bin/python"), "-c", code], capture_output=True, text=True, check=False, env=env)
    assert "undefined symbol: __nvJitLinkGetErrorLogSize_12_9, version libnvJitLink.so.12" in run.stderr
    (f,) = [f for f in _findings(copy, tmp_path / "cache") if "libcusparse.so.12" in f.subject]
    assert "resolved to nvidia/nvjitlink/lib/libnvJitLink.so.12" in f.message
    assert "from nvidia-nvjitlink-cu12 12.1.105" in f.message
    assert f.details[0] == "undefined symbol: __nvJitLinkGetErrorLogSize_12_9, version libnvJitLink.so.12"
    assert "install the release of nvidia-nvjitlink-cu12 whose libnvJitLink.so.12 defines" in f.render()
