"""The ``dlopen`` check's severity by library family and its run-time chains, on gcc-built stand-ins, each
rule with a clean twin (the same layout repaired gives no error):

* a name that resolves nowhere while its family is installed out of the caller's reach (or only under another
  name): a WARNING (the name is in the caller's data, evidence and not proof) naming where the family is, why
  the search misses it, and the remedy;
* several names of one family in a caller's data (a candidate list): an error only when none resolves;
* a name that resolves to another copy than the one its caller's own distribution or pin ships, of another
  version (an older cuDNN on LD_LIBRARY_PATH): ERROR naming both copies, both versions and the route; not
  when the process already maps the right copy;
* chains: cuDNN 8's ``libcudnn.so.8`` opens ``libcudnn_cnn_infer.so.8``, which opens ``libnvrtc.so``; the
  object opened brings its own DT_NEEDED; errors judged by whether an import maps the chain's first object.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack.checks.dlopen import dlopen_findings
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Finding, Manual, SearchPath, Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.strings import read_strings
from pytest_cudastack.model.modules import module_trees
from pytest_cudastack.model.runtime import family
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.elfbuild import link_args
from tests.helpers.sitebuild import CC, HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

EXT = "_C.cpython-311-x86_64-linux-gnu.so"
_built: dict[tuple[Any, ...], bytes] = {}


def so(
    soname: str | None,
    *,
    names: Sequence[str] = (),
    needed: Sequence[str] = (),
    rpath: str | None = None,
    runpath: str | None = None,
    pyinit: str | None = None,
) -> bytes:
    """A shared object whose read-only data holds each of ``names`` (what it may dlopen), linked against
    stubs for ``needed`` (DT_NEEDED in order)."""
    key = (soname, tuple(names), tuple(needed), rpath, runpath, pyinit)
    if key in _built:
        return _built[key]
    assert CC is not None
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "x.c"
        body = ["int cudastack_func(void) { return 42; }"]
        if names:
            body.append("const char *cudastack_names[] = {" + ", ".join(f'"{n}"' for n in names) + "};")
        if pyinit:
            body.append(f"void *PyInit_{pyinit}(void) {{ return 0; }}")
        src.write_text("\n".join(body) + "\n")
        stubs = []
        for n in needed:
            stub = Path(d) / "stubs" / n
            stub.parent.mkdir(exist_ok=True)
            subprocess.run(
                [CC, "-shared", "-fPIC", "-o", str(stub), f"-Wl,-soname,{n}", str(src)], check=True, capture_output=True
            )
            stubs.append(stub)
        out = Path(d) / "out.so"
        args = ["-shared", "-fPIC", "-o", str(out), str(src), *link_args(soname, stubs, rpath, runpath, ())]
        subprocess.run([CC, *args], check=True, capture_output=True)
        _built[key] = out.read_bytes()
    return _built[key]


def check(site: Path, llp: Sequence[str] = ()) -> list[Finding]:
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig(default_dirs=(), ld_library_path=tuple(llp)), reader=read_elf, owner=inv.owner)
    return list(dlopen_findings(inv, resolver, read_elf, read_strings, module_trees(inv, resolver)))


def failing(found: Sequence[Finding]) -> list[Finding]:
    return [f for f in found if f.severity is not Severity.INFO]


def put(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------------------------------- family installed


def _plugin_site(tmp_path: Path, *, reach: bool, names: Sequence[str] = ("libfoo_plugin.so.2",)) -> Path:
    """pkg's helper (loaded at import) may open ``names``; libfoo_plugin.so.2 is installed by another
    distribution in its own directory, on the helper's RUNPATH only when ``reach``."""
    site = site_packages(tmp_path / "venv")
    runpath = "$ORIGIN:$ORIGIN/../fooplug/lib" if reach else "$ORIGIN"
    write_dist(
        site,
        "pkg",
        "1.0",
        {
            f"pkg/{EXT}": compile_so(None, pyinit="_C", needed=["libhelper.so.1"], rpath="$ORIGIN"),
            "pkg/libhelper.so.1": so("libhelper.so.1", names=names, runpath=runpath),
        },
    )
    write_dist(site, "fooplug", "2.3", {"fooplug/lib/libfoo_plugin.so.2": so("libfoo_plugin.so.2")})
    return site


