from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.checks.closure import extension_closures
from pytest_cudastack.findings import SearchPath, Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.modules import extension_modules, module_trees
from pytest_cudastack.model.repair import plan_repairs
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

EXT = "_C.cpython-311-x86_64-linux-gnu.so"
RPATH = "$ORIGIN/lib:$ORIGIN/../nvidia/nccl/lib:$ORIGIN/../nvidia/cudnn/lib"


def build(tmp_path: Path) -> Path:
    """A torch-like layout: two extension modules sharing libtorch_x, which needs nccl and cudnn."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "torchish",
        "1.0",
        {
            f"torchish/{EXT}": compile_so(None, pyinit="_C", needed=["libtorch_x.so"], rpath=RPATH),
            "torchish/_other.abi3.so": compile_so(None, pyinit="_other", needed=["libtorch_x.so"], rpath=RPATH),
            "torchish/lib/libtorch_x.so": compile_so(
                "libtorch_x.so",
                needed=["libnccl.so.2", "libcudnn.so.9", "libcuda.so.1"],
                rpath="$ORIGIN/../../nvidia/nccl/lib:$ORIGIN/../../nvidia/cudnn/lib",
            ),
            # not an extension module: no PyInit
            "torchish/lib/libplugin.so": compile_so("libplugin.so", needed=["libfabric.so.1"]),
        },
    )
    write_dist(site, "nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2")})
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43", {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9")})
    return site


def run(site: Path):
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner)
    return inv, resolver, extension_closures(inv, resolver)


def test_modules_are_the_pyinit_exporters(tmp_path):
    site = build(tmp_path)
    inv = installed_wheels([str(site)], reader=read_elf)
    mods = {lib.pyinit for _, lib in extension_modules(inv)}
    assert mods == {"PyInit__C", "PyInit__other"}


def test_clean_layout_only_infos(tmp_path):
    site = build(tmp_path)
    inv, resolver, found = run(site)
    assert not [f for f in found if f.failing], [f.render() for f in found]
    infos = {f.subject: f for f in found}
    # the driver's libcuda.so.1 is absent on a build machine: a fact, not a failure
    driver = next(f for f in found if f.subject == "libcuda.so.1")
    assert driver.severity is Severity.INFO
    assert "provided by the NVIDIA driver" in driver.message
    plugin = infos["torchish 1.0"]
    assert plugin.severity is Severity.INFO
    assert "torchish/lib/libplugin.so needs libfabric.so.1" in plugin.details
    assert plugin.message.endswith("needs sonames not found here")  # libfabric is installed nowhere
    # owners come from the inventory
    (mt, *_) = module_trees(inv, resolver)
    providers = {lib.soname: lib.provider for lib in mt.tree.libraries}
    assert providers["libnccl.so.2"] == "nvidia-nccl-cu13 2.30.7"


def test_every_missing_soname_at_once(tmp_path):
    site = build(tmp_path)
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    (site / "nvidia/cudnn/lib/libcudnn.so.9").unlink()
    _, _, found = run(site)
    # one cause (RECORD-listed files gone), one finding, one fix naming every soname
    (f,) = [f for f in found if f.failing]
    assert f.subject == "libcudnn.so.9, libnccl.so.2"
    assert f.message.startswith("2 sonames are not found: libcudnn.so.9, libnccl.so.2; ")
    assert f.chain == (f"torchish/{EXT}", "torchish/lib/libtorch_x.so")
    chain = f"torchish/{EXT} -> torchish/lib/libtorch_x.so"
    assert (
        f"libnccl.so.2: needed by {chain}; "
        "nvidia-nccl-cu13 2.30.7 lists nvidia/nccl/lib/libnccl.so.2 but the file is gone"
    ) in f.details
    assert any(d.startswith("libcudnn.so.9: ") and "nvidia-cudnn-cu13 9.24.0.43 lists" in d for d in f.details)
    assert f"module: torchish/{EXT}" in f.details
    assert "module: torchish/_other.abi3.so" in f.details
    assert "from 2 extension module(s) of torchish 1.0" in f.message
    assert "nvidia/nccl/lib" in f.where
    assert f.fix == "pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43 nvidia-nccl-cu13==2.30.7"


def test_one_missing_soname_keeps_its_own_finding(tmp_path):
    site = build(tmp_path)
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    _, _, found = run(site)
    (nccl,) = [f for f in found if f.failing]
    assert nccl.subject == "libnccl.so.2"
    assert nccl.chain == (f"torchish/{EXT}", "torchish/lib/libtorch_x.so")
    assert nccl.cause == "nvidia-nccl-cu13 2.30.7 lists nvidia/nccl/lib/libnccl.so.2 but the file is gone"
    assert "pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7" in nccl.fix


def test_missing_with_no_claimant(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "m", "1", {"m/_m.so": compile_so(None, pyinit="_m", needed=["libnowhere.so.7"])})
    _, _, found = run(site)
    (f,) = found
    assert f.failing
    assert "no installed distribution ships it" in f.cause


def test_shipped_but_not_on_the_search_path(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "m", "1", {"m/_m.so": compile_so(None, pyinit="_m", needed=["libelsewhere.so.1"])})
    write_dist(site, "other", "2", {"other/lib/libelsewhere.so.1": compile_so("libelsewhere.so.1")})
    _, _, found = run(site)
    (f,) = found
    assert "other 2 ships it at other/lib/libelsewhere.so.1, but that directory is not on the search path" in f.cause


def test_a_so_that_is_not_an_elf_is_not_a_module(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "m", "1", {"m/_bad.so": "not an elf"})
    _, _, found = run(site)
    assert found == ()


def test_optional_library_needing_only_installed_sonames_says_so(tmp_path):
    """An optional library whose missing soname is installed (found once what ships it is loaded, as
    cuSOLVER's needing libnvJitLink): not "not found here", and the fix installs nothing."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "pkg",
        "1.0",
        {
            f"pkg/{EXT}": compile_so(None, pyinit="_C"),
            "pkg/lib/libopt.so": compile_so("libopt.so", needed=["libjit.so.13"]),
            "other/lib/libjit.so.13": compile_so("libjit.so.13"),
        },
    )
    _, _, found = run(site)
    (opt,) = [f for f in found if f.subject == "pkg 1.0"]
    assert "each is installed here and is found when what ships it is already loaded" in opt.message
    assert "not found here" not in opt.message
    assert opt.fix.startswith("nothing to install")
    assert any("shipped by pkg 1.0" in d for d in opt.details)


