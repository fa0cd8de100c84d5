"""The driver entry-point table (cuda/driversyms.py, scripts/gen_driver_symbols.py) and its use by the
symbols check: references to a libcuda.so.1 that is not here, judged against a declared driver; a gcc-built
fake libcuda.so.1 that lacks an entry point, judged by its own dynamic symbol table."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from pytest_cudastack.checks.symbols import binary_symbol_findings
from pytest_cudastack.cuda.compat import min_driver_for_cuda
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.cuda.driversyms import DATA_FILE, driver_entry_points, validate_entry_points
from pytest_cudastack.errors import DataError
from pytest_cudastack.findings import DriverUpgrade, Manual
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.symbols import read_symbols
from tests.helpers.elfbuild import CC, needs_cc

REPO = Path(__file__).resolve().parent.parent
HEADERS = Path("/usr/local/cuda/include")
DECLARED = DriverInfo(source="declared", version="535.104.05", cuda_version="12.2")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_driver_symbols", REPO / "scripts" / "gen_driver_symbols.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_table_rows_and_sources():
    table = driver_entry_points()
    assert table["cuGreenCtxDestroy"].cuda == (12, 4)
    assert table["cuGreenCtxDestroy"].source == "PFN_cuGreenCtxDestroy_v12040"
    assert (table["cuMemAlloc"].cuda, table["cuMemAlloc_v2"].cuda) == ((2, 0), (3, 2))
    assert table["cuCtxCreate_v4"].cuda == (12, 5)
    assert table["cuMemcpyHtoD_v2_ptds"].cuda == (7, 0)


def test_generator_derives_exported_names_from_typedefs_and_defines():
    gen = _generator()
    typedefs = (
        "typedef int (*PFN_cuFoo_v2000)(void);\ntypedef int (*PFN_cuFoo_v3020)(void);\n"
        "typedef int (*PFN_cuFoo_v7000_ptds)(void);\ntypedef int (*PFN_cuBar_v12040)(void);\n"
    )
    rows = gen.generate(typedefs, "#define cuFoo __CUDA_API_PTDS(cuFoo_v2)\n")
    assert rows == [
        {"symbol": "cuBar", "cuda": "12.4", "source": "PFN_cuBar_v12040"},
        {"symbol": "cuFoo", "cuda": "2.0", "source": "PFN_cuFoo_v2000"},
        {"symbol": "cuFoo_v2", "cuda": "3.2", "source": "PFN_cuFoo_v3020"},
        {"symbol": "cuFoo_v2_ptds", "cuda": "7.0", "source": "PFN_cuFoo_v7000_ptds"},
    ]


@pytest.mark.skipif(not (HEADERS / "cudaTypedefs.h").is_file(), reason="needs the CUDA toolkit headers")
def test_committed_table_is_what_the_script_generates_from_its_header(tmp_path: Path):
    shipped = json.loads((REPO / "pytest_cudastack" / "cuda" / DATA_FILE).read_text())
    out = tmp_path / "t.json"
    subprocess.run(["python3", str(REPO / "scripts/gen_driver_symbols.py"), str(HEADERS), str(out)], check=True)
    fresh = json.loads(out.read_text())
    if fresh["source"]["sha256"] != shipped["source"]["sha256"]:
        pytest.skip("this machine's cudaTypedefs.h is another toolkit's")
    assert fresh == shipped


def test_validation_names_the_row():
    good = {"schema": 1, "source": {"file": "cudaTypedefs.h", "sha256": "x"}, "rows": []}
    with pytest.raises(DataError, match="non-empty"):
        validate_entry_points(good, "t.json")
    bad = {**good, "rows": [{"symbol": "cuX", "cuda": "12", "source": "PFN_cuX_v12000"}]}
    with pytest.raises(DataError, match=r"rows\[0\]: bad CUDA version"):
        validate_entry_points(bad, "t.json")
    twice = {**good, "rows": [{"symbol": "cuX", "cuda": "12.0", "source": "PFN_cuX_v12000"}] * 2}
    with pytest.raises(DataError, match=r"rows\[1\]: duplicate row"):
        validate_entry_points(twice, "t.json")


def _cc(out: Path, source: str, *args: str, shared: bool = True) -> Path:
    assert CC is not None
    src = out.with_name(out.name.replace(".", "_") + ".c")
    src.write_text(source)
    cmd = [CC, *(["-shared", "-fPIC"] if shared else []), "-o", str(out), str(src), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


PROGRAM = (
    "int cuInit(unsigned); int cuGreenCtxDestroy(void *);\n"
    "int main(void) { return cuInit(0) + cuGreenCtxDestroy(0); }\n"
)


@needs_cc
def test_missing_libcuda_judged_by_the_declared_driver(tmp_path: Path):
    build = tmp_path / "build"
    build.mkdir()
    fake = _cc(
        build / "libcuda.so.1",
        "int cuInit(unsigned f) { return 0; }\nint cuGreenCtxDestroy(void *c) { return 0; }\n",
        "-Wl,-soname,libcuda.so.1",
    )
    exe = _cc(tmp_path / "app", PROGRAM, str(fake), "-Wl,-z,now", shared=False)
    os.unlink(fake)  # a build machine: no driver
    tree = Resolver(SearchConfig.from_environment({})).tree(str(exe))
    assert [lib.soname for lib in tree.missing] == ["libcuda.so.1"]
    found = binary_symbol_findings(tree, "app", read_symbols, driver=DECLARED)
    assert len(found) == 1
    assert found[0].failing
    assert found[0].details == (
        "cuGreenCtxDestroy needs a driver for CUDA >= 12.4; declared 535.104.05 supports <= 12.2 "
        "(PFN_cuGreenCtxDestroy_v12040 in cudaTypedefs.h)",
    )
    newer = DriverInfo(source="declared", version="550.54.15", cuda_version="12.4")
    assert binary_symbol_findings(tree, "app", read_symbols, driver=newer) == ()
    assert binary_symbol_findings(tree, "app", read_symbols) == ()  # no driver known: nothing to judge by


@needs_cc
def test_a_present_libcuda_is_judged_by_its_own_symbols(tmp_path: Path):
    full = tmp_path / "full"
    full.mkdir()
    old = tmp_path / "old"
    old.mkdir()
    lib = _cc(
        full / "libcuda.so.1",
        "int cuInit(unsigned f) { return 0; }\nint cuGreenCtxDestroy(void *c) { return 0; }\n",
        "-Wl,-soname,libcuda.so.1",
    )
    _cc(old / "libcuda.so.1", "int cuInit(unsigned f) { return 0; }\n", "-Wl,-soname,libcuda.so.1")
    exe = _cc(
        tmp_path / "app", PROGRAM, str(lib), "-Wl,-z,now", "-Wl,--enable-new-dtags", f"-Wl,-rpath,{old}", shared=False
    )
    tree = Resolver(SearchConfig.from_environment({})).tree(str(exe))
    found = binary_symbol_findings(
        tree, "app", read_symbols, driver=DriverInfo(source="probed", version="999.1", cuda_version="13.9")
    )
    assert len(found) == 1
    assert "undefined symbol: cuGreenCtxDestroy" in found[0].details
    proc = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
    assert "undefined symbol: cuGreenCtxDestroy" in proc.stderr


def _app_needing_libcuda(tmp_path: Path, libcuda_dir: Path | None) -> Path:
    """``app`` calling cuInit and cuGreenCtxDestroy (CUDA 12.4), linked against a full libcuda.so.1 that is then
    removed (a build machine) or replaced through an RPATH by ``libcuda_dir``'s old one."""
    full = tmp_path / "full"
    full.mkdir()
    lib = _cc(
        full / "libcuda.so.1",
        "int cuInit(unsigned f) { return 0; }\nint cuGreenCtxDestroy(void *c) { return 0; }\n",
        "-Wl,-soname,libcuda.so.1",
    )
    rpath = [f"-Wl,-rpath,{libcuda_dir}"] if libcuda_dir is not None else []
    exe = _cc(tmp_path / "app", PROGRAM, str(lib), "-Wl,-z,now", "-Wl,--enable-new-dtags", *rpath, shared=False)
    os.unlink(lib)
    return exe


