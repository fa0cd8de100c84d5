"""A run-time load is judged in the process that makes it (issue 33): what the import has mapped by then.

glibc's ``dlopen(name)`` first compares ``name`` with every loaded object's names (the name it was opened
as, its DT_SONAME, its path: ``_dl_map_object``'s first loop) and returns the match without a search. So a
library that a package's import maps (torch's ``__init__`` preloads NVRTC by path) satisfies a later
``dlopen("libnvrtc.so.12")`` of a library that cannot find it by its own search (cuDNN's engines).

Each case builds a real package with gcc: ``pkg/_C`` (a CPython extension module) needs ``libhelper.so.1``,
whose ``cudastack_try(name)`` calls ``dlopen(name)`` and whose read-only data names ``libdep.so.7``;
``libdep.so.7`` lies in another distribution's directory that no search of libhelper reaches. In the
healthy layout ``pkg/__init__.py`` first imports ``pkg._dep``, an extension module whose RPATH finds
``libdep.so.7``: after ``import pkg`` it is mapped. Its twin imports only ``pkg._C``. The oracle is the real
thing: a child Python that imports ``pkg`` and then calls libhelper's ``cudastack_try("libdep.so.7")``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from pytest_cudastack.checks.dlopen import dlopen_findings
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.ldcache import LdCache, read_ld_cache
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.strings import read_strings
from pytest_cudastack.model.modules import module_trees
from pytest_cudastack.model.process import ImportScope, Interpreter, import_scopes
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.elfbuild import link_args
from tests.helpers.sitebuild import CC, HAVE_CC, site_packages, write_dist

HEADERS = sysconfig.get_paths()["include"]
pytestmark = pytest.mark.skipif(
    not (HAVE_CC and os.path.isfile(os.path.join(HEADERS, "Python.h"))), reason="needs a C compiler and Python.h"
)

SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
DEP = "libdep.so.7"

MODULE_C = r"""
#include <Python.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "%(name)s", 0, -1, 0};
PyMODINIT_FUNC PyInit_%(name)s(void) { return PyModule_Create(&def); }
"""

HELPER_C = r"""
#include <dlfcn.h>
#include <stdio.h>
const char *cudastack_names[] = {"%(names)s"};
int cudastack_try(const char *name) {
    void *h = dlopen(name, RTLD_NOW);
    if (!h) { printf("FAIL %%s\n", dlerror()); return 1; }
    printf("OK\n");
    return 0;
}
"""


def _build(out: Path, source: str, *args: str, needed: tuple[Path, ...] = (), rpath: str | None = None) -> Path:
    assert CC is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(out.name + ".c")
    src.write_text(source)
    link = link_args(None, needed, rpath, None, ())
    subprocess.run([CC, "-shared", "-fPIC", *args, "-o", str(out), str(src), *link], check=True, capture_output=True)
    return out


def _lib(out: Path, soname: str, source: str = "int cudastack_dep(void) { return 7; }\n", **kw: object) -> Path:
    return _build(out, source, f"-Wl,-soname,{soname}", **kw)  # type: ignore[arg-type]


def _module(out: Path, name: str, **kw: object) -> Path:
    return _build(out, MODULE_C % {"name": name}, f"-I{HEADERS}", **kw)  # type: ignore[arg-type]


def _site(tmp_path: Path, *, preimport: bool, name: str = DEP) -> Path:
    """The package (module docstring); ``preimport``: whether ``pkg/__init__.py`` imports ``pkg._dep`` first."""
    work = tmp_path / "build"
    dep = _lib(work / name, name)
    helper = _lib(work / "libhelper.so.1", "libhelper.so.1", HELPER_C % {"names": name}, rpath="$ORIGIN")
    mod_c = _module(work / f"_C{SUFFIX}", "_C", needed=(helper,), rpath="$ORIGIN")
    mod_dep = _module(work / f"_dep{SUFFIX}", "_dep", needed=(dep,), rpath="$ORIGIN/../depdist/lib")
    site = site_packages(tmp_path / "venv", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    init = ("import pkg._dep\n" if preimport else "") + "import pkg._C\n"
    write_dist(
        site,
        "pkg",
        "1.0",
        {
            "pkg/__init__.py": init,
            f"pkg/_C{SUFFIX}": mod_c.read_bytes(),
            f"pkg/_dep{SUFFIX}": mod_dep.read_bytes(),
            "pkg/libhelper.so.1": helper.read_bytes(),
        },
    )
    write_dist(site, "depdist", "7.1", {f"depdist/lib/{name}": dep.read_bytes()})
    return site


def _real(site: Path, name: str = DEP) -> str:
    """What the real process says: ``import pkg``, then libhelper's dlopen of ``name``."""
    code = (
        "import ctypes, pkg, sys; "
        f"sys.exit(ctypes.CDLL({str(site / 'pkg/libhelper.so.1')!r}).cudastack_try({name.encode()!r}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    return done.stdout.split()[0] if done.stdout else f"rc {done.returncode}: {done.stderr[-300:]}"


def _ours(site: Path, cache: LdCache | None = None) -> list[Finding]:
    """The dlopen check's failing findings, each caller judged in its import's process (``cache``: the
    ld.so.cache the search reads; none by default)."""
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig(default_dirs=(), ld_cache=cache), reader=read_elf, owner=inv.owner)
    trees = module_trees(inv, resolver)
    interp = Interpreter.for_sites(inv.site_dirs)

    def scopes(modules: Sequence[str]) -> Mapping[str, ImportScope]:
        return import_scopes(modules, interp, resolver, read_elf, inv.owner)

    found = dlopen_findings(inv, resolver, read_elf, read_strings, trees, scopes)
    return [f for f in found if f.severity is not Severity.INFO]


