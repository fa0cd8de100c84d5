"""Benchmark: readers that stay linear on hostile input (issue #23), each against a peer in the same run.

Usage: python benchmarks/bench_linear.py

A script, not a test: it prints timings and ratios.
* the import scanner (``model/pysource.read_module_source``: its lexer, then Python's parse) on ``'"\\'``
  repeated (every quote an unclosed string: the former lexer rescanned the rest of the line for each, 40 KB
  took 4.5 s), at 150 KB and 1.5 MB (linear: ~10x), against ``ast.parse`` of a valid 150 KB module;
* the GNU hash chain of a sparse 48 MiB ELF whose chain runs into a zero tail (``linker/symbols.read_symbols``:
  the former walk made one 4-byte read per word, ~10 s), against reading the file once;
* ``load_snapshot`` of an 8 MiB snapshot of the costliest shape (a million short strings; the limit, was
  256 MiB and 27 s for 200 MB), against ``json.loads`` of the same bytes.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.timing import best  # noqa: E402  (the repository is on sys.path only from here)


def main() -> None:
    from pytest_cudastack.errors import DataError, ElfError
    from pytest_cudastack.linker.symbols import read_symbols
    from pytest_cudastack.model.pysource import read_module_source
    from pytest_cudastack.stack import SNAPSHOT_LIMIT, load_snapshot
    from tests.helpers.elfbuild import sparse_gnu_hash_elf
    from tests.test_robust_snapshot import SNAP

    work = Path(tempfile.mkdtemp())
    small, large = work / "small.py", work / "large.py"
    small.write_text('"\\' * 75_000)
    large.write_text('"\\' * 750_000)
    ts = best(lambda: read_module_source(str(small), strip=True))
    tl = best(lambda: read_module_source(str(large), strip=True))
    valid = "import os\nx = 1\ndef f(a, b):\n    return a + b\n" * (150_000 // 44)
    peer = best(lambda: ast.parse(valid))
    print(
        f"import scanner, escaped quotes: 150 KB {ts:.4f} s, 1.5 MB {tl:.4f} s (ratio {tl / ts:.1f}x, linear ~10x); "
        f"ast.parse of a valid 150 KB module {peer:.4f} s (ratio {ts / peer:.2f}x)"
    )

    with tempfile.TemporaryDirectory() as d:
        lib = Path(d) / "libsparse.so"
        sparse_gnu_hash_elf(lib, 48 << 20)

        def chain() -> None:
            with contextlib.suppress(ElfError):
                read_symbols(lib)

        tc = best(chain)
        tr = best(lambda: lib.read_bytes())
        print(
            f"GNU hash chain into a 48 MiB zero tail: {tc:.3f} s; the file read once {tr:.3f} s (ratio {tc / tr:.1f}x)"
        )

        doc = copy.deepcopy(SNAP)
        doc["wheels"][0]["libraries"] = [""] * ((SNAPSHOT_LIMIT - 4096) // 3)
        snap = Path(d) / "snap.json"
        text = json.dumps(doc, separators=(",", ":"))
        snap.write_text(text)
        try:
            tl = best(lambda: load_snapshot(str(snap)))
        except DataError as e:
            print(f"snapshot refused: {e}")
            return
        tj = best(lambda: json.loads(text))
        print(
            f"snapshot of {len(text) / 2**20:.1f} MiB (limit {SNAPSHOT_LIMIT >> 20} MiB): load_snapshot {tl:.3f} s; "
            f"json.loads {tj:.3f} s (ratio {tl / tj:.1f}x)"
        )


if __name__ == "__main__":
    main()
