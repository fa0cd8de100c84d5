"""Framework version rules (framework_rules.json's ``rules``) applied to the copies each framework loads.

For an installed framework distribution (torch, jax-cuda12-plugin, ...) and each of its rules:

* the *runtime* version: the copy of the library its extension modules' closures load (the resolver's
  winner, shadowing included), read by :func:`pytest_cudastack.checks.shadow.copy_version`; a library no
  closure reaches (loaded by name at run time, as the JAX plugin preloads the nvidia wheels) is the
  installed wheel of that library, first in search order;
* the *build* version: the version the framework's own Requires-Dist pins for that library's wheel (torch
  2.14.1 pins nvidia-cudnn-cu13==9.24.0.43: built against (9, 24, 0)).

A rule the framework breaks is an ERROR quoting the framework's own message; an undecidable rule, or one
whose versions are not readable, is an INFO that says why ("cannot be decided statically because ...");
a rule whose ``skip_env`` is set in this environment is an INFO saying the framework skips it.

Two kinds are judged on the installed files instead of versions:

* ``loads_by_name`` (cupy >= 14, which loads cuBLAS and NVRTC through cuda-pathfinder): a WARNING when the
  soname of the CUDA major in cupy's package name (cupy-cuda12x: libcublas.so.12) is in no installed wheel
  and not on the linker's search path while wheels of that library ship another major; silent when a wheel
  or the search path has it, or when a closure of cupy's modules already misses it (the closure item's);
* ``provider`` (onnxruntime-gpu's libonnxruntime_providers_cuda.so, dlopened at session creation): a
  WARNING naming the CUDA sonames its closure does not find (the session then runs on the CPU without an
  error); silent when the provider is absent or finds them all.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from pytest_cudastack._sysio import read_text
from pytest_cudastack.checks.shadow import Copy, copy_version, loaded_libraries, providers, shadowing
from pytest_cudastack.cuda.frameworks import FrameworkRules, Rule, judge, load_rules, reported_version, version_text
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import Finding, Severity, manual
from pytest_cudastack.linker.resolver import Library
from pytest_cudastack.wheels.ownership import pip_command
from pytest_cudastack.wheels.requirements import Requirements

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.frameworks import LibraryRow
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = ["build_info", "framework_findings", "run"]

_CHECK = "requirements"
_BUILD_FILE_LIMIT = 1 << 20  # TensorFlow's build_info.py is ~1 KiB


def _runtime(
    stack: StackView, dist: Distribution, row: LibraryRow, reqs: Requirements
) -> tuple[Copy | None, Library | None]:
    """The copy ``dist`` would load and the resolver's record of it; (None, ...) when another concern reports
    it: a shadowed copy (shadow.py says it, with this rule's verdict), a path two RECORDs list (the integrity
    item names whose bytes are there) or no copy at all (requirements and closure)."""
    inv = stack.inventory
    keys = {d.key for d in providers(dist, reqs)}
    for lib in loaded_libraries(stack, dist):
        if lib.path is not None and row.matches_soname(lib.soname):
            if shadowing(inv, lib, row, keys) is not None or len(inv.owners(lib.path)) > 1:
                return None, lib
            return copy_version(inv, lib.path, row), lib
    wheel = next((d for d in inv.distributions if row.matches_wheel(d.name)), None)
    if wheel is None:
        return None, None
    version = reported_version(row, wheel.version)
    return Copy(wheel.dist_info, wheel, version, f"its wheel {wheel.label} (loaded by name at run time)"), None


def _build(dist: Distribution, row: LibraryRow, reqs: Requirements) -> tuple[tuple[int, ...] | None, str]:
    for fact in reqs.of(dist):
        if row.matches_wheel(fact.name) and fact.pin is not None:
            return reported_version(row, fact.pin), fact.text
    return None, ""


def build_info(dist: Distribution, rule: Rule) -> str:
    """``"; its build_info.py says cuda_version 12.2, cudnn_version 8"``: the rule's ``build_keys`` as the
    framework's ``build_file`` states them (read as text, never imported; "" when absent or unreadable)."""
    if rule.build_file is None:
        return ""
    text = read_text(os.path.join(dist.location, rule.build_file), _BUILD_FILE_LIMIT)
    if text is None:
        return ""
    found = []
    for key in rule.build_keys:
        # a dict literal ('key': 'v') or an OrderedDict of pairs (('key', 'v')), as TensorFlow has written it
        m = re.search(rf"""['"]{re.escape(key)}['"]\s*[:,]\s*['"]([^'"]*)['"]""", text)
        if m is not None:
            found.append(f"{key} {m[1]}")
    return f"; its {os.path.basename(rule.build_file)} says {', '.join(found)}" if found else ""


