"""The registry of invariant checks: ``CHECKS``, the one list of them, in run order.

Each entry is the pytest item ``cudastack::NAME`` (a per-target check: one ``cudastack::NAME[TARGET]`` per
target), one key of ``Stack.run_checks`` and ``Stack.findings``, and one verdict line of ``cudastack check``;
its ``enabled`` says when the options turn it on (``Settings.items``). Nothing else lists every check;
``model/repair.py``'s ``_MODELLED`` names the ones whose findings the repair model plans pip commands for
("integrity", "closure", "requirements", "cuda-max", "cuda-min", "driver"), and a new check whose errors a pip command
can fix is added there too.

Adding a check = one module + one registry line (and its name in ``model/repair.py``'s ``_MODELLED`` when pip
can fix its errors):

1. ``checks/<name>.py`` with ``run(stack: StackView, target: Target | None) -> tuple[Finding, ...]`` that
   reads only what ``facts.StackView`` offers (a fact it lacks goes on that Protocol and on ``Stack``);
2. ``Check("<name>", "<what it states>", _Lazy("<name>"), lambda o: <when the options turn it on>)`` in
   ``CHECKS`` below, at its place in the run order (``targets=`` for one item per target, as scan has;
   ``skip=_Lazy("<name>", "nothing_to_check")`` when the check can have nothing to check here: its reason
   skips the item and shows as "skip" in ``cudastack check``).

tests/test_registry.py registers a dummy check that way and finds it in every place that lists items.

An entry imports its module on first run (``_Lazy``): every active pytest session reads the registry
(``Settings.items``; an unused plugin imports only ``plugin`` and ``options``), and the checks' modules import
the ELF, resolver and wheel readers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # types only: the registry is read in every pytest session and stays light
    from pytest_cudastack.checks.facts import Options, StackView, Target
    from pytest_cudastack.findings import Finding

__all__ = ["CHECKS", "Check", "Run", "Skip", "enabled_checks", "lookup", "registry"]

Run: TypeAlias = "Callable[[StackView, Target | None], tuple[Finding, ...]]"
"""A check's findings from the stack's facts, for one target of a per-target check (else None)."""

Skip: TypeAlias = "Callable[[StackView, Target | None], str | None]"
"""Why a check has nothing to check on this stack ("no GPU arch known: pass --cuda-arch=sm_XX"), else None."""


@dataclass(frozen=True)
class Check:
    """One invariant check.

    ``name`` names its item (``cudastack::NAME``); ``description`` is what the item states (shown with it),
    where ``{field}`` stands for an option's value (``describe`` fills it in); ``run`` gives its findings,
    of which an ERROR fails the item; ``enabled`` says whether the options turn it on. ``targets``, set for
    a per-target check, lists its ``(display name, path)`` targets: one item ``NAME[display name]`` each.
    ``skip``, when set, says why there is nothing to check (the item is then skipped, not run).
    """

    name: str
    description: str
    run: Run
    enabled: Callable[[Options], bool]
    targets: Callable[[StackView], tuple[Target, ...]] | None = None
    skip: Skip | None = None

    def skip_reason(self, stack: StackView, target: Target | None = None) -> str | None:
        """Why this check has nothing to check on ``stack`` (its item is SKIPPED), or None: run it."""
        return None if self.skip is None else self.skip(stack, target)

    def describe(self, options: Options) -> str:
        """The description with the options' values: ``nothing requires a CUDA newer than 12.9``."""
        return self.description.format_map(_OptionValues(options))

    def expand(self, stack: StackView) -> tuple[tuple[str, Target | None], ...]:
        """``(item name, target)`` of each item this check becomes: itself, or one per target."""
        if self.targets is None:
            return ((self.name, None),)
        return tuple((f"{self.name}[{target[0]}]", target) for target in self.targets(stack))


@dataclass(frozen=True)
class _OptionValues:
    """``str.format_map``'s mapping over the options' attributes."""

    options: Options

    def __getitem__(self, key: str) -> object:
        return getattr(self.options, key)


