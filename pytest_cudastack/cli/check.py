"""``cudastack check [pytest's cudastack options]``: the invariant items the options turn on, run as the
plugin runs them (:meth:`pytest_cudastack.stack.Stack.run_checks`), one verdict line per item.

Exit status: 0 clean, 1 on ERROR findings, 2 on bad option values or unreadable inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pytest_cudastack.checks.repair import plan_repairs, render_plans
from pytest_cudastack.cli.sites import site_dirs_from
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.settings import Settings, add_arguments
from pytest_cudastack.stack import Stack, write_snapshot

__all__ = ["add_options", "cmd_check"]


def add_options(parser: argparse.ArgumentParser) -> None:
    """pytest's cudastack options (``--cuda-max``, ``--cudastack-scan``, ...) on ``check``'s parser."""
    add_arguments(parser)


def cmd_check(args: argparse.Namespace) -> int:
    """``cudastack check``: with none of --cudastack/--cuda-max/--cuda-min/--cudastack-scan/--cudastack-baseline,
    all the built-in items (as --cudastack)."""
    try:
        settings = Settings.from_namespace(args)
    except CudaStackError as e:
        print(f"cudastack check: error: {e}", file=sys.stderr)
        return 2
    if not settings.items and not settings.cudastack_scan:
        settings = settings.with_values(cudastack=True)
    stack = Stack(settings, rootdir=os.getcwd(), site_paths=site_dirs_from(args))
    try:
        results = stack.run_checks()
        if settings.cudastack_snapshot:
            write_snapshot(stack, settings.cudastack_snapshot)
    except CudaStackError as e:
        print(f"cudastack check: error: {e}", file=sys.stderr)
        return 2
    finally:
        stack.flush_cache()
    failing = any(f.failing for found in results.values() for f in found)
    if getattr(args, "json", False):
        payload = {
            "ok": not failing,
            "items": {name: [f.to_json() for f in found] for name, found in results.items()},
        }
        print(json.dumps(payload, indent=2))
        return 1 if failing else 0
    for name, found in results.items():
        verdict = "FAIL" if any(f.failing for f in found) else "ok"
        print(f"{verdict:4} cudastack::{name}")
        for finding in found:
            text = finding.render().replace("\n", "\n       ")
            print(f"     {finding.severity.value}: {text}")
    plan = render_plans(plan_repairs([f for found in results.values() for f in found], stack.inventory))
    if plan:
        print(plan)
    return 1 if failing else 0
