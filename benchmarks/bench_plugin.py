"""What does pytest-cudastack cost a suite that does not use it?

Runs a trivial suite (default 200 tests) with the plugin installed but unused (auto-loaded from its entry
point, no cudastack option, marker or fixture) and with ``-p no:cudastack``, interleaved, and reports the
medians and their ratio. The target is <= 1.05: plugin.py imports only pytest, the standard library and
the option table (options.py), and session.py (settings, stack, checks) only when an option, marker or
fixture asks for it; nothing is probed or read before that.

    python benchmarks/bench_plugin.py [--tests 200] [--runs 15] [--max-ratio 1.05]

Exit status 1 when the ratio exceeds --max-ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_suite(root: Path, tests: int) -> None:
    per_file = 20
    for start in range(0, tests, per_file):
        body = "".join(
            f"def test_{i}():\n    assert {i} == {i}\n\n" for i in range(start, min(start + per_file, tests))
        )
        (root / f"test_trivial_{start // per_file}.py").write_text(body)
    (root / "pytest.ini").write_text("[pytest]\n")


def run(root: Path, extra: list[str]) -> float:
    # as installed for real: byte-compiled (into a private prefix, so the checkout stays clean)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUDASTACK", "PYTEST_")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--max-ratio", type=float, default=1.05)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cudastack-bench-") as tmp:
        root = Path(tmp)
        make_suite(root, args.tests)
        run(root, [])  # warm the file system and write the bytecode caches
        run(root, ["-p", "no:cudastack"])
        with_plugin: list[float] = []
        without: list[float] = []
        for _ in range(args.runs):
            with_plugin.append(run(root, []))
            without.append(run(root, ["-p", "no:cudastack"]))
    a, b = statistics.median(with_plugin), statistics.median(without)
    ratio = a / b
    print(f"{args.tests} trivial tests, {args.runs} interleaved runs each")
    print(f"  plugin installed, unused: median {a * 1000:.0f} ms (min {min(with_plugin) * 1000:.0f})")
    print(f"  -p no:cudastack:          median {b * 1000:.0f} ms (min {min(without) * 1000:.0f})")
    print(f"  ratio {ratio:.3f} (target <= {args.max_ratio})")
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
