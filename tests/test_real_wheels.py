"""Acceptance on the real torch CUDA venv ($CUDASTACK_TORCH_VENV) and real wheels ($CUDASTACK_WHEELS).

The venv itself is never modified: broken states are made in hard-linked copies (``cp -al``), which pip and
``rm`` change by unlinking and creating files, never by writing in place; the first fixture checks that
assumption on one library (inode, size and checksum of the original before and after).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.cli.report import WheelReport, wheel_report
from pytest_cudastack.findings import Severity

# cp -al and pip in the copies change the ctime of the venv's own inodes: keep these on one xdist worker,
# apart from tests that rely on those inodes staying untouched (test_treeview's closure-cache test).
pytestmark = [pytest.mark.real, pytest.mark.xdist_group("torch-venv")]

CUDNN12 = "nvidia_cudnn_cu12-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl"


def _venv() -> Path:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("CUDASTACK_TORCH_VENV unset or absent")
    return Path(venv)


def _site(venv: Path) -> str:
    sites = sorted(glob.glob(str(venv / "lib/python3*/site-packages")))
    if not sites:
        pytest.skip(f"no site-packages in {venv}")
    return sites[0]


def _wheel() -> Path:
    wheel = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")) / CUDNN12
    if not wheel.is_file():
        pytest.skip(f"{wheel} absent")
    return wheel


def _fingerprint(path: str) -> tuple[int, int, str]:
    st = os.stat(path)
    with open(path, "rb") as f:
        return st.st_ino, st.st_size, hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "elfcache"))


@pytest.fixture(scope="module")
def clean_report() -> WheelReport:
    return wheel_report([_site(_venv())])


@pytest.fixture(scope="module")
def cu12_over_cu13(tmp_path_factory) -> tuple[Path, str]:
    """A copy of the venv after ``pip install --no-deps nvidia-cudnn-cu12==9.19.0.56``."""
    venv, wheel = _venv(), _wheel()
    original = os.path.join(_site(venv), "nvidia/cudnn/lib/libcudnn.so.9")
    before = _fingerprint(original)
    copy = tmp_path_factory.mktemp("cu12") / "venv"
    subprocess.run(["cp", "-al", str(venv), str(copy)], check=True)
    subprocess.run(
        [str(copy / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    assert _fingerprint(original) == before, "pip wrote into a hard-linked file: the original venv changed"
    return copy, _site(copy)


@pytest.fixture(scope="module")
def after_uninstall(cu12_over_cu13, tmp_path_factory) -> tuple[Path, str]:
    """Then ``pip uninstall nvidia-cudnn-cu12`` and delete libnccl.so.2 and libcusparseLt.so.0."""
    src, _ = cu12_over_cu13
    copy = tmp_path_factory.mktemp("uninstalled") / "venv"
    subprocess.run(["cp", "-al", str(src), str(copy)], check=True)
    subprocess.run(
        [str(copy / "bin/python"), "-m", "pip", "uninstall", "-q", "-y", "nvidia-cudnn-cu12"],
        check=True,
        capture_output=True,
    )
    site = _site(copy)
    os.unlink(os.path.join(site, "nvidia/nccl/lib/libnccl.so.2"))
    os.unlink(os.path.join(site, "nvidia/cusparselt/lib/libcusparseLt.so.0"))
    return copy, site


def test_clean_torch_venv_has_no_failing_findings(clean_report):
    assert clean_report.failing == (), "\n\n".join(f.render() for f in clean_report.failing)
    assert not [f for f in clean_report.findings if f.severity is Severity.WARNING]
    inv = clean_report.inventory
    torch = inv.get("torch")
    assert torch is not None
    assert torch.version.startswith("2.")
    assert clean_report.modules >= 10
    assert sum(len(d.libraries) for d in inv.distributions) >= 100
    assert "13" in clean_report.flavours()
    cudnn = inv.get("nvidia-cudnn-cu13")
    assert cudnn is not None
    assert {lib.soname for lib in cudnn.libraries} >= {"libcudnn.so.9"}


def test_cu12_over_cu13_reports_overlap_and_broken_pin(cu12_over_cu13):
    _, site = cu12_over_cu13
    rep = wheel_report([site])
    errs = rep.failing
    overlap = [f for f in errs if "install the same" in f.message]
    assert len(overlap) == 1, "\n\n".join(f.render() for f in errs)
    (o,) = overlap
    assert "nvidia-cudnn-cu12 9.19.0.56 and nvidia-cudnn-cu13 9.24.0.43" in o.message
    assert "the bytes on disk are nvidia-cudnn-cu12 9.19.0.56's" in o.message
    assert "torch 2.14.1 requires nvidia-cudnn-cu13==9.24.0.43" in o.cause
    assert "uninstall -y nvidia-cudnn-cu12" in o.fix
    assert "pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43" in o.fix
    pins = [f for f in errs if f.subject == "torch -> nvidia-cudnn-cu13==9.24.0.43"]
    assert len(pins) == 1
    assert (
        "cuDNN version incompatibility at first use: torch was built against 9.24.0.43, "
        "the files on disk are 9.19.0.56" in pins[0].cause
    )
    assert "nvidia/cudnn/lib/libcudnn.so.9" in pins[0].message
    # import torch still works in this state: no closure error may be claimed
    assert not [f for f in errs if f.check == "closure"]


def test_uninstall_and_deleted_libraries_all_reported_at_once(after_uninstall):
    _, site = after_uninstall
    rep = wheel_report([site])
    closure = {f.subject: f for f in rep.failing if f.check == "closure"}
    assert set(closure) == {"libcudnn.so.9", "libnccl.so.2", "libcusparseLt.so.0"}
    for soname, dist, rel in (
        ("libcudnn.so.9", "nvidia-cudnn-cu13 9.24.0.43", "nvidia/cudnn/lib/libcudnn.so.9"),
        ("libnccl.so.2", "nvidia-nccl-cu13 2.30.7", "nvidia/nccl/lib/libnccl.so.2"),
        ("libcusparseLt.so.0", "nvidia-cusparselt-cu13 0.8.1", "nvidia/cusparselt/lib/libcusparseLt.so.0"),
    ):
        f = closure[soname]
        assert f.chain[0].startswith("torch/_C."), f.chain
        assert f.chain[-1].startswith("torch/lib/libtorch")
        assert f"{dist} lists {rel} but the file is gone" in f.cause
    integrity = [f for f in rep.failing if f.check == "integrity"]
    subjects = {f.subject for f in integrity}
    assert {"nvidia-cudnn-cu13 9.24.0.43", "nvidia-nccl-cu13 2.30.7", "nvidia-cusparselt-cu13 0.8.1"} <= subjects


def test_copies_left_the_original_intact(cu12_over_cu13, clean_report):
    # after all the mutations of the copies, the original still inventories clean
    again = wheel_report([_site(_venv())])
    assert again.failing == ()


def _why(site, soname, capsys):
    rc = main(["why", "--site", site, soname])
    text = capsys.readouterr().out
    assert main(["why", "--json", "--site", site, soname]) == rc
    return rc, text, json.loads(capsys.readouterr().out)


def test_why_libcudnn_answers_as_torch_loads_it(capsys):
    site = _site(_venv())
    rc, text, data = _why(site, "libcudnn.so.9", capsys)
    assert rc == 0, text
    assert "NOT FOUND" not in text.splitlines()[0]
    assert os.path.realpath(data["path"]) == os.path.join(site, "nvidia/cudnn/lib/libcudnn.so.9")
    assert data["provider"] == "nvidia-cudnn-cu13 9.24.0.43"
    assert data["route"] in ("runpath", "rpath")
    assert "torch/lib/libtorch" in data["route_detail"]
    assert "torch 2.14.1" in data["needed_by_providers"]


def test_why_says_whose_cudnn_bytes_are_on_disk(cu12_over_cu13, capsys):
    _, site = cu12_over_cu13
    rc, text, data = _why(site, "libcudnn.so.9", capsys)
    assert rc == 0, text
    assert "bytes on disk: nvidia-cudnn-cu12 9.19.0.56's" in text
    assert data["on_disk"]["bytes_of"] == ["nvidia-cudnn-cu12 9.19.0.56"]


def test_why_is_not_found_when_no_load_finds_it(after_uninstall, capsys):
    _, site = after_uninstall
    rc, text, data = _why(site, "libnccl.so.2", capsys)
    assert rc == 1, text
    assert text.startswith("libnccl.so.2 => NOT FOUND\n")
    assert "needed by: " in text
    assert "nvidia-nccl-cu13 2.30.7: " in text
    assert "MISSING on disk" in text
    assert all(os.path.isdir(t) for t in data["tried"])
