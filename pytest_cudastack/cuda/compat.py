"""CUDA compatibility facts, from ``data/cuda_compat.json`` (validated on load), and the verdicts built on them.

Every row of the data file cites a source id listed in its top-level ``sources``.  Rows marked
``"unconfirmed": true`` are loaded but never used to fail anything: lookups that would fail on them answer
"unknown" instead (the driver-soname list, which only ever relaxes checks, is the one exception).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pytest_cudastack.errors import DataError, RuleError

if TYPE_CHECKING:
    from pytest_cudastack.cuda.driver import DriverInfo

__all__ = [
    "DATA_FILE",
    "VERDICT_STATUSES",
    "ArchRow",
    "BranchRow",
    "CompatData",
    "DriverVerdict",
    "MvcFloor",
    "SonameRow",
    "ToolkitRow",
    "UnsuffixedWheel",
    "VerdictStatus",
    "arch_cuda_range",
    "cuda_for_driver",
    "cuda_major_for_soname_in_wheel",
    "driver_branch",
    "driver_verdict",
    "gpu_verdict",
    "is_driver_soname",
    "load_compat",
    "min_driver_for_cuda",
    "mvc_floor",
    "normalize_arch",
    "parse_cuda_version",
    "parse_driver_version",
    "soname_cuda_majors",
    "toolkit_sm_targets",
    "validate_compat",
    "wheel_cuda_flavour",
    "wheel_cuda_requirement",
]

logger = logging.getLogger(__name__)

DATA_FILE = "data/cuda_compat.json"
VERDICT_STATUSES = ("compatible", "mvc", "incompatible", "unknown")
VerdictStatus = Literal["compatible", "mvc", "incompatible", "unknown"]

_DRIVER_RE = re.compile(r"^[0-9]{3,4}(\.[0-9]{1,4}){0,3}$")
_CUDA_RE = re.compile(r"^[0-9]{1,2}(\.[0-9]{1,3}){0,3}$")
_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(?P<major>[0-9]{1,2})(?P<minor>[0-9])(?P<suffix>[af]?)$")
_CC_RE = re.compile(r"^(?P<major>[0-9]{1,2})\.(?P<minor>[0-9])(?P<suffix>[af]?)$")


# --------------------------------------------------------------------------------------------- parsing


def parse_driver_version(text: str) -> Version:
    """Parse an NVIDIA driver version ("550", "550.54.15", "570.26"); raise ValueError naming the value.

    >>> parse_driver_version("550.54.15")
    <Version('550.54.15')>
    """
    value = str(text).strip()
    if value[:1] in ("R", "r") and value[1:].isdigit():
        value = value[1:]  # branch spelling "R550"
    if not _DRIVER_RE.match(value):
        raise ValueError(f"invalid NVIDIA driver version {text!r} (expected e.g. 550.54.15, 580 or R580)")
    return Version(value)


def parse_cuda_version(text: str | Version) -> Version:
    """Parse a CUDA version ("12", "12.4", "12.4.1"); raise ValueError naming the value."""
    if isinstance(text, Version):
        return text
    value = str(text).strip()
    if not _CUDA_RE.match(value):
        raise ValueError(f"invalid CUDA version {text!r} (expected e.g. 12.4 or 13)")
    return Version(value)


def _rule_cuda(text: str | Version) -> Version:
    try:
        return parse_cuda_version(text)
    except ValueError as e:
        raise RuleError(str(e)) from e


def driver_branch(driver_version: str | Version) -> int:
    """The branch number of a driver version: 550 for "550.54.15"."""
    version = driver_version if isinstance(driver_version, Version) else parse_driver_version(driver_version)
    return version.release[0]


def normalize_arch(arch: str) -> str:
    """Normalise "sm_90", "90", "9.0", "compute_90", "sm_90a" to the ``sm_XX[a|f]`` spelling.

    Raises ValueError naming the value when it is not an arch.
    """
    value = str(arch).strip().lower()
    m = _CC_RE.match(value) or _ARCH_RE.match(value)
    if not m:
        raise ValueError(f"invalid GPU architecture {arch!r} (expected e.g. sm_86, sm_90a or 8.6)")
    return f"sm_{int(m['major'])}{m['minor']}{m['suffix']}"


def _cc_of(arch: str) -> str:
    """ "sm_90a" -> "9.0" (the suffix dropped)."""
    digits = normalize_arch(arch)[3:].rstrip("af")
    return f"{digits[:-1]}.{digits[-1]}"


def _major_minor(version: Version) -> tuple[int, int]:
    release = (*version.release, 0)
    return release[0], release[1]


def _fmt_mm(version: Version) -> str:
    major, minor = _major_minor(version)
    return f"{major}.{minor}"


# --------------------------------------------------------------------------------------------- data model


@dataclass(frozen=True)
class ToolkitRow:
    toolkit: Version
    label: str
    driver: Version
    source: str
    driver_text: str = ""  # as written ("450.80.02"; Version normalises to 450.80.2)


@dataclass(frozen=True)
class MvcFloor:
    major: int
    driver: Version
    below: Version | None  # upper end of the MVC range (later drivers work through backward compatibility)
    source: str
    driver_text: str = ""  # as written


@dataclass(frozen=True)
class BranchRow:
    branch: int
    cuda: Version
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
    first_cuda: Version
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
    sm_targets: tuple[tuple[Version, frozenset[str]], ...]
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
        src = row.get("source")
        if src not in sources:
            raise DataError(f"{self.where}: source {src!r} is not listed in 'sources'")
        self.source = str(src)

    def keys(self, allowed: set[str]) -> None:
        extra = set(self.row) - allowed - {"source", "note", "unconfirmed"}
        if extra:
            raise DataError(f"{self.where}: unknown key(s) {', '.join(sorted(extra))}")
        if "unconfirmed" in self.row and not isinstance(self.row["unconfirmed"], bool):
            raise DataError(f"{self.where}: 'unconfirmed' must be true or false")

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

    def version(self, key: str, parse: Callable[[str], Version]) -> Version:
        text = self.get(key, str)
        try:
            return parse(text)
        except ValueError as e:
            raise DataError(f"{self.where}: {key!r}: {e}") from e

    def opt_version(self, key: str, parse: Callable[[str], Version]) -> Version | None:
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
    value = raw.get(key)
    if not isinstance(value, list) or not value:
        raise DataError(f"{source}: top-level {key!r} must be a non-empty list")
    return value


def _major_regexes(
    wheels: Mapping[str, Any], key: str, source: str, sources: Mapping[str, Any]
) -> list[tuple[_Row, re.Pattern[str], str]]:
    """Rows ``{"regex": ..., "evidence": ...}`` of ``wheels[key]`` whose regex has a ``major`` group."""
    rows = []
    for i, row in enumerate(_table(wheels, key, f"{source}: wheels")):
        r = _Row(source, f"wheels.{key}", i, row, sources)
        r.keys({"regex", "evidence"})
        rx = r.regex("regex")
        if "major" not in rx.groupindex:
            raise DataError(f"{r.where}: regex needs a (?P<major>...) group")
        rows.append((r, rx, str(r.get("evidence", str))))
    return rows


_TOP_KEYS = {
    "schema",
    "description",
    "sources",
    "toolkit_drivers",
    "mvc_floors",
    "driver_branches",
    "forward_compat",
    "sonames",
    "driver_sonames",
    "wheels",
    "archs",
    "sm_targets",
}


def validate_compat(raw: Any, source: str = DATA_FILE) -> CompatData:
    """Check the raw JSON object of the data file and build :class:`CompatData`.

    Raises DataError naming ``source`` and the offending row: unknown keys, a row citing an unlisted
    source, bad versions or regexes, minimum drivers that do not rise with the toolkit version, branches
    whose CUDA version goes down, duplicate rows.
    """
    if not isinstance(raw, dict):
        raise DataError(f"{source}: top level must be an object")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise DataError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    if raw.get("schema") != 1:
        raise DataError(f"{source}: unsupported schema {raw.get('schema')!r} (expected 1)")
    sources = raw.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise DataError(f"{source}: 'sources' must be a non-empty object")
    for sid, entry in sources.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("url"), str)
            or not isinstance(entry.get("retrieved"), str)
            or not re.match(r"^\d{4}-\d{2}-\d{2}$", entry["retrieved"])
        ):
            raise DataError(f"{source}: sources[{sid!r}] needs 'url' and 'retrieved' (YYYY-MM-DD)")

    def rows(table: str, allowed: set[str]) -> list[_Row]:
        out = []
        for i, row in enumerate(_table(raw, table, source)):
            r = _Row(source, table, i, row, sources)
            r.keys(allowed)
            out.append(r)
        return out

    # toolkit -> minimum driver: sorted by toolkit, drivers non-decreasing
    toolkits: list[ToolkitRow] = []
    for r in rows("toolkit_drivers", {"toolkit", "label", "driver"}):
        tk = r.version("toolkit", parse_cuda_version)
        drv = r.version("driver", parse_driver_version)
        row = ToolkitRow(tk, str(r.get("label", str)), drv, r.source, str(r.row["driver"]))
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

    floors: list[MvcFloor] = []
    for r in rows("mvc_floors", {"major", "driver", "below"}):
        major = r.get("major", int)
        drv = r.version("driver", parse_driver_version)
        below = r.opt_version("below", parse_driver_version)
        if below is not None and below <= drv:
            raise DataError(f"{r.where}: 'below' {below} must be above 'driver' {drv}")
        if any(f.major == major for f in floors):
            raise DataError(f"{r.where}: duplicate major {major}")
        floors.append(MvcFloor(major, drv, below, r.source, str(r.row["driver"])))
    floors.sort(key=lambda f: f.major)
    for lower, higher in itertools.pairwise(floors):
        if higher.driver <= lower.driver:
            raise DataError(f"{source}: mvc_floors: floor for CUDA {higher.major} is not above CUDA {lower.major}'s")

    branches: list[BranchRow] = []
    for r in rows("driver_branches", {"branch", "cuda"}):
        branch = r.get("branch", int)
        cuda = r.version("cuda", parse_cuda_version)
        if branches and branch <= branches[-1].branch:
            raise DataError(f"{r.where}: branch {branch} is not after {branches[-1].branch} (rows must be sorted)")
        if branches and cuda <= branches[-1].cuda:
            raise DataError(f"{r.where}: CUDA {cuda} of R{branch} is not above R{branches[-1].branch}'s")
        branches.append(BranchRow(branch, cuda, r.source, r.unconfirmed, r.note))

    sonames: list[SonameRow] = []
    seen: set[str] = set()
    for r in rows("sonames", {"soname", "regex", "majors"}):
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
        key = name if name is not None else str(r.row["regex"])
        if key in seen:
            raise DataError(f"{r.where}: duplicate row {key!r}")
        seen.add(key)
        if r.unconfirmed:
            continue
        sonames.append(
            SonameRow(name, pattern, frozenset(majors_raw) if majors_raw is not None else None, r.source, r.note)
        )

    driver_sonames: set[str] = set()
    for r in rows("driver_sonames", {"soname"}):
        driver_sonames.add(r.get("soname", str))  # unconfirmed rows kept: this list only relaxes checks

    wheels = raw.get("wheels")
    if not isinstance(wheels, dict):
        raise DataError(f"{source}: 'wheels' must be an object")
    extra = set(wheels) - {
        "name_rules",
        "tracks_cuda_suffixed",
        "local_version",
        "meta_packages",
        "unsuffixed",
        "install_dirs",
    }
    if extra:
        raise DataError(f"{source}: wheels: unknown key(s) {', '.join(sorted(extra))}")
    name_rules = [
        (rx, evidence, r.unconfirmed) for r, rx, evidence in _major_regexes(wheels, "name_rules", source, sources)
    ]
    tracks = wheels.get("tracks_cuda_suffixed", [])
    if not isinstance(tracks, list) or not all(isinstance(t, str) for t in tracks):
        raise DataError(f"{source}: wheels.tracks_cuda_suffixed must be a list of names")
    lv = _Row(source, "wheels.local_version", 0, wheels.get("local_version"), sources)
    lv.keys({"regex", "evidence"})
    local_version = lv.regex("regex")
    if not {"major", "minor"} <= set(local_version.groupindex):
        raise DataError(f"{lv.where}: regex needs (?P<major>) and (?P<minor>) groups")
    metas = []
    for i, row in enumerate(_table(wheels, "meta_packages", f"{source}: wheels")):
        r = _Row(source, "wheels.meta_packages", i, row, sources)
        r.keys({"name", "evidence"})
        metas.append(canonicalize_name(r.get("name", str)))
    unsuffixed = []
    for i, row in enumerate(_table(wheels, "unsuffixed", f"{source}: wheels")):
        r = _Row(source, "wheels.unsuffixed", i, row, sources)
        r.keys({"name", "min_version", "major", "tracks_cuda"})
        try:
            minv = Version(r.get("min_version", str))
        except InvalidVersion as e:
            raise DataError(f"{r.where}: 'min_version': {e}") from e
        if r.unconfirmed:
            continue
        unsuffixed.append(
            UnsuffixedWheel(
                canonicalize_name(r.get("name", str)),
                minv,
                r.get("major", int),
                bool(r.get("tracks_cuda", bool)),
                r.source,
            )
        )
    install_dirs = [(rx, evidence) for _r, rx, evidence in _major_regexes(wheels, "install_dirs", source, sources)]

    archs: list[ArchRow] = []
    for r in rows("archs", {"cc", "first_cuda", "last_major"}):
        cc = r.get("cc", str)
        if not _CC_RE.match(cc):
            raise DataError(f"{r.where}: 'cc' {cc!r} is not a compute capability like 8.6")
        first = r.version("first_cuda", parse_cuda_version)
        last = r.get("last_major", int, optional=True)
        if last is not None and last < first.major:
            raise DataError(f"{r.where}: last_major {last} is before first_cuda {first}")
        if any(a.cc == cc for a in archs):
            raise DataError(f"{r.where}: duplicate cc {cc}")
        if r.unconfirmed:
            continue
        archs.append(ArchRow(cc, first, last, r.source, r.note))

    sm_targets: list[tuple[Version, frozenset[str]]] = []
    for r in rows("sm_targets", {"toolkit", "sm"}):
        tk = r.version("toolkit", parse_cuda_version)
        sms = r.get("sm", list)
        try:
            normalized = frozenset(normalize_arch(s) for s in sms)
        except (ValueError, TypeError) as e:
            raise DataError(f"{r.where}: 'sm': {e}") from e
        if sm_targets and tk <= sm_targets[-1][0]:
            raise DataError(f"{r.where}: toolkit {tk} is not after {sm_targets[-1][0]} (rows must be sorted)")
        sm_targets.append((tk, normalized))

    fwd = raw.get("forward_compat")
    if not isinstance(fwd, dict) or not isinstance(fwd.get("rule"), str) or fwd.get("source") not in sources:
        raise DataError(f"{source}: 'forward_compat' needs 'rule' and a listed 'source'")

    return CompatData(
        sources={k: dict(v) for k, v in sources.items()},
        toolkits=tuple(toolkits),
        mvc_floors=tuple(floors),
        branches=tuple(branches),
        sonames=tuple(sonames),
        driver_sonames=frozenset(driver_sonames),
        name_rules=tuple(name_rules),
        tracks_cuda_suffixed=frozenset(canonicalize_name(t) for t in tracks),
        local_version=local_version,
        meta_packages=tuple(metas),
        unsuffixed=tuple(unsuffixed),
        install_dirs=tuple(install_dirs),
        archs=tuple(archs),
        sm_targets=tuple(sm_targets),
        forward_compat_rule=str(fwd["rule"]),
    )


@functools.lru_cache(maxsize=1)
def load_compat() -> CompatData:
    """Load and validate the shipped data file (cached)."""
    ref = resources.files("pytest_cudastack.cuda").joinpath(DATA_FILE)
    try:
        raw = json.loads(ref.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{DATA_FILE}: cannot read: {e}") from e
    return validate_compat(raw, DATA_FILE)


# --------------------------------------------------------------------------------------------- lookups


def _branch_row(driver_version: str | Version) -> BranchRow | None:
    """The confirmed branch row for a driver: the highest branch <= the driver's branch."""
    branch = driver_branch(driver_version)
    best = None
    for row in load_compat().confirmed_branches:
        if row.branch <= branch:
            best = row
    return best


