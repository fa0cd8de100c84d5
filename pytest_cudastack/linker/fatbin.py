"""What GPU code an ELF file carries: the entries of its CUDA fatbinary containers.

Layout (little-endian) per NVIDIA's ``fatbinary_section.h`` and checked against nvcc 13.0 output:
a container is a 16-byte header (magic 0xBA55ED50, version, header size, payload size) followed by
entries, each a header of at least 0x40 bytes (kind, header size, padded payload size, the code's version
as minor at 0x18 and major at 0x1A, arch at 0x1C, flags at 0x28) and its payload. Only headers are read: a
multi-GB cuBLAS costs a few KB per entry. Two payloads are looked into, and only when stored uncompressed:
a SASS cubin's section headers (an image without a ``.text.*`` section holds no kernel: cuFFTW ships such
an sm_75 image) and a PTX text's ``.version`` line. A compressed payload is never decompressed; its PTX ISA
is the entry header's version (the PTX ``.version`` nvcc 13.0 writes there), or unknown when that is 0.0.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

from pytest_cudastack._sysio import open_regular
from pytest_cudastack.errors import ElfError

__all__ = ["Fatbin", "FatbinEntry", "read_fatbin", "runs_on"]

CONTAINER_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQ")
_ENTRY_MIN = 0x40
_KIND_PTX = 1
_KIND_ELF = 2
_FLAG_SUFFIX_A = 0x100000
_FLAG_SUFFIX_F = 0x200000
_FLAG_LZ4 = 0x2000
_FLAG_ZSTD = 0x8000
# A real library holds a few thousand entries; anything beyond this is a corrupt or hostile count.
_MAX_ENTRIES = 1_000_000
_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
_VERSION_ARCH = struct.Struct("<HHI")
_FLAGS = struct.Struct("<Q")
_FLAGS_READ = _FLAG_SUFFIX_A | _FLAG_SUFFIX_F | _FLAG_LZ4 | _FLAG_ZSTD
_ELF64 = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR64 = struct.Struct("<IIQQQQIIQQ")
# The .version directive opens a PTX text after comments (PTX ISA, "PTX Module Directives"); 4 KB holds them.
_PTX_HEAD = 4096
_PTX_VERSION = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)
_KINDS = ("sass", "ptx", "other")
_SUFFIXES = ("", "a", "f")
_COMPRESSIONS = (None, "lz4", "zstd")


@dataclass(frozen=True)
class FatbinEntry:
    """One code object: SASS for a real arch (``sm_90a``) or PTX for a virtual one (``compute_90``)."""

    kind: str  # "sass" | "ptx" | "other"
    arch: int  # 90 for sm_90 / compute_90
    suffix: str  # "", "a" (arch-specific) or "f" (family-specific)
    compression: str | None  # None, "lz4" or "zstd"
    ptx_isa: str | None = None  # PTX entries: the PTX ISA version ("9.0"), None when unknown

    @property
    def name(self) -> str:
        prefix = "compute" if self.kind == "ptx" else "sm"
        return f"{prefix}_{self.arch}{self.suffix}"

    def to_json(self) -> list[Any]:
        return [self.kind, self.arch, self.suffix, self.compression, self.ptx_isa]

    @classmethod
    def from_json(cls, raw: Any) -> FatbinEntry:
        """The inverse of :meth:`to_json`; ElfError for anything else (a corrupt cache)."""
        if not isinstance(raw, list) or len(raw) != 5:
            raise ElfError(f"malformed fatbin entry {raw!r}")
        kind, arch, suffix, compression, isa = raw
        if (
            kind not in _KINDS
            or not isinstance(arch, int)
            or isinstance(arch, bool)
            or not 0 <= arch < 10_000
            or suffix not in _SUFFIXES
            or compression not in _COMPRESSIONS
            or not (isa is None or (isinstance(isa, str) and re.fullmatch(r"\d+\.\d+", isa)))
        ):
            raise ElfError(f"malformed fatbin entry {raw!r}")
        return cls(kind=kind, arch=arch, suffix=suffix, compression=compression, ptx_isa=isa)


@dataclass(frozen=True)
class Fatbin:
    """The distinct code objects of one file (a library repeats one arch in many containers)."""

    path: str
    entries: tuple[FatbinEntry, ...]
    problems: tuple[str, ...] = ()

    @property
    def sass(self) -> tuple[str, ...]:
        return tuple(sorted({e.name for e in self.entries if e.kind == "sass"}))

    @property
    def ptx(self) -> tuple[str, ...]:
        return tuple(sorted({e.name for e in self.entries if e.kind == "ptx"}))

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "entries": [e.to_json() for e in self.entries], "problems": list(self.problems)}

    @classmethod
    def from_json(cls, raw: Any) -> Fatbin:
        """The inverse of :meth:`to_json`; ElfError for anything else (a corrupt cache)."""
        if not isinstance(raw, dict) or set(raw) != {"path", "entries", "problems"}:
            raise ElfError("malformed fatbin facts")
        path, entries, problems = raw["path"], raw["entries"], raw["problems"]
        if not isinstance(path, str) or not isinstance(entries, list) or not isinstance(problems, list):
            raise ElfError("malformed fatbin facts")
        if not all(isinstance(p, str) for p in problems):
            raise ElfError("malformed fatbin problems")
        return cls(path=path, entries=tuple(FatbinEntry.from_json(e) for e in entries), problems=tuple(problems))


_SHT_PROGBITS = 1
_SHF_ALLOC = 0x2
_SHF_EXECINSTR = 0x4

_Buffer = mmap.mmap | bytes | memoryview


def _elf64_sections(view: _Buffer, size: int) -> list[tuple[bytes, int, int, int, int]] | None:
    """(name, type, flags, offset, size) of each section of a little-endian ELF64 file, read with ``struct``
    (System V gABI, "Sections"); None when the headers are not plainly that, for pyelftools to judge."""
    if size < _ELF64.size or view[:6] != b"\x7fELF\x02\x01":
        return None
    *_, shoff, _flags, _ehsize, _phes, _phn, shes, shnum, shstrndx = _ELF64.unpack_from(view, 0)
    if shes < _SHDR64.size or not 0 < shnum < 0xFF00 or shstrndx >= shnum or shoff + shes * shnum > size:
        return None
    headers = [_SHDR64.unpack_from(view, shoff + i * shes) for i in range(shnum)]
    str_off, str_size = headers[shstrndx][4], headers[shstrndx][5]
    if str_off + str_size > size:
        return None
    names = bytes(view[str_off : str_off + str_size])
    out = []
    for name_at, kind, flags, _addr, offset, length, *_ in headers:
        if name_at >= max(str_size, 1):
            return None
        out.append((names[name_at : names.find(b"\0", name_at)], kind, flags, offset, length))
    return out


def _section_ranges(
    fd: int, view: _Buffer, size: int, path: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(offset, size) of the fatbin sections, and of the other data sections that may embed containers.

    A standalone .fatbin file is one range. Some libraries (cuFFT, CUPTI) keep containers outside
    ``.nv_fatbin``, in data sections registered by their own code, so the other allocated, non-executable
    sections are searched too: reading only ``.nv_fatbin`` would under-report their archs.
    """
    head = bytes(view[:64])
    if len(head) >= 4 and struct.unpack_from("<I", head)[0] == CONTAINER_MAGIC:
        return [(0, size)], []
    if head[:4] != b"\x7fELF":
        raise ElfError(f"{path}: neither an ELF file nor a fatbinary")
    named: list[tuple[int, int]] = []
    other: list[tuple[int, int]] = []
    sections = _elf64_sections(view, size)
    if sections is not None:
        wanted = {n.encode() for n in _SECTIONS}
        for name, kind, flags, offset, length in sections:
            if kind != _SHT_PROGBITS:
                continue
            if name in wanted:
                named.append((offset, length))
            elif flags & _SHF_ALLOC and not flags & _SHF_EXECINSTR:
                other.append((offset, length))
    else:
        named, other = _pyelftools_ranges(fd, path)
    if any(offset + length > size for offset, length in named):
        raise ElfError(f"{path}: fatbin section runs past the end of the file")
    return named, [(offset, length) for offset, length in other if offset + length <= size and length]


