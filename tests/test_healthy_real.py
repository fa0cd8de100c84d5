"""Healthy real environments stay green (issue 25, deliverable 5): each environment is first confirmed healthy
by a real import in a child process, then the whole check run must give no ERROR and no untrue WARNING.

The environments are built once by ``.ci/run`` under $CUDASTACK_HEALTHY (default /opt/cudastack-healthy);
a test skips when its environment is absent. A WARNING is accepted only when it names an import that really
fails: "`import X` will fail: libY is not found" is checked by running ``import X`` in a fresh child of that
environment's interpreter, which must fail naming libY.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from tests.helpers.realenv import Env, child, torch_site, untrue_warning

pytestmark = [pytest.mark.real]


def _healthy() -> Path:
    return Path(os.environ.get("CUDASTACK_HEALTHY", "/opt/cudastack-healthy"))


def _venv(name: str, health: str) -> Env:
    venv = _healthy() / name
    if not (venv / "bin/python").exists():
        pytest.skip(f"{venv} absent (built by .ci/run)")
    return Env(str(venv / "bin/python"), torch_site(venv), health)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "elfcache"))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)


def _confirm_healthy(env: Env) -> None:
    done = child(env, env.health)
    assert done.returncode == 0, f"the environment is not healthy: {env.health!r} failed:\n{done.stderr}"


def _assert_green(env: Env, tmp_path: Path) -> list[Finding]:
    _confirm_healthy(env)
    # rootdir: an empty directory, so that this repository's own files are not read as the project's imports
    results = Stack(Settings(cudastack=True), rootdir=str(tmp_path), site_paths=(env.site,)).run_checks()
    found = [f for fs in results.values() for f in fs]
    errors = [f for f in found if f.severity is Severity.ERROR]
    warnings = [f for f in found if f.severity is Severity.WARNING]
    untrue = [(f, why) for f in warnings if (why := untrue_warning(env, f)) is not None]
    shown = "\n\n".join(f.render() for f in errors + warnings)
    reasons = "\n".join(f"untrue: {f.id}: {why}" for f, why in untrue)
    assert (len(errors), len(untrue)) == (0, 0), (
        f"errors, untrue warnings: {len(errors)}, {len(untrue)}\n{reasons}\n\n{shown}"
    )
    return warnings


@pytest.mark.xdist_group("torch-venv")
def test_cupy_cuda13x_beside_the_cuda13_torch(tmp_path):
    # a hard-linked copy of the torch venv with cupy-cuda13x installed by its own pip
    env = _venv("cupy13-torch", "import torch, cupy; cupy.ndarray")
    warnings = _assert_green(env, tmp_path)
    # Acceptable warnings: cupy's optional modules whose libraries it does not install without its [ctk]
    # extra (cupy.cuda.cufft: libcufft.so.12, cusolver, cutensor, nccl, cupy.cuda.jitify: libnvrtc.so.13).
    # Each fails when imported first in a process (checked above); after `import torch` the same sonames are
    # already loaded from torch's wheels and the import succeeds, so "will fail" holds for a plain import only.
    assert all(f.check == "closure" for f in warnings), [f.id for f in warnings]


def test_cupy_cuda12x_alone(tmp_path):
    env = _venv("cupy12", "import cupy; cupy.ndarray")
    warnings = _assert_green(env, tmp_path)
    # Acceptable warnings: without [ctk] no CUDA 12 library is installed, so cupy's optional modules
    # (cupy_backends.cuda.libs.cublas, cupy.cuda.cufft, curand, cusolver, cusparse, cutensor, nccl,
    # cupy.cuda.jitify) fail to import, each on the library the warning names (checked above).
    assert all(f.check == "closure" for f in warnings), [f.id for f in warnings]


def test_pip_target_layout(tmp_path):
    target = _healthy() / "target-cudart12"
    if not (target / "nvidia").is_dir():
        pytest.skip(f"{target} absent (built by .ci/run)")
    health = (
        "import ctypes, os, nvidia.cuda_runtime as m; "
        "lib = ctypes.CDLL(os.path.join(list(m.__path__)[0], 'lib', 'libcudart.so.12')); "
        "v = ctypes.c_int(); assert lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and v.value >= 12000"
    )
    env = Env(sys.executable, str(target), health, (("PYTHONPATH", str(target)),))
    assert _assert_green(env, tmp_path) == []


def test_debian_system_python_with_apt_yaml(tmp_path):
    dist = "/usr/lib/python3/dist-packages"
    if not (os.path.exists("/usr/bin/python3") and os.path.isdir("/var/lib/dpkg/info")):
        pytest.skip("no Debian system Python here")
    if not list(Path(dist).glob("PyYAML-*-info")):
        pytest.skip("python3-yaml not installed (apt-get install python3-yaml)")
    # the C extension (_yaml, stripped by the Debian build after pip's RECORD was written) really loads
    env = Env("/usr/bin/python3", dist, "import yaml; yaml.CSafeLoader; yaml.load('a: 1', Loader=yaml.CSafeLoader)")
    assert _assert_green(env, tmp_path) == []


def test_onnxruntime_gpu_with_its_cuda12_wheels(tmp_path):
    # onnxruntime-gpu 1.24.4[cuda,cudnn]: the last builds for CUDA 12 (1.25 on are CUDA 13 builds)
    health = "import onnxruntime as o; o.preload_dlls(); assert 'CUDAExecutionProvider' in o.get_available_providers()"
    warnings = _assert_green(_venv("onnxruntime-gpu", health), tmp_path)
    # Acceptable warning: libonnxruntime_providers_cuda.so has no RPATH to the nvidia wheels, so it loads only
    # after onnxruntime.preload_dlls() (or torch's import) has loaded them; a plain `import onnxruntime` and a
    # CUDA session falls back to the CPU (checked above: loading it after `import onnxruntime` fails).
    # The dlopen item says the same of the provider's run-time load (its DT_NEEDED, searched from it).
    assert all(f.check in ("requirements", "dlopen") for f in warnings), [f.id for f in warnings]
    assert [f.subject for f in warnings if f.check == "dlopen"] in ([], ["libonnxruntime_providers_cuda.so"])
    # and it says the libraries are installed (its wheels), not that they are missing
    framework = [f for f in warnings if f.check == "requirements"]
    assert all("installed wheels ship them, outside its search path" in f.message for f in framework)
