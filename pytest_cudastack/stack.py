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
import marshal
import os
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pytest_cudastack import __version__
from pytest_cudastack._sysio import read_regular, write_atomic
from pytest_cudastack.checks import enabled_checks, lookup
from pytest_cudastack.checks.integrity import integrity_findings
from pytest_cudastack.checks.scan import scan_walk
from pytest_cudastack.cuda.driver import declared_driver, linker_finder, probe_driver
from pytest_cudastack.errors import DataError, UnreadableFile
from pytest_cudastack.findings import Env, Finding, Manual, Pip, Provenance, Remedy, SearchPath, UseBuild
from pytest_cudastack.image.pythons import image_interpreter, image_site_dirs
from pytest_cudastack.image.rootfs import ImageRoot, open_image
from pytest_cudastack.image.targets import image_binaries
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.fingerprint import library_files, stack_fingerprint
from pytest_cudastack.model.modules import ModuleTree, module_trees
from pytest_cudastack.model.needs import infer_binary, infer_shipped, infer_wheel
from pytest_cudastack.model.process import ImportScope, import_scopes
from pytest_cudastack.model.reach import ProjectImports, Reachability, project_imports
from pytest_cudastack.schemacheck import first_error
from pytest_cudastack.settings import Settings
from pytest_cudastack.wheels.apk import file_packages as apk_file_packages
from pytest_cudastack.wheels.dpkg import file_packages
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
    "SNAPSHOT_READS",
    "SNAPSHOT_SCHEMA",
    "CudaLibs",
    "CudaWheels",
    "SnapshotReader",
    "Stack",
    "load_snapshot",
    "snapshot_schema",
    "write_snapshot",
]

logger = logging.getLogger(__name__)