def _beyond_data(driver_version: str | Version) -> bool:
    """True when the driver is newer than every confirmed branch in the data (its CUDA is a lower bound)."""
    confirmed = load_compat().confirmed_branches
    return driver_branch(driver_version) > confirmed[-1].branch


def cuda_for_driver(driver_version: str) -> Version | None:
    """Highest CUDA version the driver supports natively ("550.54.15" -> 12.4), from the branch table.

    For a driver newer than every confirmed branch this is a lower bound (the newest confirmed CUDA).
    None when the driver predates the table or the version is not a driver version.
    """
    try:
        row = _branch_row(driver_version)
    except ValueError:
        return None
    return row.cuda if row is not None else None


def min_driver_for_cuda(cuda: str | Version) -> str | None:
    """Minimum Linux driver for a toolkit version ("12.4" -> "550.54.14", "12.4.1" -> "550.54.15").

    A major.minor without a toolkit row (12.7) falls back to the first branch supporting it ("565").
    None when the data does not know (e.g. 13.4, whose floor is unconfirmed).
    """
    version = _rule_cuda(cuda)
    mm = _major_minor(version)
    rows = [r for r in load_compat().toolkits if _major_minor(r.toolkit) == mm]
    released = [r for r in rows if not r.label.endswith(" RC")]
    rows = released or rows
    if rows:
        exact = len(version.release) >= 3
        if exact:
            candidates = [r for r in rows if r.toolkit <= version]
            chosen = candidates[-1] if candidates else rows[0]
        else:
            chosen = rows[0]
        return chosen.driver_text
    for branch in load_compat().confirmed_branches:
        if _major_minor(branch.cuda) >= mm and branch.cuda.major == version.major:
            return str(branch.branch)
    return None


