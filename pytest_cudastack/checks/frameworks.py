"""Framework version rules (framework_rules.json's ``rules``) applied to the copies each framework loads.

For an installed framework distribution (torch, jax-cuda12-plugin, ...) and each of its rules:

* the *runtime* version: the copy of the library its extension modules' closures load (the resolver's
  winner, shadowing included), read by :func:`pytest_cudastack.checks.shadow.copy_version`; a library no
  closure reaches (loaded by name at run time, as the JAX plugin preloads the nvidia wheels) is the
  installed wheel of that library, first in search order;
* the *build* version: what the framework's files state, in the places its rule's ``build`` lists: the
  version its own Requires-Dist pins for that library's wheel (torch 2.14.1 pins nvidia-cudnn-cu13==9.24.0.43:
  built against (9, 24, 0)), the floor its METADATA declares (jax-cuda12-plugin 0.6.0: nvidia-cudnn-cu12>=9.8
  under its with-cuda extra), the soname major its libraries name (``libcudnn.so.9``), its build file.

The sonames of a library the framework's own libraries name (DT_NEEDED or read-only strings) are its floor:
the copy judged is the one loaded under such a name; when none of them is found anywhere the load itself
fails, which the dlopen item (a run-time load) or the closure item (a DT_NEEDED) reports, so no rule on that
library speaks. A ``silent`` rule's ERROR (the framework drops the GPU and runs on: JAX) stays an ERROR when
the project imports the framework or a distribution requiring it (``jax`` for its CUDA plugin), else it is a
WARNING naming that import.

A rule the framework breaks is an ERROR quoting the framework's own message; an undecidable rule, or one
whose versions are not readable, is an INFO that says why ("cannot be decided statically because ...");
a rule whose ``skip_env`` is set in this environment is an INFO saying the framework skips it.

Three kinds are judged on the installed files instead of versions:

* ``wheel_floor`` (cupy 13.5 to 13.x preloading NCCL and cuTENSOR): a WARNING when the ``<wheel>-cu<major>``
  wheel its _wheel.json names is of another major or older than the ``min_pypi_version`` it states (cupy
  passes it over and takes whatever the linker's search finds); silent when it meets it or is not installed;

* ``loads_by_name`` (cupy >= 14, which loads cuBLAS and NVRTC through cuda-pathfinder): a WARNING when the
  soname of the CUDA major in cupy's package name (cupy-cuda12x: libcublas.so.12) is in no installed wheel
  and not on the linker's search path while wheels of that library ship another major; silent when a wheel
  or the search path has it, or when a closure of cupy's modules already misses it (the closure item's);
* ``provider`` (onnxruntime-gpu's libonnxruntime_providers_cuda.so, dlopened at session creation): a
  WARNING naming the CUDA sonames its closure does not find (the session then runs on the CPU without an
  error); silent when the provider is absent or finds them all.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from pytest_cudastack._sysio import read_text
from pytest_cudastack.checks.shadow import Copy, copy_version, loaded_libraries, providers, shadowing
from pytest_cudastack.cuda.dlopen import load_preloads
from pytest_cudastack.cuda.frameworks import (
    FrameworkRules,
    Rule,
    Verdict,
    judge,
    load_rules,
    reported_version,
    says_text,
    version_text,
)
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import Finding, Pip, Remedy, Severity, UseBuild, manual
from pytest_cudastack.linker.resolver import Library
from pytest_cudastack.model.reach import top_level_names
from pytest_cudastack.wheels.ownership import pip_python
from pytest_cudastack.wheels.requirements import Requirements

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.frameworks import LibraryRow
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = ["Build", "build_info", "framework_findings", "named_sonames", "run"]

_CHECK = "requirements"
_BUILD_FILE_LIMIT = 1 << 20  # TensorFlow's build_info.py is ~1 KiB
_VERSIONED = re.compile(r"lib[\w+-]+\.so\.\d+")  # a soname with its major: libcudnn.so.9


def _runtime(
    stack: StackView,
    dist: Distribution,
    row: LibraryRow,
    reqs: Requirements,
    named: Callable[[], Mapping[str, str]] = dict,
) -> tuple[Copy | None, Library | None]:
    """The copy ``dist`` would load and the resolver's record of it; (None, ...) when another concern reports
    it: a shadowed copy (shadow.py says it, with this rule's verdict), a path two RECORDs list (the integrity
    item names whose bytes are there) or no copy at all (requirements and closure). A library no closure
    reaches is loaded by name at run time: by the sonames ``named()`` (those its own files name) when there are
    any, the first that an installed wheel ships or the linker finds; None when none of them is found (the
    dlopen or closure item names the absent soname); else the installed wheel of that library."""
    inv = stack.inventory
    keys = {d.key for d in providers(dist, reqs)}
    for lib in loaded_libraries(stack, dist):
        if lib.path is not None and row.matches_soname(lib.soname):
            if shadowing(inv, lib, row, keys) is not None or len(inv.owners(lib.path)) > 1:
                return None, lib
            return copy_version(inv, lib.path, row), lib
    names = named()
    if names:
        for soname in names:
            for ships, path in inv.shipping(soname):
                if os.path.isfile(path) and row.matches_wheel(ships.name):
                    shown = reported_version(row, ships.version)
                    return Copy(path, ships, shown, f"its wheel {ships.label} (loaded as {soname} at run time)"), None
            found = stack.resolver.find(soname)
            if found.path is not None:
                return copy_version(inv, found.path, row), found
        return None, None
    wheel = next((d for d in inv.distributions if row.matches_wheel(d.name)), None)
    if wheel is None:
        return None, None
    version = reported_version(row, wheel.version)
    return Copy(wheel.dist_info, wheel, version, f"its wheel {wheel.label} (loaded by name at run time)"), None


def _preloaded(stack: StackView, row: LibraryRow, major: int) -> bool:
    """Whether a preload of ``cuda/data/dlopen_targets.json`` whose package is installed loads a soname of
    ``row`` at ``major`` (jax_plugins.xla_cuda12 loads libcudnn.so.9 by path): the dlopen item's load."""
    try:
        preloads = load_preloads()
    except CudaStackError:
        return False
    for pre in preloads:
        if not any(
            _VERSIONED.fullmatch(name) and row.matches_soname(name) and name.endswith(f".so.{major}")
            for _, name in pre.libraries
        ):
            continue
        top = pre.module.split(".")[0]
        if any(os.path.isdir(os.path.join(site, top)) for site in stack.inventory.site_dirs):
            return True
    return False