def framework_findings(stack: StackView) -> tuple[Finding, ...]:
    """The framework rules' findings for every installed framework (see the module docstring)."""
    inv = stack.inventory
    reqs = stack.requirements
    try:
        data = load_rules()
    except CudaStackError as e:
        return (Finding(_CHECK, Severity.WARNING, "framework rules", f"framework rules not loaded: {e}"),)
    findings: list[Finding] = []
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
                if isinstance(got, Finding):
                    findings.append(got)
                elif got:
                    undecided.append(got)
                continue
            if rule.skip_env and os.environ.get(rule.skip_env, "") not in ("", "0"):
                undecided.append(f"{row.name}: {dist.name} skips its check ({rule.skip_env} is set)")
                continue
            if rule.kind == "undecidable":
                bad = _known_bad(stack, dist, rule, row, reqs)
                if bad is not None:
                    findings.append(bad)
                else:
                    undecided.append(f"{row.name}: {judge(rule, None, None).text}{build_info(dist, rule)}")
                continue
            copy, lib = _runtime(stack, dist, row, reqs)
            if copy is None:
                continue  # another concern reports it (see _runtime)
            build, pin = _build(dist, row, reqs)
            if copy.owner is not None and any(f.installed is copy.owner and not f.met for f in reqs.of(dist)):
                continue  # the requirements finding on that pin says it, with this rule's verdict
            verdict = judge(rule, build, copy.version)
            if verdict.ok is None:
                undecided.append(f"{row.name}: {verdict.text}")
            elif not verdict.ok:
                findings.append(_broken(dist, rule, row, copy, lib, build, pin, verdict.text, reqs))
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
    return tuple(findings)


def _broken(
    dist: Distribution,
    rule: Rule,
    row: LibraryRow,
    copy: Copy,
    lib: Library | None,
    build: tuple[int, ...] | None,
    pin: str,
    why: str,
    reqs: Requirements,
) -> Finding:
    runtime = version_text(copy.version) if copy.version is not None else "unknown"
    built = version_text(build) if build is not None else "unknown"
    says = rule.says.format(build=built, runtime=runtime)
    route = f" via {lib.route.value}" if lib is not None else ""
    cause = f"{dist.name} {why}; it would load {copy.described}{route}"
    if pin:
        cause += f"; its metadata pins {pin}"
    pinned = [f.name for f in reqs.of(dist) if f.pin is not None and row.matches_wheel(f.name)][:1]
    fix = ""
    # the copy is the framework's own provider's (a shadowing copy is shadow.py's finding), so the route is not
    # the fault: the pin is; no LD_LIBRARY_PATH edit is proposed here
    if pin and copy.owner is not None and row.matches_wheel(copy.owner.name):
        same = [f for f in reqs.on(copy.owner.name) if f.pin is not None]
        if same and all(f.pin == same[0].pin for f in same):
            fix = f"{pip_command(copy.owner)} install --no-deps '{copy.owner.name}=={same[0].pin}'"
    return Finding(
        check=_CHECK,
        severity=Severity.ERROR,
        subject=f"{dist.name} {row.name}",
        message=f'{dist.label} would fail its {row.name} check: "{says}"',
        cause=cause,
        remedies=manual(fix),
        where=(copy.path, dist.dist_info),
        # the pinned wheel too: the repair plan claims this finding only when it meets that pin
        distributions=(dist.key, *pinned),
        details=(f"rule: {rule.kind} ({rule.source}: {_source_url(rule)})",),
    )


def _known_bad(stack: StackView, dist: Distribution, rule: Rule, row: LibraryRow, reqs: Requirements) -> Finding | None:
    """An undecidable rule's ``bad`` version loaded (JAX and cuDNN 9.10.0): a WARNING, not an ERROR, since the
    framework accepts it when it was built against that very version, which no file states."""
    if rule.bad is None:
        return None
    copy, lib = _runtime(stack, dist, row, reqs)
    if copy is None or copy.version is None or copy.version[: len(rule.bad)] != rule.bad:
        return None
    bad = version_text(rule.bad)
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
            cause=f"{dist.name} loads {rule.provider} when a session asks for it; when that load fails it logs "
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
