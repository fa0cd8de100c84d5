"""Reachability: which extension modules an import that will happen loads, and the severity that follows.

A load failure (a missing soname, an unbound reference) of an extension module is an ERROR only when an
import that will happen reaches the module:

* **the top-level import of its distribution**: ``import cupy`` for cupy-cuda13x, as the import model
  (:func:`~pytest_cudastack.model.process.import_reach`) predicts what it maps; every top-level name the
  distribution's RECORD installs counts;
* **an import of the project under test**: :func:`project_imports` reads the rootdir's own Python files
  (its packages and tests; every ``import`` and ``from ... import`` statement, in functions too, relative
  ones resolved) plus the ``cudastack_imports`` names, and the model follows each (``import cupy.fft`` in
  ``src/train.py`` reaches ``cupy/cuda/cufft...so``); such an ERROR names the import and its file:line.

Otherwise the finding becomes a WARNING that names the import that would fail (the shortest package of the
module whose import maps it, as the model predicts: "`import cupy.fft` will fail: ...") and keeps its
remedies. Computed lazily: only for the distributions that have a failing module, once per run.
"""

from __future__ import annotations

import ast
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pytest_cudastack._sysio import real_path
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Resolver
from pytest_cudastack.model.process import Interpreter, ModuleFinder, import_reach, module_name
from pytest_cudastack.model.pysource import read_module_source, resolve_from
from pytest_cudastack.wheels.inventory import Distribution, Inventory

if TYPE_CHECKING:
    from pytest_cudastack.model.modules import ModuleTree

__all__ = [
    "MAX_PROJECT_DEPTH",
    "MAX_PROJECT_DIRS",
    "MAX_PROJECT_FILES",
    "PROJECT_SCAN_SECONDS",
    "ProjectImport",
    "ProjectImports",
    "Reach",
    "Reachability",
    "ScanBounds",
    "judge_reach",
    "project_imports",
]

# The scan of the rootdir is bounded, whatever the rootdir is (``/``, ``$HOME``, a 2,000-deep tree): it reads
# breadth first (the shallowest files first: the project's own, not the bottom of one deep subtree), enters no
# directory past the depth bound, and stops at the file, directory or time bound; ``ProjectImports.limits``
# says which it met, and a finding that depends on the scan says so. It follows no symbolic link to a
# directory (as ``os.walk`` did) and enters no other file system than the rootdir's (``/proc``, ``/sys``, a
# network mount under ``$HOME``), as ``find -xdev``.
MAX_PROJECT_FILES = 5000  # Python files of the rootdir read
MAX_PROJECT_DIRS = 20_000  # directories listed (the rootdir included)
MAX_PROJECT_DEPTH = 64  # directory levels below the rootdir
PROJECT_SCAN_SECONDS = 5.0  # the whole scan, reading and parsing included
_SKIPPED_DIRS = frozenset(
    {".venv", "venv", "env", "site-packages", "dist-packages", ".git", "build", "node_modules", "__pycache__"}
)
_LIMITS = {  # each bound the scan can meet, as a message names it (formatted with ``b``: the ScanBounds)
    "files": "its file cap ({b.files} Python files)",
    "directories": "its directory cap ({b.dirs} directories)",
    "depth": "its depth cap ({b.depth} directory levels below the rootdir)",
    "time": "its time budget ({b.seconds:g} s)",
}


@dataclass(frozen=True)
class ScanBounds:
    """How much of the rootdir :func:`project_imports` reads: ``files`` Python files, ``dirs`` directories
    listed, ``depth`` levels below the rootdir, ``seconds`` on ``clock`` (injectable: a test needs no wall
    clock)."""

    files: int = MAX_PROJECT_FILES
    dirs: int = MAX_PROJECT_DIRS
    depth: int = MAX_PROJECT_DEPTH
    seconds: float = PROJECT_SCAN_SECONDS
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)


@dataclass(frozen=True)
class ProjectImport:
    """One module the project under test imports: its dotted ``name`` and ``where`` (the first statement
    importing it, ``src/train.py:3``, or the option that names it: ``--cudastack-imports (from ini)``)."""

    name: str
    where: str


