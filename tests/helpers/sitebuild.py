"""Fake site-packages for the wheels tests: dist-info (METADATA, RECORD) plus real gcc-built shared objects.

Libraries are compiled once per (soname, needed, rpath, pyinit, payload) and cached per process; NEEDED
entries come from linking against stub libraries carrying the wanted SONAME, so the stubs never need to exist
next to the result (which is what lets a test make a soname "missing").
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.elfbuild import link_args

__all__ = [
    "HAVE_CC",
    "DistSpec",
    "compile_so",
    "isolate_search",
    "record_hash",
    "site_packages",
    "write_dist",
]

CC = shutil.which("cc") or shutil.which("gcc")
HAVE_CC = CC is not None

_cache: dict[tuple[object, ...], bytes] = {}
_workdir: Path | None = None


def _work() -> Path:
    global _workdir
    if _workdir is None:
        _workdir = Path(tempfile.mkdtemp(prefix="cudastack-sitebuild-"))
        atexit.register(shutil.rmtree, _workdir, ignore_errors=True)
    return _workdir


def _cc(args: Sequence[str]) -> None:
    assert CC is not None, "needs a C compiler"
    subprocess.run([CC, *args], check=True, capture_output=True)


def _stub(soname: str) -> Path:
    out = _work() / "stubs" / soname
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        src = out.with_name(soname + ".c")
        src.write_text("int cudastack_stub(void) { return 0; }\n")
        _cc(["-shared", "-fPIC", "-o", str(out), f"-Wl,-soname,{soname}", str(src)])
    return out


def compile_so(
    soname: str | None,
    *,
    needed: Sequence[str] = (),
    rpath: str | None = None,
    runpath: str | None = None,
    pyinit: str | None = None,
    payload: str = "",
) -> bytes:
    """Bytes of a real x86-64 (host) shared object.

    ``needed``: sonames to put in DT_NEEDED (in order); ``rpath``/``runpath``: DT_RPATH / DT_RUNPATH string
    (``$ORIGIN`` kept literally); ``pyinit``: module name whose ``PyInit_<name>`` is exported;
    ``payload``: extra string data, to make two builds of one soname differ in size and hash.
    """
    key = (soname, tuple(needed), rpath, runpath, pyinit, payload)
    if key in _cache:
        return _cache[key]
    d = Path(tempfile.mkdtemp(dir=_work()))
    src = d / "x.c"
    code = ["int cudastack_func(void) { return 42; }"]
    if pyinit:
        code.append(f"void *PyInit_{pyinit}(void) {{ return 0; }}")
    if payload:
        esc = payload.replace("\\", "\\\\").replace('"', '\\"')
        code.append(f'const char cudastack_payload[] = "{esc}";')
    src.write_text("\n".join(code) + "\n")
    out = d / "out.so"
    stubs = [_stub(n) for n in needed]
    _cc(["-shared", "-fPIC", "-o", str(out), str(src), *link_args(soname, stubs, rpath, runpath, ())])
    data = out.read_bytes()
    _cache[key] = data
    return data


def record_hash(data: bytes) -> str:
    """RECORD's hash field: ``sha256=`` + urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def site_packages(prefix: Path, python: str = "python3.11") -> Path:
    """``prefix/lib/<python>/site-packages``, created."""
    site = prefix / "lib" / python / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    return site


@dataclass(frozen=True)
class DistSpec:
    name: str
    version: str
    dist_info: Path
    files: tuple[str, ...]


