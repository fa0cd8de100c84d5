"""Imports a real Cython (>= 3.1) extension module makes at init, predicted from its files, against the real
import in a child process. Cython turns a ``cimport`` of a module's cdef functions (or extension types) into
``PyImport_ImportModule("pkg.b")`` in the importing module's init (``ModuleNode``'s function/type import
code, which then fetches ``pkg.b.__pyx_capi__``): a C string, which the model follows. A ``cimport`` of only
ctypedefs, enum constants or inline functions is resolved at compile time and imports nothing; a Python
``import`` inside a function runs only when the function does: neither is predicted (no false object).
A module-level Python ``import`` is named only in the module's string table, as an import inside a function
is; the model reads which slots the module's exec function passes to the import machinery
(linker/cyinit.py) and predicts those imports.

Modules are built as wheels are, optimized (``-O2``), and with some forty functions, as real binding modules
have: a table of a few dozen constants has its length index built by immediate stores, which the reader
does not decode (the model's documented limit, asserted below). Skipped without Cython >= 3.1
(``pip install cython``), a C compiler or Python.h."""

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
from pytest_cudastack.linker.cyinit import init_names
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
# a module of some size, as binding modules are (their tables hold hundreds of constants)
FILLER = "".join(f"def filler{i}(arg{i}):\n    return arg{i}\n" for i in range(40))
FRONTS = {
    "function": "from {pkg}.b cimport twice\ndef f():\n    return twice(3)\n",
    "type": "from {pkg}.b cimport Box\ndef f():\n    cdef Box b = Box()\n    return b.v\n",
    "ctypedef_beside_type": "from {pkg}.b cimport myint\ndef f():\n    cdef myint v = 1\n    return v\n",
    "ctypedef": "from {pkg}.b cimport myint, K, inc\ndef f():\n    cdef myint v = K\n    return inc(v)\n",
    "in_function": "def f():\n    from .b import X\n    import {pkg}.b\n    return X\n",
    "module_level": "from .b import X\ndef f():\n    return X\n",
    "absolute": "import {pkg}.b\ndef f():\n    return {pkg}.b.X\n",
    "called_function": "def f():\n    from .b import X\n    return X\nf()\n",
}