@needs_cc
@pytest.mark.parametrize(
    ("declared", "cuda"),
    [
        pytest.param(DECLARED, "12.2", id="declared 535 (CUDA 12.2)"),
        pytest.param(DriverInfo(source="declared", version="525.60.13", cuda_version="12.0"), "12.0", id="525"),
    ],
)
def test_an_entry_point_the_declared_driver_lacks_is_repaired_by_the_driver_that_introduced_it(
    tmp_path: Path, declared: DriverInfo, cuda: str
):
    """Not "load the library that defines them": libcuda.so.1 comes with the driver, so the remedy is a driver
    at least the first one for the CUDA that introduced the entry point (12.4: 550.54.14), as data."""
    exe = _app_needing_libcuda(tmp_path, None)
    tree = Resolver(SearchConfig.from_environment({})).tree(str(exe))
    (found,) = binary_symbol_findings(tree, "app", read_symbols, driver=declared)
    upgrade = found.remedies[0]
    assert isinstance(upgrade, DriverUpgrade)
    assert (upgrade.minimum, upgrade.cuda) == (min_driver_for_cuda("12.4"), "12.4") == ("550.54.14", "12.4")
    assert isinstance(found.remedies[1], Manual)
    assert f"for CUDA {cuda}" in found.remedies[1].steps[0]
    assert (found.facts.required, found.facts.bound, found.facts.sonames) == ("CUDA 12.4", cuda, ("libcuda.so.1",))


