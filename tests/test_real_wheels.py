"""Acceptance on the real torch CUDA venv ($CUDASTACK_TORCH_VENV) and real wheels ($CUDASTACK_WHEELS).

The venv itself is never modified: broken states are made in hard-linked copies (``cp -al``), which pip and
``rm`` change by unlinking and creating files, never by writing in place; the first fixture checks that
assumption on one library (inode, size and checksum of the original before and after).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.cli.report import WheelReport, render_report, wheel_report
from pytest_cudastack.findings import Severity
from pytest_cudastack.model.repair import plan_repairs, render_plans

# cp -al and pip in the copies change the ctime of the venv's own inodes: keep these on one xdist worker,
# apart from tests that rely on those inodes staying untouched (test_treeview's closure-cache test).
from tests.helpers.realenv import torch_site, torch_venv

pytestmark = [pytest.mark.real, pytest.mark.xdist_group("torch-venv")]

CUDNN12 = "nvidia_cudnn_cu12-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl"


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
    return wheel_report([torch_site(torch_venv())])


@pytest.fixture(scope="module")
def cu12_over_cu13(tmp_path_factory) -> tuple[Path, str]:
    """A copy of the venv after ``pip install --no-deps nvidia-cudnn-cu12==9.19.0.56``."""
    venv, wheel = torch_venv(), _wheel()
    original = os.path.join(torch_site(venv), "nvidia/cudnn/lib/libcudnn.so.9")
    before = _fingerprint(original)
    copy = tmp_path_factory.mktemp("cu12") / "venv"
    subprocess.run(["cp", "-al", str(venv), str(copy)], check=True)
    subprocess.run(
        [str(copy / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    assert _fingerprint(original) == before, "pip wrote into a hard-linked file: the original venv changed"
    return copy, torch_site(copy)


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
    site = torch_site(copy)
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
    # one cause (the RECORD-listed files are gone), one closure finding naming every soname
    (closure,) = [f for f in rep.failing if f.check == "closure"]
    assert closure.subject == "libcudnn.so.9, libcusparseLt.so.0, libnccl.so.2"
    assert closure.chain[0].startswith("torch/_C.")
    assert closure.chain[-1].startswith("torch/lib/libtorch")
    for soname, dist, rel in (
        ("libcudnn.so.9", "nvidia-cudnn-cu13 9.24.0.43", "nvidia/cudnn/lib/libcudnn.so.9"),
        ("libnccl.so.2", "nvidia-nccl-cu13 2.30.7", "nvidia/nccl/lib/libnccl.so.2"),
        ("libcusparseLt.so.0", "nvidia-cusparselt-cu13 0.8.1", "nvidia/cusparselt/lib/libcusparseLt.so.0"),
    ):
        (detail,) = [d for d in closure.details if d.startswith(f"{soname}: needed by torch/_C.")]
        assert " -> torch/lib/libtorch" in detail
        assert detail.endswith(f"; {dist} lists {rel} but the file is gone")
    integrity = [f for f in rep.failing if f.check == "integrity"]
    subjects = {f.subject for f in integrity}
    assert {"nvidia-cudnn-cu13 9.24.0.43", "nvidia-nccl-cu13 2.30.7", "nvidia-cusparselt-cu13 0.8.1"} <= subjects


def _apply(copy: Path, site: str) -> None:
    """Take the plan ``cudastack report`` prints for the copy and run it there, step by step."""
    rep = wheel_report([site])
    assert rep.failing
    (plan,) = rep.plans  # the plan the report printed (verified over the same findings)
    assert plan.steps
    assert plan.unresolved == ()
    assert all(s.kind == "automatic" for s in plan.steps)
    text = render_report(rep)
    assert text.startswith(render_plans((plan,), rep.findings))  # the plan first
    for step in plan.steps:
        assert text.count(step.command) == 1  # each command once
        assert step.argv[:3] == (str(copy / "bin/python"), "-m", "pip"), step.command
        subprocess.run(list(step.argv), check=True, capture_output=True)


def _imports_torch(copy: Path) -> None:
    done = subprocess.run(
        [str(copy / "bin/python"), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_printed_plan_repairs_the_seed_venv(after_uninstall, tmp_path):
    src, _ = after_uninstall
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(src), str(copy)], check=True)
    site = torch_site(copy)
    (plan,) = plan_repairs(wheel_report([site]).findings, wheel_report([site]).inventory)
    assert [s.command for s in plan.steps] == [
        f"{copy}/bin/python -m pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43 "
        "nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7"
    ]
    _apply(copy, site)
    _imports_torch(copy)
    again = wheel_report([site])
    assert again.failing == (), "\n\n".join(f.render() for f in again.failing)
    assert plan_repairs(again.findings, again.inventory) == ()


def test_the_plan_removes_a_metadata_only_stray_and_restores_the_pin(cu12_over_cu13, tmp_path):
    """cu12 installed over cu13, then cu13 uninstalled: cu12 is "metadata-only" and torch's pin is gone.
    Reinstalling cu12 would give torch the wrong cuDNN; the plan removes it and installs the pinned cu13."""
    src, _ = cu12_over_cu13
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(src), str(copy)], check=True)
    subprocess.run(
        [str(copy / "bin/python"), "-m", "pip", "uninstall", "-q", "-y", "nvidia-cudnn-cu13"],
        check=True,
        capture_output=True,
    )
    site = torch_site(copy)
    rep = wheel_report([site])
    (plan,) = plan_repairs(rep.findings, rep.inventory)
    py = f"{copy}/bin/python -m pip"
    assert [s.command for s in plan.steps] == [
        f"{py} uninstall -y nvidia-cudnn-cu12",
        f"{py} install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43",
    ]
    _apply(copy, site)
    _imports_torch(copy)
    assert wheel_report([site]).failing == ()


def test_pytest_in_the_seed_venv_names_every_soname_and_the_command_first(after_uninstall, tmp_path):
    """Done-when of issues 9 and 19: in the closure item's failure, every missing soname within its first 15
    lines; the single repair command once, in the repair plan before the failures, within the run's first 25
    lines, the cause on the line above its steps."""
    copy, _ = after_uninstall
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    here = [str(Path(__file__).resolve().parents[1]), *(p for p in sys.path if p.endswith("site-packages"))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(here))
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [
            str(copy / "bin/python"),
            "-m",
            "pytest",
            "--cudastack",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-p",
            "no:xdist",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    command = (
        f"{copy}/bin/python -m pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43 "
        "nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7"
    )
    start = next(i for i, line in enumerate(out) if line.startswith("_") and "cudastack::closure" in line)
    first = "\n".join(out[start + 1 : start + 16])
    for soname in ("libcudnn.so.9", "libcusparseLt.so.0", "libnccl.so.2"):
        assert soname in first, first
    assert "fix: see the cudastack repair plan above" in first, first
    plan = next(i for i, line in enumerate(out) if line == f"repair plan for {copy}:")
    assert out[plan + 1].startswith("  cause: ")
    assert out[plan + 2] == f"  1. [run] {command}"
    assert plan + 2 < 25, "\n".join(out[:30])  # the first command on the first screen
    assert done.stdout.count(command) == 1


def test_cuda_max_on_the_cu130_venv_is_one_finding_about_torch(capsys):
    site = torch_site(torch_venv())
    assert main(["check", "--site", site, "--cuda-max=12.9"]) == 1
    out = capsys.readouterr().out
    errors = [line for line in out.splitlines() if line.lstrip().startswith("error:")]
    assert len(errors) == 1, out
    assert "torch 2.14.1 is a CUDA 13 build; it pulls 16 CUDA 13 wheel(s): cuda-toolkit, nvidia-cublas" in errors[0]
    assert "--index-url https://download.pytorch.org/whl/cu129" in out
    assert "that it carries torch 2.14.1 is a guess" in out
    assert f"repair plan for {torch_venv()}" in out


def test_copies_left_the_original_intact(cu12_over_cu13, clean_report):
    # after all the mutations of the copies, the original still inventories clean
    again = wheel_report([torch_site(torch_venv())])
    assert again.failing == ()


def _why(site, soname, capsys):
    rc = main(["why", "--site", site, soname])
    text = capsys.readouterr().out
    assert main(["why", "--json", "--site", site, soname]) == rc
    return rc, text, json.loads(capsys.readouterr().out)


def test_why_libcudnn_answers_as_torch_loads_it(capsys):
    site = torch_site(torch_venv())
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


def test_check_on_the_clean_torch_venv_is_quiet(capsys):
    """Issue 19's budget: ``cudastack check`` on a clean real stack prints at most 15 lines, infos only with
    -v, and ends in a one-line summary."""
    site = torch_site(torch_venv())
    assert main(["check", "--site", site]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) <= 15, "\n".join(out)
    assert out[-1].startswith("cudastack check: 0 errors, 0 warnings, ")
    assert not [line for line in out if line.lstrip().startswith("info:")]
    assert main(["check", "--site", site, "-v"]) == 0
    assert any(line.lstrip().startswith("info:") for line in capsys.readouterr().out.splitlines())


def test_check_on_the_seed_venv_puts_the_cause_and_the_command_first(after_uninstall, capsys):
    """Issue 19's budget: the plan's first command within the first 15 lines of ``cudastack check``, the cause
    on the line above it, each command printed once, every finding pointing at its step."""
    copy, site = after_uninstall
    assert main(["check", "--site", site]) == 1
    text = capsys.readouterr().out
    out = text.splitlines()
    first = next(i for i, line in enumerate(out) if line.startswith("  1. [run] "))
    assert first < 15, "\n".join(out[:20])
    assert out[first - 1].startswith("  cause: ")
    command = out[first].removeprefix("  1. [run] ")
    assert command.startswith(f"{copy}/bin/python -m pip install --force-reinstall --no-deps ")
    assert text.count(command) == 1
    assert f"fix: step 1 of the repair plan for {copy}" in text
    assert out[-1].startswith("cudastack check: ")


def test_a_declared_550_driver_on_the_cuda13_torch_venv_is_one_error_with_a_pip_plan(capsys):
    """Issue 19: --cuda-driver=550.54.15 on the clean CUDA 13 torch venv was 3 errors for one cause and no pip
    plan. Now: one error, its remedies as data (a driver of the CUDA 13 branch; torch's build for CUDA 12.4),
    and a plan whose automatic steps the model verified, saying what it chose over the driver upgrade."""
    site = torch_site(torch_venv())
    assert main(["check", "--site", site, "--cuda-driver=550.54.15", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (error,) = [f for f in doc["items"]["driver"] if f["severity"] == "error"]
    kinds = [r["kind"] for r in error["remedies"]]
    assert kinds == ["driver", "use-build"]
    assert error["remedies"][0]["minimum"].startswith("580")
    (plan,) = [p for p in doc["repair"] if p["steps"]]
    assert [s["kind"] for s in plan["steps"]] == ["automatic", "automatic"]
    assert plan["steps"][-1]["argv"][-3:] == ["--index-url", "https://download.pytorch.org/whl/cu124", "torch==2.14.1"]
    assert error["id"] in plan["fixes"]
    assert any("NVIDIA driver >= 580" in c for c in plan["chose"])
