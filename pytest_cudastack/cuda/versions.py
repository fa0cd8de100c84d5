"""The one parser of CUDA versions, NVIDIA driver versions, GPU architectures and the specifiers over them.

Every option (``--cuda-max``, ``--cuda-driver``, ``--cuda-arch``), marker argument (``requires_driver(">=550")``,
``requires_gpu(arch=">=8.0")``) and row of ``data/cuda_compat.json`` is read here, so a value accepted in one
place is accepted everywhere.  The results are small frozen values; a malformed value raises the error class
the caller names (``OptionError`` by default for values, ``RuleError`` for marker specifiers), with a message
in the style of packaging's ``InvalidVersion``: what kind of value, the value itself, what was expected.

Grammars (whitespace around a value is ignored, letters are case-insensitive):

* CUDA version: ``MAJOR[.MINOR[.PATCH]]`` (``13``, ``12.9``, ``12.4.1``), as the toolkit's ``cuda.h``
  ``CUDA_VERSION`` and the release notes number them; options take ``MAJOR[.MINOR]`` only.
* driver version: ``BRANCH[.MINOR[.PATCH]]`` with a 3-4 digit branch (``550.54.15``, ``570.26``), as the
  ``.run`` installers and ``nvidia-smi`` print them, or a branch alone (``580``, ``R580``: NVIDIA names its
  driver branches "R580"), whose minor version is unknown.
* architecture: ``sm_XY``, ``compute_XY`` or bare ``XY`` (``X`` = major, ``Y`` = one-digit minor of the compute
  capability, as nvcc's ``-arch`` spells it), each with an optional ``a`` (arch-specific) or ``f``
  (family-specific) suffix, or the compute capability ``X.Y`` as NVML reports it.  ``compute_XY`` names the same
  GPU as ``sm_XY``; every arch is normalised to ``sm_XY[a|f]``.
* specifiers: PEP 440 specifier sets over those versions (``>=550``, ``==535.*``, ``>=12.4,<13``); a bare
  version means "at least" it.  An arch specifier compares compute capabilities (``>=8.0``, ``>=sm_80,<sm_100``);
  an arch requirement without an operator is a list of archs (``sm_90`` or ``sm_80,sm_86``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from pytest_cudastack.errors import CudaStackError, OptionError, RuleError

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

__all__ = [
    "Arch",
    "ArchSpec",
    "CudaVersion",
    "DriverVersion",
    "parse_arch",
    "parse_arch_list",
    "parse_arch_spec",
    "parse_cuda",
    "parse_cuda_spec",
    "parse_driver",
    "parse_driver_spec",
]

_CUDA_RE = re.compile(r"(?P<major>[1-9][0-9]?)(?:\.(?P<minor>[0-9]{1,3})(?:\.(?P<patch>[0-9]{1,3}))?)?")
_DRIVER_RE = re.compile(r"[Rr](?P<branch_only>[1-9][0-9]{2,3})|(?P<release>[1-9][0-9]{2,3}(?:\.[0-9]{1,4}){0,2})")
_ARCH_RE = re.compile(r"(?:sm_|compute_)?(?P<major>[1-9][0-9]?)(?P<minor>[0-9])(?P<suffix>[af]?)")
_CC_RE = re.compile(r"(?P<major>[1-9][0-9]?)\.(?P<minor>[0-9])(?P<suffix>[af]?)")
_ARCH_CLAUSE_RE = re.compile(r"(?P<op>~=|==|!=|<=|>=|<|>)\s*(?P<target>\S+)")
_MAJOR_WILDCARD_RE = re.compile(r"(?P<major>[1-9][0-9]?)\.\*")
_OPERATOR_START = "<>=!~"

_CUDA_EXPECTED = "expected MAJOR[.MINOR], e.g. 12.9 or 13"
_CUDA_PATCH_EXPECTED = "expected e.g. 12.9, 13 or 12.4.1"
_DRIVER_EXPECTED = "expected e.g. 550.54.15, 580 or R580"
_ARCH_EXPECTED = "expected e.g. sm_90, sm_100f or 9.0"

# --------------------------------------------------------------------------------------------- values


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class _Release:
    """Numbered release, compared as packaging compares versions: trailing zeros do not count (13 == 13.0)."""

    release: tuple[int, ...]

    def _key(self) -> tuple[int, ...]:
        key = self.release
        while len(key) > 1 and key[-1] == 0:
            key = key[:-1]
        return key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Release) or type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, _Release) or type(other) is not type(self):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    @property
    def major(self) -> int:
        return self.release[0]

    def as_version(self) -> Version:
        """The same number as a packaging ``Version``, for ``SpecifierSet.contains``."""
        # lazy: the plugin's option types come from this module in every pytest session; packaging (~7 ms)
        # only when a version is compared or a specifier parsed
        from packaging.version import Version

        return Version(".".join(str(n) for n in self.release))


@dataclass(frozen=True, eq=False)
class CudaVersion(_Release):
    """A CUDA version: ``13`` (major only), ``12.9``, ``12.4.1`` (a toolkit update).

    >>> v = parse_cuda("12.4.1")
    >>> v.major, v.minor, v.patch, v.mm, str(v)
    (12, 4, 1, (12, 4), '12.4.1')
    >>> parse_cuda("13").minor is None, parse_cuda("13") == parse_cuda("13.0")
    (True, True)
    """

    @property
    def minor(self) -> int | None:
        return self.release[1] if len(self.release) > 1 else None

    @property
    def patch(self) -> int | None:
        return self.release[2] if len(self.release) > 2 else None

    @property
    def mm(self) -> tuple[int, int]:
        """``(major, minor)``, a missing minor as 0: what CUDA compatibility is decided on."""
        return self.release[0], self.minor or 0

    def __str__(self) -> str:
        return ".".join(str(n) for n in self.release)


@dataclass(frozen=True, eq=False)
class DriverVersion(_Release):
    """An NVIDIA driver version, ``text`` as written (``450.80.02``; ``R580`` is written ``580``).

    ``branch_only`` for ``580`` / ``R580``: the branch is known, its minor version is not.

    >>> d = parse_driver(" R580 ")
    >>> d.branch, d.branch_only, str(d)
    (580, True, '580')
    >>> parse_driver("450.80.02") == parse_driver("450.80.2"), str(parse_driver("450.80.02"))
    (True, '450.80.02')
    """

    text: str

    @property
    def branch(self) -> int:
        return self.release[0]

    @property
    def branch_only(self) -> bool:
        return len(self.release) == 1

    def __str__(self) -> str:
        return self.text


class Arch(NamedTuple):
    """A GPU architecture: compute capability ``major.minor`` and nvcc's ``a`` / ``f`` suffix (or "").

    >>> a = parse_arch("compute_90a")
    >>> str(a), a.cc, a.number
    ('sm_90a', '9.0', 90)
    """

    major: int
    minor: int
    suffix: str = ""

    @property
    def cc(self) -> str:
        """The compute capability without the suffix: ``"9.0"``."""
        return f"{self.major}.{self.minor}"

    @property
    def number(self) -> int:
        """``90`` for ``sm_90a``: the number nvcc's ``sm_`` / ``compute_`` names carry (suffix dropped)."""
        return self.major * 10 + self.minor

    def __str__(self) -> str:
        return f"sm_{self.number}{self.suffix}"


