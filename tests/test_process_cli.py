"""``cudastack loaded MODULE --static [--json]``: the loaded schema with route and reason, exit codes; and
the real tier's parity: the prediction for ``import torch`` equals what the real import maps."""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pytest_cudastack.cli.loaded import cmd_loaded, loaded_libraries, static_document
from tests.helpers.realenv import torch_site, torch_venv
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _schema() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(
        resources.files("pytest_cudastack").joinpath("schemas/loaded.schema.json").read_text()
    )
    return raw


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_static_json_validates_and_names_routes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = site_packages(tmp_path / "venv")
    (site / "pkg").mkdir()
    (site / "pkg/__init__.py").write_text("from . import _ext\n")
    (site / f"pkg/_ext{SUFFIX}").write_bytes(compile_so(None, pyinit="_ext", needed=["libx.so.1"], rpath="$ORIGIN"))
    (site / "pkg/libx.so.1").write_bytes(compile_so("libx.so.1"))
    doc, clean = static_document("pkg", [str(site)])
    jsonschema.validate(doc, _schema())
    assert clean
    assert doc["static"] is True
    assert doc["missing"] == []
    rows = [(os.path.basename(x["path"]), x["route"], x["reason"]) for x in doc["libraries"]]
    assert rows == [
        (f"_ext{SUFFIX}", "extension module", "extension module pkg._ext (dlopen RTLD_NOW|RTLD_LOCAL)"),
        ("libx.so.1", "DT_NEEDED", f"DT_NEEDED of _ext{SUFFIX}"),
    ]
    (site / "pkg/libx.so.1").unlink()
    doc, clean = static_document("pkg", [str(site)])
    assert not clean
    assert doc["missing"] == ["libx.so.1"]
    monkeypatch.setattr("sys.path", [str(site)])
    assert cmd_loaded(argparse.Namespace(module="no_such_module_cudastack", json=True, static=True)) == 1
    failed = json.loads(capsys.readouterr().out)
    jsonschema.validate(failed, _schema())
    assert failed["error"].startswith("No module named 'no_such_module_cudastack'")


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_static_text_escapes_control_characters_in_file_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    """A library name from the inspected tree with a terminal escape in it is shown escaped, never raw."""
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    site = site_packages(tmp_path / "venv")
    (site / "pkg").mkdir()
    (site / "pkg/__init__.py").write_text("from . import _ext\n")
    (site / f"pkg/_ext{SUFFIX}").write_bytes(
        compile_so(None, pyinit="_ext", needed=["libx\x1b]0;x.so.1"], rpath="$ORIGIN")
    )
    (site / "pkg/libx\x1b]0;x.so.1").write_bytes(compile_so("libx\x1b]0;x.so.1"))
    monkeypatch.setattr("sys.path", [str(site), *sys.path])
    assert cmd_loaded(argparse.Namespace(module="pkg", json=False, static=True)) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "libx\\x1b]0;x.so.1" in out


# What a static reading of the files cannot see, for ``import torch`` (each listed with why): nothing left.
# The Cython modules cuda.bindings cimports at init (C strings), the module-level Python imports of its
# Cython >= 3.1 modules (cuda.bindings._internal.driver's `from .utils import ...`: the string-table slots
# its exec function reads, linker/cyinit.py) and hashlib's _blake2 (imported inside a function its top
# level calls) are predicted.
UNPREDICTABLE: dict[str, str] = {}


def _unpredictable(path: str) -> bool:
    stem = path.split(".cpython-")[0]
    return any(stem.endswith(k) for k in UNPREDICTABLE)


@pytest.mark.real
def test_static_prediction_equals_the_real_import_of_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    venv = torch_venv()
    site = torch_site(venv)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    real, error = loaded_libraries("torch", python=str(venv / "bin" / "python"), site_paths=[site])
    assert error is None
    doc, clean = static_document("torch", [site])
    assert clean, doc.get("error") or doc["missing"]
    observed = {os.path.realpath(lib.path) for lib in real}
    predicted = {os.path.realpath(x["path"]) for x in doc["libraries"]}
    missing = sorted(p for p in observed - predicted if not _unpredictable(p))
    extra = sorted(predicted - observed)
    assert (missing, extra) == ([], [])
    assert all(_unpredictable(p) for p in observed - predicted)
    # each listed exception is still real (the list shrinks when the model learns one)
    assert {k for k in UNPREDICTABLE if any(p.split(".cpython-")[0].endswith(k) for p in observed - predicted)} == set(
        UNPREDICTABLE
    )
    by_path = {os.path.realpath(x["path"]): x for x in doc["libraries"]}
    assert by_path[os.path.realpath(os.path.join(site, "torch/lib/libtorch_global_deps.so"))]["route"] == "preload"
    builtins = os.path.realpath(os.path.join(site, "nvidia/cu13/lib/libnvrtc-builtins.so.13.0"))
    assert by_path[builtins]["reason"] == "preload by path (torch._load_global_deps, RTLD_LOCAL)"


# ``import triton`` (a torch dependency, a small real CUDA package): what the static reading cannot see.
TRITON_UNPREDICTABLE = {
    # triton.backends._discover_backends (called by its top level) lists its backend directories and
    # imports triton.backends.<name>.driver with importlib.import_module: a computed name; that driver
    # imports ctypes, which maps _ctypes and its libffi
    "lib-dynload/_ctypes": "importlib.import_module of a computed name (triton.backends._discover_backends)",
    "libffi.so": "DT_NEEDED of _ctypes, imported as above",
}


def _triton_unpredictable(path: str) -> bool:
    stem = os.path.basename(path).split(".cpython-")[0]
    full = os.path.join(os.path.basename(os.path.dirname(path)), stem)
    return any(full.endswith(k) or stem.startswith(k) for k in TRITON_UNPREDICTABLE)


@pytest.mark.real
def test_static_prediction_equals_the_real_import_of_triton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Parity for one more real CUDA package of the torch venv: ``import triton`` maps exactly what the static
    prediction says (realpaths), but for the listed objects, each still unpredictable."""
    venv = torch_venv()
    site = torch_site(venv)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    real, error = loaded_libraries("triton", python=str(venv / "bin" / "python"), site_paths=[site])
    assert error is None
    doc, clean = static_document("triton", [site])
    assert clean, doc.get("error") or doc["missing"]
    observed = {os.path.realpath(lib.path) for lib in real}
    predicted = {os.path.realpath(x["path"]) for x in doc["libraries"]}
    assert sorted(p for p in observed - predicted if not _triton_unpredictable(p)) == []
    assert sorted(predicted - observed) == []
    unseen = observed - predicted
    assert {k for k in TRITON_UNPREDICTABLE if any(_triton_unpredictable(p) and k in p for p in unseen)} == set(
        TRITON_UNPREDICTABLE
    )
    assert os.path.realpath(os.path.join(site, "triton/_C/libtriton.so")) in predicted  # its extension module