def test_family_installed_out_of_reach_is_a_warning_naming_where_why_and_the_remedy(tmp_path: Path):
    site = _plugin_site(tmp_path, reach=False)
    (f,) = failing(check(site))
    # only the helper's data names it: evidence of a feature that may open it, never an ERROR alone
    assert f.severity is Severity.WARNING
    assert "only the feature of pkg/libhelper.so.1 that opens it fails, if it is used" in f.message
    assert f.subject == "libfoo_plugin.so.2"
    assert "loaded at run time (dlopen) by pkg/libhelper.so.1" in f.message
    assert "libfoo_plugin is installed: fooplug/lib/libfoo_plugin.so.2 (fooplug 2.3) has that name" in f.cause
    assert "does not reach" in f.cause
    (remedy,) = f.remedies
    assert isinstance(remedy, SearchPath)
    assert (remedy.directory, remedy.op, remedy.path) == (str(site / "fooplug/lib"), "prepend", "LD_LIBRARY_PATH")
    assert f.facts.required == "libfoo_plugin.so.2"
    assert f.facts.objects == (str(site / "pkg/libhelper.so.1"), str(site / "fooplug/lib/libfoo_plugin.so.2"))
    assert f.facts.versions == ((str(site / "fooplug/lib/libfoo_plugin.so.2"), "2.3"),)
    # the remedy, applied, repairs it
    assert not failing(check(site, llp=[remedy.directory]))


def test_family_installed_in_reach_clean_twin(tmp_path: Path):
    assert not failing(check(_plugin_site(tmp_path, reach=True)))


def test_family_not_installed_is_info(tmp_path: Path):
    site = _plugin_site(tmp_path, reach=False, names=("libbar_plugin.so.2",))
    found = check(site)
    assert not failing(found)
    (info,) = [f for f in found if "may load at run time" in f.message]
    assert "pkg/libhelper.so.1 may load libbar_plugin.so.2 (not found)" in info.details


def test_family_only_at_another_major_is_a_warning_naming_it(tmp_path: Path):
    site = _plugin_site(tmp_path, reach=True, names=("libfoo_plugin.so.3",))
    (f,) = failing(check(site))
    assert f.severity is Severity.WARNING
    assert "fooplug/lib/libfoo_plugin.so.2 (fooplug 2.3) is libfoo_plugin as libfoo_plugin.so.2" in f.cause
    assert isinstance(f.remedies[0], Manual)


# ------------------------------------------------------------------------------------------- candidate lists


def test_candidate_list_fails_only_when_no_name_resolves(tmp_path: Path):
    # libfoo_plugin.so.3 first, then .so.2 (in reach): the caller's second candidate loads
    site = _plugin_site(tmp_path / "a", reach=True, names=("libfoo_plugin.so.3", "libfoo_plugin.so.2"))
    assert not failing(check(site))
    # neither in reach: one error for the family, not one per name
    site = _plugin_site(tmp_path / "b", reach=False, names=("libfoo_plugin.so.3", "libfoo_plugin.so.2"))
    (f,) = failing(check(site))
    assert f.subject == "libfoo_plugin.so.3"


# ------------------------------------------------------------------------------------------- wrong copies


CUDNN9 = ["graph", "ops", "cnn", "adv", "engines_precompiled", "engines_runtime_compiled", "heuristic"]