@dataclass(frozen=True)
class ArchSpec:
    """``requires_gpu(arch=...)``: a specifier over compute capabilities, or a list of archs (suffixes ignored).

    ``str`` is what a reason shows: ``>=8.0`` or ``sm_80,sm_86``.
    """

    specifier: SpecifierSet | None = None
    archs: tuple[Arch, ...] = ()

    def __str__(self) -> str:
        if self.specifier is not None:
            return str(self.specifier)
        return ",".join(str(a) for a in self.archs)


# --------------------------------------------------------------------------------------------- parsers


def parse_cuda(
    text: str | CudaVersion, *, patch: bool = True, error: type[CudaStackError] = OptionError
) -> CudaVersion:
    """A CUDA version; ``patch=False`` (options) refuses a patch level.

    >>> parse_cuda("12.9"), parse_cuda(" 13 ")
    (CudaVersion(release=(12, 9)), CudaVersion(release=(13,)))
    >>> parse_cuda("twelve")
    Traceback (most recent call last):
    ...
    pytest_cudastack.errors.OptionError: invalid CUDA version 'twelve' (expected e.g. 12.9, 13 or 12.4.1)
    >>> parse_cuda("12.9.1", patch=False)
    Traceback (most recent call last):
    ...
    pytest_cudastack.errors.OptionError: invalid CUDA version '12.9.1' (expected MAJOR[.MINOR], e.g. 12.9 or 13)
    """
    if isinstance(text, CudaVersion):
        return text
    m = _CUDA_RE.fullmatch(str(text).strip())
    if m is None or (m["patch"] is not None and not patch):
        raise error(f"invalid CUDA version {text!r} ({_CUDA_PATCH_EXPECTED if patch else _CUDA_EXPECTED})")
    return CudaVersion(tuple(int(n) for n in m.group("major", "minor", "patch") if n is not None))


