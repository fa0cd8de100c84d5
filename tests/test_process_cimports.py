"""Modules an extension module imports from C at init (model/process.py with linker/lookups.py): a dotted C
string naming an installed module (Cython's ``cimport``: ``__Pyx_ImportDottedModule``), followed unless a
Cython older than 3.1 built the module (its Python constants, names of imports inside functions among them,
are plain C strings too). gcc-built extension modules that really import at init, or only name a module;
the oracle is the real import in a child process."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_cudastack.cli.loaded import loaded_libraries, static_document
from pytest_cudastack.linker.lookups import Lookups, read_lookups
from tests.helpers.elfbuild import CC, needs_cc
from tests.helpers.sitebuild import site_packages, write_dist

pytestmark = needs_cc
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
INCLUDE = sysconfig.get_paths()["include"]
HAVE_HEADERS = os.path.isfile(os.path.join(INCLUDE, "Python.h"))


def _ext(out: Path, name: str, body: str, extra: str = "") -> None:
    """An extension module ``name`` whose PyInit runs ``body`` (C statements) before creating the module."""
    assert CC is not None
    src = out.with_suffix(".c")
    src.write_text(
        "#include <Python.h>\n"
        f"{extra}\n"
        f'static struct PyModuleDef def_ = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};\n'
        f"PyMODINIT_FUNC PyInit_{name}(void) {{\n{body}\n  return PyModule_Create(&def_);\n}}\n"
    )
    proc = subprocess.run(
        [CC, "-shared", "-fPIC", f"-I{INCLUDE}", "-o", str(out), str(src)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    src.unlink()


IMPORT = "  {{ PyObject *m = PyImport_ImportModule({expr}); if (!m) return NULL; Py_DECREF(m); }}"


def _site(tmp_path: Path, marker: str = "_cython_3_2_9.cython_function_or_method", imports: bool = True) -> Path:
    """``import pkgc`` imports pkgc.front (an extension module, built by the Cython ``marker`` names), whose
    init imports ``pkgc.cy`` by a C string, as Cython's cimport does (``imports``; else it only names it, as
    an old Cython's constant of an import inside a function). Strings that are not imports stay unfollowed:
    a qualified name under an extension module (``pkgc.cy.func``) and a module that is not installed."""
    site = site_packages(tmp_path / "venv")
    pkg = site / "pkgc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import front\n")
    extra = f'const char *names[] = {{"pkgc.cy.func", "pkgc.absent", "{marker}", "pkgc.cy"}};\n'
    body = IMPORT.format(expr='"pkgc.cy"') if imports else ""
    _ext(pkg / f"front{SUFFIX}", "front", body + "\n  (void)names;", extra)
    _ext(pkg / f"cy{SUFFIX}", "cy", "")
    return site


def _observed_and_predicted(site: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], set[str]]:
    monkeypatch.setenv("PYTHONPATH", str(site))
    real, error = loaded_libraries("pkgc", site_paths=[str(site)])
    assert error is None
    observed = {os.path.basename(lib.path) for lib in real if str(site) in lib.path}
    doc, clean = static_document("pkgc", [str(site)])
    assert clean, doc.get("error")
    return observed, {os.path.basename(x["path"]) for x in doc["libraries"] if str(site) in x["path"]}


@pytest.mark.skipif(not HAVE_HEADERS, reason="needs Python.h")
@pytest.mark.parametrize("marker", ["_cython_3_2_9.cython_function_or_method", "no_cython.marker"])
def test_modules_imported_from_c_are_predicted_as_the_real_import_maps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker: str
):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = _site(tmp_path, marker)
    for _ in range(2):  # cold, then from the cache
        observed, predicted = _observed_and_predicted(site, monkeypatch)
        assert observed == {f"front{SUFFIX}", f"cy{SUFFIX}"}
        assert predicted == observed


@pytest.mark.skipif(not HAVE_HEADERS, reason="needs Python.h")
def test_an_old_cython_module_s_strings_are_no_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Cython 0.29 keeps every Python constant as a C string: naming pkgc.cy is no import at init."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = _site(tmp_path, "_cython_0_29_37.cython_function_or_method", imports=False)
    observed, predicted = _observed_and_predicted(site, monkeypatch)
    assert observed == predicted == {f"front{SUFFIX}"}


@pytest.mark.skipif(not HAVE_HEADERS, reason="needs Python.h")
@pytest.mark.parametrize(
    "marker", ["_cython_3_0_12.cython_function_or_method", "_cython_0_29_37.cython_function_or_method"]
)
def test_a_module_without_a_marker_takes_its_distribution_s_cython(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker: str
):
    """One wheel is one build: ``pkge.front`` keeps no Cython marker (cupy-cuda11x's ``fft/_callback``) and
    names ``pkge.cy`` only as a constant; ``pkge.first``, imported before it from the same distribution,
    shows a Cython older than 3.1. The real import maps no ``pkge.cy``, nor does the model."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    build = tmp_path / "build"
    build.mkdir()
    _ext(build / "first.so", "first", "", f'const char *marker = "{marker}";\n')
    _ext(build / "front.so", "front", "  (void)names;", 'const char *names[] = {"pkge.cy"};\n')
    _ext(build / "cy.so", "cy", "")
    site = site_packages(tmp_path / "venv")
    files = {f"pkge/{n}{SUFFIX}": (build / f"{n}.so").read_bytes() for n in ("first", "front", "cy")}
    write_dist(site, "pkge", "1.0", {"pkge/__init__.py": "from . import first\nfrom . import front\n", **files})
    monkeypatch.setenv("PYTHONPATH", str(site))
    real, error = loaded_libraries("pkge", site_paths=[str(site)])
    assert error is None
    observed = {os.path.basename(lib.path) for lib in real if str(site) in lib.path}
    doc, clean = static_document("pkge", [str(site)])
    assert clean, doc.get("error")
    predicted = {os.path.basename(x["path"]) for x in doc["libraries"] if str(site) in x["path"]}
    assert observed == predicted == {f"first{SUFFIX}", f"front{SUFFIX}"}


@pytest.mark.skipif(not HAVE_HEADERS, reason="needs Python.h")
def test_without_the_names_nothing_more_is_predicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The twin: an extension module with no such strings imports nothing from C in the model."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = site_packages(tmp_path / "venv")
    (site / "pkgd").mkdir()
    (site / "pkgd/__init__.py").write_text("from . import front\n")
    _ext(site / f"pkgd/front{SUFFIX}", "front", "")
    _ext(site / f"pkgd/cy{SUFFIX}", "cy", "")
    doc, clean = static_document("pkgd", [str(site)])
    assert clean
    assert {os.path.basename(x["path"]) for x in doc["libraries"] if str(site) in x["path"]} == {f"front{SUFFIX}"}


@pytest.mark.skipif(not HAVE_HEADERS, reason="needs Python.h")
def test_lookups_reader_and_round_trip(tmp_path: Path):
    site = _site(tmp_path)
    found = read_lookups(site / f"pkgc/front{SUFFIX}")
    assert "pkgc.cy" in found.modules
    assert "pkgc.absent" in found.modules
    assert found.cython == (3, 2)
    assert found.init is None  # no Cython string table to read: judged by its C strings alone
    assert Lookups.from_json(found.to_json()) == found
    named = replace(found, init=("pkgc.cy", "os"))
    assert Lookups.from_json(named.to_json()) == named


def test_lookups_of_broken_files_are_elf_errors(tmp_path: Path):
    from pytest_cudastack.errors import ElfError

    text = tmp_path / "x.so"
    text.write_text("not an ELF file\n")
    with pytest.raises(ElfError, match="not an ELF"):
        read_lookups(text)
    wrong = {"path": "x", "modules": [1], "cython": None, "driver": [], "proc_address": False, "init": None}
    wrong_init = dict(wrong, modules=[], init=[1])
    old_entry = {k: v for k, v in wrong.items() if k != "init"}  # a cache entry written before ``init``
    for bad in (None, [], {"path": "x"}, wrong, wrong_init, dict(old_entry, modules=[])):
        with pytest.raises(ElfError, match="malformed"):
            Lookups.from_json(bad)
