"""The requirements item on the real torch CUDA venv ($CUDASTACK_TORCH_VENV) and hard-linked copies of it
(``cp -al``, changed only through the copy's own ``python -m pip``): clean, one pin unmet (another
nvidia-nccl-cu13 from $CUDASTACK_WHEELS installed with ``--no-deps``), one required wheel uninstalled."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.findings import Severity
from pytest_cudastack.stack import Stack
from tests.helpers.realenv import torch_site, torch_venv

# cp -al and pip in the copies change the ctime of the venv's own inodes: on the torch-venv xdist worker
pytestmark = [pytest.mark.real, pytest.mark.xdist_group("torch-venv")]

NCCL = "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.whl"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "elfcache"))
    for var in ("LD_LIBRARY_PATH", "PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK"):
        monkeypatch.delenv(var, raising=False)


def _copy(tmp_path: Path, *pip: str) -> str:
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(torch_venv()), str(copy)], check=True)
    subprocess.run([str(copy / "bin/python"), "-m", "pip", *pip], check=True, capture_output=True)
    return torch_site(copy)


def _findings(site: str, check: str = "requirements"):
    return Stack(site_paths=(site,)).findings(check)


def test_the_clean_torch_venv_gives_no_error_or_warning():
    found = _findings(torch_site(torch_venv()))
    assert not [f for f in found if f.severity is not Severity.INFO], "\n\n".join(f.render() for f in found)


def test_one_pin_unmet(tmp_path):
    wheel = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")) / NCCL
    if not wheel.is_file():
        pytest.skip(f"{wheel} absent")
    site = _copy(tmp_path, "install", "-q", "--no-deps", "--no-index", str(wheel))
    (f,) = [f for f in _findings(site) if f.failing]
    assert f.message == "torch 2.14.1 requires nvidia-nccl-cu13==2.30.7; 2.28.9 is installed"
    assert "torch's own check says" in f.cause
    assert f.fix == f"{tmp_path}/venv/bin/python -m pip install --no-deps nvidia-nccl-cu13==2.30.7"


def test_one_required_wheel_uninstalled(tmp_path):
    site = _copy(tmp_path, "uninstall", "-q", "-y", "nvidia-nvshmem-cu13")
    (f,) = [f for f in _findings(site) if f.failing]
    assert f.message == "torch 2.14.1 requires nvidia-nvshmem-cu13==3.4.5, which is not installed"
    assert f.fix == f"{tmp_path}/venv/bin/python -m pip install nvidia-nvshmem-cu13==3.4.5"
    closure = [g for g in _findings(site, "closure") if g.failing]
    assert [g.subject for g in closure] == ["libnvshmem_host.so.3"]
    assert closure[0].cause.startswith("torch 2.14.1 requires nvidia-nvshmem-cu13==3.4.5, which is not installed")


def _apply_plan(site: str) -> None:
    """Run the plan ``cudastack check`` prints for the copy: every step automatic, offline (the pinned wheels
    from $CUDASTACK_WHEELS), with the copy's own pip; then the re-run has no error and no plan."""
    from pytest_cudastack.model.repair import plan_repairs
    from pytest_cudastack.settings import Settings

    stack = Stack(Settings(cudastack=True), site_paths=(site,))
    found = [f for name in stack.run_checks() for f in stack.findings(name)]
    plans = [p for p in plan_repairs(found, stack.inventory, reqs=stack.requirements) if p.steps]
    (plan,) = plans
    assert plan.unresolved == (), plan.render()
    wheels = os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")
    for step in plan.steps:
        assert step.kind == "automatic", plan.render()
        argv = list(step.argv or ())
        if argv[3] == "install":
            argv[4:4] = ["--no-index", "--find-links", wheels]
        subprocess.run(argv, check=True, capture_output=True)
    again = Stack(Settings(cudastack=True), site_paths=(site,))
    left = [f for name in again.run_checks() for f in again.findings(name) if f.failing]
    assert left == [], "\n\n".join(f.render() for f in left)


def test_the_plan_for_an_unmet_pin_repairs_it(tmp_path):
    wheel = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")) / NCCL
    if not wheel.is_file():
        pytest.skip(f"{wheel} absent")
    _apply_plan(_copy(tmp_path, "install", "-q", "--no-deps", "--no-index", str(wheel)))


def test_the_plan_for_a_missing_pinned_wheel_repairs_it(tmp_path):
    """The closure finding (libnvshmem_host.so.3 not found) and the requirements finding are repaired by one
    install: the model knows what the pinned wheel adds to the search (the library table)."""
    _apply_plan(_copy(tmp_path, "uninstall", "-q", "-y", "nvidia-nvshmem-cu13"))


# -- failures no issue of ours described, reproduced on the real venv (each with its real import as the oracle)


def _imports(site: str) -> subprocess.CompletedProcess[str]:
    python = Path(site).parents[2] / "bin/python"
    return subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, check=False)