@dataclass(frozen=True)
class ProjectImports:
    """What :func:`project_imports` found: the imports in first-seen order, how many files were read, and
    whether the scan ran (``cudastack_imports_scan``) and was cut short (``truncated``: ``limits`` names the
    bounds of ``bounds`` it met). ``dirs``: directories listed; ``unreadable``: directories that could not be
    listed; ``other_fs``: directories not entered because they are on another file system (mount points)."""

    imports: tuple[ProjectImport, ...] = ()
    files: int = 0
    scanned: bool = False
    truncated: bool = False
    dirs: int = 0
    limits: tuple[str, ...] = ()
    bounds: ScanBounds = ScanBounds()
    unreadable: int = 0
    other_fs: int = 0

    def named(self, name: str) -> ProjectImport | None:
        return next((pi for pi in self.imports if pi.name == name), None)

    def read(self) -> str:
        """What was read, for a message: "12 Python file(s) of the rootdir", and the directories not read."""
        text = f"{self.files} Python file(s) of the rootdir"
        skipped = [
            *([f"{self.other_fs} on another file system: mount points are not crossed"] if self.other_fs else []),
            *([f"{self.unreadable} unreadable"] if self.unreadable else []),
        ]
        return f"{text} (directories not read: {'; '.join(skipped)})" if skipped else text

    def stopped(self) -> str:
        """Why the scan stopped short ("" when it did not): the bounds it met, what it had read, how to narrow it."""
        if not self.truncated:
            return ""
        met = " and ".join(_LIMITS[k].format(b=self.bounds) for k in self.limits if k in _LIMITS) or "a bound"
        files = f"{self.files} Python file{'' if self.files == 1 else 's'}"
        dirs = f"{self.dirs} director{'y' if self.dirs == 1 else 'ies'}"
        return (
            f"the rootdir's scan stopped at {met}, having read {files} in {dirs}: to narrow it, run from the "
            "project's own directory (or pass --rootdir), or list the project's imports in cudastack_imports "
            "(--cudastack-imports) and set cudastack_imports_scan = false"
        )


def _skipped(parent: str, directory: str) -> bool:
    if directory in _SKIPPED_DIRS or directory.startswith(".") or directory.endswith(".egg-info"):
        return True
    return os.path.isfile(os.path.join(parent, directory, "pyvenv.cfg"))  # a virtual environment by any name


@dataclass
class _Walk:
    """One scan of the rootdir: its bounds, its deadline on ``bounds.clock``, what it has read, the bounds it met."""

    bounds: ScanBounds
    deadline: float
    files: int = 0
    dirs: int = 0
    unreadable: int = 0
    other_fs: int = 0
    limits: list[str] = field(default_factory=list)
    dev: int = -1  # the rootdir's file system
    seen: set[tuple[int, int]] = field(default_factory=set)  # (device, inode) of each directory queued

    def met(self, limit: str) -> None:
        if limit not in self.limits:
            self.limits.append(limit)

    def out_of_time(self) -> bool:
        if self.bounds.clock() < self.deadline:
            return False
        self.met("time")
        return True


def _listing(here: str) -> tuple[list[os.DirEntry[str]], list[str], bool] | None:
    """The entries of ``here``, by name: its subdirectories (a symbolic link to a directory is not one: it is
    not followed), its ``.py`` regular files (or links to one: a FIFO, a socket or a device is never opened),
    and whether it is a site directory (it holds a ``*.dist-info``). None when it cannot be listed."""
    try:
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
    except (OSError, ValueError):
        return None
    dirs: list[os.DirEntry[str]] = []
    files: list[str] = []
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                dirs.append(e)
            elif e.name.endswith(".py") and e.is_file():
                files.append(e.name)
        except OSError:  # pragma: no cover - a d_type-less file system whose lstat fails between list and stat
            continue
    return dirs, files, any(e.name.endswith(".dist-info") for e in entries)


