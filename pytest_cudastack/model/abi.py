"""Which extension modules the inspected interpreter can import: its extension-module suffixes.

CPython's path finder looks for an extension module ``leaf`` as ``leaf + suffix`` for each suffix of
``importlib.machinery.EXTENSION_SUFFIXES``, which is the C table ``_PyImport_DynLoadFiletab``
(python/cpython ``Python/dynload_shlib.c``)::

    "." SOABI ".so", ["." ALT_SOABI ".so",]  ".abi" PYTHON_ABI_STRING ".so", ".so"

where ``configure.ac`` builds::

    SOABI='cpython-'`echo $VERSION | tr -d .`${ABIFLAGS}${SOABI_PLATFORM:+-$SOABI_PLATFORM}

(``ABIFLAGS``: ``t`` for ``--disable-gil``, then ``d`` for ``--with-pydebug``; ``ALT_SOABI``, only in a debug
build, is SOABI without the ``d``). So CPython 3.11 on x86-64 Linux loads ``.cpython-311-x86_64-linux-gnu.so``,
``.abi3.so`` and ``.so``, and never ``_mscclpp.cpython-310-x86_64-linux-gnu.so`` (another version),
``.cpython-313t-...`` (the free-threaded ABI) or ``.cpython-311-aarch64-linux-gnu.so`` (another platform):
its stem is no identifier, so no ``import`` names it. The free-threaded builds do not load the stable ABI
(packaging ``tags._abi3_applies``: "The free-threaded builds do not support abi3").

The inspected interpreter is the one owning the site directories (``--site`` of another venv, a 3.12 site
read from 3.11): its version comes from the site's layout (``lib/pythonX.Y[t]/``, ``pyvenv.cfg``:
:func:`~pytest_cudastack.wheels.requirements.site_python`); its suffixes are this interpreter's with the
version (and ``t``) of the inspected one, as CPython would have built them. The platform part stays this
machine's.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pytest_cudastack._sysio import read_text
from pytest_cudastack.model.pysource import HOST, PyTarget
from pytest_cudastack.wheels.requirements import site_python
from pytest_cudastack.wheels.sitepaths import install_prefix

__all__ = [
    "PythonAbi",
    "extension_suffixes",
    "importable_suffix",
    "inspected_stdlib",
    "inspected_suffixes",
    "inspected_target",
    "site_abi",
]

_SOABI = re.compile(r"\.cpython-(\d)(\d+)([a-z]*)(-[^.]+)?\.so")  # ".cpython-311-x86_64-linux-gnu.so"
_THREADED_DIR = re.compile(r"^python\d+\.\d+t$")  # LIBDEST: lib/python$(VERSION)$(ABI_THREAD)
_STABLE = ".abi3.so"


@dataclass(frozen=True)
class PythonAbi:
    """The inspected CPython's ``X.Y`` and whether it is the free-threaded build (``t``)."""

    version: tuple[int, int]
    threaded: bool = False

    @property
    def label(self) -> str:
        return f"CPython {self.version[0]}.{self.version[1]}{'t' if self.threaded else ''}"


def site_abi(site_dirs: Sequence[str]) -> PythonAbi | None:
    """The ABI of the interpreter owning ``site_dirs``: the first whose layout names a Python; None when
    none does (a ``--target`` directory, a bare folder)."""
    for site in site_dirs:
        full = site_python(site)
        if full is None:
            continue
        major, minor = (int(x) for x in full.split(".")[:2])
        parts = os.path.normpath(site).split(os.sep)[-3:]
        return PythonAbi((major, minor), any(_THREADED_DIR.match(p) for p in parts))
    return None


def inspected_target(site_dirs: Sequence[str]) -> PyTarget:
    """The interpreter whose ``if sys.version_info`` tests the import model decides for ``site_dirs``: the
    version their layout names (:func:`site_python`) when its minor is not this interpreter's (the micro
    from ``pyvenv.cfg``, else 0); this interpreter otherwise (a site of its own minor: its micro is the
    best evidence there is)."""
    for site in site_dirs:
        full = site_python(site)
        if full is None:
            continue
        parts = [int(p) for p in full.split(".")[:3] if p.isdigit()]
        if len(parts) < 2 or tuple(parts[:2]) == HOST.version[:2]:
            return HOST
        return replace(HOST, version=(parts[0], parts[1], parts[2] if len(parts) > 2 else 0))
    return HOST


