"""The CUDA stack of this machine as one lazily computed object, and its JSON snapshots.

``Stack`` backs the ``cuda_*`` fixtures, the markers and the invariant items: every fact (driver,
installed wheels, resolver, scanned binaries) is computed on first use and then reused. ``to_json`` is the
snapshot format (``--cudastack-snapshot``, ``cudastack snapshot``); ``cmd_diff`` compares two of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.settings import Settings

if TYPE_CHECKING:
    from pytest_cudastack.checks.bounds import Inference
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.linker.resolver import Library, Resolver, Tree
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = [
    "SNAPSHOT_FORMAT",
    "CudaLibs",
    "CudaWheels",
    "Stack",
    "cmd_check",
    "cmd_diff",
    "cmd_snapshot",
    "header_lines",
    "load_snapshot",
    "write_snapshot",
]

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 1


class CudaLibs:
    """Where the dynamic linker would load libraries from (the ``cuda_libs`` fixture)."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack

    def resolve(self, soname: str) -> Library:
        """The linker's search for ``soname`` as a DT_NEEDED of the Python executable: ``.path`` (None when
        not found), ``.route``, ``.tried``, ``.provider`` (owning distribution)."""
        return self._stack.find(soname)

    def tree(self, path: str) -> Tree:
        """The whole load closure of the ELF file at ``path``."""
        return self._stack.tree(path)


