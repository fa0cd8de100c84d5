"""``cudastack fleet SNAPSHOT...|DIR [--against SNAPSHOT] [--format text|json|prometheus|nfd|junit]``: nodes'
snapshots (``cudastack snapshot`` on each node) grouped by stack fingerprint
(:mod:`pytest_cudastack.model.fleet`); the majority named, every other group's difference from it in
``cudastack diff``'s words (:func:`pytest_cudastack.checks.baseline.snapshot_drift`) and its nodes.
``--against`` takes an environment's snapshot (``cudastack snapshot --no-host`` where it is built) and says
per group whether it would run there, with the reason.

Formats: ``text``; ``json`` (``schemas/fleet.schema.json``); ``prometheus``, the node-exporter textfile
collector's format (an info metric per node with its driver, kernel module, CUDA and fingerprint as labels,
and findings per node, check and severity); ``nfd``, node-feature-discovery feature file lines (one block per
node, its labels' values within Kubernetes' label syntax); ``junit``, a testcase per node.

Exit status: 0 one group (and the environment runs on it), 1 groups differ (or the environment would not run
somewhere, or a node records errors), 2 a file that is not a snapshot, or ``--against`` not a snapshot.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

from pytest_cudastack import __version__
from pytest_cudastack.checks.baseline import Drift, snapshot_drift
from pytest_cudastack.errors import DataError
from pytest_cudastack.escape import printable
from pytest_cudastack.model.fleet import Group, Node, Verdict, group_nodes, snapshot_files, would_run
from pytest_cudastack.stack import SnapshotReader, load_snapshot

__all__ = ["FLEET_SCHEMA", "FLEET_VERSION", "Fleet", "cmd_fleet", "read_fleet", "render"]

FLEET_SCHEMA = "pytest-cudastack/fleet"  # --format json: pytest_cudastack/schemas/fleet.schema.json
FLEET_VERSION = 1
SHOWN_NODES = 20  # node names listed per group in text; json lists them all
CHECKS = ("driver", "integrity", "closure")  # the checks a snapshot's own problems belong to


@dataclass(frozen=True)
class Fleet:
    """The grouped nodes, each group's drift from the majority (empty for the majority) and, with
    ``--against``, its verdict; ``unreadable``: (file, why) of the files that are not snapshots."""

    groups: tuple[Group, ...]
    drift: tuple[tuple[Drift, ...], ...]
    verdicts: tuple[Verdict | None, ...]
    unreadable: tuple[tuple[str, str], ...]
    against: str | None

    @property
    def nodes(self) -> int:
        return sum(len(g.nodes) for g in self.groups)

    def failing(self) -> bool:
        return (
            len(self.groups) > 1
            or any(v is not None and not v.runs for v in self.verdicts)
            or any(n.problems for g in self.groups for n in g.nodes)
        )


def _stream(paths: Sequence[str], unreadable: list[tuple[str, str]]) -> Iterator[tuple[str, dict[str, Any]]]:
    reader = SnapshotReader()
    for path in snapshot_files(paths, unreadable):
        try:
            yield path, reader.read(path)
        except DataError as e:
            unreadable.append((path, str(e)))


def read_fleet(paths: Sequence[str], against: dict[str, Any] | None = None, against_name: str | None = None) -> Fleet:
    """Group the snapshots in ``paths`` (files, or directories of ``*.json``), read one at a time."""
    unreadable: list[tuple[str, str]] = []
    groups = group_nodes(_stream(paths, unreadable))
    majority = groups[0].sample if groups else {}
    drift = tuple(() if i == 0 else snapshot_drift(majority, g.sample) for i, g in enumerate(groups))
    verdicts = tuple(would_run(against, g.sample) if against is not None else None for g in groups)
    return Fleet(groups, drift, verdicts, tuple(unreadable), against_name)


def _names(nodes: Sequence[Node], limit: int = SHOWN_NODES) -> str:
    shown = ", ".join(n.name for n in nodes[:limit])
    return shown + (f" and {len(nodes) - limit} more" if len(nodes) > limit else "")


def _short(fingerprint: str) -> str:
    return fingerprint.removeprefix("sha256:")[:12]


def render_text(fleet: Fleet) -> str:
    lines = [f"cudastack fleet: {fleet.nodes} nodes, {len(fleet.groups)} stack{'s' if len(fleet.groups) != 1 else ''}"]
    for i, (group, drift, verdict) in enumerate(zip(fleet.groups, fleet.drift, fleet.verdicts, strict=True)):
        n = group.nodes[0]
        role = "majority" if i == 0 else "group"
        lines.append(
            f"{role} {_short(group.fingerprint)}: {len(group.nodes)} node{'s' if len(group.nodes) != 1 else ''}"
            f" (driver {n.driver or 'none'}, CUDA {n.cuda or '?'}): {_names(group.nodes)}"
        )
        if i > 0:
            lines.append("  differs from the majority:" if drift else "  differs from the majority in bytes only")
            lines.extend(f"    {d.text}" for d in drift)
        for node in group.nodes:
            lines.extend(f"  ERROR {node.name}: {p.text}" for p in node.problems[:3])
            if len(node.problems) > 3:
                lines.append(f"  ERROR {node.name}: {len(node.problems) - 3} more (--format json)")
        if verdict is not None:
            word = "runs here" if verdict.runs else "would NOT run here"
            lines.append(f"  {fleet.against}: {word}" + (f": {'; '.join(verdict.reasons)}" if verdict.reasons else ""))
    return "\n".join(lines) + "\n"


def _node_json(node: Node) -> dict[str, Any]:
    return {
        "name": node.name,
        "source": node.source,
        "driver": node.driver,
        "cuda": node.cuda,
        "kernel_module": node.kernel_module,
        "problems": [{"check": p.check, "subject": p.subject, "text": p.text} for p in node.problems],
    }


def render_json(fleet: Fleet) -> str:
    groups = []
    for i, (group, drift, verdict) in enumerate(zip(fleet.groups, fleet.drift, fleet.verdicts, strict=True)):
        groups.append(
            {
                "fingerprint": group.fingerprint,
                "majority": i == 0,
                "nodes": [_node_json(n) for n in group.nodes],
                "drift": [d.to_json() for d in drift],
                "against": None if verdict is None else {"runs": verdict.runs, "reasons": list(verdict.reasons)},
            }
        )
    doc = {
        "schema": FLEET_SCHEMA,
        "version": FLEET_VERSION,
        "nodes": fleet.nodes,
        "majority": fleet.groups[0].fingerprint if fleet.groups else None,
        "against": fleet.against,
        "groups": groups,
        "unreadable": [{"source": s, "error": e} for s, e in fleet.unreadable],
    }
    return json.dumps(doc, indent=2) + "\n"


def _label(value: object) -> str:
    """A Prometheus label value, escaped as the text exposition format requires."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    return "{" + ",".join(f'{k}="{_label("" if v is None else v)}"' for k, v in labels.items()) + "}"