def mvc_floor(cuda_major: int) -> str | None:
    """Minimum driver for minor-version compatibility across a CUDA major (13 -> "580", 11 -> "450.80.02")."""
    for floor in load_compat().mvc_floors:
        if floor.major == cuda_major:
            return floor.driver_text
    return None


def soname_cuda_majors(soname: str) -> frozenset[int] | None:
    """CUDA major(s) a soname belongs to: None unknown (not a CUDA toolkit soname); >1 element ambiguous."""
    for row in load_compat().sonames:
        majors = row.match(soname)
        if majors is not None:
            return majors
    return None


def cuda_major_for_soname_in_wheel(soname: str, wheel_major: int | None) -> frozenset[int] | None:
    """Narrow an ambiguous soname by the CUDA major of the wheel shipping it.

    ``libcudnn.so.9`` in nvidia-cudnn-cu12 is CUDA 12.  A wheel major outside the soname's set is a
    contradiction; the soname's own answer wins then.
    """
    majors = soname_cuda_majors(soname)
    if majors is None or wheel_major is None:
        return majors
    if wheel_major in majors:
        return frozenset({wheel_major})
    return majors


def is_driver_soname(soname: str) -> bool:
    """Whether the soname is provided by the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1, ...)."""
    if soname in load_compat().driver_sonames:
        return True
    return soname.startswith(("libcuda.so", "libnvidia-ml.so"))


