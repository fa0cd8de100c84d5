"""Only importable modules (model/abi.py, model/modules.py): an extension module whose name carries none of
the inspected interpreter's extension suffixes (another CPython ABI or platform) is not a module of this
environment: no closure, symbol or dlopen verdict, one INFO of the closure item. The clean twin of each
case is the same module named for the inspected interpreter, whose missing library is an ERROR."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.abi import PythonAbi, extension_suffixes, importable_suffix, site_abi
from pytest_cudastack.model.modules import callers, extension_modules, foreign_modules, module_trees
from pytest_cudastack.model.process import Interpreter
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

X86 = "x86_64-linux-gnu"
BASE_311 = (f".cpython-311-{X86}.so", ".abi3.so", ".so")  # CPython 3.11's EXTENSION_SUFFIXES on x86-64 Linux


@pytest.mark.parametrize(
    ("abi", "base", "expected"),
    [
        pytest.param(None, BASE_311, BASE_311, id="site names no Python: this interpreter's"),
        pytest.param(PythonAbi((3, 11)), BASE_311, BASE_311, id="3.11 from 3.11"),
        pytest.param(PythonAbi((3, 12)), BASE_311, (f".cpython-312-{X86}.so", ".abi3.so", ".so"), id="3.12 from 3.11"),
        pytest.param(PythonAbi((3, 10)), BASE_311, (f".cpython-310-{X86}.so", ".abi3.so", ".so"), id="3.10 from 3.11"),
        pytest.param(
            PythonAbi((3, 13), threaded=True), BASE_311, (f".cpython-313t-{X86}.so", ".so"), id="3.13t: no abi3"
        ),
        pytest.param(
            PythonAbi((3, 12)),
            (f".cpython-313t-{X86}.so", ".so"),
            (f".cpython-312-{X86}.so", ".abi3.so", ".so"),
            id="3.12 from a free-threaded 3.13t: abi3 back, before .so",
        ),
        pytest.param(
            PythonAbi((3, 12)),
            (f".cpython-311d-{X86}.so", f".cpython-311-{X86}.so", ".abi3.so", ".so"),
            (f".cpython-312d-{X86}.so", f".cpython-312-{X86}.so", ".abi3.so", ".so"),
            id="debug build: SOABI and ALT_SOABI",
        ),
    ],
)
def test_suffixes_built_as_cpython_builds_them(
    abi: PythonAbi | None, base: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    assert extension_suffixes(abi, base) == expected


@pytest.mark.parametrize(
    ("name", "importable"),
    [
        pytest.param(f"_C.cpython-311-{X86}.so", True, id="own SOABI"),
        pytest.param("_C.abi3.so", True, id="abi3"),
        pytest.param("_C.so", True, id="plain .so"),
        pytest.param(f"_mscclpp.cpython-310-{X86}.so", False, id="cpython-310 in 3.11"),
        pytest.param(f"_m.cpython-312-{X86}.so", False, id="cpython-312 in 3.11"),
        pytest.param(f"_m.cpython-313t-{X86}.so", False, id="free-threaded ABI"),
        pytest.param("_m.cpython-311-aarch64-linux-gnu.so", False, id="another platform"),
        pytest.param("libfoo.so.1", False, id="versioned library name"),
    ],
)
def test_importable_suffix(name: str, importable: bool) -> None:
    assert (importable_suffix(f"/site/pkg/{name}", BASE_311) is not None) is importable


def test_site_abi_from_the_layout(tmp_path: Path) -> None:
    assert site_abi([str(site_packages(tmp_path / "a", "python3.12"))]) == PythonAbi((3, 12))
    assert site_abi([str(site_packages(tmp_path / "b", "python3.13t"))]) == PythonAbi((3, 13), threaded=True)
    assert site_abi([str(tmp_path / "target")]) is None  # a --target directory names no Python


def test_interpreter_for_a_312_site_uses_its_suffixes(tmp_path: Path) -> None:
    site = site_packages(tmp_path / "venv", "python3.12")
    suffixes = Interpreter.for_sites([str(site)]).suffixes
    assert suffixes[0].startswith(".cpython-312")
    assert not any(s.startswith(".cpython-311") for s in suffixes)


needs_cc = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


def _site(tmp_path: Path, python: str, modules: list[str]) -> Path:
    """A kernel-like package whose modules (one per name) each need libcudart.so.12, which is not here; its
    ``__init__.py`` imports them (so ``import kern`` reaches each: a load failure is an ERROR)."""
    site = site_packages(tmp_path / "venv", python)
    init = "".join(f"from kern import {name.split('.')[0]}\n" for name in modules)
    files: dict[str, bytes | str] = {"kern/__init__.py": init}
    for name in modules:
        files[f"kern/{name}"] = compile_so(None, pyinit=name.split(".")[0], needed=["libcudart.so.12"])
    write_dist(site, "kern", "0.3.0", files)
    return site


def _closure(tmp_path: Path, site: Path):
    driver = DriverInfo("declared", "580.65.06", "13.0", archs=("sm_90",), arch_source="declared")
    stack = Stack(Settings(cudastack=True), driver_info=driver, rootdir=str(tmp_path), site_paths=(str(site),))
    return stack, stack.findings("closure")


CASES = [
    pytest.param("python3.11", f"_mscclpp.cpython-310-{X86}.so", f"_mscclpp.cpython-311-{X86}.so", id="310 in 3.11"),
    pytest.param("python3.11", f"_m.cpython-312-{X86}.so", f"_m.cpython-311-{X86}.so", id="312 in 3.11"),
    pytest.param("python3.12", f"_m.cpython-311-{X86}.so", f"_m.cpython-312-{X86}.so", id="311 in a 3.12 site"),
    pytest.param("python3.11", "_m.cpython-311-aarch64-linux-gnu.so", "_m.abi3.so", id="aarch64 / abi3"),
    pytest.param("python3.11", "_m.cpython-311-aarch64-linux-gnu.so", "_m.so", id="aarch64 / plain .so"),
    pytest.param("python3.13", f"_m.cpython-313t-{X86}.so", f"_m.cpython-313-{X86}.so", id="313t in 3.13"),
    pytest.param("python3.13t", "_m.abi3.so", f"_m.cpython-313t-{X86}.so", id="abi3 in 3.13t"),
]


@needs_cc
@pytest.mark.parametrize(("python", "foreign", "own"), CASES)
def test_foreign_module_is_one_info_and_its_twin_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python: str, foreign: str, own: str
) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    stack, found = _closure(tmp_path / "foreign", _site(tmp_path / "foreign", python, [foreign]))
    assert not any(f.severity in (Severity.ERROR, Severity.WARNING) for f in found), found
    (info,) = [f for f in found if "never imports" in f.message]
    assert info.severity is Severity.INFO
    assert f"kern/{foreign}" in info.message
    assert info.subject == "kern 0.3.0"
    assert info.details == (f"module: kern/{foreign}",)
    assert stack.module_trees == ()
    # the clean twin: the same module named for the inspected interpreter misses libcudart.so.12
    stack, found = _closure(tmp_path / "own", _site(tmp_path / "own", python, [own]))
    errors = [f for f in found if f.failing]
    assert [f.subject for f in errors] == ["libcudart.so.12"]
    assert not any("never imports" in f.message for f in found)
    assert [mt.module.path.rsplit("/", 1)[1] for mt in stack.module_trees] == [own]


@needs_cc
def test_info_names_the_interpreter_and_its_suffixes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = _site(tmp_path, "python3.11", [f"_mscclpp.cpython-310-{X86}.so", f"_ops.cpython-311-{X86}.so"])
    _, found = _closure(tmp_path, site)
    (info,) = [f for f in found if "never imports" in f.message]
    assert info.message.startswith("1 extension module(s) that CPython 3.11 never imports: kern/_mscclpp.cpython-310")
    assert f".cpython-311-{X86}.so, .abi3.so, .so" in info.cause
    assert "install the build of kern 0.3.0 for CPython 3.11" in info.fix
    # the importable sibling is judged as before
    assert [f.subject for f in found if f.failing] == ["libcudart.so.12"]


@needs_cc
def test_foreign_modules_are_no_tree_and_no_caller(tmp_path: Path) -> None:
    site = _site(tmp_path, "python3.11", [f"_mscclpp.cpython-310-{X86}.so", f"_ops.cpython-311-{X86}.so"])
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner)
    foreign = f"{site}/kern/_mscclpp.cpython-310-{X86}.so"
    assert [fm.module.path for fm in foreign_modules(inv)] == [foreign]
    assert [lib.path for _, lib in extension_modules(inv)] == [f"{site}/kern/_ops.cpython-311-{X86}.so"]
    trees = module_trees(inv, resolver)
    assert [mt.module.path for mt in trees] == [f"{site}/kern/_ops.cpython-311-{X86}.so"]
    assert foreign not in {c.path for c in callers(inv, trees)}  # the dlopen check never judges it
