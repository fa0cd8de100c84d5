"""``cudastack check [pytest's cudastack options]``: the invariant items the options turn on, run as the
plugin runs them (:meth:`pytest_cudastack.stack.Stack.run_checks`), one verdict line per item. The options
are resolved as the plugin resolves them in this directory, the config file pytest would pick included
(:mod:`pytest_cudastack.cli.project`).

Exit status: 0 clean, 1 on ERROR findings, 2 on bad option values or unreadable inputs.
"""

from __future__ import annotations

import argparse
import json
import sys

from pytest_cudastack.checks import enabled_checks
from pytest_cudastack.cli.colour import painter_for
from pytest_cudastack.cli.project import add_project_options, project_settings
from pytest_cudastack.cli.sites import site_dirs_from
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.model.repair import plan_repairs, render_plans
from pytest_cudastack.stack import Stack, write_snapshot

__all__ = ["CHECK_SCHEMA", "CHECK_VERSION", "add_options", "cmd_check"]

# --json's document: pytest_cudastack/schemas/check.schema.json
CHECK_SCHEMA = "pytest-cudastack/check"
CHECK_VERSION = 2


def add_options(parser: argparse.ArgumentParser) -> None:
    """pytest's cudastack options (``--cuda-max``, ``--cudastack-scan``, ...) and configuration options
    (``-c``, ``--rootdir``, ``-o``) on ``check``'s parser."""
    add_project_options(parser)


def cmd_check(args: argparse.Namespace) -> int:
    """``cudastack check``: with none of --cudastack/--cuda-max/--cuda-min/--cudastack-scan/--cudastack-baseline,
    all the built-in items (as --cudastack)."""
    try:
        settings, config = project_settings(args)
    except CudaStackError as e:
        print(f"cudastack check: error: {e}", file=sys.stderr)
        return 2
    if not settings.items and not settings.cudastack_scan:
        settings = settings.with_values(cudastack=True)
    stack = Stack(settings, rootdir=config.rootdir, site_paths=site_dirs_from(args))
    try:
        # a skipped item is not run, as in pytest: only what is reported is computed
        skipped = stack.skipped
        results = stack.run_checks()
        if settings.cudastack_snapshot:
            write_snapshot(stack, settings.cudastack_snapshot)
    except CudaStackError as e:
        print(f"cudastack check: error: {e}", file=sys.stderr)
        return 2
    finally:
        stack.flush_cache()
    order = [name for check in enabled_checks(settings) for name, _ in check.expand(stack)]
    failing = any(f.failing for found in results.values() for f in found)
    plans = plan_repairs([f for found in results.values() for f in found], stack.inventory, reqs=stack.requirements)
    if getattr(args, "json", False):
        payload = {
            "schema": CHECK_SCHEMA,
            "version": CHECK_VERSION,
            "ok": not failing,
            "items": {name: [f.to_json() for f in results.get(name, ())] for name in order},
            "skipped": skipped,
            "repair": [plan.to_json() for plan in plans],
        }
        print(json.dumps(payload, indent=2))
        return 1 if failing else 0
    paint = painter_for(getattr(args, "color", None), sys.stdout)
    for name in order:
        found = results.get(name, ())
        if name in skipped:  # nothing to check: as the plugin's SKIPPED item, with the reason
            print(f"skip cudastack::{name}: {skipped[name]}")
            continue
        verdict = "FAIL" if any(f.failing for f in found) else "ok"
        print(f"{paint.severity(f'{verdict:4}', 'error' if verdict == 'FAIL' else '')} cudastack::{name}")
        for finding in found:
            text = finding.render().replace("\n", "\n       ")
            print(f"     {paint.severity(finding.severity.value + ':', finding.severity.value)} {text}")
    plan = render_plans(plans)
    if plan:
        print(plan)
    return 1 if failing else 0
