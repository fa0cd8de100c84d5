"""Imports a real Cython (>= 3.1) extension module makes at init, predicted from its files, against the real
import in a child process. Cython turns a ``cimport`` of a module's cdef functions (or extension types) into
``PyImport_ImportModule("pkg.b")`` in the importing module's init (``ModuleNode``'s function/type import
code, which then fetches ``pkg.b.__pyx_capi__``): a C string, which the model follows. A ``cimport`` of only
ctypedefs, enum constants or inline functions is resolved at compile time and imports nothing; a Python
``import`` inside a function runs only when the function does: neither is predicted (no false object).
A module-level Python ``import`` of such a module is named only in its packed constant table, with the
names of imports inside functions: the model's documented limit (model/process.py), asserted as such.

Skipped without Cython >= 3.1 (``pip install cython``), a C compiler or Python.h."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pytest_cudastack.cli.loaded import loaded_libraries, static_document
from pytest_cudastack.linker.lookups import read_lookups
from tests.helpers.elfbuild import CC
from tests.helpers.sitebuild import site_packages

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
INCLUDE = sysconfig.get_paths()["include"]


def _cython_version() -> tuple[int, int] | None:
    if importlib.util.find_spec("Cython") is None:
        return None
    import Cython

    major, minor = Cython.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


CYTHON = _cython_version()
pytestmark = pytest.mark.skipif(
    CC is None or CYTHON is None or CYTHON < (3, 1) or not os.path.isfile(os.path.join(INCLUDE, "Python.h")),
    reason="needs Cython >= 3.1, a C compiler and Python.h",
)

# b: a cdef function (exported in b's __pyx_capi__), a ctypedef, an enum constant, an inline function; with
# an extension type where the front's kind is in WITH_TYPE
B_PXD = (
    "cdef int twice(int x)\nctypedef int myint\ncdef enum:\n    K = 3\ncdef inline int inc(int x):\n    return x + 1\n"
)
B_PYX = "cdef int twice(int x):\n    return x * 2\nX = 1\n"
TYPE_PXD = "cdef class Box:\n    cdef int v\n"
TYPE_PYX = "cdef class Box:\n    pass\n"
WITH_TYPE = {"type", "ctypedef_beside_type"}
FRONTS = {
    "function": "from {pkg}.b cimport twice\ndef f():\n    return twice(3)\n",
    "type": "from {pkg}.b cimport Box\ndef f():\n    cdef Box b = Box()\n    return b.v\n",
    "ctypedef_beside_type": "from {pkg}.b cimport myint\ndef f():\n    cdef myint v = 1\n    return v\n",
    "ctypedef": "from {pkg}.b cimport myint, K, inc\ndef f():\n    cdef myint v = K\n    return inc(v)\n",
    "in_function": "def f():\n    from .b import X\n    import {pkg}.b\n    return X\n",
    "module_level": "from .b import X\ndef f():\n    return X\n",
}


def _build(pyx: Path, site: Path) -> None:
    """Cythonize and compile ``pyx`` in place (its package is named by the ``__init__.py`` above it)."""
    assert CC is not None
    c = pyx.with_suffix(".c")
    for cmd in (
        [sys.executable, "-m", "cython", "-3", "-I", str(site), str(pyx), "-o", str(c)],
        [CC, "-shared", "-fPIC", "-O0", f"-I{INCLUDE}", "-o", str(pyx.with_name(pyx.stem + SUFFIX)), str(c)],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
    c.unlink()
    pyx.unlink()


def _site(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """``import pkg`` imports pkg.front, built by Cython from ``FRONTS[kind]``; pkg.b is the Cython module
    it cimports or imports (its .pxd shipped beside it, as cuda-bindings ships its own)."""
    site = site_packages(tmp_path / "venv")
    pkg = f"cypkg_{kind}"
    (site / pkg).mkdir()
    (site / pkg / "__init__.py").write_text("from . import front\n")
    typed = kind in WITH_TYPE
    (site / pkg / "b.pxd").write_text(B_PXD + (TYPE_PXD if typed else ""))
    (site / pkg / "b.pyx").write_text(B_PYX + (TYPE_PYX if typed else ""))
    (site / pkg / "front.pyx").write_text(FRONTS[kind].format(pkg=pkg))
    _build(site / pkg / "b.pyx", site)
    _build(site / pkg / "front.pyx", site)
    return site, pkg


def _observed_and_predicted(site: Path, pkg: str, monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], set[str]]:
    monkeypatch.setenv("PYTHONPATH", str(site))
    real, error = loaded_libraries(pkg, site_paths=[str(site)])
    assert error is None
    doc, clean = static_document(pkg, [str(site)])
    assert clean, doc.get("error") or doc["missing"]
    ours = str(site / pkg)
    return (
        {os.path.basename(lib.path) for lib in real if lib.path.startswith(ours)},
        {os.path.basename(x["path"]) for x in doc["libraries"] if x["path"].startswith(ours)},
    )


@pytest.mark.parametrize("kind", ["function", "type", "ctypedef_beside_type"])
def test_a_cimport_of_a_cdef_function_or_type_imports_its_module_at_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
):
    """A cimport of a cdef function the module calls, of an extension type, and of a mere ctypedef from a
    .pxd that also declares an extension type (Cython imports every extension type of a cimported module,
    used or not): the init imports b by a C string, and the prediction follows it."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site, pkg = _site(tmp_path, kind)
    observed, predicted = _observed_and_predicted(site, pkg, monkeypatch)
    assert observed == {f"front{SUFFIX}", f"b{SUFFIX}"}
    assert predicted == observed
    found = read_lookups(site / pkg / f"front{SUFFIX}")
    assert f"{pkg}.b" in found.modules
    assert found.cython is not None
    assert found.cython >= (3, 1)


@pytest.mark.parametrize("kind", ["ctypedef", "in_function"])
def test_what_imports_nothing_at_init_is_not_predicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str):
    """The twins: a cimport of only a ctypedef, an enum constant and an inline function (compile time), and
    Python imports inside a function (run when it is called): the import maps front only, and so does the
    prediction."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site, pkg = _site(tmp_path, kind)
    observed, predicted = _observed_and_predicted(site, pkg, monkeypatch)
    assert observed == predicted == {f"front{SUFFIX}"}


def test_a_module_level_python_import_is_the_documented_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``from .b import X`` at module level (cuda.bindings._internal.driver's ``from .utils import ...``):
    the real import maps b; its name is only in front's packed constant table, as it would be were the
    import inside a function (the twin above), so the model does not predict it: the one object the
    torch parity test lists as unpredictable."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site, pkg = _site(tmp_path, "module_level")
    observed, predicted = _observed_and_predicted(site, pkg, monkeypatch)
    assert observed == {f"front{SUFFIX}", f"b{SUFFIX}"}
    assert predicted == {f"front{SUFFIX}"}