def _wheel_of_major(stack: StackView, row: LibraryRow, major: int) -> Copy | None:
    """The first installed wheel of ``row`` (any -cuNN) whose version reports ``major``, as a copy."""
    for wheel in stack.inventory.distributions:
        if row.matches_wheel(wheel.name):
            version = reported_version(row, wheel.version)
            if version is not None and version[0] == major:
                return Copy(wheel.dist_info, wheel, version, f"its wheel {wheel.label} (loaded by name at run time)")
    return None


def named_sonames(stack: StackView, dist: Distribution, row: LibraryRow) -> dict[str, str]:
    """The versioned sonames of ``row`` (``libcudnn.so.9``) that ``dist``'s own shipped libraries name in their
    DT_NEEDED or read-only strings (what it links or dlopens), each with the first file naming it; a file
    that cannot be read names nothing (the integrity item speaks of it)."""
    found: dict[str, str] = {}
    for lib in dist.libraries:
        if not lib.exists or lib.problem:
            continue
        names: list[str] = []
        try:
            names.extend(stack.cache.read(lib.path).needed)
            names.extend(stack.cache.read_strings(lib.path).names)
        except (CudaStackError, OSError):
            continue
        for name in names:
            if _VERSIONED.fullmatch(name) and row.matches_soname(name):
                found.setdefault(name, lib.path)
    return found


