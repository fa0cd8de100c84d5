"""Which distributions are installed, what each ships, for which CUDA major.

The inventory reads ``*.dist-info`` directories directly (METADATA with the email parser, RECORD with the csv
module): it is what pip itself trusts, it needs no import of the inspected packages and it is faster than
``importlib.metadata`` for thousands of RECORD rows. Shared libraries a RECORD lists (``*.so`` / ``*.so.*``)
are stat'ed and their SONAME read through the ELF cache; nothing is hashed here (integrity.py decides when a
hash is needed).

RECORD paths: relative paths are resolved against the site directory. Paths that leave it (``..``, such as
the ``../../../bin/torchrun`` script entries every venv has, or absolute paths) are kept as records and may be
``stat``-ed when they stay inside the installation prefix (the directory holding ``lib/pythonX.Y/``), but they
are never read or hashed. Paths outside the prefix are ignored and reported as an inventory warning.

Cost: RECORD rows are the bulk (torch alone lists ~22k files). Well-formed rows skip the per-field checks,
``Inventory.owner(s)`` builds its path map on the first lookup, keyed by the RECORD path as written (a plain
relative path needs no normalisation; only the few ``..``/absolute ones are resolved), and heavy modules
(csv, email, glob, site, findings) are imported where used. :class:`OwnerIndex` answers the same owner
question from RECORD and METADATA alone (no ELF reads, no flavour rules): it is what ``cudastack tree``
uses for its provider column.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_cudastack.errors import CudaStackError

if TYPE_CHECKING:
    from pytest_cudastack.elf import ElfInfo
    from pytest_cudastack.findings import Finding

__all__ = [
    "Distribution",
    "Inventory",
    "OwnerIndex",
    "RecordEntry",
    "ShippedLib",
    "canonical_name",
    "default_reader",
    "install_prefix",
    "installed_wheels",
    "is_shared_lib_path",
    "memo_reader",
    "owner_index",
    "record_abspath",
    "site_dirs",
]

logger = logging.getLogger(__name__)

Reader = Callable[[str], "ElfInfo"]

_SO_RE = re.compile(r"\.so(\.[0-9A-Za-z_]+)*$")
_NAME_RE = re.compile(r"[-_.]+")


def canonical_name(name: str) -> str:
    """PEP 503 normalised name: ``Nvidia_CUDNN.cu12`` -> ``nvidia-cudnn-cu12``."""
    return _NAME_RE.sub("-", name).lower()


def is_shared_lib_path(path: str) -> bool:
    """True for ``*.so`` / ``*.so.<ver>`` names (``libcudnn.so.9``, ``_C.cpython-311-x86_64-linux-gnu.so``)."""
    return ".so" in path and bool(_SO_RE.search(os.path.basename(path)))


@dataclass(frozen=True)
class RecordEntry:
    """One RECORD row: the path as written, ``"sha256=<urlsafe-b64>"`` (None when empty), size in bytes."""

    path: str
    hash: str | None
    size: int | None


@dataclass(frozen=True)
class ShippedLib:
    """A shared library a distribution's RECORD lists, as found on disk."""

    path: str  # absolute, normalised
    soname: str | None  # DT_SONAME, None when absent, unreadable or the file is missing
    exists: bool
    size: int | None = None  # st_size on disk, None when missing
    pyinit: str | None = None  # "PyInit_<mod>" when the file is a Python extension module
    record: RecordEntry | None = None  # the RECORD row that lists it
    problem: str | None = None  # why the ELF facts are absent ("not an ELF file: ...")