def arch_cuda_range(cc: str) -> tuple[int, int | None] | None:
    """First and last CUDA major supporting a compute capability ("7.0"/"sm_70" -> (9, 12)); None unknown."""
    try:
        key = _cc_of(cc)
    except ValueError:
        return None
    for row in load_compat().archs:
        if row.cc == key:
            return row.first_cuda.major, row.last_major
    return None


def toolkit_sm_targets(toolkit: str | Version) -> frozenset[str] | None:
    """Real ``sm_*`` targets accepted by a toolkit's ptxas (major.minor), or None when not in the data."""
    mm = _major_minor(_rule_cuda(toolkit))
    for tk, sms in load_compat().sm_targets:
        if _major_minor(tk) == mm:
            return sms
    return None


# --------------------------------------------------------------------------------------------- wheels


def _req_pins(requires: Sequence[str]) -> list[tuple[str, Requirement]]:
    out = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            logger.debug("ignoring unparsable requirement %r", text)
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue  # optional extra, not what this build needs
        out.append((text, req))
    return out


def _pinned_version(req: Requirement) -> Version | None:
    """The exact pin (``==13.0.3``), else the lower bound (``>=13.0.88,<14``, ``~=12.8``), else None."""
    lower: Version | None = None
    for spec in req.specifier:
        text = spec.version.rstrip(".*")
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if spec.operator in ("==", "===") and "*" not in spec.version:
            return version
        if spec.operator in (">=", "~=", ">", "==") and (lower is None or version > lower):
            lower = version
    return lower


