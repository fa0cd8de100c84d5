"""``cudastack snapshot [-o FILE]``: the stack as JSON (:meth:`pytest_cudastack.stack.Stack.to_json`), the
file ``--cudastack-baseline`` and ``cudastack diff`` compare against."""

from __future__ import annotations

import argparse

from pytest_cudastack.cli.sites import site_dirs_from
from pytest_cudastack.stack import Stack, write_snapshot

__all__ = ["cmd_snapshot"]


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Write the snapshot to ``args.output`` (standard output when absent or ``-``); exit 0."""
    stack = Stack(site_paths=site_dirs_from(args))
    try:
        write_snapshot(stack, getattr(args, "output", None))
    finally:
        stack.flush_cache()
    return 0
