"""The closure check in import context (checks/closure.py + model/process.py): modules loaded after
``import torch`` see torch's objects as already loaded. gcc-built stand-ins of the issue's false positives
(sgl-kernel / vllm / deep_gemm needing libtorch.so): the clean twin gives no error, broken twins still do."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

import pytest

from pytest_cudastack.checks.closure import extension_closures
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.modules import module_trees
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _stack(tmp_path: Path, kernel_init: str, *, libtorch: bool = True) -> Path:
    site = site_packages(tmp_path / "venv")
    torch_files: dict[str, bytes | str] = {
        "torchish/__init__.py": "from torchish import _C\n",
        f"torchish/_C{SUFFIX}": compile_so(None, pyinit="_C", needed=["libtorchish.so"], rpath="$ORIGIN/lib"),
    }
    if libtorch:
        torch_files["torchish/lib/libtorchish.so"] = compile_so("libtorchish.so")
    write_dist(site, "torchish", "2.9.0", torch_files)
    write_dist(
        site,
        "kernelish",
        "0.3.0",
        {
            "kernelish/__init__.py": kernel_init,
            # links libtorch by soname with no RPATH to torch's lib directory, as deep_gemm_cpp.abi3.so does
            "kernelish/common_ops.abi3.so": compile_so(None, pyinit="common_ops", needed=["libtorchish.so"]),
        },
        requires=["torchish==2.9.0"],
    )
    return site


def _errors(site: Path) -> list[str]:
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig(), reader=read_elf, owner=inv.owner)
    found = extension_closures(inv, resolver, trees=module_trees(inv, resolver, read_elf))
    return [f.message for f in found if f.failing]


def test_module_loaded_after_import_torch_is_clean(tmp_path: Path):
    assert _errors(_stack(tmp_path, "import torchish\nfrom kernelish import common_ops\n")) == []


def test_module_imported_before_torch_still_fails(tmp_path: Path):
    errors = _errors(_stack(tmp_path, "from kernelish import common_ops\nimport torchish\n"))
    assert len(errors) == 1
    assert errors[0].startswith("libtorchish.so is not found: needed by kernelish/common_ops.abi3.so")


def test_torch_without_its_library_still_fails(tmp_path: Path):
    errors = _errors(_stack(tmp_path, "import torchish\nfrom kernelish import common_ops\n", libtorch=False))
    assert errors
    assert all(e.startswith("libtorchish.so is not found") for e in errors)


def test_alone_the_module_would_fail(tmp_path: Path):
    """Without the import model (each module alone, as before) the clean twin is a false positive."""
    site = _stack(tmp_path, "import torchish\nfrom kernelish import common_ops\n")
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig(), reader=read_elf, owner=inv.owner)
    alone = [resolver.tree(lib.path) for d in inv.distributions for lib in d.libraries if lib.pyinit]
    assert any(x.soname == "libtorchish.so" for t in alone for x in t.missing)