def parse_driver(text: str | DriverVersion, *, error: type[CudaStackError] = OptionError) -> DriverVersion:
    """An NVIDIA driver version, or a branch (``580``, ``R580``).

    >>> parse_driver("550.54.15")
    DriverVersion(release=(550, 54, 15), text='550.54.15')
    >>> parse_driver("12.9.1")
    Traceback (most recent call last):
    ...
    pytest_cudastack.errors.OptionError: invalid NVIDIA driver version '12.9.1' (expected e.g. 550.54.15, 580 or R580)
    """
    if isinstance(text, DriverVersion):
        return text
    m = _DRIVER_RE.fullmatch(str(text).strip())
    if m is None:
        raise error(f"invalid NVIDIA driver version {text!r} ({_DRIVER_EXPECTED})")
    written = m["branch_only"] or m["release"]
    return DriverVersion(tuple(int(n) for n in written.split(".")), written)


def parse_arch(text: str | Arch, *, error: type[CudaStackError] = OptionError) -> Arch:
    """A GPU architecture in any of nvcc's or NVML's spellings.

    >>> [str(parse_arch(a)) for a in ("sm_90", "10.0", "SM_100f", "86", "compute_120a")]
    ['sm_90', 'sm_100', 'sm_100f', 'sm_86', 'sm_120a']
    >>> parse_arch("sm_9")
    Traceback (most recent call last):
    ...
    pytest_cudastack.errors.OptionError: invalid GPU architecture 'sm_9' (expected e.g. sm_90, sm_100f or 9.0)
    """
    if isinstance(text, Arch):
        return text
    value = str(text).strip().lower()
    m = _CC_RE.fullmatch(value) or _ARCH_RE.fullmatch(value)
    if m is None:
        raise error(f"invalid GPU architecture {text!r} ({_ARCH_EXPECTED})")
    return Arch(int(m["major"]), int(m["minor"]), m["suffix"])


def parse_arch_list(value: str | Iterable[str], *, error: type[CudaStackError] = OptionError) -> tuple[Arch, ...]:
    """``"sm_80,sm_90"``, ``"8.0, 90"`` or several such strings: the archs in order, each once.

    >>> [str(a) for a in parse_arch_list(["sm_90", "9.0,sm_100"])]
    ['sm_90', 'sm_100']
    >>> parse_arch_list(",")
    Traceback (most recent call last):
    ...
    pytest_cudastack.errors.OptionError: invalid GPU architecture list ',' (expected e.g. sm_80,sm_90)
    """
    parts = value.split(",") if isinstance(value, str) else [p for v in value for p in str(v).split(",")]
    archs = tuple(dict.fromkeys(parse_arch(p, error=error) for p in parts if p.strip()))
    if not archs:
        raise error(f"invalid GPU architecture list {value!r} (expected e.g. sm_80,sm_90)")
    return archs


