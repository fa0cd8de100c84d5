"""The real tier: an older cuDNN on LD_LIBRARY_PATH beside the CUDA 13 torch venv, what really loads.

The sub-libraries of nvidia-cudnn-cu12 9.19.0.56 (from $CUDASTACK_WHEELS) go in a directory on
LD_LIBRARY_PATH. The truth is what glibc does in the real process: after ``import torch``, the wheel's
``libcudnn.so.9`` (DT_RPATH ``$ORIGIN``) opens ``libcudnn_graph.so.9`` when a handle is created (which fails
without a GPU, after the load), and the process's maps say which copy it got. The resolver, asked the same
from the same caller, must name that copy, and the dlopen item must then say nothing above an info about it.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.stack import Stack
from tests.helpers.realenv import torch_site, torch_venv

pytestmark = [pytest.mark.real, pytest.mark.xdist_group("torch-venv")]

CUDNN12 = "nvidia_cudnn_cu12-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl"
PROBE = """
import ctypes, sys
import torch
lib = ctypes.CDLL(sys.argv[1])
handle = ctypes.c_void_p()
lib.cudnnCreate(ctypes.byref(handle))  # no GPU needed to load the graph library; it fails after
for line in open("/proc/self/maps"):
    path = line.split()[-1]
    if path.endswith("/libcudnn_graph.so.9"):
        print(path)
        break
"""


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "elfcache"))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)


def _older_cudnn(tmp_path: Path) -> Path:
    wheel = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")) / CUDNN12
    if not wheel.is_file():
        pytest.skip(f"{wheel} absent")
    out = tmp_path / "old-cudnn"
    out.mkdir()
    with zipfile.ZipFile(wheel) as z:
        for sub in ("graph", "cnn"):  # the small ones: a few MB each
            (out / f"libcudnn_{sub}.so.9").write_bytes(z.read(f"nvidia/cudnn/lib/libcudnn_{sub}.so.9"))
    return out


def test_older_cudnn_on_ld_library_path_loses_to_the_shims_rpath(tmp_path, monkeypatch):
    venv = torch_venv()
    site = torch_site(venv)
    shim = os.path.join(site, "nvidia/cudnn/lib/libcudnn.so.9")
    if not os.path.exists(shim):
        pytest.skip("no nvidia-cudnn libcudnn.so.9 in the torch venv")
    old = _older_cudnn(tmp_path)
    env = {**os.environ, "LD_LIBRARY_PATH": str(old)}
    done = subprocess.run(
        [str(venv / "bin/python"), "-c", PROBE, shim], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    mapped = done.stdout.strip().splitlines()
    assert mapped, done.stderr[-2000:]
    real = os.path.realpath(mapped[-1])
    monkeypatch.setenv("LD_LIBRARY_PATH", str(old))
    config = SearchConfig.from_environment()
    assert config.ld_library_path == (str(old),)
    lib = Resolver(config).dlopen("libcudnn_graph.so.9", shim)
    assert lib.realpath == real  # the wheel's: libcudnn.so.9's DT_RPATH comes before LD_LIBRARY_PATH
    found = Stack(site_paths=(site,)).findings("dlopen")
    about = [f for f in found if f.subject.startswith("libcudnn_") and f.severity is not Severity.INFO]
    assert not about, "\n\n".join(f.render() for f in about)


def test_another_venvs_cudnn_on_ld_library_path_reaches_the_graph_librarys_opens(monkeypatch):
    # onnxruntime-gpu's venv ($CUDASTACK_HEALTHY) holds nvidia-cudnn-cu12's wheel: on LD_LIBRARY_PATH it comes
    # before the RUNPATH of torch's libcudnn_graph.so.9, which opens the engine sub-libraries by soname: mixed
    # cuDNN releases (pytorch/pytorch#188892, #185512: CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH at the first
    # convolution; loading them needs a GPU, so the resolver's glibc order, checked elsewhere against real
    # dlopen, is the oracle here). Their release is unknown from their files: warnings, naming both copies
    site = torch_site(torch_venv())
    healthy = Path(os.environ.get("CUDASTACK_HEALTHY", "/opt/cudastack-healthy")) / "onnxruntime-gpu"
    other = sorted(healthy.glob("lib/python3*/site-packages/nvidia/cudnn/lib"))
    if not other:
        pytest.skip(f"no nvidia-cudnn wheel in {healthy}")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(other[0]))
    found = [f for f in Stack(site_paths=(site,)).findings("dlopen") if f.subject.startswith("libcudnn_")]
    assert {f.subject for f in found} >= {"libcudnn_engines_precompiled.so.9", "libcudnn_heuristic.so.9"}
    for f in found:
        assert f.severity is Severity.WARNING
        assert f"is {other[0]}/{f.subject} (version unknown)" in f.message
    # the clean twin: torch's own cuDNN directory on LD_LIBRARY_PATH (the same files)
    monkeypatch.setenv("LD_LIBRARY_PATH", os.path.join(site, "nvidia/cudnn/lib"))
    again = [f for f in Stack(site_paths=(site,)).findings("dlopen") if f.severity is not Severity.INFO]
    assert not again, "\n\n".join(f.render() for f in again)