def _build(pyx: Path, site: Path, opt: str = "-O2", link: tuple[str, ...] = ()) -> None:
    """Cythonize and compile ``pyx`` in place (its package is named by the ``__init__.py`` above it)."""
    assert CC is not None
    c = pyx.with_suffix(".c")
    out = pyx.with_name(pyx.stem + SUFFIX)
    for cmd in (
        [sys.executable, "-m", "cython", "-3", "-I", str(site), str(pyx), "-o", str(c)],
        [CC, "-shared", "-fPIC", opt, f"-I{INCLUDE}", "-o", str(out), str(c), *link],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
    c.unlink()
    pyx.unlink()


def _site(
    tmp_path: Path, kind: str, filler: str = FILLER, opt: str = "-O2", link: tuple[str, ...] = ()
) -> tuple[Path, str]:
    """``import pkg`` imports pkg.front, built by Cython from ``FRONTS[kind]`` (and ``filler``); pkg.b is
    the Cython module it cimports or imports (its .pxd shipped beside it, as cuda-bindings ships its own)."""
    site = site_packages(tmp_path / "venv")
    pkg = f"cypkg_{kind}"
    (site / pkg).mkdir()
    (site / pkg / "__init__.py").write_text("from . import front\n")
    typed = kind in WITH_TYPE
    (site / pkg / "b.pxd").write_text(B_PXD + (TYPE_PXD if typed else ""))
    (site / pkg / "b.pyx").write_text(B_PYX + (TYPE_PYX if typed else ""))
    (site / pkg / "front.pyx").write_text(FRONTS[kind].format(pkg=pkg) + filler)
    _build(site / pkg / "b.pyx", site, opt)
    _build(site / pkg / "front.pyx", site, opt, link)
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


@pytest.mark.parametrize("kind", ["module_level", "absolute"])
def test_a_module_level_python_import_is_predicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str):
    """``from .b import X`` (cuda.bindings._internal.driver's ``from .utils import ...``) and ``import
    pkg.b`` at module level: the real import maps b; the names are only in front's string table, as they are
    in the twin whose imports are inside a function (above), and front's exec function passes them to the
    import machinery: the prediction maps b too."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site, pkg = _site(tmp_path, kind)
    observed, predicted = _observed_and_predicted(site, pkg, monkeypatch)
    assert observed == predicted == {f"front{SUFFIX}", f"b{SUFFIX}"}
    names = init_names(site / pkg / f"front{SUFFIX}")
    assert names is not None
    assert ("b" if kind == "module_level" else f"{pkg}.b") in names
    assert not any(n.startswith("filler") or n.startswith("arg") for n in names)  # other uses of slots


@pytest.mark.parametrize("compress", [0, 1, 2, 90], ids=["raw", "zlib", "bz2", "lzss"])
def test_every_encoding_of_the_string_table_is_read(tmp_path: Path, compress: int):
    """The table's bytes as each ``CYTHON_COMPRESS_STRINGS`` stores them (``Code.py``): raw, zlib (Cython
    3.1/3.2's default), bz2, and Cython 3.3's LZSS (its default): the same names are read."""
    site, pkg = _site(tmp_path, "module_level", link=(f"-DCYTHON_COMPRESS_STRINGS={compress}",))
    names = init_names(site / pkg / f"front{SUFFIX}")
    assert names is not None
    assert {"b", f"{pkg}.b"} <= set(names)


def test_the_twin_import_inside_a_function_is_not_read_as_one_at_init(tmp_path: Path):
    """The reader itself, on the twin: the exec function reads no slot naming b for an import."""
    site, pkg = _site(tmp_path, "in_function")
    names = init_names(site / pkg / f"front{SUFFIX}")
    assert names is not None
    assert not {"b", f"{pkg}.b", "X"} & set(names)


def test_an_import_in_a_function_called_at_module_level_is_the_documented_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``def f(): from .b import X`` then ``f()`` at module level: the real import maps b (the call runs the
    function); the exec function calls it through its function object, and the import is in the function's
    own C code, which the reader does not follow (model/process.py, "Not modelled"): b is not predicted."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site, pkg = _site(tmp_path, "called_function")
    observed, predicted = _observed_and_predicted(site, pkg, monkeypatch)
    assert observed == {f"front{SUFFIX}", f"b{SUFFIX}"}
    assert predicted == {f"front{SUFFIX}"}


@pytest.mark.parametrize(
    ("filler", "opt", "flags"),
    [("", "-O2", ()), (FILLER, "-O0", ()), (FILLER, "-O2", ("-DCYTHON_USE_MODULE_STATE=1",))],
    ids=["small-table", "unoptimized", "module-state"],
)
def test_a_table_the_reader_cannot_decode_keeps_the_c_strings_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filler: str, opt: str, flags: tuple[str, ...]
):
    """The documented limit: a small table (its length index built by immediate stores), an unoptimized
    build (the table's base passed in a register) or a module-state build (the table in the module object,
    not in static data): nothing is read (None), and the module-level import is not predicted (today's
    behaviour, no false object)."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site, pkg = _site(tmp_path, "module_level", filler, opt, flags)
    assert init_names(site / pkg / f"front{SUFFIX}") is None
    observed, predicted = _observed_and_predicted(site, pkg, monkeypatch)
    assert observed == {f"front{SUFFIX}", f"b{SUFFIX}"}
    assert predicted == {f"front{SUFFIX}"}


def _gone_library(tmp_path: Path) -> Path:
    """A library to link against and then delete: its SONAME stays a DT_NEEDED that resolves nowhere."""
    assert CC is not None
    src = tmp_path / "gone.c"
    src.write_text("int gone_cy(void) { return 1; }\n")
    lib = tmp_path / "libgone_cy.so"
    subprocess.run([CC, "-shared", "-fPIC", "-Wl,-soname,libgone_cy.so.1", "-o", str(lib), str(src)], check=True)
    return lib


