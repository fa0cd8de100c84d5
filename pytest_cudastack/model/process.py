"""The process ``import MODULE`` creates, predicted from the files: which shared objects it maps, in order,
and why each one, without importing or executing anything.

The model:

* **Python's imports, statically.** A module's top-level statements are read with :mod:`ast` (never run;
  a string-aware line scan first keeps only the statements the rules below read, so the parse is small):
  each ``import X`` / ``from X import a`` is followed depth first, in statement order, as the interpreter
  executes them (``from P import a`` imports ``P.a`` when that is a submodule; class bodies run, function
  bodies do not); ``if`` tests on
  ``TYPE_CHECKING``, ``sys.platform``, ``sys.version_info`` and ``os.name`` are evaluated (for the Python
  owning the site: ``Interpreter.target``), others take
  both branches; a ``try`` takes its body, and its ``except`` handlers only when an import of the body is
  not found or fails to load (its extension module misses a DT_NEEDED: that import's maps are undone and
  the rest of the body is skipped, as the ImportError it raises is caught). Code in functions and classes
  runs later (or never) and is not followed. Modules are found the way ``importlib``'s path finder does:
  packages (a directory with ``__init__.py``), then extension modules
  (``importlib.machinery.EXTENSION_SUFFIXES``), then ``.py`` files, in each ``sys.path`` entry in order; a
  directory without ``__init__.py`` is a namespace portion. Builtin modules and modules already
  imported when the interpreter starts (``Interpreter.startup``) map nothing new.
* **CPython extension loading.** An extension module is ``dlopen``-ed by path with RTLD_NOW | RTLD_LOCAL
  (``sys.getdlopenflags()``'s default); its DT_NEEDED closure is resolved by :meth:`Resolver.tree` with every
  object mapped so far already loaded (glibc's ``_dl_map_object`` first matches a request against the
  names and DT_SONAME of loaded objects, whatever their RTLD_LOCAL/RTLD_GLOBAL scope). Each ``dlopen`` is
  recorded (``Process.loads``) with what it finds loaded and the global scope then, for the binding check.
* **Imports from C.** An extension module's init then imports what its C code names
  (:mod:`pytest_cudastack.linker.lookups`): each dotted C string of its read-only data that names an
  installed module (Cython's ``cimport``s of cdef functions and extension types), unless a Cython older than
  3.1 built it (a module with no version marker takes the one its distribution's other modules show); and,
  for a Cython >= 3.1 module, the names its module exec function passes to the import
  machinery (:mod:`pytest_cudastack.linker.cyinit`: its module-level ``import`` statements, not those inside
  functions), each taken absolute or relative to the module's package (``Python/import.c``'s
  ``resolve_name`` at level 1), when it names an installed module. Such an import whose module fails to load
  (a DT_NEEDED found nowhere) is taken as caught and leaves nothing mapped: a ``try``/``except
  ImportError`` around it (cupy's optional cuTENSOR module) is not read from machine code, and a false error
  on a healthy stack is the worse mistake. tests/test_process_cython.py checks these rules against real
  Cython builds.
* **Known preloads** (``cuda/data/dlopen_targets.json``, ``preloads``): torch's ``_load_global_deps``
  maps ``libtorch_global_deps.so`` by path with RTLD_GLOBAL and then its nvidia libraries by path from
  ``sys.path``, at the point of its top-level code that calls it; rows with ``before_import`` run right
  before the model imports one of their modules (cupy's cuda-pathfinder loads, RTLD_GLOBAL, before each
  ``cupy_backends.cuda.libs`` submodule; jax's CUDA plugin ``initialize``, before its extension). Objects an
  RTLD_GLOBAL load maps (and its search list) join the global scope (``Mapped.global_scope``,
  :class:`ImportScope`), which the symbols check uses.
* **dlopen targets.** The run-time loads of the dlopen table (:mod:`pytest_cudastack.checks.dlopen`) of
  every mapped object are listed apart (``Process.run_time``): they happen when a feature is first used,
  not at import.
* **Calls at import time.** Imports inside the module's own functions that its top-level code calls (with
  constant arguments, through aliases, in ``for`` loops over constant sequences) run when the call does
  (:mod:`pytest_cudastack.model.pysource`: hashlib's ``__get_builtin_constructor`` imports ``_blake2``).

Not modelled: imports performed by code the model does not run (``importlib.import_module`` with a computed
name, ``__getattr__`` lazy imports, methods and other modules' functions called at import time; in a Cython
module, imports inside its functions that its module-level code calls, and the imports of a module whose
string table the reader cannot decode: a table of a few dozen constants, an unoptimized or
``CYTHON_USE_MODULE_STATE`` build, another machine than x86-64; imports relative to a grandparent package
(``from ..x import``); a C string that names a module the extension imports only later, when a function
runs, is taken as an import at init; a module-level Cython import that fails to load without a ``try`` is
taken as caught, so the failure of that import is not predicted),
``.pth`` files, the current directory at the head of ``sys.path``, and ctypes loads other than the table's.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pytest_cudastack._sysio import real_path
from pytest_cudastack.cuda.dlopen import Preload, load_preloads
from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.lookups import Lookups, cached_lookups
from pytest_cudastack.linker.resolver import Resolver, Route
from pytest_cudastack.linker.strings import StringFacts
from pytest_cudastack.model.abi import inspected_stdlib, inspected_suffixes, inspected_target
from pytest_cudastack.model.pysource import HOST, Items, PyTarget, module_imports, string_constant
from pytest_cudastack.model.runtime import loads_of

__all__ = [
    "ImportScope",
    "Interpreter",
    "Load",
    "Mapped",
    "ModuleFinder",
    "Process",
    "import_contexts",
    "import_reach",
    "import_scopes",
    "module_name",
    "predict_import",
]

MAX_MODULES = 20_000  # torch's import executes ~1,000 modules; a cap keeps a hostile tree finite
_MAX_DEPTH = 100  # nested imports; each level costs ~3 Python frames of the model (recursion limit 1000)


@dataclass(frozen=True)
class Interpreter:
    """What decides a module search: ``sys.path`` of the interpreter that would import, its executable
    (whose closure is mapped before any import), the extension suffixes and the modules it has imported
    when it starts (builtin and frozen: they map nothing)."""

    path: tuple[str, ...]
    executable: str
    suffixes: tuple[str, ...] = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    startup: frozenset[str] = frozenset(sys.builtin_module_names)
    target: PyTarget = HOST  # the version its modules' ``if sys.version_info`` tests are decided for

    @classmethod
    def for_sites(cls, site_dirs: Sequence[str], executable: str | None = None, root: str | None = None) -> Interpreter:
        """The standard library and ``lib-dynload`` of the interpreter owning ``site_dirs``, then ``site_dirs``:
        the ``sys.path`` of a venv; the extension suffixes of that interpreter
        (:func:`~pytest_cudastack.model.abi.inspected_suffixes`: a 3.12 venv's ``.cpython-312-...so``, never
        this 3.11's). Its standard library is this interpreter's for a site of this minor on this machine;
        the one the site's files show (:func:`~pytest_cudastack.model.abi.inspected_stdlib`) for another
        minor, or for a site inside another system's ``root`` (an image's: none where its files show none,
        never this machine's)."""
        target = inspected_target(site_dirs)
        shown = inspected_stdlib(site_dirs, root)
        head: tuple[str, ...] = shown or ()
        if root is None and (shown is None or target.version[:2] == HOST.version[:2]):
            # lazy: sysconfig parses the build configuration; only the import model needs it
            import sysconfig

            stdlib = sysconfig.get_paths()["stdlib"]
            head = (stdlib, os.path.join(stdlib, "lib-dynload"))
        return cls(
            tuple(dict.fromkeys((*head, *site_dirs))),
            os.path.realpath(executable or sys.executable),
            suffixes=inspected_suffixes(site_dirs),
            startup=frozenset(sys.builtin_module_names) | _FROZEN_AT_STARTUP,
            target=target,
        )


# CPython 3.11's frozen startup modules (Python/frozen.c, "stdlib - startup, without site"): imported before
# any user code, so their imports map nothing new.
_FROZEN_AT_STARTUP = frozenset(
    {
        "abc",
        "codecs",
        "io",
        "_collections_abc",
        "_sitebuiltins",
        "genericpath",
        "ntpath",
        "posixpath",
        "os",
        "site",
        "stat",
        "importlib.util",
        "importlib.machinery",
        "runpy",
        "encodings",
    }
)


@dataclass(frozen=True)
class Mapped:
    """One shared object the import maps: where, its soname, owner, how (``route``) and why (``reason``)."""

    path: str
    realpath: str
    soname: str | None
    provider: str | None
    route: str  # "extension module" | "DT_NEEDED" | "preload" | "dlopen"
    reason: str  # "extension module torch._C", "DT_NEEDED of libtorch.so", "preload by path (torch ...)"
    global_scope: bool = False  # in the global lookup scope: loaded (or needed) by an RTLD_GLOBAL load


@dataclass(frozen=True)
class Load:
    """One ``dlopen`` of the import (an extension module or a preload by path): the object opened, the index
    in ``Process.objects`` of the first object it mapped (it maps those up to the next load's), and what it
    finds loaded and in the global scope when it starts (the binding check's lookup scopes)."""

    path: str
    first: int
    scope: ImportScope


@dataclass(frozen=True)
class Process:
    """The predicted process: mapped objects in load order, loads that happen later (``run_time``: dlopen
    by a mapped object when a feature is used), missing sonames and problems."""

    module: str
    objects: tuple[Mapped, ...]
    run_time: tuple[Mapped, ...] = ()
    missing: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    modules: tuple[str, ...] = field(default=(), repr=False)  # Python modules the model imported, in order
    loads: tuple[Load, ...] = field(default=(), repr=False)  # the dlopen calls that mapped ``objects``, in order
    executable: str = field(default="", repr=False)  # the interpreter whose closure is the first global scope


@dataclass
class _State:
    interp: Interpreter
    resolver: Resolver
    read: Callable[[str], ElfInfo]
    owner: Callable[[str], str | None]
    objects: list[Mapped] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)  # paths of every mapped object (and the executable's)
    real: set[str] = field(default_factory=set)
    imported: dict[str, str | None] = field(default_factory=dict)  # module -> its file (None: no file)
    order: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    dirs: dict[str, str] = field(default_factory=dict)
    preloads: tuple[Preload, ...] = ()
    cache: ElfCache | None = None
    before: dict[str, tuple[str, ...]] = field(default_factory=dict)  # realpath -> what was mapped before it
    globals: list[str] = field(default_factory=list)  # the global scope: the executable's closure, RTLD_GLOBAL loads
    scope_before: dict[str, tuple[str, ...]] = field(default_factory=dict)  # realpath -> global scope then
    ran: set[int] = field(default_factory=set)  # before_import preload rows already run (by index)
    triggers: dict[str, tuple[int, ...]] = field(default_factory=dict)  # module -> its before_import rows
    global_real: set[str] = field(default_factory=set)  # realpaths of ``globals``
    loads: list[Load] = field(default_factory=list)
    # (name, path): the DT_NEEDED strings mapped objects were opened as (glibc's l_libname), which a later
    # dlopen of that name matches before any search
    names: list[tuple[str, str]] = field(default_factory=list)
    cython_of: dict[str, tuple[int, int]] = field(default_factory=dict)  # distribution -> the Cython its modules show


