"""Shadowed copies: a consumer would load a CUDA library other than the one its own wheels provide.

For every extension module of a distribution D, each library of its resolved closure that is a known CUDA
library (framework_rules.json's ``libraries``) is compared with the copies D's *providers* ship: the
installed distributions D requires, directly or through their requirements (torch -> nvidia-cudnn-cu13,
torch -> cuda-toolkit[cublas] -> nvidia-cublas). When the resolver's winner (found through
LD_LIBRARY_PATH, ld.so.cache, a default directory, another wheel's RUNPATH) is not a provider's copy and its
version differs from the provider's, that is a finding naming both copies, the winner's route, both
versions and the consequence.

Versions, as readable without loading anything (:func:`copy_version`), first that applies:

1. the copy's owning wheel, when it is that library's wheel: the version the library reports for that
   wheel version (nvidia-cudnn-cu12 9.19.0.56 -> (9, 19, 0); ``reports`` in the data file);
2. the real file's name past ``.so.`` when it has a minor (``libcudnn.so.9.19.0`` -> (9, 19, 0), the
   name NVIDIA's packages and tarballs install, ``libcudnn.so.9`` being a link to it);
3. the library's version header next to it (``../include/cudnn_version.h`` of its directory, the layout
   of the wheels, tarballs and /usr/local/cuda): the macros named in the data file.

Severity: ERROR when the consumer's own rule for that library (framework_rules.json) fails on the winner's
version (torch's cuDNN check), or, without such a rule, when a requirement on the provider (a pin) rejects
it; else WARNING; a winner whose version no rule can read is an INFO (it cannot be
decided statically).

Fixes are verified (:func:`_fix`): the consumer's modules are re-resolved with the changed LD_LIBRARY_PATH
(the shadowing entry removed; else the provider's directory put first); the fix is printed only when each
module then loads the provider's copy and still finds every library it finds now. A winner from ld.so.cache
or a default directory gets no automatic fix (the consumer's RUNPATH does not reach its wheel, and removing
a system copy or editing ld.so.conf changes other programs): the finding says what to do by hand, with the
LD_LIBRARY_PATH workaround only when it verifies.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from packaging.version import Version

from pytest_cudastack._sysio import read_text
from pytest_cudastack.cuda.frameworks import (
    VERSION_KINDS,
    LibraryRow,
    VersionTuple,
    framework_says,
    load_rules,
    reported_version,
    version_text,
)
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import Finding, Manual, Remedy, SearchPath, Severity
from pytest_cudastack.linker.resolver import Library, Resolver, Route
from pytest_cudastack.model.repair import NO_SAFE_REPAIR
from pytest_cudastack.wheels.inventory import Distribution, Inventory
from pytest_cudastack.wheels.ownership import bytes_on_disk
from pytest_cudastack.wheels.requirements import Requirements

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target

__all__ = ["Copy", "copy_version", "loaded_libraries", "providers", "run", "shadow_findings", "shadowing"]

_CHECK = "requirements"
_SO_VERSION = re.compile(r"\.so\.(\d+(?:\.\d+)+)$")
_HEADER_LIMIT = 1 << 20  # version headers are a few KiB; a bigger file is not one


@dataclass(frozen=True)
class Copy:
    """One copy of a library on disk: its path, owner, the version it reports (None: not readable) and
    what that version was read from."""

    path: str
    owner: Distribution | None
    version: VersionTuple | None
    basis: str

    @property
    def described(self) -> str:
        who = self.owner.label if self.owner is not None else "no installed distribution"
        shown = version_text(self.version) if self.version is not None else "version unknown"
        return f"{self.path} ({who}; {shown}, from {self.basis})"


def _header_version(libdir: str, row: LibraryRow) -> VersionTuple | None:
    if row.header is None:
        return None
    text = read_text(os.path.join(os.path.dirname(libdir), "include", row.header), _HEADER_LIMIT)
    if text is None:
        return None
    parts: list[int] = []
    for macro in row.macros:
        m = re.search(rf"^\s*#\s*define\s+{re.escape(macro)}\s+(\d+)\s*$", text, re.MULTILINE)
        if m is None:
            return None
        parts.append(int(m[1]))
    return tuple(parts)


def copy_version(inv: Inventory, path: str, row: LibraryRow) -> Copy:
    """The version the copy at ``path`` reports, read as the module docstring says."""
    owners = inv.owners(path)
    if len(owners) > 1:  # two RECORDs list it (cu12 and cu13 variants): the one whose bytes are there
        owners = bytes_on_disk(inv, path)[0] or owners
    owner = next((d for d in owners if row.matches_wheel(d.name)), owners[0] if owners else None)
    if owner is not None and row.matches_wheel(owner.name):
        version = reported_version(row, owner.version)
        if version is not None:
            return Copy(path, owner, version, f"its wheel {owner.label}")
    real = os.path.realpath(path)
    m = _SO_VERSION.search(os.path.basename(real))
    if m is not None and row.reports is not None:
        version = tuple(int(x) for x in m[1].split("."))[: row.reports]
        return Copy(path, owner, version, f"the file name {os.path.basename(real)}")
    version = _header_version(os.path.dirname(real), row)
    if version is not None:
        return Copy(path, owner, version, f"{row.header} next to it")
    return Copy(path, owner, None, "nothing readable")


def providers(dist: Distribution, reqs: Requirements) -> tuple[Distribution, ...]:
    """The installed distributions ``dist`` requires, directly or through their own requirements."""
    out: dict[str, Distribution] = {}
    todo = [dist]
    while todo:
        d = todo.pop()
        for fact in reqs.of(d):
            if fact.installed is not None and fact.installed.key not in out and fact.installed is not dist:
                out[fact.installed.key] = fact.installed
                todo.append(fact.installed)
    return tuple(out.values())


def loaded_libraries(stack: StackView, dist: Distribution) -> Iterable[Library]:
    """Every found library of the closures of ``dist``'s extension modules (each soname and path once)."""
    seen: set[tuple[str, str]] = set()
    for lib in dist.libraries:
        if not lib.exists or not lib.pyinit:
            continue
        for got in stack.tree(lib.path).libraries:
            if got.path is None or (got.soname, got.path) in seen:
                continue
            seen.add((got.soname, got.path))
            yield got