def _cudnn9_site(tmp_path: Path, *, preload: bool = False) -> Path:
    """A torch-like extension linking the cuDNN 9 shim of nvidia-cudnn-cu13 9.24.0.43, whose libraries'
    RUNPATH is ``$ORIGIN`` (LD_LIBRARY_PATH comes first); ``preload``: the extension also links every
    sub-library, so the process maps the wheel's copies before the shim opens them."""
    site = site_packages(tmp_path / "venv")
    needed = ["libcudnn.so.9", *(f"libcudnn_{s}.so.9" for s in CUDNN9)] if preload else ["libcudnn.so.9"]
    write_dist(
        site,
        "torchish",
        "1.0",
        {f"torchish/{EXT}": so(None, pyinit="_C", needed=needed, runpath="$ORIGIN/../nvidia/cudnn/lib")},
        requires=["nvidia-cudnn-cu13==9.24.0.43"],
    )
    files = {"nvidia/cudnn/lib/libcudnn.so.9": so("libcudnn.so.9", runpath="$ORIGIN")}
    files.update({f"nvidia/cudnn/lib/libcudnn_{s}.so.9": so(f"libcudnn_{s}.so.9", runpath="$ORIGIN") for s in CUDNN9})
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43", files)
    return site


def _old_cudnn(tmp_path: Path, version: str) -> Path:
    """A toolkit-style cuDNN directory: each sub-library as libcudnn_X.so.9 -> libcudnn_X.so.VERSION."""
    d = tmp_path / "opt/cudnn/lib"
    for s in CUDNN9:
        put(d / f"libcudnn_{s}.so.{version}", so(f"libcudnn_{s}.so.9", names=("old",)))
        os.symlink(f"libcudnn_{s}.so.{version}", d / f"libcudnn_{s}.so.9")
    return d


def test_older_copy_on_ld_library_path_is_an_error_naming_both(tmp_path: Path):
    site = _cudnn9_site(tmp_path)
    old = _old_cudnn(tmp_path, "9.19.0")
    found = failing(check(site, llp=[str(old)]))
    # each sub-library the wheel's shim opens comes from the older directory (and what those open is theirs)
    assert sorted(f.subject for f in found) == sorted(f"libcudnn_{s}.so.9" for s in ("graph", "ops", "cnn", "adv"))
    (f,) = [f for f in found if f.subject == "libcudnn_graph.so.9"]
    assert f.severity is Severity.ERROR
    assert f"is {old}/libcudnn_graph.so.9 (version 9.19.0), not nvidia/cudnn/lib/libcudnn_graph.so.9" in f.message
    assert "(nvidia-cudnn-cu13 9.24.0.43)" in f.message
    assert f.cause.startswith("found by LD_LIBRARY_PATH")
    assert f.facts.versions == (
        (f"{old}/libcudnn_graph.so.9", "9.19.0"),
        (str(site / "nvidia/cudnn/lib/libcudnn_graph.so.9"), "9.24.0.43"),
    )
    (remedy,) = f.remedies
    assert isinstance(remedy, SearchPath)
    assert (remedy.directory, remedy.op) == (str(old), "remove")
    # clean twins: no LD_LIBRARY_PATH; the same version there; the process already maps the wheel's copy
    assert not failing(check(site))


def test_same_version_on_ld_library_path_clean_twin(tmp_path: Path):
    site = _cudnn9_site(tmp_path)
    assert not failing(check(site, llp=[str(_old_cudnn(tmp_path, "9.24.0"))]))


def test_right_copy_already_mapped_clean_twin(tmp_path: Path):
    """glibc returns the object already loaded by that SONAME: the older copy on LD_LIBRARY_PATH is never
    opened (torch preloads its cuDNN by path for this reason)."""
    site = _cudnn9_site(tmp_path, preload=True)
    assert not failing(check(site, llp=[str(_old_cudnn(tmp_path, "9.19.0"))]))


