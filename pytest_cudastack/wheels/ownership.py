"""Whose bytes are on disk? The installed distributions' RECORD rows against the files they list.

Every path some RECORD lists maps to its owners (``Listed``: each distribution once, merged across spellings
of one site directory); the bytes at a path are attributed to the owners whose rows match it (``attribute``):
sizes come from ``stat``, and a file is hashed only when sizes cannot decide between owners (or with
``verify_hashes``), never outside its site directory. The integrity check turns these facts into findings;
``cudastack why`` and the shadow rule read ``bytes_on_disk``.

Also here: who requires what (``active_requirements``; markers evaluated for the inspected interpreter by
:mod:`pytest_cudastack.wheels.requirements`), the -cu12/-cu13 variants that install the same paths
(``variant_sibling``) and the environment's own pip (``pip_command``).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pytest_cudastack._sysio import open_span
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Pip
from pytest_cudastack.wheels.dpkg import INFO_DIR, listing_packages, md5sums
from pytest_cudastack.wheels.inventory import Distribution, Inventory, RecordEntry, install_prefix
from pytest_cudastack.wheels.requirements import Requirements, requirement_facts
from pytest_cudastack.wheels.sitepaths import record_abspath

__all__ = [
    "FORCE",
    "DebOverlap",
    "Disk",
    "Listed",
    "Owned",
    "PathState",
    "Requirer",
    "StateFn",
    "active_requirements",
    "attribute",
    "bytes_on_disk",
    "deb_overlaps",
    "exact_pin",
    "file_digest",
    "in_dist_info",
    "inside_site",
    "pip_command",
    "pip_python",
    "reinstall",
    "uninstall",
    "variant_sibling",
]

logger = logging.getLogger(__name__)

# wheels whose -cu12 and -cu13 variants install into one directory (reference/cuda-facts.md §3a, LOCAL)
_VARIANT = re.compile(r"^nvidia-(cudnn|nccl|nvshmem|cusparselt)-cu(12|13)$")


@dataclass(frozen=True)
class Requirer:
    """``dist`` requires ``requirement`` (active for the inspected interpreter and the extras asked of ``dist``)."""

    dist: Distribution
    requirement: Requirement

    @property
    def text(self) -> str:
        r = self.requirement
        extras = f"[{','.join(sorted(r.extras))}]" if r.extras else ""
        return f"{r.name}{extras}{r.specifier}"


def active_requirements(inv: Inventory, reqs: Requirements | None = None) -> dict[str, list[Requirer]]:
    """Canonical name -> who requires it: the requirement facts of ``inv`` (``reqs``, the run's; computed when
    not given) that a distribution states, with the extras other distributions request (an extra counted only
    by inference is left out: nothing asked for it). Markers are evaluated for the inspected interpreter, by
    the one evaluator (:func:`~pytest_cudastack.wheels.requirements.requirement_facts`)."""
    facts = reqs if reqs is not None else requirement_facts(inv)
    out: dict[str, list[Requirer]] = {}
    for f in facts.facts:
        if f.requirer is not None and not f.inferred:
            out.setdefault(f.name, []).append(Requirer(f.requirer, f.requirement))
    return out


def pip_python(dist: Distribution) -> str:
    """The interpreter of ``dist``'s environment (``<prefix>/bin/python`` for a venv-style site directory),
    "" when it has none of its own (then plain ``pip``)."""
    prefix = install_prefix(dist.location)
    if prefix != os.path.normpath(dist.location):
        py = os.path.join(prefix, "bin", "python")
        if os.path.exists(py):
            return py
    return ""


def pip_command(dist: Distribution) -> str:
    """``<prefix>/bin/python -m pip`` for a venv-style site directory, else ``pip``."""
    py = pip_python(dist)
    return f"{py} -m pip" if py else "pip"


def reinstall(dist: Distribution, version: str | None = None, why: str = "") -> Pip:
    """``pip install --force-reinstall --no-deps NAME==VERSION`` (default: its installed version) in its
    environment: pip writes the distribution's files again over whatever is there."""
    return Pip("install", (f"{dist.name}=={version or dist.version}",), pip_python(dist), FORCE, why=why)


