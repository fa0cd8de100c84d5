"""The timer the in-process benchmarks share: the best of ``n`` runs, since on a shared machine the fastest
run is the one least disturbed by other work (the ratios against a peer are taken from the same timer)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best(fn: Callable[[], object], n: int = 3) -> float:
    """The shortest wall-clock time, in seconds, of ``n`` calls of ``fn``."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)