_HOME = re.compile(r"^[ \t]*home[ \t]*=[ \t]*(.*?)[ \t]*$", re.M)  # pyvenv.cfg: the base interpreter's bin


def _rooted(root: str | None, path: str) -> str:
    return os.path.join(root, path.lstrip("/")) if root else path


def inspected_stdlib(site_dirs: Sequence[str], root: str | None = None) -> tuple[str, ...] | None:
    """The standard library and ``lib-dynload`` of the interpreter owning ``site_dirs`` (host paths; ``root``:
    the other system's root they are in, an image's), where its files show them: the prefix's own
    ``lib/python3.X`` (a CPython installed there, conda), a venv's base (``pyvenv.cfg``'s ``home``, an image's
    path taken under ``root``), else Debian's ``/usr/lib/python3.X`` (its ``dist-packages`` directories'
    interpreter); each only where it holds ``os.py``. None when no site says (a ``--target`` folder)."""
    abi = site_abi(site_dirs)
    if abi is None:
        return None
    pydir = f"python{abi.version[0]}.{abi.version[1]}{'t' if abi.threaded else ''}"
    for site in site_dirs:
        prefix = install_prefix(site)
        parts = os.path.normpath(site).split(os.sep)
        if parts[-3:] == ["lib", "python3", "dist-packages"]:
            prefix = os.sep.join(parts[:-3]) or os.sep
        elif prefix == os.path.normpath(site):
            continue  # not a prefix's site directory
        candidates = [os.path.join(prefix, "lib", pydir)]
        text = read_text(os.path.join(prefix, "pyvenv.cfg"), 1 << 16)
        home = _HOME.search(text) if text else None
        if home is not None and home[1].startswith("/"):
            candidates.append(os.path.join(os.path.dirname(_rooted(root, home[1].rstrip("/"))), "lib", pydir))
        candidates.append(_rooted(root, f"/usr/lib/{pydir}"))
        for stdlib in candidates:
            if os.path.isfile(os.path.join(stdlib, "os.py")):
                return stdlib, os.path.join(stdlib, "lib-dynload")
    return None


def extension_suffixes(abi: PythonAbi | None, base: Sequence[str] | None = None) -> tuple[str, ...]:
    """The extension suffixes of ``abi``, made from ``base`` (default: this interpreter's
    ``EXTENSION_SUFFIXES``) the way CPython builds its table (module docstring): each SOABI suffix with
    the version and the ``t`` flag replaced, the stable-ABI suffix only for a build with the GIL, in
    CPython's order. ``abi`` None: ``base`` unchanged."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES if base is None else base)
    if abi is None:
        return suffixes
    out: list[str] = []
    for s in suffixes:
        m = _SOABI.fullmatch(s)
        if m is not None:
            flags = ("t" if abi.threaded else "") + m[3].replace("t", "")
            out.append(f".cpython-{abi.version[0]}{abi.version[1]}{flags}{m[4] or ''}.so")
        elif s != _STABLE:
            out.append(s)
    if not abi.threaded:
        plain = out.index(".so") if ".so" in out else len(out)
        out.insert(plain, _STABLE)  # "." SOABI ".so", ..., ".abi3.so", ".so"
    return tuple(dict.fromkeys(out))


def inspected_suffixes(site_dirs: Sequence[str]) -> tuple[str, ...]:
    """The extension suffixes of the interpreter owning ``site_dirs`` (:func:`site_abi`)."""
    return extension_suffixes(site_abi(site_dirs))


def importable_suffix(path: str, suffixes: Sequence[str]) -> str | None:
    """The suffix by which an import finds the file at ``path`` (its name is an identifier + that suffix),
    else None: no interpreter with these suffixes imports it."""
    name = os.path.basename(path)
    for suffix in suffixes:
        if name.endswith(suffix) and name[: -len(suffix)].isidentifier():
            return suffix
    return None
