"""``cudastack check`` on every healthy matrix environment against its peers, measured side by side (issue 33).

Usage: python benchmarks/bench_matrix.py [--matrix DIR] [--only NAME ...] [--runs N] [--json]
(default: $CUDASTACK_MATRIX or /opt/cudastack-matrix; the environments of tests/matrix.toml that are built).
Targets: warm ``cudastack check`` <= 1x the environment's own installer check (``pip check``; ``uv pip check
--python`` for a uv-made venv, which has no pip); cold <= 0.5x the environment's own main import.

Each figure is the best of ``--runs`` fresh child processes, each started from an empty directory (the
project scan reads nothing), all with warm pages:

* ``import``: the environment's interpreter runs ``import MAIN`` (its ``main``: the first module its health
  code imports), interpreter start-up included;
* ``installer check``: ``python -m pip check`` (or ``uv pip check``) of the environment;
* ``cold``: ``cudastack check --site SITE`` with an empty CUDASTACK_CACHE_DIR (every ELF file and Python
  source read);
* ``warm``: the same cache directory again (the state a second run, or a CI job restoring its cache, finds).

``cudastack`` runs on this interpreter (the checkout's package), as a user's CI runs it beside the
environment it checks. Bytecode is written (PYTHONDONTWRITEBYTECODE unset), as on a user's machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's tests.helpers.matrix

from tests.helpers.matrix import MatrixEnv, load, matrix_root, uv_binary


def _timed(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    """Seconds ``cmd`` ran; a run that fails is no figure (SystemExit naming it)."""
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, cwd=cwd)
        took = time.perf_counter() - start
    if done.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr[-500:]}")
    return took


def _best(cmd: list[str], env: dict[str, str], runs: int) -> float:
    return min(_timed(cmd, env) for _ in range(runs))


_WORDS = re.compile(r"^\s*import\s+([\w., ]+)", re.M)


def _main_module(spec: MatrixEnv) -> str:
    """The first module outside the standard library that its health code imports after the shared prelude
    (the environment's main import: ``import importlib, cupy`` gives cupy)."""
    own = spec.health.rsplit("def site_of", 1)[-1]
    for line in _WORDS.finditer(own):
        for name in (n.strip().split(".")[0] for n in line.group(1).split(",")):
            if name and name not in sys.stdlib_module_names:
                return name
    return spec.packages[0].replace("-", "_")


def _installer_check(spec: MatrixEnv, root: Path) -> list[str]:
    python = str(spec.python(root))
    if spec.installer == "uv":
        return [str(uv_binary(root)), "pip", "check", "--python", python]
    return [python, "-m", "pip", "check"]


def measure(spec: MatrixEnv, root: Path, runs: int, env: dict[str, str]) -> dict[str, Any]:
    """The four figures of one environment (module docstring) and their ratios."""
    check = [sys.executable, "-m", "pytest_cudastack.cli", "check", "--site", str(spec.site_dir(root))]
    child = dict(spec.child_env(root), **{k: v for k, v in env.items() if k == "PATH"})
    main = _main_module(spec)
    imp = _best([str(spec.python(root)), "-c", f"import {main}"], child, runs)
    peer = _best(_installer_check(spec, root), child, runs)
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            run_env = dict(env, CUDASTACK_CACHE_DIR=cache)
            cold.append(_timed(check, run_env))
            warm.append(_timed(check, run_env))
    return {
        "env": spec.name,
        "main": main,
        "import_s": round(imp, 3),
        "installer_check_s": round(peer, 3),
        "cold_s": round(min(cold), 3),
        "warm_s": round(min(warm), 3),
        "warm_vs_installer_check": round(min(warm) / peer, 2),
        "cold_vs_import": round(min(cold) / imp, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(matrix_root()))
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    root = Path(args.matrix)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "LD_LIBRARY_PATH")}
    rows = []
    for spec in load():
        if (args.only and spec.name not in args.only) or not spec.python(root).exists():
            continue
        rows.append(measure(spec, root, args.runs, env))
        if not args.json:
            r = rows[-1]
            print(
                f"{r['env']:<24} import {r['main']:<12} {r['import_s']:6.2f} s  installer check "
                f"{r['installer_check_s']:5.2f} s  cold {r['cold_s']:6.2f} s ({r['cold_vs_import']:.2f}x import)  "
                f"warm {r['warm_s']:5.2f} s ({r['warm_vs_installer_check']:.2f}x installer check)",
                flush=True,
            )
    if args.json:
        print(json.dumps(rows))
    else:
        print("targets: warm <= 1x the installer check; cold <= 0.5x the main import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