def test_the_consumer_is_a_distribution_key_and_the_count_is_in_the_message(tmp_path):
    """Facts.consumer means one thing (the needing object's distribution); the grouped message says how many
    extension modules need the soname, counted from ``objects``."""
    site = build(tmp_path)
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    _inv, _resolver, found = run(site)
    (err,) = [f for f in found if f.failing]
    assert err.facts.consumer == "torchish"
    assert len(err.facts.objects) == 2
    assert err.message == (
        "libnccl.so.2 is not found: needed by torchish/lib/libtorch_x.so (from 2 extension module(s) of torchish 1.0)"
    )
    (site / "nvidia/cudnn/lib/libcudnn.so.9").unlink()
    _inv, _resolver, found = run(site)
    (grouped,) = [f for f in found if f.failing]
    assert grouped.facts.consumer is None
    assert grouped.message.endswith(
        "; the first needed by torchish/lib/libtorch_x.so (from 2 extension module(s) of torchish 1.0)"
    )


# -- a soname installed outside the search ------------------------------------------------------------------------


def _outside(tmp_path: Path, *, shadow: bool = False) -> Path:
    """``fftish``'s module needs libfftx.so.3, which the ``fftx-lib`` wheel installs in ``vendor/cu9/lib``,
    outside the module's RUNPATH. ``shadow``: that directory also holds a libcore.so.1 of its own, while the
    ``other`` package's module loads libcore.so.1 from its own directory."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "fftish",
        "3.1",
        {"fftish/_fft.abi3.so": compile_so(None, pyinit="_fft", needed=["libfftx.so.3"], runpath="$ORIGIN")},
    )
    libs = {"vendor/cu9/lib/libfftx.so.3": compile_so("libfftx.so.3")}
    if shadow:
        libs["vendor/cu9/lib/libcore.so.1"] = compile_so("libcore.so.1", payload="vendor build")
    write_dist(site, "fftx-lib", "9.2.0", libs)
    write_dist(
        site,
        "other",
        "1.0",
        {
            "other/_o.abi3.so": compile_so(None, pyinit="_o", needed=["libcore.so.1"], runpath="$ORIGIN/lib"),
            "other/lib/libcore.so.1": compile_so("libcore.so.1"),
        },
    )
    return site


def test_a_soname_installed_outside_the_search_gets_a_checked_search_path_step(tmp_path):
    site = _outside(tmp_path)
    inv, _resolver, found = run(site)
    (err,) = [f for f in found if f.failing]
    directory = str(site / "vendor/cu9/lib")
    step = err.remedies[0]
    assert isinstance(step, SearchPath)
    assert (step.directory, step.op, step.path) == (directory, "prepend", "LD_LIBRARY_PATH")
    assert step.why.startswith("checked: ")
    (plan,) = plan_repairs(found, inv)
    assert plan.steps[0].action == step
    assert plan.steps[0].resolves == (err.id,)
    assert "decide which of the distributions" not in plan.render()
    # the oracle: the module loads with that entry, and not without
    code = f"import ctypes; ctypes.CDLL({str(site / 'fftish/_fft.abi3.so')!r})"
    assert subprocess.run([sys.executable, "-c", code], env={}, capture_output=True).returncode != 0
    ok = subprocess.run([sys.executable, "-c", code], env={"LD_LIBRARY_PATH": directory}, capture_output=True)
    assert ok.returncode == 0, ok.stderr


def test_a_search_path_step_that_would_move_another_library_is_not_offered(tmp_path):
    """The directory also holds another build of a library another module loads from elsewhere: putting it
    first on LD_LIBRARY_PATH would load that build instead, so no search-path step is offered."""
    _inv, _resolver, found = run(_outside(tmp_path, shadow=True))
    (err,) = [f for f in found if f.failing]
    assert not any(isinstance(r, SearchPath) for r in err.remedies)


def test_no_search_path_step_to_a_copy_of_another_cuda_major(tmp_path):
    """A CUDA 12 package's module needs libcusparse.so.12, which only the CUDA 13 wheel installs (outside its
    search): putting that directory on LD_LIBRARY_PATH would load the CUDA 13 build into it."""
    site = site_packages(tmp_path / "venv")
    ops = compile_so(None, pyinit="_ops", needed=["libcusparse.so.12"], runpath="$ORIGIN")
    write_dist(site, "kernelish-cu12", "0.3.0", {"kernelish/_ops.abi3.so": ops})
    write_dist(
        site, "nvidia-cusparse", "12.6.3.3", {"nvidia/cu13/lib/libcusparse.so.12": compile_so("libcusparse.so.12")}
    )
    _inv, _resolver, found = run(site)
    (err,) = [f for f in found if f.failing]
    assert not any(isinstance(r, SearchPath) for r in err.remedies)
    # the same layout with the CUDA 12 wheel's copy: the checked step
    site2 = site_packages(tmp_path / "venv2")
    write_dist(site2, "kernelish-cu12", "0.3.0", {"kernelish/_ops.abi3.so": ops})
    write_dist(
        site2, "nvidia-cusparse-cu12", "12.5.8.93", {"vendor/lib/libcusparse.so.12": compile_so("libcusparse.so.12")}
    )
    _inv, _resolver, found = run(site2)
    (err,) = [f for f in found if f.failing]
    assert isinstance(err.remedies[0], SearchPath)