@dataclass(frozen=True)
class _Lazy:
    """``checks/<module>.py``'s ``function``, imported when first called."""

    module: str
    function: str = "run"

    def __call__(self, stack: StackView, target: Target | None) -> tuple[Finding, ...]:
        # lazy: Settings reads this registry in every pytest session; a check's module (ELF reader, resolver,
        # wheel readers) loads only when that check runs. Only this package's own modules are named here.
        run: Run = getattr(importlib.import_module(f"{__name__}.{self.module}"), self.function)
        return run(stack, target)


@dataclass(frozen=True)
class _LazySkip:
    """``checks/<module>.py``'s ``nothing_to_check``, imported when first called (as ``_Lazy``)."""

    module: str

    def __call__(self, stack: StackView, target: Target | None) -> str | None:
        skip: Skip = importlib.import_module(f"{__name__}.{self.module}").nothing_to_check
        return skip(stack, target)


def registry(*checks: Check) -> Mapping[str, Check]:
    """A read-only registry of ``checks`` in the order given; ``ValueError`` on a name given twice."""
    out: dict[str, Check] = {}
    for check in checks:
        if check.name in out:
            raise ValueError(f"cudastack check {check.name!r} registered twice")
        out[check.name] = check
    return MappingProxyType(out)


CHECKS: Mapping[str, Check] = registry(
    Check(
        "integrity",
        "every RECORD-listed shared library is present, intact and owned by one distribution",
        _Lazy("integrity"),
        lambda o: o.cudastack,
    ),
    Check(
        "closure", "every Python extension module resolves all its DT_NEEDED", _Lazy("closure"), lambda o: o.cudastack
    ),
    Check(
        "dlopen",
        "every library loaded at run time (dlopen) is found, for the CUDA its caller is built for",
        _Lazy("dlopen"),
        lambda o: o.cudastack,
    ),
    Check("symbols", "every undefined symbol binds, with its version", _Lazy("symbols"), lambda o: o.cudastack),
    Check(
        "cuda-max",
        "nothing requires a CUDA newer than {cuda_max}",
        _Lazy("bounds", "run_max"),
        lambda o: o.cuda_max is not None,
    ),
    Check(
        "cuda-min",
        "nothing is built for a CUDA older than {cuda_min}",
        _Lazy("bounds", "run_min"),
        lambda o: o.cuda_min is not None,
    ),
    Check(
        "driver",
        "the driver supports the CUDA the stack requires",
        _Lazy("driver"),
        lambda o: o.cudastack or o.cuda_driver is not None,
        skip=_LazySkip("driver"),
    ),
    Check(
        "container",
        "the NVIDIA container runtime starts the image on the declared host, with the host's driver",
        _Lazy("container"),
        lambda o: o.cudastack and o.cudastack_image is not None,
    ),
    Check(
        "arch",
        "GPU code runs on the target architectures",
        _Lazy("arch"),
        lambda o: o.cudastack or bool(o.cuda_arch),
        skip=_LazySkip("arch"),
    ),
    Check(
        "requirements",
        "Requires-Dist present and pins met, framework version rules hold, no shadowed copy",
        _Lazy("requirements"),
        lambda o: o.cudastack,
        skip=_LazySkip("requirements"),
    ),
    Check(
        "toolchain",
        "the compiler tools each framework runs accept what the stack emits",
        _Lazy("toolchain"),
        lambda o: o.cudastack,
        skip=_LazySkip("toolchain"),
    ),
    Check(
        "baseline",
        "the stack matches the snapshot {cudastack_baseline}",
        _Lazy("baseline"),
        lambda o: o.cudastack_baseline is not None,
    ),
    Check(
        "scan",
        "every DT_NEEDED resolves here",
        _Lazy("scan"),
        lambda o: bool(o.cudastack_scan) or o.cudastack_image is not None,  # an image's own binaries
        targets=lambda stack: (*stack.scan_targets, *stack.scan_dirs),
    ),
)


def enabled_checks(options: Options) -> tuple[Check, ...]:
    """The checks ``options`` turn on, in run order (read from ``CHECKS`` at each call)."""
    return tuple(check for check in CHECKS.values() if check.enabled(options))


def lookup(name: str) -> Check:
    """The check named ``name`` (read from ``CHECKS`` at each call); ``ValueError`` for an unknown name."""
    try:
        return CHECKS[name]
    except KeyError:
        raise ValueError(f"unknown cudastack check {name!r}") from None
