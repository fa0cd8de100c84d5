"""Frameworks that look for the driver library themselves (triton's ``libcuda_dirs``), judged as their own
code would run here: part of the ``toolchain`` item, since the lookup runs when the framework compiles.

A finding only where the loader finds the driver (``libcuda.so.1`` resolves on this machine, or the NVIDIA
runtime will inject it into the image) and the framework's own lookup does not: a missing driver is the
driver item's, a declared deployment target's file layout is unknown here. Severity by reach: an ERROR when
the project imports the framework, else a WARNING that names the first compile it breaks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pytest_cudastack.cuda.driverlookup import (
    LookupCode,
    LookupResult,
    LookupRow,
    load_driver_lookups,
    read_lookup_code,
    replay_lookup,
)
from pytest_cudastack.findings import Env, Finding, Manual, Remedy, Severity
from pytest_cudastack.linker.ldcache import LdCache, LdCacheEntry, read_ld_so_conf, required_flags
from pytest_cudastack.linker.resolver import DEBIAN_DEFAULT_DIRS
from pytest_cudastack.model.reach import top_level_names

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = ["Machine", "driver_lookup_findings", "run"]


@dataclass(frozen=True)
class Machine:
    """Where the lookup runs: the file system ``root``, the ``environ``, the ``ld.so.cache`` its ldconfig
    prints, the directory the loader finds ``libcuda.so.1`` in (``libcuda_dir``), and for an image
    (``image=True``) the NVIDIA runtime's start: it injects the host's driver and refreshes the cache."""

    root: str
    environ: Mapping[str, str]
    cache: LdCache | None
    libcuda_dir: str | None
    image: bool = False
    imports: tuple[str, ...] = ()  # the project's imports (top-level names), for severity
    # glibc's SYSTEM_DIRS: the loader's default directories, which ldconfig caches without an ld.so.conf line
    default_dirs: tuple[str, ...] = DEBIAN_DEFAULT_DIRS

    def exists(self, path: str) -> bool:
        return os.path.exists(os.path.join(self.root, path.lstrip("/")) if path.startswith("/") else path)


def _installed(row: LookupRow, inventory: Inventory) -> tuple[Distribution, LookupCode] | None:
    """The distribution shipping one of ``row``'s files (first in search order) and its lookup code."""
    for dist in inventory.distributions:
        if inventory.get(dist.name) is not dist or not any(f in dist.plain_rows for f in row.files):
            continue
        code = read_lookup_code(dist.location, row)
        if code is not None:
            return dist, code
    return None


def _replay(code: LookupCode, machine: Machine) -> LookupResult:
    if not machine.image:
        return replay_lookup(code, machine.environ, machine.cache, machine.exists)
    # the runtime's ldconfig lists the injected library (libnvidia-container runs it at every start): what
    # remains the image's is whether the framework can run its own program
    if code.env and machine.environ.get(code.env):
        return LookupResult(True, "env", (machine.environ[code.env],))
    if not machine.exists(code.argv[0]):
        return replay_lookup(code, machine.environ, None, machine.exists)
    return LookupResult(True, "cache")


def _env_fix(code: LookupCode, row: LookupRow, machine: Machine) -> Remedy | None:
    """The framework's own variable set to the directory the loader finds the driver in, where that passes."""
    found = machine.libcuda_dir
    if found is None or not code.env:
        return None
    after = replace(machine, environ={**machine.environ, code.env: found})
    if not _replay(code, after).ok:
        return None
    return Env(code.env, found, why=f"{row.framework} takes the directory as given")


def _fixes(code: LookupCode, row: LookupRow, result: LookupResult, machine: Machine) -> tuple[Remedy, ...]:
    """Each fix is checked by replaying the lookup on the machine it leaves."""
    found = machine.libcuda_dir
    env_fix = _env_fix(code, row, machine)
    fixes: list[Remedy] = [env_fix] if env_fix is not None else []
    if result.how == "no-program":
        where = "the image" if machine.image else "this machine"
        fixes.append(Manual((f"install {code.argv[0]} in {where} (Debian and Ubuntu: libc-bin)",)))
    elif result.dirs and any(machine.exists(os.path.join(d, row.library)) for d in result.dirs):
        first = next(d for d in result.dirs if machine.exists(os.path.join(d, row.library)))
        fixes.append(Manual((f"ln -s {row.library} {os.path.join(first, code.required)}",)))
    elif found is not None and not machine.image and _ldconfig_lists(found, machine):
        listed = LdCacheEntry(row.library, os.path.join(found, row.library), required_flags()[0], 0)
        old = machine.cache
        cache = LdCache(old.path if old else "/etc/ld.so.cache", (*(old.entries if old else ()), listed), "new")
        if replay_lookup(code, machine.environ, cache, machine.exists).ok:
            fixes.append(Manual((f"run ldconfig as root: it adds {found}/{row.library} to /etc/ld.so.cache",)))
    return tuple(fixes)


