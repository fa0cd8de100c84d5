"""What the checks read: option values (``Options``) and the stack's facts (``StackView``), as Protocols.

``settings.Settings`` and ``stack.Stack`` satisfy them structurally; this floor sits below both and never
imports them (PEP 544 structural subtyping). Importing this module costs nothing beyond ``typing``: every
pytest session reads the registry built on it (``Settings.items``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.findings import Finding
    from pytest_cudastack.image.rootfs import ImageRoot
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.linker.fatbin import Fatbin
    from pytest_cudastack.linker.resolver import Resolver, Tree
    from pytest_cudastack.model.modules import ModuleTree
    from pytest_cudastack.model.needs import Inference
    from pytest_cudastack.model.process import ImportScope
    from pytest_cudastack.model.reach import Reachability
    from pytest_cudastack.wheels.inventory import Inventory
    from pytest_cudastack.wheels.requirements import Requirements

__all__ = ["Options", "StackView", "Target"]

Target = tuple[str, str]
"""One target of a per-target check: ``(display name, absolute path)``, as ``scan.scan_targets`` lists them."""


class Options(Protocol):
    """The options a check's ``enabled``, ``description`` and ``run`` read (``settings.Settings``)."""

    @property
    def cudastack(self) -> bool: ...

    @property
    def cuda_max(self) -> str | None: ...

    @property
    def cuda_min(self) -> str | None: ...

    @property
    def cuda_driver(self) -> str | None: ...

    @property
    def cuda_arch(self) -> tuple[str, ...]: ...

    @property
    def cudastack_scan(self) -> tuple[str, ...]: ...

    @property
    def cudastack_baseline(self) -> str | None: ...

    @property
    def cudastack_image(self) -> str | None: ...

    @property
    def cudastack_imports(self) -> tuple[str, ...]: ...

    @property
    def cudastack_imports_scan(self) -> bool: ...

    def describe(self, key: str) -> str:
        """``"--cuda-max=12.9 (from ini)"``: the option, its value and where it came from."""
        ...


class StackView(Protocol):
    """The facts a check's ``run`` reads (``stack.Stack``, each computed once on first use)."""

    @property
    def settings(self) -> Options: ...

    @property
    def driver(self) -> DriverInfo: ...

    @property
    def image(self) -> ImageRoot | None:
        """The deployment image judged instead of this machine (``--cudastack-image``), else None."""
        ...

    @property
    def interpreter(self) -> str | None:
        """The Python that imports the inventory's modules; None: this one (``sys.executable``)."""
        ...

    @property
    def inventory(self) -> Inventory: ...

    @property
    def integrity(self) -> tuple[Finding, ...]: ...

    @property
    def resolver(self) -> Resolver: ...

    @property
    def module_trees(self) -> tuple[ModuleTree, ...]:
        """Every extension module with its closure, in its import context (built once per run)."""
        ...

    def import_scopes(self, modules: Sequence[str]) -> Mapping[str, ImportScope]:
        """For each extension module of ``modules``, the process of the import that loads it: what is mapped
        when it loads and once that import is complete (each computed once per run, when first asked)."""
        ...

    @property
    def requirements(self) -> Requirements:
        """Every installed distribution's Requires-Dist, evaluated once for the inspected interpreter."""
        ...

    @property
    def cache(self) -> ElfCache:
        """The run's one ELF cache (ELF facts and dynamic symbol facts)."""
        ...

    @property
    def reachability(self) -> Reachability:
        """Which extension modules an import that will happen loads: the installed distributions' top-level
        imports and the project's own imports (``model.reach``), computed on first question."""
        ...

    @property
    def scan_targets(self) -> tuple[Target, ...]: ...

    @property
    def scan_dirs(self) -> tuple[Target, ...]:
        """Walked scan directories holding files the walk did not check (their items warn about each)."""
        ...

    @property
    def inferences(self) -> tuple[Inference, ...]: ...

    def tree(self, path: str) -> Tree: ...

    def fatbin(self, path: str) -> Fatbin:
        """The GPU code of ``path``, through the run's ELF cache; ``ElfError`` when unreadable."""
        ...

    def to_json(self) -> dict[str, Any]: ...

    def recorded_snapshot(self, path: str) -> dict[str, Any]:
        """The snapshot recorded in ``path`` (relative to the rootdir); ``DataError`` when it is not one."""
        ...
