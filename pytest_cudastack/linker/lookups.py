"""Names an ELF file looks up by name at run time, read from its read-only data: the Python modules an
extension module imports from C, and the CUDA driver entry points it asks ``dlsym``/``cuGetProcAddress`` for.

* **Modules imported from C.** An extension module that imports another module in its init function passes
  the name to ``PyImport_ImportModule`` as a C string: a NUL-terminated dotted name in ``.rodata``
  (``cuda.bindings.cydriver`` in ``cuda/bindings/driver.so``). Cython writes one for each ``cimport``ed
  module whose cdef functions the module uses (it then fetches them from the module's ``__pyx_capi__``) or
  whose ``.pxd`` declares an extension type (every such type is imported, used or not: ``ModuleNode``'s
  function and type import code); a ``cimport`` of only ctypedefs, constants or inline functions is
  resolved at compile time, imports nothing and leaves no such string. :attr:`Lookups.modules` lists them,
  and :attr:`Lookups.cython` the Cython version named by the shared-type module a Cython module keeps
  (``_cython_3_2_9``): before Cython 3.1 every Python string constant, the names of imports inside functions
  among them, was such a C string too, so there a dotted string proves no import at init; from 3.1 on the
  Python constants live in one packed (sorted, optionally compressed) string table and a plain dotted C
  string is a C-level use. In that table an import at module level and one inside a function look alike;
  :attr:`Lookups.init` holds the names the module's exec function itself passes to the import machinery,
  read from its machine code (:mod:`pytest_cudastack.linker.cyinit`; read unless the file names a Cython
  older than 3.1; None where it cannot be decoded: the module is then judged by its C strings alone).
* **Driver entry points.** NUL-terminated ``cu[A-Z]...`` identifiers (``cuMemAlloc_v2``, ``cuGreenCtxCreate``),
  the names a library passes to ``dlsym`` on ``libcuda.so.1`` or to ``cuGetProcAddress``;
  :attr:`Lookups.proc_address` says whether the file names ``cuGetProcAddress`` itself (the lookup that
  reports a missing entry point per call instead of failing the load).

Bounded like :mod:`pytest_cudastack.linker.strings`: at most :data:`MAX_SCAN` bytes of read-only data,
:data:`MAX_NAMES` names of each kind.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pytest_cudastack._sysio import Span, open_span
from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.cyinit import init_names
from pytest_cudastack.linker.strings import read_only_ranges

__all__ = ["MAX_NAMES", "MAX_SCAN", "ExtraStore", "Lookups", "cached_lookups", "read_lookups"]

MAX_SCAN = 64 << 20  # an extension module's read-only data: a few MB (cuda-bindings' driver: 1.5 MB)
MAX_NAMES = 4096
_DOTTED = re.compile(rb"\0([A-Za-z_][A-Za-z0-9_]{0,100}(?:\.[A-Za-z_][A-Za-z0-9_]{0,100}){1,10})(?=\0)")
_CYTHON = re.compile(r"_cython_(\d+)_(\d+)_\d+(?:\.|$)")
_DRIVER = re.compile(rb"\0(cu[A-Z][A-Za-z0-9_]{1,100})(?=\0)")
_MAX_DRIVER_NAME = 104  # NUL, "cu", 101 characters
_CHUNK = 4 << 20


@dataclass(frozen=True)
class Lookups:
    """What one file looks up by name at run time (module docstring)."""

    path: str
    modules: tuple[str, ...]  # dotted C strings, in file order
    cython: tuple[int, int] | None  # the Cython (major, minor) that built it, None when no Cython marker
    driver: tuple[str, ...]  # cu* identifiers, in file order
    proc_address: bool  # the file names cuGetProcAddress (per-entry lookups that report absence)
    init: tuple[str, ...] | None = None  # Cython >= 3.1: the names its exec function reads (cyinit); else None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "modules": list(self.modules),
            "cython": list(self.cython) if self.cython else None,
            "driver": list(self.driver),
            "proc_address": self.proc_address,
            "init": list(self.init) if self.init is not None else None,
        }

    @classmethod
    def from_json(cls, d: Any) -> Lookups:
        """Inverse of :meth:`to_json`; ElfError on anything else (a corrupt cache entry)."""
        keys = {"path", "modules", "cython", "driver", "proc_address", "init"}
        if not isinstance(d, dict) or set(d) != keys or not isinstance(d["proc_address"], bool):
            raise ElfError("malformed lookups")
        lists = [d["modules"], d["driver"], [] if d["init"] is None else d["init"]]
        if not isinstance(d["path"], str) or not all(
            isinstance(v, list) and len(v) <= MAX_NAMES and all(isinstance(x, str) for x in v) for v in lists
        ):
            raise ElfError("malformed lookups")
        cy = d["cython"]
        if cy is not None and not (
            isinstance(cy, list) and len(cy) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in cy)
        ):
            raise ElfError("malformed lookups")
        init = None if d["init"] is None else tuple(lists[2])
        return cls(d["path"], tuple(lists[0]), (cy[0], cy[1]) if cy else None, tuple(lists[1]), d["proc_address"], init)


def read_lookups(path: str | os.PathLike[str], modules: bool = True) -> Lookups:
    """The names ``path`` looks up at run time (module docstring); ElfError when it cannot be read. Without
    ``modules`` only the driver entry points are read (``modules`` empty): a multi-GB library's read-only
    data is then one cheap scan."""
    p = os.fspath(path)
    dotted: dict[str, None] = {}
    driver: dict[str, None] = {}
    budget = MAX_SCAN
    ranges = read_only_ranges(p)
    span, _st = open_span(p)
    try:
        for offset, length in ranges:
            n = min(length, budget)
            if n <= 0:
                break
            budget -= n
            _driver_names(span, offset, n, driver)
            if not modules:
                continue
            # whole: an extension module's read-only data is small
            data = b"\0" + span.pread(n, offset) + b"\0"
            for m in _DOTTED.finditer(data):
                if len(dotted) < MAX_NAMES:
                    dotted.setdefault(m.group(1).decode("ascii"), None)
    except OSError as e:
        raise ElfError(f"{p}: cannot read: {e.strerror or e}") from e
    finally:
        span.close()
    proc = any(n.startswith("cuGetProcAddress") for n in driver)
    cython = None
    for name in dotted:
        hit = _CYTHON.match(name)
        if hit is not None:
            cython = (int(hit.group(1)), int(hit.group(2)))
            break
    modules_ = tuple(n for n in dotted if _CYTHON.match(n) is None)
    init = init_names(p) if modules and (cython is None or cython >= (3, 1)) else None
    return Lookups(p, modules_, cython, tuple(driver), proc, init)


def _driver_names(span: Span, offset: int, length: int, found: dict[str, None]) -> None:
    """Add the ``cu*`` strings of one range to ``found``, chunk by chunk (a multi-GB library is never read
    whole); the unfinished string after a chunk's last NUL is carried into the next one."""
    carry = b"\0"
    pos, end = offset, offset + length
    while pos < end and len(found) < MAX_NAMES:
        chunk = span.pread(min(_CHUNK, end - pos), pos)
        if not chunk:
            break
        pos += len(chunk)
        buf = carry + chunk + (b"\0" if pos >= end else b"")
        last = buf.rfind(b"\0")
        if last == -1:  # no string boundary at all: nothing here starts a name
            carry = b""
            continue
        for m in _DRIVER.finditer(buf, 0, last + 1):
            if len(found) < MAX_NAMES:
                found.setdefault(m.group(1).decode("ascii"), None)
        tail = buf[last:]
        carry = tail if len(tail) <= _MAX_DRIVER_NAME else b""