@dataclass(frozen=True)
class Distribution:
    """An installed distribution (one ``*.dist-info`` directory)."""

    name: str
    version: str
    location: str  # site directory holding the dist-info
    dist_info: str  # absolute path of the dist-info directory
    records: tuple[RecordEntry, ...] = field(repr=False)
    libraries: tuple[ShippedLib, ...]
    requires: tuple[str, ...]  # Requires-Dist, verbatim (markers included)
    cuda_major: int | None
    cuda_evidence: str
    problems: tuple[str, ...]
    summary: str = field(default="", repr=False)

    @property
    def key(self) -> str:
        """Canonical (PEP 503) name."""
        return canonical_name(self.name)

    @property
    def label(self) -> str:
        """``"name version"`` as owners are named everywhere."""
        return f"{self.name} {self.version}"

    def abspath(self, entry: RecordEntry) -> str | None:
        """Absolute path of a RECORD entry, None when it points outside the installation prefix."""
        return record_abspath(self.location, entry.path)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "location": self.location,
            "dist_info": self.dist_info,
            "cuda_major": self.cuda_major,
            "cuda_evidence": self.cuda_evidence,
            "requires": list(self.requires),
            "records": len(self.records),
            "libraries": [
                {"path": lib.path, "soname": lib.soname, "exists": lib.exists, "pyinit": lib.pyinit}
                for lib in self.libraries
            ],
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class Inventory:
    """Every distribution visible from ``site_dirs``, in search order, and what reading them found."""

    distributions: tuple[Distribution, ...]
    site_dirs: tuple[str, ...]
    findings: tuple[Finding, ...]
    _owners: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    _by_name: dict[str, Distribution] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    _by_soname: dict[str, list[tuple[Distribution, str]]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        for dist in self.distributions:
            self._by_name.setdefault(dist.key, dist)
            for lib in dist.libraries:
                names = {os.path.basename(lib.path)}
                if lib.soname:
                    names.add(lib.soname)
                for n in names:
                    self._by_soname.setdefault(n, []).append((dist, lib.path))

    def _owner_maps(
        self,
    ) -> tuple[list[tuple[tuple[str, ...], dict[str, int], dict[str, list[int]]]], dict[str, list[int]]]:
        """Built on the first lookup: per site directory, RECORD paths as written -> the first distribution
        index (and every index, for paths more than one RECORD lists); a plain path resolves to
        ``<root>/<path>`` unchanged, so it needs no normalisation. Absolute paths for the few that are not
        plain (``..``, absolute, ``./``)."""
        if "maps" not in self._owners:
            by_loc: dict[str, tuple[tuple[str, ...], dict[str, list[int]]]] = {}
            firsts: dict[str, dict[str, int]] = {}
            special: dict[str, list[int]] = {}
            for i, dist in enumerate(self.distributions):
                loc = dist.location
                if loc not in by_loc:
                    roots = tuple(dict.fromkeys((os.path.normpath(loc), os.path.realpath(loc))))
                    by_loc[loc] = (roots, {})
                    firsts[loc] = {}
                roots, multi = by_loc[loc]
                first = firsts[loc]
                paths = [e.path for e in dist.records]
                odd = _nonplain(paths)
                plain = dict.fromkeys(paths, i)
                for x in odd:
                    if plain.pop(x, None) is None:
                        continue  # a marked line that is not one of this RECORD's paths
                    for root in roots:
                        full = record_abspath(root, x)
                        if full is not None:
                            hit = special.setdefault(full, [])
                            if not hit or hit[-1] != i:
                                hit.append(i)
                for x in plain.keys() & first.keys():  # listed by an earlier distribution too
                    multi.setdefault(x, [first[x]]).append(i)
                plain.update(first)  # the earlier distribution stays first
                firsts[loc] = plain
            self._owners["maps"] = ([(r, firsts[loc], m) for loc, (r, m) in by_loc.items()], special)
        maps: tuple[list[tuple[tuple[str, ...], dict[str, int], dict[str, list[int]]]], dict[str, list[int]]] = (
            self._owners["maps"]
        )
        return maps

    def _owner_indexes(self, p: str) -> list[int]:
        plain_maps, special = self._owner_maps()
        found = set(special.get(p, ()))
        for roots, first, multi in plain_maps:
            for root in roots:
                prefix = root if root.endswith("/") else root + "/"
                if p.startswith(prefix):
                    rel = p[len(prefix) :]
                    if rel in multi:
                        found.update(multi[rel])
                    elif rel in first:
                        found.add(first[rel])
        return sorted(found)

    def owners(self, path: str) -> tuple[Distribution, ...]:
        """Every distribution whose RECORD lists ``path`` (absolute; normalised and realpath'ed here)."""
        p = os.path.normpath(os.path.abspath(path))
        found = self._owner_indexes(p)
        if not found:
            real = os.path.realpath(p)
            if real != p:
                found = self._owner_indexes(real)
        return tuple(self.distributions[i] for i in found)

    def owner(self, path: str) -> str | None:
        """``"name version"`` of the (first) distribution whose RECORD lists ``path``, else None."""
        found = self.owners(path)
        return found[0].label if found else None

    def get(self, name: str) -> Distribution | None:
        """The distribution named ``name`` (any spelling) that comes first in search order."""
        return self._by_name.get(canonical_name(name))

    def all_named(self, name: str) -> tuple[Distribution, ...]:
        """Every distribution with this name (more than one is itself a finding)."""
        key = canonical_name(name)
        return tuple(d for d in self.distributions if d.key == key)

    def shipping(self, soname: str) -> tuple[tuple[Distribution, str], ...]:
        """``(distribution, absolute path)`` for every RECORD-listed library with this SONAME or file name,
        whether or not the file is still on disk."""
        return tuple(self._by_soname.get(soname, ()))

    def to_json(self) -> dict[str, Any]:
        return {
            "site_dirs": list(self.site_dirs),
            "distributions": [d.to_json() for d in self.distributions],
            "findings": [f.to_json() for f in self.findings],
        }


# ----------------------------------------------------------------------------------------------------
# paths


@functools.lru_cache(maxsize=256)
def install_prefix(location: str) -> str:
    """The installation prefix of a site directory: ``P`` for ``P/lib/python3.11/site-packages``, else the
    site directory itself."""
    loc = os.path.normpath(location)
    parts = loc.split(os.sep)
    if (
        len(parts) >= 4
        and parts[-1] in ("site-packages", "dist-packages")
        and parts[-2].startswith("python")
        and parts[-3] in ("lib", "lib64", "lib32", "libx32")
    ):
        return os.sep.join(parts[:-3]) or os.sep
    return loc


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=256)
def _norm_location(location: str) -> str:
    return os.path.normpath(location)


