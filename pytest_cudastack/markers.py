"""Marker semantics as pure functions: ``requires_*`` arguments + stack facts -> ``Unmet`` or ``None``.

Like pytest's ``skipping.py``: ``check_marker`` validates a marker's arguments (raising ``RuleError`` on
misuse) and ``evaluate`` returns a frozen ``Unmet`` whose ``reason`` names what was required, what was
found and where it looked. The plugin only acts on the result (fail or skip). No pytest here.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from pytest_cudastack.errors import RuleError
from pytest_cudastack.findings import Finding

if TYPE_CHECKING:
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.linker.resolver import Library
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = ["Facts", "MarkerCall", "Unmet", "check_marker", "evaluate", "evaluate_all"]

logger = logging.getLogger(__name__)

_SONAME_RE = re.compile(r"[A-Za-z0-9_+.\-]+\.so(\.[0-9A-Za-z_.\-]+)?")


class Facts(Protocol):
    """What marker evaluation reads; ``stack.Stack`` provides it lazily."""

    @property
    def driver(self) -> DriverInfo: ...

    @property
    def inventory(self) -> Inventory: ...

    @property
    def integrity(self) -> tuple[Finding, ...]: ...

    def find(self, soname: str) -> Library: ...


@dataclass(frozen=True)
class MarkerCall:
    """A validated marker: its name and normalised arguments."""

    name: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(repr(a) for a in self.args)})"


@dataclass(frozen=True)
class Unmet:
    """An unmet marker; ``reason`` is the whole message (what was required, found, and where looked)."""

    marker: str
    reason: str


def check_marker(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> MarkerCall:
    """Validate one marker's arguments; raises ``RuleError`` with a one-line message on misuse."""
    if name in ("requires_soname", "requires_wheel"):
        if kwargs:
            raise RuleError(f"{name}: unexpected keyword argument(s) {', '.join(sorted(kwargs))}")
        if not args:
            what = "soname, e.g. 'libcudnn.so.9'" if name == "requires_soname" else "requirement"
            raise RuleError(f"{name}: needs at least one {what}")
        for arg in args:
            if not isinstance(arg, str):
                raise RuleError(f"{name}: expected strings, got {arg!r}")
            if name == "requires_soname" and ("/" in arg or not _SONAME_RE.fullmatch(arg)):
                raise RuleError(f"{name}({arg!r}): not a soname (expected e.g. 'libcublas.so.12')")
            if name == "requires_wheel":
                try:
                    Requirement(arg)
                except InvalidRequirement as e:
                    raise RuleError(f"{name}({arg!r}): invalid PEP 508 requirement: {e}") from e
        return MarkerCall(name, tuple(args))
    if name in ("requires_driver", "requires_cuda"):
        values = [*args, *kwargs.values()]
        if len(values) != 1 or (kwargs and "spec" not in kwargs):
            raise RuleError(f"{name}: takes exactly one specifier, e.g. {name}('>=12.4')")
        if not isinstance(values[0], str):
            raise RuleError(f"{name}: expected a specifier string such as '>=12.4', got {values[0]!r}")
        call = MarkerCall(name, (values[0],))
    elif name == "requires_gpu":
        names = ("count", "arch", "memory")
        if len(args) > 3 or set(kwargs) - set(names):
            raise RuleError("requires_gpu: signature is requires_gpu(count=1, arch=None, memory=None)")
        bound = dict(zip(names, args, strict=False))
        for key, value in kwargs.items():
            if key in bound:
                raise RuleError(f"requires_gpu: {key} given twice")
            bound[key] = value
        call = MarkerCall(name, (bound.get("count", 1), bound.get("arch"), bound.get("memory")))
    else:
        raise RuleError(f"unknown cudastack marker {name!r}")
    from pytest_cudastack.cuda.driver import DriverInfo

    # a dry run against an absent driver validates the arguments (RuleError on misuse)
    _driver_unmet(call, DriverInfo("absent", None, None, reason="argument check"))
    return call


# evaluation -----------------------------------------------------------------------------------------


def _soname_unmet(soname: str, facts: Facts) -> str | None:
    lib = facts.find(soname)
    if lib.path is not None:
        return None
    claims: list[str] = []
    for dist, path in facts.inventory.shipping(soname):
        if os.path.isfile(path):
            return None  # shipped by an installed wheel: loadable via that wheel's own search path
        claims.append(f"{dist.label} claims it at {path} but the file is missing")
    looked = ", ".join(lib.tried) if lib.tried else "no candidate directory"
    msg = f"{soname} not found by the dynamic linker (looked in: {looked})"
    if lib.problem:
        msg += f"; {lib.problem}"
    if claims:
        msg += "; " + "; ".join(claims)
    else:
        msg += "; no installed wheel ships it"
    return msg


def _broken(dist: Distribution, integrity: Sequence[Finding]) -> list[str]:
    problems = [f"{lib.path} (listed in RECORD) is missing" for lib in dist.libraries if not lib.exists]
    problems += [f.message for f in integrity if f.failing and dist.key in f.distributions]
    return problems


def _wheel_unmet(text: str, facts: Facts) -> str | None:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate():
        return None
    dist = facts.inventory.get(req.name)
    if dist is None:
        return f"{text}: no distribution {req.name!r} installed (searched {', '.join(facts.inventory.site_dirs)})"
    try:
        ok = req.specifier.contains(Version(dist.version), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        return f"{text}: installed {dist.label} does not satisfy {req.specifier}"
    broken = _broken(dist, facts.integrity)
    if broken:
        return f"{text}: {dist.label} is installed but not intact: " + "; ".join(broken)
    return None


def _driver_unmet(call: MarkerCall, driver: DriverInfo) -> str | None:
    from pytest_cudastack.cuda.driver import cuda_satisfies, driver_satisfies, gpus_satisfy

    if call.name == "requires_driver":
        ok, found = driver_satisfies(call.args[0], driver)
    elif call.name == "requires_cuda":
        ok, found = cuda_satisfies(call.args[0], driver)
    else:
        count, arch, memory = call.args
        ok, found = gpus_satisfy(count, arch, memory, driver)
    return None if ok else found


_EVALUATORS: dict[str, Callable[[MarkerCall, Facts], list[str]]] = {
    "requires_soname": lambda c, f: [m for s in c.args if (m := _soname_unmet(s, f))],
    "requires_wheel": lambda c, f: [m for r in c.args if (m := _wheel_unmet(r, f))],
    "requires_driver": lambda c, f: [m] if (m := _driver_unmet(c, f.driver)) else [],
    "requires_cuda": lambda c, f: [m] if (m := _driver_unmet(c, f.driver)) else [],
    "requires_gpu": lambda c, f: [m] if (m := _driver_unmet(c, f.driver)) else [],
}


def evaluate(call: MarkerCall, facts: Facts) -> Unmet | None:
    """``None`` when the marker is met, else ``Unmet`` naming every unmet part at once."""
    problems = _EVALUATORS[call.name](call, facts)
    if not problems:
        return None
    return Unmet(call.name, f"cudastack: {call} unmet: " + "; ".join(problems))


def evaluate_all(calls: Sequence[MarkerCall], facts: Facts) -> Unmet | None:
    """Evaluate every marker of a test; one ``Unmet`` listing all unmet ones (or ``None``)."""
    unmet = [u for c in calls if (u := evaluate(c, facts)) is not None]
    if not unmet:
        return None
    if len(unmet) == 1:
        return unmet[0]
    return Unmet(",".join(u.marker for u in unmet), "\n".join(u.reason for u in unmet))
