"""Library names written in an ELF file's read-only data: what it may load at run time by name (dlopen).

A library that dlopens another by name keeps that name as a C string in its read-only data
(``libnvrtc.so.13`` holds ``libnvrtc-builtins.so.13.0``; cuDNN 9's shim holds ``libcudnn_graph.so`` and
appends its major). :func:`read_strings` lists the NUL-terminated strings of the ``.rodata`` sections (``.rodata``,
``.rodata.*``, ``.rodata1``) that look like a shared library's file name (``lib*.so`` with an optional
numeric version), in file order, once each. Without section headers (a stripped table) the read-only
loadable segments (``PT_LOAD`` with flags exactly ``PF_R``) are read instead: the gABI's program view.

Bounded: the data is streamed in chunks (never the whole file in memory), at most :data:`MAX_SCAN`
bytes per file and :data:`MAX_NAMES` names, and ``truncated`` says when a cap cut the scan short. Only
little-endian ELF64 is read (x86-64, aarch64); other files give no names. Cached by the ELF cache
(``ElfCache.read_strings``), so a multi-GB library is scanned once while it is unchanged.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Any

from pytest_cudastack._sysio import Span, open_span
from pytest_cudastack.errors import ElfError

__all__ = ["MAX_NAMES", "MAX_SCAN", "StringFacts", "read_only_ranges", "read_strings"]

MAX_SCAN = 256 << 20  # torch's libtorch_cuda.so has 9.5 MB of .rodata; 256 MB bounds a hostile file
MAX_NAMES = 4096
_CHUNK = 4 << 20
_MAX_STRING = 4096  # a name longer than this is no library name: the carry between chunks is dropped
_NAME = re.compile(rb"\0(lib[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,250}?\.so(?:\.[0-9]+){0,6})\0")
_MAX_NAME = 260
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHT_PROGBITS = 1
_PT_LOAD = 1
_PF_R = 4
_MAX_TABLE = 0xFF00
_MAX_ENTRY = 256  # bytes per header entry at most (64 in ELF64): a table stays under about 16 MiB


@dataclass(frozen=True)
class StringFacts:
    """The library names in one file's read-only data; see the module docstring."""

    path: str
    names: tuple[str, ...]
    truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "names": list(self.names), "truncated": self.truncated}

    @classmethod
    def from_json(cls, d: Any) -> StringFacts:
        """Inverse of :meth:`to_json`; ElfError on anything else (a corrupt cache entry)."""
        if not isinstance(d, dict) or set(d) != {"path", "names", "truncated"}:
            raise ElfError("malformed string facts")
        path, names, truncated = d["path"], d["names"], d["truncated"]
        if not isinstance(path, str) or not isinstance(truncated, bool) or not isinstance(names, list):
            raise ElfError("malformed string facts")
        if len(names) > MAX_NAMES or not all(isinstance(n, str) and _valid(n) for n in names):
            raise ElfError("malformed string facts")
        return cls(path, tuple(names), truncated)


def _valid(name: str) -> bool:
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        return False
    return _NAME.fullmatch(b"\0" + raw + b"\0") is not None


