"""The baseline check: the stack now against a snapshot recorded earlier (``Stack.to_json``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_cudastack.findings import Finding, Severity, manual
from pytest_cudastack.model.fleet import snapshot_problems

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target

__all__ = ["Drift", "baseline_findings", "diff_snapshots", "run", "snapshot_drift"]


def _index(items: Iterable[Mapping[str, Any]], key: str) -> dict[str, Mapping[str, Any]]:
    return {str(item[key]): item for item in items}


@dataclass(frozen=True)
class Drift:
    """One difference between two snapshots, as ``cudastack diff --json`` lists it (schemas/diff.schema.json).

    ``kind`` is "driver" (``subject``: "version", "cuda_version", "archs" or "gpus"), "wheel" (``subject``: its
    name; ``item``: the file that went missing, is back, or whose bytes changed), "binary" (``subject``: its
    path; ``item``: the soname whose path changed) or "host" (``subject``: "kernel_module", "libcuda_version"
    or "nvml_version"); ``change`` is "added", "removed" or "changed"; ``before``/``after`` are the
    values on each side (None where absent or not found); ``text`` is the line ``cudastack diff`` prints.
    """

    kind: str
    subject: str
    item: str | None
    change: str
    before: Any
    after: Any
    text: str

    @property
    def key(self) -> str:
        """What differs, as one id: ``wheel nvidia-cudnn-cu12 /s/libcudnn.so.9``, ``driver version``. Each
        drift's finding is its own subject, so the repair plan's ``resolves`` names each one apart."""
        return " ".join(p for p in (self.kind, self.subject, self.item) if p)

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
        *_host_drift(old.get("host"), new.get("host")),
        *_wheels_drift(old.get("wheels", ()), new.get("wheels", ())),
        *_binaries_drift(old.get("binaries", ()), new.get("binaries", ())),
    )


def _host_drift(oh: Mapping[str, Any] | None, nh: Mapping[str, Any] | None) -> list[Drift]:
    """The node's kernel module and user-space driver library versions, when both snapshots have node facts
    (the driver's version, CUDA and GPUs are the driver's drift)."""
    if not oh or not nh:
        return []
    out: list[Drift] = []
    for key in ("kernel_module", "libcuda_version", "nvml_version"):
        if oh.get(key) != nh.get(key):
            line = f"host {key}: {oh.get(key)} -> {nh.get(key)}"
            out.append(Drift("host", key, None, "changed", oh.get(key), nh.get(key), line))
    return out


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
    listed = _record_owners(nw.values())
    for name in sorted(ow.keys() | nw.keys()):
        a, b = ow.get(name), nw.get(name)
        if a is None and b is not None:
            line = f"wheel {name} {b.get('version')}: added"
            out.append(Drift("wheel", name, None, "added", None, b.get("version"), line))
        elif b is None and a is not None:
            line = f"wheel {name} {a.get('version')}: removed"
            out.append(Drift("wheel", name, None, "removed", a.get("version"), None, line))
        elif a is not None and b is not None:
            out.extend(_wheel_drift(name, a, b, listed))
    return out


def _record_owners(wheels: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(RECORD path, RECORD hash) -> "name version" of the wheel whose RECORD lists those bytes there."""
    out: dict[tuple[str, str], str] = {}
    for w in wheels:
        for f in w.get("files", ()):
            if f.get("record"):
                out.setdefault((str(f["path"]), str(f["record"])), f"{w.get('name')} {w.get('version')}")
    return out