def test_pinned_distribution_copy_beaten_by_ld_library_path(tmp_path: Path):
    """The caller's own distribution does not ship the names it opens; the one it requires (its pin) does:
    a package bundling the cuDNN shim over nvidia-cudnn-cu13's sub-libraries."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "bundler",
        "1.0",
        {
            f"bundler/{EXT}": so(None, pyinit="_C", needed=["libcudnn.so.9"], runpath="$ORIGIN/lib"),
            "bundler/lib/libcudnn.so.9": so("libcudnn.so.9", runpath="$ORIGIN/../../nvidia/cudnn/lib"),
        },
        requires=["nvidia-cudnn-cu13==9.24.0.43"],
    )
    subs = {f"nvidia/cudnn/lib/libcudnn_{s}.so.9": so(f"libcudnn_{s}.so.9", runpath="$ORIGIN") for s in CUDNN9}
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43", subs)
    assert not failing(check(site))
    old = _old_cudnn(tmp_path, "9.19.0")
    found = [f for f in failing(check(site, llp=[str(old)])) if f.subject == "libcudnn_ops.so.9"]
    assert [f.severity for f in found] == [Severity.ERROR]
    assert "(version 9.19.0), not nvidia/cudnn/lib/libcudnn_ops.so.9 (nvidia-cudnn-cu13 9.24.0.43)" in found[0].message


def test_name_in_data_on_another_copy_is_info(tmp_path: Path):
    """A name found only in a caller's data may be opened by a full path instead (triton's proton opens its
    own libcupti.so so): another copy on the search is reported, as a fact."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "jitpkg",
        "1.0",
        {f"jitpkg/{EXT}": so(None, pyinit="_C", names=("libnvjitlink.so.13",), runpath="$ORIGIN/../nvidia/cu13/lib")},
        requires=["nvidia-nvjitlink==13.0.88"],
    )
    write_dist(site, "nvidia-nvjitlink", "13.0.88", {"nvidia/cu13/lib/libnvjitlink.so.13": so("libnvjitlink.so.13")})
    old = tmp_path / "cuda/lib64"
    put(old / "libnvjitlink.so.13.0.39", so("libnvjitlink.so.13", names=("old",)))
    os.symlink("libnvjitlink.so.13.0.39", old / "libnvjitlink.so.13")
    found = check(site, llp=[str(old)])
    assert not failing(found)
    (f,) = [f for f in found if f.subject == "libnvjitlink.so.13"]
    assert "(version 13.0.39), not nvidia/cu13/lib/libnvjitlink.so.13 (nvidia-nvjitlink 13.0.88)" in f.message


# ------------------------------------------------------------------------------------------- run-time chains


def _cudnn8_site(tmp_path: Path, *, dev_link: bool, init: str | None = None, cublas: bool = True) -> Path:
    """The torch 2.0 cu118 layout: the extension links libcudnn.so.8 (nvidia-cudnn-cu11), whose shim opens
    libcudnn_cnn_infer.so.8 at run time, which opens the unversioned libnvrtc.so; nvidia-cuda-nvrtc-cu11
    ships libnvrtc.so.11.2 only (``dev_link``: and a libnvrtc.so link beside it, which only LD_LIBRARY_PATH
    reaches: the sub-library has no loader whose RPATH would)."""
    site = site_packages(tmp_path / "venv")
    rpath = "$ORIGIN/../nvidia/cudnn/lib:$ORIGIN/../nvidia/cuda_nvrtc/lib:$ORIGIN/../nvidia/cublas/lib"
    files: dict[str, bytes | str] = {f"torchish/{EXT}": so(None, pyinit="_C", needed=["libcudnn.so.8"], rpath=rpath)}
    if init is not None:
        files["torchish/__init__.py"] = init
    write_dist(site, "torchish", "2.0.1", files)
    subs = ["ops_infer", "ops_train", "cnn_infer", "cnn_train", "adv_infer", "adv_train"]
    cudnn = {"nvidia/cudnn/lib/libcudnn.so.8": so("libcudnn.so.8")}
    cudnn.update({f"nvidia/cudnn/lib/libcudnn_{s}.so.8": so(f"libcudnn_{s}.so.8") for s in subs})
    # an object dlopen maps has no loader: its own RPATH finds its dependencies, as the wheels' do
    cudnn["nvidia/cudnn/lib/libcudnn_cnn_infer.so.8"] = so(
        "libcudnn_cnn_infer.so.8", needed=["libcublasLt.so.11"], rpath="$ORIGIN:$ORIGIN/../../cublas/lib"
    )
    write_dist(site, "nvidia-cudnn-cu11", "8.5.0.96", cudnn)
    if cublas:
        write_dist(
            site, "nvidia-cublas-cu11", "11.10.3.66", {"nvidia/cublas/lib/libcublasLt.so.11": so("libcublasLt.so.11")}
        )
    write_dist(
        site, "nvidia-cuda-nvrtc-cu11", "11.7.99", {"nvidia/cuda_nvrtc/lib/libnvrtc.so.11.2": so("libnvrtc.so.11.2")}
    )
    if dev_link:
        os.symlink("libnvrtc.so.11.2", site / "nvidia/cuda_nvrtc/lib/libnvrtc.so")
    return site