def write_dist(
    site: Path,
    name: str,
    version: str,
    files: Mapping[str, bytes | str] | None = None,
    *,
    requires: Sequence[str] = (),
    summary: str = "",
    metadata: str | None = None,
    record: str | None = None,
    extra_rows: Sequence[str] = (),
    write_files: bool = True,
    overwrite: bool = True,
) -> DistSpec:
    """Install a fake distribution into ``site`` the way pip would (files, then dist-info with RECORD).

    ``files`` map RECORD paths (relative to ``site``; ``../../../bin/x`` allowed) to contents.
    ``metadata``/``record``: replace the generated METADATA / RECORD text verbatim (None: generate;
    ``""`` for METADATA means: do not write one). ``extra_rows``: raw lines appended to RECORD.
    ``write_files=False`` writes only the dist-info (files "deleted"); ``overwrite=False`` keeps files
    already on disk (RECORD still lists this distribution's bytes).
    """
    files = dict(files or {})
    dist_dir = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_dir.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    for rel, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        target = Path(os.path.normpath(site / rel))
        if write_files and (overwrite or not target.exists()):
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                target.unlink()  # as pip does: a new inode, never writing in place
            target.write_bytes(data)
        rows.append(f"{rel},{record_hash(data)},{len(data)}")
    meta_files: dict[str, str] = {"INSTALLER": "pip\n", "WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"}
    if metadata is None:
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        if summary:
            lines.append(f"Summary: {summary}")
        lines += [f"Requires-Dist: {r}" for r in requires]
        meta_files["METADATA"] = "\n".join(lines) + "\n\n"
    elif metadata:
        meta_files["METADATA"] = metadata
    for fname, text in meta_files.items():
        (dist_dir / fname).write_text(text)
        rows.append(f"{dist_dir.name}/{fname},{record_hash(text.encode())},{len(text.encode())}")
    rows.append(f"{dist_dir.name}/RECORD,,")
    rows.extend(extra_rows)
    (dist_dir / "RECORD").write_text(record if record is not None else "\n".join(rows) + "\n")
    return DistSpec(name, version, dist_dir, tuple(files))


# cuda-pathfinder's loads for cublas (RTLD_NOW | RTLD_GLOBAL, by path, from the first sys.path entry holding
# the CUDA 13 wheel's libraries), written as a stand-in cupy_backends.cuda.libs package's __getattr__: the
# real child-process oracle of the cupy preload rows (tests/test_process_cupy.py, tests/test_symbols_context.py)
CUPY_LIBS_GETATTR = """\
import ctypes, importlib, os, sys


def __getattr__(name):
    if name == "cublas":
        for entry in sys.path:
            lib = os.path.join(entry, "nvidia", "cu13", "lib")
            if os.path.isfile(os.path.join(lib, "libcublas.so.13")):
                for so in ("libcublasLt.so.13", "libcublas.so.13"):
                    ctypes.CDLL(os.path.join(lib, so), os.RTLD_NOW | os.RTLD_GLOBAL)
                break
    return importlib.import_module(f"cupy_backends.cuda.libs.{name}")
"""


def write_cupy_stand_in(site: Path, cublas_module: bytes) -> None:
    """A stand-in ``cupy-cuda13x`` 14.0.0 in ``site``: ``import cupy`` imports ``cupy_backends.cuda.libs.cublas``
    (the extension ``cublas_module``) through :data:`CUPY_LIBS_GETATTR`'s preloads, as cupy's own package does."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    write_dist(
        site,
        "cupy-cuda13x",
        "14.0.0",
        {
            "cupy/__init__.py": "from cupy_backends.cuda.libs import cublas\n",
            "cupy_backends/__init__.py": "",
            "cupy_backends/cuda/__init__.py": "",
            "cupy_backends/cuda/libs/__init__.py": CUPY_LIBS_GETATTR,
            f"cupy_backends/cuda/libs/cublas{suffix}": cublas_module,
        },
    )


def isolate_search(monkeypatch: Any, tmp_path: Path) -> Path:
    """The host's ld.so.cache and default directories replaced by one empty directory (returned), the cache
    and LD_LIBRARY_PATH off: a test's loader search sees only what the test builds (pytest's ``monkeypatch``)."""
    from dataclasses import replace

    from pytest_cudastack.linker.resolver import SearchConfig

    system = tmp_path / "system"
    system.mkdir()
    config = SearchConfig.from_environment({})
    monkeypatch.setattr(
        SearchConfig,
        "from_environment",
        classmethod(lambda cls, environ=None, root="/": replace(config, default_dirs=(str(system),), ld_cache=None)),
    )
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    return system
