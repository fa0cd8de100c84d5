"""CUDA compatibility facts, from ``data/cuda_compat.json`` (validated on load), and the lookups over them.

Every row of the data file cites a source id listed in its top-level ``sources``.  Rows marked
``"unconfirmed": true`` are loaded but never used to fail anything: lookups that would fail on them answer
"unknown" instead (the driver-soname list, which only ever relaxes checks, is the one exception).
Versions and archs in the file are read by :mod:`pytest_cudastack.cuda.versions`, as options are; the rules
built on these facts are :mod:`~pytest_cudastack.cuda.flavour` (a wheel's CUDA) and
:mod:`~pytest_cudastack.cuda.verdicts` (driver and GPU verdicts).
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pytest_cudastack.cuda.datafile import DataShape, check_data, cited, shipped_json
from pytest_cudastack.cuda.versions import CudaVersion, DriverVersion, parse_arch, parse_cuda, parse_driver
from pytest_cudastack.errors import DataError, OptionError, RuleError

__all__ = [
    "DATA_FILE",
    "ArchRow",
    "BranchRow",
    "CompatData",
    "MvcFloor",
    "SonameRow",
    "ToolkitRow",
    "UnsuffixedWheel",
    "arch_cuda_range",
    "beyond_data",
    "cuda_for_driver",
    "is_driver_soname",
    "load_compat",
    "min_driver_for_cuda",
    "mvc_floor",
    "mvc_floor_row",
    "soname_cuda_majors",
    "toolkit_sm_targets",
    "validate_compat",
]

logger = logging.getLogger(__name__)

DATA_FILE = "data/cuda_compat.json"

_T = TypeVar("_T")


# --------------------------------------------------------------------------------------------- data model


@dataclass(frozen=True)
class ToolkitRow:
    toolkit: CudaVersion
    label: str
    driver: DriverVersion
    source: str

    @property
    def driver_text(self) -> str:
        """The minimum driver as written ("450.80.02")."""
        return str(self.driver)


@dataclass(frozen=True)
class MvcFloor:
    major: int
    driver: DriverVersion
    below: DriverVersion | None  # upper end of the MVC range (later drivers work through backward compatibility)
    source: str

    @property
    def driver_text(self) -> str:
        return str(self.driver)


@dataclass(frozen=True)
class BranchRow:
    branch: int
    cuda: CudaVersion
    source: str
    unconfirmed: bool = False
    note: str = ""


@dataclass(frozen=True)
class SonameRow:
    soname: str | None
    regex: re.Pattern[str] | None
    majors: frozenset[int] | None  # None: the regex's "major" group decides
    source: str
    note: str = ""

    def match(self, soname: str) -> frozenset[int] | None:
        if self.soname is not None:
            return self.majors if soname == self.soname else None
        m = self.regex.match(soname) if self.regex is not None else None
        if not m:
            return None
        if self.majors is not None:
            return self.majors
        return frozenset({int(m["major"])})


@dataclass(frozen=True)
class UnsuffixedWheel:
    name: str
    min_version: Version
    major: int
    tracks_cuda: bool
    source: str


@dataclass(frozen=True)
class ArchRow:
    cc: str
    first_cuda: CudaVersion
    last_major: int | None
    source: str
    note: str = ""


@dataclass(frozen=True)
class CompatData:
    """The validated content of ``data/cuda_compat.json``."""

    sources: Mapping[str, Mapping[str, str]]
    toolkits: tuple[ToolkitRow, ...]
    mvc_floors: tuple[MvcFloor, ...]
    branches: tuple[BranchRow, ...]
    sonames: tuple[SonameRow, ...]
    driver_sonames: frozenset[str]
    name_rules: tuple[tuple[re.Pattern[str], str, bool], ...]  # (regex, evidence template, unconfirmed)
    tracks_cuda_suffixed: frozenset[str]
    local_version: re.Pattern[str]
    meta_packages: tuple[str, ...]
    unsuffixed: tuple[UnsuffixedWheel, ...]
    install_dirs: tuple[tuple[re.Pattern[str], str], ...]
    archs: tuple[ArchRow, ...]
    sm_targets: tuple[tuple[CudaVersion, frozenset[str]], ...]
    forward_compat_rule: str

    @property
    def confirmed_branches(self) -> tuple[BranchRow, ...]:
        return tuple(b for b in self.branches if not b.unconfirmed)


# --------------------------------------------------------------------------------------------- validation


class _Row:
    """Helper: typed access to one row, every problem a DataError naming file and row."""

    def __init__(self, source: str, table: str, index: int, row: Any, sources: Mapping[str, Any]) -> None:
        self.where = f"{source}: {table}[{index}]"
        if not isinstance(row, dict):
            raise DataError(f"{self.where}: expected an object, got {type(row).__name__}")
        self.row: dict[str, Any] = row
        self.source = cited(row, sources, self.where)

    def get(self, key: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
        if key not in self.row:
            if optional:
                return None
            raise DataError(f"{self.where}: missing key {key!r}")
        value = self.row[key]
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise DataError(f"{self.where}: {key!r} has the wrong type ({value!r})")
        return value

    def version(self, key: str, parse: Callable[[str], _T]) -> _T:
        text = self.get(key, str)
        try:
            return parse(text)
        except OptionError as e:
            raise DataError(f"{self.where}: {key!r}: {e}") from e

    def opt_version(self, key: str, parse: Callable[[str], _T]) -> _T | None:
        if self.row.get(key) is None:
            return None
        return self.version(key, parse)

    def regex(self, key: str) -> re.Pattern[str]:
        text = self.get(key, str)
        try:
            return re.compile(text)
        except re.error as e:
            raise DataError(f"{self.where}: {key!r} is not a valid regex: {e}") from e

    @property
    def unconfirmed(self) -> bool:
        return bool(self.row.get("unconfirmed", False))

    @property
    def note(self) -> str:
        return str(self.row.get("note", ""))


def _table(raw: Mapping[str, Any], key: str, source: str) -> list[Any]:
    """The rows of table ``key``, which the file must not leave empty."""
    value = raw.get(key)
    if not isinstance(value, list) or not value:
        raise DataError(f"{source}: top-level {key!r} must be a non-empty list")
    return value


def _rows(raw: Mapping[str, Any], table: str, source: str, sources: Mapping[str, Any]) -> list[_Row]:
    """The rows of the dotted ``table`` (``wheels.unsuffixed``) with typed access, each naming its place."""
    *parents, key = table.split(".")
    node = raw
    for part in parents:
        node = node[part]
    where = ": ".join([source, *parents])
    return [_Row(source, table, i, row, sources) for i, row in enumerate(_table(node, key, where))]


def _major_regexes(rows: list[_Row]) -> list[tuple[_Row, re.Pattern[str], str]]:
    """Rows ``{"regex": ..., "evidence": ...}`` whose regex must have a ``major`` group."""
    out = []
    for r in rows:
        rx = r.regex("regex")
        if "major" not in rx.groupindex:
            raise DataError(f"{r.where}: regex needs a (?P<major>...) group")
        out.append((r, rx, str(r.get("evidence", str))))
    return out


SHAPE = DataShape(
    "cuda_compat.schema.json",
    {
        "toolkit_drivers": ("toolkit",),
        "mvc_floors": ("major",),
        "driver_branches": ("branch",),
        "sonames": ("soname", "regex"),
        "driver_sonames": ("soname",),
        "wheels.name_rules": ("regex",),
        "wheels.meta_packages": ("name",),
        "wheels.unsuffixed": ("name",),
        "wheels.install_dirs": ("regex",),
        "archs": ("cc",),
        "sm_targets": ("toolkit",),
    },
    objects=("forward_compat", "wheels.local_version"),
)


def _toolkits(rows: list[_Row]) -> tuple[ToolkitRow, ...]:
    """Toolkit -> minimum driver rows: sorted by toolkit, drivers never falling, none unconfirmed."""
    toolkits: list[ToolkitRow] = []
    for r in rows:
        tk = r.version("toolkit", parse_cuda)
        drv = r.version("driver", parse_driver)
        row = ToolkitRow(tk, str(r.get("label", str)), drv, r.source)
        if toolkits and row.toolkit <= toolkits[-1].toolkit:
            raise DataError(f"{r.where}: toolkit {tk} is not after {toolkits[-1].toolkit} (rows must be sorted)")
        if toolkits and row.driver < toolkits[-1].driver:
            raise DataError(
                f"{r.where}: minimum driver {drv} for toolkit {tk} is lower than {toolkits[-1].driver} "
                f"for {toolkits[-1].toolkit} (minimum drivers must rise)"
            )
        if r.unconfirmed:
            raise DataError(f"{r.where}: unconfirmed toolkit rows must be left out")
        toolkits.append(row)
    return tuple(toolkits)


def _mvc_floors(rows: list[_Row], source: str) -> tuple[MvcFloor, ...]:
    """Minor-version-compatibility floors, one per major, each below its ``below`` and above the last major's."""
    floors: list[MvcFloor] = []
    for r in rows:
        major = r.get("major", int)
        drv = r.version("driver", parse_driver)
        below = r.opt_version("below", parse_driver)
        if below is not None and below <= drv:
            raise DataError(f"{r.where}: 'below' {below} must be above 'driver' {drv}")
        if any(f.major == major for f in floors):
            raise DataError(f"{r.where}: duplicate major {major}")
        floors.append(MvcFloor(major, drv, below, r.source))
    floors.sort(key=lambda f: f.major)
    for lower, higher in itertools.pairwise(floors):
        if higher.driver <= lower.driver:
            raise DataError(f"{source}: mvc_floors: floor for CUDA {higher.major} is not above CUDA {lower.major}'s")
    return tuple(floors)


