"""Cost of the arch item's wheel-wide coverage on a real venv, cold and warm, against ``ldd`` over the same files.

Usage: python benchmarks/bench_arch.py [VENV_OR_SITE_DIR] [--runs N] [--json]
(default: $CUDASTACK_TORCH_VENV). Targets (issue #13): cold <= 1x ldd, warm <= 0.05x ldd.

Each measurement runs in a fresh child process, so no in-memory state carries over. The timed part is the
coverage itself: the fatbin facts of every RECORD-listed library (``ElfCache.fatbin``, headers only) and the
findings for two target archs, after the wheel inventory is built (untimed: the other items pay for it).

* ``cold``: an empty CUDASTACK_CACHE_DIR whose inventory pass is untimed, so only fatbin facts are missing;
* ``warm``: the same cache directory again (fatbin facts read from the cache, files only stat'ed).

``ldd`` runs once per library (the same files), sequentially, in the same run. The page cache is not dropped:
all figures are with warm pages. Every figure is the best of ``--runs``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

CHILD = r"""
import json, sys, time
from pytest_cudastack.checks.arch import wheel_arch_findings
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.wheels.inventory import installed_wheels
cache = ElfCache()
inv = installed_wheels([sys.argv[1]], reader=cache.read)
if sys.argv[2] == "inventory":
    cache.flush()
    paths = [lib.path for d in inv.distributions for lib in d.libraries if lib.exists]
    print(json.dumps({"paths": paths}))
    raise SystemExit
driver = DriverInfo("declared", "580.65.06", None, archs=("sm_60", "sm_90"), arch_source="declared")
t = time.perf_counter()
found = wheel_arch_findings(inv, driver.archs, "declared", reader=cache.fatbin, driver=driver)
cache.flush()
print(json.dumps({"coverage": time.perf_counter() - t, "findings": len(found), "misses": cache.misses}))
"""


def _site(path: str) -> str:
    sites = sorted(glob.glob(os.path.join(path, "lib/python3*/site-packages")))
    return sites[0] if sites else path


def _child(site: str, cache_dir: str, mode: str) -> dict[str, Any]:
    env = dict(os.environ, CUDASTACK_CACHE_DIR=cache_dir)
    env.pop("CUDASTACK_NO_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, site, mode], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _ldd(paths: list[str]) -> float:
    t = time.perf_counter()
    for p in paths:
        subprocess.run(["ldd", p], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venv", nargs="?", default=os.environ.get("CUDASTACK_TORCH_VENV"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.venv:
        parser.error("no venv given and $CUDASTACK_TORCH_VENV is not set")
    site = _site(args.venv)
    colds, warms, ldds = [], [], []
    paths: list[str] = []
    findings = 0
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="cudastack-bench-arch-") as cache_dir:
            paths = _child(site, cache_dir, "inventory")["paths"]
            cold = _child(site, cache_dir, "coverage")
            warm = _child(site, cache_dir, "coverage")
            assert warm["misses"] == 0, "the warm run parsed a file"
            colds.append(cold["coverage"])
            warms.append(warm["coverage"])
            findings = warm["findings"]
        ldds.append(_ldd(paths))
    cold_s, warm_s, ldd_s = min(colds), min(warms), min(ldds)
    result = {
        "site": site,
        "libraries": len(paths),
        "findings": findings,
        "ldd_s": ldd_s,
        "cold_s": cold_s,
        "warm_s": warm_s,
        "cold_ratio": cold_s / ldd_s,
        "warm_ratio": warm_s / ldd_s,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{site}: {len(paths)} RECORD-listed libraries, {findings} findings for sm_60,sm_90")
        print(f"  ldd (same files)  {ldd_s:8.3f} s")
        print(f"  coverage cold     {cold_s:8.3f} s  {result['cold_ratio']:.2f}x ldd (target <= 1)")
        print(f"  coverage warm     {warm_s:8.3f} s  {result['warm_ratio']:.3f}x ldd (target <= 0.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
