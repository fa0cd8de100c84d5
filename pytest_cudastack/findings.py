"""The shape every check reports in: a finding that explains itself."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SEVERITY_ORDER", "Finding", "Severity", "most_severe_first"]

_COMPACT_ITEMS = 3  # places looked in and details the compact form lists before saying how many more
# The full form's caps: an RPATH at the ELF reader's cap (4,096 directories) times 1,000 missing sonames
# printed 100 MB; --json keeps every entry.
_FULL_ITEMS = 50  # places looked in and details
_FULL_CHAIN = 20  # hops of a load chain (the first and last halves are shown)
_MAX_TEXT = 2000  # characters of one field (a soname can be a 100 KB string)


class Severity(str, enum.Enum):
    """How much a finding matters; declared most severe first, the order findings are shown in."""

    ERROR = "error"  # fails the invariant item / `cudastack check` exits 1
    WARNING = "warning"  # shown, never fails
    INFO = "info"  # a fact worth reporting (optional plugin with an absent dep, no driver here)

    @property
    def rank(self) -> int:
        """0 for ERROR, 1 for WARNING, 2 for INFO: the sort key that puts the most severe first."""
        return SEVERITY_ORDER.index(self)


SEVERITY_ORDER: tuple[Severity, ...] = tuple(Severity)


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

    def render(self, *, compact: bool = False) -> str:
        """Multi-line human text: message, then the chain, cause, places looked in, details and fix.

        The full form (failed items, ``cudastack check``, ``cudastack report -v``) lists up to 50 places and
        50 details, 20 hops of the chain and 2,000 characters of each field, and says how many more
        ``--json`` would show; the compact form (``cudastack report``) lists at most three places and three
        details and says how many more ``-v`` or ``--json`` would show.
        """
        # a message that already opens with its subject ("libcuda.so.1: loaded at run time by ...", "torch 2.14.1
        # is a CUDA 13 build ...") says it once
        opens = bool(self.subject) and self.message.startswith((f"{self.subject}:", f"{self.subject} "))
        lines = [_clip(self.message) if opens else f"{_clip(self.subject)}: {_clip(self.message)}"]
        if self.chain:
            chain = [_clip(c) for c in self.chain]
            if len(chain) > _FULL_CHAIN:
                half = _FULL_CHAIN // 2
                chain = [*chain[:half], f"... {len(chain) - 2 * half} more ...", *chain[-half:]]
            lines.append("  needed by: " + " -> ".join(chain))
        if self.cause:
            lines.append(f"  cause: {_clip(self.cause)}")
        limit = _COMPACT_ITEMS if compact else _FULL_ITEMS
        if self.where and len(self.where) <= limit:
            lines.append("  looked in: " + ", ".join(_clip(w) for w in self.where))
        elif self.where:
            shown = ", ".join(_clip(w) for w in self.where[:limit])
            more = "-v or --json" if compact else "--json"
            lines.append(f"  looked in {len(self.where)} places: {shown}, ... ({more} for all)")
        details = self.details[:limit]
        lines.extend(f"  {_clip(d)}" for d in details)
        if len(self.details) > len(details):
            lines.append(f"  ... {len(self.details) - len(details)} more ({'-v or --json' if compact else '--json'})")
        if self.fix:
            lines.append(f"  fix: {_clip(self.fix)}")
        return "\n".join(lines)


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else f"{text[:_MAX_TEXT]}... ({len(text) - _MAX_TEXT} more characters)"


def most_severe_first(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """*findings* errors first, then warnings, then infos; stable within a severity."""
    return tuple(sorted(findings, key=lambda f: f.severity.rank))
