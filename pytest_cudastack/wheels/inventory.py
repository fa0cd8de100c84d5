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

Cost: RECORD rows are the bulk (the venv of torch 2.14 lists ~22k files). :mod:`pytest_cudastack.wheels.distinfo`
reads RECORD and METADATA (each with a shortcut for the usual text). ``Inventory.owner(s)`` and integrity.py
look paths up in one dict per distribution, built on first use, keyed by the RECORD path as written (a plain
relative path needs no normalisation; only the few ``..``/absolute ones are resolved).
:class:`OwnerIndex` answers the same owner question from RECORD and METADATA alone (no ELF reads, no flavour
rules): it is what ``cudastack tree`` uses for its provider column.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from packaging.utils import canonicalize_name

from pytest_cudastack._sysio import read_text
from pytest_cudastack.cuda.flavour import wheel_cuda_flavour
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import Finding, Pip, Severity, manual
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.wheels.distinfo import (
    is_plain_record_path,
    metadata_headers,
    name_version,
    name_version_from_dirname,
    parse_record,
)
from pytest_cudastack.wheels.dpkg import dist_info_package
from pytest_cudastack.wheels.sitepaths import (  # re-exported: they are part of this module's API
    OwnerIndex,
    dist_info_dirs,
    install_prefix,
    owner_index,
    record_abspath,
    site_dirs,
)

if TYPE_CHECKING:
    from pytest_cudastack.linker.elf import ElfInfo

__all__ = [
    "PYTHON_INSTALLERS",
    "Distribution",
    "Inventory",
    "OwnerIndex",
    "Reader",
    "RecordEntry",
    "ShippedLib",
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

# INSTALLER texts of Python installers (pip and uv write their names; conda, poetry, pdm theirs): a
# distribution they installed is judged by its RECORD even where an OS package lists the same dist-info
PYTHON_INSTALLERS = frozenset({"pip", "uv", "conda", "poetry", "pdm", "pipenv", "hatch", "pixi"})
_INSTALLER_LIMIT = 256  # bytes of INSTALLER read (one word)

_SO_RE = re.compile(r"\.so(\.[0-9A-Za-z_]+)*$")


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
    installer: str | None = field(default=None, repr=False)  # INSTALLER's first line, None when absent
    # the OS package whose file list names this dist-info (dpkg's ``<package>.list``), when no Python
    # installer's INSTALLER says otherwise: its files are judged by that package's record, not by RECORD
    os_package: str | None = None

    # functools.cached_property stores in the instance's __dict__, past the frozen __setattr__: computed
    # once per distribution, not a field (not compared, hashed or shown)
    @functools.cached_property
    def nonplain_paths(self) -> tuple[str, ...]:
        """The RECORD paths, in order, that do not resolve to ``<location>/<path>`` unchanged (``..``,
        absolute, ``./``: see :func:`~pytest_cudastack.wheels.distinfo.is_plain_record_path`), found once
        (the inventory, its owner map and integrity.py all ask)."""
        return tuple([e.path for e in self.records if not is_plain_record_path(e.path)])

    @functools.cached_property
    def plain_rows(self) -> Mapping[str, RecordEntry]:
        """Plain RECORD path -> the first row listing it, built once (the owner lookups and integrity.py
        share it)."""
        rows = {e.path: e for e in reversed(self.records)}  # reversed: the first row of a path wins
        for x in self.nonplain_paths:
            rows.pop(x, None)
        return rows

    @property
    def key(self) -> str:
        """Canonical (PEP 503) name."""
        return canonicalize_name(self.name)

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
            "installer": self.installer,
            "os_package": self.os_package,
        }


