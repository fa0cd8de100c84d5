"""``cudastack diff A B``: what changed between two snapshots (:func:`pytest_cudastack.checks.baseline.diff_snapshots`).

Exit status: 0 when equal, 1 when they differ, 2 when a file is not a snapshot.
"""

from __future__ import annotations

import argparse
import sys

from pytest_cudastack.checks.baseline import diff_snapshots
from pytest_cudastack.errors import DataError
from pytest_cudastack.stack import load_snapshot

__all__ = ["cmd_diff"]


def cmd_diff(args: argparse.Namespace) -> int:
    """Print one line per difference between snapshot files ``args.a`` and ``args.b``."""
    try:
        old, new = load_snapshot(args.a), load_snapshot(args.b)
    except DataError as e:
        print(f"cudastack diff: {e}", file=sys.stderr)
        return 2
    lines = diff_snapshots(old, new)
    for line in lines:
        print(line)
    return 1 if lines else 0
