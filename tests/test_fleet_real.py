"""Real tier: the torch CUDA 13 venv as nodes. A hard-linked copy with ``pip install nvidia-cudnn-cu12`` over it
is replaced bytes in ``cudastack diff`` (not only "added"), its own group in ``cudastack fleet``, and never
proposed as the new baseline."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.checks.baseline import baseline_findings
from pytest_cudastack.cli import main
from tests.helpers.realenv import torch_site, torch_venv

pytestmark = [pytest.mark.real, pytest.mark.xdist_group("torch-venv")]

CUDNN12 = "nvidia_cudnn_cu12-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl"
TARGET = ["--cuda-driver=580.95.05", "--cuda-arch=sm_90"]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Snapshots of the clean venv and of a copy with the cu12 cuDNN installed over the cu13 one."""
    venv = torch_venv()
    wheel = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")) / CUDNN12
    if not wheel.is_file():
        pytest.skip(f"{wheel} absent")
    root = tmp_path_factory.mktemp("fleet-real")
    copy = root / "venv"
    subprocess.run(["cp", "-al", str(venv), str(copy)], check=True)
    pip = [str(copy / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(pip, check=True, capture_output=True)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDASTACK_CACHE_DIR", str(root / "cache"))  # the copy's hard links hit the clean run's hashes
        mp.chdir(root)
        for name, site in (("clean", torch_site(venv)), ("clobbered", torch_site(copy))):
            path = root / f"{name}.json"
            assert main(["snapshot", "--site", site, *TARGET, "-o", str(path)]) == 0
            out[name] = json.loads(path.read_text())
    return out


def test_diff_names_the_replaced_bytes(nodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    for name, doc in nodes.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    assert main(["diff", str(tmp_path / "clean.json"), str(tmp_path / "clobbered.json")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "wheel nvidia-cudnn-cu12 9.19.0.56: added" in lines
    replaced = [x for x in lines if x.startswith("wheel nvidia-cudnn-cu13: nvidia/cudnn/lib/libcudnn")]
    assert replaced
    assert all("replaced by nvidia-cudnn-cu12 9.19.0.56's bytes" in x for x in replaced)


def test_fleet_groups_the_clobbered_node(nodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    for i in range(3):
        doc = json.loads(json.dumps(nodes["clean"]))
        doc["host"]["name"] = f"clean{i}"
        (tmp_path / f"clean{i}.json").write_text(json.dumps(doc))
    (tmp_path / "bad.json").write_text(json.dumps(nodes["clobbered"]))
    assert main(["fleet", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "cudastack fleet: 4 nodes, 2 stacks"
    assert "majority" in out.splitlines()[1]
    assert "clean0, clean1, clean2" in out.splitlines()[1]
    assert "replaced by nvidia-cudnn-cu12 9.19.0.56's bytes" in out


def test_clobbered_stack_is_never_the_new_baseline(nodes):
    findings = baseline_findings("stack.json", nodes["clean"], nodes["clobbered"])
    assert findings
    assert all("--cudastack-snapshot" not in f.fix for f in findings)
    assert nodes["clean"]["fingerprint"] != nodes["clobbered"]["fingerprint"]