def _version_spec(text: str, what: str, example: str, parse: Callable[[str], _Release]) -> SpecifierSet:
    # lazy: as in _Release.as_version
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    value = str(text).strip()
    if not value:
        raise RuleError(f"empty {what} specifier")
    if value[0] not in _OPERATOR_START:
        try:
            return SpecifierSet(f">={parse(value)}")  # a bare version means "at least"
        except CudaStackError as e:
            raise RuleError(f"invalid {what} specifier {text!r}: {e}") from e
    try:
        specs = SpecifierSet(value)
    except InvalidSpecifier:
        raise RuleError(f"invalid {what} specifier {text!r} (expected e.g. {example})") from None
    for spec in specs:
        if spec.operator == "===":
            raise RuleError(f"invalid {what} specifier {text!r}: '===' compares text, not versions")
        try:
            parse(spec.version.removesuffix(".*"))
        except CudaStackError as e:
            raise RuleError(f"invalid {what} specifier {text!r}: {e}") from e
    return specs


def parse_driver_spec(text: str) -> SpecifierSet:
    """``requires_driver(spec)``: a specifier set over driver versions; a bare version means ">=".

    >>> parse_driver_spec("550"), parse_driver_spec("R580"), parse_driver_spec("==535.*")
    (<SpecifierSet('>=550')>, <SpecifierSet('>=580')>, <SpecifierSet('==535.*')>)
    >>> parse_driver_spec(">=12")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pytest_cudastack.errors.RuleError: invalid driver version specifier '>=12': invalid NVIDIA driver version '12' (...)
    """
    return _version_spec(text, "driver version", "'>=550' or '==535.*'", lambda v: parse_driver(v, error=RuleError))


def parse_cuda_spec(text: str) -> SpecifierSet:
    """``requires_cuda(spec)``: a specifier set over CUDA versions; a bare version means ">=".

    >>> parse_cuda_spec("12.4"), parse_cuda_spec(">=12.4,<13")
    (<SpecifierSet('>=12.4')>, <SpecifierSet('<13,>=12.4')>)
    >>> parse_cuda_spec("~~12")
    Traceback (most recent call last):
    ...
    pytest_cudastack.errors.RuleError: invalid CUDA version specifier '~~12' (expected e.g. '>=12.4' or '==12.*')
    """
    return _version_spec(text, "CUDA version", "'>=12.4' or '==12.*'", lambda v: parse_cuda(v, error=RuleError))


def parse_arch_spec(text: str) -> ArchSpec:
    """``requires_gpu(arch=...)``: ``>=8.0`` / ``>=sm_80,<sm_100`` (compute capabilities) or ``sm_80,sm_86``.

    >>> str(parse_arch_spec(">=sm_80,<10.0")), str(parse_arch_spec("sm_86, 8.0"))
    ('<10.0,>=8.0', 'sm_86,sm_80')
    >>> parse_arch_spec(">=8")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pytest_cudastack.errors.RuleError: invalid arch specifier '>=8': invalid GPU architecture '8' (...)
    """
    value = str(text).strip()
    if not value:
        raise RuleError("empty arch requirement")
    if value[0] not in _OPERATOR_START:
        try:
            return ArchSpec(archs=parse_arch_list(value, error=RuleError))
        except RuleError as e:
            raise RuleError(f"invalid arch requirement {text!r}: {e}") from e
    clauses: list[str] = []
    for clause in value.split(","):
        m = _ARCH_CLAUSE_RE.fullmatch(clause.strip())
        if m is None:
            raise RuleError(f"invalid arch specifier {text!r} (expected e.g. '>=8.0', '>=sm_80,<sm_100' or '==9.*')")
        wildcard = _MAJOR_WILDCARD_RE.fullmatch(m["target"])
        if wildcard is not None and m["op"] in ("==", "!="):
            clauses.append(f"{m['op']}{int(wildcard['major'])}.*")
            continue
        try:
            clauses.append(f"{m['op']}{parse_arch(m['target'], error=RuleError).cc}")
        except RuleError as e:
            raise RuleError(f"invalid arch specifier {text!r}: {e}") from e
    # lazy: as in _Release.as_version
    from packaging.specifiers import SpecifierSet

    return ArchSpec(specifier=SpecifierSet(",".join(clauses)))