@dataclass(frozen=True)
class Inventory:
    """Every distribution visible from ``site_dirs``, in search order, and what reading them found."""

    distributions: tuple[Distribution, ...]
    site_dirs: tuple[str, ...]
    findings: tuple[Finding, ...]
    dpkg_root: str = "/"  # where dpkg's database was read (``<root>/var/lib/dpkg/info``)
    root: str | None = None  # another system's root the site directories are in (an image's); None: this machine
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

    def _owner_maps(self) -> tuple[list[tuple[str, ...]], dict[str, list[int]]]:
        """Built on the first lookup: per distribution, the directory prefixes its plain RECORD paths are
        looked up under (``<site dir>/``, normalised and realpath'ed; the paths themselves are in
        :attr:`Distribution.plain_rows`: a plain path resolves to ``<root>/<path>`` unchanged, so it needs no
        normalisation); absolute path -> distribution indexes for the few paths that are not plain (``..``,
        absolute, ``./``)."""
        if "maps" not in self._owners:
            by_loc: dict[str, tuple[str, ...]] = {}
            prefixes: list[tuple[str, ...]] = []
            special: dict[str, list[int]] = {}
            for i, dist in enumerate(self.distributions):
                loc = dist.location
                if loc not in by_loc:
                    by_loc[loc] = tuple(dict.fromkeys((os.path.normpath(loc), os.path.realpath(loc))))
                roots = by_loc[loc]
                prefixes.append(tuple(root if root.endswith("/") else root + "/" for root in roots))
                for x in dict.fromkeys(dist.nonplain_paths):
                    for root in roots:
                        full = record_abspath(root, x)
                        if full is not None:
                            hit = special.setdefault(full, [])
                            if not hit or hit[-1] != i:
                                hit.append(i)
            self._owners["maps"] = (prefixes, special)
        maps: tuple[list[tuple[str, ...]], dict[str, list[int]]] = self._owners["maps"]
        return maps

    def _owner_indexes(self, p: str) -> list[int]:
        prefixes, special = self._owner_maps()
        found = set(special.get(p, ()))
        for i, (dist, pres) in enumerate(zip(self.distributions, prefixes, strict=True)):
            for prefix in pres:
                if p.startswith(prefix) and p[len(prefix) :] in dist.plain_rows:
                    found.add(i)
                    break
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

    def relative(self, path: str) -> str:
        """``path`` relative to the site directory that holds it (``torch/lib/libtorch.so``), as findings name
        files; unchanged when no site directory does."""
        p = os.path.normpath(path)
        for site in self.site_dirs:
            s = os.path.normpath(site).rstrip(os.sep) + os.sep
            if p.startswith(s):
                return p[len(s) :]
        return p

    def owner(self, path: str) -> str | None:
        """``"name version"`` of the (first) distribution whose RECORD lists ``path``, else None."""
        found = self.owners(path)
        return found[0].label if found else None

    def get(self, name: str) -> Distribution | None:
        """The distribution named ``name`` (any spelling) that comes first in search order."""
        return self._by_name.get(canonicalize_name(name))

    def all_named(self, name: str) -> tuple[Distribution, ...]:
        """Every distribution with this name (more than one is itself a finding)."""
        key = canonicalize_name(name)
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
# reading


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


def _flavour(name: str, version: str, requires: Sequence[str], paths: Sequence[str]) -> tuple[int | None, str]:
    try:
        return wheel_cuda_flavour(name, version, tuple(requires), tuple(paths))
    except CudaStackError as e:  # the compat data file failed to load or validate
        return None, f"flavour rules failed: {e}"


def _shipped_lib(location: str, entry: RecordEntry, reader: Reader) -> ShippedLib | None:
    path = record_abspath(location, entry.path)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return ShippedLib(path, None, False, record=entry)
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
    name, version = name_version_from_dirname(dirname)
    summary = ""
    requires: list[str] = []
    meta_text = read_text(os.path.join(dist_info, "METADATA"))
    if meta_text is None:
        problems.append(f"no readable METADATA in {dirname}; name and version taken from the directory name")
    else:
        headers = metadata_headers(meta_text)
        name, version = name_version(headers, dirname)
        first: dict[str, str] = {}
        for k, v in headers:
            first.setdefault(k, v)
        summary = first.get("summary", "").strip()
        requires = [r.strip() for k, r in headers if k == "requires-dist" and r.strip()]
        if not first.get("name") or not first.get("version"):
            problems.append(f"METADATA of {dirname} lacks Name or Version")
    records: list[RecordEntry] = []
    record_text = read_text(os.path.join(dist_info, "RECORD"))
    if record_text is None:
        problems.append(f"no readable RECORD in {dirname}; its files cannot be checked")
    else:
        records, rec_problems = parse_record(record_text, RecordEntry)
        problems.extend(rec_problems)
    paths = [e.path for e in records]
    # ".so" in the path first: what is_shared_lib_path tests first, without a call per RECORD row
    libraries = tuple(
        lib
        for lib in (
            _shipped_lib(location, e, reader) for e in records if ".so" in e.path and is_shared_lib_path(e.path)
        )
        if lib is not None
    )
    cuda_major, evidence = _flavour(name, version, requires, paths)
    installer_text = read_text(os.path.join(dist_info, "INSTALLER"), limit=_INSTALLER_LIMIT)
    installer = installer_text.strip().partition("\n")[0].strip() if installer_text is not None else None
    dist = Distribution(
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
        installer=installer,
    )
    # after construction, so that its non-plain paths are found once (they are asked for again by the owner
    # lookups and integrity.py); a RECORD listing a path outside is rare, and only then is it rebuilt
    outside = [x for x in dist.nonplain_paths if record_abspath(location, x) is None]
    if outside:
        shown = ", ".join(outside[:3]) + (f" and {len(outside) - 3} more" if len(outside) > 3 else "")
        problems.append(f"RECORD lists {len(outside)} path(s) outside the install prefix, ignored: {shown}")
        dist = replace(dist, problems=tuple(problems))
    return dist