@needs_cc
def test_a_present_libcuda_lacking_an_entry_point_is_repaired_by_a_newer_driver(tmp_path: Path):
    old = tmp_path / "old"
    old.mkdir()
    _cc(old / "libcuda.so.1", "int cuInit(unsigned f) { return 0; }\n", "-Wl,-soname,libcuda.so.1")
    exe = _app_needing_libcuda(tmp_path, old)
    tree = Resolver(SearchConfig.from_environment({})).tree(str(exe))
    (found,) = binary_symbol_findings(tree, "app", read_symbols)
    assert isinstance(found.remedies[0], DriverUpgrade)
    assert (found.remedies[0].minimum, found.remedies[0].cuda) == ("550.54.14", "12.4")
    assert not any("load the library that defines them" in r.render() for r in found.remedies)


@needs_cc
def test_a_missing_symbol_of_another_library_keeps_its_own_remedy(tmp_path: Path):
    """The clean twin of the rule above: a library that is not the driver's lacks a symbol (which happens to
    share no name with the driver's table): no driver remedy."""
    d = tmp_path / "d"
    d.mkdir()
    full = _cc(d / "libfoo.so.1", "int foo_new(void) { return 0; }\n", "-Wl,-soname,libfoo.so.1")
    exe = _cc(
        tmp_path / "app",
        "int foo_new(void);\nint main(void) { return foo_new(); }\n",
        str(full),
        "-Wl,-z,now",
        "-Wl,--enable-new-dtags",
        f"-Wl,-rpath,{d}",
        shared=False,
    )
    _cc(d / "libfoo.so.1", "int foo_old(void) { return 0; }\n", "-Wl,-soname,libfoo.so.1")
    tree = Resolver(SearchConfig.from_environment({})).tree(str(exe))
    (found,) = binary_symbol_findings(tree, "app", read_symbols)
    assert found.failing
    assert not any(isinstance(r, DriverUpgrade) for r in found.remedies)
