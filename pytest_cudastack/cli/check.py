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
from collections.abc import Mapping, Sequence

from pytest_cudastack.checks import enabled_checks
from pytest_cudastack.cli.colour import Painter, painter_for
from pytest_cudastack.cli.project import add_project_options, project_settings
from pytest_cudastack.cli.sites import site_dirs_from
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.escape import printable
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.model.repair import RepairPlan, plan_repairs, plan_step, render_plans
from pytest_cudastack.stack import Stack, write_snapshot

__all__ = ["CHECK_SCHEMA", "CHECK_VERSION", "add_options", "cmd_check", "render_check"]

# --json's document: pytest_cudastack/schemas/check.schema.json
CHECK_SCHEMA = "pytest-cudastack/check"
CHECK_VERSION = 2


def add_options(parser: argparse.ArgumentParser) -> None:
    """pytest's cudastack options (``--cuda-max``, ``--cudastack-scan``, ...), configuration options
    (``-c``, ``--rootdir``, ``-o``) and ``-v`` (infos, full findings) on ``check``'s parser."""
    add_project_options(parser)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="show infos and every finding in full")


def cmd_check(args: argparse.Namespace, prog: str = "check") -> int:
    """``cudastack check``: with none of --cudastack/--cuda-max/--cuda-min/--cudastack-scan/--cudastack-baseline,
    all the built-in items (as --cudastack). ``prog``: the subcommand its messages name (``image`` runs it)."""
    try:
        settings, config = project_settings(args)
    except CudaStackError as e:
        print(printable(f"cudastack {prog}: error: {e}"), file=sys.stderr)
        return 2
    # the declared target (--cuda-driver, --cuda-arch) turns on its own item in pytest; here it is what the
    # whole check is evaluated against
    chosen = (
        settings.cudastack,
        settings.cuda_max,
        settings.cuda_min,
        settings.cudastack_scan,
        settings.cudastack_baseline,
    )
    if not any(chosen):
        settings = settings.with_values(cudastack=True)
    stack = Stack(settings, rootdir=config.rootdir, site_paths=site_dirs_from(args))
    try:
        # a skipped item is not run, as in pytest: only what is reported is computed
        skipped = stack.skipped
        results = stack.run_checks()
        if settings.cudastack_snapshot:
            write_snapshot(stack, settings.cudastack_snapshot)
    except CudaStackError as e:
        print(printable(f"cudastack {prog}: error: {e}"), file=sys.stderr)
        return 2
    finally:
        stack.flush_cache()
    order = [name for check in enabled_checks(settings) for name, _ in check.expand(stack)]
    failing = any(f.failing for found in results.values() for f in found)
    plans = plan_repairs(
        [f for found in results.values() for f in found],
        stack.inventory,
        reqs=stack.requirements,
        machine=stack.environment,
        place=stack.image.image_path if stack.image is not None else None,
    )
    if getattr(args, "json", False):
        payload = {
            "schema": CHECK_SCHEMA,
            "version": CHECK_VERSION,
            "ok": not failing,
            "items": {name: [f.to_json() for f in results.get(name, ())] for name in order},
            "skipped": skipped,
            "repair": [plan.to_json() for plan in plans],
        }
        if stack.image is not None:
            payload["image"] = stack.image.to_json()
        print(json.dumps(payload, indent=2))
        return 1 if failing else 0
    paint = painter_for(getattr(args, "color", None), sys.stdout)
    verbose = int(getattr(args, "verbose", 0) or 0)
    if stack.image is not None:  # which image was judged, one line
        image = stack.image
        print(f"image {image.reference} ({image.kind}, {image.platform}, {len(image.layers)} layers)")
    print("\n".join(render_check(order, results, skipped, plans, verbose=verbose, paint=paint)))
    return 1 if failing else 0


def render_check(
    order: Sequence[str],
    results: Mapping[str, tuple[Finding, ...]],
    skipped: Mapping[str, str],
    plans: Sequence[RepairPlan],
    *,
    verbose: int = 0,
    paint: Painter | None = None,
) -> list[str]:
    """``cudastack check``'s text: the repair plan first (each environment's cause in one line, then its
    steps: each command printed once), then one verdict line per item with its errors and warnings, each
    pointing at its plan step (infos only with ``-v``), then a one-line summary."""
    paint = paint or Painter(False)
    found = [f for name in order for f in results.get(name, ())]
    lines = render_plans(plans, found).splitlines()
    shown = {Severity.ERROR, Severity.WARNING} | ({Severity.INFO} if verbose > 0 else set())
    for name in order:
        if name in skipped:  # nothing to check: as the plugin's SKIPPED item, with the reason
            lines.append(printable(f"skip cudastack::{name}: {skipped[name]}"))
            continue
        items = results.get(name, ())
        verdict = "FAIL" if any(f.failing for f in items) else "ok"
        lines.append(f"{paint.severity(f'{verdict:4}', 'error' if verdict == 'FAIL' else '')} cudastack::{name}")
        for finding in items:
            if finding.severity not in shown:
                continue
            step = plan_step(plans, finding) if finding.failing else None
            text = finding.render(compact=verbose <= 0, plan_step=step).replace("\n", "\n       ")
            lines.append(f"     {paint.severity(finding.severity.value + ':', finding.severity.value)} {text}")
    lines.append(_summary(found, len(order), len(skipped)))
    return lines


def _summary(found: Sequence[Finding], items: int, skipped: int) -> str:
    """``cudastack check: 2 errors, 1 warning, 14 infos (-v) in 12 items (4 skipped)``."""
    count = {s: sum(f.severity is s for f in found) for s in Severity}
    parts = [
        f"{count[Severity.ERROR]} error{'' if count[Severity.ERROR] == 1 else 's'}",
        f"{count[Severity.WARNING]} warning{'' if count[Severity.WARNING] == 1 else 's'}",
        f"{count[Severity.INFO]} info{'' if count[Severity.INFO] == 1 else 's'} (-v)",
    ]
    return f"cudastack check: {', '.join(parts)} in {items} items ({skipped} skipped)"