SNAPSHOT_SCHEMA = "pytest-cudastack/snapshot"
# the snapshot's "version" (and "format", its name in files pytest-cudastack 0.1.0 reads). 2: node facts, the
# fingerprint, each library's bytes, key sonames' resolution, the CUDA needs; a reader of 1 would compare two
# version-2 files without their bytes and call them equal, so the version changed. Files of 1 still read.
SNAPSHOT_FORMAT = 2
SNAPSHOT_READS = (1, 2)
KEY_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")  # the driver's; each CUDA wheel's libraries join them


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
    restricts the wheel inventory (default: ``sys.path``); ``host_root`` is where the probe reads ``/proc``
    and ``/sys`` (tests pass a fake root). ``image`` (else ``--cudastack-image``, opened on first use) is a
    deployment image judged instead of this machine: its root, environment, Pythons and binaries replace this
    machine's (see :attr:`image`).
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
        host_root: str = "/",
        image: ImageRoot | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.host_root = host_root
        self._image = image
        self.rootdir = rootdir
        self._driver_info = driver_info
        self._probe = probe
        self._cache = cache
        self._site_paths = site_paths
        self._trees: dict[str, Tree] = {}
        self._scopes: dict[str, ImportScope | None] = {}
        self._findings: dict[tuple[str, Target | None], tuple[Finding, ...]] = {}
        self._files: dict[str, list[dict[str, Any]]] = {}

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
            # no owner: naming libcuda's distribution would build the inventory just to probe the driver; an
            # image's run reads the image through its cache, and the probe this machine's files
            linker = Resolver(SearchConfig.from_environment(), reader=None if self.image else self.cache.read)
            probed = probe_driver(find=linker_finder(linker), root=self.host_root)
        if s.cuda_driver is None and not s.cuda_arch:
            return probed
        return declared_driver(s.cuda_driver, s.cuda_arch, probed=probed)

    @cached_property
    def cache(self) -> ElfCache:
        """The one ELF cache of this stack's run: every layer that parses ELF files reads through it, and
        :meth:`flush_cache` writes it once."""
        if self._cache is not None:
            return self._cache
        image = self.image
        return ElfCache(enabled=False if self.settings.cudastack_no_cache else None, root=image.root if image else None)

    def flush_cache(self) -> None:
        """Write the ELF cache if this session read anything through it."""
        if "cache" in self.__dict__:
            self.cache.flush()

    @cached_property
    def image(self) -> ImageRoot | None:
        """The deployment image judged instead of this machine (``--cudastack-image``), read once
        (``image.rootfs.open_image``: its layers materialised in the cache directory, by digest); None for
        this machine. In an image, the linker's search is the image's (its root, ``ld.so.conf``/``ld.so.cache``
        and the config's ``LD_LIBRARY_PATH`` and ``WorkingDir``), the wheels are those of its Pythons
        (``image.pythons``) with its dpkg database, and the scanned binaries its own (``image.targets``);
        its findings name the layer of each image file they name. ImageError when it cannot be read."""
        if self._image is not None:
            return self._image
        path = self.settings.cudastack_image
        if path is None:
            return None
        return open_image(
            os.path.join(self.rootdir, path),
            self.settings.cudastack_image_platform,
            no_cache=self.settings.cudastack_no_cache,
        )

    @cached_property
    def environment(self) -> str:
        """What this run judges, as its repair plan names it: "this machine", or "the image REFERENCE"
        (``--cudastack-image``), whose files a fix changes in the image's build, not here."""
        image = self.image
        return f"the image {image.reference}" if image is not None else "this machine"

    @cached_property
    def inventory(self) -> Inventory:
        image = self.image
        if image is not None:
            return installed_wheels(
                image_site_dirs(image), reader=self.cache.read, dpkg_root=image.root, root=image.root
            )
        return installed_wheels(self._site_paths, reader=self.cache.read)

    @cached_property
    def integrity(self) -> tuple[Finding, ...]:
        """Inventory problems (malformed dist-infos, one name installed twice) and integrity findings."""
        return integrity_findings(self.inventory, self.requirements)

    @cached_property
    def resolver(self) -> Resolver:
        image = self.image
        if image is None:
            return Resolver(SearchConfig.from_environment(), reader=self.cache.read, owner=self._owner)
        config = replace(SearchConfig.from_environment(image.env, root=image.root), cwd=image.workdir)
        return Resolver(config, reader=self.cache.read, owner=self._owner)

    @cached_property
    def interpreter(self) -> str | None:
        """The Python that imports the inventory's modules: None for this one (``sys.executable``), an image's
        first ``python3`` on its ``PATH`` (host path under its root) for an image."""
        image = self.image
        return image_interpreter(image) if image is not None else None

    def _owner(self, path: str) -> str | None:
        image = self.image
        return self.inventory.owner(image.host(path) if image is not None and path.startswith("/") else path)

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

    def import_scopes(self, modules: Sequence[str]) -> Mapping[str, ImportScope]:
        """For each extension module of ``modules``, the process of the import that loads it
        (``model.process.import_scopes``: one model process per top-level package), each computed once per
        run and only when a check asks (the import model reads every Python file the import runs)."""
        wanted = [m for m in dict.fromkeys(modules) if m not in self._scopes]
        if wanted:
            reach = self.reachability
            found = import_scopes(wanted, reach.interp, self.resolver, self.cache.read, self._owner, self.cache)
            self._scopes.update({m: found.get(m) for m in wanted})
        return {m: sc for m in modules if (sc := self._scopes.get(m)) is not None}

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
        """``soname`` as a DT_NEEDED of the running Python executable; in an image, of the program it runs
        first: its Python, else its first binary (a search without a loader of its own: no RPATH)."""
        image = self.image
        if image is None:
            return self.resolver.find(soname)
        loader = self.interpreter or next((path for _, path in self.scan_targets), None)
        return self.resolver.find(soname, loader=self.resolver.logical(loader) if loader else "/")

    def tree(self, path: str) -> Tree:
        path = path if self.image is not None else os.path.abspath(path)
        if path not in self._trees:
            self._trees[path] = self.resolver.tree(path)
        return self._trees[path]

    def fatbin(self, path: str) -> Fatbin:
        return self.cache.fatbin(path)

    @cached_property
    def _scan_walk(self) -> tuple[tuple[Target, ...], tuple[Target, ...]]:
        image = self.image
        if image is None:
            return scan_walk(self.settings.cudastack_scan, self.rootdir)
        # an image's own binaries, then --cudastack-scan paths taken inside the image root
        given = scan_walk([p.lstrip("/") for p in self.settings.cudastack_scan], image.root)
        named = tuple(("/" + name, path) for name, path in given[0])
        packaged = {**apk_file_packages(image.root), **file_packages(image.root)}  # what an OS package installed
        return image_binaries(image, packaged) + named, given[1]

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
            found = lookup(check).run(self, target)
            self._findings[key] = found if self.image is None else tuple(self._with_provenance(f) for f in found)
        return self._findings[key]

    def _with_provenance(self, finding: Finding) -> Finding:
        """``finding`` as an image's finding: the paths of its path fields (subject, objects, the files whose
        versions it names, chain, places looked in) that name a file under the image's root (the wheel
        inventory lists those) named by their image paths, and the layer and history step of each image file
        it names (for a link, also of the file it leads to)."""
        image = self.image
        if image is None:
            return finding

        def logical(path: str) -> str:
            return image.image_path(path) or path

        root = image.root.rstrip("/") + "/"

        def unrooted(text: str) -> str:  # a text naming files of the image names them by their image paths
            return text.replace(root, "/") if len(root) > 1 else text

        def inside(r: Remedy) -> Remedy:  # each step runs in the container: by image paths
            if isinstance(r, Pip) and r.python:
                return replace(r, python=logical(r.python))
            if isinstance(r, UseBuild) and r.install is not None:
                return replace(r, install=replace(r.install, python=logical(r.install.python)))
            if isinstance(r, SearchPath):
                return replace(r, directory=logical(r.directory), why=unrooted(r.why))
            if isinstance(r, Env) and r.value is not None:
                return replace(r, value=unrooted(r.value), why=unrooted(r.why))
            if isinstance(r, Manual):
                return replace(r, steps=tuple(unrooted(step) for step in r.steps), why=unrooted(r.why))
            return r

        facts = replace(
            finding.facts,
            objects=tuple(logical(p) for p in finding.facts.objects),
            versions=tuple((logical(name), version) for name, version in finding.facts.versions),
        )
        finding = replace(
            finding,
            remedies=tuple(inside(r) for r in finding.remedies),
            message=unrooted(finding.message),
            cause=unrooted(finding.cause),
            details=tuple(unrooted(d) for d in finding.details),
            subject=logical(finding.subject),
            chain=tuple(logical(p) for p in finding.chain),
            where=tuple(logical(p) for p in finding.where),
            facts=facts,
        )
        found: dict[str, Provenance] = {}
        for path in (finding.subject, *facts.objects, *finding.chain) if image.layers else ():
            if not path.startswith("/"):
                continue
            host = image.host(path)
            for candidate in (host, os.path.realpath(host)):
                origin = image.origin(candidate) if image.image_path(candidate) is not None else None
                if origin is not None:
                    found.setdefault(origin.path, origin)
        return replace(finding, provenance=tuple(found.values())) if found else finding

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
    def to_json(self, host: bool = True) -> dict[str, Any]:
        """The stack as JSON: driver, CUDA wheels (with missing files and each library's bytes), where the key
        sonames resolve, the CUDA each component needs, scanned binaries' resolution, the node's facts
        (``host``; ``cudastack snapshot --no-host`` leaves them out) and the stack fingerprint over them."""
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
                    "files": self._library_files(dist),
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
        doc: dict[str, Any] = {
            "schema": SNAPSHOT_SCHEMA,
            "version": SNAPSHOT_FORMAT,
            "format": SNAPSHOT_FORMAT,
            "generator": f"pytest-cudastack {__version__}",
            "driver": self.driver.to_json(),
            "wheels": wheels,
            "binaries": binaries,
            "resolved": self._resolved_json(),
            "needs": [
                {"subject": inf.subject, "distribution": inf.distribution, "cuda": need.version}
                for inf in self.inferences
                for need in inf.needs
            ],
        }
        if host:
            doc["host"] = self._host_json()
        doc["fingerprint"] = stack_fingerprint(doc)
        return doc

    def _library_files(self, dist: Distribution) -> list[dict[str, Any]]:
        """Each library's RECORD and on-disk hashes (``model.fingerprint.library_files``), hashed once per
        stack even without the on-disk cache: the snapshot, the baseline and the -v header share them."""
        if dist.dist_info not in self._files:
            self._files[dist.dist_info] = library_files(dist, self.cache)
        return self._files[dist.dist_info]

    @cached_property
    def fingerprint(self) -> str:
        """The stack fingerprint of this node's snapshot (``to_json()["fingerprint"]``), for the -v header."""
        return str(self.to_json()["fingerprint"])

    def _resolved_json(self) -> list[dict[str, Any]]:
        """Where the linker would load each key soname from as a DT_NEEDED of the Python executable: the
        driver's libraries and every CUDA wheel's."""
        sonames = dict.fromkeys(KEY_SONAMES)
        for dist in self.wheels:
            sonames.update(dict.fromkeys(sorted(lib.soname for lib in dist.libraries if lib.soname)))
        out = []
        for soname in sonames:
            lib = self.find(soname)
            out.append({"soname": soname, "path": lib.path, "provider": lib.provider})
        return out

    def _host_json(self) -> dict[str, Any]:
        """This node: its name, the loaded kernel module against the user-space driver libraries, its GPUs
        (NVML's, when the driver was probed)."""
        d = self.driver
        probed = d.source == "probed"
        return {
            "name": socket.gethostname(),
            "driver_version": d.version if probed else None,
            "cuda_version": d.cuda_version if probed else None,
            "kernel_module": d.kernel_module,
            "libcuda_version": d.libcuda_version,
            "nvml_version": d.nvml_version,
            "mismatch": [{"soname": s, "version": v} for s, v in d.mismatched_libraries()],
            "gpus": [
                {"name": g.name, "compute_capability": g.compute_capability, "uuid": g.uuid}
                for g in (d.gpus if probed else ())
            ],
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
    return SnapshotReader(memo=0).read(path)


class SnapshotReader:
    """:func:`load_snapshot` for many files (``cudastack fleet``): the same answers, with each top-level
    field's verdict remembered by its content, so the wheels and resolution that thousands of nodes share
    are checked against the schema once. At most ``memo`` verdicts are kept (the memo is emptied when full);
    a document with any complaint is checked again whole, so its message is :func:`load_snapshot`'s."""

    def __init__(self, memo: int = 256) -> None:
        self._limit = memo
        self._memo: dict[tuple[int, bool, str, bytes], bool] = {}
        self._schemas: dict[tuple[int, bool], tuple[dict[str, Any], dict[str, Any]]] = {}

    def _schema(self, version: int, legacy: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the whole schema, its top level alone: required and additional properties, any value allowed)."""
        key = (version, legacy)
        if key not in self._schemas:
            whole = snapshot_schema(legacy=legacy, version=version)
            top = {**whole, "properties": {name: {} for name in whole["properties"]}}
            self._schemas[key] = (whole, top)
        return self._schemas[key]

    def _valid(self, data: dict[str, Any], version: int, legacy: bool) -> bool:
        whole, top = self._schema(version, legacy)
        if first_error(data, top) is not None:
            return False
        for name, value in data.items():
            # marshal: the value's exact content (types, order) at a fifth of json.dumps's cost
            key = (version, legacy, name, marshal.dumps(value))
            verdict = self._memo.get(key)
            if verdict is None:
                sub = {"$defs": whole.get("$defs", {}), **whole["properties"][name]}
                verdict = first_error(value, sub) is None
                if len(self._memo) >= self._limit:
                    self._memo.clear()
                if self._limit:
                    self._memo[key] = verdict
            if not verdict:
                return False
        return True

    def read(self, path: str) -> dict[str, Any]:
        """The snapshot in ``path``, as :func:`load_snapshot` reads it."""
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
        version = data.get("version", data.get("format"))
        if version not in SNAPSHOT_READS:
            expected = " or ".join(map(str, SNAPSHOT_READS))
            raise DataError(f"{path}: not a cudastack snapshot (version {expected} expected)")
        legacy = "schema" not in data
        if self._limit and self._valid(data, version, legacy):
            return data
        error = first_error(data, self._schema(version, legacy)[0])
        if error is not None:
            raise DataError(f"{path}: not a cudastack snapshot: {error}")
        return data


def snapshot_schema(legacy: bool, version: int = SNAPSHOT_FORMAT) -> dict[str, Any]:
    """The shipped snapshot schema; for a version-1 file, without the fields version 2 added (node facts,
    fingerprint, bytes, resolution, needs) and with version 1's driver; for a 0.1.0 file, also without the
    fields 0.1.0 did not write (the top level's schema and version, a wheel's gpu_code; its driver object was
    not fixed then)."""
    with open(os.path.join(os.path.dirname(__file__), "schemas", "snapshot.schema.json"), encoding="utf-8") as f:
        schema: dict[str, Any] = json.load(f)
    if version == 1:
        added = ("resolved", "needs", "fingerprint")
        schema["required"] = [k for k in schema["required"] if k not in added]
        for key in ("version", "format"):
            schema["properties"][key] = {"const": 1}
        defs = schema["$defs"]
        defs["wheel"]["required"] = [k for k in defs["wheel"]["required"] if k != "files"]
        libraries = ("libcuda_version", "nvml_version")
        defs["driver"]["required"] = [k for k in defs["driver"]["required"] if k not in libraries]
    if legacy:
        schema["required"] = [k for k in schema["required"] if k not in ("schema", "version")]
        defs = schema["$defs"]
        defs["wheel"]["required"] = [k for k in defs["wheel"]["required"] if k != "gpu_code"]
        defs["driver"]["required"] = []
    return schema


def write_snapshot(stack: Stack, path: str | None, host: bool = True) -> None:
    """``stack.to_json(host)`` to ``path`` (its directory created, the file replaced atomically), or to standard
    output when None or ``-``. DataError naming the path when it cannot be written."""
    text = json.dumps(stack.to_json(host), indent=2, sort_keys=True) + "\n"
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    # a user's output file: 0666 less the umask, as any tool's `-o FILE` (the ELF caches stay private)
    error = write_atomic(os.path.dirname(os.path.abspath(path)), path, text, mode=0o666)
    if error is not None:
        raise DataError(f"{path}: cannot write the snapshot: {error.strerror or error}")