@dataclass(frozen=True)
class Build:
    """The version a framework was built against, as its files state it (``version`` None: none does), and
    where each part was read (``said``: "its METADATA declares nvidia-cudnn-cu12>=9.8,<10.0", ...)."""

    version: tuple[int, ...] | None
    said: tuple[str, ...] = ()
    pin: str = ""  # the active Requires-Dist pin it came from ("pin"), for the fix
    spec: str = ""  # the requirement its METADATA declares ("declared": nvidia-cudnn-cu12<10.0,>=9.8), for the fix


def _declared(dist: Distribution, row: LibraryRow) -> tuple[tuple[int, ...], str, str] | None:
    """The lowest version of ``row``'s wheel that ``dist``'s METADATA accepts, any extra (``==``, ``>=``,
    ``~=``): JAX's CUDA plugin declares the cuDNN it was built against as a floor (``nvidia-cudnn-cu12>=9.8,
    <10.0; extra == "with-cuda"``), TensorFlow's ``and-cuda`` extra pins it."""
    for text in dist.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if not row.matches_wheel(req.name):
            continue
        for spec in req.specifier:
            if spec.operator in ("==", ">=", "~=", "===") and "*" not in spec.version:
                try:
                    release = Version(spec.version).release
                except InvalidVersion:
                    continue
                said = f"its METADATA declares {req.name}{req.specifier}"
                if req.marker is not None:
                    said += f" ({req.marker})"
                return (*release, 0, 0)[: max(len(release), row.reports or 0)], said, f"{req.name}{req.specifier}"
    return None


def _from_build_file(dist: Distribution, rule: Rule) -> tuple[tuple[int, ...], str] | None:
    """``{library}_version`` of the rule's ``build_file`` (TensorFlow's build_info.py: cudnn_version '8')."""
    value = _build_value(dist, rule, f"{rule.library}_version")
    if value is None or not re.fullmatch(r"\d+(\.\d+)*", value):
        return None
    return tuple(int(x) for x in value.split(".")), f"its {os.path.basename(rule.build_file or '')} says " + (
        f"{rule.library}_version {value}"
    )


def _build(dist: Distribution, rule: Rule, row: LibraryRow, reqs: Requirements, named: Mapping[str, str]) -> Build:
    """The build version from the places ``rule.build_from`` names, in order: the first that states a major
    and a minor wins; the major of a soname its files name (``files``) overrides a stated version of another
    major (the files say what is loaded) and stands alone when nothing states the minor."""
    majors = sorted({int(s.rsplit(".so.", 1)[1].split(".")[0]) for s in named}) if "files" in rule.build_from else []
    major = majors[-1] if len(majors) == 1 else None
    files_said = (
        f"its {os.path.basename(named[next(iter(named))])} names {next(iter(named))}" if major is not None else ""
    )
    for where in rule.build_from:
        got: tuple[tuple[int, ...] | None, str] | None = None
        pin = spec = ""
        if where == "pin":
            fact = next((f for f in reqs.of(dist) if row.matches_wheel(f.name) and f.pin is not None), None)
            if fact is not None and fact.pin is not None:
                got, pin = (reported_version(row, fact.pin), f"its metadata pins {fact.text}"), fact.text
        elif where == "declared":
            declared = _declared(dist, row)
            if declared is not None:
                got, spec = declared[:2], declared[2]
        elif where == "build_file":
            got = _from_build_file(dist, rule)
        if got is None or got[0] is None:
            continue
        version = got[0]
        if major is not None and version[0] != major:
            continue
        if len(version) >= 2:
            said = (got[1], files_said) if files_said else (got[1],)
            return Build(version, said, pin, spec)
        if major is None:
            major, files_said = version[0], got[1]
    return Build((major,), (files_said,)) if major is not None else Build(None)