def record_abspath(location: str, path: str) -> str | None:
    """Resolve a RECORD path against its site directory; None when the result leaves the install prefix."""
    if not path or "\x00" in path:
        return None
    loc = _norm_location(location)
    if (
        path[0] != "/"
        and ".." not in path
        and "//" not in path
        and "/./" not in path
        and not path.startswith("./")
        and not path.endswith(("/.", "/"))
    ):
        return path if loc == "." else (loc + path if loc == "/" else f"{loc}/{path}")  # fast path
    full = os.path.normpath(os.path.join(loc, path))
    if _within(full, loc) or _within(full, install_prefix(location)):
        return full
    return None


def _pth_dirs(site_dir: str) -> list[str]:
    """Directories a site dir's ``.pth`` files add (``import`` lines are never executed)."""
    out: list[str] = []
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth"))
    except OSError:
        return out
    for n in names:
        text = _read_text(os.path.join(site_dir, n))
        if text is None:
            continue
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
                continue
            d = os.path.normpath(os.path.join(site_dir, line))
            if os.path.isdir(d):
                out.append(d)
    return out


def _expand_prefix(path: str) -> list[str]:
    import glob

    found = sorted(glob.glob(os.path.join(glob.escape(path), "lib*", "python3*", "site-packages")))
    if not found:
        return [path]
    if os.path.exists(os.path.join(path, "pyvenv.cfg")) or not _dist_info_dirs(path):
        return found
    return [path]


def _twins(path: str) -> list[str]:
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    if len(parts) >= 4 and parts[-1] == "site-packages" and parts[-3] in ("lib", "lib64"):
        twin = [*parts[:-3], "lib64" if parts[-3] == "lib" else "lib", *parts[-2:]]
        return [os.sep.join(twin)]
    return []