def test_cudnn8_chain_unversioned_nvrtc_is_an_error_through_the_chain(tmp_path: Path):
    site = _cudnn8_site(tmp_path, dev_link=False)
    (f,) = failing(check(site))
    assert f.severity is Severity.ERROR
    assert f.subject == "libnvrtc.so"
    assert "by nvidia/cudnn/lib/libcudnn_cnn_infer.so.8" in f.message
    assert "judged alone" not in f.message
    # the chain, root first: the shim an import maps, then the sub-library it opened at run time
    cudnn = str(site / "torchish/../nvidia/cudnn/lib")
    assert f.chain == (f"{cudnn}/libcudnn.so.8", f"{cudnn}/libcudnn_cnn_infer.so.8")
    assert "libnvrtc is installed: nvidia/cuda_nvrtc/lib/libnvrtc.so.11.2 (nvidia-cuda-nvrtc-cu11 11.7.99)" in f.cause
    assert "not the name libnvrtc.so opened" in f.cause
    assert "sdnext-539" in f.details[0]


def test_cudnn8_chain_clean_twin(tmp_path: Path):
    site = _cudnn8_site(tmp_path, dev_link=True)
    (f,) = failing(check(site))  # the link is there, out of the search: its directory is the remedy
    (remedy,) = f.remedies
    assert isinstance(remedy, SearchPath)
    assert remedy.directory == str(site / "nvidia/cuda_nvrtc/lib")
    assert not failing(check(site, llp=[remedy.directory]))


def test_object_opened_at_run_time_brings_its_dt_needed(tmp_path: Path):
    site = _cudnn8_site(tmp_path, dev_link=True, cublas=False)
    (f,) = failing(check(site, llp=[str(site / "nvidia/cuda_nvrtc/lib")]))
    assert f.subject == "libcudnn_cnn_infer.so.8"
    assert "cannot be loaded: it needs libcublasLt.so.11, not found" in f.message
    assert "by nvidia/cudnn/lib/libcudnn.so.8" in f.message


def _stack_dlopen(tmp_path: Path, site: Path) -> list[Finding]:
    driver = DriverInfo("declared", "580.65.06", "13.0", archs=("sm_90",), arch_source="declared")
    stack = Stack(Settings(cudastack=True), driver_info=driver, rootdir=str(tmp_path), site_paths=(str(site),))
    return [f for f in stack.findings("dlopen") if f.subject == "libnvrtc.so"]


def test_chain_error_kept_when_an_import_maps_its_first_object(tmp_path: Path):
    found = _stack_dlopen(tmp_path, _cudnn8_site(tmp_path, dev_link=False, init="from torchish import _C\n"))
    assert [f.severity for f in found] == [Severity.ERROR]
    assert "reached by `import torchish` (the top-level import of torchish 2.0.1)" in found[0].details


def test_chain_error_a_warning_naming_the_import_when_none_maps_it(tmp_path: Path):
    found = _stack_dlopen(tmp_path, _cudnn8_site(tmp_path, dev_link=False, init=""))
    assert [f.severity for f in found] == [Severity.WARNING]
    assert found[0].message.startswith("after `import torchish._C`: libnvrtc.so is not found")


@pytest.mark.parametrize(
    ("name", "fam"),
    [
        ("libcudnn_graph.so.9", "libcudnn_graph"),
        ("libcudnn_graph.so", "libcudnn_graph"),
        ("libnvrtc-builtins.so.13.0", "libnvrtc-builtins"),
        ("libnvrtc.so.11.2", "libnvrtc"),
        ("/x/y/libcublasLt.so.12", "libcublasLt"),
    ],
)
def test_family_is_the_name_before_so(name: str, fam: str):
    assert family(name) == fam