def _requirement_from_name(name: str, version: str | None) -> tuple[str | None, str]:
    """CUDA requirement implied by one distribution (name + version) without looking at its deps."""
    data = load_compat()
    cname = canonicalize_name(name)
    parsed: Version | None = None
    if version:
        try:
            parsed = Version(version)
        except InvalidVersion:
            parsed = None
    for rx, template, unconfirmed in data.name_rules:
        m = rx.match(cname)
        if not m or unconfirmed:
            continue
        major = int(m["major"])
        evidence = template.format(major=major)
        base = m.groupdict().get("base")
        if (
            parsed is not None
            and base is not None
            and base in data.tracks_cuda_suffixed
            and parsed.major == major
            and len(parsed.release) > 1
        ):
            return f"{major}.{_major_minor(parsed)[1]}", f"{evidence} ({name} {version})"
        return str(major), evidence
    if parsed is not None and parsed.local:
        lm = data.local_version.match(parsed.local)
        if lm:
            return f"{int(lm['major'])}.{lm['minor']}", f"local version +{parsed.local}"
        return None, f"local version +{parsed.local} (not a CUDA build)"
    if cname in data.meta_packages:
        if parsed is None:
            return None, f"{name}: unparsable version {version!r}"
        return _fmt_mm(parsed), f"{name} meta package {version}"
    for row in data.unsuffixed:
        if row.name != cname:
            continue
        if parsed is None:
            return None, f"unsuffixed {name} with unparsable version {version!r}"
        if parsed >= row.min_version:
            if row.tracks_cuda and parsed.major == row.major and len(parsed.release) > 1:
                return _fmt_mm(parsed), f"unsuffixed {name} {version} (CUDA {row.major} naming)"
            return str(row.major), f"unsuffixed {name} {version} (CUDA {row.major} naming)"
        return None, f"unsuffixed {name} {version}: older than the CUDA {row.major} series; major unknown"
    return None, ""