class ExtraStore(Protocol):
    """Where facts are kept between runs (``ElfCache.get_extra`` / ``put_extra``; ``in_root``: the file a path
    names, under an image's root for an image's path)."""

    def get_extra(self, key: str) -> Any: ...

    def put_extra(self, key: str, value: Any) -> None: ...

    def file_slot(self, host: str) -> str: ...

    def in_root(self, path: str) -> str: ...


def cached_lookups(path: str, store: ExtraStore | None, modules: bool = True) -> Lookups:
    """:func:`read_lookups`, kept in ``store`` under the file's identity (device, inode, size, mtime) while
    it is unchanged; ElfError as :func:`read_lookups`. An image's path (``/usr/lib/x``) is read under the
    image's root, as the store's other facts are."""
    key: list[int] | None = None
    if store is not None:
        path = store.in_root(path)
        try:
            st = os.stat(path)
        except (OSError, ValueError) as e:
            raise ElfError(f"{path}: cannot read: {e}") from e
        key = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
        hit = store.get_extra(f"lookups{int(modules)}:{store.file_slot(path)}")
        if isinstance(hit, dict) and hit.get("key") == key:
            try:
                # the same inode under another root of an image (its top layer changed): named as asked
                return replace(Lookups.from_json(hit.get("lookups")), path=path)
            except ElfError:
                pass  # a corrupt entry: read the file again
    found = read_lookups(path, modules)
    if store is not None and key is not None:
        store.put_extra(f"lookups{int(modules)}:{store.file_slot(path)}", {"key": key, "lookups": found.to_json()})
    return found
