"""Generated invariant items: ``cudastack::integrity``, ``cudastack::scan[bin/train]``, ...

They are ordinary ``pytest.Item`` objects under one session-level collector named ``cudastack``, so they
show in ``--co``, ``-k``, JUnit and are distributed (once each) by xdist. An item fails iff its check has an
ERROR finding, and shows the errors (only) in its failure; its findings as text go to its JUnit system-out
(``session.junit_output``) and, with ``junit_family = xunit1``, to ``user_properties`` (JUnit properties).
Its findings as data (``ItemResult``) travel with its call report (``REPORT_RESULT``, serialised by
``pytest_cudastack.session`` under xdist): the end-of-run summary and repair plan read them there, on the
controller, and run no check again. An item whose check has nothing to check here is skipped
with the check's reason (``Check.skip_reason``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cudastack.checks import enabled_checks, lookup
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import Finding, Severity, most_severe_first

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr
    from _pytest._io import TerminalWriter

    from pytest_cudastack.checks.facts import Target
    from pytest_cudastack.stack import Stack

__all__ = [
    "FINDING_PROPERTY",
    "MAX_SHOWN",
    "PLAN_POINTER",
    "REPORT_RESULT",
    "CudaStackCollector",
    "FindingsRepr",
    "InvariantFailed",
    "InvariantItem",
    "ItemResult",
    "finding_properties",
    "headlines",
    "render_findings",
]

FINDING_PROPERTY = "cudastack.finding"  # the user_properties name (JUnit <property>) of a finding's text
REPORT_RESULT = "cudastack_result"  # the attribute of an invariant item's call report holding its ItemResult
# Findings one item prints (and records as properties) before saying how many more: 1,000 missing sonames
# are one cause, and ``cudastack check --json`` lists them all.
MAX_SHOWN = 100
# What an error's failure says instead of its commands: the run's repair plan, printed before the failures,
# holds every step once (the failure is rendered on the worker, before the plan exists under xdist).
PLAN_POINTER = "see the cudastack repair plan above (each step names the findings it resolves)"


class InvariantFailed(Exception):
    """Raised by ``InvariantItem.runtest`` when its check has ERROR findings."""

    def __init__(self, findings: tuple[Finding, ...]) -> None:
        super().__init__(f"{sum(f.failing for f in findings)} cudastack finding(s)")
        self.findings = findings


def render_findings(findings: Iterable[Finding]) -> str:
    """Findings as text, errors first, each with its cause, chain, places looked and fix."""
    ordered = most_severe_first(findings)
    lines = [f"[{f.severity.value}] {f.render()}" for f in ordered[:MAX_SHOWN]]
    if len(ordered) > MAX_SHOWN:
        lines.append(_more(len(ordered) - MAX_SHOWN))
    return "\n".join(lines)


def _more(n: int) -> str:
    return f"... {n} more finding{'' if n == 1 else 's'} (cudastack check --json lists them all)"


def finding_properties(findings: tuple[Finding, ...]) -> list[tuple[Severity, str]]:
    """``(severity, "warning: text")`` of each finding an item shows (``MAX_SHOWN``, most severe first when
    there are more, then an info saying how many more): its JUnit properties and its lines in the summary."""
    shown = findings if len(findings) <= MAX_SHOWN else most_severe_first(findings)[:MAX_SHOWN]
    out = [(f.severity, f"{f.severity.value}: {f.render()}") for f in shown]
    if len(findings) > MAX_SHOWN:
        out.append((Severity.INFO, f"{Severity.INFO.value}: {_more(len(findings) - MAX_SHOWN)}"))
    return out


@dataclass(frozen=True)
class ItemResult:
    """What an invariant item's call report carries as data: its check, its target's display name (a
    per-target item's, else None) and its findings. JSON-able (``to_json``/``from_json``) for xdist."""

    check: str
    target: str | None
    findings: tuple[Finding, ...]

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "target": self.target, "findings": [f.to_json() for f in self.findings]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ItemResult:
        target = data.get("target")
        return cls(
            check=str(data["check"]),
            target=None if target is None else str(target),
            findings=tuple(Finding.from_json(f) for f in data.get("findings", ())),
        )


@dataclass(frozen=True)
class Crash:
    """What pytest's short summary reads from a failure (``longrepr.reprcrash.message``): one line."""

    message: str


@dataclass(frozen=True)
class FindingsRepr:
    """An item's failure: its ERROR findings, each headline red through pytest's terminal writer.

    Duck-typed like pytest's ``TerminalRepr`` (``toterminal``, ``str``): pytest prints it with
    ``toterminal``; xdist, JUnit and ``longreprtext`` read ``str``. ``reprcrash`` gives the short summary
    one line naming the errors' subjects rather than repeating them.
    """

    findings: tuple[Finding, ...]
    compact: bool = True

    @property
    def reprcrash(self) -> Crash:
        errors = [f for f in self.findings if f.failing]
        subjects = ", ".join(dict.fromkeys(f.subject for f in errors))
        return Crash(f"{len(errors)} error{'' if len(errors) == 1 else 's'}: {subjects}")

    def lines(self) -> Iterator[tuple[str, bool]]:
        """``(line, is a headline)`` of every error, most severe first."""
        errors = most_severe_first(f for f in self.findings if f.failing)
        for finding in errors[:MAX_SHOWN]:
            text = finding.render(compact=self.compact, plan_step=PLAN_POINTER)
            first, *rest = f"[{finding.severity.value}] {text}".splitlines()
            yield first, True
            for line in rest:
                yield line, False
        if len(errors) > MAX_SHOWN:
            yield _more(len(errors) - MAX_SHOWN), True

    def toterminal(self, tw: TerminalWriter) -> None:
        for line, headline in self.lines():
            tw.line(line, red=headline, bold=headline)

    def __str__(self) -> str:
        return "\n".join(line for line, _ in self.lines())


def _junit_family(config: pytest.Config) -> str | None:
    """``junit_family`` (xunit2 by default), None without pytest's junitxml plugin (``-p no:junitxml``)."""
    try:
        family = str(config.getini("junit_family"))
    except ValueError:
        return None
    return "xunit1" if family == "legacy" else family  # as pytest's junitxml reads it


def headlines(findings: Iterable[Finding]) -> str:
    """The first line of each ERROR finding, most severe first, ``; ``-joined: a JUnit failure's message."""
    return "; ".join(f.render().splitlines()[0] for f in most_severe_first(f for f in findings if f.failing))


class InvariantItem(pytest.Item):
    """One invariant check of the CUDA stack; ``check`` names it (``checks.CHECKS``), ``target`` is the
    ``(display name, path)`` of a per-target check's item (a scanned binary)."""

    def __init__(
        self,
        *,
        check: str,
        stack: Callable[[], Stack],
        target: Target | None = None,
        description: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.target = target
        self.description = description
        self._stack = stack
        self.findings: tuple[Finding, ...] = ()

    def runtest(self) -> None:
        stack = self._stack()
        reason = lookup(self.check).skip_reason(stack, self.target)
        if reason is not None:
            pytest.skip(reason)
        self.findings = stack.findings(self.check, self.target)
        if _junit_family(self.config) == "xunit1":
            # xunit2's testcase has no <properties> (pytest warns its record_property users): there the
            # findings go to the testcase's failure message and system-out (session.junit_output)
            for _, text in finding_properties(self.findings):
                self.user_properties.append((FINDING_PROPERTY, text))
        if any(f.failing for f in self.findings):
            raise InvariantFailed(self.findings)

    def result(self) -> ItemResult:
        """Its findings as data, for its call report (``REPORT_RESULT``)."""
        return ItemResult(self.check, None if self.target is None else self.target[0], self.findings)

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: Any = None,
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, InvariantFailed):
            # duck-typed TerminalRepr (pytest calls toterminal / str); subclassing pytest's would import _pytest
            return FindingsRepr(excinfo.value.findings, compact=self.config.option.verbose <= 0)  # type: ignore[return-value]
        if isinstance(excinfo.value, CudaStackError):
            return f"cudastack: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "cudastack", None, f"cudastack::{self.name}" + (f": {self.description}" if self.description else "")


class CudaStackCollector(pytest.Collector):
    """The session-level collector ``cudastack`` holding the generated invariant items."""

    def __init__(self, *, stack: Callable[[], Stack], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._stack = stack

    @classmethod
    def for_session(cls, session: pytest.Session, stack: Callable[[], Stack]) -> CudaStackCollector:
        # nodeid "cudastack" (not "::cudastack") so the items read cudastack::integrity
        return cls.from_parent(session, name="cudastack", nodeid="cudastack", stack=stack)

    def collect(self) -> Iterator[pytest.Item]:
        stack = self._stack()
        for check in enabled_checks(stack.settings):
            description = check.describe(stack.settings)
            for name, target in check.expand(stack):
                yield InvariantItem.from_parent(
                    self, name=name, check=check.name, target=target, stack=self._stack, description=description
                )