# --------------------------------------------------------------------------------------------- finding modules


def _listing(listings: dict[str, frozenset[str]], entry: str) -> frozenset[str]:
    """The names in the directory ``entry`` (none when it is no directory), listed once a run: importlib's
    FileFinder keeps the same listing (``_path_cache``) and stats only a name that is in it."""
    names = listings.get(entry)
    if names is None:
        try:
            names = frozenset(os.listdir(entry))
        except (OSError, ValueError):
            names = frozenset()
        listings[entry] = names
    return names


def _find_in(
    entries: Sequence[str], leaf: str, suffixes: Sequence[str], listings: dict[str, frozenset[str]]
) -> tuple[str | None, list[str], bool]:
    """(file, namespace portions, is_package) of ``leaf`` in ``entries``, as importlib's FileFinder: in each
    entry a package directory first, then extension modules, then a ``.py`` file; a directory without
    ``__init__.py`` is remembered as a namespace portion and the search goes on. A name is looked at only
    when the entry's listing (``listings``) has it."""
    portions: list[str] = []
    for entry in entries:
        names = _listing(listings, entry)
        if not names:
            continue
        d = os.path.join(entry, leaf)
        if leaf in names:
            init = os.path.join(d, "__init__.py")
            if os.path.isfile(init):
                return init, [d], True
        for suffix in (*suffixes, ".py"):
            f = d + suffix
            if leaf + suffix in names and os.path.isfile(f):
                return f, [], False
        if leaf in names and os.path.isdir(d):
            portions.append(d)
    return None, portions, bool(portions)