def _branches(rows: list[_Row]) -> tuple[BranchRow, ...]:
    """Driver branch -> CUDA rows, both rising."""
    branches: list[BranchRow] = []
    for r in rows:
        branch = r.get("branch", int)
        cuda = r.version("cuda", parse_cuda)
        if branches and branch <= branches[-1].branch:
            raise DataError(f"{r.where}: branch {branch} is not after {branches[-1].branch} (rows must be sorted)")
        if branches and cuda <= branches[-1].cuda:
            raise DataError(f"{r.where}: CUDA {cuda} of R{branch} is not above R{branches[-1].branch}'s")
        branches.append(BranchRow(branch, cuda, r.source, r.unconfirmed, r.note))
    return tuple(branches)


def _soname(r: _Row) -> SonameRow:
    """One soname row: a ``soname`` or a ``regex``, with its ``majors`` or a regex ``major`` group."""
    name = r.get("soname", str, optional=True)
    pattern = r.regex("regex") if "regex" in r.row else None
    if (name is None) == (pattern is None):
        raise DataError(f"{r.where}: needs exactly one of 'soname' or 'regex'")
    majors_raw = r.get("majors", list, optional=True)
    if majors_raw is not None and (
        not majors_raw or not all(isinstance(m, int) and not isinstance(m, bool) for m in majors_raw)
    ):
        raise DataError(f"{r.where}: 'majors' must be a non-empty list of integers")
    if majors_raw is None and (pattern is None or "major" not in pattern.groupindex):
        raise DataError(f"{r.where}: without 'majors' the regex must have a (?P<major>...) group")
    majors = frozenset(majors_raw) if majors_raw is not None else None
    return SonameRow(name, pattern, majors, r.source, r.note)