def render_prometheus(fleet: Fleet) -> str:
    """The node-exporter textfile collector's format: ``cudastack_stack_info`` (1, its facts as labels),
    ``cudastack_findings`` per node, check and severity (the snapshot's own errors; ``fleet``: a warning
    for a node outside the majority; ``against``: an error where the environment would not run), and the
    fleet's group count."""
    info = [
        "# HELP cudastack_stack_info The node's CUDA stack: driver, kernel module, CUDA and stack fingerprint.",
        "# TYPE cudastack_stack_info gauge",
    ]
    findings = [
        "# HELP cudastack_findings Findings of cudastack about the node, by check and severity.",
        "# TYPE cudastack_findings gauge",
    ]
    for i, (group, verdict) in enumerate(zip(fleet.groups, fleet.verdicts, strict=True)):
        for n in group.nodes:
            info.append(
                "cudastack_stack_info"
                + _labels(
                    node=n.name,
                    driver=n.driver,
                    kernel_module=n.kernel_module,
                    cuda=n.cuda,
                    fingerprint=n.fingerprint,
                    majority="true" if i == 0 else "false",
                )
                + " 1"
            )
            for check in CHECKS:
                count = sum(1 for p in n.problems if p.check == check)
                findings.append(
                    "cudastack_findings" + _labels(node=n.name, check=check, severity="error") + f" {count}"
                )
            findings.append(
                "cudastack_findings" + _labels(node=n.name, check="fleet", severity="warning") + f" {int(i > 0)}"
            )
            if verdict is not None:
                failed = int(not verdict.runs)
                findings.append(
                    "cudastack_findings" + _labels(node=n.name, check="against", severity="error") + f" {failed}"
                )
    groups = [
        "# HELP cudastack_fleet_groups Distinct CUDA stacks among the nodes read (1 when all agree).",
        "# TYPE cudastack_fleet_groups gauge",
        f"cudastack_fleet_groups {len(fleet.groups)}",
    ]
    return "\n".join([*info, *findings, *groups]) + "\n"