@dataclass
class ModuleFinder:
    """Where ``interp``'s import system finds each module (importlib's path finders over its ``sys.path``):
    file-system facts only, so one finder serves every model process of a run over the same interpreter."""

    interp: Interpreter
    paths: dict[str, list[str]] = field(default_factory=dict)  # package -> its __path__
    files: dict[str, str | None] = field(default_factory=dict)
    found: dict[str, bool] = field(default_factory=dict)
    listings: dict[str, frozenset[str]] = field(default_factory=dict)  # directory -> its names (_listing)

    def find(self, name: str) -> bool:
        """Whether ``name`` is found; its file (None for a namespace package) in ``files``."""
        if name in self.found:
            return self.found[name]
        parent, _, leaf = name.rpartition(".")
        if parent:
            if not self.find(parent) or parent not in self.paths:
                self.found[name] = False
                return False
            entries: Sequence[str] = self.paths[parent]
        else:
            entries = self.interp.path
        file, portions, package = _find_in(entries, leaf, self.interp.suffixes, self.listings)
        ok = file is not None or package
        self.found[name] = ok
        if ok:
            self.files[name] = file
            if package:
                self.paths[name] = portions
        return ok


# --------------------------------------------------------------------------------------------- the model


def _promote(st: _State, path: str) -> None:
    """``path`` joins the global scope (dl_open_worker's add_to_global: every object of an RTLD_GLOBAL
    load's search list, those loaded before included)."""
    key = real_path(path, st.dirs)
    if key not in st.global_real:
        st.global_real.add(key)
        st.globals.append(path)
        for i, o in enumerate(st.objects):
            if o.realpath == key and not o.global_scope:
                st.objects[i] = replace(o, global_scope=True)