def uninstall(dists: Sequence[Distribution], why: str = "") -> Pip:
    """``pip uninstall -y NAME...`` in the first one's environment."""
    return Pip("uninstall", tuple(d.name for d in dists), pip_python(dists[0]), ("-y",), why=why)


FORCE = ("--force-reinstall", "--no-deps")  # reinstall exactly these files, touching nothing else


def file_digest(path: str, h: Any) -> bytes | None:
    """The digest ``h`` (a fresh hashlib object) of the regular file at ``path``, None when it cannot be read;
    opened without blocking, so a FIFO named in a RECORD or md5sums never hangs the run."""
    try:
        span, _st = open_span(path)
    except ElfError:
        return None
    try:
        for chunk in span.chunks():
            h.update(chunk)
    except OSError:
        return None
    finally:
        span.close()
    digest: bytes = h.digest()
    return digest


class Disk:
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
                raw = file_digest(path, hashlib.new(algorithm))
            except (TypeError, ValueError):  # TypeError: SHAKE's digest() needs a length
                raw = None
            if raw is not None:
                result = algorithm + "=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
                self.hashed.append(path)
        self._hash[key] = result
        return result

    def md5(self, path: str) -> str | None:
        """md5 hex digest of the regular file at ``path`` (dpkg's md5sums record these), None when it cannot
        be read. Asked only of a file a ``.deb`` and a RECORD both list (:func:`deb_overlaps`)."""
        key = (path, "md5")
        if key not in self._hash:
            raw = file_digest(path, hashlib.md5(usedforsecurity=False))
            result = None if raw is None else raw.hex()
            if raw is not None:
                self.hashed.append(path)
            self._hash[key] = result
        return self._hash[key]

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
class Owned:
    dist: Distribution
    entry: RecordEntry


@dataclass(frozen=True)
class PathState:
    path: str  # absolute
    rel: str  # as in the first owner's RECORD
    owners: tuple[Owned, ...]
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


StateFn = Callable[[str], PathState]


def attribute(path: str, owners: Sequence[Owned], disk: Disk) -> tuple[tuple[Distribution, ...], bool]:
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


def inside_site(dist: Distribution, path: str) -> bool:
    site = os.path.normpath(dist.location).rstrip(os.sep) + os.sep
    return path.startswith(site)


def in_dist_info(dist: Distribution, path: str) -> bool:
    return path == dist.dist_info or path.startswith(dist.dist_info.rstrip(os.sep) + os.sep)


class Listed:
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
        self._memo: dict[str, list[Owned]] = {}
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

    def get(self, path: str) -> list[Owned]:
        got = self._memo.get(path)
        if got is None:
            got = []
            for d, prefix, odd in zip(self.dists, self._prefix, self._odd, strict=True):
                e = d.plain_rows.get(path[len(prefix) :]) if path.startswith(prefix) else None
                o = odd.get(path)
                if o is not None and (e is None or next(j for j, x in enumerate(d.records) if x is e) > o[0]):
                    e = o[1]  # a row that is not plain, listed before the plain one for the same path
                if e is not None:
                    got.append(Owned(d, e))
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
    owners = Listed(inv).get(os.path.normpath(path))
    if not owners:
        return (), False
    return attribute(os.path.normpath(path), owners, Disk(False))


@dataclass(frozen=True)
class DebOverlap:
    """A path a wheel's RECORD and a ``.deb``'s file list both name: the wheels' side (``state``: its RECORD
    rows and which of them the bytes match), dpkg's ``package``, the ``md5`` its md5sums record (None: none)
    and ``deb_bytes``: whether the file's md5 is that one (None: no record, or no readable file)."""

    state: PathState
    package: str
    md5: str | None
    deb_bytes: bool | None

    @property
    def whose(self) -> str:
        """``wheel`` (the bytes are a RECORD's and not dpkg's), ``deb``, ``both`` (identical bytes),
        ``neither``, ``missing`` or ``unknown`` (what cannot be decided: no record, no hash allowed)."""
        s = self.state
        if s.size is None:
            return "missing"
        if s.on_disk and self.deb_bytes:
            return "both"
        if s.on_disk:  # dpkg's md5 differs, or it records none (a conffile): the RECORD's bytes are there
            return "wheel"
        if self.deb_bytes and not s.on_disk:  # dpkg's md5 matches; a RECORD row without a hash cannot object
            return "deb"
        if self.deb_bytes is False and not s.on_disk and not s.undecided:
            return "neither"
        return "unknown"