def test_a_cycle_of_run_time_loads_ends(tmp_path: Path):
    """A opens B, B opens C, C opens B again (already mapped): each object is judged once."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "pkg",
        "1.0",
        {
            f"pkg/{EXT}": compile_so(None, pyinit="_C", needed=["libcsa.so.1"], rpath="$ORIGIN"),
            "pkg/libcsa.so.1": so("libcsa.so.1", names=("libcsb.so.1",), rpath="$ORIGIN"),
            "pkg/libcsb.so.1": so("libcsb.so.1", names=("libcsc.so.1", "libcsa.so.1"), rpath="$ORIGIN"),
            "pkg/libcsc.so.1": so("libcsc.so.1", names=("libcsb.so.1", "libcsd.so.4"), rpath="$ORIGIN"),
            "pkg/libcsd.so.3": so("libcsd.so.3"),
        },
    )
    (f,) = failing(check(site))  # C wants libcsd.so.4; only libcsd.so.3 is installed
    assert f.subject == "libcsd.so.4"
    assert [os.path.basename(p) for p in f.chain] == ["libcsa.so.1", "libcsb.so.1", "libcsc.so.1"]


def test_a_name_the_import_opened_an_object_as_is_that_object(tmp_path: Path):
    """glibc matches a dlopen's name against the names loaded objects were opened as (``l_libname``): the
    extension's DT_NEEDED ``libcsplug.so`` (a library without SONAME, found through the extension's RPATH)
    answers the helper's dlopen of that name, though the helper's own search (its RUNPATH: no RPATH chain)
    would not find it."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "pkg",
        "1.0",
        {
            f"pkg/{EXT}": so(
                None, pyinit="_C", needed=["libhelper.so.1", "libcsplug.so"], rpath="$ORIGIN:$ORIGIN/plug"
            ),
            "pkg/libhelper.so.1": so("libhelper.so.1", names=("libcsplug.so",), runpath="$ORIGIN"),
            "pkg/plug/libcsplug.so": so(None),
        },
    )
    assert not failing(check(site))


def _other_venvs_cudnn(tmp_path: Path, *, same: bool) -> Path:
    """Another venv's nvidia-cudnn wheel on LD_LIBRARY_PATH: files named by their soname only (libcudnn_X.so.9),
    no dist-info this check reads; ``same``: byte-identical to the checked venv's copies."""
    d = tmp_path / "other-venv/lib/python3.11/site-packages/nvidia/cudnn/lib"
    for s in CUDNN9:
        data = so(f"libcudnn_{s}.so.9", runpath="$ORIGIN") if same else so(f"libcudnn_{s}.so.9", names=("cu12",))
        put(d / f"libcudnn_{s}.so.9", data)
    return d


def test_another_venvs_cudnn_on_ld_library_path_is_a_warning_naming_both_copies(tmp_path: Path):
    # pytorch/pytorch#188892, #185512: cuDNN sub-libraries of another install through the loader path ->
    # CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH at the first convolution. Its file names give no release (a
    # wheel's .so.9): it was taken for the same version ("9" agrees with 9.24.0.43) and nothing was said
    site = _cudnn9_site(tmp_path)
    other = _other_venvs_cudnn(tmp_path, same=False)
    found = failing(check(site, llp=[str(other)]))
    (f,) = [f for f in found if f.subject == "libcudnn_graph.so.9"]
    assert f.severity is Severity.WARNING  # its release is unknown: not claimed to differ
    assert f"is {other}/libcudnn_graph.so.9 (version unknown), not nvidia/cudnn/lib/libcudnn_graph.so.9" in f.message
    assert "(nvidia-cudnn-cu13 9.24.0.43)" in f.message
    (remedy,) = f.remedies
    assert isinstance(remedy, SearchPath)
    assert (remedy.directory, remedy.op) == (str(other), "remove")


def test_another_path_to_identical_cudnn_copies_clean_twin(tmp_path: Path):
    site = _cudnn9_site(tmp_path)
    assert not failing(check(site, llp=[str(_other_venvs_cudnn(tmp_path, same=True))]))