def _map(st: _State, path: str, route: str, reason: str, is_global: bool = False) -> None:
    """Map ``path`` (an extension module or a library loaded by path) and its DT_NEEDED closure, every
    object mapped so far already loaded; with ``is_global`` (RTLD_GLOBAL) all of them join the global
    scope."""
    key = real_path(path, st.dirs)
    if key in st.real:
        if is_global:  # dlopen of a loaded object with RTLD_GLOBAL promotes it (and its search list)
            _promote(st, path)
            for lib in st.resolver.tree(path, loaded=st.loaded).libraries:
                if lib.path is not None:
                    _promote(st, lib.path)
        return
    try:
        info = st.read(path)
    except ElfError as e:
        st.problems.append(str(e))
        return
    st.real.add(key)
    st.before[key] = tuple(st.loaded)
    st.scope_before[key] = tuple(st.globals)
    st.loads.append(Load(path, len(st.objects), ImportScope(st.before[key], st.scope_before[key])))
    st.loaded.append(path)
    st.objects.append(Mapped(path, key, info.soname, st.owner(path), route, reason))
    if is_global:
        _promote(st, path)
    tree = st.resolver.tree(path, loaded=st.loaded[:-1])
    for lib in tree.libraries:
        if lib.path is None:
            if lib.soname not in st.missing:
                st.missing.append(lib.soname)
            continue
        if lib.route is Route.ALREADY_LOADED:
            if is_global:
                _promote(st, lib.path)
            continue
        k = lib.realpath or real_path(lib.path, st.dirs)
        if k in st.real:
            continue
        st.real.add(k)
        st.loaded.append(lib.path)
        st.names.append((lib.soname, lib.path))
        needer = lib.needed_by[0] if lib.needed_by else path
        try:
            soname = st.read(lib.path).soname
        except ElfError:
            soname = lib.soname
        st.objects.append(
            Mapped(lib.path, k, soname, lib.provider, "DT_NEEDED", f"DT_NEEDED of {os.path.basename(needer)}")
        )
        if is_global:
            _promote(st, lib.path)


