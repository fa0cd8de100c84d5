"""Benchmark: the ``symbols`` check over a whole torch venv, cold and warm, against ``import torch``.

Usage: python benchmarks/bench_symbols.py [VENV]   (default: $CUDASTACK_TORCH_VENV)

A script, not a test: it prints timings and ratios. Targets (issue #11): cold <= the time of
``VENV/bin/python -c "import torch"`` measured in the same run, warm <= 0.1x of it. Every figure is the best
of three, each in a fresh interpreter: ``import torch`` three times; the check (the inventory of the venv,
the resolver's trees of every extension module and the interpreter, and
``checks.symbols.extension_symbol_findings``) timed inside a child process, cold with three fresh cache
directories, warm on the cache the cold run left. The child's start-up and imports are not counted: a
pytest session or a ``cudastack`` command pays them once for every check.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import sys, time
from pytest_cudastack.checks.symbols import extension_symbol_findings
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.wheels.inventory import installed_wheels
site, python, cache_dir = sys.argv[1:4]
t = time.perf_counter()
cache = ElfCache(cache_dir)
inv = installed_wheels([site], reader=cache.read)
resolver = Resolver(SearchConfig.from_environment({}), reader=cache.read, owner=inv.owner)
found = extension_symbol_findings(inv, resolver, cache.read_symbols, interpreter=python, verdicts=cache)
cache.flush()
print(time.perf_counter() - t, len(found))
"""


def import_torch(python: str) -> float:
    t = time.perf_counter()
    subprocess.run([python, "-c", "import torch"], check=True, capture_output=True)
    return time.perf_counter() - t


def check(site: str, python: str, cache_dir: str) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("LD_LIBRARY_PATH", None)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, site, python, cache_dir], check=True, capture_output=True, text=True, env=env
    ).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    venv = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CUDASTACK_TORCH_VENV", "")
    sites = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    if not venv or not sites:
        sys.exit("usage: bench_symbols.py VENV (a venv with torch; or set $CUDASTACK_TORCH_VENV)")
    python = os.path.join(venv, "bin", "python")
    torch = min(import_torch(python) for _ in range(3))
    colds: list[float] = []
    warms: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(3):
            cache_dir = os.path.join(tmp, f"cache{i}")
            seconds, n = check(sites[0], python, cache_dir)
            colds.append(seconds)
            warms.append(check(sites[0], python, cache_dir)[0])
    cold, warm = min(colds), min(warms)
    print(f"import torch      {torch:7.3f} s")
    print(f"symbols cold      {cold:7.3f} s  {cold / torch:5.2f}x import torch (target <= 1)   findings: {n}")
    print(f"symbols warm      {warm:7.3f} s  {warm / torch:5.2f}x import torch (target <= 0.1)")


if __name__ == "__main__":
    main()
