"""The integrity check: are the installed distributions' files intact, and whose bytes are on disk?

Four kinds of finding, each naming the distributions, the paths and the bytes on disk, with the repair:

* **overlap**: one path listed by the RECORDs of two or more distributions with different contents (pip
  installs the second over the first without a word; uninstalling either deletes what the other lists).
  Overlaps whose RECORDs agree byte for byte (namespace ``__init__.py`` files) are not reported, except
  shared libraries, which are reported as INFO (uninstalling either still deletes the other's copy).
* **broken pin**: a distribution requires Y, but Y's shared libraries on disk are another distribution's
  bytes (torch pins nvidia-cudnn-cu13==9.24.0.43, libcudnn.so.9 on disk is nvidia-cudnn-cu12 9.19.0.56's).
* **missing / altered**: a RECORD-listed shared library is gone, or its size (hash when the size cannot tell)
  is not what the RECORD says and no other RECORD claims those bytes. A distribution whose every file is
  gone gets one finding saying so ("ships nothing it claims").
* **placeholder**: a ``0.0.x.devN`` / "placeholder" distribution that ships no files.

A distribution an OS package owns (:attr:`~pytest_cudastack.wheels.inventory.Distribution.os_package`: dpkg
lists its dist-info and no Python installer wrote its INSTALLER) gets no RECORD verdict: Debian strips its
shared libraries after pip's RECORD was written. Its shared libraries are judged by the package's own record
(dpkg's md5sums): one that is gone or whose md5 differs is an error whose remedy is the package's reinstall
(``apt-get install --reinstall PKG``, by hand), never a pip command.

The facts (whose bytes are where) come from :mod:`pytest_cudastack.wheels.ownership`; each failing finding's
fix is replaced by the one the repair model verifies (``repair.verified_fixes``: the plan's command for the
whole item where it repairs the finding).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from pytest_cudastack.findings import Facts, Finding, Manual, Pip, Remedy, Severity, manual
from pytest_cudastack.model.repair import verified_fixes
from pytest_cudastack.model.system import VENV, by_hand_instead, externally_managed_env
from pytest_cudastack.wheels.dpkg import INFO_DIR, md5sums, md5sums_path, reinstall_command
from pytest_cudastack.wheels.inventory import Distribution, Inventory, install_prefix, is_shared_lib_path
from pytest_cudastack.wheels.ownership import (
    FORCE,
    DebOverlap,
    Disk,
    Listed,
    PathState,
    Requirer,
    StateFn,
    active_requirements,
    attribute,
    deb_overlaps,
    exact_pin,
    file_digest,
    in_dist_info,
    inside_site,
    pip_command,
    pip_python,
    reinstall,
    uninstall,
    variant_sibling,
)
from pytest_cudastack.wheels.requirements import Requirements
from pytest_cudastack.wheels.sitepaths import externally_managed

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target

__all__ = ["check_integrity", "integrity_findings", "run"]

logger = logging.getLogger(__name__)

_PLACEHOLDER_VERSION = re.compile(r"^0\.0\.\d+\.dev\d+$")


_PLACEHOLDER_SUMMARY = re.compile(r"placeholder|fake package|dummy package|not the package", re.IGNORECASE)


_LIB_NAMES = {
    "cudnn": "cuDNN",
    "nccl": "NCCL",
    "cusparselt": "cuSPARSELt",
    "nvshmem": "NVSHMEM",
    "cublas": "cuBLAS",
    "cufft": "cuFFT",
    "cusparse": "cuSPARSE",
    "cusolver": "cuSOLVER",
    "curand": "cuRAND",
    "cutensor": "cuTENSOR",
}


_Required = Callable[[], "dict[str, list[Requirer]]"]  # who requires what, computed on the first call


def check_integrity(
    inv: Inventory, *, verify_hashes: bool = False, reqs: Requirements | None = None
) -> tuple[Finding, ...]:
    """Integrity findings for an inventory (overlaps, broken pins, missing/altered libraries, placeholders).

    ``verify_hashes=True`` also hashes every existing RECORD-listed shared library whose size matches
    (slow on a CUDA venv: gigabytes); by default a matching size is taken as intact.
    """
    disk = Disk(verify_hashes)
    memo: list[dict[str, list[Requirer]]] = []

    def required_by() -> dict[str, list[Requirer]]:
        """active_requirements(inv, reqs), computed when a finding first needs it (most runs find nothing)."""
        if not memo:
            memo.append(active_requirements(inv, reqs))
        return memo[0]

    by_path = Listed(inv)
    states: dict[str, PathState] = {}

    def state(path: str) -> PathState:
        if path not in states:
            owners = by_path.get(path)
            on_disk, undecided = attribute(path, owners, disk)
            states[path] = PathState(path, owners[0].entry.path, tuple(owners), disk.size(path), on_disk, undecided)
        return states[path]

    debs = deb_overlaps(inv, by_path, state, disk)
    findings: list[Finding] = []
    findings += _overlaps(inv, by_path, state, required_by)
    findings += _deb_overlap_findings(inv, debs, required_by)
    findings += _broken_pins(inv, state, required_by)
    dpkg_bytes = {o.state.path for o in debs if o.whose == "deb"}  # attributed: to dpkg's package
    findings += _missing_or_altered(inv, by_path, state, disk, required_by, dpkg_bytes)
    findings += _placeholders(inv, required_by)
    findings += _os_package_findings(inv, {o.state.path for o in debs if o.whose == "wheel"})
    if disk.hashed:
        logger.debug("integrity hashed %d file(s): %s", len(disk.hashed), disk.hashed[:5])
    return tuple(findings)


def _pinned_version(dist: Distribution, requirers: Sequence[Requirer]) -> str:
    for r in requirers:
        specs = list(r.requirement.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
            return specs[0].version
    return dist.version


def _who_requires(dist: Distribution, required_by: dict[str, list[Requirer]]) -> list[Requirer]:
    return [r for r in required_by.get(dist.key, []) if r.dist is not dist]


def _keep_one(dists: Sequence[Distribution], required_by: dict[str, list[Requirer]]) -> tuple[str, tuple[Remedy, ...]]:
    """(reason, remedies) for distributions that install the same paths: keep the required one."""
    names = " and ".join(d.name for d in dists) if len(dists) == 2 else ", ".join(d.name for d in dists)
    head = f"{names} install the same paths; keep one"
    req = {d.key: _who_requires(d, required_by) for d in dists}
    required = [d for d in dists if req[d.key]]
    if len(required) == 1:
        keep = required[0]
        drop = [d for d in dists if d is not keep]
        version = _pinned_version(keep, req[keep.key])
        why = "; ".join(f"{r.dist.label} requires {r.text}" for r in req[keep.key][:3])
        reason = f"{head}: {why}, nothing installed requires {', '.join(d.name for d in drop)}"
        return reason, (uninstall(drop, why=reason), reinstall(keep, version, why=why))
    if not required:
        reason = f"{head}: nothing installed requires any of them"
        pip = pip_command(dists[0])
        return reason, manual(
            "uninstall the one you do not use, then force-reinstall the other, e.g. "
            f"{pip} uninstall -y {dists[0].name} && "
            f"{pip} install --force-reinstall --no-deps {dists[-1].name}=={dists[-1].version}"
        )
    why = "; ".join(f"{r.dist.label} requires {r.text}" for d in required for r in req[d.key][:2])
    reason = f"{head}, but more than one is required ({why}): they cannot share one environment"
    return reason, manual(
        "keep the one the package you run needs (force-reinstall it with --no-deps after uninstalling "
        "the other) and move the other's dependents to a separate environment"
    )


def _summarise(paths: Sequence[str], limit: int = 4) -> str:
    names = [os.path.basename(p) for p in paths]
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _common_dir(rels: Sequence[str]) -> str:
    try:
        common = os.path.commonpath([os.path.dirname(r) or "." for r in rels])
    except ValueError:
        return ""
    return common if common not in ("", ".") else ""


def _overlaps(
    inv: Inventory,
    by_path: Listed,
    state: StateFn,
    required_by: _Required,
) -> list[Finding]:
    """One finding per set of distributions that list the same paths: an ERROR when their rows differ, an
    INFO when only identical shared libraries are shared."""
    groups: dict[tuple[int, ...], list[PathState]] = {}
    order: dict[int, int] = {id(d): i for i, d in enumerate(inv.distributions)}
    for path in by_path.shared:
        owners = by_path.get(path)
        key = tuple(sorted(order[id(o.dist)] for o in owners))
        groups.setdefault(key, []).append(state(path))
    findings: list[Finding] = []
    for key, paths in sorted(groups.items()):
        if sum(inv.distributions[i].os_package is None for i in key) < 2:
            continue  # an OS package's RECORD is not its record: its md5sums judge its files
        found = _overlap_finding([inv.distributions[i] for i in key], paths, required_by)
        if found is not None:
            findings.append(found)
    return findings


def _overlap_finding(
    dists: Sequence[Distribution], paths: Sequence[PathState], required_by: _Required
) -> Finding | None:
    """The finding for ``dists`` listing ``paths`` together, None when nothing of it matters."""
    conflicting = [s for s in paths if s.conflicting]
    libs = [s for s in paths if is_shared_lib_path(s.path)]
    if not conflicting and not libs:
        return None
    labels = " and ".join(d.label for d in dists) if len(dists) == 2 else ", ".join(d.label for d in dists)
    what = _what_is_shared(paths, libs)
    fix: tuple[Remedy, ...] = ()
    if conflicting:
        strays = _stray_modules(conflicting)
        # a top-level module file both wheels ship by mistake (a build script: build_backend.py) is read only
        # by an import of that very name: nothing of either distribution's packages or libraries changes
        severity = Severity.WARNING if strays else Severity.ERROR
        message = f"{labels} install the same {what}; " + "; ".join(_whose_bytes(conflicting))
        reason, fix = _overlap_remedy(dists, required_by)
        cause = (
            "pip installs one distribution's files over the other's without a warning, and uninstalling "
            f"either deletes files the other's RECORD still lists. {reason}"
        )
        if strays:
            cause += (
                f"; only {', '.join(f'`import {m}`' for m in strays)} reads them: top-level modules outside "
                "either distribution's packages, no shared library among them"
            )
    else:
        severity = Severity.INFO
        message = f"{labels} list the same {what} with identical bytes"
        cause = "uninstalling either deletes the file the other still lists"
    shown = sorted(conflicting or libs, key=lambda s: (not is_shared_lib_path(s.path), s.rel))
    details = tuple(s.describe() for s in shown[:8])
    if len(shown) > 8:
        details += (f"... and {len(shown) - 8} more",)
    return Finding(
        check="integrity",
        severity=severity,
        subject=" / ".join(d.name for d in dists),
        distributions=tuple(d.key for d in dists),
        message=message,
        cause=cause,
        remedies=fix,
        facts=Facts(objects=tuple(s.path for s in shown), versions=tuple((d.name, d.version) for d in dists)),
        where=tuple(os.path.join(d.dist_info, "RECORD") for d in dists),
        details=details,
    )


def _stray_modules(conflicting: Sequence[PathState]) -> list[str]:
    """The top-level module names when every conflicting path is a top-level Python module of the site
    (``build_backend.py``, its ``__pycache__/build_backend.cpython-311.pyc``), else none."""
    names: list[str] = []
    for s in conflicting:
        parts = s.rel.replace(os.sep, "/").split("/")
        if parts[0] == "__pycache__" and len(parts) == 2 and parts[1].endswith(".pyc"):
            name = parts[1].split(".")[0]
        elif len(parts) == 1 and parts[0].endswith(".py"):
            name = parts[0][:-3]
        else:
            return []
        if name.isidentifier() and name not in names:
            names.append(name)
    return names


def _what_is_shared(paths: Sequence[PathState], libs: Sequence[PathState]) -> str:
    """``3 file(s) under nvidia/cudnn/lib/, 2 of them shared libraries (libcudnn.so.9, ...)``."""
    where_dir = _common_dir(sorted(s.rel for s in paths))
    under = f" under {where_dir}/" if where_dir else ""
    what = f"{len(paths)} file(s){under}"
    lib_rels = sorted(s.rel for s in libs)
    if lib_rels:
        what += f", {len(lib_rels)} of them shared libraries ({_summarise(lib_rels)})"
    return what


def _whose_bytes(states: Sequence[PathState]) -> list[str]:
    """Whose bytes are on disk at the shared paths, grouped by owner ("the bytes on disk are X's")."""
    winners: dict[str, list[str]] = {}
    for s in sorted(states, key=lambda s: s.rel):
        if s.size is None:
            winners.setdefault("missing", []).append(s.rel)
        elif s.on_disk:
            winners.setdefault(" / ".join(d.label for d in s.on_disk), []).append(s.rel)
        else:
            winners.setdefault("unknown", []).append(s.rel)
    parts = []
    for who, rs in winners.items():
        if who == "missing":
            parts.append(f"{len(rs)} are missing")
        elif who == "unknown":
            parts.append(f"{len(rs)} match no RECORD")
        elif len(winners) == 1:
            parts.append(f"the bytes on disk are {who}'s")
        else:
            parts.append(f"{len(rs)} on disk are {who}'s ({_summarise(rs, 2)})")
    return parts


def _overlap_remedy(dists: Sequence[Distribution], required_by: _Required) -> tuple[str, tuple[Remedy, ...]]:
    """(reason, remedies) of a conflicting overlap: two dist-infos of one name are a leftover; otherwise keep
    the one that is required (:func:`_keep_one`)."""
    if len({d.key for d in dists}) != 1:
        return _keep_one(dists, required_by())
    reason = (
        f"two dist-info directories of {dists[0].name} list the same files: one is left over "
        "from an interrupted install or uninstall"
    )
    pip = pip_command(dists[0])
    return reason, manual(
        f"{pip} uninstall -y {dists[0].name} (repeat until none is left)",
        f"{pip} install --no-deps {dists[-1].name}=={dists[-1].version}",
    )


def _lib_name(dist_name: str) -> str:
    base = re.sub(r"-cu\d+$", "", canonicalize_name(dist_name))
    base = re.sub(r"^nvidia-", "", base)
    return _LIB_NAMES.get(base, base)


def _broken_pins(inv: Inventory, state: StateFn, required: _Required) -> list[Finding]:
    findings: list[Finding] = []
    if not any(_foreign_on_disk(y, state) for y in inv.distributions):
        return findings  # no requirement can be broken: who requires what is not needed
    required_by = required()
    for key, requirers in required_by.items():
        y = inv.get(key)
        if y is None:
            continue
        foreign: dict[int, tuple[Distribution, list[PathState]]] = {}
        for lib in y.libraries:
            if lib.record is None or not lib.exists:
                continue
            s = state(lib.path)
            if not s.on_disk or any(d is y for d in s.on_disk):
                continue
            z = s.on_disk[0]
            foreign.setdefault(id(z), (z, []))[1].append(s)
        if not foreign:
            continue
        for r in requirers:
            if r.dist is y:
                continue
            for z, states in foreign.values():
                states.sort(key=lambda s: s.rel)
                rels = [s.rel for s in states]
                more = f" (and {len(rels) - 1} more)" if len(rels) > 1 else ""
                exact = exact_pin(r)
                libname = _lib_name(y.name)
                if exact is not None and z.version != exact and libname == "cuDNN" and r.dist.key == "torch":
                    # torch compares the cuDNN version it was built with to the loaded one at first use
                    predicted = (
                        f"cuDNN version incompatibility at first use: torch was built against {exact}, the "
                        f"files on disk are {z.version}"
                    )
                elif exact is not None and z.version != exact:
                    predicted = (
                        f"{r.dist.name} pins {y.name}=={exact} but will load {libname} {z.version} from {z.name}"
                    )
                else:
                    predicted = f"{r.dist.name} will load {z.label}'s build of {libname}, not {y.label}'s"
                if z.cuda_major is not None and y.cuda_major is not None and z.cuda_major != y.cuda_major:
                    predicted += f" (built for CUDA {z.cuda_major}, {y.name} is for CUDA {y.cuda_major})"
                _reason, fix = _keep_one([y, z], required_by)
                findings.append(
                    Finding(
                        check="integrity",
                        severity=Severity.ERROR,
                        subject=f"{r.dist.name} -> {r.text}",
                        distributions=(r.dist.key,),
                        message=(
                            f"{r.dist.label} requires {r.text}, but {rels[0]}{more} on disk "
                            f"{'are' if more else 'is'} {z.label}'s"
                        ),
                        cause=f"predicted failure: {predicted}. "
                        f"{z.name} was installed over {y.name}: both install the same paths",
                        remedies=fix,
                        facts=Facts(
                            required=r.text,
                            found=f"{z.name} {z.version}",
                            objects=tuple(s.path for s in states),
                            versions=((y.name, y.version), (z.name, z.version)),
                            consumer=r.dist.key,
                        ),
                        where=(os.path.join(y.dist_info, "RECORD"), os.path.join(z.dist_info, "RECORD")),
                        details=tuple(s.describe() for s in states[:12]),
                    )
                )
    return findings


def _foreign_on_disk(y: Distribution, state: StateFn) -> bool:
    """Is some present library ``y``'s RECORD lists another distribution's bytes (and not ``y``'s)?"""
    for lib in y.libraries:
        if lib.record is None or not lib.exists:
            continue
        s = state(lib.path)
        if s.on_disk and not any(d is y for d in s.on_disk):
            return True
    return False


def _missing_or_altered(
    inv: Inventory,
    by_path: Listed,
    state: StateFn,
    disk: Disk,
    required: _Required,
    dpkg_bytes: frozenset[str] | set[str] = frozenset(),
) -> list[Finding]:
    """Per distribution: one finding when every file it lists is gone, else one for its RECORD-listed
    libraries that are gone and one for those with other bytes that no installed RECORD claims nor dpkg's
    md5sums (``dpkg_bytes``: those are a ``.deb``'s, reported with it)."""
    findings: list[Finding] = []
    for d in inv.distributions:
        if d.os_package is not None:
            continue  # judged by its package's md5sums (_os_package_findings)
        if _ships_none(d):
            findings.append(_ships_nothing(d, _own_files(d), by_path, required))
            continue
        missing, altered = _gone_and_altered(d, state, dpkg_bytes)
        if missing:
            findings.append(_gone_finding(d, missing, by_path))
        if altered:
            findings.append(
                Finding(
                    check="integrity",
                    severity=Severity.ERROR,
                    subject=d.label,
                    distributions=(d.key,),
                    message=f"{d.label}: {len(altered)} shared librar{'y has' if len(altered) == 1 else 'ies have'} "
                    "other bytes than its RECORD lists, and no installed RECORD claims them",
                    cause="modified after install (patchelf, strip, a copy over it) or overwritten by a "
                    "distribution that has since been uninstalled",
                    remedies=(reinstall(d),),
                    where=(os.path.join(d.dist_info, "RECORD"),),
                    details=tuple(altered[:12]),
                )
            )
    return findings


def _ships_none(d: Distribution) -> bool:
    """Does ``d`` list files outside its dist-info, none of them present? Stops at the first present one: a
    torch venv has ~22,000 RECORD rows, nearly all of whose first file exists."""
    own = (p for p in (d.abspath(e) for e in d.records) if p is not None and not in_dist_info(d, p))
    first = next(own, None)
    return first is not None and not os.path.lexists(first) and not any(os.path.lexists(p) for p in own)


def _own_files(d: Distribution) -> list[str]:
    """The absolute paths ``d``'s RECORD lists outside its dist-info."""
    return [p for p in (d.abspath(e) for e in d.records) if p is not None and not in_dist_info(d, p)]


def _ships_nothing(d: Distribution, own: Sequence[str], by_path: Listed, required: _Required) -> Finding:
    """``d`` lists files and every one is gone: why (another distribution's uninstall, most likely) and the
    repair (its required CUDA variant instead of it when nothing requires it, else its reinstall)."""
    others = sorted({o.dist.label for p in own for o in by_path.get(p) if o.dist is not d})
    if others:
        cause = (
            "its files were deleted, most likely by uninstalling another distribution that installs "
            f"the same paths; installed now and listing the same paths: {', '.join(others)}"
        )
    else:
        cause = (
            "its files were deleted, most likely by uninstalling another distribution that installs "
            f"the same paths{_variant_hint(d)}; no installed distribution lists them now, so which "
            "one cannot be read from the files"
        )
    needed = _who_requires(d, required())
    sibling = variant_sibling(d.key)
    wanted = [r for r in required().get(sibling or "", []) if r.dist is not d]
    fix: tuple[Remedy, ...]
    if not needed and wanted:
        # reinstalling it would put its bytes where the required variant's belong (an overlap)
        pin = next((v for r in wanted if (v := exact_pin(r)) is not None), None)
        why = f"{wanted[0].dist.label} requires {wanted[0].text}; nothing installed requires {d.name}"
        spec = f"{sibling}=={pin}" if pin else str(sibling)
        fix = (uninstall([d], why=why), Pip("install", (spec,), pip_python(d), FORCE, why=why))
    elif needed:
        fix = (reinstall(d),)
    else:
        fix = (reinstall(d), Manual((f"or, if nothing needs it: {pip_command(d)} uninstall -y {d.name}",)))
    return Finding(
        check="integrity",
        severity=Severity.ERROR,
        subject=d.label,
        distributions=(d.key,),
        message=(
            f"{d.label} ships nothing it claims: all {len(own)} file(s) its RECORD lists are gone, "
            "only its dist-info is left"
        ),
        cause=cause,
        remedies=fix,
        facts=Facts(objects=tuple(own), versions=((d.name, d.version),)),
        where=(os.path.join(d.dist_info, "RECORD"),),
        details=tuple(sorted(os.path.relpath(p, d.location) for p in own)[:8]),
    )


def _gone_and_altered(
    d: Distribution, state: StateFn, dpkg_bytes: frozenset[str] | set[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """``d``'s RECORD-listed libraries that are gone (relative paths, sorted) and those whose bytes match no
    installed RECORD (described); another owner's bytes (a RECORD's, a ``.deb``'s: ``dpkg_bytes``) are an
    overlap, reported there."""
    missing: list[str] = []
    altered: list[str] = []
    for lib in d.libraries:
        if lib.record is None or lib.path in dpkg_bytes:
            continue
        s = state(lib.path)
        if s.size is None:
            missing.append(s.rel)
        elif not s.on_disk and not s.undecided:
            altered.append(s.describe() + f" (RECORD: {lib.record.size} bytes)")
    return sorted(missing), altered


def _gone_finding(d: Distribution, missing: Sequence[str], by_path: Listed) -> Finding:
    """``d``'s RECORD-listed libraries that are gone, and who else lists those paths."""
    others = sorted(
        {o.dist.label for rel in missing for o in by_path.get(os.path.join(d.location, rel)) if o.dist is not d}
    )
    if len(missing) == 1:
        message = f"{d.label} lists {missing[0]} but the file is gone"
    else:
        message = f"{d.label} lists {len(missing)} shared libraries that are gone: {_summarise(missing)}"
    if others:
        cause = (
            f"{', '.join(others)} list(s) the same path(s); installing or uninstalling one of them "
            "replaces or deletes the other's files"
        )
    else:
        cause = (
            "deleted after install, by hand or by uninstalling a distribution that installs the same "
            f"paths{_variant_hint(d)}; no installed distribution lists them now"
        )
    return Finding(
        check="integrity",
        severity=Severity.ERROR,
        subject=d.label,
        distributions=(d.key,),
        message=message,
        cause=cause,
        remedies=(reinstall(d),),
        facts=Facts(objects=tuple(os.path.join(d.location, r) for r in missing), versions=((d.name, d.version),)),
        where=(os.path.join(d.dist_info, "RECORD"),),
        details=tuple(f"{r}: missing on disk" for r in missing[:12]),
    )


def _variant_hint(d: Distribution) -> str:
    """`` (nvidia-cudnn-cu12 does)`` for the wheels whose other CUDA variant installs the same paths."""
    sibling = variant_sibling(d.key)
    return f" ({sibling} does)" if sibling else ""


def _placeholders(inv: Inventory, required: _Required) -> list[Finding]:
    findings: list[Finding] = []
    for d in inv.distributions:
        looks = bool(_PLACEHOLDER_VERSION.match(d.version)) or bool(_PLACEHOLDER_SUMMARY.search(d.summary))
        if not looks:
            continue
        payload = [
            e for e in d.records if (p := d.abspath(e)) is not None and not in_dist_info(d, p) and inside_site(d, p)
        ]
        if payload:
            continue
        why = f"its summary says {d.summary!r}" if d.summary else f"version {d.version}"
        needed = _who_requires(d, required())
        by = f"; required by {', '.join(r.dist.label for r in needed[:3])}" if needed else ""
        findings.append(
            Finding(
                check="integrity",
                severity=Severity.WARNING,
                subject=d.label,
                distributions=(d.key,),
                message=f"{d.label} is a placeholder: it ships no modules or libraries ({why}){by}",
                cause="a stub wheel published under the real name, installed instead of the real distribution",
                remedies=(
                    uninstall([d], why="a placeholder, not the real distribution"),
                    Manual(("install the real distribution (its summary or project page says from where)",)),
                ),
                where=(os.path.join(d.dist_info, "METADATA"),),
            )
        )
    return findings


def _os_package_findings(inv: Inventory, wheel_bytes: frozenset[str] | set[str] = frozenset()) -> list[Finding]:
    """Per OS-owned distribution: its package's shared libraries under its site directory that are gone, and
    those whose md5 is not the one dpkg recorded (a package without md5sums is not judged); those whose
    bytes are a wheel's that lists them too (``wheel_bytes``) are that overlap's (:func:`_deb_overlap_findings`)."""
    findings: list[Finding] = []
    for d in inv.distributions:
        package = d.os_package
        if package is None:
            continue
        sums = md5sums(package, inv.dpkg_root)
        if not sums:
            continue
        record = md5sums_path(package, inv.dpkg_root)
        site = os.path.normpath(d.location).rstrip(os.sep) + os.sep
        missing: list[str] = []
        altered: list[str] = []
        for path, digest in sorted(sums.items()):
            if not path.startswith(site) or not is_shared_lib_path(path) or path in wheel_bytes:
                continue
            rel = path[len(site) :]
            if not os.path.lexists(path):
                missing.append(rel)
                continue
            raw = file_digest(path, hashlib.md5(usedforsecurity=False))
            got = None if raw is None else raw.hex()
            if got != digest:
                altered.append(f"{rel}: md5 {got or 'unreadable'}, dpkg's md5sums: {digest}")
        if missing:
            gone = [f"{r}: missing on disk" for r in missing]
            findings.append(_os_finding(d, package, record, missing, "gone", gone))
        if altered:
            rels = [a.partition(":")[0] for a in altered]
            findings.append(_os_finding(d, package, record, rels, "altered", altered))
    return findings


def _os_finding(
    d: Distribution, package: str, record: str, rels: Sequence[str], how: str, details: Sequence[str]
) -> Finding:
    """The finding for an OS package's shared libraries that are gone or altered (``record``: its md5sums)."""
    pkg = package.partition(":")[0]
    n = len(rels)
    what = f"{n} shared librar{'y' if n == 1 else 'ies'} ({_summarise(rels)})"
    if how == "gone":
        message = f"{d.label}: {what} dpkg's {pkg} installed {'is' if n == 1 else 'are'} gone"
        cause = "deleted after the package was installed (by hand, or by a pip uninstall over the system's files)"
    else:
        message = f"{d.label}: {what} {'has' if n == 1 else 'have'} other bytes than dpkg's md5sums for {pkg} list"
        cause = "modified after the package was installed (a pip install over the system's files, patchelf, a copy)"
    return Finding(
        check="integrity",
        severity=Severity.ERROR,
        subject=d.label,
        distributions=(d.key,),
        message=message,
        cause=f"{cause}; the files are {pkg}'s, so dpkg, not pip, puts them back",
        remedies=(
            Manual(
                (reinstall_command(pkg),),
                why=f"dpkg's {pkg} owns {d.name}'s files: its md5sums are their record, and pip must not "
                "replace a system package's files",
            ),
        ),
        facts=Facts(
            objects=tuple(os.path.join(d.location, r) for r in rels),
            versions=((d.name, d.version),),
        ),
        where=(d.dist_info, record),
        details=tuple(details[:12]),
    )


def _deb_overlap_findings(inv: Inventory, overlaps: Sequence[DebOverlap], required: _Required) -> list[Finding]:
    """One finding per wheel and ``.deb`` that list the same paths (:func:`deb_overlaps`), by whose bytes are
    on disk: a WARNING naming what breaks, and when (the bytes load and run today: which of the two owners'
    operations undoes the other's); an INFO for identical shared libraries; a path gone is the missing
    library's finding (``_gone_finding``, the loader's), not this one's."""
    groups: dict[tuple[str, str], list[DebOverlap]] = {}
    for o in overlaps:
        wheel = next(own.dist for own in o.state.owners if own.dist.os_package is None)
        if o.whose == "missing" or (o.whose == "both" and not is_shared_lib_path(o.state.path)):
            continue
        groups.setdefault((wheel.key, o.package), []).append(o)
    findings: list[Finding] = []
    for (key, package), found in groups.items():
        dist = inv.get(key)
        if dist is not None:
            findings.append(_deb_overlap_finding(inv, dist, package, found, required))
    return findings


def _deb_whose(d: Distribution, pkg: str, found: Sequence[DebOverlap]) -> tuple[str, str]:
    """(whose bytes, what breaks) of the paths ``d`` and dpkg's ``pkg`` both list."""
    whose = {o.whose for o in found}
    if whose == {"both"}:
        return "with identical bytes", f"uninstalling {d.name} (pip) or removing {pkg} (apt) deletes the other's file"
    verdicts = []
    for label, kind in ((f"{d.label}'s", "wheel"), (f"dpkg's {pkg}'s", "deb"), ("neither's", "neither")):
        rels = sorted(o.state.rel for o in found if o.whose == kind)
        if rels and whose == {kind}:
            verdicts.append(f"the bytes on disk are {label}")
        elif rels:
            verdicts.append(f"{_summarise(rels, 2)} on disk {'is' if len(rels) == 1 else 'are'} {label}")
    unknown = sorted(o.state.rel for o in found if o.whose == "unknown")
    if unknown:
        verdicts.append(f"whose bytes {_summarise(unknown, 2)} holds cannot be told (no record to compare)")
    breaks: list[str] = []
    if "deb" in whose:
        breaks.append(f"{d.name}'s RECORD does not match them now: what imports {d.name} runs {pkg}'s build")
    if any(o.deb_bytes is False for o in found):
        breaks.append(f"dpkg --verify {pkg} fails now (their md5 is not its md5sums')")
    if whose & {"wheel", "neither", "unknown"}:
        breaks.append(
            f"apt-get upgrade or apt-get install --reinstall {pkg} writes {pkg}'s bytes over them, and "
            f"{d.name}'s RECORD no longer matches"
        )
    breaks.append(f"pip uninstall {d.name} deletes them, leaving {pkg} without its files")
    return "; ".join(verdicts), "; ".join(breaks)


def _deb_overlap_finding(
    inv: Inventory, d: Distribution, package: str, found: Sequence[DebOverlap], required: _Required
) -> Finding:
    """The finding for ``d`` (a wheel) and dpkg's ``package`` listing ``found``'s paths, with the repair as
    steps in order: uninstall the wheel (which deletes the shared files), reinstall the package (which puts
    them back), and, where something needs the wheel, install it where dpkg owns nothing (a venv that sees
    the system's packages). On another system's root (an image) the steps are ``RUN`` lines of its build."""
    pkg = package.partition(":")[0]
    states = [o.state for o in found]
    libs = [s for s in states if is_shared_lib_path(s.path)]
    whose, breaks = _deb_whose(d, pkg, found)
    severity = Severity.INFO if {o.whose for o in found} == {"both"} else Severity.WARNING
    root = os.path.normpath(inv.root or os.sep)
    image = inv.root is not None

    def shown(path: str) -> str:  # a path as the system it belongs to names it
        return "/" + os.path.relpath(path, root) if image and path.startswith(root + os.sep) else path

    python = pip_python(d)
    pip = f"{shown(python)} -m pip" if python else "pip"
    marker = externally_managed(d.location)
    uninstall_cmd = f"{pip} uninstall -y {'--break-system-packages ' if marker else ''}{d.name}"
    reinstall_cmd = reinstall_command(pkg)
    if image:
        reinstall_cmd = f"apt-get update && apt-get install -y --reinstall {pkg}"
    run = "RUN " if image else ""  # another system's root: its build changes it, not a command here
    needed = _who_requires(d, required())
    venv = f"python3 -m venv --system-site-packages {VENV} && {VENV}/bin/python -m pip install {d.name}=={d.version}"
    steps = (
        f"{run}{uninstall_cmd}",
        f"{run}{reinstall_cmd}",
        f"{run}{venv}" if needed else f"only if you need {d.name}: {run}{venv}",
    )
    by = f"; {needed[0].dist.label} requires {needed[0].text}" if needed else ""
    why = (
        f"uninstall {d.name} first (it deletes the shared files), then reinstall {pkg} (it puts its own back); "
        f"{d.name} belongs where dpkg owns nothing{by}"
    )
    return Finding(
        check="integrity",
        severity=severity,
        subject=f"{d.name} / {pkg}",
        distributions=(d.key,),
        message=f"{d.label} and dpkg's {pkg} install the same {_what_is_shared(states, libs)}; {whose}",
        cause=f"a pip install into a directory dpkg owns (--prefix=/usr, --target, --break-system-packages "
        f"--ignore-installed) or a .deb installed over a wheel's files: {breaks}",
        remedies=(Manual(steps, why=why),),
        facts=Facts(
            objects=tuple(s.path for s in sorted(states, key=lambda s: s.rel)),
            versions=((d.name, d.version),),
            found=",".join(sorted({o.whose for o in found})),
        ),
        where=(os.path.join(d.dist_info, "RECORD"), os.path.join(inv.dpkg_root, INFO_DIR, f"{package}.list")),
        details=tuple(_deb_detail(o, pkg) for o in sorted(found, key=lambda o: o.state.rel)[:8]),
    )


def _deb_detail(o: DebOverlap, pkg: str) -> str:
    """``yaml/__init__.py: 1234 bytes on disk = PyYAML 6.0.1's; md5 differs from dpkg's python3-yaml's``."""
    md5 = {True: f"md5 = dpkg's {pkg}'s", False: f"md5 differs from dpkg's {pkg}'s", None: f"no md5 of {pkg}'s"}
    return f"{o.state.describe()}; {md5[o.deb_bytes]}"


def integrity_findings(inventory: Inventory, reqs: Requirements) -> tuple[Finding, ...]:
    """Inventory problems (malformed dist-infos, one name installed twice), then ``check_integrity``'s, with
    verified fixes (``reqs``: the run's requirement facts)."""
    found = (*inventory.findings, *check_integrity(inventory, reqs=reqs))
    # an OS package's findings keep their package manager's remedy: no pip command repairs them
    owned = [f for f in found if any((d := inventory.get(k)) is not None and d.os_package for k in f.distributions)]
    return _where_pip_runs(verified_fixes(found, inventory, reqs=reqs, keep=owned), inventory)


def _where_pip_runs(findings: Sequence[Finding], inv: Inventory) -> tuple[Finding, ...]:
    """Each finding's pip remedies that pip must not run in its distributions' environment (PEP 668's
    externally managed one, an OS package's files) replaced by the step by hand
    (:func:`~pytest_cudastack.model.system.by_hand_instead`), as the repair plan replaces its steps."""
    out: list[Finding] = []
    for f in findings:
        dists = [d for k in f.distributions if (d := inv.get(k)) is not None]
        if not dists or not f.pip:
            out.append(f)
            continue
        prefix = install_prefix(dists[0].location)
        env = [d for d in inv.distributions if install_prefix(d.location) == prefix]
        marker = externally_managed_env(dists)
        remedies = [(by_hand_instead(r, env, marker) if isinstance(r, Pip) else None) or r for r in f.remedies]
        out.append(replace(f, remedies=tuple(dict.fromkeys(remedies))) if remedies != list(f.remedies) else f)
    return tuple(out)


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``integrity`` item: the stack's ``integrity`` (computed once; ``requires_wheel`` reads it too)."""
    return stack.integrity