def wheel_cuda_requirement(
    name: str, version: str, requires: Sequence[str] = (), paths: Sequence[str] = ()
) -> tuple[str | None, str]:
    """The CUDA version a distribution needs: ("13.0", evidence), ("13", evidence) when only the major is
    known, or (None, reason) when it is not a CUDA wheel.

    Evidence, in this order: the name (``-cu12``), the local version (``+cu130``), the ``cuda-toolkit``
    meta package's own version, the unsuffixed CUDA 13 names, the CUDA pins in Requires-Dist
    (``cuda-toolkit[...]==13.0.3``, ``nvidia-*-cu13``), then shipped paths (``nvidia/cu13/lib``).
    """
    cuda, evidence = _requirement_from_name(name, version)
    if cuda is not None or evidence.startswith("local version"):
        return cuda, evidence
    # Requires-Dist pins
    found: list[tuple[str, str, str]] = []  # (cuda, evidence, pinned name)
    for text, req in _req_pins(requires):
        pinned = _pinned_version(req)
        dep_cuda, _ = _requirement_from_name(req.name, str(pinned) if pinned is not None else None)
        if dep_cuda is None:
            continue
        spec = str(req.specifier)
        found.append((dep_cuda, f"pins {req.name}{spec}" if spec else f"requires {req.name}", text))
    if found:
        majors = {Version(c).major for c, _, _ in found}
        if len(majors) > 1:
            listed = "; ".join(ev for _, ev, _ in found)
            return None, f"requires packages of several CUDA majors ({listed})"
        # prefer the most precise (major.minor) and, among those, a meta package pin
        precise = [f for f in found if "." in f[0]]
        metas = [f for f in precise if canonicalize_name(Requirement(f[2]).name) in load_compat().meta_packages]
        best = (metas or precise or found)[0]
        return best[0], best[1]
    for path in paths:
        for rx, template in load_compat().install_dirs:
            m = rx.search(path.replace("\\", "/"))
            if m:
                return str(int(m["major"])), template.format(major=int(m["major"]))
    return None, evidence or "no CUDA evidence (name, version, requirements, paths)"


