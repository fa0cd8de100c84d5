"""The CUDA stack of this machine as one lazily computed object, and its JSON snapshot files.

``Stack`` backs the ``cuda_*`` fixtures (``CudaLibs``, ``CudaWheels``), the markers, the invariant items and
``cudastack check``: every fact (driver, installed wheels, resolver, scanned binaries) is computed on first
use and then reused. ``Stack.to_json`` is the snapshot (schema ``SNAPSHOT_SCHEMA`` version ``SNAPSHOT_FORMAT``,
``pytest_cudastack/schemas/snapshot.schema.json``); ``write_snapshot`` and
``load_snapshot`` are its file I/O, shared by ``--cudastack-snapshot``/``--cudastack-baseline`` and the
``cudastack snapshot``/``check``/``diff`` subcommands (``pytest_cudastack.cli``), which do their own printing.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pytest_cudastack import __version__
from pytest_cudastack._sysio import read_regular, write_atomic
from pytest_cudastack.checks import enabled_checks, lookup
from pytest_cudastack.checks.integrity import integrity_findings
from pytest_cudastack.checks.scan import scan_walk
from pytest_cudastack.cuda.driver import declared_driver, linker_finder, probe_driver
from pytest_cudastack.errors import DataError, UnreadableFile
from pytest_cudastack.findings import Finding
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.modules import ModuleTree, module_trees
from pytest_cudastack.model.needs import infer_binary, infer_shipped, infer_wheel
from pytest_cudastack.model.reach import ProjectImports, Reachability, project_imports
from pytest_cudastack.schemacheck import first_error
from pytest_cudastack.settings import Settings
from pytest_cudastack.wheels.inventory import installed_wheels
from pytest_cudastack.wheels.requirements import Requirements, requirement_facts

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import Target
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.linker.fatbin import Fatbin
    from pytest_cudastack.linker.resolver import Library, Resolver, Tree
    from pytest_cudastack.model.needs import Inference
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = [
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_LIMIT",
    "SNAPSHOT_SCHEMA",
    "CudaLibs",
    "CudaWheels",
    "Stack",
    "load_snapshot",
    "snapshot_schema",
    "write_snapshot",
]

logger = logging.getLogger(__name__)

SNAPSHOT_SCHEMA = "pytest-cudastack/snapshot"
SNAPSHOT_FORMAT = 1  # the snapshot's "version" (and "format", its name in files pytest-cudastack 0.1.0 reads)


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
        self._findings: dict[tuple[str, Target | None], tuple[Finding, ...]] = {}

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
            return declared_driver(s.cuda_driver, s.cuda_arch)
        probed = self._probe() if self._probe is not None else None
        if probed is None:
            # no owner: naming libcuda's distribution would build the inventory just to probe the driver
            linker = Resolver(SearchConfig.from_environment(), reader=self.cache.read)
            probed = probe_driver(find=linker_finder(linker))
        if s.cuda_driver is None and not s.cuda_arch:
            return probed
        return declared_driver(s.cuda_driver, s.cuda_arch, probed=probed)

    @cached_property
    def cache(self) -> ElfCache:
        """The one ELF cache of this stack's run: every layer that parses ELF files reads through it, and
        :meth:`flush_cache` writes it once."""
        return self._cache or ElfCache(enabled=False if self.settings.cudastack_no_cache else None)

    def flush_cache(self) -> None:
        """Write the ELF cache if this session read anything through it."""
        if "cache" in self.__dict__:
            self.cache.flush()

    @cached_property
    def inventory(self) -> Inventory:
        return installed_wheels(self._site_paths, reader=self.cache.read)

    @cached_property
    def integrity(self) -> tuple[Finding, ...]:
        """Inventory problems (malformed dist-infos, one name installed twice) and integrity findings."""
        return integrity_findings(self.inventory, self.requirements)

    @cached_property
    def resolver(self) -> Resolver:
        return Resolver(SearchConfig.from_environment(), reader=self.cache.read, owner=self._owner)

    def _owner(self, path: str) -> str | None:
        return self.inventory.owner(path)

    @cached_property
    def requirements(self) -> Requirements:
        """Every Requires-Dist of the inventory, evaluated once for the inspected interpreter: the requirements
        item, the framework rules, the shadow rule, integrity and the repair model read these facts."""
        return requirement_facts(self.inventory)

    @cached_property
    def module_trees(self) -> tuple[ModuleTree, ...]:
        """Every extension module's closure in its import context, built once: the closure, dlopen and
        symbols items read the same trees."""
        return module_trees(self.inventory, self.resolver, self.cache.read, self.cache)

    @cached_property
    def project_imports(self) -> ProjectImports:
        """The modules the project under test imports: the rootdir's own Python files (unless
        ``cudastack_imports_scan`` is false) and the ``cudastack_imports`` names (``model.reach``)."""
        s = self.settings
        return project_imports(
            self.rootdir, s.cudastack_imports, s.named("cudastack_imports"), scan=s.cudastack_imports_scan
        )

    @cached_property
    def reachability(self) -> Reachability:
        """Which extension modules an import that will happen loads (``model.reach``): the severity of the
        closure and symbols findings; each answer computed when a check first asks."""
        return Reachability(self.inventory, self.resolver, self.cache.read, lambda: self.project_imports, self.cache)

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

    def fatbin(self, path: str) -> Fatbin:
        return self.cache.fatbin(path)

    @cached_property
    def _scan_walk(self) -> tuple[tuple[Target, ...], tuple[Target, ...]]:
        return scan_walk(self.settings.cudastack_scan, self.rootdir)

    @property
    def scan_targets(self) -> tuple[Target, ...]:
        return self._scan_walk[0]

    @property
    def scan_dirs(self) -> tuple[Target, ...]:
        """The walked scan directories holding files the walk did not check (``checks.scan.scan_walk``)."""
        return self._scan_walk[1]

    @cached_property
    def binary_inferences(self) -> tuple[Inference, ...]:
        return tuple(
            infer_binary(self.tree(path), name, self.inventory)
            for name, path in self.scan_targets
            if os.path.isfile(path)
        )

    @cached_property
    def wheel_inferences(self) -> tuple[Inference, ...]:
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
    def findings(self, check: str, target: Target | None = None) -> tuple[Finding, ...]:
        """Findings of one invariant item ("integrity", "closure", "cuda-max", ...; ``checks.CHECKS``);
        ``target`` is the ``(display name, path)`` of a per-target check's item (scan). Each is computed
        once per stack: the item, the repair plan and ``run_checks`` read the same findings."""
        key = (check, target)
        if key not in self._findings:
            self._findings[key] = lookup(check).run(self, target)
        return self._findings[key]

    def run_checks(self) -> dict[str, tuple[Finding, ...]]:
        """Every invariant item the settings turn on and that has something to check, as the plugin names them
        ("integrity", "scan[bin/train]") -> its findings; what ``cudastack check`` reports. An item with nothing
        to check (:attr:`skipped`) is not run, as pytest does not run a SKIPPED item."""
        skipped = self.skipped
        out: dict[str, tuple[Finding, ...]] = {}
        for check in enabled_checks(self.settings):
            for name, target in check.expand(self):
                if name not in skipped:
                    out[name] = self.findings(check.name, target)
        return out

    @cached_property
    def skipped(self) -> dict[str, str]:
        """The enabled items with nothing to check on this stack -> why (``Check.skip_reason``), decided once."""
        return {
            name: reason
            for check in enabled_checks(self.settings)
            for name, target in check.expand(self)
            if (reason := check.skip_reason(self, target)) is not None
        }

    def recorded_snapshot(self, path: str) -> dict[str, Any]:
        """The snapshot recorded in ``path`` (from the rootdir): the baseline check's old side."""
        return load_snapshot(os.path.join(self.rootdir, path))

    # JSON -------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The stack as JSON: driver, CUDA wheels (with missing files), scanned binaries' resolution."""
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
                    "gpu_code": self._gpu_code(dist),
                }
            )
        binaries = []
        for name, path in self.scan_targets:
            if os.path.isfile(path):
                # lazy: the GPU-code lists load with the first snapshot
                from pytest_cudastack.cuda.gpucode import with_gpu_code

                tree = with_gpu_code(self.tree(path).to_json(), self.fatbin)
                tree["path"] = name
                binaries.append(tree)
        return {
            "schema": SNAPSHOT_SCHEMA,
            "version": SNAPSHOT_FORMAT,
            "format": SNAPSHOT_FORMAT,
            "generator": f"pytest-cudastack {__version__}",
            "driver": self.driver.to_json(),
            "wheels": wheels,
            "binaries": binaries,
        }

    def _gpu_code(self, dist: Distribution) -> dict[str, list[str]]:
        """The SASS and PTX its present libraries carry (fatbin headers, through the ELF cache), as
        ``cudastack report`` and ``tree`` list them (``checks.arch.dist_gpu_code``)."""
        # lazy: the arch rules (compat data, verdicts) load only when a snapshot is written
        from pytest_cudastack.checks.arch import dist_gpu_code

        return dist_gpu_code(dist, self.fatbin)


