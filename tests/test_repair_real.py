"""Verified repairs on a copy of the real torch venv (issue 12, part 5): the seed's "metadata-only"
nvidia-cudnn-cu12. Every fix `cudastack check` prints is the model-verified plan's command; applied offline with
the copy's own pip, it leaves `import torch` working and the re-run clean."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from tests.helpers.realenv import torch_site, torch_venv

pytestmark = [pytest.mark.real, pytest.mark.xdist_group("torch-venv")]

CUDNN12 = "nvidia_cudnn_cu12-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl"
CUDNN13 = "nvidia_cudnn_cu13-9.24.0.43-py3-none-manylinux_2_27_x86_64.whl"  # torch 2.14.1's pin


def _wheels() -> Path:
    store = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels"))
    for name in (CUDNN12, CUDNN13):
        if not (store / name).is_file():
            pytest.skip(f"{store / name} absent (.ci/run downloads it)")
    return store


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "elfcache"))


def _pip(copy: Path, *args: str) -> None:
    subprocess.run([str(copy / "bin/python"), "-m", "pip", "-q", *args], check=True, capture_output=True)


def _check(site: str, capsys) -> tuple[int, dict]:
    rc = main(["check", "--json", "--site", site])
    return rc, json.loads(capsys.readouterr().out)


def test_metadata_only_cudnn_repair_is_verified_and_works(tmp_path, capsys):
    store, venv = _wheels(), torch_venv()
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(venv), str(copy)], check=True)
    _pip(copy, "install", "--no-deps", "--no-index", str(store / CUDNN12))
    _pip(copy, "uninstall", "-y", "nvidia-cudnn-cu13")  # deletes the paths cu12 had overwritten
    site = torch_site(copy)

    rc, doc = _check(site, capsys)
    assert rc == 1
    (plan,) = doc["repair"]
    py = f"{copy}/bin/python -m pip"
    assert [s["command"] for s in plan["steps"]] == [
        f"{py} uninstall -y nvidia-cudnn-cu12",
        f"{py} install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43",
    ]
    assert plan["unresolved"] == []
    failing = [f for found in doc["items"].values() for f in found if f["severity"] == "error"]
    assert {f["check"] for f in failing} == {"integrity", "closure", "requirements"}
    # each item's fix is the plan's command; the naive reinstall of the stray is printed nowhere
    assert {f["fix"] for f in failing} == {plan["command"]}
    assert "nvidia-cudnn-cu12==" not in json.dumps(doc)

    for step in plan["steps"]:
        argv = list(step["argv"])
        assert argv[:3] == [str(copy / "bin/python"), "-m", "pip"]
        if argv[3] == "install":
            argv[4:4] = ["--no-index", "--find-links", str(store)]  # offline, from the local wheel store
        subprocess.run(argv, check=True, capture_output=True)

    done = subprocess.run(
        [str(copy / "bin/python"), "-c", "import torch; print(torch.backends.cudnn.version())"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rc, again = _check(site, capsys)
    assert rc == 0, json.dumps(again["items"], indent=1)[-4000:]
    assert again["repair"] == []


def test_a_deleted_cudnn_sub_library_is_claimed_by_the_reinstall_that_restores_it(tmp_path, capsys):
    """libcudnn.so.9 opens its sub-libraries at run time: with one deleted, the dlopen error is claimed by the
    reinstall of the pinned cuDNN (its load, searched again over the predicted files, finds it); applied
    offline, the re-run is clean."""
    store, venv = _wheels(), torch_venv()
    copy = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(venv), str(copy)], check=True)
    site = torch_site(copy)
    (Path(site) / "nvidia/cudnn/lib/libcudnn_ops.so.9").unlink()  # a link of its own: cp -al

    rc, doc = _check(site, capsys)
    assert rc == 1
    failing = {f["id"]: f for found in doc["items"].values() for f in found if f["severity"] == "error"}
    assert "dlopen: libcudnn_ops.so.9" in failing
    (plan,) = doc["repair"]
    (step,) = plan["steps"]
    assert step["kind"] == "automatic"
    assert (
        step["command"] == f"{copy}/bin/python -m pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43"
    )
    assert set(step["resolves"]) == set(failing)

    argv = list(step["argv"])
    argv[4:4] = ["--no-index", "--find-links", str(store)]
    subprocess.run(argv, check=True, capture_output=True)
    rc, again = _check(site, capsys)
    assert rc == 0, json.dumps(again["items"], indent=1)[-4000:]
    assert again["repair"] == []