def _ranges(span: Span, path: str, size: int) -> list[tuple[int, int]]:
    """(offset, length) of the read-only data to scan: the .rodata sections, else the PF_R PT_LOADs."""
    head = span.pread(_EHDR.size, 0)
    if len(head) < _EHDR.size or head[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    if head[4:6] != b"\x02\x01":
        return []  # ELF32 or big-endian: not read (see the module docstring)
    _ident, _t, _m, _v, _entry, phoff, shoff, _f, _eh, phes, phnum, shes, shnum, shstrndx = _EHDR.unpack(head)
    out: list[tuple[int, int]] = []
    # an entry size is the ELF's own (64 bytes): a larger one only lets a hostile header ask for gigabytes
    if (
        shoff
        and _SHDR.size <= shes <= _MAX_ENTRY
        and 0 < shnum < _MAX_TABLE
        and shstrndx < shnum
        and shoff + shes * shnum <= size
    ):
        table = span.pread(shes * shnum, shoff)
        headers = [_SHDR.unpack_from(table, i * shes) for i in range(shnum)]
        str_off, str_size = headers[shstrndx][4], headers[shstrndx][5]
        names = span.pread(min(str_size, 1 << 20), str_off) if str_off + str_size <= size else b""
        for name_at, kind, _flags, _addr, offset, length, *_ in headers:
            if kind != _SHT_PROGBITS or name_at >= len(names) or not length or offset + length > size:
                continue
            name = names[name_at : names.find(b"\0", name_at)]
            if name == b".rodata" or name == b".rodata1" or name.startswith(b".rodata."):
                out.append((offset, length))
        if out or names:
            return out
    if phoff and _PHDR.size <= phes <= _MAX_ENTRY and 0 < phnum < _MAX_TABLE and phoff + phes * phnum <= size:
        table = span.pread(phes * phnum, phoff)
        for i in range(phnum):
            p_type, p_flags, offset, _va, _pa, filesz, _memsz, _align = _PHDR.unpack_from(table, i * phes)
            if p_type == _PT_LOAD and p_flags == _PF_R and filesz and offset + filesz <= size:
                out.append((offset, filesz))
    return out


def read_strings(path: str | os.PathLike[str]) -> StringFacts:
    """The library names in ``path``'s read-only data (module docstring); ElfError when it cannot be read
    or is not an ELF file."""
    p = os.fspath(path)
    span, st = open_span(p)
    try:
        ranges = _ranges(span, p, st.st_size)
        found: dict[str, None] = {}
        budget = MAX_SCAN
        truncated = False
        for offset, length in ranges:
            if budget <= 0 or len(found) >= MAX_NAMES:
                truncated = True
                break
            if length > budget:
                length, truncated = budget, True
            budget -= length
            truncated |= _scan(span, offset, length, found)
    except OSError as e:
        raise ElfError(f"{p}: cannot read: {e.strerror or e}") from e
    finally:
        span.close()
    return StringFacts(p, tuple(found), truncated)


def _scan(span: Span, offset: int, length: int, found: dict[str, None]) -> bool:
    """Add the names of one range to ``found``, chunk by chunk; True when MAX_NAMES cut it short.

    Each chunk is scanned up to its last NUL (every string it holds whole); the unfinished string after
    it is carried into the next chunk, so a name split by a chunk boundary is still seen once. A range
    starts a string (the leading NUL stands for the section start)."""
    carry = b"\0"
    end = offset + length
    pos = offset
    while pos < end:
        chunk = span.pread(min(_CHUNK, end - pos), pos)
        if not chunk:
            break
        pos += len(chunk)
        buf = carry + chunk if pos < end else carry + chunk + b"\0"
        last = buf.rfind(b"\0")
        if last == -1:  # a run with no NUL at all: no string boundary to start from
            carry = b""
            continue
        # find ".so" (C speed) and judge only the NUL-delimited string around each hit: a regex over every
        # byte would cost seconds on a 500 MB library's read-only data
        at = buf.find(b".so", 0, last)
        while at != -1:
            start = buf.rfind(b"\0", max(0, at - _MAX_NAME), at) + 1
            stop = buf.find(b"\0", at, last + 1)
            if start > 0 and stop != -1:
                m = _NAME.fullmatch(buf, start - 1, stop + 1)
                if m is not None:
                    found.setdefault(buf[start:stop].decode("ascii"), None)
                    if len(found) >= MAX_NAMES:
                        return True
            at = buf.find(b".so", (stop if stop != -1 else at) + 1, last)
        tail = buf[last:]
        carry = tail if len(tail) <= _MAX_STRING else b""
    return False


def read_only_ranges(path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """(offset, length) of the read-only data :func:`read_strings` scans (the ``.rodata`` sections, else the
    PF_R PT_LOADs), for other readers of that data; ElfError when the file cannot be read or is no ELF."""
    p = os.fspath(path)
    span, st = open_span(p)
    try:
        return _ranges(span, p, st.st_size)
    except OSError as e:
        raise ElfError(f"{p}: cannot read: {e.strerror or e}") from e
    finally:
        span.close()
