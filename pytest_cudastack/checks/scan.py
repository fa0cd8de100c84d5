"""The scan check: every DT_NEEDED in the load closure of each ``--cudastack-scan`` binary must resolve.

A per-target check: one item ``scan[NAME]`` per ELF file the scan paths name (``scan_targets``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pytest_cudastack.cuda.compat import is_driver_soname
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.linker.elf import looks_like_elf

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.linker.resolver import Tree
    from pytest_cudastack.wheels.inventory import Inventory

__all__ = ["binary_findings", "run", "scan_targets"]


def scan_targets(paths: Sequence[str], base: str) -> tuple[Target, ...]:
    """``(display name, absolute path)`` for every ELF file named by ``paths`` (directories walked).

    Relative paths are taken from ``base`` (the rootdir); display names are relative to it where possible.
    A path that does not exist stays in the list, so its item can fail and say so.
    """
    found: dict[str, str] = {}

    def display(path: str) -> str:
        rel = os.path.relpath(path, base)
        return path if rel.startswith("..") else rel

    for given in paths:
        path = os.path.normpath(os.path.join(base, os.path.expanduser(given)))
        if os.path.isdir(path):
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames.sort()
                for name in sorted(filenames):
                    full = os.path.join(dirpath, name)
                    if os.path.isfile(full) and looks_like_elf(full):
                        found.setdefault(full, display(full))
        else:
            found.setdefault(path, display(path))
    return tuple((name, path) for path, name in found.items())


def binary_findings(
    tree: Tree, subject: str, inventory: Inventory | None = None, driver: DriverInfo | None = None
) -> tuple[Finding, ...]:
    """Every DT_NEEDED in ``tree``'s closure must resolve: one ERROR per missing soname, all at once.

    A missing driver soname (``libcuda.so.1``) is INFO unless a driver was probed on this machine: the
    driver comes with the deployment host, not with the image.
    """
    out: list[Finding] = []
    out.extend(
        Finding("scan", Severity.ERROR, subject, problem, fix="scan only ELF binaries") for problem in tree.problems
    )
    for lib in tree.missing:
        chain = tree.chain(lib.soname)
        if is_driver_soname(lib.soname) and (driver is None or driver.source != "probed"):
            out.append(
                Finding(
                    "scan",
                    Severity.INFO,
                    subject,
                    f"{lib.soname} (NVIDIA driver library) is not on this machine; the deployment host's "
                    "driver provides it",
                    chain=chain,
                )
            )
            continue
        shipped = [
            (dist, path, os.path.isfile(path)) for dist, path in (inventory.shipping(lib.soname) if inventory else ())
        ]
        claims = tuple(f"{d.label} ships it at {p} ({'present' if ok else 'missing'})" for d, p, ok in shipped)
        present = [p for _, p, ok in shipped if ok]
        if present:
            fix = f"add {os.path.dirname(present[0])} to the binary's RUNPATH (-Wl,-rpath) or to LD_LIBRARY_PATH"
        elif shipped:
            name = shipped[0][0].name
            fix = f"reinstall {name} (pip install --force-reinstall --no-deps {name})"
        else:
            fix = f"install the package that provides {lib.soname}, or rebuild against the CUDA this image has"
        out.append(
            Finding(
                "scan",
                Severity.ERROR,
                subject,
                f"needs {lib.soname}, which the dynamic linker does not find",
                cause=lib.problem or ("; ".join(claims) if claims else "no directory searched holds it"),
                fix=fix,
                where=lib.searched,
                chain=chain,
                details=claims,
            )
        )
    return tuple(out)


def run(stack: StackView, target: Target | None) -> tuple[Finding, ...]:
    """The ``scan[NAME]`` item of one target; a path that does not exist is its one ERROR."""
    if target is None:
        raise ValueError("cudastack check 'scan' runs per target: scan[NAME]")
    name, path = target
    if not os.path.lexists(path):
        return (Finding("scan", Severity.ERROR, name, "no such file", fix="fix the --cudastack-scan path"),)
    return binary_findings(stack.tree(path), name, stack.inventory, stack.driver)
