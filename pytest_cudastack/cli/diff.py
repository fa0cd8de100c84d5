"""``cudastack diff A B [--json]``: what changed between two snapshots
(:func:`pytest_cudastack.checks.baseline.snapshot_drift`).

Exit status: 0 when equal ("no drift"), 1 when they differ, 2 when a file is not a snapshot.
"""

from __future__ import annotations

import argparse
import json
import sys

from pytest_cudastack.checks.baseline import snapshot_drift
from pytest_cudastack.errors import DataError
from pytest_cudastack.escape import printable
from pytest_cudastack.stack import load_snapshot

__all__ = ["DIFF_SCHEMA", "DIFF_VERSION", "cmd_diff"]

# --json's document: pytest_cudastack/schemas/diff.schema.json
DIFF_SCHEMA = "pytest-cudastack/diff"
DIFF_VERSION = 2  # 2: host drift and changed library bytes (pytest_cudastack/schemas/diff.schema.json)


def cmd_diff(args: argparse.Namespace) -> int:
    """Print one line per difference between snapshot files ``args.a`` and ``args.b``, or "no drift"."""
    try:
        old, new = load_snapshot(args.a), load_snapshot(args.b)
    except DataError as e:
        print(printable(f"cudastack diff: {e}"), file=sys.stderr)
        return 2
    drift = snapshot_drift(old, new)
    if getattr(args, "json", False):
        payload = {
            "schema": DIFF_SCHEMA,
            "version": DIFF_VERSION,
            "a": args.a,
            "b": args.b,
            "drift": [d.to_json() for d in drift],
        }
        print(json.dumps(payload, indent=2))
    else:
        for d in drift:
            print(printable(d.text, newlines=True))
        if not drift:
            print("no drift")
    return 1 if drift else 0
