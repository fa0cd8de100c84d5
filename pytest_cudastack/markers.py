"""Marker semantics as pure functions: ``requires_*`` arguments + stack facts -> ``Unmet`` or ``None``.

Like pytest's ``skipping.py``: ``check_marker`` validates a marker's arguments (raising ``RuleError`` on
misuse) and ``evaluate`` returns a frozen ``Unmet`` whose ``reason`` names what was required, what was
found and where it looked. The plugin only acts on the result (fail or skip). No pytest here.

The driver markers' predicates (``driver_satisfies``, ``cuda_satisfies``, ``gpus_satisfy``) take a
``DriverInfo``, probed or declared; their specifiers are read by :mod:`pytest_cudastack.cuda.versions`.
"""

from __future__ import annotations

import logging
import os
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import Specifier
from packaging.version import Version

from pytest_cudastack.checks.requirements import cuda_relevant
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.cuda.versions import (
    Arch,
    ArchSpec,
    parse_arch,
    parse_arch_spec,
    parse_cuda,
    parse_cuda_spec,
    parse_driver,
    parse_driver_spec,
)
from pytest_cudastack.errors import OptionError, RuleError
from pytest_cudastack.escape import printable
from pytest_cudastack.findings import Finding
from pytest_cudastack.wheels.requirements import (
    RequirementFact,
    Requirements,
    Status,
    evaluate_marker,
    evaluate_requirement,
    marker_environment,
)

if TYPE_CHECKING:
    from pytest_cudastack.linker.resolver import Library
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = [
    "REASON_LONG",
    "REASON_PARTS",
    "REASON_WIDTH",
    "Facts",
    "MarkerCall",
    "Unmet",
    "check_marker",
    "cuda_satisfies",
    "driver_satisfies",
    "evaluate",
    "evaluate_all",
    "gpus_satisfy",
    "parse_memory",
    "short_reason",
]

logger = logging.getLogger(__name__)

REASON_WIDTH = 120  # a reason's lines are wrapped to this width (pytest's default terminal is 80-120 wide)
REASON_LONG = 4 * REASON_WIDTH  # a marker's reason longer than this is wrapped and capped
REASON_PARTS = 6  # parts of a long reason shown below -v; the rest is counted ("... N more (-v)")

_SONAME_RE = re.compile(r"[A-Za-z0-9_+.\-]+\.so(\.[0-9A-Za-z_.\-]+)?")


class Facts(Protocol):
    """What marker evaluation reads; ``stack.Stack`` provides it lazily."""

    @property
    def driver(self) -> DriverInfo: ...

    @property
    def inventory(self) -> Inventory: ...

    @property
    def integrity(self) -> tuple[Finding, ...]: ...

    @property
    def requirements(self) -> Requirements: ...

    def find(self, soname: str) -> Library: ...


@dataclass(frozen=True)
class MarkerCall:
    """A validated marker: its name and normalised arguments."""

    name: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        """The call as written: ``requires_soname('libcudnn.so.9')``, ``requires_gpu(count=1, arch='sm_90')``."""
        if self.name == "requires_gpu":
            count, arch, memory = self.args
            named = [f"count={count!r}"] + [
                f"{k}={v!r}" for k, v in (("arch", arch), ("memory", memory)) if v is not None
            ]
            return f"{self.name}({', '.join(named)})"
        return f"{self.name}({', '.join(repr(a) for a in self.args)})"


@dataclass(frozen=True)
class Unmet:
    """An unmet marker; ``reason`` is the whole message (what was required, found, and where looked)."""

    marker: str
    reason: str

    def render(self, verbose: int = 0) -> str:
        """``reason`` for a terminal. A marker's reason longer than ``REASON_LONG`` is split into its parts
        ("; "), one a line, wrapped at ``REASON_WIDTH``; below ``-v`` at most ``REASON_PARTS`` parts and
        "... N more (-v)". Shorter reasons stay one line each, so one test reads as one line."""
        lines: list[str] = []
        for reason in self.reason.splitlines():
            head, sep, rest = reason.partition(" unmet: ")
            if len(reason) <= REASON_LONG or not sep:
                lines.append(reason)
                continue
            lines.append(f"{head}{sep}".rstrip())
            parts = rest.split("; ")
            shown = parts if verbose > 0 or len(parts) <= REASON_PARTS else parts[: REASON_PARTS - 1]
            for part in shown:
                lines.extend(
                    textwrap.wrap(
                        part,
                        REASON_WIDTH,
                        initial_indent="  ",
                        subsequent_indent="    ",
                        break_long_words=False,
                        break_on_hyphens=False,
                    )
                )
            if len(shown) < len(parts):
                lines.append(f"  ... {len(parts) - len(shown)} more (-v)")
        return printable("\n".join(lines), newlines=True)  # names and paths from files


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
    """The requirement as pip would judge it (wheels/requirements.py: its version, then the requirements its
    extras add), then the distribution intact: its RECORD-listed libraries present, no integrity error, its
    own CUDA requirements met (a torch whose nvidia pins are unmet is not intact)."""
    req = Requirement(text)
    inv = facts.inventory
    # the one evaluator's environment: the inspected interpreter (its site directory), as for Requires-Dist
    if req.marker is not None:
        holds = evaluate_marker(req.marker, marker_environment(next(iter(inv.site_dirs), None)))
        if isinstance(holds, str):
            return f"requires_wheel({text!r}): its marker cannot be evaluated ({holds})"
        if not holds:
            return None
    own, *added = evaluate_requirement(req, inv)
    dist = own.installed
    if dist is None:
        return f"{text}: no distribution {req.name!r} installed (searched {', '.join(inv.site_dirs)})"
    if own.status is Status.VERSION:
        return f"{text}: installed {dist.label} does not satisfy {req.specifier}"
    unmet = [f for f in added if not f.met]
    if unmet:
        return f"{text}: " + "; ".join(f"{f.requester} requires {f.text}, {_found(f)}" for f in unmet)
    broken = _broken(dist, facts.integrity)
    broken += [
        f"it requires {f.text}, {_found(f)}"
        for f in facts.requirements.of(dist)
        if not f.met and not f.inferred and cuda_relevant(f)
    ]
    if broken:
        return f"{text}: {dist.label} is installed but not intact: " + "; ".join(broken)
    return None


