"""The NVIDIA container runtime's start-up rules (``data/container_runtime.json``, validated on load) and its
requirement language, evaluated as libnvidia-container's ``dsl.c`` evaluates it.

``NVIDIA_REQUIRE_CUDA="cuda>=12.9 brand=tesla,driver>=535,driver<536"``: terms separated by spaces are ORed,
predicates separated by commas ANDed; ``cuda`` is the host driver's CUDA version, ``driver`` its version,
``arch`` a GPU's compute capability, ``brand`` its brand; versions compare number by number, trailing zeros
ignored (``dsl_compare_version``). Where a fact is unknown here (a GPU's brand, a driver branch's minor) a
predicate on it is undecided, and so is what depends on it: :func:`evaluate` answers True, False or None.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_cudastack.cuda.datafile import DataShape, check_data, shipped_json

__all__ = [
    "DATA_FILE",
    "HostFacts",
    "RuntimeData",
    "compare_version",
    "driver_capabilities",
    "evaluate",
    "first_term",
    "load_runtime",
    "required_cuda",
    "requirements",
    "validate_runtime",
]

DATA_FILE = "container_runtime.json"
SHAPE = DataShape(
    "container_runtime.schema.json",
    {"driver_libraries": ("library",)},
    ("requirements", "compat", "capabilities"),
    says=True,
)
_OPERATORS = ("<=", ">=", "!=", "=", "<", ">")
_PREDICATE = re.compile(r"([A-Za-z_]+)(<=|>=|!=|=|<|>)(.+)")


@dataclass(frozen=True)
class RuntimeData:
    """The runtime's rules: the requirement variables, the compat directory and the host's driver libraries."""

    require_prefix: str
    require_excluded: tuple[str, ...]
    disable: str
    legacy: str
    compat_dir: str
    compat_library: str
    driver_libraries: tuple[str, ...]
    capabilities_variable: str = "NVIDIA_DRIVER_CAPABILITIES"
    default_capabilities: tuple[str, ...] = ("utility", "compute")
    all_capabilities: str = "all"
    library_capability: tuple[tuple[str, str], ...] = ()  # (library, capability that mounts it)


def validate_runtime(raw: Any, source: str = DATA_FILE) -> RuntimeData:
    """The data file as :class:`RuntimeData`; ``DataError`` naming ``source`` and the field otherwise."""
    data = check_data(raw, source, SHAPE)
    req, compat = data["requirements"], data["compat"]
    return RuntimeData(
        str(req["prefix"]),
        tuple(str(x) for x in req["excluded"]),
        str(req["disable"]),
        str(req["legacy"]),
        str(compat["directory"]).rstrip("/"),
        str(compat["library"]),
        tuple(str(row["library"]) for row in data["driver_libraries"]),
        str(data["capabilities"]["variable"]),
        tuple(str(c) for c in data["capabilities"]["default"]),
        str(data["capabilities"]["all"]),
        tuple((str(row["library"]), str(row["capability"])) for row in data["driver_libraries"]),
    )


@functools.cache
def load_runtime() -> RuntimeData:
    """The shipped rules, validated once."""
    return validate_runtime(shipped_json(f"data/{DATA_FILE}"), DATA_FILE)


def _true(value: str) -> bool:
    # Go's strconv.ParseBool, as cuda_image.go reads NVIDIA_DISABLE_REQUIRE
    return value in ("1", "t", "T", "TRUE", "true", "True")


def requirements(env: Mapping[str, str], data: RuntimeData | None = None) -> tuple[tuple[str, str], ...]:
    """``(variable, expression)`` of each requirement the runtime checks for an image with environment
    ``env`` (``GetRequirements``): none when the disable variable is true; a legacy image's ``cuda>=X.Y``
    (from ``CUDA_VERSION``) under that variable's name."""
    rules = data or load_runtime()
    if _true(env.get(rules.disable, "")):
        return ()
    out = [
        (k, v)
        for k, v in sorted(env.items())
        if k.startswith(rules.require_prefix) and not k.startswith(rules.require_excluded)
    ]
    legacy = env.get(rules.legacy, "")
    if legacy and not env.get(rules.require_prefix + "CUDA"):
        found = re.match(r"v?(\d+)\.(\d+)", legacy)
        if found:
            out.append((rules.legacy, f"cuda>={found[1]}.{found[2]}"))
    return tuple(out)