def _build_value(dist: Distribution, rule: Rule, key: str) -> str | None:
    """``key``'s value in the rule's ``build_file`` (read as text, never imported); None when absent."""
    if rule.build_file is None:
        return None
    text = read_text(os.path.join(dist.location, rule.build_file), _BUILD_FILE_LIMIT)
    if text is None:
        return None
    # a dict literal ('key': 'v') or an OrderedDict of pairs (('key', 'v')), as TensorFlow has written it, or
    # an assignment (key = 'v'), as onnxruntime's build_and_package_info.py is
    m = re.search(rf"""['"]{re.escape(key)}['"]\s*[:,]\s*['"]([^'"]*)['"]""", text) or re.search(
        rf"""^{re.escape(key)}\s*=\s*['"]([^'"]*)['"]""", text, re.MULTILINE
    )
    return m[1] if m is not None else None


def build_info(dist: Distribution, rule: Rule) -> str:
    """``"; its build_info.py says cuda_version 12.2, cudnn_version 8"``: the rule's ``build_keys`` as the
    framework's ``build_file`` states them (read as text, never imported; "" when absent or unreadable)."""
    found = [f"{key} {value}" for key in rule.build_keys if (value := _build_value(dist, rule, key)) is not None]
    return f"; its {os.path.basename(rule.build_file or '')} says {', '.join(found)}" if found else ""


def framework_findings(stack: StackView) -> tuple[Finding, ...]:
    """The framework rules' findings for every installed framework (see the module docstring)."""
    inv = stack.inventory
    try:
        data = load_rules()
    except CudaStackError as e:
        return (Finding(_CHECK, Severity.WARNING, "framework rules", f"framework rules not loaded: {e}"),)
    findings: list[Finding] = []
    silent: list[tuple[Distribution, Finding]] = []
    seen: set[tuple[str, str]] = set()
    environ = stack.image.env if stack.image is not None else os.environ  # where the framework runs
    for dist in inv.distributions:
        if inv.get(dist.name) is not dist:
            continue
        undecided: list[str] = []
        for rule in data.rules_for(dist.name, dist.version):
            if rule.kind == "provider":
                findings.extend(_provider(stack, dist, rule, data))
                continue
            row = data.library(rule.library)
            if row is None:
                continue
            if rule.kind == "loads_by_name":
                got = _by_name(stack, dist, rule, row)
            elif rule.kind == "wheel_floor":
                got = _wheel_floor(stack, dist, rule, row)
            elif rule.skip_env and environ.get(rule.skip_env, "") not in ("", "0"):
                got = f"{row.name}: {dist.name} skips its check ({rule.skip_env} is set)"
            else:
                got = _version_rule(stack, dist, rule, row)
            if isinstance(got, Finding) and (got.subject, got.message) in seen:
                continue  # two rules on one library meeting the same absent major (XLA's check and JAX's floor)
            if isinstance(got, Finding):
                seen.add((got.subject, got.message))
            if isinstance(got, Finding) and rule.silent and got.severity is Severity.ERROR:
                silent.append((dist, got))
            elif isinstance(got, Finding):
                findings.append(got)
            elif got:
                undecided.append(got)
        if undecided:
            findings.append(
                Finding(
                    check=_CHECK,
                    severity=Severity.INFO,
                    subject=dist.label,
                    message=f"{len(undecided)} of {dist.name}'s own version checks not judged here",
                    cause="; ".join(undecided),
                    where=(dist.dist_info,),
                    details=tuple(undecided),
                )
            )
    findings.extend(_reached(stack, dist, f) for dist, f in silent)
    return tuple(findings)


