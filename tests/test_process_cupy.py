"""cupy's load order through cuda-pathfinder (the ``cupy_backends.cuda.libs`` preload rows of
cuda/data/dlopen_targets.json): before ``cupy_backends.cuda.libs.cublas`` is imported, pathfinder loads
``libcublasLt.so.13`` then ``libcublas.so.13`` by path from site-packages ``nvidia/cu13/lib`` with
RTLD_GLOBAL, so the extension module, which has no RUNPATH to them, finds ``libcublas.so.13`` already
loaded. gcc-built stand-ins; a real child-process import of them is the oracle."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.checks.closure import extension_closures
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.modules import module_trees
from pytest_cudastack.model.process import Interpreter, predict_import
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_cupy_stand_in, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _cupy(tmp_path: Path, *, cublas: bool = True) -> Path:
    site = site_packages(tmp_path / "venv")
    files: dict[str, bytes | str] = {"nvidia/cu13/lib/libcublasLt.so.13": compile_so("libcublasLt.so.13")}
    if cublas:
        files["nvidia/cu13/lib/libcublas.so.13"] = compile_so(
            "libcublas.so.13", needed=["libcublasLt.so.13"], runpath="$ORIGIN"
        )
    write_dist(site, "nvidia-cublas", "13.1.0", files)
    # links libcublas.so.13 by soname, no RUNPATH to nvidia/cu13/lib: as cupy's wheels
    write_cupy_stand_in(site, compile_so(None, pyinit="cublas", needed=["libcublas.so.13"]))
    return site


def _errors(site: Path) -> list[str]:
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig(), reader=read_elf, owner=inv.owner)
    found = extension_closures(inv, resolver, trees=module_trees(inv, resolver, read_elf))
    return [f.message for f in found if f.failing]


def _real_import(site: Path) -> str:
    """The oracle: stderr of ``import cupy`` by this interpreter in a child, with only ``site`` added."""
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    r = subprocess.run([sys.executable, "-c", "import cupy"], env=env, capture_output=True, text=True)
    return r.stderr


def test_cupy_preload_predicted_in_pathfinder_order(tmp_path: Path):
    site = _cupy(tmp_path)
    exe = tmp_path / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.write_bytes(compile_so(None))
    interp = Interpreter((str(site),), str(exe), startup=frozenset(sys.builtin_module_names))
    p = predict_import("cupy", interp, Resolver(SearchConfig(), reader=read_elf), read_elf, lambda _: None)
    assert p.missing == ()
    rows = [(os.path.basename(o.path), o.route, o.global_scope) for o in p.objects]
    assert rows == [
        ("libcublasLt.so.13", "preload", True),
        ("libcublas.so.13", "preload", True),
        (f"cublas{SUFFIX}", "extension module", False),
    ]
    assert p.objects[1].reason == "preload by path (cupy_backends.cuda.libs.__getattr__, RTLD_GLOBAL)"


def test_clean_cupy_has_no_closure_error_and_really_imports(tmp_path: Path):
    site = _cupy(tmp_path)
    assert _errors(site) == []
    assert "cannot open shared object file" not in _real_import(site)  # dlopen succeeded (PyInit stub: no module)


def test_cupy_without_its_cublas_still_errors(tmp_path: Path):
    site = _cupy(tmp_path, cublas=False)
    errors = _errors(site)
    assert len(errors) == 1
    assert errors[0].startswith(f"libcublas.so.13 is not found: needed by cupy_backends/cuda/libs/cublas{SUFFIX}")
    assert "libcublas.so.13: cannot open shared object file" in _real_import(site)
