"""``cudastack snapshot [-o FILE] [--no-host] [pytest's cudastack options]``: the stack as JSON
(:meth:`pytest_cudastack.stack.Stack.to_json`), the file ``--cudastack-baseline`` and ``cudastack diff``
compare against. The options are resolved as the plugin resolves them in this directory
(:mod:`pytest_cudastack.cli.project`), so the ``cudastack_scan`` binaries are in it as they are in
``pytest --cudastack-snapshot``'s: the two documents are the same for the same state.

Exit status: 0 written, 2 on bad option values or unreadable inputs.
"""

from __future__ import annotations

import argparse
import sys

from pytest_cudastack.cli.project import add_project_options, project_settings
from pytest_cudastack.cli.sites import site_dirs_from
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.escape import printable
from pytest_cudastack.stack import Stack, write_snapshot

__all__ = ["add_options", "cmd_snapshot"]


def add_options(parser: argparse.ArgumentParser) -> None:
    """``check``'s options on ``snapshot``'s parser (``-o`` is the output file here: ``--override-ini``)."""
    add_project_options(parser, short_override=False)
    parser.add_argument(
        "--no-host",
        action="store_true",
        help="leave out this node's facts (host name, kernel module, driver libraries, GPUs): an environment's "
        "snapshot, whose fingerprint is the same on every node",
    )


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Write the snapshot to ``args.output`` (else ``--cudastack-snapshot`` given on the command line, else
    standard output)."""
    try:
        settings, config = project_settings(args)
    except CudaStackError as e:
        print(printable(f"cudastack snapshot: error: {e}"), file=sys.stderr)
        return 2
    output = getattr(args, "output", None)
    if output is None and settings.source("cudastack_snapshot") == "command line":
        output = settings.cudastack_snapshot
    stack = Stack(settings, rootdir=config.rootdir, site_paths=site_dirs_from(args))
    try:
        write_snapshot(stack, output, host=not getattr(args, "no_host", False))
    except (CudaStackError, OSError) as e:
        print(printable(f"cudastack snapshot: error: {e}"), file=sys.stderr)
        return 2
    finally:
        stack.flush_cache()
    return 0