def _version_rule(stack: StackView, dist: Distribution, rule: Rule, row: LibraryRow) -> Finding | str | None:
    """One version rule (``build_match``, ``pin_floor``, ``floor``, ``undecidable``) of ``dist``: a Finding
    when it fails, the INFO text when it cannot be decided, None when it holds or another concern reports it.
    The copy judged is the one its closures load, else the soname its own files name (``named_sonames``):
    when that soname is found nowhere the dlopen or closure item reports it, not this rule."""
    reqs = stack.requirements
    named = functools.cache(lambda: named_sonames(stack, dist, row))  # read only when a closure does not say
    copy, lib = _runtime(stack, dist, row, reqs, named)
    if rule.kind == "undecidable":
        if rule.bad is None:
            return f"{row.name}: {judge(rule, None, None).text}{build_info(dist, rule)}"
        if copy is None or copy.version is None:
            return None if copy is None else f"{row.name}: {judge(rule, None, None).text}"
        # refused only when the loaded copy is that version: any other passes whatever the build was
        return _known_bad(dist, rule, row, copy, lib) if copy.version[: len(rule.bad)] == rule.bad else None
    if copy is None:
        return None  # another concern reports it (see _runtime)
    if copy.owner is not None and any(
        f.installed is copy.owner and not f.met and not f.inferred for f in reqs.of(dist)
    ):
        return None  # the requirements finding on that pin says it, with this rule's verdict
    # a floor is judged without the build, but the build's major still says which copy is loaded by name
    build = _build(dist, rule, row, reqs, named() if "files" in rule.build_from else {})
    if lib is None and build.version and copy.version and copy.version[0] != build.version[0]:
        # loaded by name: the framework asks for its build's major, which another installed wheel may ship
        copy = _wheel_of_major(stack, row, build.version[0]) or copy
    verdict = judge(rule, build.version, copy.version)
    if lib is None and build.version and copy.version and copy.version[0] != build.version[0]:
        if _preloaded(stack, row, build.version[0]):
            return None  # a run-time load the dlopen item judges (its table names it): said once, there
        # no wheel ships its build's major, nor do its files name that soname (the dlopen item would say it), so
        # the load by name fails whatever a floor says of the other major's version
        verdict = Verdict(False, f"was built against {row.name} {build.version[0]}")
    if verdict.ok is None:
        return f"{row.name}: {verdict.text}" + (f" ({'; '.join(build.said)})" if build.said else "")
    if verdict.ok:
        return None
    return _broken(dist, rule, row, copy, lib, build, verdict.text, reqs)


def _broken(
    dist: Distribution,
    rule: Rule,
    row: LibraryRow,
    copy: Copy,
    lib: Library | None,
    build: Build,
    why: str,
    reqs: Requirements,
) -> Finding:
    says = says_text(rule, build.version, copy.version)
    route = f" via {lib.route.value}" if lib is not None else ""
    cause = f"{dist.name} {why}; it would load {copy.described}{route}"
    if build.said:
        cause += "; " + "; ".join(build.said)
    if rule.silent:
        cause += f"; when the check fails {dist.name} drops the GPU and runs on the CPU, with a warning only"
    pin = build.pin
    pinned = [f.name for f in reqs.of(dist) if f.pin is not None and row.matches_wheel(f.name)][:1]
    remedies: tuple[Remedy, ...] = ()
    # the copy is the framework's own provider's (a shadowing copy is shadow.py's finding), so the route is not
    # the fault: the pin is; no LD_LIBRARY_PATH edit is proposed here
    owner = copy.owner if copy.owner is not None and row.matches_wheel(copy.owner.name) else None
    if pin and owner is not None:
        same = [f for f in reqs.on(owner.name) if f.pin is not None]
        if same and all(f.pin == same[0].pin for f in same):
            why = f"the version every requirer pins ({dist.name} among them)"
            spec = f"{owner.name}=={same[0].pin}"
            remedies = (Pip("install", (spec,), pip_python(owner), ("--no-deps",), why=why),)
    if not remedies and build.spec and owner is not None:
        # what its own METADATA declares: a floor, so the install stays a manual step (which release pip picks is
        # the index's choice, not the repair model's)
        why = f"{dist.name} was built against it (its METADATA)"
        get = Pip("install", (build.spec,), pip_python(owner), ("--no-deps",), why=why)
        remedies = (UseBuild(owner.name, f"a release {build.spec}", get, why=why),)
    message = f'{dist.label} would fail its {row.name} check: "{says}"'
    if build.version and copy.version and build.version[0] != copy.version[0]:
        # another major: the framework loads the soname of its build's major, absent here, so it never gets as
        # far as comparing versions
        message = (
            f"{dist.label} loads {row.name} {build.version[0]}, which is not installed: the {row.name} here is "
            f"{version_text(copy.version)}, another major"
        )
    return Finding(
        check=_CHECK,
        severity=Severity.ERROR,
        subject=f"{dist.name} {row.name}",
        message=message,
        cause=cause,
        remedies=remedies,
        where=(copy.path, dist.dist_info),
        # the pinned wheel too: the repair plan claims this finding only when it meets that pin
        distributions=(dist.key, *pinned),
        details=(f"rule: {rule.kind} ({rule.source}: {_source_url(rule)})",),
    )