def _enqueue(
    here: str, subdirs: Sequence[os.DirEntry[str]], depth: int, queue: deque[tuple[str, int]], walk: _Walk
) -> None:
    """Queue the subdirectories of ``here`` (at ``depth``) to read: not a skipped one, not one on another file
    system than the rootdir's, not one queued already (a bind mount of its own parent), none past the depth or
    the directory bound."""
    for e in subdirs:
        if _skipped(here, e.name):
            continue
        if depth > walk.bounds.depth:
            walk.met("depth")
            return
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            walk.unreadable += 1
            continue
        key = (st.st_dev, st.st_ino)
        if st.st_dev != walk.dev:
            walk.other_fs += 1
        elif key not in walk.seen:
            if walk.dirs + len(queue) >= walk.bounds.dirs:
                walk.met("directories")
                return
            walk.seen.add(key)
            queue.append((e.path, depth))


def _project_files(rootdir: str, walk: _Walk) -> Iterator[str]:
    """The ``.py`` files under ``rootdir``, breadth first (each directory's files and subdirectories in sorted
    order), skipping virtual environments (by name, or holding a ``pyvenv.cfg``), installed packages (a
    directory holding a ``*.dist-info`` is a site directory), build output, VCS and hidden directories; within
    ``walk``'s bounds (each checked before the next file or directory, so reading a file counts too); an
    explicit queue, no recursion: any depth is safe."""
    try:
        top = os.stat(rootdir)
    except (OSError, ValueError):
        walk.unreadable += 1
        return
    walk.dev = top.st_dev
    walk.seen.add((top.st_dev, top.st_ino))
    queue: deque[tuple[str, int]] = deque([(rootdir, 0)])
    while queue:
        here, depth = queue.popleft()
        if walk.out_of_time():
            return
        walk.dirs += 1
        listed = _listing(here)
        if listed is None:
            walk.unreadable += 1
            continue
        subdirs, files, site = listed
        if site:  # installed packages, not the project
            continue
        for name in files:
            if walk.files >= walk.bounds.files:
                walk.met("files")
                return
            if walk.out_of_time():
                return
            walk.files += 1
            yield os.path.join(here, name)
        _enqueue(here, subdirs, depth + 1, queue, walk)


def _file_module(path: str) -> tuple[str, bool]:
    """The dotted name a project file is imported as (its package chain: the directories above it that hold an
    ``__init__.py``), and whether it is a package's ``__init__.py``."""
    d, base = os.path.split(path)
    stem = base[:-3]
    is_package = stem == "__init__"
    parts = [] if is_package else [stem]
    while os.path.isfile(os.path.join(d, "__init__.py")):
        d, pkg = os.path.split(d)
        parts.insert(0, pkg)
        if not pkg:
            break
    return ".".join(p for p in parts if p), is_package


def _file_imports(path: str) -> list[tuple[str, int]]:
    """Every module an ``import`` statement of the file names (in functions and classes too), in line order:
    ``from P import a`` names ``P`` and ``P.a`` (a submodule or not: the model finds out)."""
    tree = read_module_source(path)
    if tree is None:
        return []
    module, is_package = _file_module(path)
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(module, is_package, node)
            if base is not None:
                out.append((base, node.lineno))
                out.extend((f"{base}.{a.name}", node.lineno) for a in node.names if a.name != "*")
    return sorted(out, key=lambda x: x[1])


def project_imports(
    rootdir: str,
    extra: Sequence[str] = (),
    extra_where: str = "cudastack_imports",
    *,
    scan: bool = True,
    limit: int = MAX_PROJECT_FILES,
    bounds: ScanBounds | None = None,
) -> ProjectImports:
    """The modules the project under test imports: with ``scan``, every import statement of the rootdir's own
    Python files (``_project_files``, within ``bounds``; ``limit`` alone: at most that many files), each named
    with its first file:line relative to ``rootdir``; then the ``extra`` names (``cudastack_imports``), named
    ``extra_where``."""
    b = bounds if bounds is not None else ScanBounds(files=limit)
    walk = _Walk(b, b.clock() + b.seconds)
    found: dict[str, ProjectImport] = {}
    if scan:
        for path in _project_files(rootdir, walk):
            rel = os.path.relpath(path, rootdir)
            for name, line in _file_imports(path):
                found.setdefault(name, ProjectImport(name, f"{rel}:{line}"))
    for name in extra:
        found.setdefault(name, ProjectImport(name, extra_where))
    limits = tuple(walk.limits)
    return ProjectImports(
        tuple(found.values()), walk.files, scan, bool(limits), walk.dirs, limits, b, walk.unreadable, walk.other_fs
    )