_NFD_VALUE = re.compile(r"[^A-Za-z0-9._-]")


def _nfd_value(value: object) -> str:
    """Within a Kubernetes label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric."""
    text = _NFD_VALUE.sub("_", str(value))[:63].strip("._-")
    return text or "none"


def render_nfd(fleet: Fleet) -> str:
    """node-feature-discovery's local source feature file: ``name=value`` lines (the default prefix
    ``feature.node.kubernetes.io/`` is NFD's), one block per node under a ``# node NAME`` comment; install
    each node's block as ``/etc/kubernetes/node-feature-discovery/features.d/cudastack``."""
    lines: list[str] = []
    for i, (group, verdict) in enumerate(zip(fleet.groups, fleet.verdicts, strict=True)):
        for n in group.nodes:
            lines.append(f"# node {n.name}")
            lines.append(f"cudastack.driver={_nfd_value(n.driver or 'none')}")
            lines.append(f"cudastack.kernel-module={_nfd_value(n.kernel_module or 'none')}")
            lines.append(f"cudastack.cuda={_nfd_value(n.cuda or 'none')}")
            lines.append(f"cudastack.fingerprint={_short(n.fingerprint)}")
            lines.append(f"cudastack.majority={'true' if i == 0 else 'false'}")
            lines.append(f"cudastack.errors={len(n.problems)}")
            if verdict is not None:
                lines.append(f"cudastack.runs={'true' if verdict.runs else 'false'}")
    return "\n".join(lines) + "\n"


def render_junit(fleet: Fleet) -> str:
    """A testsuite ``cudastack.fleet`` with a testcase per node: failed when the node records errors, is
    outside the majority (the message is its difference) or the environment would not run there."""
    suite = ElementTree.Element("testsuite", name="cudastack.fleet", tests=str(fleet.nodes))
    failures = 0
    for i, (group, drift, verdict) in enumerate(zip(fleet.groups, fleet.drift, fleet.verdicts, strict=True)):
        for n in group.nodes:
            case = ElementTree.SubElement(suite, "testcase", classname="cudastack.fleet", name=n.name, file=n.source)
            why = [p.text for p in n.problems]
            if i > 0:
                why.append(f"stack {_short(n.fingerprint)} is not the majority's: " + "; ".join(d.text for d in drift))
            if verdict is not None and not verdict.runs:
                why.append(f"{fleet.against} would not run: " + "; ".join(verdict.reasons))
            if why:
                failures += 1
                failure = ElementTree.SubElement(case, "failure", message=why[0][:500])
                failure.text = "\n".join(why)
    suite.set("failures", str(failures))
    suites = ElementTree.Element("testsuites", name=f"pytest-cudastack {__version__}")
    suites.append(suite)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def render(fleet: Fleet, fmt: str) -> str:
    return {
        "text": render_text,
        "json": render_json,
        "prometheus": render_prometheus,
        "nfd": render_nfd,
        "junit": render_junit,
    }[fmt](fleet)


def _against(path: str) -> dict[str, Any]:
    """The environment's snapshot; an image (a directory or an archive) is refused naming how to get one."""
    if os.path.isdir(path):
        raise DataError(
            f"{path}: --against takes a snapshot file, not an image: write the image's snapshot first "
            "(cudastack snapshot --no-host -o FILE, run where the image's environment is)"
        )
    try:
        return load_snapshot(path)
    except DataError as e:
        raise DataError(f"{e} (--against takes a snapshot file; an image needs its snapshot written first)") from e


def cmd_fleet(args: argparse.Namespace) -> int:
    try:
        against = _against(args.against) if args.against else None
    except DataError as e:
        print(printable(f"cudastack fleet: error: {e}"), file=sys.stderr)
        return 2
    fleet = read_fleet(args.snapshots, against, args.against)
    for _, why in fleet.unreadable:
        print(printable(f"cudastack fleet: error: {why}"), file=sys.stderr)
    if not fleet.groups:
        print("cudastack fleet: error: no snapshot read", file=sys.stderr)
        return 2
    out = render(fleet, args.format)
    # the text view shows host names and drift read from the snapshots: escaped for the terminal, as diff's
    sys.stdout.write(printable(out, newlines=True) if args.format == "text" else out)
    if fleet.unreadable:
        return 2
    return 1 if fleet.failing() else 0
