"""Imports inside functions that a module's top level calls (model/pysource.py's call following): a ``for``
over a constant tuple calling a function through an alias, ``if name in {...}`` decided for each constant
argument, a ``try`` whose handler runs only when its body's import is not found, and an
``if __name__ == "__main__":`` block that an import never runs (hashlib's shape: ``_blake2`` is imported by
``__get_builtin_constructor``, which its top-level loop reaches). gcc-built extension modules; the oracle is
the real import in a child process."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from pytest_cudastack.cli.loaded import loaded_libraries, static_document
from pytest_cudastack.model.pysource import module_imports
from tests.helpers.elfbuild import CC, needs_cc
from tests.helpers.sitebuild import site_packages

pytestmark = needs_cc
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
INCLUDE = sysconfig.get_paths()["include"]
HAVE_HEADERS = os.path.isfile(os.path.join(INCLUDE, "Python.h"))

INIT = """\
_ALWAYS = ("alpha", "beta")
_PREFER_OWN = {"beta"}


def _own(name):
    if name == "alpha":
        from . import _alpha
    elif name in {"beta", "gamma"}:
        from . import _beta
    return name


def _pick(name):
    if name in _PREFER_OWN:
        return _own(name)
    try:
        import pkgf._fast
    except ImportError:
        return _own(name)
    return name


try:
    import pkgf._fast
    _get = _pick
except ImportError:
    _get = _own

for _n in _ALWAYS:
    _get(_n)


def main():
    from . import _script


def later():
    from . import _later


if __name__ == "__main__":
    main()
"""


def _ext(out: Path, name: str) -> None:
    assert CC is not None
    src = out.with_suffix(".c")
    src.write_text(
        "#include <Python.h>\n"
        f'static struct PyModuleDef def_ = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};\n'
        f"PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&def_); }}\n"
    )
    proc = subprocess.run(
        [CC, "-shared", "-fPIC", f"-I{INCLUDE}", "-o", str(out), str(src)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    src.unlink()


def _site(tmp_path: Path, init: str) -> Path:
    site = site_packages(tmp_path / "venv")
    pkg = site / "pkgf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(init)
    (pkg / "_fast.py").write_text("")
    for name in ("_alpha", "_beta", "_script", "_later"):
        _ext(pkg / f"{name}{SUFFIX}", name)
    return site


def _mapped(site: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], set[str]]:
    monkeypatch.setenv("PYTHONPATH", str(site))
    real, error = loaded_libraries("pkgf", site_paths=[str(site)])
    assert error is None
    doc, clean = static_document("pkgf", [str(site)])
    assert clean, doc.get("error")
    ours = str(site)
    return (
        {os.path.basename(lib.path) for lib in real if ours in lib.path},
        {os.path.basename(x["path"]) for x in doc["libraries"] if ours in x["path"]},
    )


@pytest.mark.skipif(not HAVE_HEADERS, reason="needs Python.h")
def test_imports_in_functions_the_top_level_calls_are_predicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    real, predicted = _mapped(_site(tmp_path, INIT), monkeypatch)
    assert real == {f"_beta{SUFFIX}"}  # alpha takes _fast; beta is preferred from _own; main() never runs
    assert predicted == real


@pytest.mark.skipif(not HAVE_HEADERS, reason="needs Python.h")
def test_the_handler_runs_when_the_body_import_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The twin: without _fast the top-level try binds _get = _own, and alpha imports _alpha too."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = _site(tmp_path, INIT)
    (site / "pkgf/_fast.py").unlink()
    real, predicted = _mapped(site, monkeypatch)
    assert real == {f"_alpha{SUFFIX}", f"_beta{SUFFIX}"}
    assert predicted == real


@pytest.mark.skipif(not HAVE_HEADERS, reason="needs Python.h")
def test_functions_nothing_calls_are_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    init = INIT.replace("for _n in _ALWAYS:\n    _get(_n)\n", "")
    real, predicted = _mapped(_site(tmp_path, init), monkeypatch)
    assert real == predicted == set()


def test_hashlib_of_this_interpreter_imports_blake2(tmp_path: Path):
    import hashlib

    items = repr(module_imports(hashlib.__file__, "hashlib", False, None))
    assert "'_blake2'" in items


def test_a_call_graph_with_fan_out_is_followed_once_per_distinct_call(tmp_path: Path):
    """Each function calls the next ten times: the paths are 10**30, the distinct calls a few hundred."""
    src = [f"def f{i}(x):\n    import mod{i}\n" + "".join(f"    f{i + 1}({k})\n" for k in range(10)) for i in range(30)]
    src.append("for v in (1, 2, 3):\n    f0(v)\n")
    path = tmp_path / "fan.py"
    path.write_text("\n".join(src))
    items = module_imports(str(path), "fan", False, None)
    text = repr(items)
    assert "'mod0'" in text
    assert "'mod5'" in text  # followed as deep as the depth cap allows
    assert len(text) < 10_000


def test_many_functions_with_imports_nothing_calls_are_not_followed(tmp_path: Path):
    path = tmp_path / "many.py"
    path.write_text("".join(f"def f{i}():\n    import mod{i}\n" for i in range(1000)))
    assert module_imports(str(path), "many", False, None) == []
