"""Bad input to the scan of the project's own imports (issue #33, Deliver 5; ``model/reach.py``): a 2,000-deep
directory or a symbolic link loop under the rootdir gives no ``RecursionError``, a FIFO named ``x.py`` is never
opened, an unreadable directory is said, and a run from ``/`` or ``$HOME`` is bounded in files, directories,
depth and time, and says which bound it met, what it read and how to narrow it.

The deep chain is built and removed through directory descriptors, one level at a time: its paths come near
PATH_MAX, and ``shutil.rmtree`` (which pytest's tmp_path cleanup uses) recurses once a level."""

from __future__ import annotations

import importlib.machinery
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Severity
from pytest_cudastack.model import reach
from pytest_cudastack.model.reach import MAX_PROJECT_DEPTH, ProjectImports, ScanBounds, project_imports
from pytest_cudastack.settings import ENV, Settings
from pytest_cudastack.stack import Stack
from tests.helpers.deeptree import build_chain, clean_run, remove_chain
from tests.helpers.elfbuild import synth_elf
from tests.helpers.sitebuild import site_packages, write_dist

pytest_plugins = ["pytester"]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
DEEP = 2000
EVERY = 10  # a Python file every EVERY levels of the chain: ``import modN`` at level N


def _chain(top: Path, depth: int = DEEP, every: int = EVERY) -> None:
    """``top/d/d/.../d``, ``depth`` levels; at each level that is a multiple of ``every``, ``m.py`` holding
    ``import mod<level>``."""
    build_chain(top, depth, lambda level: {"m.py": f"import mod{level}\n".encode()} if level % every == 0 else {})


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory holding a 2,000-deep chain (and a ``top.py`` beside it): built once (removing 2,000
    directories takes seconds on some disks), read only."""
    top = tmp_path_factory.mktemp("deep")
    (top / "top.py").write_text("import json\n")
    (top / "pytest.ini").write_text("[pytest]\n")  # the rootdir of a command run there
    _chain(top)
    yield top
    remove_chain(top)


def _site(tmp_path: Path) -> Path:
    """pkgx in a venv under ``tmp_path`` (the scan skips it): ``pkgx.fft._fft`` needs ``libfftx.so.1``, which
    nothing ships, and ``import pkgx`` does not import it, so its finding depends on the project's imports.
    Synthetic ELF files: no compiler needed."""
    site = site_packages(tmp_path / "venv")
    build = tmp_path / "elf"
    build.mkdir()
    write_dist(
        site,
        "pkgx",
        "1.0",
        {
            "pkgx/__init__.py": "from pkgx import _core\n",
            f"pkgx/_core{SUFFIX}": synth_elf(build / "core.so", soname=None, pyinit="_core").read_bytes(),
            "pkgx/fft/__init__.py": "from pkgx.fft import _fft\n",
            f"pkgx/fft/_fft{SUFFIX}": synth_elf(
                build / "fft.so", soname=None, pyinit="_fft", needed=["libfftx.so.1"]
            ).read_bytes(),
        },
    )
    return site


@pytest.fixture(autouse=True)
def _own_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def _names(found: ProjectImports) -> set[str]:
    return {pi.name for pi in found.imports}


# ------------------------------------------------------------------------------------------- depth


def test_a_2000_deep_tree_is_read_to_the_depth_bound_without_recursion(deep: Path):
    found = project_imports(str(deep))
    levels = range(EVERY, MAX_PROJECT_DEPTH + 1, EVERY)
    assert _names(found) == {"json", *(f"mod{n}" for n in levels)}
    assert found.named(f"mod{EVERY}") is not None
    assert found.named(f"mod{EVERY}").where == "d/" * EVERY + "m.py:1"  # type: ignore[union-attr]
    assert (found.dirs, found.files, found.limits, found.truncated) == (MAX_PROJECT_DEPTH + 1, 7, ("depth",), True)
    assert "its depth cap (64 directory levels below the rootdir)" in found.stopped()


def test_a_deeper_bound_walks_1500_levels_without_recursion(deep: Path):
    """Far past the interpreter's recursion limit (1000): the walk keeps its own queue."""
    found = project_imports(str(deep), bounds=ScanBounds(depth=1500))
    assert found.named("mod1500") is not None
    assert found.named("mod1510") is None
    assert (found.dirs, found.limits) == (1501, ("depth",))