def _found(fact: RequirementFact) -> str:
    return "which is not installed" if fact.installed is None else f"{fact.installed.version} is installed"


def _driver_unmet(call: MarkerCall, driver: DriverInfo) -> str | None:
    if call.name == "requires_driver":
        ok, found = driver_satisfies(call.args[0], driver)
    elif call.name == "requires_cuda":
        ok, found = cuda_satisfies(call.args[0], driver)
    else:
        count, arch, memory = call.args
        ok, found = gpus_satisfy(count, arch, memory, driver)
    return None if ok else found


# driver, CUDA and GPU predicates -----------------------------------------------------------------------


def short_reason(reason: str | None) -> str:
    """A driver probe's reason in a few words, for a header or a marker reason ("no libnvidia-ml.so.1"):
    its first clause without the parenthesised details (``nvml_reason`` writes "nvmlInit: ... (details)
    (NVML_ERROR_X)"); the whole reason is in the header at ``-v``."""
    if not reason:
        return "unknown"
    if "NVML_ERROR_LIBRARY_NOT_FOUND" in reason or ("libnvidia-ml.so.1" in reason and "not found" in reason):
        return "no libnvidia-ml.so.1"
    text = reason.split("; ")[0]
    text = re.sub(r" \([^()]*(\([^()]*\)[^()]*)*\)", "", text).strip()
    return text if len(text) <= 60 else text[:57] + "..."


def _source_tag(source: str | None) -> str:
    return f" ({source})" if source in ("probed", "declared") else ""


def _branch_meets(spec: Specifier, branch: int) -> bool | None:
    """Whether every driver of ``branch`` (580.x, minor unknown) meets ``spec``: True, False (none does) or None.

    A specifier whose version lies outside the branch puts the whole branch on one side of it; inside the
    branch only ``>=580``, ``<580``, ``~=580.0`` and ``==580.*`` / ``!=580.*`` decide.
    """
    wildcard = spec.version.endswith(".*")
    release = parse_driver(spec.version.removesuffix(".*"), error=RuleError).release
    if release[0] != branch:
        return spec.contains(Version(str(branch)), prereleases=True)
    at_branch = all(n == 0 for n in release[1:])
    if wildcard:
        if len(release) == 1:
            return spec.operator == "=="
        return None
    if at_branch and spec.operator in (">=", "<"):
        return spec.operator == ">="
    if spec.operator == "~=" and release[1:] == (0,):
        return True
    return None


def driver_satisfies(spec: str, driver: DriverInfo) -> tuple[bool, str]:
    """``requires_driver(">=550")``: is the driver version in ``spec``? (A bare "550" means ">=550".)

    A declared branch without a minor (``--cuda-driver=R580``) meets the specifier only when every 580.x does;
    when some 580.x would and some would not, it is unmet and the reason says the minor is unknown.
    """
    wanted = parse_driver_spec(spec)
    if not driver.version:
        return False, f"no driver ({short_reason(driver.reason)}); requires driver {wanted}"
    try:
        found = parse_driver(driver.version)
    except OptionError:
        return False, f"driver version {driver.version!r} is not comparable; requires driver {wanted}"
    if found.branch_only:
        verdicts = [_branch_meets(s, found.branch) for s in wanted]
        who = f"driver branch R{found.branch}{_source_tag(driver.source)}"
        if False in verdicts:
            return False, f"{who}; requires {wanted}"
        if None in verdicts:
            return False, (
                f"{who}, minor version unknown: cannot tell whether it meets {wanted}; requires {wanted} "
                "(declare the full driver version to decide)"
            )
        return True, f"{who}; requires {wanted}"
    ok = wanted.contains(found.as_version(), prereleases=True)
    return ok, f"driver {driver.version}{_source_tag(driver.source)}; requires {wanted}"


