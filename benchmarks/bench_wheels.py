"""Cost of the wheels checks (inventory + integrity + closure) on a real venv, against ``ldd``.

Usage: python benchmarks/bench_wheels.py [VENV_OR_SITE_DIR] [--runs N] [--json]
(default: $CUDASTACK_TORCH_VENV). Each measurement runs in a fresh child process so module state and the
in-memory ELF cache do not carry over:

* ``no-cache``: CUDASTACK_NO_CACHE=1 (every ELF file parsed);
* ``cold``: an empty CUDASTACK_CACHE_DIR (parsed, then the cache is written);
* ``warm``: the same cache directory again (facts read from the cache, files only stat'ed).

``ldd`` runs once per ELF file of the site directory, sequentially, in the same run (it maps each file and
its closure with the real dynamic linker, which is what these checks avoid doing). The file system's page
cache is not dropped: all figures are with warm pages.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.wheels.inventory import installed_wheels, memo_reader
from pytest_cudastack.checks.integrity import check_integrity
from pytest_cudastack.model.modules import module_trees
from pytest_cudastack.checks.closure import extension_closures
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
t1 = time.perf_counter()
cache = ElfCache()
reader = memo_reader(cache.read)
inv = installed_wheels([sys.argv[1]], reader=reader)
t2 = time.perf_counter()
integ = check_integrity(inv)
t3 = time.perf_counter()
resolver = Resolver(SearchConfig.from_environment(), reader=reader, owner=inv.owner)
trees = module_trees(inv, resolver)
clos = extension_closures(inv, resolver, trees=trees)
t4 = time.perf_counter()
cache.flush()
t5 = time.perf_counter()
print(json.dumps({
    "import": t1 - t0, "inventory": t2 - t1, "integrity": t3 - t2, "closure": t4 - t3, "flush": t5 - t4,
    "total": t5 - t1,
    "distributions": len(inv.distributions),
    "libraries": sum(len(d.libraries) for d in inv.distributions),
    "modules": len(trees),
    "failing": sum(1 for f in (*integ, *clos) if f.failing),
}))
"""


def _site(path: str) -> str:
    sites = sorted(glob.glob(os.path.join(path, "lib/python3*/site-packages")))
    return sites[0] if sites else path


def _elf_files(site: str) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(site):
        for name in files:
            p = os.path.join(root, name)
            if (".so" in name) and os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    if f.read(4) == b"\x7fELF":
                        out.append(p)
    return sorted(out)


def _child(site: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", CHILD, site], env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _ldd(files: list[str]) -> float:
    t0 = time.perf_counter()
    for p in files:
        subprocess.run(["ldd", p], capture_output=True, check=False)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("venv", nargs="?", default=os.environ.get("CUDASTACK_TORCH_VENV"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.venv:
        ap.error("give a venv or site directory, or set CUDASTACK_TORCH_VENV")
    site = _site(args.venv)
    base = dict(os.environ)
    base.pop("CUDASTACK_NO_CACHE", None)
    results: dict[str, list[dict[str, Any]]] = {"no-cache": [], "cold": [], "warm": []}
    for _ in range(args.runs):
        results["no-cache"].append(_child(site, {**base, "CUDASTACK_NO_CACHE": "1"}))
        with tempfile.TemporaryDirectory(prefix="cudastack-bench-") as cache:
            env = {**base, "CUDASTACK_CACHE_DIR": cache}
            results["cold"].append(_child(site, env))
            results["warm"].append(_child(site, env))
    files = _elf_files(site)
    ldd_runs = [_ldd(files) for _ in range(args.runs)]
    summary: dict[str, Any] = {
        "site": site,
        "elf_files": len(files),
        "runs": args.runs,
        "ldd_seconds": statistics.median(ldd_runs),
    }
    for kind, rs in results.items():
        summary[kind] = {
            k: round(statistics.median(r[k] for r in rs), 3)
            for k in ("inventory", "integrity", "closure", "flush", "total")
        }
        summary[kind]["failing"] = rs[-1]["failing"]
    first = results["warm"][-1]
    summary.update(distributions=first["distributions"], libraries=first["libraries"], modules=first["modules"])
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"site: {site}\n{summary['distributions']} distributions, {summary['libraries']} RECORD-listed shared "
        f"libraries, {summary['modules']} extension modules; {len(files)} ELF files; median of {args.runs}"
    )
    for kind in ("no-cache", "cold", "warm"):
        s = summary[kind]
        print(
            f"  {kind:8s} total {s['total']:.2f}s  (inventory {s['inventory']:.2f}s, integrity "
            f"{s['integrity']:.2f}s, closure {s['closure']:.2f}s, cache flush {s['flush']:.2f}s); "
            f"failing findings: {s['failing']}"
        )
    print(f"  ldd over {len(files)} ELF files: {summary['ldd_seconds']:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