def _preload(st: _State, row: Preload, module: str, package_dir: str) -> None:
    reason = f"preload by path ({module}.{row.at}, {row.flags})"
    is_global = row.flags == "RTLD_GLOBAL"
    if row.kind == "path":
        # relative to the top-level package (torch/, torchaudio/), whichever of its modules calls ``at``
        top = st.imported.get(module.split(".")[0])
        p = os.path.join(os.path.dirname(top) if top else package_dir, row.path)
        if os.path.isfile(p):
            _map(st, p, "preload", reason, is_global)
        else:
            st.problems.append(f"{module}: {row.at} would load {p}, which is missing")
        return
    if row.when_mapped and not any(
        (o.soname or os.path.basename(o.path)).startswith(row.when_mapped) for o in st.objects
    ):
        return
    major = string_constant(package_dir, row.cuda_major) if row.cuda_major else None
    dirs = [d for d in row.dirs if "{cuda_major}" not in d or major is not None]
    for folder, pattern in row.libraries:
        subs = [d.format(folder=folder, cuda_major=major or "") for d in dirs]
        if row.order == "dirs":  # each directory over every entry, then the next directory
            groups = [[os.path.join(e, sub) for e in st.interp.path] for sub in subs]
        else:  # each entry's directories, then the next entry
            groups = [[os.path.join(e, sub) for sub in subs] for e in st.interp.path]
        for group in groups:
            hits: list[str] = []
            for sub in group:
                try:
                    names = os.listdir(sub)  # glob.glob's order: the directory's own
                except OSError:
                    continue
                hits.extend(os.path.join(sub, n) for n in names if fnmatch.fnmatchcase(n, pattern))
            if hits:
                if row.unless_loaded and _soname_mapped(st, hits[0]):
                    break
                _map(st, hits[0], "preload", reason, is_global)
                break


def _soname_mapped(st: _State, path: str) -> bool:
    """Whether an object with ``path``'s soname is mapped (cuda-pathfinder's RTLD_NOLOAD check)."""
    try:
        soname = st.read(path).soname
    except ElfError:
        return False
    return soname is not None and any(o.soname == soname for o in st.objects)


def _import(st: _State, finder: ModuleFinder, name: str, depth: int = 0) -> bool:
    """Import ``name`` (and its parents first) into the model; whether it was found."""
    if name in st.imported:
        return True
    if name in st.interp.startup:
        st.imported[name] = None
        return True
    parent = name.rpartition(".")[0]
    if parent and not _import(st, finder, parent, depth):
        return False
    if name in st.imported:  # the parent's code imported it
        return True
    if not finder.find(name):
        return False
    if len(st.imported) >= MAX_MODULES or depth > _MAX_DEPTH:
        st.problems.append(f"import model stopped at {name}: more than {MAX_MODULES} modules or {_MAX_DEPTH} levels")
        return True
    for i in st.triggers.get(name, ()):
        row = st.preloads[i]
        if i not in st.ran:
            st.ran.add(i)
            owner = finder.files.get(row.module)
            _preload(st, row, row.module, os.path.dirname(owner) if owner else "")
    file = finder.files.get(name)
    st.imported[name] = file
    st.order.append(name)
    if file is None:
        return True
    if not file.endswith(".py"):
        fresh = real_path(file, st.dirs) not in st.real
        _map(st, file, "extension module", f"extension module {name} (dlopen RTLD_NOW|RTLD_LOCAL)")
        if fresh and real_path(file, st.dirs) in st.real:  # its init ran: the imports it makes from C
            for sub, guarded in _c_imports(st, finder, name, file):
                if not guarded:
                    _import(st, finder, sub, depth + 1)
                    continue
                saved = _snapshot(st)
                _import(st, finder, sub, depth + 1)
                if len(st.missing) > len(saved.missing):  # it fails to load: taken as caught (module docstring)
                    _restore(st, saved)
        return True
    is_package = os.path.basename(file) == "__init__.py"
    rows = [r for r in st.preloads if r.module == name and not r.before_import]
    items = module_imports(file, name, is_package, st.cache, st.interp.target)
    _run_body(st, finder, items, name, os.path.dirname(file), rows, depth)
    return True