def top_level_names(dist: Distribution) -> tuple[str, ...]:
    """The top-level import names the distribution's RECORD installs (its packages and top-level modules)."""
    names: list[str] = []
    for path in dist.plain_rows:
        head, sep, _ = path.partition("/")
        name = head if sep else head.split(".")[0]
        if sep and (head.endswith((".dist-info", ".data"))):
            continue
        if not sep and not head.endswith((".py", ".so")):
            continue
        if name.isidentifier() and not name.startswith("__") and name not in names:
            names.append(name)
    return tuple(sorted(names))


@dataclass(frozen=True)
class Reach:
    """How an extension module is reached: ``importer`` is the import that loads it (or, when ``reached`` is
    False, the import that would fail), ``where`` why that import happens (``src/train.py:3``, "pkgx 1.0's
    top-level import", ``--cudastack-imports (from ini)``); None when not reached."""

    reached: bool
    importer: str
    where: str | None = None

    def describe(self) -> str:
        return f"reached by `import {self.importer}` ({self.where})"


class Reachability:
    """Which extension modules an import that will happen loads (module docstring); each answer computed on
    first question: one model process per distribution with a failing module (its top-level imports), one
    for the project's imports, one per unreached module (the import that would fail)."""

    def __init__(
        self,
        inv: Inventory,
        resolver: Resolver,
        read: Callable[[str], ElfInfo],
        project: Callable[[], ProjectImports],
        cache: ElfCache | None = None,
    ) -> None:
        self._inv = inv
        self._resolver = resolver
        self._read = read
        self._project_source = project
        self._cache = cache
        self._dirs: dict[str, str] = {}
        self._interp: Interpreter | None = None
        self._finder: ModuleFinder | None = None  # where the interpreter finds each module: shared by every _reach
        self._project: ProjectImports | None = None
        self._project_map: dict[str, int] | None = None
        self._tops: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {}
        self._answers: dict[str, Reach | None] = {}

    @property
    def interp(self) -> Interpreter:
        if self._interp is None:
            self._interp = Interpreter.for_sites(self._inv.site_dirs, root=self._inv.root)
        return self._interp

    @property
    def project(self) -> ProjectImports:
        if self._project is None:
            self._project = self._project_source()
        return self._project

    def _reach(self, names: Sequence[str]) -> dict[str, int]:
        if self._finder is None:
            self._finder = ModuleFinder(self.interp)
        return import_reach(names, self.interp, self._resolver, self._read, self._inv.owner, self._cache, self._finder)

    def _top(self, dist: Distribution, own: str) -> tuple[tuple[str, ...], dict[str, int]]:
        if dist.dist_info not in self._tops:
            names = tuple(dict.fromkeys((own, *top_level_names(dist))))
            self._tops[dist.dist_info] = (names, self._reach(names))
        return self._tops[dist.dist_info]

    def _installed(self, top: str) -> bool:
        """Whether a top-level name is installed in a site directory (not the standard library's, not the
        project's own): only those imports can load an installed extension module."""
        for site in self._inv.site_dirs:
            base = os.path.join(site, top)
            if os.path.isdir(base) or any(os.path.isfile(base + s) for s in (".py", *self.interp.suffixes)):
                return True
        return False

    def _project_reach(self) -> dict[str, int]:
        if self._project_map is None:
            names = [pi.name for pi in self.project.imports]
            installed = {top for top in {n.split(".")[0] for n in names} if self._installed(top)}
            kept = [n for n in names if n.split(".")[0] in installed]
            mapped = self._reach(kept)
            index = {n: i for i, n in enumerate(names)}
            self._project_map = {k: index[kept[i]] for k, i in mapped.items()}
        return self._project_map

    def of_module(self, dist: Distribution, path: str) -> Reach | None:
        """How the extension module at ``path`` (of ``dist``) is reached; None when the model cannot name it
        (not under a site directory of the inspected interpreter): it is judged as before."""
        if path not in self._answers:
            self._answers[path] = self._judge(dist, path)
        return self._answers[path]

    def _judge(self, dist: Distribution, path: str) -> Reach | None:
        name = module_name(path, self._inv.site_dirs, self.interp.suffixes)
        if name is None:
            return None
        key = real_path(path, self._dirs)
        tops, mapped = self._top(dist, name.split(".")[0])
        if key in mapped:
            return Reach(True, tops[mapped[key]], f"the top-level import of {dist.label}")
        by_project = self._project_reach()
        if key in by_project:
            pi = self.project.imports[by_project[key]]
            return Reach(True, pi.name, pi.where)
        direct = self.project.named(name)  # named itself, where the model does not find it
        if direct is not None:
            return Reach(True, direct.name, direct.where)
        parts = name.split(".")
        chain = [".".join(parts[: i + 1]) for i in range(1, len(parts))]
        again = self._reach([*tops, *chain])
        at = again.get(key, -1) - len(tops)
        return Reach(False, chain[at] if 0 <= at < len(chain) else name)

    def not_reached(self, dist: Distribution, reach: Reach) -> str:
        """Why nothing reaches a module: its distribution's top-level imports do not load it, and the project
        does not import it (how the project was read)."""
        tops, _ = self._top(dist, reach.importer.split(".")[0])
        own = " or ".join(f"`import {t}`" for t in tops[:3])
        p = self.project
        if p.scanned:
            project = f"no import in the {p.read()} or cudastack_imports loads it"
            if p.truncated:
                project += f"; {p.stopped()}"
        else:
            project = (
                "the rootdir's files are not read (cudastack_imports_scan is false) and no cudastack_imports "
                "name loads it"
            )
        return f"no import that will happen loads it: {own} ({dist.label}'s top-level import) does not, and {project}"


