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
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.version import Version

from pytest_cudastack._sysio import read_text
from pytest_cudastack.cuda.frameworks import (
    LibraryRow,
    VersionTuple,
    framework_says,
    load_rules,
    reported_version,
    version_text,
)
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.linker.resolver import Library, Route
from pytest_cudastack.wheels.integrity import bytes_on_disk
from pytest_cudastack.wheels.inventory import Distribution, Inventory
from pytest_cudastack.wheels.requirements import Requirements, requirement_facts

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


def _fix(lib: Library, expected: Copy) -> str:
    here = os.path.dirname(lib.path or "")
    want = os.path.dirname(expected.path)
    if lib.route is Route.LD_LIBRARY_PATH:
        return f"remove {here} from LD_LIBRARY_PATH (or put {want} before it)"
    if lib.route in (Route.LD_CACHE, Route.DEFAULT):
        return f"make {want} reachable first (the consumer's RUNPATH should name it) or remove the copy in {here}"
    return f"make the consumer load {expected.path}"


def shadowing(inv: Inventory, lib: Library, row: LibraryRow, keys: set[str]) -> tuple[Distribution, str] | None:
    """``(provider, its copy)`` when ``lib`` (found) is not a copy of one of the providers ``keys`` (canonical
    names) while a provider ships a present copy of that soname; None when it is theirs or none ships it."""
    if lib.path is None or any(d.key in keys for d in inv.owners(lib.path)):
        return None
    theirs = [
        (d, p) for d, p in inv.shipping(lib.soname) if d.key in keys and row.matches_wheel(d.name) and os.path.isfile(p)
    ]
    return theirs[0] if theirs else None


def shadow_findings(stack: StackView, reqs: Requirements | None = None) -> tuple[Finding, ...]:
    """Shadowed-copy findings for every distribution of the stack (see the module docstring)."""
    inv = stack.inventory
    reqs = reqs if reqs is not None else requirement_facts(inv)
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
            findings.append(_finding(dist, lib, row, (winner, expected), provider, reqs))
    return tuple(findings)


def _finding(
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
            fix=_fix(lib, expected),
            where=lib.searched[:12],
            details=details,
        )
    version = Version(".".join(map(str, winner.version)))
    rejecting = [
        f
        for f in reqs.on(provider.name)
        if not f.inferred
        and not f.requirement.specifier.contains(version, prereleases=True)
        and f.requirement.specifier.contains(Version(provider.version), prereleases=True)
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
            r.library == row.library and r.kind != "undecidable" for r in data.rules_for(dist.name, dist.version)
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
        fix=_fix(lib, expected),
        where=lib.searched[:12],
        details=details,
        distributions=(dist.key,),
    )


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """Shadowed copies alone (the ``requirements`` item runs them with the other two concerns)."""
    return shadow_findings(stack)