def _pyelftools_ranges(fd: int, path: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    # lazy: pyelftools only for files the section scan cannot read directly (32-bit, big-endian, odd headers)
    from elftools.common.exceptions import ELFError as PyElfError
    from elftools.elf.constants import SH_FLAGS
    from elftools.elf.elffile import ELFFile

    named: list[tuple[int, int]] = []
    other: list[tuple[int, int]] = []
    with os.fdopen(os.dup(fd), "rb") as stream:
        try:
            for section in ELFFile(stream).iter_sections():
                if section["sh_type"] != "SHT_PROGBITS":
                    continue
                span = (int(section["sh_offset"]), int(section["sh_size"]))
                if section.name in _SECTIONS:
                    named.append(span)
                elif section["sh_flags"] & SH_FLAGS.SHF_ALLOC and not section["sh_flags"] & SH_FLAGS.SHF_EXECINSTR:
                    other.append(span)
        except (PyElfError, struct.error, ValueError, IndexError, UnicodeDecodeError, OSError) as e:
            raise ElfError(f"{path}: corrupt ELF headers: {e}") from e
    return named, other


def _embedded(
    view: mmap.mmap, ranges: list[tuple[int, int]], memo: dict[tuple[int, ...], FatbinEntry]
) -> list[FatbinEntry]:
    """Entries of well-formed containers found by their magic inside ``ranges``.

    The magic can occur by chance in data, so a match counts only when its header and every entry fit;
    a match that does not is data, not a malformed container. The needle is the magic with version 1 and
    header size 16, the only headers accepted: an 8-byte needle searches faster than the 4-byte magic.
    """
    found: list[FatbinEntry] = []
    magic = _CONTAINER.pack(CONTAINER_MAGIC, 1, _CONTAINER.size, 0)[:8]
    for start, length in ranges:
        end = start + length
        pos = view.find(magic, start, end)
        while pos != -1 and pos + _CONTAINER.size <= end:
            _magic, _version, header_size, files_size = _CONTAINER.unpack_from(view, pos)
            container_end = pos + header_size + files_size
            if files_size and container_end <= end:
                problems: list[str] = []  # only whether there are any: a bad match is data
                entries = _entries(view, pos, header_size + files_size, problems, memo)
                if entries and not problems:
                    found.extend(entries)
                    pos = view.find(magic, container_end, end)
                    continue
            pos = view.find(magic, pos + 1, end)
    return found


def _entries(
    view: _Buffer, start: int, length: int, problems: list[str], memo: dict[tuple[int, ...], FatbinEntry]
) -> list[FatbinEntry]:
    found: list[FatbinEntry] = []
    end = start + length
    pos = start
    while pos + _CONTAINER.size <= end:
        magic, _version, header_size, files_size = _CONTAINER.unpack_from(view, pos)
        if magic != CONTAINER_MAGIC:
            # Containers are padded to alignment; zeros between them are normal, anything else is not.
            if magic == 0:
                pos += 8
                continue
            problems.append(f"bad container magic 0x{magic:08x} at offset {pos}")
            break
        container_end = pos + header_size + files_size
        if header_size < _CONTAINER.size or container_end > end:
            problems.append(f"container at offset {pos} declares {files_size} bytes past its section")
            break
        q = pos + header_size
        while q + _ENTRY_MIN <= container_end:
            kind, _ev, entry_header, padded = _ENTRY.unpack_from(view, q)
            minor, major, arch = _VERSION_ARCH.unpack_from(view, q + 0x18)
            (flags,) = _FLAGS.unpack_from(view, q + 0x28)
            if entry_header < _ENTRY_MIN or q + entry_header + padded > container_end:
                problems.append(f"entry at offset {q} runs past its container")
                break
            payload = q + entry_header
            q = payload + padded
            flags &= _FLAGS_READ
            compressed = bool(flags & (_FLAG_LZ4 | _FLAG_ZSTD))
            if kind == _KIND_ELF and not compressed and not _has_kernels(view, payload, padded):
                continue
            isa = (major, minor) if kind == _KIND_PTX else (0, 0)
            if kind == _KIND_PTX and not compressed:
                isa = _ptx_text_version(view, payload, padded) or isa
            key = (kind, arch, flags, *isa)
            entry = memo.get(key)
            if entry is None:
                entry = memo[key] = _entry(kind, arch, flags, isa)
            found.append(entry)
            if len(found) > _MAX_ENTRIES:
                problems.append("absurd number of fatbin entries")
                return found
        pos = container_end
    return found


def _has_kernels(view: _Buffer, start: int, length: int) -> bool:
    """Whether an uncompressed cubin has a ``.text.*`` section (a kernel). Anything not a readable 64-bit ELF
    counts as code: only a cubin proven empty is skipped."""
    sections = _elf64_sections(memoryview(view)[start : start + length], length)
    return sections is None or any(name.startswith(b".text.") for name, *_ in sections)


def _ptx_text_version(view: _Buffer, start: int, length: int) -> tuple[int, int] | None:
    """The ``.version`` of an uncompressed PTX text: what the driver's JIT reads."""
    m = _PTX_VERSION.search(view[start : start + min(length, _PTX_HEAD)])
    return (int(m[1]), int(m[2])) if m else None


def _entry(kind: int, arch: int, flags: int, isa: tuple[int, int]) -> FatbinEntry:
    suffix = "a" if flags & _FLAG_SUFFIX_A else "f" if flags & _FLAG_SUFFIX_F else ""
    compression = "zstd" if flags & _FLAG_ZSTD else "lz4" if flags & _FLAG_LZ4 else None
    name = {_KIND_PTX: "ptx", _KIND_ELF: "sass"}.get(kind, "other")
    ptx_isa = f"{isa[0]}.{isa[1]}" if kind == _KIND_PTX and isa[0] else None
    return FatbinEntry(kind=name, arch=arch, suffix=suffix, compression=compression, ptx_isa=ptx_isa)


def read_fatbin(path: str | os.PathLike[str]) -> Fatbin:
    """The fatbin entries of an ELF file (``.nv_fatbin``, ``__nv_relfatbin``) or a standalone ``.fatbin``.

    The entries are distinct, in the order first found. A file without GPU code gives no entries. A malformed
    container is a problem of the result; only a file that cannot be read at all raises :class:`ElfError`.
    """
    name = os.fspath(path)
    fd, st = open_regular(name)
    try:
        if st.st_size == 0:
            raise ElfError(f"{name}: neither an ELF file nor a fatbinary (empty)")
        try:
            view = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise ElfError(f"{name}: cannot map: {e}") from e
        with view:
            problems: list[str] = []
            entries: list[FatbinEntry] = []
            memo: dict[tuple[int, ...], FatbinEntry] = {}
            named, other = _section_ranges(fd, view, st.st_size, name)
            for start, length in named:
                entries.extend(_entries(view, start, length, problems, memo))
            entries.extend(_embedded(view, other, memo))
            return Fatbin(path=name, entries=tuple(dict.fromkeys(entries)), problems=tuple(problems))
    finally:
        os.close(fd)


def runs_on(entry: FatbinEntry, cc: int) -> bool:
    """Whether ``entry`` can run on a GPU of compute capability ``cc`` (e.g. 86 for 8.6).

    CUDA C++ Programming Guide, "Binary Compatibility" / "PTX Compatibility", and ptxas 13.0's help:
    SASS for sm_XY runs on X.z with z >= Y; ``a`` SASS only on X.Y itself; ``f`` SASS on the same family
    (same major) with z >= Y. PTX for compute_XY is JIT-compiled for any cc >= XY; ``a`` PTX only for XY.
    """
    major, minor = divmod(entry.arch, 10)
    gpu_major, gpu_minor = divmod(cc, 10)
    if entry.kind == "sass":
        if entry.suffix == "a":
            return cc == entry.arch
        return gpu_major == major and gpu_minor >= minor
    if entry.kind == "ptx":
        if entry.suffix == "a":
            return cc == entry.arch
        if entry.suffix == "f":
            return gpu_major == major and gpu_minor >= minor
        return cc >= entry.arch
    return False
