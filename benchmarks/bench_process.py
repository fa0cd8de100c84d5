"""Cost of ``cudastack loaded torch --static`` (the import model) against the real ``import torch``, same run.

Usage: python benchmarks/bench_process.py [VENV] [--module torch] [--runs N] [--baseline CHECKOUT] [--json]
(default: $CUDASTACK_TORCH_VENV). Target (issues #10, #20): the static prediction, which includes the binding
check over the predicted process (issue #20), <= 0.25x the real import, warm.
``--baseline``: another checkout of pytest_cudastack (e.g. /work/main) measured the same way in the same run
(its package first on PYTHONPATH), for before/after figures.

Each measurement runs in a fresh child process, so no in-memory state carries over:

* ``real``: the venv's own interpreter runs ``import MODULE`` (interpreter start-up included, as
  ``cudastack loaded`` pays it);
* ``static cold``: ``static_document`` with an empty CUDASTACK_CACHE_DIR (every ELF file and Python source
  parsed);
* ``real, no .pyc``: the real import with an empty ``PYTHONPYCACHEPREFIX`` (every module compiled from
  source: the like-for-like peer of the cold prediction, which parses every module from source);
* ``static warm``: the same cache directory again (facts and import lists read from the cache; the state a
  second ``cudastack`` run or a pytest session after the first finds).

The static children import this package (pytest_cudastack) and are timed from their own start too. The page
cache is not dropped: all figures are with warm pages. Every figure is the best of ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

CHILD = r"""
import sys
from pytest_cudastack.cli.loaded import static_document
doc, clean = static_document(sys.argv[1], [sys.argv[2]])
print(len(doc["libraries"]), clean)
"""


def _site(venv: str) -> str:
    lib = os.path.join(venv, "lib")
    for name in sorted(os.listdir(lib)):
        site = os.path.join(lib, name, "site-packages")
        if name.startswith("python") and os.path.isdir(site):
            return site
    raise SystemExit(f"no site-packages under {venv}")


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    # run from an empty directory: ``python -c`` puts the current directory first on sys.path, which would
    # shadow the package under test (--baseline) with the checkout the benchmark is started from
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=cwd)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("venv", nargs="?", default=os.environ.get("CUDASTACK_TORCH_VENV"))
    ap.add_argument("--module", default="torch")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--baseline", help="another checkout of pytest_cudastack, measured in the same run")
    args = ap.parse_args(argv)
    if not args.venv:
        raise SystemExit("pass a venv or set CUDASTACK_TORCH_VENV")
    site = _site(args.venv)
    env = dict(os.environ)
    real = min(
        _timed([os.path.join(args.venv, "bin", "python"), "-c", f"import {args.module}"], env) for _ in range(args.runs)
    )
    # the real import with no bytecode cache of its own (every module compiled from source, as the cold
    # prediction parses every module from source): the like-for-like peer of the cold figure
    real_cold: list[float] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as prefix:
            cold_env = dict(env, PYTHONPYCACHEPREFIX=prefix)
            real_cold.append(
                _timed([os.path.join(args.venv, "bin", "python"), "-c", f"import {args.module}"], cold_env)
            )
    variants = {"static": env}
    if args.baseline:
        base = dict(env)
        base["PYTHONPATH"] = os.pathsep.join(p for p in (args.baseline, env.get("PYTHONPATH", "")) if p)
        variants["baseline"] = base
    result: dict[str, Any] = {
        "module": args.module,
        "real_s": round(real, 3),
        "real_uncached_s": round(min(real_cold), 3),
        "target_ratio": 0.25,
    }
    for name, venv_env in variants.items():
        cold: list[float] = []
        warm: list[float] = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as cache:
                venv_env["CUDASTACK_CACHE_DIR"] = cache
                cold.append(_timed([sys.executable, "-c", CHILD, args.module, site], venv_env))
                warm.append(_timed([sys.executable, "-c", CHILD, args.module, site], venv_env))
        result[f"{name}_cold_s"] = round(min(cold), 3)
        result[f"{name}_warm_s"] = round(min(warm), 3)
        result[f"{name}_cold_ratio"] = round(min(cold) / real, 3)
        result[f"{name}_warm_ratio"] = round(min(warm) / real, 3)
        result[f"{name}_cold_vs_uncached_ratio"] = round(min(cold) / min(real_cold), 3)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"import {args.module} (real, child):       {result['real_s']:.3f} s")
        print(f"import {args.module} (real, no .pyc):     {result['real_uncached_s']:.3f} s")
        for name in variants:
            for kind in ("cold", "warm"):
                secs, ratio = result[f"{name}_{kind}_s"], result[f"{name}_{kind}_ratio"]
                print(f"{name} prediction, {kind} cache: {' ' * (8 - len(name))}{secs:.3f} s  ({ratio:.2f}x)")
            uncached = result[f"{name}_cold_vs_uncached_ratio"]
            print(f"{name} prediction, cold vs the real import without .pyc: {uncached:.2f}x")
        print("target: <= 0.25x the real import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
