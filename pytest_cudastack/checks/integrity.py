"""The integrity check: the wheels floor's verdict on the installed distributions, as one item, each failing
finding's fix replaced by the one the repair model verifies (``repair.verified_fixes``: the plan's command
for the whole item where it repairs the finding)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_cudastack.checks.repair import verified_fixes
from pytest_cudastack.wheels.integrity import check_integrity

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.findings import Finding
    from pytest_cudastack.wheels.inventory import Inventory

__all__ = ["integrity_findings", "run"]


def integrity_findings(inventory: Inventory) -> tuple[Finding, ...]:
    """Inventory problems (malformed dist-infos, one name installed twice), then ``check_integrity``'s, with
    verified fixes."""
    return verified_fixes((*inventory.findings, *check_integrity(inventory)), inventory)


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``integrity`` item: the stack's ``integrity`` (computed once; ``requires_wheel`` reads it too)."""
    return stack.integrity