def _sonames(rows: list[_Row]) -> tuple[SonameRow, ...]:
    """The confirmed soname rows (unconfirmed ones are checked, then left out)."""
    return tuple(row for r in rows if (row := _soname(r)) and not r.unconfirmed)


def _local_version(raw: Any, source: str, sources: Mapping[str, Any]) -> re.Pattern[str]:
    """The local-version regex, which must name ``major`` and ``minor``."""
    lv = _Row(source, "wheels.local_version", 0, raw, sources)
    local_version = lv.regex("regex")
    if not {"major", "minor"} <= set(local_version.groupindex):
        raise DataError(f"{lv.where}: regex needs (?P<major>) and (?P<minor>) groups")
    return local_version


def _unsuffixed(rows: list[_Row]) -> tuple[UnsuffixedWheel, ...]:
    """The confirmed wheels whose name carries no CUDA suffix, from their ``min_version`` on."""
    out = []
    for r in rows:
        try:
            minv = Version(r.get("min_version", str))
        except InvalidVersion as e:
            raise DataError(f"{r.where}: 'min_version': {e}") from e
        if r.unconfirmed:
            continue
        name = canonicalize_name(r.get("name", str))
        out.append(UnsuffixedWheel(name, minv, r.get("major", int), bool(r.get("tracks_cuda", bool)), r.source))
    return tuple(out)