def _ldconfig_lists(directory: str, machine: Machine) -> bool:
    """Whether ``ldconfig`` would put ``directory`` in the cache: a system directory, or one ld.so.conf names."""
    if directory in machine.default_dirs:
        return True
    return directory in read_ld_so_conf("/etc/ld.so.conf", root=machine.root)


def _message(row: LookupRow, code: LookupCode, result: LookupResult, machine: Machine) -> tuple[str, str]:
    rel = os.path.basename(os.path.dirname(code.path)) + "/" + os.path.basename(code.path)
    runs = " ".join(code.argv)
    if result.how == "no-program":
        where = "the image has" if machine.image else "this machine has"
        cause = f"{rel}'s {code.function}() runs {runs}, and {where} no {code.argv[0]}"
    elif result.how == "no-cache":
        cause = f"{rel}'s {code.function}() runs {runs}, which fails without an /etc/ld.so.cache"
    else:
        shown = ", ".join(result.listed[:3]) or "none"
        cause = (
            f"{rel}'s {code.function}() keeps the directories of the `{runs}` lines holding {code.match!r} "
            f"({shown}) and asserts one holds {code.required}"
        )
        if machine.libcuda_dir is not None:
            cause += f"; the loader finds {row.library} in {machine.libcuda_dir}"
            cause += ", which the cache does not list" if not result.listed else ""
    return f"{row.framework} cannot find {row.library} at {row.when}: {result.error}", cause


def _severity(dist: Distribution, machine: Machine) -> tuple[Severity, str]:
    tops = top_level_names(dist)
    hit = next((t for t in tops if t in machine.imports), None)
    if hit is not None:
        return Severity.ERROR, f"reached by `import {hit}` in the project"
    name = tops[0] if tops else dist.name
    return Severity.WARNING, f"not reached: the project does not import {name}; only its JIT users fail"


def driver_lookup_findings(inventory: Inventory, machine: Machine) -> tuple[Finding, ...]:
    """One finding per installed framework whose own driver lookup fails on ``machine`` while the driver is
    there (the loader finds it, or the runtime injects it into the image)."""
    if machine.libcuda_dir is None and not machine.image:
        return ()
    findings: list[Finding] = []
    for row in load_driver_lookups():
        got = _installed(row, inventory)
        if got is None:
            continue
        dist, code = got
        result = _replay(code, machine)
        if result.ok or (result.how == "no-cache" and machine.exists("/etc/ld.so.cache")):
            continue  # a cache there that the reader refused: what ldconfig -p prints is not known
        message, cause = _message(row, code, result, machine)
        severity, reach = _severity(dist, machine)
        findings.append(
            Finding(
                "toolchain",
                severity,
                dist.label,
                message,
                cause=cause,
                remedies=_fixes(code, row, result, machine),
                details=(reach, f"replayed from {code.path} ({row.source})"),
                distributions=(dist.key,),
            )
        )
    return tuple(findings)


def _machine(stack: StackView) -> Machine | None:
    image = stack.image
    imports = tuple(dict.fromkeys(i.name.split(".")[0] for i in stack.reachability.project.imports))
    config = stack.resolver.config
    if image is not None:
        return Machine(image.root, image.env, config.ld_cache, None, image=True, imports=imports)
    driver = stack.driver
    if driver.source == "declared" or driver.libcuda is None:
        return None  # the deployment's layout is not this machine's; no driver is the driver item's
    libcuda_dir = os.path.dirname(driver.libcuda)
    return Machine(
        config.root, os.environ, config.ld_cache, libcuda_dir, imports=imports, default_dirs=config.default_dirs
    )


def run(stack: StackView) -> tuple[Finding, ...]:
    """The driver-lookup findings of ``stack`` (this machine as probed, or its image)."""
    machine = _machine(stack)
    return () if machine is None else driver_lookup_findings(stack.inventory, machine)