def test_a_wheel_only_cuda_toolkits_extra_requires_uninstalled(tmp_path):
    # pip uninstall nvidia-cuda-nvrtc: torch requires it only through cuda-toolkit[nvrtc]==13.0.3, whose pin
    # (==13.0.88.*) names no -cuNN and no exact version; it was "outside the CUDA stack" and the plan generic
    site = _copy(tmp_path, "uninstall", "-q", "-y", "nvidia-cuda-nvrtc")
    run = _imports(site)
    assert run.returncode != 0
    assert "libnvrtc.so.13: cannot open shared object file" in run.stderr
    (f,) = [f for f in _findings(site) if f.failing]
    assert f.message.endswith("requires nvidia-cuda-nvrtc==13.0.88.*, which is not installed")
    (g,) = [g for g in _findings(site, "closure") if g.failing]
    assert g.subject == "libnvrtc.so.13"
    assert "requires nvidia-cuda-nvrtc==13.0.88.*, which is not installed; " in g.cause
    # the command the plan gives by hand repairs it (the wheel from the local store, as pip would pick it)
    store = [d for d in ("/opt/pypi-more/files", os.environ.get("CUDASTACK_WHEELS", "")) if d and os.path.isdir(d)]
    if not any(Path(d).glob("nvidia_cuda_nvrtc-13.0.88-*.whl") for d in store):
        pytest.skip("no nvidia_cuda_nvrtc 13.0.88 wheel in a local store")
    pip = [str(Path(site).parents[2] / "bin/python"), "-m", "pip", "install", "-q", "--no-index"]
    subprocess.run([*pip, *(f"--find-links={d}" for d in store), "nvidia-cuda-nvrtc==13.0.88.*"], check=True)
    assert _imports(site).returncode == 0
    assert not [f for f in _findings(site) if f.failing]


def test_a_newer_cusparse_than_cuda_toolkits_pin_is_a_warning(tmp_path):
    # pip install -U nvidia-cusparse: pip check objects to cuda-toolkit's ==12.6.3.3.*, but torch imports (a
    # newer cuSPARSE 12 keeps libcusparse.so.12 and what torch binds): it was an error, a false alarm
    wheels = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels"))
    found = sorted(wheels.glob("nvidia_cusparse-12.9.4.2-*.whl"))
    if not found:
        pytest.skip(f"no nvidia_cusparse 12.9.4.2 wheel in {wheels}")
    site = _copy(tmp_path, "install", "-q", "--no-deps", "--no-index", str(found[0]))
    assert _imports(site).returncode == 0
    found_req = _findings(site)
    assert not [f for f in found_req if f.failing], "\n\n".join(f.render() for f in found_req)
    (w,) = [f for f in found_req if f.severity is Severity.WARNING]
    assert (
        w.message
        == "cuda-toolkit 13.0.3.0 [extra cusolver] requires nvidia-cusparse==12.6.3.3.*; 12.9.4.2 is installed"
    )
    assert not [f for f in _findings(site, "symbols") if f.failing]


def test_cuda_toolkit_uninstalled_is_a_warning_whose_fix_keeps_torchs_extras(tmp_path):
    # pip uninstall cuda-toolkit (a meta package): torch still imports, pip check objects
    site = _copy(tmp_path, "uninstall", "-q", "-y", "cuda-toolkit")
    assert _imports(site).returncode == 0
    found = _findings(site)
    assert not [f for f in found if f.failing], "\n\n".join(f.render() for f in found)
    (w,) = [f for f in found if f.severity is Severity.WARNING]
    assert w.message.startswith("torch 2.14.1 requires cuda-toolkit[cublas,")
    (spec,) = w.pip[0].specs
    assert spec.startswith("cuda-toolkit[cublas,cudart,")
    assert spec.endswith("]==13.0.3")


@pytest.mark.parametrize(
    ("glob", "message"),
    [
        # cuDNN newer than torch's pin: torch's own check (runtime minor >= compile minor) accepts it
        pytest.param(
            "nvidia_cudnn_cu13-9.28.1.4-*.whl",
            "torch 2.14.1 requires nvidia-cudnn-cu13==9.24.0.43; 9.28.1.4 is installed",
            id="cudnn-newer",
        ),
        # cuBLAS older than cuda-toolkit's pin: every reference of torch's still binds (the symbols item's check)
        pytest.param(
            "nvidia_cublas-13.0.2.14-*.whl",
            "cuda-toolkit 13.0.3.0 [extra cublas] requires nvidia-cublas==13.1.1.3.*; 13.0.2.14 is installed",
            id="cublas-older",
        ),
    ],
)
def test_another_release_in_its_major_is_a_warning_where_torch_imports(tmp_path, glob, message):
    wheels = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels"))
    found = sorted(wheels.glob(glob))
    if not found:
        pytest.skip(f"no {glob} in {wheels}")
    site = _copy(tmp_path, "install", "-q", "--no-deps", "--no-index", str(found[0]))
    python = Path(site).parents[2] / "bin/python"
    code = "import torch; torch.backends.cudnn.version()"  # runs torch's cuDNN compatibility check
    run = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    found_req = _findings(site)
    assert not [f for f in found_req if f.failing], "\n\n".join(f.render() for f in found_req)
    assert [f.message for f in found_req if f.severity is Severity.WARNING] == [message]
    assert not [f for f in _findings(site, "symbols") if f.failing]
