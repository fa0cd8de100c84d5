"""Real tier: a single-node Slurm cluster from Debian's packages (slurm-wlm, munge; .ci/run installs them)
started here, on free ports, from a private munge key and slurm.conf (no cgroup plugins: proctrack/linuxproc,
task/none). ``sbatch --wait example_project/fleet/slurm-fleet.sh`` writes the node's snapshot through srun and
groups it; the health check drains the node through the real scontrol when its venv is clobbered."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.fleetbuild import clobber, cudnn_site
from tests.helpers.sitebuild import HAVE_CC

pytestmark = [pytest.mark.real, pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")]

FLEET = Path(__file__).resolve().parent.parent / "example_project" / "fleet"
CUDASTACK = str(Path(sys.executable).with_name("cudastack"))
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SLURM_CONF = """\
ClusterName=cudastack
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={d}/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/linear
NodeName={host} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop(pid_files: list[Path]) -> None:
    for pid_file in reversed(pid_files):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The cluster's environment (SLURM_CONF); skipped when the packages are absent, not root, or it does not
    come up within 30 s (the skip names the log's last line)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    if missing:
        pytest.skip(f"Slurm not installed (.ci/run installs slurm-wlm and munge): {', '.join(missing)} absent")
    if os.geteuid() != 0:
        pytest.skip("the single-node Slurm cluster runs its daemons as root")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (d / sub).mkdir()
    (d / "munge").chmod(0o700)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, d=d, ctld_port=free_port(), d_port=free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": f"/usr/sbin:{os.environ['PATH']}"}
    pid_files = [d / "munge" / "pid", d / "slurmctld.pid", d / "slurmd.pid"]
    munge = [f"--key-file={key}", f"--socket={d}/munge/sock", f"--pid-file={pid_files[0]}"]
    munge += [f"--log-file={d}/log/munged.log", f"--seed-file={d}/munge/seed"]
    try:
        subprocess.run(["munged", "-f", *munge], env=env, check=True, capture_output=True)
        subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True, capture_output=True)
        subprocess.run(["slurmd", "-f", str(conf)], env=env, check=True, capture_output=True)
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout
            if state.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            logs = [(d / "log" / n).read_text().strip().splitlines()[-1:] for n in ("slurmctld.log", "slurmd.log")]
            pytest.skip(f"the Slurm node is {state.strip() or 'absent'} after 30 s: {logs}")
    except subprocess.CalledProcessError as e:
        _stop(pid_files)
        pytest.skip(f"{e.cmd[0]} did not start: {e.stderr.decode(errors='replace').strip()[-300:]}")
    yield {**env, "CUDASTACK_EXE": CUDASTACK, "CUDASTACK_CACHE_DIR": str(d / "cache"), "HOST": host}
    _stop(pid_files)


def test_sbatch_recipe_writes_a_snapshot_per_node_and_groups_them(slurm: dict[str, str], tmp_path: Path):
    site = cudnn_site(tmp_path / "venv")
    out = tmp_path / "snapshots"
    job_out = tmp_path / "job.out"
    env = {**slurm, "CUDASTACK_FLEET_DIR": str(out)}
    cmd = ["sbatch", "--wait", "--nodes=1", "-o", str(job_out), str(FLEET / "slurm-fleet.sh"), str(site)]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    text = job_out.read_text() if job_out.exists() else ""
    assert done.returncode == 0, done.stderr + text
    assert [p.name for p in out.iterdir()] == [f"{socket.gethostname()}.json"]
    assert "cudastack fleet: 1 nodes, 1 stack" in text


def test_health_check_drains_through_scontrol(slurm: dict[str, str], tmp_path: Path):
    site = cudnn_site(tmp_path / "venv")
    clobber(site)
    env = {**slurm, "CUDASTACK_SITE": str(site), "CUDASTACK_STATE_DIR": str(tmp_path / "state")}
    try:
        done = subprocess.run(
            ["sh", str(FLEET / "healthcheck.sh")], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 1, done.stderr
        node = subprocess.run(
            ["scontrol", "show", "node", slurm["HOST"]], env=env, capture_output=True, text=True, check=True
        ).stdout
        assert "DRAIN" in node
        assert "Reason=cudastack: ERROR" in node
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={slurm['HOST']}", "State=RESUME"], env=env, check=False)
