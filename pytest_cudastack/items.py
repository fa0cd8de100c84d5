"""Generated invariant items: ``cudastack::integrity``, ``cudastack::scan[bin/train]``, ...

They are ordinary ``pytest.Item`` objects under one session-level collector named ``cudastack``, so they
show in ``--co``, ``-k``, JUnit and are distributed (once each) by xdist. An item fails iff its check has an
ERROR finding; warnings and infos go to ``user_properties`` (JUnit properties, the terminal summary).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cudastack.checks import enabled_checks
from pytest_cudastack.errors import CudaStackError
from pytest_cudastack.findings import Finding, most_severe_first

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

    from pytest_cudastack.checks.facts import Target
    from pytest_cudastack.stack import Stack

__all__ = ["FINDING_PROPERTY", "CudaStackCollector", "InvariantFailed", "InvariantItem", "render_findings"]

FINDING_PROPERTY = "cudastack.finding"


class InvariantFailed(Exception):
    """Raised by ``InvariantItem.runtest`` when its check has ERROR findings."""

    def __init__(self, findings: tuple[Finding, ...]) -> None:
        super().__init__(f"{sum(f.failing for f in findings)} cudastack finding(s)")
        self.findings = findings


def render_findings(findings: Iterable[Finding]) -> str:
    """Findings as text, errors first, each with its cause, chain, places looked and fix."""
    return "\n".join(f"[{f.severity.value}] {f.render()}" for f in most_severe_first(findings))


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
        self.findings = self._stack().findings(self.check, self.target)
        for finding in self.findings:
            self.user_properties.append((FINDING_PROPERTY, _property(finding)))
        if any(f.failing for f in self.findings):
            raise InvariantFailed(self.findings)

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: Any = None,
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, InvariantFailed):
            return render_findings(excinfo.value.findings)
        if isinstance(excinfo.value, CudaStackError):
            return f"cudastack: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "cudastack", None, f"cudastack::{self.name}" + (f": {self.description}" if self.description else "")


def _property(finding: Finding) -> str:
    return f"{finding.severity.value}: {finding.render()}"


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