def site_dirs(paths: Sequence[str] | None = None) -> tuple[str, ...]:
    """Directories to look in, in search order, without duplicates (by realpath).

    ``paths=None``: every directory on this interpreter's ``sys.path`` (which already holds ``.pth``-added
    paths and the user site), plus ``site.getsitepackages()`` and the user site. Explicit ``paths``: those,
    each followed by its ``lib``/``lib64`` twin (``P/lib64/python3.11/site-packages`` for
    ``P/lib/python3.11/site-packages``, when it is another directory) and the directories its ``.pth``
    files add. A path that is an environment prefix (``pyvenv.cfg`` or ``lib/python3*/site-packages`` in it,
    no dist-info of its own) stands for its site directories.
    """
    candidates: list[str] = []
    if paths is None:
        import site

        candidates.extend(p or os.getcwd() for p in sys.path)
        with contextlib.suppress(AttributeError):  # old virtualenv site.py lacks it
            candidates.extend(site.getsitepackages())
        user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
        if isinstance(user, str):
            candidates.append(user)
    else:
        for given in paths:
            for p in _expand_prefix(given):
                for q in (p, *_twins(p)):
                    candidates.append(q)
                    candidates.extend(_pth_dirs(q))
    seen: set[str] = set()
    out: list[str] = []
    for c in candidates:
        a = os.path.normpath(os.path.abspath(c))
        if not os.path.isdir(a):
            continue
        r = os.path.realpath(a)
        if r in seen:
            continue
        seen.add(r)
        out.append(a)
    return tuple(out)


# ----------------------------------------------------------------------------------------------------
# reading


def default_reader() -> Reader:
    """The core's cached ELF reader (``elfcache.default_cache().read``), else ``elf.read_elf``."""
    try:
        elfcache = importlib.import_module("pytest_cudastack.elfcache")
    except ImportError:  # pragma: no cover - depends on the core's progress
        from pytest_cudastack.elf import read_elf

        return read_elf
    reader: Reader = elfcache.default_cache().read
    return reader


def memo_reader(reader: Reader) -> Reader:
    """``reader`` memoised by path for one run (shares parsed ELF facts between the inventory and the
    resolver even when the on-disk cache is off); errors are memoised too."""
    memo: dict[str, ElfInfo | CudaStackError | OSError] = {}

    def read(path: str) -> ElfInfo:
        got = memo.get(path)
        if got is None:
            try:
                got = reader(path)
            except (CudaStackError, OSError) as e:
                got = e
            memo[path] = got
        if isinstance(got, (CudaStackError, OSError)):
            raise got
        return got

    return read


