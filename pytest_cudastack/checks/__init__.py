"""Invariant checks of the pytest layer: facts + options -> findings. Pure functions; no pytest.

Each function returns ``tuple[Finding, ...]``; an invariant item fails iff one of them is an ERROR.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_cudastack.checks.bounds import CudaNeed, Inference
from pytest_cudastack.findings import Finding, Severity

if TYPE_CHECKING:
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.linker.resolver import Tree
    from pytest_cudastack.wheels.inventory import Inventory

__all__ = [
    "arch_coverage",
    "baseline_findings",
    "binary_findings",
    "diff_snapshots",
    "driver_findings",
    "scan_targets",
]

logger = logging.getLogger(__name__)


def scan_targets(paths: Sequence[str], base: str) -> tuple[tuple[str, str], ...]:
    """``(display name, absolute path)`` for every ELF file named by ``paths`` (directories walked).

    Relative paths are taken from ``base`` (the rootdir); display names are relative to it where possible.
    A path that does not exist stays in the list, so its item can fail and say so.
    """
    from pytest_cudastack.linker.elf import looks_like_elf

    found: dict[str, str] = {}

    def display(path: str) -> str:
        rel = os.path.relpath(path, base)
        return path if rel.startswith("..") else rel

    for given in paths:
        path = os.path.normpath(os.path.join(base, os.path.expanduser(given)))
        if os.path.isdir(path):
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames.sort()
                for name in sorted(filenames):
                    full = os.path.join(dirpath, name)
                    if os.path.isfile(full) and looks_like_elf(full):
                        found.setdefault(full, display(full))
        else:
            found.setdefault(path, display(path))
    return tuple((name, path) for path, name in found.items())


def binary_findings(
    tree: Tree, subject: str, inventory: Inventory | None = None, driver: DriverInfo | None = None
) -> tuple[Finding, ...]:
    """Every DT_NEEDED in ``tree``'s closure must resolve: one ERROR per missing soname, all at once.

    A missing driver soname (``libcuda.so.1``) is INFO unless a driver was probed on this machine: the
    driver comes with the deployment host, not with the image.
    """
    from pytest_cudastack.cuda.compat import is_driver_soname

    out: list[Finding] = []
    out.extend(
        Finding("scan", Severity.ERROR, subject, problem, fix="scan only ELF binaries") for problem in tree.problems
    )
    for lib in tree.missing:
        chain = tree.chain(lib.soname)
        if is_driver_soname(lib.soname) and (driver is None or driver.source != "probed"):
            out.append(
                Finding(
                    "scan",
                    Severity.INFO,
                    subject,
                    f"{lib.soname} (NVIDIA driver library) is not on this machine; the deployment host's "
                    "driver provides it",
                    chain=chain,
                )
            )
            continue
        shipped = [
            (dist, path, os.path.isfile(path)) for dist, path in (inventory.shipping(lib.soname) if inventory else ())
        ]
        claims = tuple(f"{d.label} ships it at {p} ({'present' if ok else 'missing'})" for d, p, ok in shipped)
        present = [p for _, p, ok in shipped if ok]
        if present:
            fix = f"add {os.path.dirname(present[0])} to the binary's RUNPATH (-Wl,-rpath) or to LD_LIBRARY_PATH"
        elif shipped:
            name = shipped[0][0].name
            fix = f"reinstall {name} (pip install --force-reinstall --no-deps {name})"
        else:
            fix = f"install the package that provides {lib.soname}, or rebuild against the CUDA this image has"
        out.append(
            Finding(
                "scan",
                Severity.ERROR,
                subject,
                f"needs {lib.soname}, which the dynamic linker does not find",
                cause=lib.problem or ("; ".join(claims) if claims else "no directory searched holds it"),
                fix=fix,
                where=lib.tried,
                chain=chain,
                details=claims,
            )
        )
    return tuple(out)


def driver_findings(inferences: Iterable[Inference], driver: DriverInfo) -> tuple[Finding, ...]:
    """Each distinct CUDA requirement of the stack against the driver (``verdicts.driver_verdict``).

    compatible: nothing; minor-version compatibility: WARNING; incompatible: ERROR; unknown: INFO.
    """
    from pytest_cudastack.cuda.verdicts import driver_verdict

    groups: dict[str, list[CudaNeed]] = {}
    for inf in inferences:
        if not inf.needs:
            continue
        need = max(inf.needs, key=lambda n: n.key)
        required = f"{need.major}.{need.minor}" if need.minor is not None else str(need.major)
        groups.setdefault(required, []).append(need)
    out: list[Finding] = []
    severity = {"compatible": None, "mvc": Severity.WARNING, "incompatible": Severity.ERROR}
    for required, needs in sorted(groups.items()):
        subject = needs[0].subject if len(needs) == 1 else f"{len(needs)} components"
        verdict = driver_verdict(required, driver)  # the finding's subject names who needs it
        sev = severity.get(verdict.status, Severity.INFO)
        if sev is None:
            continue
        out.append(
            Finding(
                "driver",
                sev,
                subject,
                verdict.message,
                fix=f"use a driver that supports CUDA {required}, or rebuild for the driver's CUDA"
                if sev is Severity.ERROR
                else "",
                details=tuple(f"{n.subject}: {n.evidence}" for n in needs),
            )
        )
    return tuple(out)


def arch_coverage(paths: Sequence[str], driver: DriverInfo) -> tuple[Finding, ...]:
    """GPU code of ``paths`` against the probed or declared archs (``archcheck.arch_findings``)."""
    from pytest_cudastack.checks.arch import arch_findings

    if not paths:
        return ()
    if not driver.archs:
        why = driver.reason or "no GPU found"
        return (
            Finding(
                "arch",
                Severity.INFO,
                "archs",
                f"no target GPU architecture known ({why}); pass --cuda-arch=sm_XX to check coverage",
            ),
        )
    return arch_findings(paths, driver.archs, driver.arch_source or driver.source)


# snapshots ------------------------------------------------------------------------------------------


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
