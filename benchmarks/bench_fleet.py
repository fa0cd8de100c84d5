"""``cudastack fleet`` over 10,000 nodes' snapshots, against reading and parsing the same files.

Usage: python benchmarks/bench_fleet.py [SNAPSHOT_OR_VENV] [--nodes N] [--json]
(default: a snapshot of $CUDASTACK_TORCH_VENV, taken with ``cudastack snapshot --site``). Targets: the
10,000 snapshots grouped in <= 10 s with <= 1 GB peak memory (resident set of the ``cudastack fleet`` process).

The nodes are made from the real snapshot with realistic perturbations (a seeded random generator, so every run
writes the same files): host names; three driver versions (70 % 580.95.05, 25 % 580.82.07, 5 % 575.57.08,
the kernel module alike); 1 % with a cu12 cuDNN installed over the cu13 one (the cu12 wheel added, the
cu13 wheel's library bytes those of the cu12 RECORD); 0.5 % with user-space driver libraries newer than the
kernel module (upgraded, not rebooted); one node with a library missing. Each fingerprint is recomputed
as ``cudastack snapshot`` would write it.

Measured, each in a fresh child process, with the files' pages cached (written just before):

* ``peer``: ``json.load`` of every file, the floor of any reader of these files;
* ``fleet``: ``cudastack fleet DIR --format json`` (every file read against the snapshot schema, grouped,
  each group's drift from the majority), its wall time and peak RSS (``wait4``'s ``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

from pytest_cudastack.model.fingerprint import stack_fingerprint

PEER = r"""
import json, os, sys
n = 0
for name in sorted(os.listdir(sys.argv[1])):
    with open(os.path.join(sys.argv[1], name), "rb") as f:
        json.load(f)
    n += 1
print(n)
"""


def base_snapshot(source: str | None) -> dict[str, Any]:
    """The real snapshot: ``source`` when it is a file, else ``cudastack snapshot --site`` of the venv."""
    if source and os.path.isfile(source):
        with open(source, encoding="utf-8") as f:
            doc: dict[str, Any] = json.load(f)
        return doc
    venv = source or os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv:
        sys.exit("bench_fleet: give a snapshot or a venv, or set CUDASTACK_TORCH_VENV")
    out = subprocess.run(
        [sys.executable, "-m", "pytest_cudastack.cli", "snapshot", "--site", venv, "--cuda-driver=580.95.05"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    ).stdout
    doc = json.loads(out)
    return doc


def node(base: dict[str, Any], i: int, rng: random.Random) -> dict[str, Any]:
    """Node ``i``: the base stack on a host with one of three drivers, some clobbered or mismatched."""
    doc = copy.deepcopy(base)
    driver = rng.choices(["580.95.05", "580.82.07", "575.57.08"], weights=[70, 25, 5])[0]
    libs = driver if rng.random() > 0.005 else "590.48.01"
    gpu = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "uuid": None}
    doc["driver"].update(source="probed", version=driver, kernel_module=driver)
    doc["driver"].update(libcuda_version=libs, nvml_version=libs)
    mismatch = [] if libs == driver else [{"soname": s, "version": libs} for s in ("libcuda.so.1", "libnvidia-ml.so.1")]
    doc["host"] = {
        "name": f"gpu{i:05d}",
        "driver_version": driver,
        "cuda_version": "13.0" if driver.startswith("58") else "12.9",
        "kernel_module": driver,
        "libcuda_version": libs,
        "nvml_version": libs,
        "mismatch": mismatch,
        "gpus": [dict(gpu, uuid=f"GPU-{i}-{g}") for g in range(8)],
    }
    wheels = doc["wheels"]
    if wheels and rng.random() < 0.01:  # a cu12 build installed over a cu13 one: same paths, cu12 bytes
        victim = wheels[rng.randrange(len(wheels))]
        cu12 = copy.deepcopy(victim)
        cu12["name"] = str(victim["name"]).replace("cu13", "cu12") + ("" if "cu13" in victim["name"] else "-cu12")
        cu12["version"] = "9.10.2.21"
        for f in cu12["files"]:
            f["record"] = f["sha256"] = f"sha256=cu12-{f['path']}"
        for f, g in zip(victim["files"], cu12["files"], strict=True):
            f["sha256"] = g["record"]
        wheels.append(cu12)
    if i == 4242 and wheels and wheels[0]["files"]:  # one node lost a library
        gone = wheels[0]["files"][0]
        gone["sha256"] = gone["size"] = None
        wheels[0]["missing"] = [gone["path"]]
    doc["fingerprint"] = stack_fingerprint(doc)
    return doc


def peak_rss(argv: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak resident set (bytes, from ``wait4``) and standard output of a child process."""
    t0 = time.perf_counter()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: stdout to the pipe, stderr dropped
        os.close(r)
        os.dup2(w, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.execvp(argv[0], argv)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        sys.exit(f"bench_fleet: {argv[:4]} exited {code}")
    return wall, usage.ru_maxrss * 1024, b"".join(chunks).decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="a snapshot file or a venv (default: $CUDASTACK_TORCH_VENV)")
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = base_snapshot(args.source)
    rng = random.Random(22)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as d:
        t0 = time.perf_counter()
        total = 0
        for i in range(args.nodes):
            text = json.dumps(node(base, i, rng))
            total += len(text)
            with open(os.path.join(d, f"gpu{i:05d}.json"), "w", encoding="utf-8") as f:
                f.write(text)
        made = time.perf_counter() - t0
        peer_wall, peer_rss, _ = peak_rss([sys.executable, "-c", PEER, d])
        fleet_wall, fleet_rss, out = peak_rss(
            [sys.executable, "-m", "pytest_cudastack.cli", "fleet", d, "--format", "json"]
        )
    doc = json.loads(out)
    result = {
        "nodes": args.nodes,
        "bytes": total,
        "groups": len(doc["groups"]),
        "majority": len(doc["groups"][0]["nodes"]),
        "generate_s": round(made, 2),
        "peer_s": round(peer_wall, 2),
        "peer_rss_mb": round(peer_rss / 2**20),
        "fleet_s": round(fleet_wall, 2),
        "fleet_rss_mb": round(fleet_rss / 2**20),
        "ratio": round(fleet_wall / peer_wall, 2),
        "targets_met": fleet_wall <= 10 and fleet_rss <= 2**30,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.nodes} snapshots, {total / 2**20:.0f} MiB ({made:.1f} s to write); {result['groups']} groups, "
        f"majority {result['majority']} nodes"
    )
    print(f"peer  json.load of every file:   {peer_wall:6.2f} s  peak RSS {peer_rss / 2**20:6.0f} MiB")
    print(
        f"cudastack fleet --format json:   {fleet_wall:6.2f} s  peak RSS {fleet_rss / 2**20:6.0f} MiB  "
        f"({result['ratio']}x the peer)"
    )
    print(f"targets (<= 10 s, <= 1 GB): {'met' if result['targets_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