def _read_text(path: str, limit: int = 64 << 20) -> str | None:
    """Text of a regular file, None when missing/unreadable/not regular (never blocks on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        total = 0
        while total < limit:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
            total += len(b)
        return b"".join(chunks).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _parse_record(text: str) -> tuple[list[RecordEntry], list[str]]:
    import csv

    entries: list[RecordEntry] = []
    problems: list[str] = []
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as e:
        return entries, [f"RECORD is not valid CSV: {e}"]
    for lineno, row in enumerate(rows, 1):
        if len(row) == 3:  # the well-formed row, decided without the checks below (same result)
            path, digest, size_s = row
            if (
                path.strip()
                and (not digest or ("=" in digest and digest == digest.strip()))
                and (not size_s or (size_s.isascii() and size_s.isdigit()))
            ):
                entries.append(RecordEntry(path, digest or None, int(size_s) if size_s else None))
                continue
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != 3:
            problems.append(f"RECORD line {lineno}: expected 3 fields (path,hash,size), got {len(row)}")
            if not row[0]:
                continue
            row = [*row, "", ""][:3]
        path, digest, size_s = row
        if not path:
            problems.append(f"RECORD line {lineno}: empty path")
            continue
        size: int | None = None
        if size_s.strip():
            try:
                size = int(size_s)
                if size < 0:
                    raise ValueError(size_s)
            except ValueError:
                problems.append(f"RECORD line {lineno}: size {size_s!r} is not a byte count ({path})")
                size = None
        h = digest.strip() or None
        if h is not None and "=" not in h:
            problems.append(f"RECORD line {lineno}: hash {h!r} is not '<algorithm>=<digest>' ({path})")
            h = None
        entries.append(RecordEntry(path, h, size))
    return entries, problems


def _name_version_from_dirname(dirname: str) -> tuple[str, str]:
    stem = dirname[: -len(".dist-info")]
    name, sep, version = stem.partition("-")
    return name, version if sep else ""


def _flavour(name: str, version: str, requires: Sequence[str], paths: Sequence[str]) -> tuple[int | None, str]:
    try:
        compat = importlib.import_module("pytest_cudastack.compat")
    except ImportError:  # pragma: no cover - depends on the driver engineer's progress
        return None, "compat rules unavailable"
    try:
        major, evidence = compat.wheel_cuda_flavour(name, version, tuple(requires), tuple(paths))
    except CudaStackError as e:
        return None, f"flavour rules failed: {e}"
    return (major if isinstance(major, int) else None), str(evidence)


def _shipped_lib(location: str, entry: RecordEntry, reader: Reader) -> ShippedLib | None:
    path = record_abspath(location, entry.path)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return ShippedLib(path, None, False, record=entry)
    import stat

    if not stat.S_ISREG(st.st_mode):
        return ShippedLib(path, None, True, st.st_size, record=entry, problem="not a regular file")
    try:
        info = reader(path)
    except (CudaStackError, OSError) as e:
        return ShippedLib(path, None, True, st.st_size, record=entry, problem=str(e))
    return ShippedLib(path, info.soname, True, st.st_size, info.pyinit, entry)


def read_distribution(location: str, dirname: str, reader: Reader) -> Distribution:
    """One ``*.dist-info`` directory; never raises for malformed content (problems are recorded)."""
    dist_info = os.path.join(location, dirname)
    problems: list[str] = []
    fallback_name, fallback_version = _name_version_from_dirname(dirname)
    name, version, summary = fallback_name, fallback_version, ""
    requires: list[str] = []
    meta_text = _read_text(os.path.join(dist_info, "METADATA"))
    if meta_text is None:
        problems.append(f"no readable METADATA in {dirname}; name and version taken from the directory name")
    else:
        import email.parser
        import email.policy

        msg = email.parser.Parser(policy=email.policy.compat32).parsestr(meta_text, headersonly=True)
        name = str(msg.get("Name") or "").strip() or fallback_name
        version = str(msg.get("Version") or "").strip() or fallback_version
        summary = str(msg.get("Summary") or "").strip()
        requires = [str(r).strip() for r in msg.get_all("Requires-Dist") or () if str(r).strip()]
        if not msg.get("Name") or not msg.get("Version"):
            problems.append(f"METADATA of {dirname} lacks Name or Version")
    records: list[RecordEntry] = []
    record_text = _read_text(os.path.join(dist_info, "RECORD"))
    if record_text is None:
        problems.append(f"no readable RECORD in {dirname}; its files cannot be checked")
    else:
        records, rec_problems = _parse_record(record_text)
        problems.extend(rec_problems)
    outside = [
        e.path
        for e in records
        if ("\x00" in e.path or not _is_plain_record_path(e.path)) and record_abspath(location, e.path) is None
    ]
    if outside:
        shown = ", ".join(outside[:3]) + (f" and {len(outside) - 3} more" if len(outside) > 3 else "")
        problems.append(f"RECORD lists {len(outside)} path(s) outside the install prefix, ignored: {shown}")
    libraries = tuple(
        lib
        for lib in (_shipped_lib(location, e, reader) for e in records if is_shared_lib_path(e.path))
        if lib is not None
    )
    cuda_major, evidence = _flavour(name, version, requires, [e.path for e in records])
    return Distribution(
        name=name,
        version=version,
        location=location,
        dist_info=dist_info,
        records=tuple(records),
        libraries=libraries,
        requires=tuple(requires),
        cuda_major=cuda_major,
        cuda_evidence=evidence,
        problems=tuple(problems),
        summary=summary,
    )


def _dist_info_dirs(location: str) -> list[str]:
    try:
        names = os.listdir(location)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(".dist-info") and os.path.isdir(os.path.join(location, n)))


def _inventory_findings(dists: Iterable[Distribution]) -> list[Finding]:
    from pytest_cudastack.findings import Finding, Severity  # lazy: the owners-only path never needs it

    findings: list[Finding] = []
    by_name: dict[str, list[Distribution]] = {}
    for d in dists:
        by_name.setdefault(d.key, []).append(d)
        for p in d.problems:
            findings.append(
                Finding(
                    check="inventory",
                    severity=Severity.WARNING,
                    subject=d.label,
                    message=p,
                    cause="the dist-info directory is malformed or was edited by hand",
                    fix=f"pip install --force-reinstall --no-deps {d.name}=={d.version}" if d.version else "",
                    where=(d.dist_info,),
                )
            )
    for dups in by_name.values():
        if len(dups) < 2:
            continue
        first = dups[0]
        same_dir = len({os.path.realpath(d.location) for d in dups}) < len(dups)
        listing = "; ".join(f"{d.version} in {d.dist_info}" for d in dups)
        if same_dir:
            cause = (
                "two dist-info directories for one name in one site directory: one is left over from an "
                "interrupted install or uninstall, and tools pick either"
            )
            fix = (
                f"pip uninstall {first.name} (repeat until none is left), then "
                f"pip install {first.name}=={first.version}"
            )
        else:
            cause = (
                f"the first on the search path ({first.version} in {first.location}) is the one imported; "
                "the others are shadowed"
            )
            fix = f"uninstall the copies you do not mean to use (pip uninstall {first.name} there)"
        findings.append(
            Finding(
                check="inventory",
                severity=Severity.WARNING,
                subject=first.name,
                message=f"{first.name} is installed {len(dups)} times: {listing}",
                cause=cause,
                fix=fix,
                where=tuple(d.dist_info for d in dups),
            )
        )
    return findings


def installed_wheels(paths: Sequence[str] | None = None, reader: Reader | None = None) -> Inventory:
    """Every distribution in ``paths`` (default: this interpreter's site directories), in search order.

    ``reader`` returns ElfInfo for a path (default: :func:`default_reader`); it is called only for
    RECORD-listed ``*.so`` / ``*.so.*`` files that exist.
    """
    rd = reader if reader is not None else default_reader()
    dirs = site_dirs(paths)
    dists: list[Distribution] = []
    for loc in dirs:
        for dirname in _dist_info_dirs(loc):
            try:
                dists.append(read_distribution(loc, dirname, rd))
            except (OSError, UnicodeError, ValueError) as e:  # belt and braces: never crash on a dist-info
                logger.debug("cannot read %s/%s: %s", loc, dirname, e)
                name, version = _name_version_from_dirname(dirname)
                dists.append(
                    Distribution(
                        name=name,
                        version=version,
                        location=loc,
                        dist_info=os.path.join(loc, dirname),
                        records=(),
                        libraries=(),
                        requires=(),
                        cuda_major=None,
                        cuda_evidence="",
                        problems=(f"unreadable dist-info {dirname}: {e}",),
                    )
                )
    return Inventory(tuple(dists), dirs, tuple(_inventory_findings(dists)))


# ----------------------------------------------------------------------------------------------------
# owners only


def _meta_name_version(text: str) -> tuple[str, str]:
    """First ``Name:`` and ``Version:`` header values (stripped; "" when absent) of a METADATA text, with
    plain string operations (what the email parser gives for these one-line headers)."""
    name: str | None = None
    version: str | None = None
    for line in text.splitlines():
        if not line:
            break  # end of the header block
        head = line[:8].lower()
        if name is None and head.startswith("name:"):
            name = line[5:].strip()
        elif version is None and head == "version:":
            version = line[8:].strip()
        if name is not None and version is not None:
            break
    return name or "", version or ""


def _nonplain(paths: list[str]) -> list[str]:
    """The paths that are not plain (see :func:`_is_plain_record_path`): a cheap inline screen first (a
    superset: a leading ``/`` or ``.``, ``..``, ``//``, ``/.``, a trailing ``/``, NUL), the exact test only on
    what it lets through. Most RECORD paths fail the screen's every test."""
    return [
        x
        for x in paths
        if (not x or x[0] in "/." or ".." in x or "//" in x or "/." in x or x[-1] == "/" or "\x00" in x)
        and not _is_plain_record_path(x)
    ]


def _is_plain_record_path(path: str) -> bool:
    """record_abspath's fast-path condition: the path resolves to ``<site dir>/<path>`` unchanged."""
    return not (
        not path
        or "\x00" in path
        or path.startswith(("/", "./"))
        or ".." in path
        or "//" in path
        or "/./" in path
        or path.endswith(("/.", "/"))
    )


def _record_paths(text: str) -> tuple[list[str], list[str]]:
    """(every path of a RECORD text, the subset that is not plain), as _parse_record reads them."""
    if '"' in text:  # quoted fields: the csv module decides, exactly as the full inventory reads them
        entries, _problems = _parse_record(text)
        paths = [e.path for e in entries]
        return paths, _nonplain(paths)
    # a row is kept when its path is not empty and not every field is blank (see _parse_record)
    paths = [
        x
        for line in text.splitlines()
        if (x := line.partition(",")[0]) and (x.strip() or line.replace(",", "").strip())
    ]
    return paths, _nonplain(paths)


class OwnerIndex:
    """``path -> "name version"`` from RECORD files alone, for the provider column of ``cudastack tree``.

    Reads each dist-info's RECORD (plain string operations) and the Name/Version lines of its METADATA, but no
    ELF file and no flavour rule, so it costs a fraction of :func:`installed_wheels`. ``owner`` agrees with
    :meth:`Inventory.owner` for the same directories: the first distribution (in search order) whose RECORD
    lists the path, looked up normalised, then realpath'ed. Built on the first lookup.
    """

    def __init__(self, dirs: Sequence[str]) -> None:
        self.site_dirs = tuple(dirs)
        self._plain: list[tuple[tuple[str, ...], dict[str, tuple[int, str]]]] | None = None
        self._special: dict[str, tuple[int, str]] = {}

    def stamp(self) -> list[Any]:
        """What the answers depend on: the directories, their dist-info names and the (inode, size, mtime)
        of each RECORD and METADATA (a cached answer is valid while the stamp is equal)."""
        out: list[Any] = []
        for loc in self.site_dirs:
            row: list[Any] = [loc]
            for dirname in _dist_info_dirs(loc):
                row.append(dirname)
                for f in ("RECORD", "METADATA"):
                    try:
                        st = os.stat(os.path.join(loc, dirname, f))
                        row.append([st.st_ino, st.st_size, st.st_mtime_ns])
                    except OSError:
                        row.append(None)
            out.append(row)
        return out

    def _build(self) -> list[tuple[tuple[str, ...], dict[str, tuple[int, str]]]]:
        plain_by_site: list[tuple[tuple[str, ...], dict[str, tuple[int, str]]]] = []
        order = 0
        for loc in self.site_dirs:
            roots = tuple(dict.fromkeys((os.path.normpath(loc), os.path.realpath(loc))))
            plain: dict[str, tuple[int, str]] = {}
            for dirname in _dist_info_dirs(loc):
                order += 1
                fallback_name, fallback_version = _name_version_from_dirname(dirname)
                meta = _read_text(os.path.join(loc, dirname, "METADATA"))
                name, version = _meta_name_version(meta) if meta is not None else ("", "")
                label = f"{name or fallback_name} {version or fallback_version}"
                text = _read_text(os.path.join(loc, dirname, "RECORD"))
                if text is None:
                    continue
                paths, special = _record_paths(text)
                value = (order, label)
                new = dict.fromkeys(paths, value)
                special = [x for x in special if x in new]
                new.update(plain)  # an earlier distribution keeps its claim
                plain = new
                for raw in special:
                    for root in roots:
                        full = record_abspath(root, raw)
                        if full is not None:
                            self._special.setdefault(full, value)
            plain_by_site.append((roots, plain))
        return plain_by_site

    def _lookup(self, p: str) -> str | None:
        assert self._plain is not None
        best = self._special.get(p)
        for roots, plain in self._plain:
            for root in roots:
                prefix = root if root.endswith("/") else root + "/"
                if p.startswith(prefix):
                    hit = plain.get(p[len(prefix) :])
                    if hit is not None and (best is None or hit[0] < best[0]):
                        best = hit
        return best[1] if best is not None else None

    def owner(self, path: str) -> str | None:
        """``"name version"`` of the first distribution whose RECORD lists *path*, else None."""
        if self._plain is None:
            self._plain = self._build()
        p = os.path.normpath(os.path.abspath(path))
        found = self._lookup(p)
        if found is None:
            real = os.path.realpath(p)
            if real != p:
                found = self._lookup(real)
        return found


def owner_index(paths: Sequence[str] | None = None) -> OwnerIndex:
    """An :class:`OwnerIndex` over :func:`site_dirs` of *paths* (default: this interpreter's)."""
    return OwnerIndex(site_dirs(paths))