def _reached(stack: StackView, dist: Distribution, f: Finding) -> Finding:
    """A silent rule's ERROR (the framework drops the GPU and runs on) kept when the project imports the
    framework: a top-level name its distribution installs, or one of a distribution that requires it (``jax``
    for ``jax-cuda12-plugin``: jax loads its plugins itself); else a WARNING naming the import after which
    the GPU would be lost (``model.reach``'s rule for what an import that will happen reaches)."""
    reqs = stack.requirements
    owners = [*(x.requirer for x in reqs.on(dist.name) if x.requirer is not None), dist]
    tops = list(dict.fromkeys(t for d in owners for t in top_level_names(d)))
    if not tops:
        return f
    project = stack.reachability.project
    hit = next((pi for pi in project.imports if pi.name.split(".")[0] in tops), None)
    if hit is not None:
        return replace(f, details=(*f.details, f"reached by `import {hit.name}` ({hit.where})"))
    hint = f"import {tops[0]} in the project (or list it in cudastack_imports) to make this an error"
    return replace(
        f,
        severity=Severity.WARNING,
        message=f"after `import {tops[0]}`: {f.message}",
        cause=f"{f.cause}; the project imports none of {', '.join(tops[:5])}",
        details=(*f.details, f"not reached: {hint}"),
    )


def _known_bad(dist: Distribution, rule: Rule, row: LibraryRow, copy: Copy, lib: Library | None) -> Finding:
    """An undecidable rule's ``bad`` version loaded (JAX and cuDNN 9.10.0): a WARNING, not an ERROR, since the
    framework accepts it when it was built against that very version, which no file states."""
    bad = version_text(rule.bad or ())
    route = f" via {lib.route.value}" if lib is not None else ""
    return Finding(
        check=_CHECK,
        severity=Severity.WARNING,
        subject=f"{dist.name} {row.name}",
        message=f'{dist.label} refuses {row.name} {bad} unless it was built against it: "{rule.says}"',
        cause=f"it would load {copy.described}{route}; whether it was built against {bad} "
        f"{judge(rule, None, None).text}",
        remedies=manual(
            f"no safe automatic repair is known. By hand: install a {row.name} wheel other than {bad} that "
            f"{dist.name}'s requirements accept"
        ),
        where=(copy.path, dist.dist_info),
        distributions=(dist.key,),
        details=(f"rule: {rule.kind} ({rule.source}: {_source_url(rule)})",),
    )


def _cupy_version(text: str) -> tuple[int, int, int]:
    """cupy's ``_parse_version``: the first three numbers, missing ones 0 (``2.27.7`` -> (2, 27, 7))."""
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]] + [0, 0, 0]
    return parts[0], parts[1], parts[2]