def _consumers(stack: StackView, dist: Distribution, lib: Library) -> tuple[str, ...]:
    """The extension modules of ``dist`` whose closures load ``lib`` (that soname from that path)."""
    return tuple(
        m.path
        for m in dist.libraries
        if m.exists
        and m.pyinit
        and any(x.soname == lib.soname and x.path == lib.path for x in stack.tree(m.path).libraries)
    )


def _same_dir(entry: str, directory: str) -> bool:
    return os.path.normpath(entry) == directory or os.path.realpath(entry) == os.path.realpath(directory)


def _verified(stack: StackView, modules: Sequence[str], lib: Library, expected: Copy, llp: tuple[str, ...]) -> bool:
    """With LD_LIBRARY_PATH ``llp``, does every module of ``modules`` load ``lib.soname`` from the provider's
    copy (``expected``) and still find every library it finds now (nothing goes missing)?"""
    again = Resolver(
        replace(stack.resolver.config, ld_library_path=llp), reader=stack.cache.read, owner=stack.inventory.owner
    )
    want = os.path.realpath(expected.path)
    for path in modules:
        before = {x.soname for x in stack.tree(path).libraries if x.path is not None}
        after = {x.soname: x for x in again.tree(path).libraries}
        got = after.get(lib.soname)
        if got is None or got.path is None or os.path.realpath(got.path) != want:
            return False
        if any(after.get(name) is None or after[name].path is None for name in before):
            return False
    return True