def judge_reach(
    findings: Sequence[Finding],
    reach: Reachability,
    trees: Sequence[ModuleTree],
    objects: Callable[[Finding], Sequence[str]] = lambda f: f.facts.objects,
    lead: Callable[[str], str] = lambda name: f"`import {name}` will fail",
) -> tuple[Finding, ...]:
    """``findings`` with each ERROR about extension modules (``objects``: the files it is about, each an
    extension module or an object in one's closure) judged by reachability: kept, naming how it is reached,
    when an import that will happen loads one of the modules; else a WARNING naming the import that would
    fail (``lead``: how its message begins, for a run-time load "after `import cupy.fft`"). A finding whose
    files no module tree holds, or whose module the model cannot name, is kept as is."""
    if not any(f.severity is Severity.ERROR for f in findings):
        return tuple(findings)
    dirs: dict[str, str] = {}
    loaders: dict[str, list[ModuleTree]] = {}
    for mt in trees:
        loaders.setdefault(real_path(mt.module.path, dirs), []).append(mt)
        for lib in mt.tree.libraries:
            if lib.path is not None:
                loaders.setdefault(lib.realpath or real_path(lib.path, dirs), []).append(mt)
    return tuple(_judged(f, reach, loaders, objects(f), dirs, lead) for f in findings)


def _judged(
    f: Finding,
    reach: Reachability,
    loaders: dict[str, list[ModuleTree]],
    objs: Sequence[str],
    dirs: dict[str, str],
    lead: Callable[[str], str],
) -> Finding:
    if f.severity is not Severity.ERROR or not objs:
        return f
    modules: dict[str, ModuleTree] = {}
    for obj in objs:
        found = loaders.get(real_path(obj, dirs))
        if not found:
            return f
        for mt in found:
            modules.setdefault(mt.module.path, mt)
    answers: list[tuple[ModuleTree, Reach]] = []
    for path in sorted(modules):
        mt = modules[path]
        r = reach.of_module(mt.dist, path)
        if r is None:
            return f
        if r.reached:
            return replace(f, details=(*f.details, r.describe()))
        answers.append((mt, r))
    mt, first = answers[0]
    others = sorted({r.importer for _, r in answers[1:]} - {first.importer})
    notes = tuple(f"{lead(name)} too" for name in others)
    why = reach.not_reached(mt.dist, first)
    hint = f"import {first.importer} in the project (or list it in cudastack_imports) to make this an error"
    return replace(
        f,
        severity=Severity.WARNING,
        message=f"{lead(first.importer)}: {f.message}",
        cause=f"{f.cause}; {why}" if f.cause else why,
        details=(*f.details, *notes, f"not reached: {hint}"),
    )