def driver_capabilities(env: Mapping[str, str], data: RuntimeData | None = None) -> frozenset[str] | None:
    """The driver capabilities the runtime mounts for an image with environment ``env`` (None: all of them):
    the variable's comma-separated value when set and non-empty, all for a legacy image that does not set it,
    the default (``utility,compute``) otherwise (``getDriverCapabilities``)."""
    rules = data or load_runtime()
    value = env.get(rules.capabilities_variable)
    legacy = bool(env.get(rules.legacy)) and not env.get(rules.require_prefix + "CUDA")
    if value is None and legacy:
        return None
    if not value:
        return frozenset(rules.default_capabilities)
    caps = frozenset(c.strip() for c in value.split(",") if c.strip())
    return None if rules.all_capabilities in caps else caps


@dataclass(frozen=True)
class HostFacts:
    """What the requirement language reads: the driver's CUDA (``12.4``), its version (``550.54.15``), a GPU's
    compute capability (``9.0``) and brand; None where unknown here."""

    cuda: str | None
    driver: str | None
    arch: str | None = None
    brand: str | None = None
    driver_is_branch: bool = False  # only the branch is known ("550"): a comparison its minor decides is None


def compare_version(v1: str, op: str, v2: str) -> bool | None:
    """``dsl_compare_version``: dot-separated numbers compared in turn, trailing zeros ignored; None for a
    value that is not one."""
    if not re.fullmatch(r"[0-9.]+", v1) or not re.fullmatch(r"[0-9.]+", v2):
        return None
    a = [int(x) for x in v1.split(".") if x]
    b = [int(x) for x in v2.split(".") if x]
    while a and a[-1] == 0:
        a.pop()
    while b and b[-1] == 0:
        b.pop()
    order = (a > b) - (a < b)
    return {"=": order == 0, "!=": order != 0, "<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0}[op]


def _predicate(text: str, host: HostFacts) -> bool | None:
    found = _PREDICATE.fullmatch(text)
    if found is None:
        return None
    name, op, value = found[1].lower(), found[2], found[3]
    if name == "brand":
        if host.brand is None:
            return None
        return (host.brand.lower() == value.lower()) == (op == "=") if op in ("=", "!=") else None
    fact = {"cuda": host.cuda, "driver": host.driver, "arch": host.arch}.get(name)
    if fact is None:
        return None
    result = compare_version(fact, op, value)
    # a driver branch (550) against 550.54: the minor decides; against another major the branch alone does
    if name == "driver" and host.driver_is_branch and result is not None and value.split(".")[0] == fact:
        return None
    return result


def evaluate(expression: str, host: HostFacts) -> bool | None:
    """Whether the runtime accepts ``expression`` on ``host`` (``dsl_evaluate``): True, False, or None when
    it depends on a fact unknown here."""
    any_unknown = False
    for term in expression.split(" "):
        if not term:
            continue
        results = [_predicate(p, host) for p in term.split(",") if p]
        if all(r is True for r in results):
            return True
        if not any(r is False for r in results):
            any_unknown = True
    return None if any_unknown else False


def first_term(expression: str) -> str:
    """What the runtime's message names: the expression's first term (``cuda>=12.9``)."""
    return next((t for t in expression.split(" ") if t), expression)


def required_cuda(expression: str) -> str | None:
    """The ``cuda>=X.Y`` floor of the expression's first term, None when it has none."""
    for predicate in first_term(expression).split(","):
        found = _PREDICATE.fullmatch(predicate)
        if found and found[1].lower() == "cuda" and found[2] in (">=", ">"):
            return found[3]
    return None