def _wheel_floor(stack: StackView, dist: Distribution, rule: Rule, row: LibraryRow) -> Finding | str | None:
    """A ``wheel_floor`` rule (cupy 13.5+ preloading NCCL, cuTENSOR): the ``<wheel>-cu<major>`` wheel its build
    file names must have the same major and be no older than ``min_pypi_version``; an older or other-major one
    is passed over (a WARNING: the library then comes from the linker's search, whatever version that finds).
    None when the build file does not configure the library, or no such wheel is installed (the closure item
    judges what the extension then loads)."""
    text = read_text(os.path.join(dist.location, rule.build_file or ""), _BUILD_FILE_LIMIT)
    try:
        config = json.loads(text) if text is not None else None
    except ValueError:
        config = None
    if not isinstance(config, dict):
        return f"{row.name}: its {os.path.basename(rule.build_file or '')} is absent or not JSON"
    entry, cuda = config.get(rule.library), config.get("cuda")
    if not isinstance(entry, dict) or not isinstance(entry.get("min_pypi_version"), str) or not isinstance(cuda, str):
        return None  # not preloaded by this build ("Preload ... not configured in wheel")
    name = f"{row.wheel}-cu{cuda.split('.')[0]}"
    wheel = stack.inventory.get(name)
    if wheel is None:
        return None
    want, got = _cupy_version(entry["min_pypi_version"]), _cupy_version(wheel.version)
    if got[0] == want[0] and got[1:] >= want[1:]:
        return None
    says = says_text(rule, want, got)
    return Finding(
        check=_CHECK,
        severity=Severity.WARNING,
        subject=f"{dist.name} {row.name}",
        message=f'{dist.label} passes over {wheel.label} when it preloads {row.name}: "{says}"',
        cause=f"its {os.path.basename(rule.build_file or '')} says it was built for CUDA {cuda} with {row.name} "
        f"{entry.get('version', entry['min_pypi_version'])} and takes the {name} wheel only at major {want[0]}, "
        f"{entry['min_pypi_version']} or later; {row.name} then comes from the linker's search for its extension's "
        "own DT_NEEDED, whatever version that finds (an older one can lack symbols it binds)",
        remedies=manual(
            f"no safe automatic repair is known. By hand: install {name}>={entry['min_pypi_version']},"
            f"<{want[0] + 1} (what {dist.name} itself proposes when the preload fails)"
        ),
        where=(wheel.dist_info, dist.dist_info),
        distributions=(dist.key, wheel.key),
        details=(f"rule: {rule.kind} ({rule.source}: {_source_url(rule)})",),
    )


def _shipped(inv: Inventory, row: LibraryRow) -> list[str]:
    """``"libcublas.so.13 (nvidia-cublas 13.1.1.3)"`` for each present soname of ``row`` an installed wheel of
    that library ships."""
    return [
        f"{lib.soname} ({d.label})"
        for d in inv.distributions
        if row.matches_wheel(d.name)
        for lib in d.libraries
        if lib.exists and lib.soname is not None and row.matches_soname(lib.soname)
    ]


def _by_name(stack: StackView, dist: Distribution, rule: Rule, row: LibraryRow) -> Finding | str | None:
    """A ``loads_by_name`` rule: ``dist`` loads ``rule.soname`` by name at run time (cuda-pathfinder: NVIDIA
    wheels, then the OS loader, then CUDA_HOME/CUDA_PATH). None when an installed wheel ships it, the linker's
    own search finds it (the OS-loader step), or a closure of ``dist`` already misses it (the closure item
    says so); a WARNING when only wheels of another CUDA major ship that library; else the INFO text saying
    what is not judged here."""
    inv, soname = stack.inventory, rule.soname or ""
    if any(os.path.isfile(p) for _, p in inv.shipping(soname)):
        return None
    for lib in dist.libraries:
        if lib.exists and lib.pyinit and any(x.soname == soname for x in stack.tree(lib.path).missing):
            return None
    if stack.resolver.find(soname).path is not None:
        return None
    others = _shipped(inv, row)
    if not others:
        return (
            f"{row.name}: {soname} is in no installed wheel and not on the linker's search path; whether "
            f"CUDA_HOME/CUDA_PATH holds it (cuda-pathfinder's last step) is not judged here"
        )
    built = build_info(dist, rule)
    return Finding(
        check=_CHECK,
        severity=Severity.WARNING,
        subject=f"{dist.name} {row.name}",
        message=f"{dist.label} is built for CUDA {rule.major} and loads {soname} by name, which no installed "
        f"wheel ships: the installed {row.name} is {', '.join(others)}",
        cause=f"{dist.name}'s package name states its CUDA major (CUDA {rule.major}){built}; it loads {row.name} "
        f"through cuda-pathfinder (NVIDIA wheels in site-packages, then the OS loader, then CUDA_HOME/CUDA_PATH), "
        f"and neither the wheels nor the linker's search path have {soname}, so unless CUDA_HOME/CUDA_PATH holds "
        f'it: "{rule.says}"',
        remedies=manual(
            f"no safe automatic repair is known. By hand: install the {dist.name.split('-cuda')[0]} package built for "
            f"the installed CUDA major, or the CUDA {rule.major} wheels ({dist.name}[ctk])"
        ),
        where=(dist.dist_info,),
        distributions=(dist.key,),
        details=(f"rule: {rule.kind} ({rule.source}: {_source_url(rule)})",),
    )


