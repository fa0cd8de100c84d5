"""Benchmark: hostile search lists (issue #14): a long LD_LIBRARY_PATH, and 1,000 DT_NEEDED entries times an
RPATH at the ELF reader's cap (4,096 elements, each an existing directory), resolved, reported and rendered.

Usage: python benchmarks/bench_robust.py [--quadratic]

A script, not a test: it prints timings and ratios against peers measured in the same run. The search-list
expansion (``Resolver._dirlist``) must grow linearly: 100,000 elements against 10,000 should be ~10x, where
the former ``not in list`` dedupe was ~100x (``--quadratic`` measures that too, for the record: 100,000
elements took minutes). The 1,000 x 4,096 tree is measured against the same tree with one DT_NEEDED entry
(per-soname cost) and its rendered text against the 388 MB of the original report.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.timing import best  # noqa: E402  (the repository is on sys.path only from here)


def main() -> None:
    from pytest_cudastack.checks.scan import binary_findings
    from pytest_cudastack.items import render_findings
    from pytest_cudastack.linker.resolver import Resolver, SearchConfig
    from tests.helpers.elfbuild import synth_elf

    def dirlist(n: int) -> float:
        cfg = SearchConfig.from_environment({"LD_LIBRARY_PATH": ":".join(f"/nonexistent/d{i}" for i in range(n))})
        r = Resolver(cfg)
        return best(lambda: r._dirlist(cfg.ld_library_path, None))

    small, large = dirlist(10_000), dirlist(100_000)
    print(
        f"LD_LIBRARY_PATH 10,000 elements: {small:.3f} s; 100,000: {large:.3f} s; "
        f"ratio {large / small:.1f}x (linear: ~10x)"
    )
    if "--quadratic" in sys.argv:

        def old(elements: list[str]) -> list[str]:
            out: list[str] = []
            for el in elements:
                if el not in out:
                    out.append(el)
            return out

        els = [f"/nonexistent/d{i}" for i in range(30_000)]
        t = time.perf_counter()
        old(els)
        print(f"  the former dedupe, 30,000 elements: {time.perf_counter() - t:.2f} s")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dirs = []
        for i in range(4096):
            d = root / "rp" / f"d{i:05d}"
            d.mkdir(parents=True)
            dirs.append(str(d))
        rpath = ":".join(dirs[:4095])  # 4,095 separators is the reader's cap
        one = synth_elf(root / "one", needed=["libmissing0.so.1"], rpath=rpath)
        many = synth_elf(root / "many", needed=[f"libmissing{i}.so.1" for i in range(1000)], rpath=rpath)

        def report(path: Path) -> tuple[float, float, int]:
            t = time.perf_counter()
            tree = Resolver(SearchConfig.from_environment({})).tree(str(path))
            t1 = time.perf_counter()
            text = render_findings(binary_findings(tree, path.name))
            return t1 - t, time.perf_counter() - t1, len(text)

        t1, r1, n1 = report(one)
        tm, rm, nm = report(many)
        print(f"1 DT_NEEDED x 4,095 RPATH dirs: tree {t1:.2f} s, findings + text {r1:.2f} s, {n1 / 1e3:.1f} KB")
        print(
            f"1,000 DT_NEEDED x 4,095 RPATH dirs: tree {tm:.2f} s ({tm / t1:.0f}x one), findings + text {rm:.2f} s "
            f"({rm / max(r1, 1e-6):.0f}x one), {nm / 1e6:.2f} MB ({388e6 / nm:.0f}x less than the original 388 MB)"
        )


if __name__ == "__main__":
    main()