# ------------------------------------------------------------------------------------------- links


def test_symlink_loops_end_and_each_real_directory_is_read_once(tmp_path: Path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.py").write_text("import numpy\n")
    (tmp_path / "a" / "b" / "up").symlink_to("..")  # a link to its parent
    (tmp_path / "self").symlink_to(".")  # to the rootdir itself
    (tmp_path / "l1").symlink_to("l2")  # links pointing at each other
    (tmp_path / "l2").symlink_to("l1")
    (tmp_path / "p1.py").symlink_to("p2.py")  # the same, named like Python files
    (tmp_path / "p2.py").symlink_to("p1.py")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "o.py").write_text("import cupy\n")
    (tmp_path / "out").symlink_to(outside)  # a linked directory is not followed: not the project's tree
    (tmp_path / "alias.py").symlink_to(tmp_path / "a" / "b" / "x.py")  # a linked file is read
    found = project_imports(str(tmp_path))
    assert _names(found) == {"numpy"}
    assert found.named("numpy").where == "alias.py:1"  # type: ignore[union-attr]
    assert found.files == 2  # x.py, alias.py: the looping links p1.py, p2.py are no files read
    assert (found.dirs, found.truncated, found.unreadable) == (3, False, 0)  # the rootdir, a, a/b: each once


# ------------------------------------------------------------------------------------------- odd files


def test_a_fifo_named_like_python_is_never_opened(tmp_path: Path):
    os.mkfifo(tmp_path / "x.py")
    (tmp_path / "y.py").write_text("import jax\n")
    done: list[ProjectImports] = []
    t = threading.Thread(target=lambda: done.append(project_imports(str(tmp_path))), daemon=True)
    t.start()
    t.join(30)
    assert done, "the scan waited on the FIFO"
    assert _names(done[0]) == {"jax"}
    assert done[0].files == 1  # the FIFO is not a file read


def test_an_unreadable_directory_is_skipped_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "l.py").write_text("import cupy\n")
    (tmp_path / "open").mkdir()
    (tmp_path / "open" / "o.py").write_text("import jax\n")
    locked = str(tmp_path / "locked")
    real_scandir = os.scandir

    def scandir(path: str) -> object:
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(reach.os, "scandir", scandir)
    found = project_imports(str(tmp_path))
    assert _names(found) == {"jax"}
    assert (found.unreadable, found.truncated) == (1, False)
    assert found.read() == "1 Python file(s) of the rootdir (directories not read: 1 unreadable)"


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists a directory of mode 000")
def test_a_mode_000_directory_is_skipped_and_said(tmp_path: Path):
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "l.py").write_text("import cupy\n")
    (tmp_path / "o.py").write_text("import jax\n")
    (tmp_path / "locked").chmod(0)
    try:
        found = project_imports(str(tmp_path))
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert (_names(found), found.unreadable) == ({"jax"}, 1)


# ------------------------------------------------------------------------------------------- bounds


def _tree(root: Path) -> None:
    """Five directories of two files each, one level below ``root``."""
    for i in range(5):
        (root / f"p{i}").mkdir()
        for j in range(2):
            (root / f"p{i}" / f"m{j}.py").write_text(f"import mod{i}{j}\n")


def _ticks(seconds: float) -> ScanBounds:
    """A time budget on a clock that advances one second each time it is read: no wall clock."""
    return ScanBounds(seconds=seconds, clock=itertools.count().__next__)