def _lookups(st: _State, path: str) -> Lookups | None:
    """The run-time lookups of an extension module (kept in the ELF cache); None when it cannot be read."""
    try:
        return cached_lookups(path, st.cache)
    except ElfError as e:
        st.problems.append(str(e))
        return None


def _c_imports(st: _State, finder: ModuleFinder, module: str, path: str) -> list[tuple[str, bool]]:
    """The installed modules extension ``module`` imports from C at init (:mod:`pytest_cudastack.linker.lookups`),
    each with whether a failure to load it is taken as caught: its dotted C strings that name a module
    (Cython's cimports: not caught), unless a Cython older than 3.1 built it (its Python constants, the names
    of imports inside functions among them, are such strings too); then the names its Cython >= 3.1 exec
    function passes to the import machinery (:mod:`pytest_cudastack.linker.cyinit`), absolute or relative to
    its package (``Python/import.c``'s ``resolve_name`` at level 1): caught, as a ``try``/``except
    ImportError`` around them is not read."""
    found = _lookups(st, path)
    if found is None:
        return []
    # one wheel is one build, by one Cython: a module that keeps no version marker (no shared-type module
    # name: cupy-cuda11x's fft/_callback beside its _cython_3_0_12 siblings) takes its distribution's
    version, owner = found.cython, st.owner(path) or ""
    if version is None:
        version = st.cython_of.get(owner)
    elif owner:
        st.cython_of.setdefault(owner, version)
    if version is not None and version < (3, 1):
        return []
    names = {n: False for n in found.modules}
    package = module.rpartition(".")[0]
    for name in found.init or ():
        names.setdefault(name, True)
        if package:
            names.setdefault(f"{package}.{name}", True)
    return [(n, g) for n, g in names.items() if n != module and n not in st.imported and finder.find(n)]


# what an import records in _State (all but the finder's caches), for _snapshot/_restore
_RECORD = (
    "objects",
    "loaded",
    "real",
    "imported",
    "order",
    "missing",
    "problems",
    "before",
    "globals",
    "scope_before",
    "ran",
    "global_real",
    "loads",
    "names",
)


def _snapshot(st: _State) -> _State:
    """A copy of what ``st`` records (:data:`_RECORD`), for :func:`_restore`."""
    return replace(st, **{f: type(getattr(st, f))(getattr(st, f)) for f in _RECORD})


def _restore(st: _State, saved: _State) -> None:
    """Undo what was recorded since ``saved``: a failed import leaves nothing mapped (glibc's dlopen
    unmaps what a failed load mapped; the import system drops the module)."""
    for f in _RECORD:
        setattr(st, f, getattr(saved, f))


def _run_body(
    st: _State,
    finder: ModuleFinder,
    items: Items,
    module: str,
    pkg_dir: str,
    rows: list[Preload],
    depth: int,
    guarded: bool = False,
) -> bool:
    """Execute the imports of one block; whether all of them were found (and, in a ``try`` body:
    ``guarded``, loaded). In a ``try`` body an import whose extension module fails to load (a DT_NEEDED
    found nowhere) raises ImportError there: what it mapped is undone, as glibc unmaps a failed load, and
    the rest of the body does not run (cupy's ``try: import cupy_backends.cuda.libs.cutensor``)."""
    ok = True
    for item in items:
        kind = item[0]
        if kind == "c":
            for row in rows:
                if row.at == item[1]:
                    _preload(st, row, module, pkg_dir)
        elif kind == "i":
            saved = _snapshot(st) if guarded else None
            first, *rest = item[1]
            if not _import(st, finder, first, depth + 1):
                ok = False
                continue
            for sub in rest:  # from P import a: P.a when it is a submodule
                if sub not in st.imported and finder.find(sub):
                    _import(st, finder, sub, depth + 1)
            if saved is not None and len(st.missing) > len(saved.missing):
                _restore(st, saved)
                return False
        elif kind == "t" and not _run_body(st, finder, item[1], module, pkg_dir, rows, depth, guarded=True):
            for handler in item[2]:
                _run_body(st, finder, handler, module, pkg_dir, rows, depth, guarded)
    return ok