class CudaWheels:
    """The installed CUDA distributions (the ``cuda_wheels`` fixture); iterate, ``len()``, ``get(name)``."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.distributions: tuple[Distribution, ...] = tuple(
            d for d in inventory.distributions if d.cuda_major is not None
        )

    def __iter__(self) -> Iterator[Distribution]:
        return iter(self.distributions)

    def __len__(self) -> int:
        return len(self.distributions)

    def get(self, name: str) -> Distribution | None:
        """Any installed distribution by name (CUDA or not), None when absent."""
        return self.inventory.get(name)


class Stack:
    """Facts about this machine's CUDA stack, each computed on first use.

    ``rootdir`` is where relative scan paths start and what display names are relative to; ``site_paths``
    restricts the wheel inventory (default: ``sys.path``).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        driver_info: DriverInfo | None = None,
        probe: Callable[[], DriverInfo | None] | None = None,
        cache: ElfCache | None = None,
        rootdir: str = ".",
        site_paths: tuple[str, ...] | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.rootdir = rootdir
        self._driver_info = driver_info
        self._probe = probe
        self._cache = cache
        self._site_paths = site_paths
        self._trees: dict[str, Tree] = {}

    # facts ------------------------------------------------------------------------------------------
    @cached_property
    def driver(self) -> DriverInfo:
        """The driver to evaluate against: ``driver_info`` when given (an xdist worker gets the controller's),
        else the probe (``probe``; when it gives None, NVML plus the driver's files found by this stack's
        linker search and ELF cache) with declared facts (``--cuda-driver`` / ``--cuda-arch``) on top; a
        declared version with declared archs needs no probe at all."""
        if self._driver_info is not None:
            return self._driver_info
        s = self.settings
        if s.cuda_driver is not None and s.cuda_arch:
            from pytest_cudastack.cuda.driver import declared_driver

            return declared_driver(s.cuda_driver, s.cuda_arch)
        probed = self._probe() if self._probe is not None else None
        if probed is None:
            from pytest_cudastack.cuda.driver import linker_finder, probe_driver
            from pytest_cudastack.linker.resolver import Resolver, SearchConfig

            # no owner: naming libcuda's distribution would build the inventory just to probe the driver
            linker = Resolver(SearchConfig.from_environment(), reader=self.cache.read)
            probed = probe_driver(find=linker_finder(linker))
        if s.cuda_driver is None and not s.cuda_arch:
            return probed
        from pytest_cudastack.cuda.driver import declared_driver

        return declared_driver(s.cuda_driver, s.cuda_arch, probed=probed)

    @cached_property
    def cache(self) -> ElfCache:
        """The one ELF cache of this stack's run: every layer that parses ELF files reads through it, and
        :meth:`flush_cache` writes it once."""
        from pytest_cudastack.linker.elfcache import ElfCache

        return self._cache or ElfCache(enabled=False if self.settings.cudastack_no_cache else None)

    def flush_cache(self) -> None:
        """Write the ELF cache if this session read anything through it."""
        if "cache" in self.__dict__:
            self.cache.flush()

    @cached_property
    def inventory(self) -> Inventory:
        from pytest_cudastack.wheels.inventory import installed_wheels

        return installed_wheels(self._site_paths, reader=self.cache.read)

    @cached_property
    def integrity(self) -> tuple[Finding, ...]:
        """Inventory problems (malformed dist-infos, one name installed twice) and integrity findings."""
        from pytest_cudastack.wheels.integrity import check_integrity

        return (*self.inventory.findings, *check_integrity(self.inventory))

    @cached_property
    def resolver(self) -> Resolver:
        from pytest_cudastack.linker.resolver import Resolver, SearchConfig

        return Resolver(SearchConfig.from_environment(), reader=self.cache.read, owner=self._owner)

    def _owner(self, path: str) -> str | None:
        return self.inventory.owner(path)

    @cached_property
    def libs(self) -> CudaLibs:
        return CudaLibs(self)

    @cached_property
    def wheels(self) -> CudaWheels:
        return CudaWheels(self.inventory)

    def find(self, soname: str) -> Library:
        return self.resolver.find(soname)  # as a DT_NEEDED of the running Python executable

    def tree(self, path: str) -> Tree:
        path = os.path.abspath(path)
        if path not in self._trees:
            self._trees[path] = self.resolver.tree(path)
        return self._trees[path]

    @cached_property
    def scan_targets(self) -> tuple[tuple[str, str], ...]:
        from pytest_cudastack.checks import scan_targets

        return scan_targets(self.settings.cudastack_scan, self.rootdir)

    @cached_property
    def binary_inferences(self) -> tuple[Inference, ...]:
        from pytest_cudastack.checks.bounds import infer_binary

        return tuple(
            infer_binary(self.tree(path), name, self.inventory)
            for name, path in self.scan_targets
            if os.path.isfile(path)
        )

    @cached_property
    def wheel_inferences(self) -> tuple[Inference, ...]:
        from pytest_cudastack.checks.bounds import infer_shipped, infer_wheel

        out = []
        for dist in self.inventory.distributions:
            inference = infer_wheel(dist) if dist.cuda_major is not None else infer_shipped(dist, self.cache.read)
            if inference.needs or inference.undecided:
                out.append(inference)
        return tuple(out)

    @property
    def inferences(self) -> tuple[Inference, ...]:
        """The CUDA requirement of every scanned binary, installed CUDA wheel and other installed wheel
        whose extension modules link CUDA libraries."""
        return self.binary_inferences + self.wheel_inferences

    # findings per invariant item ---------------------------------------------------------------------
    def findings(self, check: str) -> tuple[Finding, ...]:
        """Findings of one invariant item ("integrity", "closure", "cuda-max", ...)."""
        from pytest_cudastack import checks
        from pytest_cudastack.checks import bounds as cudainfer

        s = self.settings
        if check == "integrity":
            return self.integrity
        if check == "closure":
            from pytest_cudastack.checks.closure import extension_closures

            return extension_closures(self.inventory, self.resolver)
        if check == "cuda-max" and s.cuda_max is not None:
            return cudainfer.bound_findings("max", s.cuda_max, self.inferences, s.describe("cuda_max"))
        if check == "cuda-min" and s.cuda_min is not None:
            return cudainfer.bound_findings("min", s.cuda_min, self.inferences, s.describe("cuda_min"))
        if check == "driver":
            return checks.driver_findings(self.inferences, self.driver)
        if check == "arch":
            names = {path: name for name, path in self.scan_targets if os.path.isfile(path)}
            found = checks.arch_coverage(tuple(names), self.driver)
            return tuple(replace(f, subject=names.get(f.subject, f.subject)) for f in found)
        if check == "baseline" and s.cudastack_baseline is not None:
            path = os.path.join(self.rootdir, s.cudastack_baseline)
            return checks.baseline_findings(s.cudastack_baseline, load_snapshot(path), self.to_json())
        raise ValueError(f"unknown cudastack check {check!r}")

    def scan_findings(self, path: str, name: str) -> tuple[Finding, ...]:
        from pytest_cudastack.checks import binary_findings

        if not os.path.lexists(path):
            return (Finding("scan", Severity.ERROR, name, "no such file", fix="fix the --cudastack-scan path"),)
        return binary_findings(self.tree(path), name, self.inventory, self.driver)

    def run_checks(self) -> dict[str, tuple[Finding, ...]]:
        """Every invariant item the settings turn on, as the plugin names them ("integrity",
        "scan[bin/train]") -> its findings; what ``cudastack check`` reports."""
        out = {check: self.findings(check) for check in self.settings.items}
        for name, path in self.scan_targets:
            out[f"scan[{name}]"] = self.scan_findings(path, name)
        return out

    # JSON -------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The stack as JSON: driver, CUDA wheels (with missing files), scanned binaries' resolution."""
        from pytest_cudastack import __version__

        wheels = []
        for dist in self.wheels:
            wheels.append(
                {
                    "name": dist.name,
                    "version": dist.version,
                    "cuda_major": dist.cuda_major,
                    "cuda_evidence": dist.cuda_evidence,
                    "libraries": sorted(lib.soname or os.path.basename(lib.path) for lib in dist.libraries),
                    "missing": sorted(lib.path for lib in dist.libraries if not lib.exists),
                    "problems": list(dist.problems),
                }
            )
        binaries = []
        for name, path in self.scan_targets:
            if os.path.isfile(path):
                tree = self.tree(path).to_json()
                tree["path"] = name
                binaries.append(tree)
        return {
            "format": SNAPSHOT_FORMAT,
            "generator": f"pytest-cudastack {__version__}",
            "driver": self.driver.to_json(),
            "wheels": wheels,
            "binaries": binaries,
        }