@pytest.mark.parametrize(
    ("bounds", "limits", "files", "dirs", "says"),
    [
        pytest.param(lambda: ScanBounds(files=3), ("files",), 3, 3, "its file cap (3 Python files)", id="files"),
        pytest.param(
            lambda: ScanBounds(dirs=3), ("directories",), 4, 3, "its directory cap (3 directories)", id="dirs"
        ),
        pytest.param(lambda: ScanBounds(depth=0), ("depth",), 0, 1, "its depth cap (0 directory levels", id="depth"),
        # the deadline is read at 0 (4), then once a directory or a file: root 1, p0 2, p0/m0.py 3, p0/m1.py 4
        pytest.param(lambda: _ticks(4), ("time",), 1, 2, "its time budget (4 s)", id="time"),
    ],
)
def test_each_bound_stops_the_scan_and_says_so(
    tmp_path: Path, bounds: Callable[[], ScanBounds], limits: tuple[str, ...], files: int, dirs: int, says: str
):
    _tree(tmp_path)
    found = project_imports(str(tmp_path), bounds=bounds())
    assert (found.limits, found.truncated, found.files, found.dirs) == (limits, True, files, dirs)
    text = found.stopped()
    assert says in text
    assert f"having read {files} Python file" in text
    for narrow in ("--rootdir", "cudastack_imports (--cudastack-imports)", "cudastack_imports_scan = false"):
        assert narrow in text
    assert project_imports(str(tmp_path)).stopped() == ""  # the defaults read it all


def test_a_finding_that_depends_on_a_bounded_scan_says_so(tmp_path: Path):
    """The WARNING's cause names the bound, what was read and how to narrow it (a 70-deep tree meets the
    default depth bound)."""
    site = _site(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    _chain(project, depth=MAX_PROJECT_DEPTH + 6, every=MAX_PROJECT_DEPTH + 6)
    driver = DriverInfo("declared", "580.65.06", "13.0", archs=("sm_90",), arch_source="declared")
    stack = Stack(
        Settings(cudastack=True), driver_info=driver, rootdir=str(project), site_paths=(str(site),), cache=None
    )
    found = [f for f in stack.findings("closure") if "libfftx" in f.render() and f.severity is not Severity.INFO]
    assert [f.severity for f in found] == [Severity.WARNING]
    assert "no import in the 0 Python file(s) of the rootdir or cudastack_imports loads it; the rootdir's scan " in (
        found[0].cause
    )
    assert "stopped at its depth cap (64 directory levels below the rootdir), having read 0 Python files in 65 " in (
        found[0].cause
    )


# ------------------------------------------------------------------------------------------- end to end


def test_cudastack_check_from_a_deep_tree_ends_without_a_traceback(deep: Path, tmp_path: Path):
    site = _site(tmp_path)
    done = clean_run([sys.executable, "-m", "pytest_cudastack.cli", "check", "--site", str(site)], cwd=deep)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "`import pkgx.fft` will fail: libfftx.so.1 is not found" in done.stdout
    assert "no import in the 7 Python file(s) of the rootdir or cudastack_imports loads it; the rootdir's scan " in (
        done.stdout
    )
    assert "stopped at its depth cap (64 directory levels below the rootdir), having read 7 Python files in 65 " in (
        done.stdout
    )


def test_pytest_cudastack_with_a_deep_tree_as_rootdir_runs_its_items(
    deep: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    """The plugin's closure item, the deep tree its rootdir (pytest is given the one test file: its own
    collection of the whole tree recurses once a level too)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.syspathinsert(_site(pytester.path / "x"))
    test = pytester.makepyfile(test_x="def test_x(): pass\n")
    result = pytester.runpytest(
        "-p", "pytest_cudastack.plugin", "-p", "no:cacheprovider", "--cudastack", "-rA", "--rootdir", str(deep), test
    )
    out = result.stdout.str()
    assert "RecursionError" not in out
    assert "FAILED cudastack::closure" not in out
    result.stdout.fnmatch_lines(
        ["*`import pkgx.fft` will fail: libfftx.so.1 is not found*", "*the rootdir's scan stopped at its depth cap*"]
    )
