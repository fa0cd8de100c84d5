"""Driver entry points obtained at run time (``dlsym`` on libcuda.so.1, ``cuGetProcAddress``): the ``cu*`` names
in an object's read-only data (linker/lookups.py), judged against the declared or probed driver with the
link-time table (cuda/data/driver_symbols.json), naming each entry point and the CUDA that introduced it.
gcc-built stand-ins: a library that dlsyms its entry points, one that asks cuGetProcAddress, a clean twin
with a new enough driver."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.checks.symbols import binary_symbol_findings
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.lookups import read_lookups
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.symbols import read_symbols
from tests.helpers.elfbuild import CC, needs_cc

pytestmark = needs_cc
DECLARED = DriverInfo(source="declared", version="535.104.05", cuda_version="12.2")
NEWER = DriverInfo(source="declared", version="580.65.06", cuda_version="13.0")

# a JIT-like library: opens libcuda.so.1 and looks its entry points up by name; links nothing of the driver
DLSYM = r"""
#include <dlfcn.h>
void *entry(const char *name);
int start(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return -1;
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    void *green = dlsym(h, "cuGreenCtxCreate");
    void *ctx = dlsym(h, "cuCtxCreate_v4");
    return init && green && ctx ? init(0) : -2;
}
"""
PROC = r"""
typedef int (*getproc_t)(const char *, void **, int, unsigned long long, void *);
int ask(getproc_t get, void **out) { return get("cuGreenCtxCreate", out, 12040, 0, 0); }
const char *via = "cuGetProcAddress_v2";
"""


def _lib(tmp_path: Path, name: str, source: str) -> Path:
    assert CC is not None
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / f"{name}.so"
    proc = subprocess.run(
        [CC, "-shared", "-fPIC", "-o", str(out), str(src), "-ldl"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return out


def _findings(lib: Path, driver: DriverInfo | None) -> list:
    tree = Resolver(SearchConfig.from_environment({})).tree(str(lib))
    return [
        f for f in binary_symbol_findings(tree, lib.name, read_symbols, driver=driver) if f.subject.endswith(lib.name)
    ]


def test_dlsym_names_newer_than_the_driver_are_warnings_naming_entry_point_and_cuda(tmp_path: Path):
    lib = _lib(tmp_path, "libjit", DLSYM)
    assert {"cuInit", "cuGreenCtxCreate", "cuCtxCreate_v4"} <= set(read_lookups(lib).driver)
    (finding,) = _findings(lib, DECLARED)
    assert finding.severity is Severity.WARNING
    assert "(dlsym)" in finding.message
    assert finding.details == (
        "cuGreenCtxCreate was introduced in CUDA 12.4 (PFN_cuGreenCtxCreate_v12040 in cudaTypedefs.h)",
        "cuCtxCreate_v4 was introduced in CUDA 12.5 (PFN_cuCtxCreate_v12050 in cudaTypedefs.h)",
    )
    assert finding.facts.required == "cuGreenCtxCreate cuCtxCreate_v4"
    assert "CUDA 12.2" in finding.message


def test_cugetprocaddress_users_are_infos_named_by_their_lookup(tmp_path: Path):
    lib = _lib(tmp_path, "libproc", PROC)
    assert read_lookups(lib).proc_address
    (finding,) = _findings(lib, DECLARED)
    assert finding.severity is Severity.INFO  # cuGetProcAddress reports a missing entry point per call
    assert "(cuGetProcAddress)" in finding.message
    assert finding.details[0].startswith("cuGreenCtxCreate was introduced in CUDA 12.4")


def test_clean_twins_a_new_enough_driver_or_none_known(tmp_path: Path):
    lib = _lib(tmp_path, "libjit", DLSYM)
    assert _findings(lib, NEWER) == []
    assert _findings(lib, None) == []


def test_the_driver_itself_is_no_lookup(tmp_path: Path):
    """An object defining the entry points (a libcuda.so.1 in the stack) names them for itself."""
    lib = _lib(
        tmp_path, "libcuda_like", 'int cuGreenCtxCreate(void) { return 0; }\nconst char *n = "cuGreenCtxCreate";\n'
    )
    assert _findings(lib, DECLARED) == []


def test_driver_names_are_read_in_chunks_without_losing_one_across_a_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    lib = _lib(tmp_path, "libjit", DLSYM)
    whole = read_lookups(lib, modules=False).driver
    for size in (7, 16, 33):
        monkeypatch.setattr("pytest_cudastack.linker.lookups._CHUNK", size)
        assert read_lookups(lib, modules=False).driver == whole


def test_the_runtime_s_entry_point_lookup_is_a_per_entry_lookup(tmp_path: Path):
    """torch's c10 asks cudaGetDriverEntryPointByVersion (imported from libcudart) for names in its data."""
    assert CC is not None
    rt = tmp_path / "rt"
    rt.mkdir()
    (rt / "r.c").write_text("int cudaGetDriverEntryPointByVersion(const char *s, void **f, unsigned v) { return 0; }\n")
    cudart = rt / "libcudart.so.13"
    subprocess.run(
        [CC, "-shared", "-fPIC", "-o", str(cudart), str(rt / "r.c"), "-Wl,-soname,libcudart.so.13"], check=True
    )
    src = tmp_path / "c10.c"
    src.write_text(
        "int cudaGetDriverEntryPointByVersion(const char *, void **, unsigned);\n"
        'int get(void **f) { return cudaGetDriverEntryPointByVersion("cuGreenCtxCreate", f, 12040); }\n'
    )
    lib = tmp_path / "libc10_like.so"
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(lib), str(src), str(cudart), f"-Wl,-rpath,{rt}"], check=True)
    (finding,) = _findings(lib, DECLARED)
    assert finding.severity is Severity.INFO
    assert "(cudaGetDriverEntryPointByVersion)" in finding.message