def _fix(stack: StackView, dist: Distribution, lib: Library, expected: Copy) -> tuple[Remedy, ...]:
    """The remedies for the shadowing route, a search-path change only when the resolver, re-run on the
    state after it, loads the provider's copy and loses no other library; else "no safe automatic repair is
    known" and what to do by hand. Only LD_LIBRARY_PATH is a change this package can model and propose: a
    winner from ld.so.cache or a default directory means the consumer's RUNPATH does not reach its wheel's copy
    (those are searched after RUNPATH), and removing a system library or editing ld.so.conf changes other
    programs too."""
    here = os.path.dirname(os.path.normpath(lib.path or ""))
    want = os.path.dirname(expected.path)
    modules = _consumers(stack, dist, lib)
    llp = stack.resolver.config.ld_library_path
    checked = f"checked: {dist.name} then loads {expected.path} and finds every other library it loads now"
    if lib.route is Route.LD_LIBRARY_PATH:
        entries = [e for e in llp if e and _same_dir(e, here)]
        kept = tuple(e for e in llp if e not in entries)
        if entries and modules and _verified(stack, modules, lib, expected, kept):
            return tuple(SearchPath(e, why=checked) for e in dict.fromkeys(entries))
        if modules and _verified(stack, modules, lib, expected, (want, *llp)):
            return (SearchPath(want, op="prepend", why=checked),)
        why = (
            f"{NO_SAFE_REPAIR}: the resolver, re-run with {here} removed from LD_LIBRARY_PATH or {want} put before "
            f"it, does not load {expected.path} or loses another library"
        )
        step = f"find which library of {here} the process needs, and install it where {dist.name}'s wheels are"
        return (Manual((step,), why=why),)
    if lib.route in (Route.LD_CACHE, Route.DEFAULT):
        where = "ld.so.cache" if lib.route is Route.LD_CACHE else "a default directory"
        why = (
            f"{NO_SAFE_REPAIR}: {here} is {where}, and {dist.name}'s RUNPATH does not reach {want} (ld.so.cache and "
            "default directories come after it); removing that system copy or editing ld.so.conf changes every "
            "program on the machine"
        )
        steps = (
            f"reinstall {dist.name} so that its RUNPATH reaches {want} (a virtual environment: one site directory)",
            f"or remove {lib.path} if nothing else uses it",
        )
        out: tuple[Remedy, ...] = (Manual(steps, why=why),)
        if modules and _verified(stack, modules, lib, expected, (want, *llp)):
            out += (
                SearchPath(want, op="prepend", why=f"for this environment only, before starting Python; {checked}"),
            )
        return out
    return (Manual((f"make {dist.name} load {expected.path}",), why=NO_SAFE_REPAIR),)


def shadowing(inv: Inventory, lib: Library, row: LibraryRow, keys: set[str]) -> tuple[Distribution, str] | None:
    """``(provider, its copy)`` when ``lib`` (found) is not a copy of one of the providers ``keys`` (canonical
    names) while a provider ships a present copy of that soname; None when it is theirs or none ships it."""
    if lib.path is None or any(d.key in keys for d in inv.owners(lib.path)):
        return None
    theirs = [
        (d, p) for d, p in inv.shipping(lib.soname) if d.key in keys and row.matches_wheel(d.name) and os.path.isfile(p)
    ]
    return theirs[0] if theirs else None


