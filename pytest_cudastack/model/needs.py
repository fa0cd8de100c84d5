"""Which CUDA version does a binary or a wheel require? Evidence-based, never guessed.

A binary's requirement comes from the sonames in its load closure that belong to one CUDA major
(``libcublas.so.13`` -> 13.x; ``compat.soname_cuda_majors``). A soname shared by several majors
(``libcurand.so.10``, ``libcusparse.so.12``) is decided by the file it resolves to: its owning wheel's
version, else that library's own unambiguous NEEDED; otherwise it stays undecided. A wheel's requirement
comes from its CUDA flavour and version (``flavour.wheel_cuda_requirement``). The bounds, driver and
repair code read these needs (``Stack.inferences``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from pytest_cudastack.cuda.compat import soname_cuda_majors
from pytest_cudastack.cuda.flavour import wheel_cuda_requirement
from pytest_cudastack.cuda.versions import parse_cuda
from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.resolver import Tree
from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = ["CudaNeed", "Inference", "infer_binary", "infer_shipped", "infer_wheel"]

logger = logging.getLogger(__name__)

_BUILTINS_RE = re.compile(r"libnvrtc-builtins(?:\.alt)?\.so\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class CudaNeed:
    """One piece of evidence: ``subject`` requires CUDA ``major.minor`` (``minor`` None: any of that major)."""

    major: int
    minor: int | None
    subject: str
    evidence: str

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}" if self.minor is not None else f"{self.major}.x"

    @property
    def key(self) -> tuple[int, int]:
        """Sort key; an unknown minor sorts below every known one."""
        return self.major, -1 if self.minor is None else self.minor


@dataclass(frozen=True)
class Inference:
    """What one binary or wheel requires: decided evidence and sonames that could not be decided."""

    subject: str
    needs: tuple[CudaNeed, ...] = ()
    undecided: tuple[str, ...] = ()
    distribution: str | None = None  # the installed distribution's key, for a wheel


def _single_major(soname: str) -> tuple[int, int | None] | None:
    majors = soname_cuda_majors(soname)
    if not majors or len(majors) != 1:
        return None
    match = _BUILTINS_RE.fullmatch(soname)
    return next(iter(majors)), (int(match.group(2)) if match else None)


def infer_wheel(dist: Distribution) -> Inference:
    """A wheel's CUDA requirement from its flavour and version; no needs when it is not a CUDA wheel."""
    cuda, evidence = wheel_cuda_requirement(
        dist.name, dist.version, dist.requires, tuple(lib.path for lib in dist.libraries)
    )
    if cuda is None:
        return Inference(dist.label, distribution=dist.key)
    parsed = parse_cuda(cuda)
    major, minor = parsed.major, parsed.minor
    version = f"{major}.{minor}" if minor is not None else f"{major}.x"
    need = CudaNeed(major, minor, dist.label, f"needs CUDA {version}: {evidence}")
    return Inference(dist.label, (need,), distribution=dist.key)


def infer_shipped(dist: Distribution, reader: Callable[[str], ElfInfo]) -> Inference:
    """A wheel without a CUDA flavour whose shared libraries (extension modules) link CUDA sonames that
    decide a major directly (``libcudart.so.13``): each such DT_NEEDED is evidence."""
    needs: list[CudaNeed] = []
    for lib in dist.libraries:
        if not lib.exists:
            continue
        try:
            needed = reader(lib.path).needed
        except ElfError:
            continue
        rel = os.path.relpath(lib.path, dist.location)
        for soname in needed:
            single = _single_major(soname)
            if single is not None:
                major, minor = single
                version = f"{major}.{minor}" if minor is not None else f"{major}.x"
                needs.append(CudaNeed(major, minor, dist.label, f"{rel} links {soname} (CUDA {version})"))
    return Inference(dist.label, tuple(needs), distribution=dist.key)


def infer_binary(tree: Tree, subject: str, inventory: Inventory | None = None) -> Inference:
    """Requirements of the binary ``tree`` is rooted at, from every CUDA soname in its load closure."""
    needs: list[CudaNeed] = []
    undecided: list[str] = []
    by_path: dict[str, list[str]] = {}
    for lib in tree.libraries:
        for parent in lib.needed_by:
            by_path.setdefault(parent, []).append(lib.soname)
    for lib in tree.libraries:
        majors = soname_cuda_majors(lib.soname)
        if not majors:
            continue
        chain = tree.chain(lib.soname)
        via = "" if len(chain) <= 1 else " via " + " -> ".join(chain[1:])
        single = _single_major(lib.soname)
        if single is not None:
            major, minor = single
            version = f"{major}.{minor}" if minor is not None else f"{major}.x"
            needs.append(CudaNeed(major, minor, subject, f"links {lib.soname} (CUDA {version}){via}"))
            continue
        decided = _decide(lib.soname, lib.path, lib.provider, by_path, inventory)
        choices = ", ".join(str(m) for m in sorted(majors))
        if decided is None:
            where = f"resolves to {lib.path}" if lib.path else "does not resolve here"
            undecided.append(
                f"{lib.soname} (shared by CUDA {choices}){via} {where}; neither an owning CUDA wheel nor "
                "its own NEEDED tells which"
            )
            continue
        major, minor, why = decided
        version = f"{major}.{minor}" if minor is not None else f"{major}.x"
        needs.append(CudaNeed(major, minor, subject, f"links {lib.soname} (CUDA {version}: {why}){via}"))
    return Inference(subject, tuple(needs), tuple(undecided))


def _decide(
    soname: str,
    path: str | None,
    provider: str | None,
    by_path: dict[str, list[str]],
    inventory: Inventory | None,
) -> tuple[int, int | None, str] | None:
    if path is None:
        return None
    if inventory is not None:
        for dist in inventory.owners(path):
            wheel = infer_wheel(dist)
            if wheel.needs:
                need = wheel.needs[0]
                return need.major, need.minor, f"{path} belongs to {dist.label}"
    for needed in by_path.get(path, ()):
        single = _single_major(needed)
        if single is not None:
            return single[0], None, f"{path} needs {needed}"
    return None