@pytest.mark.parametrize("name", [DEP, "libother_dep.so.12"], ids=["libdep.so.7", "libother_dep.so.12"])
def test_a_library_the_import_mapped_satisfies_a_later_dlopen_by_bare_name(tmp_path: Path, name: str):
    site = _site(tmp_path, preimport=True, name=name)
    assert _real(site, name) == "OK"  # glibc: the loaded object's soname matches, no search
    assert _ours(site) == []


@pytest.mark.parametrize("name", [DEP, "libother_dep.so.12"], ids=["libdep.so.7", "libother_dep.so.12"])
def test_twin_where_nothing_mapped_it_fails_and_is_said(tmp_path: Path, name: str):
    site = _site(tmp_path, preimport=False, name=name)
    assert _real(site, name) == "FAIL"
    (f,) = _ours(site)
    assert f.subject == name
    assert f"{name} is not found: loaded at run time (dlopen) by pkg/libhelper.so.1" in f.message
    assert f"depdist/lib/{name} (depdist 7.1) has that name" in f.cause
    # the name is only in libhelper's data: evidence of a load, not proof of one that must happen
    assert f.severity is Severity.WARNING


def test_the_closure_alone_would_not_see_it(tmp_path: Path):
    """Without the import's process (the module's closure only), the healthy layout's load looks missing."""
    site = _site(tmp_path, preimport=True)
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig(default_dirs=()), reader=read_elf, owner=inv.owner)
    found = dlopen_findings(inv, resolver, read_elf, read_strings, module_trees(inv, resolver))
    assert [f.subject for f in found if f.severity is not Severity.INFO] == [DEP]


# ------------------------------------------------------------------- a name in the data: evidence, not proof

HAVE_LDCONFIG = shutil.which("ldconfig") is not None or os.path.exists("/sbin/ldconfig")


def _toolkit_cache(tmp_path: Path) -> LdCache:
    """An ld.so.cache (built by ldconfig) of a CUDA 13 toolkit's directory outside every environment:
    ``libcudart.so`` -> ``libcudart.so.13``, as a host toolkit's development link."""
    lib = tmp_path / "toolkit/lib"
    _lib(lib / "libcudart.so.13", "libcudart.so.13")
    os.symlink("libcudart.so.13", lib / "libcudart.so")
    conf, cache = tmp_path / "ld.so.conf", tmp_path / "ld.so.cache"
    conf.write_text(f"{lib}\n")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    subprocess.run([ldconfig, "-X", "-C", str(cache), "-f", str(conf)], check=True, capture_output=True)
    return read_ld_cache(str(cache))


def _profiler_site(tmp_path: Path, *, runtime_mapped: bool) -> Path:
    """``pkg/_C`` needs a CUDA 12 ``libcupti.so.12`` whose data names ``libcudart.so`` (a fallback it may
    try); with ``runtime_mapped`` it needs ``libcudart.so.12`` too, from its wheel (the process has it)."""
    work = tmp_path / "build"
    cudart = _lib(work / "libcudart.so.12", "libcudart.so.12")
    cupti = _lib(work / "libcupti.so.12", "libcupti.so.12", HELPER_C % {"names": "libcudart.so"})
    needed = (cupti, cudart) if runtime_mapped else (cupti,)
    rpath = "$ORIGIN/../nvidia/cuda_cupti/lib:$ORIGIN/../nvidia/cuda_runtime/lib"
    mod = _module(work / f"_C{SUFFIX}", "_C", needed=needed, rpath=rpath)
    site = site_packages(tmp_path / "venv", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    write_dist(site, "pkg", "1.0", {"pkg/__init__.py": "import pkg._C\n", f"pkg/_C{SUFFIX}": mod.read_bytes()})
    write_dist(site, "nvidia-cuda-cupti-cu12", "12.8.90", {"nvidia/cuda_cupti/lib/libcupti.so.12": cupti.read_bytes()})
    write_dist(
        site, "nvidia-cuda-runtime-cu12", "12.8.90", {"nvidia/cuda_runtime/lib/libcudart.so.12": cudart.read_bytes()}
    )
    return site


@pytest.mark.skipif(not HAVE_LDCONFIG, reason="needs ldconfig to build a private cache")
def test_a_data_name_whose_family_is_mapped_is_no_finding(tmp_path: Path):
    # the cache resolves libcudart.so to the CUDA 13 toolkit; the process already maps libcudart.so.12
    assert _ours(_profiler_site(tmp_path, runtime_mapped=True), _toolkit_cache(tmp_path)) == []


@pytest.mark.skipif(not HAVE_LDCONFIG, reason="needs ldconfig to build a private cache")
def test_a_data_name_resolving_to_another_major_through_the_cache_is_at_most_a_warning(tmp_path: Path):
    found = _ours(_profiler_site(tmp_path, runtime_mapped=False), _toolkit_cache(tmp_path))
    (f,) = found
    assert f.subject == "libcudart.so"
    assert f.severity is Severity.WARNING
    assert "built for CUDA 13" in f.message
    # what opens it and when: CUPTI, in a profiler session (the data table's features row)
    assert "only a profiler session (torch.profiler" in f.message
    assert "nvidia/cuda_cupti/lib/libcupti.so.12 opens it then, if at all" in f.message
