from __future__ import annotations

import argparse
import glob
import json
import os

import pytest

from pytest_cudastack.cli.loaded import cmd_loaded, loaded_libraries


def test_loaded_lists_new_shared_objects_with_sonames():
    libs, error = loaded_libraries("_ctypes")
    assert error is None
    by_name = {lib.path.rsplit("/", 1)[-1]: lib for lib in libs}
    ext = next(lib for name, lib in by_name.items() if name.startswith("_ctypes"))
    assert ext.soname is None  # an extension module has no DT_SONAME
    assert any(lib.soname and lib.soname.startswith("libffi.so") for lib in libs)


def test_loaded_json_shape(capsys):
    assert cmd_loaded(argparse.Namespace(module="_ctypes", json=True)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["module"] == "_ctypes"
    assert data["libraries"]
    assert set(data["libraries"][0]) == {"path", "soname", "provider"}


def test_loaded_already_imported_module_maps_nothing_new():
    libs, error = loaded_libraries("sys")
    assert error is None
    assert libs == ()


def test_loaded_json_lists_what_importing_json_adds(capsys):
    # the child must not import json (and with it the _json extension) before its "before" picture
    import _json

    if not getattr(_json, "__file__", None):
        pytest.skip("_json is built into this interpreter: importing json maps nothing new")
    assert cmd_loaded(argparse.Namespace(module="json", json=True)) == 0
    paths = [lib["path"] for lib in json.loads(capsys.readouterr().out)["libraries"]]
    assert os.path.realpath(_json.__file__) in [os.path.realpath(p) for p in paths]


def test_loaded_failed_import_exits_1(capsys):
    assert cmd_loaded(argparse.Namespace(module="no_such_module_cudastack", json=True)) == 1
    data = json.loads(capsys.readouterr().out)
    assert "ModuleNotFoundError" in data["error"]


def test_loaded_module_printing_to_stdout(tmp_path, monkeypatch):
    (tmp_path / "noisy_cudastack.py").write_text("import _ctypes\nprint('{\"paths\": []}', end='')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    libs, error = loaded_libraries("noisy_cudastack")
    assert error is None
    assert libs


@pytest.mark.real
@pytest.mark.xdist_group("torch-venv")  # importing torch may write __pycache__ into the venv
def test_loaded_torch_maps_the_cuda_wheels_libraries():
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("needs the real torch CUDA venv ($CUDASTACK_TORCH_VENV)")
    site = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
    libs, error = loaded_libraries("torch", python=os.path.join(venv, "bin", "python"), site_paths=site)
    assert error is None
    providers = {lib.soname: lib.provider for lib in libs}
    assert providers["libcudart.so.13"].startswith("nvidia-cuda-runtime ")
    assert providers["libcublas.so.13"].startswith("nvidia-cublas ")
    assert providers["libtorch_cuda.so"].startswith("torch ")
