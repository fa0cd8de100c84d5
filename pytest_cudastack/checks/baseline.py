"""The baseline check: the stack now against a snapshot recorded earlier (``Stack.to_json``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_cudastack.findings import Finding, Severity, manual

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target

__all__ = ["Drift", "baseline_findings", "diff_snapshots", "run", "snapshot_drift"]


def _index(items: Iterable[Mapping[str, Any]], key: str) -> dict[str, Mapping[str, Any]]:
    return {str(item[key]): item for item in items}


@dataclass(frozen=True)
class Drift:
    """One difference between two snapshots, as ``cudastack diff --json`` lists it (schemas/diff.schema.json).

    ``kind`` is "driver" (``subject``: "version", "cuda_version", "archs" or "gpus"), "wheel" (``subject``: its
    name; ``item``: the file that went missing or is back) or "binary" (``subject``: its path; ``item``: the
    soname whose path changed); ``change`` is "added", "removed" or "changed"; ``before``/``after`` are the
    values on each side (None where absent or not found); ``text`` is the line ``cudastack diff`` prints.
    """

    kind: str
    subject: str
    item: str | None
    change: str
    before: Any
    after: Any
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "item": self.item,
            "change": self.change,
            "before": self.before,
            "after": self.after,
            "text": self.text,
        }


def snapshot_drift(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[Drift, ...]:
    """The differences between two stack snapshots (``Stack.to_json``); empty when equal."""
    od, nd = old.get("driver") or {}, new.get("driver") or {}
    return (
        *_driver_drift(od, nd),
        *_wheels_drift(old.get("wheels", ()), new.get("wheels", ())),
        *_binaries_drift(old.get("binaries", ()), new.get("binaries", ())),
    )


def _driver_drift(od: Mapping[str, Any], nd: Mapping[str, Any]) -> list[Drift]:
    """The driver's changes: its version, CUDA version, architectures and GPUs (name, compute capability)."""
    out: list[Drift] = []
    for key in ("version", "cuda_version", "archs"):
        if od.get(key) != nd.get(key):
            line = f"driver {key}: {od.get(key)} -> {nd.get(key)}"
            out.append(Drift("driver", key, None, "changed", od.get(key), nd.get(key), line))
    ogpus = [(g.get("name"), g.get("compute_capability")) for g in od.get("gpus", ())]
    ngpus = [(g.get("name"), g.get("compute_capability")) for g in nd.get("gpus", ())]
    if ogpus != ngpus:
        line = f"GPUs: {ogpus or 'none'} -> {ngpus or 'none'}"
        was, now = ([{"name": n, "compute_capability": c} for n, c in gpus] for gpus in (ogpus, ngpus))
        out.append(Drift("driver", "gpus", None, "changed", was, now, line))
    return out


def _wheels_drift(old: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[Drift]:
    """Wheels added or removed, by name in order, and the changes of each wheel on both sides."""
    out: list[Drift] = []
    ow, nw = _index(old, "name"), _index(new, "name")
    for name in sorted(ow.keys() | nw.keys()):
        a, b = ow.get(name), nw.get(name)
        if a is None and b is not None:
            line = f"wheel {name} {b.get('version')}: added"
            out.append(Drift("wheel", name, None, "added", None, b.get("version"), line))
        elif b is None and a is not None:
            line = f"wheel {name} {a.get('version')}: removed"
            out.append(Drift("wheel", name, None, "removed", a.get("version"), None, line))
        elif a is not None and b is not None:
            out.extend(_wheel_drift(name, a, b))
    return out


def _wheel_drift(name: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Drift]:
    """One wheel's changes: its version, then its files that went missing and those that are back."""
    out: list[Drift] = []
    if a.get("version") != b.get("version"):
        line = f"wheel {name}: {a.get('version')} -> {b.get('version')}"
        out.append(Drift("wheel", name, None, "changed", a.get("version"), b.get("version"), line))
    am, bm = set(a.get("missing", ())), set(b.get("missing", ()))
    out.extend(Drift("wheel", name, p, "removed", p, None, f"wheel {name}: {p} went missing") for p in sorted(bm - am))
    out.extend(Drift("wheel", name, p, "added", None, p, f"wheel {name}: {p} is back") for p in sorted(am - bm))
    return out


def _binaries_drift(old: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[Drift]:
    """Binaries added or removed, by path in order, and the changed library paths of each binary on both sides."""
    out: list[Drift] = []
    ob, nb = _index(old, "path"), _index(new, "path")
    for path in sorted(ob.keys() | nb.keys()):
        a, b = ob.get(path), nb.get(path)
        if a is None or b is None:
            change = "added" if a is None else "removed"
            out.append(Drift("binary", path, None, change, None, None, f"binary {path}: {change}"))
        else:
            out.extend(_binary_drift(path, a, b))
    return out


def _binary_drift(path: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Drift]:
    """One binary's sonames whose path changed (found elsewhere, not found, newly or no longer needed)."""
    out: list[Drift] = []
    al = {lib["soname"]: lib.get("path") for lib in a.get("libraries", ())}
    bl = {lib["soname"]: lib.get("path") for lib in b.get("libraries", ())}
    for soname in sorted(al.keys() | bl.keys()):
        if al.get(soname, "absent") != bl.get(soname, "absent"):
            before = al.get(soname, "not needed") or "not found"
            after = bl.get(soname, "not needed") or "not found"
            change = "added" if soname not in al else "removed" if soname not in bl else "changed"
            line = f"binary {path}: {soname}: {before} -> {after}"
            out.append(Drift("binary", path, soname, change, al.get(soname), bl.get(soname), line))
    return out


def diff_snapshots(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """Human-readable differences between two stack snapshots (``Stack.to_json``); empty when equal."""
    return tuple(d.text for d in snapshot_drift(old, new))


def baseline_findings(baseline: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[Finding, ...]:
    """One ERROR per difference between the recorded baseline and the stack now."""
    return tuple(
        Finding(
            "baseline",
            Severity.ERROR,
            baseline,
            f"drift from baseline: {line}",
            remedies=manual(f"restore the recorded stack, or re-record it (pytest --cudastack-snapshot={baseline})"),
        )
        for line in diff_snapshots(old, new)
    )


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``baseline`` item: the snapshot ``--cudastack-baseline`` names against the stack now."""
    baseline = stack.settings.cudastack_baseline
    if baseline is None:
        raise ValueError("cudastack check 'baseline' needs --cudastack-baseline")
    return baseline_findings(baseline, stack.recorded_snapshot(baseline), stack.to_json())
