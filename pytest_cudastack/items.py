"""Generated invariant items: ``cudastack::integrity``, ``cudastack::scan[bin/train]``, ...

They are ordinary ``pytest.Item`` objects under one session-level collector named ``cudastack``, so they
show in ``--co``, ``-k``, JUnit and are distributed (once each) by xdist. An item fails iff its check has an
ERROR finding; warnings and infos go to ``user_properties`` (JUnit properties, the terminal summary).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_cudastack.findings import Finding, most_severe_first

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

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
    """One invariant check of the CUDA stack; ``check`` names it, ``target`` is a scanned binary's path."""

    def __init__(
        self,
        *,
        check: str,
        stack: Callable[[], Stack],
        target: str | None = None,
        subject: str = "",
        description: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.target = target
        self.subject = subject
        self.description = description
        self._stack = stack
        self.findings: tuple[Finding, ...] = ()

    def runtest(self) -> None:
        stack = self._stack()
        if self.target is not None:
            self.findings = stack.scan_findings(self.target, self.subject)
        else:
            self.findings = stack.findings(self.check)
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
        from pytest_cudastack.errors import CudaStackError

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
        descriptions = {
            "integrity": "every RECORD-listed shared library is present, intact and owned by one distribution",
            "closure": "every Python extension module resolves all its DT_NEEDED",
            "cuda-max": f"nothing requires a CUDA newer than {stack.settings.cuda_max}",
            "cuda-min": f"nothing is built for a CUDA older than {stack.settings.cuda_min}",
            "driver": "the driver supports the CUDA the stack requires",
            "arch": "GPU code runs on the target architectures",
            "baseline": f"the stack matches the snapshot {stack.settings.cudastack_baseline}",
        }
        for check in stack.settings.items:
            yield InvariantItem.from_parent(
                self, name=check, check=check, stack=self._stack, description=descriptions.get(check, "")
            )
        for name, path in stack.scan_targets:
            yield InvariantItem.from_parent(
                self,
                name=f"scan[{name}]",
                check="scan",
                target=path,
                subject=name,
                stack=self._stack,
                description="every DT_NEEDED resolves here",
            )