def wheel_cuda_flavour(
    name: str, version: str, requires: Sequence[str] = (), paths: Sequence[str] = ()
) -> tuple[int | None, str]:
    """(CUDA major, evidence) of a distribution; (None, reason) when it is not a CUDA wheel."""
    cuda, evidence = wheel_cuda_requirement(name, version, requires, paths)
    if cuda is None:
        return None, evidence
    return int(cuda.split(".")[0]), evidence


# --------------------------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class DriverVerdict:
    """Outcome of checking a CUDA requirement (or a GPU) against a driver.

    ``status``: "compatible"; "mvc" (works with a caveat: minor-version or forward compatibility; a
    warning); "incompatible" (a failure); "unknown" (no facts; ``message`` says why).
    """

    status: VerdictStatus
    message: str
    via: str | None = None  # "minor-version compatibility" / "forward compatibility" when status == "mvc"

    @property
    def failing(self) -> bool:
        return self.status == "incompatible"


def _driver_label(driver: DriverInfo) -> str:
    who = f"driver {driver.version}" if driver.version else "the driver"
    return f"{who} ({driver.source})" if driver.source in ("declared", "probed") else who


def _native_cuda(driver: DriverInfo) -> Version | None:
    if driver.forward_compat and driver.version:
        # NVML reports the CUDA version of the libcuda it loaded, i.e. the forward-compatibility one; what the
        # kernel driver itself supports comes from its branch
        kernel = cuda_for_driver(driver.version)
        if kernel is not None:
            return kernel
    if driver.cuda_version:
        try:
            return parse_cuda_version(driver.cuda_version)
        except ValueError:
            pass
    if driver.version:
        return cuda_for_driver(driver.version)
    return None


def _driver_version(driver: DriverInfo) -> Version | None:
    if not driver.version:
        return None
    try:
        return parse_driver_version(driver.version)
    except ValueError:
        return None


def _support_phrase(driver: DriverInfo, native: Version) -> str:
    text = f"{_driver_label(driver)} supports CUDA ≤ {_fmt_mm(native)}"
    dv = _driver_version(driver)
    floor = mvc_floor(native.major)
    if dv is not None and floor is not None and dv >= parse_driver_version(floor):
        text += f" ({native.major}.x via minor-version compatibility)"
    return text