def _dpkg_may_list(d: Distribution) -> bool:
    """Can a ``.deb`` list ``d``'s files? Not an OS package's own distribution (its md5sums judge it), nor one
    in a virtual environment (dpkg installs nothing into one)."""
    if d.os_package is not None:
        return False
    prefix = install_prefix(d.location)
    return prefix == os.path.normpath(d.location) or not os.path.isfile(os.path.join(prefix, "pyvenv.cfg"))


def _recorded(sums: Mapping[str, str], path: str) -> str | None:
    """The md5 ``sums`` (a package's md5sums) record for ``path``, by its spelling or its real path (a
    merged-/usr system's md5sums may name ``lib/x`` for the file at ``usr/lib/x``)."""
    real = os.path.realpath(path)
    found = sums.get(path) or sums.get(real)
    if found is None:
        name = os.path.basename(path)
        found = next((v for p, v in sums.items() if os.path.basename(p) == name and os.path.realpath(p) == real), None)
    return found


def deb_overlaps(inv: Inventory, by_path: Listed, state: StateFn, disk: Disk) -> list[DebOverlap]:
    """Every path that a wheel's RECORD (a distribution no OS package owns, outside a virtual environment)
    and a ``.list`` of the inventory's dpkg database (:attr:`Inventory.dpkg_root`) both name, with whose bytes
    are on disk: the RECORD rows' verdict (:func:`attribute`, the wheels' overlap's, hashed here when dpkg's
    md5 also matches, to tell identical bytes from dpkg's) beside the file's md5 against dpkg's md5sums
    (``pip install --prefix=/usr`` or ``--break-system-packages --ignore-installed`` over ``python3-*``'s
    files, a wheel unpacked over a CUDA ``.deb``'s library)."""
    dists = [d for d in inv.distributions if _dpkg_may_list(d)]
    if not dists or not os.path.isdir(os.path.join(inv.dpkg_root, INFO_DIR)):
        return []
    paths = {p for d in dists for e in d.records if (p := d.abspath(e)) is not None and not in_dist_info(d, p)}
    listed = listing_packages(sorted(paths), inv.dpkg_root)
    sums: dict[str, Mapping[str, str] | None] = {}
    out: list[DebOverlap] = []
    for path, package in sorted(listed.items()):
        s = state(path)
        wheels = tuple(o for o in s.owners if o.dist.os_package is None)  # an OS package's RECORD is not its record
        if not wheels:
            continue
        if len(wheels) < len(s.owners):
            on_disk, undecided = attribute(path, wheels, disk)
            s = replace(s, owners=wheels, on_disk=on_disk, undecided=undecided)
        if package not in sums:
            sums[package] = md5sums(package, inv.dpkg_root)
        recorded = _recorded(sums[package] or {}, path)
        got = disk.md5(path) if recorded is not None and s.size is not None else None
        deb_bytes = None if got is None else got == recorded
        if deb_bytes and s.on_disk:  # the size agreed: only a hash tells the RECORD's bytes from dpkg's
            verdicts = [(o.dist, disk.matches(path, o.entry, o.dist.location, True)) for o in s.owners]
            same = tuple(d for d, m in verdicts if m)
            s = replace(s, on_disk=same, undecided=not same and any(m is None for _d, m in verdicts))
        out.append(DebOverlap(s, package, recorded, deb_bytes))
    return out


def exact_pin(r: Requirer) -> str | None:
    """The version ``r`` pins with ``==`` (no wildcard), else None."""
    specs = list(r.requirement.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def variant_sibling(name: str) -> str | None:
    """The other CUDA variant of a wheel whose -cu12 and -cu13 builds install the same paths
    (``nvidia-cudnn-cu12`` -> ``nvidia-cudnn-cu13``; reference/cuda-facts.md §3a), else None."""
    m = _VARIANT.match(canonicalize_name(name))
    if m is None:
        return None
    return f"nvidia-{m.group(1)}-cu{'12' if m.group(2) == '13' else '13'}"
