"""Are the installed distributions' files intact, and whose bytes are on disk?

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

Cost: sizes come from ``stat``; a file is hashed only when RECORD sizes cannot decide between owners (or
with ``verify_hashes=True``), and never outside its site directory.

Requirement markers are evaluated for the running interpreter, with the extras each distribution is asked
for (``cuda-toolkit[cublas]`` activates cuda-toolkit's ``extra == "cublas"`` requirements).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from pytest_cudastack._sysio import open_regular
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.wheels.inventory import (
    Distribution,
    Inventory,
    RecordEntry,
    install_prefix,
    is_shared_lib_path,
)
from pytest_cudastack.wheels.sitepaths import record_abspath

__all__ = [
    "Requirer",
    "active_requirements",
    "bytes_on_disk",
    "check_integrity",
    "exact_pin",
    "pip_command",
    "variant_sibling",
]

logger = logging.getLogger(__name__)

_PLACEHOLDER_VERSION = re.compile(r"^0\.0\.\d+\.dev\d+$")
_PLACEHOLDER_SUMMARY = re.compile(r"placeholder|fake package|dummy package|not the package", re.IGNORECASE)
# wheels whose -cu12 and -cu13 variants install into one directory (reference/cuda-facts.md §3a, LOCAL)
_VARIANT = re.compile(r"^nvidia-(cudnn|nccl|nvshmem|cusparselt)-cu(12|13)$")
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


@dataclass(frozen=True)
class Requirer:
    """``dist`` requires ``requirement`` (active for this interpreter and the extras asked of ``dist``)."""

    dist: Distribution
    requirement: Requirement

    @property
    def text(self) -> str:
        r = self.requirement
        extras = f"[{','.join(sorted(r.extras))}]" if r.extras else ""
        return f"{r.name}{extras}{r.specifier}"


def active_requirements(inv: Inventory) -> dict[str, list[Requirer]]:
    """Canonical name -> who requires it, following extras through the installed distributions."""
    parsed: dict[int, list[Requirement]] = {}
    for d in inv.distributions:
        reqs: list[Requirement] = []
        for text in d.requires:
            try:
                reqs.append(Requirement(text))
            except InvalidRequirement as e:
                logger.debug("%s: unparsable Requires-Dist %r: %s", d.label, text, e)
        parsed[id(d)] = reqs
    extras: dict[str, set[str]] = {d.key: set() for d in inv.distributions}
    active: dict[tuple[int, int], Requirer] = {}
    memo: dict[tuple[str, str], bool] = {}
    changed = True
    while changed:
        changed = False
        for d in inv.distributions:
            asked = extras.get(d.key, set())
            for i, req in enumerate(parsed[id(d)]):
                if (id(d), i) in active or not _marker_ok(req, asked, memo):
                    continue
                active[(id(d), i)] = Requirer(d, req)
                key = canonicalize_name(req.name)
                new = {canonicalize_name(e) for e in req.extras} - extras.setdefault(key, set())
                if new:
                    extras[key] |= new
                    changed = True
                changed = True
    out: dict[str, list[Requirer]] = {}
    for r in active.values():
        out.setdefault(canonicalize_name(r.requirement.name), []).append(r)
    return out


def _marker_ok(req: Requirement, extras: Iterable[str], memo: dict[tuple[str, str], bool]) -> bool:
    if req.marker is None:
        return True
    text = str(req.marker)
    for extra in ("", *sorted(extras)):
        key = (text, extra)
        if key not in memo:
            try:
                memo[key] = bool(req.marker.evaluate({"extra": extra}))
            except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
                memo[key] = False
        if memo[key]:
            return True
    return False


def pip_command(dist: Distribution) -> str:
    """``<prefix>/bin/python -m pip`` for a venv-style site directory, else ``pip``."""
    prefix = install_prefix(dist.location)
    if prefix != os.path.normpath(dist.location):
        py = os.path.join(prefix, "bin", "python")
        if os.path.exists(py):
            return f"{py} -m pip"
    return "pip"


# --------------------------------------------------------------------------------------------------------------
# bytes on disk


class _Disk:
    """Memoised stat and hashes; hashes only regular files inside a site directory."""

    def __init__(self, verify_hashes: bool) -> None:
        self.verify = verify_hashes
        self._size: dict[str, int | None] = {}
        self._hash: dict[tuple[str, str], str | None] = {}
        self.hashed: list[str] = []

    def size(self, path: str) -> int | None:
        if path not in self._size:
            try:
                st = os.stat(path)
                self._size[path] = st.st_size if stat.S_ISREG(st.st_mode) else None
            except OSError:
                self._size[path] = None
        return self._size[path]

    def digest(self, path: str, algorithm: str, site: str) -> str | None:
        """``algorithm=<urlsafe b64, no padding>``, None when not allowed or unreadable."""
        key = (path, algorithm)
        if key in self._hash:
            return self._hash[key]
        result: str | None = None
        # realpath, not normpath: a RECORD-listed symlink into another tree must not get that tree hashed
        site_n = os.path.realpath(site).rstrip(os.sep) + os.sep
        if os.path.realpath(path).startswith(site_n) and algorithm in hashlib.algorithms_available:
            try:
                fd, _st = open_regular(path)
            except ElfError:
                fd = -1
            if fd >= 0:
                try:
                    h = hashlib.new(algorithm)
                    while chunk := os.read(fd, 1 << 20):
                        h.update(chunk)
                    result = algorithm + "=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
                    self.hashed.append(path)
                except (OSError, TypeError, ValueError):  # TypeError: SHAKE's digest() needs a length
                    result = None
                finally:
                    os.close(fd)
        self._hash[key] = result
        return result

    def matches(self, path: str, entry: RecordEntry, site: str, need_hash: bool) -> bool | None:
        """Do the bytes on disk match this RECORD row? None: cannot tell."""
        size = self.size(path)
        if size is None:
            return False
        if entry.size is not None and entry.size != size:
            return False
        if not need_hash and entry.size is not None:
            return True
        if entry.hash is None:
            return None if entry.size is None else True
        algorithm = entry.hash.partition("=")[0]
        d = self.digest(path, algorithm, site)
        if d is None:
            return None
        return d == entry.hash


@dataclass(frozen=True)
class _Owned:
    dist: Distribution
    entry: RecordEntry


@dataclass(frozen=True)
class _PathState:
    path: str  # absolute
    rel: str  # as in the first owner's RECORD
    owners: tuple[_Owned, ...]
    size: int | None  # on disk, None when missing
    on_disk: tuple[Distribution, ...]  # owners whose RECORD matches the bytes on disk
    undecided: bool  # the bytes could not be attributed (no hash allowed/possible)

    @property
    def conflicting(self) -> bool:
        rows = {(o.entry.hash, o.entry.size) for o in self.owners}
        return len(rows) > 1

    def describe(self) -> str:
        if self.size is None:
            return f"{self.rel}: missing on disk"
        if self.on_disk:
            whose = " / ".join(d.label for d in self.on_disk)
            return f"{self.rel}: {self.size} bytes on disk = {whose}'s"
        if self.undecided:
            return f"{self.rel}: {self.size} bytes on disk, not attributable without a hash"
        return f"{self.rel}: {self.size} bytes on disk, matching no RECORD"


_StateFn = Callable[[str], _PathState]
_Required = Callable[[], "dict[str, list[Requirer]]"]  # who requires what, computed on the first call


def _attribute(path: str, owners: Sequence[_Owned], disk: _Disk) -> tuple[tuple[Distribution, ...], bool]:
    size = disk.size(path)
    if size is None:
        return (), False
    candidates = [o for o in owners if o.entry.size is None or o.entry.size == size]
    if not candidates:
        return (), False
    # size decides when every owner with this size lists the same hash (or there is only one)
    need_hash = (
        disk.verify or len({o.entry.hash for o in candidates}) > 1 or any(o.entry.size is None for o in candidates)
    )
    site = owners[0].dist.location
    matched: list[Distribution] = []
    undecided = False
    for o in candidates:
        m = disk.matches(path, o.entry, site, need_hash)
        if m is None:
            undecided = True
        elif m:
            matched.append(o.dist)
    return tuple(matched), undecided and not matched


def _inside_site(dist: Distribution, path: str) -> bool:
    site = os.path.normpath(dist.location).rstrip(os.sep) + os.sep
    return path.startswith(site)


def _in_dist_info(dist: Distribution, path: str) -> bool:
    return path == dist.dist_info or path.startswith(dist.dist_info.rstrip(os.sep) + os.sep)


# --------------------------------------------------------------------------------------------------------------
# findings


class _Listed:
    """Every path listed by some RECORD -> its owners (each distribution once, in inventory order, with its
    first row for the path), merged across spellings of one site directory: the absolute path is
    ``Distribution.abspath`` of the row. A plain row's absolute path is ``<site dir>/<path>`` unchanged, so
    it is looked up by that relative path in ``Distribution.plain_rows`` (shared with the owner lookups);
    only the few other rows (``..``, absolute, ``./``) are resolved."""

    def __init__(self, inv: Inventory) -> None:
        self.dists = inv.distributions
        self._prefix: list[str] = []
        self._odd: list[dict[str, tuple[int, RecordEntry]]] = []
        for d in self.dists:
            loc = os.path.normpath(d.location)
            self._prefix.append("" if loc == "." else ("/" if loc == "/" else loc + "/"))  # as record_abspath
            self._odd.append(_odd_rows(d))
        self._memo: dict[str, list[_Owned]] = {}
        self.shared = self._shared()  # listed by two or more distributions

    def _shared(self) -> list[str]:
        prefixes = set(self._prefix)
        if any(a != b and b.startswith(a) for a in prefixes for b in prefixes):
            # a site directory inside another: one path can be plain in two spellings
            return self._shared_by_abspath()
        shared: set[str] = set()
        groups: dict[str, list[Distribution]] = {}
        for d, prefix in zip(self.dists, self._prefix, strict=True):
            groups.setdefault(prefix, []).append(d)
        for prefix, dists in groups.items():
            seen: set[str] = set()
            for d in dists:
                rows = d.plain_rows
                if seen:
                    shared.update(prefix + rel for rel in rows.keys() & seen)
                seen.update(rows)
        for odd in self._odd:
            shared.update(full for full in odd if len(self.get(full)) > 1)
        return sorted(shared)

    def _shared_by_abspath(self) -> list[str]:
        seen: set[str] = set()
        shared: set[str] = set()
        for d, prefix, odd in zip(self.dists, self._prefix, self._odd, strict=True):
            own = {prefix + rel for rel in d.plain_rows}
            own.update(odd)
            shared |= own & seen
            seen |= own
        return sorted(shared)

    def get(self, path: str) -> list[_Owned]:
        got = self._memo.get(path)
        if got is None:
            got = []
            for d, prefix, odd in zip(self.dists, self._prefix, self._odd, strict=True):
                e = d.plain_rows.get(path[len(prefix) :]) if path.startswith(prefix) else None
                o = odd.get(path)
                if o is not None and (e is None or next(j for j, x in enumerate(d.records) if x is e) > o[0]):
                    e = o[1]  # a row that is not plain, listed before the plain one for the same path
                if e is not None:
                    got.append(_Owned(d, e))
            self._memo[path] = got
        return got


def _odd_rows(d: Distribution) -> dict[str, tuple[int, RecordEntry]]:
    """``d.abspath(e) -> (index, e)`` for the first row ``e`` of each path that is not plain (None ones left
    out)."""
    odd = set(d.nonplain_paths)
    out: dict[str, tuple[int, RecordEntry]] = {}
    if odd:
        for i, e in enumerate(d.records):
            if e.path in odd:
                full = record_abspath(d.location, e.path)
                if full is not None and full not in out:
                    out[full] = (i, e)
    return out


def bytes_on_disk(inv: Inventory, path: str) -> tuple[tuple[Distribution, ...], bool]:
    """Whose bytes are at ``path`` (absolute), decided as the overlap finding decides it: the distributions
    whose RECORD rows for it match the file, and whether the bytes could not be attributed (no hash to
    tell). ``((), False)`` when no RECORD lists the path or the file is gone."""
    owners = _Listed(inv).get(os.path.normpath(path))
    if not owners:
        return (), False
    return _attribute(os.path.normpath(path), owners, _Disk(False))


def check_integrity(inv: Inventory, *, verify_hashes: bool = False) -> tuple[Finding, ...]:
    """Integrity findings for an inventory (overlaps, broken pins, missing/altered libraries, placeholders).

    ``verify_hashes=True`` also hashes every existing RECORD-listed shared library whose size matches
    (slow on a CUDA venv: gigabytes); by default a matching size is taken as intact.
    """
    disk = _Disk(verify_hashes)
    memo: list[dict[str, list[Requirer]]] = []

    def required_by() -> dict[str, list[Requirer]]:
        """active_requirements(inv), computed when a finding first needs it (most runs find nothing)."""
        if not memo:
            memo.append(active_requirements(inv))
        return memo[0]

    by_path = _Listed(inv)
    states: dict[str, _PathState] = {}

    def state(path: str) -> _PathState:
        if path not in states:
            owners = by_path.get(path)
            on_disk, undecided = _attribute(path, owners, disk)
            states[path] = _PathState(path, owners[0].entry.path, tuple(owners), disk.size(path), on_disk, undecided)
        return states[path]

    findings: list[Finding] = []
    findings += _overlaps(inv, by_path, state, required_by)
    findings += _broken_pins(inv, state, required_by)
    findings += _missing_or_altered(inv, by_path, state, disk, required_by)
    findings += _placeholders(inv, required_by)
    if disk.hashed:
        logger.debug("integrity hashed %d file(s): %s", len(disk.hashed), disk.hashed[:5])
    return tuple(findings)


def _pinned_version(dist: Distribution, requirers: Sequence[Requirer]) -> str:
    for r in requirers:
        specs = list(r.requirement.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
            return specs[0].version
    return dist.version


def exact_pin(r: Requirer) -> str | None:
    """The version ``r`` pins with ``==`` (no wildcard), else None."""
    specs = list(r.requirement.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def _who_requires(dist: Distribution, required_by: dict[str, list[Requirer]]) -> list[Requirer]:
    return [r for r in required_by.get(dist.key, []) if r.dist is not dist]


def _keep_one(dists: Sequence[Distribution], required_by: dict[str, list[Requirer]]) -> tuple[str, str]:
    """(reason, fix) for distributions that install the same paths: keep the required one."""
    names = " and ".join(d.name for d in dists) if len(dists) == 2 else ", ".join(d.name for d in dists)
    head = f"{names} install the same paths; keep one"
    req = {d.key: _who_requires(d, required_by) for d in dists}
    required = [d for d in dists if req[d.key]]
    pip = pip_command(dists[0])
    if len(required) == 1:
        keep = required[0]
        drop = [d for d in dists if d is not keep]
        version = _pinned_version(keep, req[keep.key])
        why = "; ".join(f"{r.dist.label} requires {r.text}" for r in req[keep.key][:3])
        reason = f"{head}: {why}, nothing installed requires {', '.join(d.name for d in drop)}"
        fix = (
            f"{pip} uninstall -y {' '.join(d.name for d in drop)} && "
            f"{pip} install --force-reinstall --no-deps {keep.name}=={version}"
        )
        return reason, fix
    if not required:
        reason = f"{head}: nothing installed requires any of them"
        fix = (
            f"uninstall the one you do not use, then force-reinstall the other, e.g. "
            f"{pip} uninstall -y {dists[0].name} && "
            f"{pip} install --force-reinstall --no-deps {dists[-1].name}=={dists[-1].version}"
        )
        return reason, fix
    why = "; ".join(f"{r.dist.label} requires {r.text}" for d in required for r in req[d.key][:2])
    reason = f"{head}, but more than one is required ({why}): they cannot share one environment"
    fix = (
        "keep the one the package you run needs (force-reinstall it with --no-deps after uninstalling "
        "the other) and move the other's dependents to a separate environment"
    )
    return reason, fix


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
    by_path: _Listed,
    state: _StateFn,
    required_by: _Required,
) -> list[Finding]:
    groups: dict[tuple[int, ...], list[_PathState]] = {}
    order: dict[int, int] = {id(d): i for i, d in enumerate(inv.distributions)}
    for path in by_path.shared:
        owners = by_path.get(path)
        key = tuple(sorted(order[id(o.dist)] for o in owners))
        groups.setdefault(key, []).append(state(path))
    findings: list[Finding] = []
    for key, paths in sorted(groups.items()):
        dists = [inv.distributions[i] for i in key]
        conflicting = [s for s in paths if s.conflicting]
        libs = [s for s in paths if is_shared_lib_path(s.path)]
        if not conflicting and not libs:
            continue
        labels = " and ".join(d.label for d in dists) if len(dists) == 2 else ", ".join(d.label for d in dists)
        rels = sorted(s.rel for s in paths)
        where_dir = _common_dir(rels)
        under = f" under {where_dir}/" if where_dir else ""
        lib_rels = sorted(s.rel for s in libs)
        what = f"{len(paths)} file(s){under}"
        if lib_rels:
            what += f", {len(lib_rels)} of them shared libraries ({_summarise(lib_rels)})"
        # whose bytes are on disk
        winners: dict[str, list[str]] = {}
        for s in sorted(conflicting or paths, key=lambda s: s.rel):
            if s.size is None:
                winners.setdefault("missing", []).append(s.rel)
            elif s.on_disk:
                winners.setdefault(" / ".join(d.label for d in s.on_disk), []).append(s.rel)
            else:
                winners.setdefault("unknown", []).append(s.rel)
        on_disk_parts = []
        for who, rs in winners.items():
            if who == "missing":
                on_disk_parts.append(f"{len(rs)} are missing")
            elif who == "unknown":
                on_disk_parts.append(f"{len(rs)} match no RECORD")
            elif len(winners) == 1:
                on_disk_parts.append(f"the bytes on disk are {who}'s")
            else:
                on_disk_parts.append(f"{len(rs)} on disk are {who}'s ({_summarise(rs, 2)})")
        same_name = len({d.key for d in dists}) == 1
        if conflicting:
            severity = Severity.ERROR
            message = f"{labels} install the same {what}; " + "; ".join(on_disk_parts)
            if same_name:
                reason = (
                    f"two dist-info directories of {dists[0].name} list the same files: one is left over "
                    "from an interrupted install or uninstall"
                )
                fix = (
                    f"{pip_command(dists[0])} uninstall -y {dists[0].name} (repeat until none is left), then "
                    f"{pip_command(dists[0])} install --no-deps {dists[-1].name}=={dists[-1].version}"
                )
            else:
                reason, fix = _keep_one(dists, required_by())
            cause = (
                "pip installs one distribution's files over the other's without a warning, and uninstalling "
                f"either deletes files the other's RECORD still lists. {reason}"
            )
        else:
            severity = Severity.INFO
            message = f"{labels} list the same {what} with identical bytes"
            cause = "uninstalling either deletes the file the other still lists"
            fix = ""
        shown = sorted(conflicting or libs, key=lambda s: (not is_shared_lib_path(s.path), s.rel))
        details = tuple(s.describe() for s in shown[:8])
        if len(shown) > 8:
            details += (f"... and {len(shown) - 8} more",)
        findings.append(
            Finding(
                check="integrity",
                severity=severity,
                subject=" / ".join(d.name for d in dists),
                distributions=tuple(d.key for d in dists),
                message=message,
                cause=cause,
                fix=fix,
                where=tuple(os.path.join(d.dist_info, "RECORD") for d in dists),
                details=details,
            )
        )
    return findings


def _lib_name(dist_name: str) -> str:
    base = re.sub(r"-cu\d+$", "", canonicalize_name(dist_name))
    base = re.sub(r"^nvidia-", "", base)
    return _LIB_NAMES.get(base, base)


def _broken_pins(inv: Inventory, state: _StateFn, required: _Required) -> list[Finding]:
    findings: list[Finding] = []
    if not any(_foreign_on_disk(y, state) for y in inv.distributions):
        return findings  # no requirement can be broken: who requires what is not needed
    required_by = required()
    for key, requirers in required_by.items():
        y = inv.get(key)
        if y is None:
            continue
        foreign: dict[int, tuple[Distribution, list[_PathState]]] = {}
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
                        fix=fix,
                        where=(os.path.join(y.dist_info, "RECORD"), os.path.join(z.dist_info, "RECORD")),
                        details=tuple(s.describe() for s in states[:12]),
                    )
                )
    return findings


def _foreign_on_disk(y: Distribution, state: _StateFn) -> bool:
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
    by_path: _Listed,
    state: _StateFn,
    disk: _Disk,
    required: _Required,
) -> list[Finding]:
    findings: list[Finding] = []
    for d in inv.distributions:
        pip = pip_command(d)
        reinstall = f"{pip} install --force-reinstall --no-deps {d.name}=={d.version}"
        # ships nothing it claims?
        own_iter = (p for p in (d.abspath(e) for e in d.records) if p is not None and not _in_dist_info(d, p))
        first = next(own_iter, None)
        if first is not None and not os.path.lexists(first) and not any(os.path.lexists(p) for p in own_iter):
            own = [p for p in (d.abspath(e) for e in d.records) if p is not None and not _in_dist_info(d, p)]
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
            if not needed and wanted:
                # reinstalling it would put its bytes where the required variant's belong (an overlap)
                pin = next((v for r in wanted if (v := exact_pin(r)) is not None), None)
                version = f"=={pin}" if pin else ""
                fix = (
                    f"{pip} uninstall -y {d.name} && {pip} install --force-reinstall --no-deps {sibling}{version} "
                    f"({wanted[0].dist.label} requires {wanted[0].text}; nothing installed requires {d.name})"
                )
            else:
                fix = reinstall if needed else f"{reinstall} (or {pip} uninstall -y {d.name} if nothing needs it)"
            findings.append(
                Finding(
                    check="integrity",
                    severity=Severity.ERROR,
                    subject=d.label,
                    distributions=(d.key,),
                    message=(
                        f"{d.label} ships nothing it claims: all {len(own)} file(s) its RECORD lists are gone, "
                        "only its dist-info is left"
                    ),
                    cause=cause,
                    fix=fix,
                    where=(os.path.join(d.dist_info, "RECORD"),),
                    details=tuple(sorted(os.path.relpath(p, d.location) for p in own)[:8]),
                )
            )
            continue
        missing: list[str] = []
        altered: list[str] = []
        for lib in d.libraries:
            if lib.record is None:
                continue
            s = state(lib.path)
            if s.size is None:
                missing.append(s.rel)
                continue
            if any(x is d for x in s.on_disk) or s.undecided:
                continue
            if s.on_disk:
                continue  # another owner's bytes: reported as an overlap
            altered.append(s.describe() + f" (RECORD: {lib.record.size} bytes)")
        if missing:
            missing.sort()
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
            findings.append(
                Finding(
                    check="integrity",
                    severity=Severity.ERROR,
                    subject=d.label,
                    distributions=(d.key,),
                    message=message,
                    cause=cause,
                    fix=reinstall,
                    where=(os.path.join(d.dist_info, "RECORD"),),
                    details=tuple(f"{r}: missing on disk" for r in missing[:12]),
                )
            )
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
                    fix=reinstall,
                    where=(os.path.join(d.dist_info, "RECORD"),),
                    details=tuple(altered[:12]),
                )
            )
    return findings


def variant_sibling(name: str) -> str | None:
    """The other CUDA variant of a wheel whose -cu12 and -cu13 builds install the same paths
    (``nvidia-cudnn-cu12`` -> ``nvidia-cudnn-cu13``; reference/cuda-facts.md §3a), else None."""
    m = _VARIANT.match(canonicalize_name(name))
    if m is None:
        return None
    return f"nvidia-{m.group(1)}-cu{'12' if m.group(2) == '13' else '13'}"


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
            e for e in d.records if (p := d.abspath(e)) is not None and not _in_dist_info(d, p) and _inside_site(d, p)
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
                fix=f"{pip_command(d)} uninstall -y {d.name}, then install the real distribution "
                "(its summary or project page says from where)",
                where=(os.path.join(d.dist_info, "METADATA"),),
            )
        )
    return findings