def header_lines(stack: Stack, verbose: int = 0) -> list[str]:
    """The report header: one line (driver | CUDA | GPUs | CUDA wheels | options), details with -v."""
    d = stack.driver
    driver = f"driver {d.version} ({d.source})" if d.version else f"driver: none ({d.reason or 'not found'})"
    parts = [driver, f"CUDA <= {d.cuda_version}" if d.cuda_version else "CUDA: unknown"]
    if d.gpus:
        names = sorted({g.name for g in d.gpus})
        parts.append(f"GPUs: {len(d.gpus)} x {', '.join(names)}")
    elif d.archs:
        parts.append(f"GPUs: archs {','.join(d.archs)} ({d.arch_source})")
    else:
        parts.append(f"GPUs: none ({d.reason or 'none found'})" if not d.present else "GPUs: none")
    wheels = stack.wheels
    majors: dict[int, int] = {}
    for dist in wheels:
        if dist.cuda_major is not None:
            majors[dist.cuda_major] = majors.get(dist.cuda_major, 0) + 1
    flavours = ", ".join(f"cu{m}: {n}" for m, n in sorted(majors.items()))
    parts.append(f"{len(wheels)} CUDA wheels" + (f" ({flavours})" if flavours else ""))
    s = stack.settings
    for key in ("cuda_max", "cuda_min"):
        if getattr(s, key) is not None:
            parts.append(s.describe(key))
    if s.cudastack_scan:
        count = len(stack.scan_targets)
        parts.append(f"scan: {count} file{'' if count == 1 else 's'}")
    lines = ["cudastack: " + " | ".join(parts)]
    if verbose > 0:
        lines.extend(
            f"  GPU {g.index}: {g.name} (sm {g.compute_capability or '?'}"
            + (f", {g.memory_total / 2**30:.1f} GiB" if g.memory_total else "")
            + ")"
            for g in d.gpus
        )
        lines.extend(f"  driver note: {n}" for n in d.notes)
        lines.extend(f"  wheel: {dist.label} (CUDA {dist.cuda_major}: {dist.cuda_evidence})" for dist in wheels)
    return lines


def load_snapshot(path: str) -> dict[str, Any]:
    """Read a snapshot file; ``DataError`` naming the file when it is not one."""
    from pytest_cudastack.errors import DataError

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read cudastack snapshot: {e}") from e
    if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
        raise DataError(f"{path}: not a cudastack snapshot (format {SNAPSHOT_FORMAT} expected)")
    return data


def write_snapshot(stack: Stack, path: str | None) -> None:
    text = json.dumps(stack.to_json(), indent=2, sort_keys=True) + "\n"
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _site_paths(args: argparse.Namespace) -> tuple[str, ...] | None:
    from pytest_cudastack.cli.report import site_dirs_from

    return site_dirs_from(args)


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``cudastack snapshot [-o FILE]``."""
    stack = Stack(site_paths=_site_paths(args))
    try:
        write_snapshot(stack, getattr(args, "output", None))
    finally:
        stack.flush_cache()
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``cudastack check [pytest's cudastack options]``: the invariant items the options turn on, as the
    plugin runs them; with none of --cudastack/--cuda-max/--cuda-min/--cudastack-scan/--cudastack-baseline,
    all the built-in ones (as --cudastack). Exit 0 clean, 1 findings, 2 bad options."""
    from pytest_cudastack.errors import CudaStackError

    try:
        settings = Settings.from_namespace(args)
    except CudaStackError as e:
        print(f"cudastack check: error: {e}", file=sys.stderr)
        return 2
    if not settings.items and not settings.cudastack_scan:
        settings = settings.with_values(cudastack=True)
    stack = Stack(settings, rootdir=os.getcwd(), site_paths=_site_paths(args))
    try:
        results = stack.run_checks()
        if settings.cudastack_snapshot:
            write_snapshot(stack, settings.cudastack_snapshot)
    except CudaStackError as e:
        print(f"cudastack check: error: {e}", file=sys.stderr)
        return 2
    finally:
        stack.flush_cache()
    failing = any(f.failing for found in results.values() for f in found)
    if getattr(args, "json", False):
        payload = {
            "ok": not failing,
            "items": {name: [f.to_json() for f in found] for name, found in results.items()},
        }
        print(json.dumps(payload, indent=2))
        return 1 if failing else 0
    for name, found in results.items():
        verdict = "FAIL" if any(f.failing for f in found) else "ok"
        print(f"{verdict:4} cudastack::{name}")
        for finding in found:
            text = finding.render().replace("\n", "\n       ")
            print(f"     {finding.severity.value}: {text}")
    return 1 if failing else 0


def cmd_diff(args: argparse.Namespace) -> int:
    """``cudastack diff A B``: exit 0 when equal, 1 when they differ, 2 when a file is not a snapshot."""
    from pytest_cudastack.checks import diff_snapshots
    from pytest_cudastack.errors import DataError

    try:
        old, new = load_snapshot(args.a), load_snapshot(args.b)
    except DataError as e:
        print(f"cudastack diff: {e}", file=sys.stderr)
        return 2
    lines = diff_snapshots(old, new)
    for line in lines:
        print(line)
    return 1 if lines else 0