def _provider(stack: StackView, dist: Distribution, rule: Rule, data: FrameworkRules) -> tuple[Finding, ...]:
    """A ``provider`` rule: the provider library ``dist`` dlopens at run time (onnxruntime's CUDA execution
    provider) needs CUDA libraries the linker does not find: a WARNING (the framework falls back to another
    provider, the CPU, and runs on). Nothing when the provider is absent (a CPU-only build) or finds them all."""
    path = os.path.join(dist.location, rule.provider or "")
    if not os.path.isfile(path):
        return ()
    absent = [x.soname for x in stack.tree(path).missing if data.library_for_soname(x.soname) is not None]
    if not absent:
        return ()
    names = ", ".join(dict.fromkeys(absent))
    # every one shipped under its own soname by an installed wheel: present, only outside the linker's search
    dirs = {
        soname: [os.path.dirname(p) for _, p in stack.inventory.shipping(soname) if os.path.isfile(p)]
        for soname in absent
    }
    if all(dirs.values()):
        ships = ", ".join(
            dict.fromkeys(
                f"{soname} ({d.label})"
                for soname in absent
                for d, p in stack.inventory.shipping(soname)
                if os.path.isfile(p)
            )
        )
        has = f"; installed wheels ship them, outside its search path: {ships}"
        fix = (
            "no safe automatic repair is known. By hand: load them before a session asks for the provider "
            "(onnxruntime.preload_dlls() loads them from these wheels), or put their directories on LD_LIBRARY_PATH "
            f"({':'.join(dict.fromkeys(x for found in dirs.values() for x in found))})"
        )
    else:
        installed: list[str] = []
        for soname in absent:
            row = data.library_for_soname(soname)
            installed.extend(
                x for x in (_shipped(stack.inventory, row) if row is not None else []) if x not in installed
            )
        has = f"; installed instead: {', '.join(installed)}" if installed else "; no installed wheel ships them"
        fix = (
            "no safe automatic repair is known. By hand: install the CUDA libraries of the major its provider "
            f"links ({names}), or the {dist.name} build for the installed CUDA major"
        )
    return (
        Finding(
            check=_CHECK,
            severity=Severity.WARNING,
            subject=f"{dist.name} {os.path.basename(path)}",
            message=f"{dist.label}'s {os.path.basename(path)} needs {names}, which the linker does not find{has}",
            cause=f"{dist.name} loads {rule.provider} when a session asks for it{build_info(dist, rule)}; when that "
            "load fails it logs "
            f'"{rule.says}" and creates the session with the remaining providers: the model runs, on the CPU, '
            "without an error (unless the program preloads these libraries itself, e.g. onnxruntime.preload_dlls())",
            remedies=manual(fix),
            where=(path, dist.dist_info),
            distributions=(dist.key,),
            details=(f"rule: {rule.kind} ({rule.source}: {_source_url(rule)})",),
        ),
    )


def _source_url(rule: Rule) -> str:
    """The URL of a rule's source."""
    try:
        return str(load_rules().sources[rule.source].get("url", rule.source))
    except (CudaStackError, KeyError):
        return rule.source


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """Framework rules alone (the ``requirements`` item runs them with the other two concerns)."""
    return framework_findings(stack)
