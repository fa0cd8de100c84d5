"""The symbols check in import context (checks/symbols.py with model/process.py's ``import_scopes``): a
module's references bind in the global scope its import gives it (the executable's closure plus what
RTLD_GLOBAL loads mapped before it) and in its own search list; an object an RTLD_LOCAL load mapped (an
earlier extension module) never provides a symbol (glibc's ``_dl_lookup_symbol_x`` walks only those scopes).
gcc-built stand-ins; the oracle is a real child-process import of them by this interpreter."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_cudastack.checks.symbols import extension_symbol_findings
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.symbols import read_symbols
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.elfbuild import CC, needs_cc
from tests.helpers.sitebuild import site_packages, write_cupy_stand_in, write_dist

pytestmark = needs_cc
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _so(build: Path, name: str, source: str, args: Sequence[str] = ()) -> bytes:
    assert CC is not None
    build.mkdir(parents=True, exist_ok=True)
    src = build / (name.replace(".", "_") + ".c")
    src.write_text(source)
    out = build / name
    proc = subprocess.run(
        [CC, "-shared", "-fPIC", "-o", str(out), str(src), *args], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return out.read_bytes()


def _findings(site: Path) -> str:
    inv = installed_wheels([str(site)], reader=None)
    resolver = Resolver(SearchConfig.from_environment({}), owner=inv.owner)
    return "\n\n".join(f.render() for f in extension_symbol_findings(inv, resolver, read_symbols))


def _real_import(site: Path, module: str) -> str:
    """The oracle: stderr of ``import module`` by this interpreter in a child, with only ``site`` added."""
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    env.pop("LD_LIBRARY_PATH", None)
    return subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True).stderr


def _cupy(tmp_path: Path, *, cublas: bool) -> Path:
    site = site_packages(tmp_path / "venv")
    build = tmp_path / "build"
    files: dict[str, bytes | str] = {
        "nvidia/cu13/lib/libcublasLt.so.13": _so(build, "libcublasLt.so.13", "int lt_fn(void) { return 1; }\n"),
    }
    if cublas:
        files["nvidia/cu13/lib/libcublas.so.13"] = _so(
            build,
            "libcublas.so.13",
            "int lt_fn(void);\nint cublas_fn(void) { return lt_fn(); }\n",
            [
                "-Wl,-soname,libcublas.so.13",
                str(build / "libcublasLt.so.13"),
                "-Wl,--enable-new-dtags",
                "-Wl,-rpath,$ORIGIN",
            ],
        )
    write_dist(site, "nvidia-cublas", "13.1.0", files)
    # the module uses cublas_fn but has no DT_NEEDED on libcublas: only the RTLD_GLOBAL preload provides it
    module = _so(
        build, f"cublas{SUFFIX}", "int cublas_fn(void);\nint PyInit_cublas(void) { return cublas_fn() - 1; }\n"
    )
    write_cupy_stand_in(site, module)
    return site


def test_symbol_only_an_earlier_rtld_global_preload_provides_binds(tmp_path: Path):
    site = _cupy(tmp_path, cublas=True)
    assert _findings(site) == ""
    assert "undefined symbol" not in _real_import(site, "cupy")


def test_without_the_preload_the_symbol_is_unbound(tmp_path: Path):
    site = _cupy(tmp_path, cublas=False)
    text = _findings(site)
    assert "undefined symbol: cublas_fn" in text
    assert f"cupy_backends/cuda/libs/cublas{SUFFIX}" in text
    assert "undefined symbol: cublas_fn" in _real_import(site, "cupy")


def _local(tmp_path: Path) -> Path:
    site = site_packages(tmp_path / "venv")
    build = tmp_path / "build"
    provider = _so(
        build, f"_provider{SUFFIX}", "int shared_fn(void) { return 1; }\nint PyInit__provider(void) { return 0; }\n"
    )
    consumer = _so(
        build, f"_consumer{SUFFIX}", "int shared_fn(void);\nint PyInit__consumer(void) { return shared_fn() - 1; }\n"
    )
    write_dist(
        site,
        "pkgl",
        "1.0",
        {
            # the provider's (stub) init fails, but CPython keeps it mapped (RTLD_LOCAL) and goes on
            "pkgl/__init__.py": (
                "try:\n    from pkgl import _provider\nexcept Exception:\n    pass\nfrom pkgl import _consumer\n"
            ),
            f"pkgl/_provider{SUFFIX}": provider,
            f"pkgl/_consumer{SUFFIX}": consumer,
        },
    )
    return site


def test_a_symbol_of_an_earlier_rtld_local_extension_does_not_bind(tmp_path: Path):
    site = _local(tmp_path)
    text = _findings(site)
    assert "undefined symbol: shared_fn" in text
    assert f"pkgl/_consumer{SUFFIX}" in text
    assert "undefined symbol: shared_fn" in _real_import(site, "pkgl")


def _kernel_after_torch(tmp_path: Path) -> Path:
    site = site_packages(tmp_path / "venv")
    build = tmp_path / "build"
    c10 = _so(build, "libc10ish.so", "int c10_fn(void) { return 1; }\n", ["-Wl,-soname,libc10ish.so"])
    libtorch = _so(
        build,
        "libtorchish.so",
        "int c10_fn(void);\nint torch_fn(void) { return c10_fn(); }\n",
        ["-Wl,-soname,libtorchish.so", str(build / "libc10ish.so"), "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN"],
    )
    ext = _so(
        build,
        f"_C{SUFFIX}",
        "int torch_fn(void);\nint PyInit__C(void) { return torch_fn() - 1; }\n",
        [str(build / "libtorchish.so"), "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/lib"],
    )
    write_dist(
        site,
        "torchish",
        "2.9.0",
        {
            "torchish/__init__.py": "try:\n    from torchish import _C\nexcept SystemError:\n    pass\n",
            f"torchish/_C{SUFFIX}": ext,
            "torchish/lib/libtorchish.so": libtorch,
            "torchish/lib/libc10ish.so": c10,
        },
    )
    # needs libtorchish.so by soname (no RUNPATH: found already loaded) and calls c10_fn, which only
    # libtorchish.so's own dependency defines: its search list holds it (glibc walks the loaded object's needs)
    kernel = _so(
        build,
        f"ops{SUFFIX}",
        "int torch_fn(void); int c10_fn(void);\nint PyInit_ops(void) { return torch_fn() + c10_fn() - 2; }\n",
        [str(build / "libtorchish.so"), f"-Wl,-rpath-link,{build}"],
    )
    kernel_init = "import torchish\nfrom kernelish import ops\n"
    write_dist(site, "kernelish", "0.3.0", {"kernelish/__init__.py": kernel_init, f"kernelish/ops{SUFFIX}": kernel})
    return site


def test_an_already_loaded_dependency_brings_its_own_dependencies(tmp_path: Path):
    site = _kernel_after_torch(tmp_path)
    assert _findings(site) == ""
    assert "undefined symbol" not in _real_import(site, "kernelish")
    assert "initialization of ops" in _real_import(site, "kernelish")  # dlopen bound it; only the stub init fails


def _preloaded_needs_newer(tmp_path: Path, *, lt_has_new: bool) -> Path:
    """cupy-cuda12x + nvidia-cusparse-cu12 12.5 + nvidia-nvjitlink-cu12 12.1 in small: the preload opens
    libcublas.so.13 by path (RTLD_GLOBAL), whose DT_NEEDED libcublasLt.so.13 (another wheel, found by
    libcublas's RUNPATH) is an older release lacking ``lt_fn2``, which libcublas binds."""
    site = site_packages(tmp_path / "venv")
    build = tmp_path / "build"
    new_lt = "int lt_fn(void) { return 1; }\nint lt_fn2(void) { return 2; }\n"
    old_lt = new_lt if lt_has_new else "int lt_fn(void) { return 1; }\n"
    _so(build / "new", "libcublasLt.so.13", new_lt, ["-Wl,-soname,libcublasLt.so.13"])
    write_dist(
        site,
        "nvidia-cublaslt-stand-in",
        "13.0.0",
        {
            "nvidia/cu13/lib/libcublasLt.so.13": _so(
                build, "libcublasLt.so.13", old_lt, ["-Wl,-soname,libcublasLt.so.13"]
            )
        },
    )
    cublas = _so(
        build,
        "libcublas.so.13",
        "int lt_fn2(void);\nint cublas_fn(void) { return lt_fn2(); }\n",
        [
            "-Wl,-soname,libcublas.so.13",
            str(build / "new" / "libcublasLt.so.13"),
            "-Wl,-z,now",
            "-Wl,--enable-new-dtags",
            "-Wl,-rpath,$ORIGIN",
        ],
    )
    write_dist(site, "nvidia-cublas", "13.1.0", {"nvidia/cu13/lib/libcublas.so.13": cublas})
    # the module needs libcublas.so.13 by DT_NEEDED: the preload has mapped it, so it binds as already loaded
    module = _so(
        build,
        f"cublas{SUFFIX}",
        "int cublas_fn(void);\nint PyInit_cublas(void) { return cublas_fn() - 2; }\n",
        [str(build / "libcublas.so.13")],
    )
    write_cupy_stand_in(site, module)
    return site


def test_a_preloaded_librarys_own_dependency_is_named_where_it_lacks_a_symbol(tmp_path: Path):
    site = _preloaded_needs_newer(tmp_path, lt_has_new=False)
    assert "undefined symbol: lt_fn2" in _real_import(site, "cupy")
    text = _findings(site)
    assert "undefined symbol: lt_fn2" in text
    # the library that was to define it, where it resolved and whose it is (it was "no object in its lookup
    # scope defines them": the preloaded library's own dependencies were not in the scope)
    assert "are not defined: libcublasLt.so.13 (the needed library defining their nearest names) resolved to " in text
    assert "resolved to nvidia/cu13/lib/libcublasLt.so.13 (runpath, runpath of nvidia/cu13/lib/libcublas.so.13" in text
    assert "from nvidia-cublaslt-stand-in 13.0.0" in text
    assert "install the release of nvidia-cublaslt-stand-in whose libcublasLt.so.13 defines lt_fn2" in text


def test_a_preloaded_librarys_dependency_that_defines_it_is_clean(tmp_path: Path):
    site = _preloaded_needs_newer(tmp_path, lt_has_new=True)
    assert "undefined symbol" not in _real_import(site, "cupy")
    assert _findings(site) == ""