@pytest.mark.parametrize("guarded", [True, False], ids=["try-except", "bare"])
def test_an_init_import_that_fails_to_load_is_taken_as_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarded: bool
):
    """``try: from .opt import Y`` / ``except ImportError`` at module level (cupy's optional cuTENSOR
    module), opt an extension whose library is absent: the real import tries opt, whose dlopen fails, and
    goes on; the model cannot see the ``try`` in machine code and takes the failed load as caught: nothing of
    opt is predicted and the prediction stays clean. Without the ``try`` the real import fails while the
    prediction is the same: the model's documented limit (model/process.py)."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = site_packages(tmp_path / "venv")
    pkg = "cyguard"
    (site / pkg).mkdir()
    (site / pkg / "__init__.py").write_text("from . import front\n")
    (site / pkg / "opt.pyx").write_text("Y = 1\n")
    _build(site / pkg / "opt.pyx", site, link=("-Wl,--no-as-needed", str(_gone_library(tmp_path))))
    (tmp_path / "libgone_cy.so").unlink()
    body = "try:\n    from .opt import Y\nexcept ImportError:\n    Y = None\n" if guarded else "from .opt import Y\n"
    (site / pkg / "front.pyx").write_text(body + FILLER)
    _build(site / pkg / "front.pyx", site)
    names = init_names(site / pkg / f"front{SUFFIX}")
    assert names is not None
    assert "opt" in names
    monkeypatch.setenv("PYTHONPATH", str(site))
    real, error = loaded_libraries(pkg, site_paths=[str(site)])
    assert (error is None) is guarded
    doc, clean = static_document(pkg, [str(site)])
    assert clean, doc.get("error") or doc["missing"]
    predicted = {os.path.basename(x["path"]) for x in doc["libraries"] if x["path"].startswith(str(site))}
    assert predicted == {f"front{SUFFIX}"}
    if guarded:
        assert {os.path.basename(lib.path) for lib in real if lib.path.startswith(str(site))} == predicted


def test_other_names_and_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A nested package's module (``top.inner.front``) that imports a sibling relative to its package
    (``from .sib import V``) and a module of another top-level package by its absolute dotted name
    (``import otherpkg.deep.mod``), at module level; and a sibling it names only inside a function (never
    imported): the prediction equals the real import."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = site_packages(tmp_path / "venv")
    inner = site / "top" / "inner"
    inner.mkdir(parents=True)
    (site / "top" / "__init__.py").write_text("")
    (inner / "__init__.py").write_text("from . import front\n")
    deep = site / "otherpkg" / "deep"
    deep.mkdir(parents=True)
    (site / "otherpkg" / "__init__.py").write_text("")
    (deep / "__init__.py").write_text("")
    for d, name in ((inner, "sib"), (inner, "later"), (deep, "mod")):
        (d / f"{name}.pyx").write_text("V = 1\n")
        _build(d / f"{name}.pyx", site)
    (inner / "front.pyx").write_text(
        "from .sib import V\nimport otherpkg.deep.mod\ndef f():\n    from . import later\n    return later\n" + FILLER
    )
    _build(inner / "front.pyx", site)
    monkeypatch.setenv("PYTHONPATH", str(site))
    real, error = loaded_libraries("top.inner", site_paths=[str(site)])
    assert error is None
    doc, clean = static_document("top.inner", [str(site)])
    assert clean, doc.get("error") or doc["missing"]
    ours = str(site)
    observed = {os.path.basename(lib.path) for lib in real if lib.path.startswith(ours)}
    assert observed == {f"front{SUFFIX}", f"sib{SUFFIX}", f"mod{SUFFIX}"}
    assert {os.path.basename(x["path"]) for x in doc["libraries"] if x["path"].startswith(ours)} == observed


def test_hostile_variants_never_raise(tmp_path: Path):
    """Truncated, zero-filled and bit-flipped copies of a real Cython module: the reader gives None or
    names, never an exception; the intact file gives its import."""
    site, pkg = _site(tmp_path, "module_level")
    data = (site / pkg / f"front{SUFFIX}").read_bytes()
    assert "b" in (init_names(site / pkg / f"front{SUFFIX}") or ())
    variants = [data[:n] for n in (0, 16, 64, len(data) // 3, len(data) // 2, len(data) - 1)]
    for at in range(0, len(data), max(1, len(data) // 40)):
        variants.append(data[:at] + bytes(256) + data[at + 256 :])
        variants.append(data[:at] + bytes(b ^ 0xA5 for b in data[at : at + 64]) + data[at + 64 :])
    bad = tmp_path / "bad.so"
    for v in variants:
        bad.write_bytes(v)
        result = init_names(bad)
        assert result is None or all(isinstance(n, str) for n in result)
