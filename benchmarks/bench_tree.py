"""Benchmark: ``cudastack tree --json`` over every ELF file of a venv, cold and warm, against ldd and lddtree.

Usage: python benchmarks/bench_tree.py [VENV] [--gpu-code]   (default: $CUDASTACK_TORCH_VENV)

A script, not a test: it prints timings and ratios. Targets: cold <= 0.25x ldd, warm <= 0.05x ldd,
>= 30x faster than auditwheel's lddtree. Every command figure is the best of three (cold: three fresh cache
directories; ldd: three passes over all files); lddtree runs once. The start-up lines show the floor of any
Python command on this machine (the interpreter, and the standard-library modules every command imports).

The command is measured as users run it: this checkout installed (not editable) with
``pip install --no-deps --target TMP/site .``, its ``cudastack`` console script run by a fresh venv's
interpreter (``python -m venv --without-pip``) with ``PYTHONPATH=TMP/site`` plus this interpreter's
site-packages for the dependencies (pyelftools, ...; put on the path, their ``.pth`` files are not run).
An editable install's import hook costs ~20 ms per start; the "editable" line shows the dev venv's
``python -m pytest_cudastack.cli``. ``--gpu-code`` measures ``tree --json --gpu-code`` (each library's SASS/PTX
list, read from its fatbin headers) instead: the same targets would apply were it the default.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "pytest_cudastack.cli"]  # replaced by the installed copy's in main()
PYTHON = sys.executable
PYTHONPATH: str | None = None
FLAGS: list[str] = []  # ["--gpu-code"] with --gpu-code


def elf_files(venv: str) -> list[str]:
    from pytest_cudastack.linker.elf import looks_like_elf

    out = []
    for dirpath, _dirs, files in os.walk(venv):
        for f in files:
            p = os.path.join(dirpath, f)
            if (".so" in f or os.access(p, os.X_OK)) and not os.path.islink(p) and looks_like_elf(p):
                out.append(p)
    return sorted(out)


def _child_env(cache_dir: str) -> dict[str, str]:
    env = dict(os.environ, CUDASTACK_CACHE_DIR=cache_dir)
    for k in ("CUDASTACK_NO_CACHE", "LD_LIBRARY_PATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH"):
        env.pop(k, None)  # measure an installed package: byte-compiled modules
    if PYTHONPATH is not None:
        env["PYTHONPATH"] = PYTHONPATH
    return env


def install(tmp: str) -> tuple[str, str, str]:
    """(interpreter, its ``cudastack`` script, PYTHONPATH) of a non-editable install of this checkout."""
    target = os.path.join(tmp, "site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, str(REPO)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    venv = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    deps = [p for p in site.getsitepackages() if os.path.isdir(p)]
    script = os.path.join(target, "bin", "cudastack")
    return os.path.join(venv, "bin", "python"), script, os.pathsep.join([target, *deps])


def compile_once(files: list[str]) -> None:
    """An untimed run so every module is byte-compiled, as in an installed package."""
    with tempfile.TemporaryDirectory(prefix="cudastack-bench-warmup-") as cache:
        subprocess.run(
            [*COMMAND, "tree", "--json", *FLAGS, files[0]],
            env=_child_env(cache),
            stdout=subprocess.DEVNULL,
            check=False,
        )


def run_tree(files: list[str], cache_dir: str) -> float:
    env = _child_env(cache_dir)
    t = time.perf_counter()
    subprocess.run(
        [*COMMAND, "tree", "--json", *FLAGS, *files],
        env=env,
        stdout=subprocess.DEVNULL,
        check=False,
    )
    return time.perf_counter() - t


def run_core(files: list[str], cache_dir: str) -> tuple[float, float]:
    """In-process Resolver over all files (no interpreter start-up, no wheel inventory): cold, warm."""
    os.environ["CUDASTACK_CACHE_DIR"] = cache_dir
    os.environ.pop("CUDASTACK_NO_CACHE", None)
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.linker.resolver import Resolver, SearchConfig

    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    times = []
    for _ in range(2):
        t = time.perf_counter()
        cache = ElfCache(cache_dir, enabled=True)
        resolver = Resolver(SearchConfig.from_environment(env), reader=cache.read)
        for f in files:
            resolver.tree(f)
        cache.flush()
        times.append(time.perf_counter() - t)
    return times[0], times[1]


def run_floor(cache_dir: str) -> tuple[float, float, float]:
    """Interpreter start-up alone; with the modules every ``cudastack`` command imports (the package, json,
    argparse); and with cli.py's parser built and a ``tree`` command line parsed: the part of a warm run
    that no change to the tree command itself can remove."""
    env = _child_env(cache_dir)
    out = []
    for code in (
        "pass",
        "import pytest_cudastack, json, argparse",
        "import json, pytest_cudastack.cli as c; c.build_parser(False).parse_args(['tree', '--json', 'x'])",
    ):
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([PYTHON, "-c", code], env=env, check=False)
            best = min(best, time.perf_counter() - t)
        out.append(best)
    return out[0], out[1], out[2]


def run_ldd(files: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    t = time.perf_counter()
    for f in files:
        subprocess.run(["ldd", f], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t


def run_lddtree(files: list[str]) -> float | None:
    try:
        from auditwheel.lddtree import ldd  # type: ignore[import-untyped]
    except ImportError:
        return None
    t = time.perf_counter()
    for f in files:
        try:
            ldd(Path(f))
        except Exception as e:  # lddtree chokes on some inputs; count the time anyway
            print(f"  lddtree failed on {f}: {e}", file=sys.stderr)
    return time.perf_counter() - t


def main(argv: list[str]) -> int:
    global FLAGS
    if "--gpu-code" in argv:
        FLAGS = ["--gpu-code"]
        argv = [a for a in argv if a != "--gpu-code"]
    venv = argv[1] if len(argv) > 1 else os.environ.get("CUDASTACK_TORCH_VENV", "")
    if not venv or not os.path.isdir(venv):
        print("usage: bench_tree.py VENV (or set CUDASTACK_TORCH_VENV)", file=sys.stderr)
        return 2
    global COMMAND, PYTHON, PYTHONPATH
    files = elf_files(venv)
    print(f"{len(files)} ELF files under {venv}; tree --json {' '.join(FLAGS)}")
    # the editable dev install first, for comparison
    compile_once(files)
    with tempfile.TemporaryDirectory(prefix="cudastack-bench-") as cache:
        run_tree(files, cache)
        editable = min(run_tree(files, cache) for _ in range(3))
    tmp = tempfile.TemporaryDirectory(prefix="cudastack-bench-install-")
    PYTHON, script, PYTHONPATH = install(tmp.name)
    COMMAND = [PYTHON, script]
    print(f"installed (not editable) under {tmp.name}; run as {PYTHON} {script}")
    compile_once(files)
    # best of three for every timed command (cold: three fresh cache directories), ldd included: on a
    # shared, noisy machine the minimum is the figure least disturbed by other load
    colds: list[float] = []
    warms: list[float] = []
    for _ in range(3):
        with tempfile.TemporaryDirectory(prefix="cudastack-bench-") as cache:
            colds.append(run_tree(files, cache))
            warms.append(min(run_tree(files, cache) for _ in range(3)))
    cold, warm = min(colds), min(warms)
    with tempfile.TemporaryDirectory(prefix="cudastack-bench-core-") as cache:
        core_cold, core_warm = run_core(files, cache)
    with tempfile.TemporaryDirectory(prefix="cudastack-bench-floor-") as cache:
        start, floor, parse = run_floor(cache)
    ldd_t = min(run_ldd(files) for _ in range(3))
    lddtree_t = run_lddtree(files)
    tmp.cleanup()
    print(f"cudastack tree cold : {cold:8.3f} s   ({cold / ldd_t:.3f} x ldd; target <= 0.25)")
    print(f"cudastack tree warm : {warm:8.3f} s   ({warm / ldd_t:.3f} x ldd; target <= 0.05)")
    print(f"warm, editable      : {editable:8.3f} s   ({editable / ldd_t:.3f} x ldd; the dev venv's editable install)")
    print(f"resolver core cold  : {core_cold:8.3f} s   ({core_cold / ldd_t:.3f} x ldd; in-process, no inventory)")
    print(f"resolver core warm  : {core_warm:8.3f} s   ({core_warm / ldd_t:.3f} x ldd; in-process, no inventory)")
    print(f"python start-up     : {start:8.3f} s   ({start / ldd_t:.3f} x ldd; `python -c pass`)")
    print(f"start-up + imports  : {floor:8.3f} s   ({floor / ldd_t:.3f} x ldd; pytest_cudastack, json, argparse)")
    print(f"+ cli parser        : {parse:8.3f} s   ({parse / ldd_t:.3f} x ldd; cli.build_parser + parse_args)")
    print(f"ldd                 : {ldd_t:8.3f} s   ({ldd_t / len(files) * 1000:.1f} ms per file)")
    if lddtree_t is not None:
        print(
            f"auditwheel lddtree  : {lddtree_t:8.3f} s   (cold is {lddtree_t / cold:.1f}x faster, warm "
            f"{lddtree_t / warm:.1f}x; target >= 30)"
        )
    else:
        print("auditwheel lddtree  : not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