def cuda_satisfies(spec: str, driver: DriverInfo) -> tuple[bool, str]:
    """``requires_cuda(">=12.4")``: is the highest CUDA the driver supports in ``spec``?"""
    wanted = parse_cuda_spec(spec)
    if not driver.cuda_version:
        who = f"driver {driver.version}" if driver.version else "no driver"
        return False, f"{who}: CUDA version unknown ({short_reason(driver.reason)}); requires CUDA {wanted}"
    try:
        found = parse_cuda(driver.cuda_version)
    except OptionError:
        return False, f"CUDA version {driver.cuda_version!r} is not comparable; requires {wanted}"
    ok = wanted.contains(found.as_version(), prereleases=True)
    who = f"driver {driver.version}" if driver.version else "the driver"
    return ok, f"{who}{_source_tag(driver.source)} supports CUDA <= {driver.cuda_version}; requires {wanted}"


_MEMORY_RE = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[KMGT]i?B?|[kmgt]i?b?|B|b)?\s*$")
_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KI": 2**10,
    "MI": 2**20,
    "GI": 2**30,
    "TI": 2**40,
}


def parse_memory(value: int | str) -> int:
    """Bytes from an int or "40GiB" / "40Gi" (binary) / "80GB" / "80G" (decimal) / "512MiB"; RuleError else."""
    if isinstance(value, bool):
        raise RuleError(f"invalid memory {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise RuleError(f"invalid memory {value!r}: negative")
        return value
    m = _MEMORY_RE.match(str(value))
    if not m:
        raise RuleError(f"invalid memory {value!r} (expected bytes or e.g. '40GiB', '80GB')")
    unit = (m["unit"] or "").upper()
    unit = unit[:-1] if len(unit) > 1 and unit.endswith("B") else unit
    return int(float(m["num"]) * _UNITS[unit])


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _arch_of(text: str) -> Arch | None:
    """A probed or declared arch ("9.0", "sm_90"); None when NVML gave nothing usable."""
    try:
        return parse_arch(text)
    except OptionError:
        return None


def _arch_matches(spec: ArchSpec, arch: Arch | None) -> bool:
    """Compute capabilities are compared; the a/f suffix of either side is ignored."""
    if arch is None:
        return False
    if spec.specifier is not None:
        return spec.specifier.contains(Version(arch.cc), prereleases=True)
    return any((a.major, a.minor) == (arch.major, arch.minor) for a in spec.archs)


def gpus_satisfy(
    count: int = 1, arch: str | None = None, memory: int | str | None = None, driver: DriverInfo | None = None
) -> tuple[bool, str]:
    """``requires_gpu(count=1, arch=">=8.0"|"sm_90", memory="40GiB")`` against probed GPUs or declared archs.

    With declared archs (``--cuda-arch``) the GPU count and memory are unknown: an arch requirement is met by
    any declared arch, a count above 1 or a memory requirement is not met (the reason says so).
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise RuleError(f"requires_gpu count must be a non-negative integer, got {count!r}")
    arch_spec = parse_arch_spec(arch) if arch is not None else None
    need_mem = parse_memory(memory) if memory is not None else None
    wants = [f"{count} GPU{'s' if count != 1 else ''}"]
    if arch_spec is not None:
        wants.append(f"arch {arch_spec}")
    if need_mem is not None:
        wants.append(f"memory >= {_fmt_bytes(need_mem)}")
    wanted = "requires " + ", ".join(wants)
    if driver is None:
        return False, f"no driver information; {wanted}"
    if driver.arch_source == "declared" and not driver.gpus:
        hits = [a for a in driver.archs if arch_spec is None or _arch_matches(arch_spec, _arch_of(a))]
        found = f"declared archs {','.join(driver.archs)}"
        if need_mem is not None:
            return False, f"{found} (GPU memory unknown when archs are declared); {wanted}"
        if count > 1:
            return False, f"{found} (GPU count unknown when archs are declared); {wanted}"
        ok = count == 0 or bool(hits)
        return ok, f"{found}; {wanted}"
    if not driver.gpus:
        if driver.source == "declared" and driver.arch_source != "declared":
            # --cuda-driver alone declares a driver, not GPUs: say which of the two is missing
            found = "no GPU probed here and none declared (--cuda-driver declares the driver; --cuda-arch the GPUs)"
            return count == 0, f"{found}; {wanted}"
        why = short_reason(driver.reason) if driver.reason else "NVML sees no GPU"
        return count == 0, f"no GPU{_source_tag(driver.arch_source or driver.source)} ({why}); {wanted}"
    matching = []
    for gpu in driver.gpus:
        if arch_spec is not None and not _arch_matches(arch_spec, _arch_of(gpu.compute_capability)):
            continue
        if need_mem is not None and (gpu.memory_total is None or gpu.memory_total < need_mem):
            continue
        matching.append(gpu)
    shown = "; ".join(
        f"{g.name} {g.compute_capability or '?'}"
        + (f" {_fmt_bytes(g.memory_total)}" if g.memory_total is not None else "")
        for g in driver.gpus
    )
    found = f"{len(matching)} of {len(driver.gpus)} GPUs{_source_tag(driver.arch_source)} match ({shown})"
    return len(matching) >= count, f"{found}; {wanted}"


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
