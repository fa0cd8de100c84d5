"""Framework version rules and the versions CUDA libraries report, from ``data/framework_rules.json``.

Two tables, every row citing a source listed in the file's ``sources`` (validated on load, as
:mod:`pytest_cudastack.cuda.compat` validates its file):

* ``libraries``: one CUDA library each (cuDNN, NCCL, cuBLAS, ...): the wheel that ships it (``nvidia-cudnn``
  stands for ``nvidia-cudnn`` and every ``nvidia-cudnn-cuNN``), the stems of its sonames (``libcudnn``
  matches ``libcudnn.so.9`` and ``libcudnn_ops.so.9``: the stem itself or the stem then ``_``), and how many
  leading components of the wheel's version the library reports at run time (``reports``: nvidia-cudnn-cu12
  9.19.0.56 reports (9, 19, 0)), plus the header and macros that state it in an unowned install;
* ``rules``: how a framework judges one library, of four kinds, each judged on reported versions:

  - ``build_match`` (torch and cuDNN): same major as the build, minor not lower;
  - ``pin_floor`` (torch and NCCL): not older than the build;
  - ``floor``: not older than ``min``;
  - ``undecidable``: the framework's check needs a fact no file states; its ``reason`` says which; ``bad``
    names a version the framework refuses unless it is the build's own (JAX and cuDNN 9.10.0), quoted with
    ``says`` when the loaded copy is that version;
  - ``loads_by_name`` (cupy >= 14 and cuBLAS, NVRTC): the framework, built for CUDA ``major``, loads
    ``soname`` by name at run time (cuda-pathfinder), so some installed copy of that soname must exist;
  - ``wheel_floor`` (cupy 13.5 to 13.x and NCCL, cuTENSOR): the framework preloads the library from its wheel
    ``<wheel>-cu<major>`` only when that wheel has the major and is not older than the ``min_pypi_version``
    its ``build_file`` (a JSON file: cupy/.data/_wheel.json, with the CUDA major under ``cuda``) states for
    the rule's library; else it falls back to the linker's search;
  - ``provider`` (onnxruntime-gpu's CUDA execution provider): the framework dlopens ``provider`` (a path in
    its site directory) at run time and falls back to another provider when that fails; every library of
    the table (``library`` ``"*"``) its closure needs must be found.

  The *build* version is read from the framework's files, in the order its ``build`` lists (default
  ``pin``): ``pin``, the wheel its active Requires-Dist pins (torch pins the nvidia wheels it was built
  against); ``declared``, the lowest version its METADATA accepts for that library's wheel, any extra (JAX's
  CUDA plugin declares the cuDNN it was built against as its with-cuda floor, TensorFlow's and-cuda extra pins
  it); ``files``, the soname major its shipped libraries name in DT_NEEDED or read-only strings
  (``libcudnn.so.9``: it was built against cuDNN 9, whatever else is declared); ``build_file``, the
  ``<library>_version`` its ``build_file`` states (TensorFlow's build_info.py). The checks find it and the copy
  the framework would load. ``skip_env`` names the environment variable that turns the framework's check off;
  ``silent`` says a failed check drops the GPU without an error (JAX registers no CUDA backend and runs on the
  CPU), so its severity follows whether the project imports the framework.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from pytest_cudastack.cuda.datafile import DataShape, check_data, check_row, check_template, shipped_json
from pytest_cudastack.errors import DataError

__all__ = [
    "ANY_LIBRARY",
    "BUILD_FROM",
    "DATA_FILE",
    "KINDS",
    "VERSION_KINDS",
    "FrameworkRules",
    "LibraryRow",
    "Rule",
    "Verdict",
    "framework_says",
    "judge",
    "load_rules",
    "reported_version",
    "says_text",
    "validate_rules",
    "version_text",
]

DATA_FILE = "data/framework_rules.json"
KINDS = ("build_match", "pin_floor", "floor", "undecidable", "loads_by_name", "provider", "wheel_floor")
VERSION_KINDS = ("build_match", "pin_floor", "floor")  # judged on reported versions by judge()
ANY_LIBRARY = "*"  # a provider rule's library: every library of the table

SHAPE = DataShape(
    "framework_rules.schema.json", {"libraries": ("library",), "rules": ("framework", "versions", "library")}
)
_LIB_KEYS = frozenset({"library", "name", "wheel", "sonames", "reports", "header", "macros", "source"})
_RULE_KEYS = frozenset(
    {
        "framework",
        "versions",
        "library",
        "kind",
        "min",
        "skip_env",
        "says",
        "reason",
        "build_file",
        "build_keys",
        "soname",
        "major",
        "provider",
        "bad",
        "build",
        "silent",
        "source",
    }
)
BUILD_FROM = ("pin", "declared", "files", "build_file")  # where a rule's build version is read, in order
_CU_SUFFIX = re.compile(r"-cu\d+$")

VersionTuple = tuple[int, ...]
_BUILD_PLACES = {
    "pin": "its Requires-Dist pin",
    "declared": "the floor its METADATA declares for the library's wheel, any extra",
    "files": "the soname its libraries name",
    "build_file": "its build file",
}
SAYS_FIELDS = ("build", "runtime", "build_dotted", "runtime_dotted")  # the fields a rule's 'says' may name


def version_text(v: VersionTuple) -> str:
    """``(9, 24, 0)`` as torch prints it."""
    return "(" + ", ".join(str(x) for x in v) + ")"


@dataclass(frozen=True)
class LibraryRow:
    """One CUDA library: ``library`` id, display ``name``, its wheel, soname stems, what it reports."""

    library: str
    name: str
    wheel: str
    sonames: tuple[str, ...]
    reports: int | None  # leading components of the wheel version the library reports; None: unknown
    header: str | None
    macros: tuple[str, ...]
    source: str

    def matches_wheel(self, name: str) -> bool:
        """``nvidia-cudnn-cu12`` and ``nvidia-cudnn`` for the row ``nvidia-cudnn``."""
        return _CU_SUFFIX.sub("", canonicalize_name(name)) == self.wheel

    def matches_soname(self, soname: str) -> bool:
        """``libcudnn.so.9``, ``libcudnn_ops.so.9`` for the stem ``libcudnn``; not ``libcudnnx.so``."""
        stem = soname.split(".so", 1)[0]
        return any(stem == s or stem.startswith(s + "_") for s in self.sonames)


@dataclass(frozen=True)
class Rule:
    """How ``framework`` (a distribution name, within ``versions``) judges ``library``."""

    framework: str
    versions: SpecifierSet
    library: str
    kind: str
    minimum: VersionTuple | None
    skip_env: str | None
    says: str
    reason: str
    source: str
    build_file: str | None = None  # a file of the framework's wheel stating its build (read, never imported)
    build_keys: tuple[str, ...] = ()  # the keys of that file worth quoting
    soname: str | None = None  # loads_by_name: the soname the framework loads at run time
    major: int | None = None  # loads_by_name: the CUDA major the framework is built for
    provider: str | None = None  # provider: the library (inside the site directory) it dlopens at run time
    bad: VersionTuple | None = None  # undecidable: a version refused unless it is the build's (JAX's cuDNN 9.10.0)
    build_from: tuple[str, ...] = ("pin",)  # where the build version is read (BUILD_FROM), first that says it
    silent: bool = False  # a failed check drops the GPU without an error (JAX falls back to the CPU)

    def applies(self, name: str, version: str) -> bool:
        if canonicalize_name(name) != self.framework:
            return False
        try:
            return self.versions.contains(Version(version), prereleases=True)
        except ValueError:  # InvalidVersion, or a number over the digit limit
            return not str(self.versions)


@dataclass(frozen=True)
class Verdict:
    """A rule judged: ``ok`` True/False, or None when it cannot be decided; ``text`` says why."""

    ok: bool | None
    text: str


@dataclass(frozen=True)
class FrameworkRules:
    libraries: tuple[LibraryRow, ...]
    rules: tuple[Rule, ...]
    sources: Mapping[str, Mapping[str, str]]

    def library(self, library_id: str) -> LibraryRow | None:
        return next((row for row in self.libraries if row.library == library_id), None)

    def library_for_soname(self, soname: str) -> LibraryRow | None:
        """The library whose soname stems match ``soname`` (the longest stem wins)."""
        hits = [(max(len(s) for s in row.sonames), row) for row in self.libraries if row.matches_soname(soname)]
        return max(hits, key=lambda h: h[0])[1] if hits else None

    def library_for_wheel(self, name: str) -> LibraryRow | None:
        return next((row for row in self.libraries if row.matches_wheel(name)), None)

    def rules_for(self, name: str, version: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.applies(name, version))


def reported_version(row: LibraryRow, wheel_version: str) -> VersionTuple | None:
    """What the library of a wheel of ``wheel_version`` reports at run time (None: unknown)."""
    if row.reports is None:
        return None
    try:
        release = Version(wheel_version).release
    except ValueError:  # InvalidVersion, or a number over the digit limit
        return None
    return tuple((*release, 0, 0, 0)[: row.reports])


def judge(rule: Rule, build: VersionTuple | None, runtime: VersionTuple | None) -> Verdict:
    """``rule`` for a framework built against ``build`` that would load ``runtime`` (reported versions)."""
    if rule.kind == "undecidable":
        return Verdict(None, f"cannot be decided statically because {rule.reason}")
    if rule.kind not in VERSION_KINDS:
        return Verdict(None, f"a {rule.kind} rule is judged on the installed files, not on versions")
    if runtime is None:
        return Verdict(None, "cannot be decided statically because the loaded copy's version is not readable")
    if rule.kind == "floor":
        floor = rule.minimum or ()
        return Verdict(runtime[: len(floor)] >= floor, f"needs at least {version_text(floor)}")
    if build is None:
        if rule.build_from == ("pin",):
            return Verdict(
                None,
                "cannot be decided statically because its metadata pins no wheel of it (the build version is "
                "compiled into its binaries)",
            )
        return Verdict(
            None,
            "cannot be decided statically because no file states the version it was built against (the "
            f"places read: {', '.join(_BUILD_PLACES[b] for b in rule.build_from)})",
        )
    if rule.kind == "pin_floor":
        return Verdict(runtime >= build[: len(runtime)], f"built against {version_text(build)}")
    # build_match: torch/backends/cudnn/__init__.py _init(), for cuDNN >= 7 on CUDA; XLA's cuda_dnn.cc
    # IsSourceCompatibleWithCudnnLibrary (jax's CUDA plugin, TensorFlow) is the same test
    if build and runtime and build[0] != runtime[0]:
        return Verdict(False, f"compiled against {version_text(build)}: needs the same major and a minor not lower")
    if len(runtime) < 2 or len(build) < 2:
        return Verdict(
            None,
            f"cannot be decided statically because the minor of the {'build' if len(build) < 2 else 'loaded copy'} "
            "is stated by no file (its major matches)",
        )
    ok = runtime[0] == build[0] and runtime[1] >= build[1]
    return Verdict(ok, f"compiled against {version_text(build)}: needs the same major and a minor not lower")


def says_text(rule: Rule, build: VersionTuple | None, runtime: VersionTuple | None) -> str:
    """The rule's ``says`` for these versions: ``{build}``/``{runtime}`` as torch prints them ("(9, 24, 0)"),
    ``{build_dotted}``/``{runtime_dotted}`` as XLA does ("9.24.0"); "unknown" for a version not known."""
    shown = {
        "build": version_text(build) if build is not None else "unknown",
        "runtime": version_text(runtime) if runtime is not None else "unknown",
        "build_dotted": ".".join(map(str, build)) if build is not None else "unknown",
        "runtime_dotted": ".".join(map(str, runtime)) if runtime is not None else "unknown",
    }
    return rule.says.format(**shown)


def framework_says(
    data: FrameworkRules,
    name: str,
    version: str,
    library: str,
    build: VersionTuple | None,
    runtime: VersionTuple | None,
) -> str:
    """The framework's own failure message when one of its rules on ``library`` fails for these versions
    ("cuDNN version incompatibility: PyTorch was compiled against (9, 24, 0) but found runtime version
    (9, 19, 0)"), else ""."""
    for rule in data.rules_for(name, version):
        if rule.library == library and judge(rule, build, runtime).ok is False:
            return says_text(rule, build, runtime)
    return ""


# --------------------------------------------------------------------------------------------- validation


def _tuple(text: Any, where: str, key: str = "min") -> VersionTuple:
    if not isinstance(text, str) or not re.fullmatch(r"\d+(\.\d+){0,3}", text):
        raise DataError(f"{where}: '{key}' must be a dotted version such as '12.1.0', got {text!r}")
    return tuple(int(x) for x in text.split("."))


def _str_list(value: Any, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(x, str) and x for x in value):
        raise DataError(f"{where}: '{key}' must be a non-empty list of strings")
    return tuple(value)


def _library(raw: Any, i: int, source: str, sources: Mapping[str, Any]) -> LibraryRow:
    where = f"{source}: libraries[{i}]"
    raw = check_row(raw, where, _LIB_KEYS, ("library", "name", "wheel", "source"), sources)
    if canonicalize_name(raw["wheel"]) != raw["wheel"] or _CU_SUFFIX.search(raw["wheel"]):
        raise DataError(f"{where}: 'wheel' must be a canonical name without -cuNN, got {raw['wheel']!r}")
    stems = _str_list(raw.get("sonames"), where, "sonames")
    if any(not s.startswith("lib") or ".so" in s for s in stems):
        raise DataError(f"{where}: 'sonames' are stems such as 'libcudnn' (no '.so')")
    reports = raw.get("reports")
    if reports is not None and (isinstance(reports, bool) or not isinstance(reports, int) or not 1 <= reports <= 4):
        raise DataError(f"{where}: 'reports' must be 1..4 (leading version components), got {reports!r}")
    header = raw.get("header")
    macros: tuple[str, ...] = ()
    if header is not None:
        if not isinstance(header, str) or "/" in header or not header.endswith(".h"):
            raise DataError(f"{where}: 'header' must be a header file name, got {header!r}")
        macros = _str_list(raw.get("macros"), where, "macros")
        if reports is None or len(macros) != reports:
            raise DataError(f"{where}: 'macros' must name one macro per reported component ({reports})")
    elif "macros" in raw:
        raise DataError(f"{where}: 'macros' without 'header'")
    return LibraryRow(raw["library"], raw["name"], raw["wheel"], stems, reports, header, macros, raw["source"])


def _check_kind(raw: dict[str, Any], where: str, libraries: Mapping[str, LibraryRow]) -> str:
    """The rule's ``kind``, and its ``library`` one of the table's (``*`` for kind provider only)."""
    kind = str(raw["kind"])
    if kind not in KINDS:
        raise DataError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
    if (raw["library"] == ANY_LIBRARY) != (kind == "provider"):
        raise DataError(f"{where}: library '{ANY_LIBRARY}' is for kind 'provider' only, which needs it")
    if raw["library"] not in libraries and raw["library"] != ANY_LIBRARY:
        raise DataError(f"{where}: library {raw['library']!r} is not in 'libraries'")
    for key, owner in (("soname", "loads_by_name"), ("major", "loads_by_name"), ("provider", "provider")):
        if key in raw and kind != owner:
            raise DataError(f"{where}: '{key}' belongs to kind '{owner}' only")
    if kind in ("build_match", "pin_floor") and libraries[raw["library"]].reports is None:
        raise DataError(f"{where}: kind {kind!r} needs a library whose reported version is known ('reports')")
    return kind


def _check_loads(raw: dict[str, Any], where: str, kind: str, libraries: Mapping[str, LibraryRow]) -> None:
    """A loads_by_name rule's ``soname`` (one of its library's) and ``major``; a provider's ``provider`` path."""
    soname, major, provider = raw.get("soname"), raw.get("major"), raw.get("provider")
    if kind == "loads_by_name":
        if not isinstance(soname, str) or not re.fullmatch(r"lib[\w+-]+\.so\.\d+", soname):
            raise DataError(f"{where}: 'soname' must be a versioned soname such as 'libcublas.so.12', got {soname!r}")
        if not libraries[raw["library"]].matches_soname(soname):
            raise DataError(f"{where}: soname {soname!r} is not one of {raw['library']!r}'s")
        if isinstance(major, bool) or not isinstance(major, int) or not 1 <= major <= 99:
            raise DataError(f"{where}: 'major' must be a CUDA major version (an integer), got {major!r}")
    if kind == "wheel_floor" and not str(raw.get("build_file", "")).endswith(".json"):
        raise DataError(f"{where}: a wheel_floor rule reads its 'build_file', a JSON file such as _wheel.json")
    if kind == "provider" and (
        not isinstance(provider, str) or provider.startswith("/") or ".." in provider.split("/")
    ):
        raise DataError(f"{where}: 'provider' must be a path inside the site directory, got {provider!r}")


def _check_versions(raw: dict[str, Any], where: str, kind: str) -> tuple[VersionTuple | None, VersionTuple | None]:
    """The rule's ``bad`` version (an undecidable rule's, with its ``says``) and ``min`` (a floor's)."""
    bad = None
    if "bad" in raw:
        if kind != "undecidable" or not raw.get("says"):
            raise DataError(f"{where}: 'bad' belongs to an undecidable rule with its 'says'")
        bad = _tuple(raw["bad"], where, "bad")
    minimum = _tuple(raw.get("min"), where) if kind == "floor" else None
    if kind != "floor" and "min" in raw:
        raise DataError(f"{where}: 'min' belongs to kind 'floor' only")
    return bad, minimum


def _check_says(raw: dict[str, Any], where: str, kind: str) -> None:
    """An undecidable rule's ``reason``, a decidable one's ``says`` (a template of build and runtime)."""
    if kind == "undecidable":
        if not isinstance(raw.get("reason"), str) or not raw["reason"]:
            raise DataError(f"{where}: an undecidable rule needs its 'reason'")
    elif not isinstance(raw.get("says"), str) or not raw["says"]:
        raise DataError(f"{where}: a decidable rule needs 'says' (the framework's own message)")
    if isinstance(raw.get("says"), str):
        check_template(raw["says"], set(SAYS_FIELDS), f"{where}: 'says'")


def _build_source(raw: dict[str, Any], where: str) -> tuple[str | None, tuple[str, ...]]:
    """The ``build_file`` (inside the site directory) and the ``build_keys`` read from it."""
    build_file = raw.get("build_file")
    if build_file is None:
        if "build_keys" in raw:
            raise DataError(f"{where}: 'build_keys' without 'build_file'")
        return None, ()
    if not isinstance(build_file, str) or build_file.startswith("/") or ".." in build_file.split("/"):
        raise DataError(f"{where}: 'build_file' must be a path inside the site directory, got {build_file!r}")
    return build_file, _str_list(raw.get("build_keys"), where, "build_keys")


def _check_build(raw: dict[str, Any], where: str, kind: str) -> tuple[tuple[str, ...], bool]:
    """A version rule's ``build`` (where its build version is read: BUILD_FROM, in order) and ``silent``."""
    build = raw.get("build", ["pin"])
    if (
        not isinstance(build, list)
        or not build
        or any(b not in BUILD_FROM for b in build)
        or len(set(build)) < len(build)
    ):
        raise DataError(f"{where}: 'build' must list some of {', '.join(BUILD_FROM)}, once each, got {build!r}")
    if "build" in raw and kind not in VERSION_KINDS:
        # a floor ignores the build's version, but its major says which copy a load by name gets
        raise DataError(f"{where}: 'build' belongs to kinds {', '.join(VERSION_KINDS)} only")
    if "build_file" in build and "build_file" not in raw:
        raise DataError(f"{where}: 'build' reads 'build_file', which the rule does not name")
    silent = raw.get("silent", False)
    if not isinstance(silent, bool):
        raise DataError(f"{where}: 'silent' must be true or false, got {silent!r}")
    return tuple(build), silent


def _rule(raw: Any, i: int, source: str, sources: Mapping[str, Any], libraries: Mapping[str, LibraryRow]) -> Rule:
    """One rule row, each of its parts checked for its kind."""
    where = f"{source}: rules[{i}]"
    raw = check_row(raw, where, _RULE_KEYS, ("framework", "library", "kind", "source"), sources)
    kind = _check_kind(raw, where, libraries)
    try:
        versions = SpecifierSet(raw.get("versions", ""))
    except (InvalidSpecifier, TypeError) as e:
        raise DataError(f"{where}: 'versions' is not a version specifier: {e}") from e
    _check_loads(raw, where, kind, libraries)
    bad, minimum = _check_versions(raw, where, kind)
    _check_says(raw, where, kind)
    skip_env = raw.get("skip_env")
    if skip_env is not None and (not isinstance(skip_env, str) or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", skip_env)):
        raise DataError(f"{where}: 'skip_env' must be an environment variable name, got {skip_env!r}")
    name = raw["framework"]
    if canonicalize_name(name) != name:
        raise DataError(f"{where}: 'framework' must be a canonical distribution name, got {name!r}")
    build_file, build_keys = _build_source(raw, where)
    build_from, silent = _check_build(raw, where, kind)
    return Rule(
        name,
        versions,
        raw["library"],
        kind,
        minimum,
        skip_env,
        raw.get("says", ""),
        raw.get("reason", ""),
        raw["source"],
        build_file,
        build_keys,
        raw.get("soname"),
        raw.get("major"),
        raw.get("provider"),
        bad,
        build_from,
        silent,
    )


def validate_rules(raw: Any, source: str = DATA_FILE) -> FrameworkRules:
    """Check the raw JSON object of the rules file and build :class:`FrameworkRules`; ``DataError`` naming
    ``source`` and the row otherwise (unknown keys, unlisted sources, bad kinds, versions or names, a library
    or rule given twice)."""
    raw = check_data(raw, source, SHAPE)
    sources = raw["sources"]
    raw_libs, raw_rules = raw["libraries"], raw["rules"]
    libraries: dict[str, LibraryRow] = {}
    for i, item in enumerate(raw_libs):
        row = _library(item, i, source, sources)
        clash = next((o for o in libraries.values() if o.wheel == row.wheel or set(o.sonames) & set(row.sonames)), None)
        if clash is not None:
            raise DataError(f"{source}: libraries[{i}]: wheel or soname stem already claimed by {clash.library!r}")
        libraries[row.library] = row
    rules: list[Rule] = []
    seen: set[tuple[str, str, str]] = set()
    for i, item in enumerate(raw_rules):
        rule = _rule(item, i, source, sources, libraries)
        key = (rule.framework, str(rule.versions), rule.library)
        if key in seen:
            raise DataError(f"{source}: rules[{i}]: a rule for {rule.framework} and {rule.library} given twice")
        seen.add(key)
        rules.append(rule)
    return FrameworkRules(tuple(libraries.values()), tuple(rules), sources)


@functools.lru_cache(maxsize=1)
def load_rules() -> FrameworkRules:
    """Load and validate the shipped rules file (cached)."""
    raw = shipped_json(DATA_FILE)
    return validate_rules(raw, DATA_FILE)