def _new_state(
    interp: Interpreter,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    owner: Callable[[str], str | None],
    preloads: Sequence[Preload] | None,
    cache: ElfCache | None,
) -> _State:
    st = _State(
        interp, resolver, read, owner, preloads=tuple(load_preloads() if preloads is None else preloads), cache=cache
    )
    triggers: dict[str, list[int]] = {}
    for i, row in enumerate(st.preloads):
        for m in row.before_import:
            triggers.setdefault(m, []).append(i)
    st.triggers = {m: tuple(v) for m, v in triggers.items()}
    exe = resolver.tree(interp.executable)
    st.loaded.append(interp.executable)
    st.globals.append(interp.executable)
    st.real.add(real_path(interp.executable, st.dirs))
    st.global_real.add(real_path(interp.executable, st.dirs))
    for lib in exe.libraries:
        if lib.path is not None:
            key = lib.realpath or real_path(lib.path, st.dirs)
            st.loaded.append(lib.path)
            st.globals.append(lib.path)  # the main program's search list is the global scope
            st.real.add(key)
            st.global_real.add(key)
    return st


def _copy(st: _State) -> _State:
    """A copy of a model process whose later imports leave ``st`` as it is."""
    return replace(
        st,
        objects=list(st.objects),
        loaded=list(st.loaded),
        real=set(st.real),
        imported=dict(st.imported),
        order=list(st.order),
        missing=list(st.missing),
        problems=list(st.problems),
        before=dict(st.before),
        globals=list(st.globals),
        scope_before=dict(st.scope_before),
        ran=set(st.ran),
        global_real=set(st.global_real),
        loads=list(st.loads),
        names=list(st.names),
    )


def module_name(path: str, site_dirs: Sequence[str], suffixes: Sequence[str]) -> str | None:
    """The dotted name an extension module at ``path`` is imported as from ``site_dirs``, else None."""
    for site in site_dirs:
        prefix = os.path.normpath(site).rstrip(os.sep) + os.sep
        p = os.path.normpath(path)
        if not p.startswith(prefix):
            continue
        rel = p[len(prefix) :]
        for suffix in sorted(suffixes, key=len, reverse=True):
            if rel.endswith(suffix):
                parts = rel[: -len(suffix)].split(os.sep)
                if all(x.isidentifier() for x in parts):
                    return ".".join(parts)
    return None


@dataclass(frozen=True)
class ImportScope:
    """What an extension module's ``dlopen`` finds when the import reaches it: every object mapped before
    it (``loaded``, in load order: what its DT_NEEDED match by name or SONAME) and the global lookup scope
    then (``global_scope``: the executable's closure and what RTLD_GLOBAL loads added, in order; objects
    loaded RTLD_LOCAL, extension modules among them, are not in it)."""

    loaded: tuple[str, ...]
    global_scope: tuple[str, ...]
    # the process once the import that loads the module is complete, where the run-time loads of what it
    # mapped happen (a feature is used after its import): every object mapped, in load order, and the
    # DT_NEEDED names they were opened as (``(name, path)``)
    after: tuple[str, ...] = ()
    after_names: tuple[tuple[str, str], ...] = ()


def import_contexts(
    modules: Sequence[str],
    interp: Interpreter,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    owner: Callable[[str], str | None],
    cache: ElfCache | None = None,
) -> dict[str, tuple[str, ...]]:
    """For each extension module path of ``modules``, the objects already mapped when the import that loads
    it reaches it (:func:`import_scopes`' ``loaded``)."""
    return {p: s.loaded for p, s in import_scopes(modules, interp, resolver, read, owner, cache).items()}