def _arch(r: _Row) -> ArchRow:
    """One arch row: a compute capability, the first CUDA that knows it, the last major that still does."""
    cc = r.get("cc", str)
    try:
        is_cc = parse_arch(cc).cc == cc
    except OptionError:
        is_cc = False
    if not is_cc:
        raise DataError(f"{r.where}: 'cc' {cc!r} is not a compute capability like 8.6")
    first = r.version("first_cuda", parse_cuda)
    last = r.get("last_major", int, optional=True)
    if last is not None and last < first.major:
        raise DataError(f"{r.where}: last_major {last} is before first_cuda {first}")
    return ArchRow(cc, first, last, r.source, r.note)


def _archs(rows: list[_Row]) -> tuple[ArchRow, ...]:
    """The confirmed arch rows, each compute capability once."""
    archs: list[ArchRow] = []
    for r in rows:
        row = _arch(r)
        if any(a.cc == row.cc for a in archs):
            raise DataError(f"{r.where}: duplicate cc {row.cc}")
        if not r.unconfirmed:
            archs.append(row)
    return tuple(archs)


def _sm_targets(rows: list[_Row]) -> tuple[tuple[CudaVersion, frozenset[str]], ...]:
    """Toolkit -> the SM targets it builds, sorted by toolkit."""
    sm_targets: list[tuple[CudaVersion, frozenset[str]]] = []
    for r in rows:
        tk = r.version("toolkit", parse_cuda)
        try:
            normalized = frozenset(str(parse_arch(s)) for s in r.get("sm", list))
        except OptionError as e:
            raise DataError(f"{r.where}: 'sm': {e}") from e
        if sm_targets and tk <= sm_targets[-1][0]:
            raise DataError(f"{r.where}: toolkit {tk} is not after {sm_targets[-1][0]} (rows must be sorted)")
        sm_targets.append((tk, normalized))
    return tuple(sm_targets)


def validate_compat(raw: Any, source: str = DATA_FILE) -> CompatData:
    """Check the raw JSON object of the data file and build :class:`CompatData`.

    Raises DataError naming ``source`` and the offending row: the shape (``cuda_compat.schema.json``) and
    header (:func:`~pytest_cudastack.cuda.datafile.check_data`: unknown keys, a row citing an unlisted source,
    duplicate rows), then what only code can say: bad versions or regexes, minimum drivers that do not rise
    with the toolkit version, branches whose CUDA version goes down.
    """
    raw = check_data(raw, source, SHAPE)
    sources = raw["sources"]

    def rows(table: str) -> list[_Row]:
        return _rows(raw, table, source, sources)

    wheels = raw["wheels"]
    return CompatData(
        sources={k: dict(v) for k, v in sources.items()},
        toolkits=_toolkits(rows("toolkit_drivers")),
        mvc_floors=_mvc_floors(rows("mvc_floors"), source),
        branches=_branches(rows("driver_branches")),
        sonames=_sonames(rows("sonames")),
        # unconfirmed rows kept: this list only relaxes checks
        driver_sonames=frozenset(str(r.get("soname", str)) for r in rows("driver_sonames")),
        name_rules=tuple((rx, ev, r.unconfirmed) for r, rx, ev in _major_regexes(rows("wheels.name_rules"))),
        tracks_cuda_suffixed=frozenset(canonicalize_name(t) for t in wheels.get("tracks_cuda_suffixed", [])),
        local_version=_local_version(wheels["local_version"], source, sources),
        meta_packages=tuple(canonicalize_name(r.get("name", str)) for r in rows("wheels.meta_packages")),
        unsuffixed=_unsuffixed(rows("wheels.unsuffixed")),
        install_dirs=tuple((rx, ev) for _r, rx, ev in _major_regexes(rows("wheels.install_dirs"))),
        archs=_archs(rows("archs")),
        sm_targets=_sm_targets(rows("sm_targets")),
        forward_compat_rule=str(raw["forward_compat"]["rule"]),
    )


