"""The baseline check: the stack now against a snapshot recorded earlier (``Stack.to_json``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pytest_cudastack.findings import Finding, Severity

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target

__all__ = ["baseline_findings", "diff_snapshots", "run"]


def _index(items: Iterable[Mapping[str, Any]], key: str) -> dict[str, Mapping[str, Any]]:
    return {str(item[key]): item for item in items}


def diff_snapshots(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """Human-readable differences between two stack snapshots (``Stack.to_json``); empty when equal."""
    out: list[str] = []
    od, nd = old.get("driver") or {}, new.get("driver") or {}
    for key in ("version", "cuda_version", "archs"):
        if od.get(key) != nd.get(key):
            out.append(f"driver {key}: {od.get(key)} -> {nd.get(key)}")
    ogpus = [(g.get("name"), g.get("compute_capability")) for g in od.get("gpus", ())]
    ngpus = [(g.get("name"), g.get("compute_capability")) for g in nd.get("gpus", ())]
    if ogpus != ngpus:
        out.append(f"GPUs: {ogpus or 'none'} -> {ngpus or 'none'}")
    ow, nw = _index(old.get("wheels", ()), "name"), _index(new.get("wheels", ()), "name")
    for name in sorted(ow.keys() | nw.keys()):
        a, b = ow.get(name), nw.get(name)
        if a is None and b is not None:
            out.append(f"wheel {name} {b.get('version')}: added")
        elif b is None and a is not None:
            out.append(f"wheel {name} {a.get('version')}: removed")
        elif a is not None and b is not None:
            if a.get("version") != b.get("version"):
                out.append(f"wheel {name}: {a.get('version')} -> {b.get('version')}")
            am, bm = set(a.get("missing", ())), set(b.get("missing", ()))
            out.extend(f"wheel {name}: {p} went missing" for p in sorted(bm - am))
            out.extend(f"wheel {name}: {p} is back" for p in sorted(am - bm))
    ob, nb = _index(old.get("binaries", ()), "path"), _index(new.get("binaries", ()), "path")
    for path in sorted(ob.keys() | nb.keys()):
        a, b = ob.get(path), nb.get(path)
        if a is None or b is None:
            out.append(f"binary {path}: {'added' if a is None else 'removed'}")
            continue
        al = {lib["soname"]: lib.get("path") for lib in a.get("libraries", ())}
        bl = {lib["soname"]: lib.get("path") for lib in b.get("libraries", ())}
        for soname in sorted(al.keys() | bl.keys()):
            if al.get(soname, "absent") != bl.get(soname, "absent"):
                before = al.get(soname, "not needed") or "not found"
                after = bl.get(soname, "not needed") or "not found"
                out.append(f"binary {path}: {soname}: {before} -> {after}")
    return tuple(out)


def baseline_findings(baseline: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[Finding, ...]:
    """One ERROR per difference between the recorded baseline and the stack now."""
    return tuple(
        Finding(
            "baseline",
            Severity.ERROR,
            baseline,
            f"drift from baseline: {line}",
            fix=f"restore the recorded stack, or re-record it (pytest --cudastack-snapshot={baseline})",
        )
        for line in diff_snapshots(old, new)
    )


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``baseline`` item: the snapshot ``--cudastack-baseline`` names against the stack now."""
    baseline = stack.settings.cudastack_baseline
    if baseline is None:
        raise ValueError("cudastack check 'baseline' needs --cudastack-baseline")
    return baseline_findings(baseline, stack.recorded_snapshot(baseline), stack.to_json())