def import_scopes(
    modules: Sequence[str],
    interp: Interpreter,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    owner: Callable[[str], str | None],
    cache: ElfCache | None = None,
) -> dict[str, ImportScope]:
    """For each extension module path of ``modules``, its :class:`ImportScope`: one model process per
    top-level package, which imports the package (as ``import P`` does) and then each of its modules that
    import did not reach, in order. A module the model cannot import (its package's code is not found) is
    absent from the answer."""
    names: dict[str, list[tuple[str, str]]] = {}
    for path in modules:
        name = module_name(path, interp.path, interp.suffixes)
        if name is not None:
            names.setdefault(name.split(".")[0], []).append((name, path))
    out: dict[str, ImportScope] = {}
    listings: dict[str, frozenset[str]] = {}  # the directories' names: one listing each for every package
    for top, members in names.items():
        st = _new_state(interp, resolver, read, owner, None, cache)
        finder = ModuleFinder(interp, listings=listings)  # caches the file system only: shared by the copies
        with contextlib.suppress(RecursionError):  # too deep a chain: what was reached still counts
            _import(st, finder, top)
        for name, path in members:
            key = real_path(path, st.dirs)
            where = st
            if key not in st.before:
                where = _copy(st)
                with contextlib.suppress(RecursionError):
                    _import(where, finder, name)
            if key in where.before:
                out[path] = ImportScope(
                    where.before[key], where.scope_before[key], tuple(where.loaded), tuple(where.names)
                )
    return out


def import_reach(
    names: Sequence[str],
    interp: Interpreter,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    owner: Callable[[str], str | None],
    cache: ElfCache | None = None,
    finder: ModuleFinder | None = None,
) -> dict[str, int]:
    """One model process that runs ``import NAME`` for each of ``names`` in turn (as a program's import
    statements run): the real path of every object mapped -> the index in ``names`` of the first import that
    mapped it. A name the model does not find maps nothing. ``finder``: one kept by the caller for ``interp``
    (its answers reused by every process of the run)."""
    st = _new_state(interp, resolver, read, owner, None, cache)
    if finder is None or finder.interp is not interp:
        finder = ModuleFinder(interp)
    out: dict[str, int] = {}
    for i, name in enumerate(names):
        before = len(st.objects)
        with contextlib.suppress(RecursionError):  # too deep a chain: what was reached still counts
            _import(st, finder, name)
        for obj in st.objects[before:]:
            out.setdefault(obj.realpath, i)
    return out


def predict_import(
    module: str,
    interp: Interpreter,
    resolver: Resolver,
    read: Callable[[str], ElfInfo],
    owner: Callable[[str], str | None],
    strings: Callable[[str], StringFacts] | None = None,
    preloads: Sequence[Preload] | None = None,
    cache: ElfCache | None = None,
) -> Process:
    """The shared objects ``import module`` maps in ``interp`` (module docstring), beyond those of the
    interpreter's own executable (mapped before any import). ``strings``: the run's
    ``ElfCache.read_strings``, for the run-time loads (dlopen table rows that read names from data);
    ``cache``: the run's ELF cache, which keeps each Python file's imports (parsed once while unchanged)."""
    st = _new_state(interp, resolver, read, owner, preloads, cache)
    finder = ModuleFinder(interp)
    try:
        found = _import(st, finder, module)
    except RecursionError:  # a deeper chain than _MAX_DEPTH allows for (nested try blocks): a problem, not a crash
        found = True
        st.problems.append(f"import model stopped: {module}'s imports nest too deeply")
    if not found:
        st.problems.append(f"No module named {module!r} on {os.pathsep.join(interp.path)}")
    later: list[Mapped] = []
    if strings is not None:
        # lazy: checks.dlopen imports checks.closure, which imports this module for import contexts

        seen = set(st.real)
        for obj in list(st.objects):
            try:
                info = read(obj.path)
            except ElfError:
                continue
            for ld in loads_of(obj.path, info, resolver, strings, st.loaded):
                lib = ld.library
                if lib.path is None or lib.route is Route.ALREADY_LOADED:
                    continue
                k = lib.realpath or real_path(lib.path, st.dirs)
                if k in seen:
                    continue
                seen.add(k)
                later.append(
                    Mapped(lib.path, k, ld.name, lib.provider, "dlopen", f"dlopen by {os.path.basename(obj.path)}")
                )
    return Process(
        module,
        tuple(st.objects),
        tuple(later),
        tuple(st.missing),
        tuple(st.problems),
        tuple(st.order),
        tuple(st.loads),
        interp.executable,
    )