def driver_verdict(required_cuda: str, driver: DriverInfo, *, subject: str = "") -> DriverVerdict:
    """Can ``driver`` run code built for CUDA ``required_cuda`` ("13.0", "12", "12.9.1")?

    ``subject`` names what needs it ("torch 2.14.1+cu130") in the message.  Raises RuleError for a
    malformed ``required_cuda``.
    """
    try:
        required = parse_cuda_version(required_cuda)
    except ValueError as e:
        raise RuleError(str(e)) from e
    req_major = required.major
    req_text = str(required) if len(required.release) > 1 else f"{req_major}"
    needs = f"{subject} needs CUDA {req_text}" if subject else f"CUDA {req_text} is required"
    native = _native_cuda(driver)
    dv = _driver_version(driver)
    if native is None:
        why = driver.reason or (
            f"driver {driver.version} is not in the compatibility data" if driver.version else "no driver facts"
        )
        return DriverVerdict("unknown", f"{needs}; cannot tell whether the driver supports it: {why}")
    support = _support_phrase(driver, native)
    if _major_minor(required) <= _major_minor(native):
        return DriverVerdict("compatible", f"{needs}; {support}")
    floor_text = mvc_floor(req_major)
    fwd = _forward_compat(driver, required)
    if req_major == native.major or (
        dv is not None and floor_text is not None and dv >= parse_driver_version(floor_text)
    ):
        if dv is not None and floor_text is not None and dv < parse_driver_version(floor_text):
            pass  # below the MVC floor of its own major (e.g. 450.51 with 11.x): fall through
        else:
            return DriverVerdict(
                "mvc",
                f"{needs}; {support}: it runs through minor-version compatibility with a limited feature set; "
                f"PTX newer than the driver (CUDA {_fmt_mm(native)}) cannot be JIT-compiled "
                "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION), and APIs needing a newer driver fail",
                via="minor-version compatibility",
            )
    if fwd is not None:
        return fwd
    if dv is not None and _beyond_data(dv) and floor_text is None:
        return DriverVerdict(
            "unknown",
            f"{needs}; {_driver_label(driver)} is newer than the compatibility data "
            f"(known to support CUDA ≥ {_fmt_mm(native)}); cannot tell",
        )
    if floor_text is not None:
        hint = f"CUDA {req_major} needs driver ≥ {floor_text}"
    else:
        hint = f"no driver in the compatibility data supports CUDA {req_major}"
    return DriverVerdict("incompatible", f"{needs}; {support}; {hint}")


def _forward_compat(driver: DriverInfo, required: Version) -> DriverVerdict | None:
    """A forward-compatibility libcuda (cuda-compat) newer than the kernel driver can lift the limit."""
    compat_version = driver.forward_compat
    if not compat_version:
        return None
    compat_cuda = cuda_for_driver(compat_version)
    if compat_cuda is None or _major_minor(compat_cuda) < _major_minor(required):
        return None
    if driver.gpus and all("geforce" in gpu.name.lower() for gpu in driver.gpus):
        return DriverVerdict(
            "incompatible",
            f"CUDA {required} is beyond {_driver_label(driver)}; the forward-compatibility libcuda "
            f"{compat_version} does not help on GeForce GPUs ({', '.join(g.name for g in driver.gpus)}): "
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804)",
        )
    return DriverVerdict(
        "mvc",
        f"CUDA {required} is beyond {_driver_label(driver)}, but a forward-compatibility libcuda "
        f"{compat_version} (CUDA {_fmt_mm(compat_cuda)}) is on the library path: this works only on "
        "data-center GPUs (and select NGC-Server-Ready RTX / Jetson), not GeForce "
        "(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, error 804)",
        via="forward compatibility",
    )


def gpu_verdict(cc: str, cuda_major: int) -> DriverVerdict:
    """Does CUDA ``cuda_major`` still support a GPU of compute capability ``cc`` ("7.0" or "sm_70")?

    V100 (7.0) with CUDA 13 is "incompatible"; an arch newer than the major's first release is too.
    Raises RuleError for a malformed ``cc``.
    """
    try:
        arch = normalize_arch(cc)
    except ValueError as e:
        raise RuleError(str(e)) from e
    key = _cc_of(arch)
    span = arch_cuda_range(key)
    if span is None:
        return DriverVerdict("unknown", f"compute capability {key} ({arch}) is not in the compatibility data")
    first, last = span
    if last is not None and cuda_major > last:
        return DriverVerdict(
            "incompatible",
            f"CUDA {cuda_major} no longer supports compute capability {key} ({arch}); the last CUDA major "
            f"supporting it is {last}",
        )
    if cuda_major < first:
        return DriverVerdict(
            "incompatible", f"compute capability {key} ({arch}) needs CUDA ≥ {first}; the stack has CUDA {cuda_major}"
        )
    return DriverVerdict("compatible", f"CUDA {cuda_major} supports compute capability {key} ({arch})")