def _bytes_drift(
    name: str, a: Mapping[str, Any], b: Mapping[str, Any], listed: Mapping[tuple[str, str], str]
) -> list[Drift]:
    """Each library present on both sides whose bytes on disk changed, saying whose bytes are there now: its
    own RECORD's, another wheel's (a cu12 build installed over the cu13 one at the same paths), or nobody's.
    Snapshots without bytes (version 1) compare nothing here."""
    out: list[Drift] = []
    af = {str(f.get("path")): f for f in a.get("files", ())}
    for f in b.get("files", ()):
        path = str(f.get("path"))
        before, after = (af.get(path) or {}).get("sha256"), f.get("sha256")
        if before is None or after is None or before == after:
            continue
        if after == f.get("record"):
            whose = "its RECORD's bytes again" if (af.get(path) or {}).get("record") != before else "new bytes"
        elif (other := listed.get((path, str(after)))) is not None:
            whose = f"replaced by {other}'s bytes"
        else:
            whose = "replaced by bytes no installed RECORD lists"
        line = f"wheel {name}: {path}: {whose} ({before[:19]}... -> {after[:19]}...)"
        out.append(Drift("wheel", name, path, "changed", before, after, line))
    return out


def _wheel_drift(
    name: str, a: Mapping[str, Any], b: Mapping[str, Any], listed: Mapping[tuple[str, str], str]
) -> list[Drift]:
    """One wheel's changes: its version, then its files that went missing and those that are back, then the
    libraries whose bytes changed."""
    out: list[Drift] = []
    if a.get("version") != b.get("version"):
        line = f"wheel {name}: {a.get('version')} -> {b.get('version')}"
        out.append(Drift("wheel", name, None, "changed", a.get("version"), b.get("version"), line))
    am, bm = set(a.get("missing", ())), set(b.get("missing", ()))
    out.extend(Drift("wheel", name, p, "removed", p, None, f"wheel {name}: {p} went missing") for p in sorted(bm - am))
    out.extend(Drift("wheel", name, p, "added", None, p, f"wheel {name}: {p} is back") for p in sorted(am - bm))
    if a.get("version") == b.get("version"):
        out.extend(_bytes_drift(name, a, b, listed))
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


def restore_step(d: Drift) -> str:
    """What brings one difference back to the recorded stack, by hand (a wheel's recorded version, the recorded
    driver); the other way out, re-recording, is the finding's second step."""
    if d.kind == "wheel" and d.item is None:
        if d.change == "added":
            return f"uninstall {d.subject} (not in the recorded stack)"
        now = f"; {d.after} now" if d.change == "changed" else ""
        return f"install {d.subject} {d.before} (recorded{now})"
    if d.kind == "wheel":
        return f"force-reinstall {d.subject} at its recorded version (its {d.item} {d.change} since)"
    if d.kind == "binary":
        before, after = (v or "not found" for v in (d.before, d.after))
        return f"restore {d.subject} as recorded ({d.item}: {before} recorded, {after} now)"
    return f"restore the recorded {d.kind} {d.subject}: {d.before} ({d.after} now)"


def baseline_findings(baseline: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[Finding, ...]:
    """One ERROR per difference between the recorded baseline and the stack now, its remedy the steps by
    hand that restore it (:func:`restore_step`). Re-recording is proposed only when the stack now shows no
    error (:func:`snapshot_problems`): a broken stack never becomes the baseline."""
    problems = snapshot_problems(new)
    if problems:
        shown = "; ".join(p.text for p in problems[:3]) + (f"; {len(problems) - 3} more" if len(problems) > 3 else "")
        why = f"not re-recorded: the stack now has errors ({shown}), which would become the baseline"
        rerecord = ""
    else:
        why = "the stack drifted from the recorded one"
        rerecord = f"or re-record it: pytest --cudastack-snapshot={baseline}"
    return tuple(
        Finding(
            "baseline",
            Severity.ERROR,
            d.key,
            f"drift from baseline: {d.text}",
            remedies=manual(restore_step(d), rerecord, why=why),
            where=(baseline,),
        )
        for d in snapshot_drift(old, new)
    )


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``baseline`` item: the snapshot ``--cudastack-baseline`` names against the stack now."""
    baseline = stack.settings.cudastack_baseline
    if baseline is None:
        raise ValueError("cudastack check 'baseline' needs --cudastack-baseline")
    return baseline_findings(baseline, stack.recorded_snapshot(baseline), stack.to_json())