@functools.lru_cache(maxsize=1)
def load_compat() -> CompatData:
    """Load and validate the shipped data file (cached)."""
    raw = shipped_json(DATA_FILE)
    return validate_compat(raw, DATA_FILE)


# --------------------------------------------------------------------------------------------- lookups


def _branch_row(driver: DriverVersion) -> BranchRow | None:
    """The confirmed branch row for a driver: the highest branch <= the driver's branch."""
    best = None
    for row in load_compat().confirmed_branches:
        if row.branch <= driver.branch:
            best = row
    return best


def beyond_data(driver_version: str | DriverVersion) -> bool:
    """True when the driver is newer than every confirmed branch in the data (its CUDA is a lower bound).

    Raises OptionError for a malformed version.
    """
    confirmed = load_compat().confirmed_branches
    return parse_driver(driver_version).branch > confirmed[-1].branch


def cuda_for_driver(driver_version: str | DriverVersion) -> CudaVersion | None:
    """Highest CUDA version the driver supports natively ("550.54.15" -> 12.4), from the branch table.

    For a driver newer than every confirmed branch this is a lower bound (the newest confirmed CUDA).
    None when the driver predates the table or the version is not a driver version.
    """
    try:
        row = _branch_row(parse_driver(driver_version))
    except OptionError:
        return None
    return row.cuda if row is not None else None


def min_driver_for_cuda(cuda: str | CudaVersion) -> str | None:
    """Minimum Linux driver for a toolkit version ("12.4" -> "550.54.14", "12.4.1" -> "550.54.15").

    A major.minor without a toolkit row (12.7) falls back to the first branch supporting it ("565").
    None when the data does not know (e.g. 13.4, whose floor is unconfirmed).  Raises RuleError for a
    malformed version.
    """
    version = parse_cuda(cuda, error=RuleError)
    rows = [r for r in load_compat().toolkits if r.toolkit.mm == version.mm]
    released = [r for r in rows if not r.label.endswith(" RC")]
    rows = released or rows
    if rows:
        exact = version.patch is not None
        if exact:
            candidates = [r for r in rows if r.toolkit <= version]
            chosen = candidates[-1] if candidates else rows[0]
        else:
            chosen = rows[0]
        return chosen.driver_text
    for branch in load_compat().confirmed_branches:
        if branch.cuda.mm >= version.mm and branch.cuda.major == version.major:
            return str(branch.branch)
    return None


def mvc_floor_row(cuda_major: int) -> MvcFloor | None:
    """The minor-version compatibility floor of a CUDA major, None when the data has none."""
    for floor in load_compat().mvc_floors:
        if floor.major == cuda_major:
            return floor
    return None


def mvc_floor(cuda_major: int) -> str | None:
    """Minimum driver for minor-version compatibility across a CUDA major (13 -> "580", 11 -> "450.80.02")."""
    row = mvc_floor_row(cuda_major)
    return row.driver_text if row is not None else None


def soname_cuda_majors(soname: str) -> frozenset[int] | None:
    """CUDA major(s) a soname belongs to: None unknown (not a CUDA toolkit soname); >1 element ambiguous."""
    for row in load_compat().sonames:
        majors = row.match(soname)
        if majors is not None:
            return majors
    return None


def is_driver_soname(soname: str) -> bool:
    """Whether the soname is provided by the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1, ...)."""
    if soname in load_compat().driver_sonames:
        return True
    return soname.startswith(("libcuda.so", "libnvidia-ml.so"))


def arch_cuda_range(cc: str) -> tuple[int, int | None] | None:
    """First and last CUDA major supporting a compute capability ("7.0"/"sm_70" -> (9, 12)); None unknown."""
    try:
        key = parse_arch(cc).cc
    except OptionError:
        return None
    for row in load_compat().archs:
        if row.cc == key:
            return row.first_cuda.major, row.last_major
    return None


def toolkit_sm_targets(toolkit: str | CudaVersion) -> frozenset[str] | None:
    """Real ``sm_*`` targets accepted by a toolkit's ptxas (major.minor), or None when not in the data.

    Raises RuleError for a malformed version.
    """
    mm = parse_cuda(toolkit, error=RuleError).mm
    for tk, sms in load_compat().sm_targets:
        if tk.mm == mm:
            return sms
    return None
