"""Run one parser call on one file in a child with an address-space limit (issue #14's hostile inputs).

Without their caps those inputs need gigabytes: in the child they fail with MemoryError instead of
swapping the shared machine, so a regression test fails rather than hangs the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

__all__ = ["run_guarded"]

_CHILD = textwrap.dedent(
    """
    import importlib, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[4]), int(sys.argv[4])))
    from pytest_cudastack.errors import CudaStackError
    func = getattr(importlib.import_module(sys.argv[1]), sys.argv[2])
    t = time.monotonic()
    try:
        func(sys.argv[3])
        print("OK")
    except CudaStackError as e:
        print(type(e).__name__, e)
    print("seconds", time.monotonic() - t)
    """
)


def run_guarded(module: str, func: str, path: Path | str, *, timeout: float = 60, memory: int = 2 << 30) -> str:
    """stdout of ``module.func(path)`` in a child limited to *memory* bytes: ``OK`` or ``<Error> message``
    (a CudaStackError), then ``seconds <wall time>``. Any other exception fails the call's assertion."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, module, func, str(path), str(memory)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