def shadow_findings(stack: StackView) -> tuple[Finding, ...]:
    """Shadowed-copy findings for every distribution of the stack (see the module docstring)."""
    inv = stack.inventory
    reqs = stack.requirements
    try:
        rules = load_rules()
    except CudaStackError:
        return ()
    findings: list[Finding] = []
    reported: set[tuple[str, str, str]] = set()
    for dist in inv.distributions:
        if not any(lib.pyinit for lib in dist.libraries):
            continue
        keys = {d.key for d in providers(dist, reqs)}
        if not keys:
            continue
        for lib in loaded_libraries(stack, dist):
            row = rules.library_for_soname(lib.soname)
            theirs = shadowing(inv, lib, row, keys) if row is not None else None
            if row is None or theirs is None or lib.path is None or (dist.key, lib.soname, lib.path) in reported:
                continue
            reported.add((dist.key, lib.soname, lib.path))
            provider, path = theirs
            winner = copy_version(inv, lib.path, row)
            expected = copy_version(inv, path, row)
            if winner.version is not None and winner.version == expected.version:
                continue
            findings.append(_finding(stack, dist, lib, row, (winner, expected), provider, reqs))
    return tuple(findings)


def _finding(
    stack: StackView,
    dist: Distribution,
    lib: Library,
    row: LibraryRow,
    copies: tuple[Copy, Copy],
    provider: Distribution,
    reqs: Requirements,
) -> Finding:
    winner, expected = copies
    detail = lib.route_detail if lib.route_detail not in ("", lib.route.value) else ""
    route = lib.route.value + (f" ({detail})" if detail else "")
    message = (
        f"{dist.label} would load {lib.soname} from {lib.path} (via {route}), not the copy of its own {provider.label}"
    )
    details = (f"winner: {winner.described}", f"expected: {expected.described}")
    if winner.version is None:
        return Finding(
            check=_CHECK,
            severity=Severity.INFO,
            subject=lib.soname,
            message=message,
            cause=f"whether the versions differ cannot be decided statically because {winner.path}'s version "
            f"is not readable (no owning {row.name} wheel, no version in its file name, no {row.header or 'header'} "
            "next to it)",
            remedies=_fix(stack, dist, lib, expected),
            where=lib.searched[:12],
            details=details,
        )
    version = Version(".".join(map(str, winner.version)))
    try:
        provided: Version | None = Version(provider.version)
    except ValueError:  # a METADATA version pip would not accept (or past the digit limit): no pin can accept it
        provided = None
    rejecting = [
        f
        for f in reqs.on(provider.name)
        if not f.inferred
        and not f.requirement.specifier.contains(version, prereleases=True)
        and provided is not None
        and f.requirement.specifier.contains(provided, prereleases=True)
    ]
    shown = version_text(expected.version) if expected.version is not None else "version unknown"
    cause = (
        f"{lib.route.value} is searched before the directory of {provider.name}'s copy; {row.name} "
        f"{version_text(winner.version)} would be loaded where {dist.name} expects {shown}"
    )
    if rejecting:
        asks = "; ".join(f"{f.requester} requires {f.text}" for f in rejecting)
        cause += f"; {asks}: {dist.name} can fail at import (symbols) or at first use (its own {row.name} check)"
    build = next((reported_version(row, p) for f in reqs.of(dist) if row.matches_wheel(f.name) and (p := f.pin)), None)
    try:
        data = load_rules()
    except CudaStackError:
        says, judged = "", False
    else:
        says = framework_says(data, dist.name, dist.version, row.library, build, winner.version)
        judged = any(
            r.library == row.library and r.kind in VERSION_KINDS for r in data.rules_for(dist.name, dist.version)
        )
    if says:
        cause += f'; {dist.name}\'s own check says: "{says}"'
    return Finding(
        check=_CHECK,
        # the framework's own rule, where there is one, decides (a newer cuDNN minor passes torch's check);
        # else the requirement it breaks
        severity=Severity.ERROR if (says if judged else rejecting) else Severity.WARNING,
        subject=lib.soname,
        message=message + f": {row.name} {version_text(winner.version)} instead of {shown}",
        cause=cause,
        remedies=_fix(stack, dist, lib, expected),
        where=lib.searched[:12],
        details=details,
        distributions=(dist.key,),
    )


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """Shadowed copies alone (the ``requirements`` item runs them with the other two concerns)."""
    return shadow_findings(stack)