def _inventory_findings(dists: Iterable[Distribution]) -> list[Finding]:
    findings: list[Finding] = []
    by_name: dict[str, list[Distribution]] = {}
    for d in dists:
        by_name.setdefault(d.key, []).append(d)
        for p in d.problems:
            findings.append(
                Finding(
                    check="integrity",
                    severity=Severity.WARNING,
                    subject=d.label,
                    message=p,
                    cause="the dist-info directory is malformed or was edited by hand",
                    remedies=(
                        (Pip("install", (f"{d.name}=={d.version}",), flags=("--force-reinstall", "--no-deps")),)
                        if d.version
                        else ()
                    ),
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
            fix = manual(
                f"pip uninstall {first.name} (repeat until none is left)", f"pip install {first.name}=={first.version}"
            )
        else:
            cause = (
                f"the first on the search path ({first.version} in {first.location}) is the one imported; "
                "the others are shadowed"
            )
            fix = manual(f"uninstall the copies you do not mean to use (pip uninstall {first.name} there)")
        findings.append(
            Finding(
                check="integrity",
                severity=Severity.WARNING,
                subject=first.name,
                message=f"{first.name} is installed {len(dups)} times: {listing}",
                cause=cause,
                remedies=fix,
                where=tuple(d.dist_info for d in dups),
            )
        )
    return findings


def _os_owned(dist: Distribution, dpkg_root: str | None) -> Distribution:
    """``dist`` with its OS package, when no Python installer wrote its INSTALLER and dpkg lists it."""
    if dpkg_root is None or (dist.installer or "").lower() in PYTHON_INSTALLERS:
        return dist
    package = dist_info_package(dist.dist_info, dpkg_root)
    return dist if package is None else replace(dist, os_package=package)


def installed_wheels(
    paths: Sequence[str] | None = None,
    reader: Reader | None = None,
    *,
    dpkg_root: str | None = "/",
    root: str | None = None,
) -> Inventory:
    """Every distribution in ``paths`` (default: this interpreter's site directories), in search order.

    ``dpkg_root``: where dpkg's database is (``<root>/var/lib/dpkg/info``; None: do not look), read only for
    distributions no Python installer's INSTALLER claims (:attr:`Distribution.os_package`). ``root``: the root
    of the system ``paths`` belong to (an image's), whose paths their ``.pth`` files name
    (:func:`~pytest_cudastack.wheels.sitepaths.site_dirs`); None: this machine's.

    ``reader`` returns ElfInfo for a path (default: :func:`~pytest_cudastack.linker.elf.read_elf`, uncached;
    a run hands down its ``ElfCache.read``); it is called only for RECORD-listed ``*.so`` / ``*.so.*`` files
    that exist.
    """
    rd = reader if reader is not None else read_elf
    dirs = site_dirs(paths, root)
    dists: list[Distribution] = []
    for loc in dirs:
        for dirname in dist_info_dirs(loc):
            try:
                dists.append(_os_owned(read_distribution(loc, dirname, rd), dpkg_root))
            except (OSError, UnicodeError, ValueError) as e:  # belt and braces: never crash on a dist-info
                logger.debug("cannot read %s/%s: %s", loc, dirname, e)
                name, version = name_version_from_dirname(dirname)
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
    return Inventory(tuple(dists), dirs, tuple(_inventory_findings(dists)), dpkg_root or "/", root)
