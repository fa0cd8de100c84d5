"""Module trees: every Python extension module of the inventory with its resolved closure, in its import context.

An extension module is a RECORD-listed shared object that exports ``PyInit_<name>`` (``ElfInfo.pyinit``);
the ``.so`` suffix alone does not make one (nvidia's ``libcheckpoint.so``, triton's test plugins). Each
module is the root of one :meth:`Resolver.tree`; one Resolver serves them all, so directory listings and ELF
facts are read once. The closure, dlopen and symbols checks read these trees (``Stack.module_trees``, built
once per run).

Only modules the inspected interpreter can import are modules of this environment: a file whose name is not
an identifier plus one of that interpreter's extension suffixes (:mod:`pytest_cudastack.model.abi`: sgl-kernel's
``_mscclpp.cpython-310-x86_64-linux-gnu.so`` in a Python 3.11 venv) is never loaded, so it has no tree and
is no caller; :func:`foreign_modules` lists them (the closure item's one INFO).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_cudastack._sysio import real_path
from pytest_cudastack.cuda.compat import is_driver_soname
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Resolver, Route, SearchConfig, Tree
from pytest_cudastack.model.abi import PythonAbi, importable_suffix, inspected_suffixes, site_abi
from pytest_cudastack.model.process import Interpreter, import_contexts
from pytest_cudastack.wheels.inventory import Distribution, Inventory, Reader, ShippedLib

__all__ = [
    "Caller",
    "ForeignModule",
    "ModuleTree",
    "callers",
    "default_resolver",
    "extension_modules",
    "foreign_modules",
    "module_trees",
]


@dataclass(frozen=True)
class ModuleTree:
    """One extension module, its distribution and its resolved closure."""

    dist: Distribution
    module: ShippedLib
    tree: Tree


def default_resolver(inv: Inventory, config: SearchConfig | None = None, reader: Reader | None = None) -> Resolver:
    """A Resolver for this process's search configuration that names owners from ``inv`` (``reader``: the
    run's ``ElfCache.read``; default: uncached)."""
    return Resolver(
        config if config is not None else SearchConfig.from_environment(),
        reader=reader,
        owner=inv.owner,
    )


@dataclass(frozen=True)
class ForeignModule:
    """A file exporting ``PyInit_<name>`` that the inspected interpreter never imports: its name carries no
    suffix of that interpreter (``suffixes``, ``abi``: None when the site's layout names no Python)."""

    dist: Distribution
    module: ShippedLib
    suffixes: tuple[str, ...]
    abi: PythonAbi | None


def _present_modules(inv: Inventory) -> tuple[tuple[Distribution, ShippedLib], ...]:
    return tuple((d, lib) for d in inv.distributions for lib in d.libraries if lib.exists and lib.pyinit)


def extension_modules(
    inv: Inventory, suffixes: tuple[str, ...] | None = None
) -> tuple[tuple[Distribution, ShippedLib], ...]:
    """Every RECORD-listed, present file that exports ``PyInit_<name>`` and that the inspected interpreter
    can import (``suffixes``: its extension suffixes, default from ``inv.site_dirs``), in inventory order."""
    sfx = suffixes if suffixes is not None else inspected_suffixes(inv.site_dirs)
    return tuple((d, lib) for d, lib in _present_modules(inv) if importable_suffix(lib.path, sfx) is not None)


def foreign_modules(inv: Inventory) -> tuple[ForeignModule, ...]:
    """The present files exporting ``PyInit_<name>`` that the inspected interpreter never imports (another
    CPython version, the free-threaded ABI, another platform), in inventory order."""
    abi = site_abi(inv.site_dirs)
    sfx = inspected_suffixes(inv.site_dirs)
    return tuple(
        ForeignModule(d, lib, sfx, abi) for d, lib in _present_modules(inv) if importable_suffix(lib.path, sfx) is None
    )


def module_trees(
    inv: Inventory, resolver: Resolver, read: Reader | None = None, cache: ElfCache | None = None
) -> tuple[ModuleTree, ...]:
    """The resolved closure of every extension module, in its import context.

    A module whose closure alone misses a soname (other than the driver's) is resolved again with the
    objects already mapped when its import reaches it (:func:`~pytest_cudastack.model.process.import_contexts`:
    ``sgl_kernel/__init__.py`` imports torch first, so libtorch.so is loaded and satisfies the module's
    DT_NEEDED by SONAME). ``read``: the run's ``ElfCache.read`` (default uncached), ``cache``: its ELF cache
    (keeps the Python files' import lists)."""
    mods = extension_modules(inv)
    trees = [resolver.tree(lib.path) for _, lib in mods]
    needy = [
        lib.path
        for (_, lib), t in zip(mods, trees, strict=True)
        if any(not is_driver_soname(x.soname) for x in t.missing)
    ]
    if needy:
        interp = Interpreter.for_sites(inv.site_dirs, root=inv.root)
        contexts = import_contexts(needy, interp, resolver, read or read_elf, inv.owner, cache)
        trees = [
            resolver.tree(lib.path, loaded=contexts[lib.path]) if lib.path in contexts else t
            for (_, lib), t in zip(mods, trees, strict=True)
        ]
    return tuple(ModuleTree(d, lib, t) for (d, lib), t in zip(mods, trees, strict=True))


@dataclass(frozen=True)
class Caller:
    """A library that may dlopen: its path, the objects that loaded it at import (nearest first; None when
    no extension module's closure reaches it) and the distribution shipping it."""

    path: str
    loaders: tuple[str, ...] | None
    owner: str
    loaded: tuple[str, ...] = ()  # what the import has mapped when the caller runs: its module's closure


def callers(inv: Inventory, trees: Sequence[ModuleTree]) -> tuple[Caller, ...]:
    """Every extension module and every library its closure maps (with the chain that loaded it, first
    occurrence), then every other present shipped library (loaded by nothing at import) except the modules
    the inspected interpreter never imports (:func:`foreign_modules`)."""
    out: dict[str, Caller] = {}
    dirs: dict[str, str] = {}
    foreign = {fm.module.path for fm in foreign_modules(inv)}
    for mt in trees:
        key = real_path(mt.module.path, dirs)
        mapped = (mt.module.path, *(x.path for x in mt.tree.libraries if x.path is not None))
        out.setdefault(key, Caller(mt.module.path, (), mt.dist.label, mapped))
        for lib in mt.tree.libraries:
            if lib.path is None or lib.route is Route.ALREADY_LOADED:
                continue
            key = lib.realpath or real_path(lib.path, dirs)
            if key not in out:
                chain = mt.tree.chain(lib.soname)
                out[key] = Caller(lib.path, tuple(reversed(chain)), inv.owner(lib.path) or "", mapped)
    for dist in inv.distributions:
        for shipped in dist.libraries:
            if shipped.exists and not shipped.problem and shipped.path not in foreign:
                out.setdefault(real_path(shipped.path, dirs), Caller(shipped.path, None, dist.label))
    return tuple(out.values())