# bytes: a torch venv's snapshot is ~10 KB; 8 MiB of the costliest shape (a million short strings) parses and
# is checked against the schema in ~0.5 s, so a hostile file bounds diff and --cudastack-baseline below 1 s
SNAPSHOT_LIMIT = 8 << 20


def load_snapshot(path: str) -> dict[str, Any]:
    """Read a snapshot file: DataError naming the file when it cannot be read (missing, not a regular file,
    over ``SNAPSHOT_LIMIT`` bytes), is not JSON, or departs from the shipped snapshot schema, naming the first
    wrong field. A file without ``"schema"`` (written before the snapshot named its schema, by
    pytest-cudastack 0.1.0) is read by its ``"format"``, without the fields added since."""
    try:
        raw = read_regular(path, SNAPSHOT_LIMIT)
    except UnreadableFile as e:
        reason = str(e).removeprefix(f"{path}: ")
        raise DataError(f"{path}: cannot read cudastack snapshot: {reason}") from e
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; nesting -> RecursionError
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise DataError(f"{path}: not a cudastack snapshot: not JSON: {why}") from e
    if not isinstance(data, dict) or data.get("schema", SNAPSHOT_SCHEMA) != SNAPSHOT_SCHEMA:
        raise DataError(f"{path}: not a cudastack snapshot (schema {SNAPSHOT_SCHEMA!r} expected)")
    if data.get("version", data.get("format")) != SNAPSHOT_FORMAT:
        raise DataError(f"{path}: not a cudastack snapshot (version {SNAPSHOT_FORMAT} expected)")
    error = first_error(data, snapshot_schema(legacy="schema" not in data))
    if error is not None:
        raise DataError(f"{path}: not a cudastack snapshot: {error}")
    return data


def snapshot_schema(legacy: bool) -> dict[str, Any]:
    """The shipped snapshot schema; for a 0.1.0 file, without the fields 0.1.0 did not write (the top
    level's schema and version, a wheel's gpu_code; its driver object was not fixed then)."""
    with open(os.path.join(os.path.dirname(__file__), "schemas", "snapshot.schema.json"), encoding="utf-8") as f:
        schema: dict[str, Any] = json.load(f)
    if legacy:
        schema["required"] = [k for k in schema["required"] if k not in ("schema", "version")]
        defs = schema["$defs"]
        defs["wheel"]["required"] = [k for k in defs["wheel"]["required"] if k != "gpu_code"]
        defs["driver"]["required"] = []
    return schema


def write_snapshot(stack: Stack, path: str | None) -> None:
    """``stack.to_json()`` to ``path`` (its directory created, the file replaced atomically), or to standard
    output when None or ``-``. DataError naming the path when it cannot be written."""
    text = json.dumps(stack.to_json(), indent=2, sort_keys=True) + "\n"
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    error = write_atomic(os.path.dirname(os.path.abspath(path)), path, text)
    if error is not None:
        raise DataError(f"{path}: cannot write the snapshot: {error.strerror or error}")
