"""The shape every check reports in: a finding that explains itself."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "Severity"]


class Severity(str, enum.Enum):
    ERROR = "error"  # fails the invariant item / `cudastack check` exits 1
    WARNING = "warning"  # shown, never fails
    INFO = "info"  # a fact worth reporting (optional plugin with an absent dep, no driver here)


@dataclass(frozen=True)
class Finding:
    """One problem (or notable fact) about the stack.

    ``check`` is the invariant it belongs to ("integrity", "closure", "cuda-max", "cuda-min", "scan",
    "driver", "arch", "baseline", "inventory"); ``subject`` the file, soname or distribution it is about.
    ``message`` says what was required and what was found, ``cause`` why, ``fix`` what to do.
    ``where`` lists places looked at (directories tried, RECORD files), ``chain`` the load chain that
    needs a missing library (root first). ``distributions`` names (canonically) the installed distributions
    the finding makes not intact, for checks such as ``requires_wheel``.
    """

    check: str
    severity: Severity
    subject: str
    message: str
    cause: str = ""
    fix: str = ""
    where: tuple[str, ...] = ()
    chain: tuple[str, ...] = ()
    details: tuple[str, ...] = field(default=())
    distributions: tuple[str, ...] = ()

    @property
    def failing(self) -> bool:
        return self.severity is Severity.ERROR

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity.value,
            "subject": self.subject,
            "message": self.message,
            "cause": self.cause,
            "fix": self.fix,
            "where": list(self.where),
            "chain": list(self.chain),
            "details": list(self.details),
            "distributions": list(self.distributions),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(
            check=str(data["check"]),
            severity=Severity(data["severity"]),
            subject=str(data["subject"]),
            message=str(data["message"]),
            cause=str(data.get("cause", "")),
            fix=str(data.get("fix", "")),
            where=tuple(data.get("where", ())),
            chain=tuple(data.get("chain", ())),
            details=tuple(data.get("details", ())),
            distributions=tuple(data.get("distributions", ())),
        )

    def render(self) -> str:
        """Multi-line human text: message, then cause, fix, chain and places looked."""
        lines = [f"{self.subject}: {self.message}"]
        if self.chain:
            lines.append("  needed by: " + " -> ".join(self.chain))
        if self.cause:
            lines.append(f"  cause: {self.cause}")
        if self.where:
            lines.append("  looked in: " + ", ".join(self.where))
        lines.extend(f"  {d}" for d in self.details)
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)
