"""What GPU code an ELF file carries: the entries of its CUDA fatbinary containers.

Layout (little-endian) per NVIDIA's ``fatbinary_section.h`` and checked against nvcc 13.0 output:
a container is a 16-byte header (magic 0xBA55ED50, version, header size, payload size) followed by
entries, each a header of at least 0x40 bytes (kind, header size, padded payload size, arch at 0x1C,
flags at 0x28) and its payload. Only headers are read: a multi-GB cuBLAS costs a few KB per entry.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

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


@dataclass(frozen=True)
class FatbinEntry:
    """One code object: SASS for a real arch (``sm_90a``) or PTX for a virtual one (``compute_90``)."""

    kind: str  # "sass" | "ptx" | "other"
    arch: int  # 90 for sm_90 / compute_90
    suffix: str  # "", "a" (arch-specific) or "f" (family-specific)
    compression: str | None  # None, "lz4" or "zstd"

    @property
    def name(self) -> str:
        prefix = "compute" if self.kind == "ptx" else "sm"
        return f"{prefix}_{self.arch}{self.suffix}"


@dataclass(frozen=True)
class Fatbin:
    path: str
    entries: tuple[FatbinEntry, ...]
    problems: tuple[str, ...] = ()

    @property
    def sass(self) -> tuple[str, ...]:
        return tuple(sorted({e.name for e in self.entries if e.kind == "sass"}))

    @property
    def ptx(self) -> tuple[str, ...]:
        return tuple(sorted({e.name for e in self.entries if e.kind == "ptx"}))


def _section_ranges(fd: int, path: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(offset, size) of the fatbin sections, and of the other data sections that may embed containers.

    A standalone .fatbin file is one range. Some libraries (cuFFT) keep most of their containers outside
    ``.nv_fatbin``, in large-model data sections registered by their own code, so the other allocated,
    non-executable sections are searched too: reading only ``.nv_fatbin`` would under-report their archs.
    """
    head = os.pread(fd, 64, 0)
    size = os.fstat(fd).st_size
    if len(head) >= 4 and struct.unpack_from("<I", head)[0] == CONTAINER_MAGIC:
        return [(0, size)], []
    if head[:4] != b"\x7fELF":
        raise ElfError(f"{path}: neither an ELF file nor a fatbinary")
    # lazy: pyelftools only for files the section scan cannot read directly
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
    if any(offset + length > size for offset, length in named):
        raise ElfError(f"{path}: fatbin section runs past the end of the file")
    return named, [(offset, length) for offset, length in other if offset + length <= size and length]


def _embedded(fd: int, ranges: list[tuple[int, int]]) -> list[FatbinEntry]:
    """Entries of well-formed containers found by their magic inside ``ranges``.

    The magic can occur by chance in data, so a match counts only when its header and every entry fit;
    a match that does not is data, not a malformed container.
    """
    if not ranges:
        return []
    found: list[FatbinEntry] = []
    magic = struct.pack("<I", CONTAINER_MAGIC)
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as view:
        for start, length in ranges:
            end = start + length
            pos = view.find(magic, start, end)
            while pos != -1:
                if pos + _CONTAINER.size > end:  # a magic in the range's last 15 bytes: data, not a header
                    break
                _magic, version, header_size, files_size = _CONTAINER.unpack_from(view, pos)
                container_end = pos + header_size + files_size
                if version == 1 and header_size == _CONTAINER.size and files_size and container_end <= end:
                    problems: list[str] = []
                    entries = _entries(fd, pos, header_size + files_size, problems)
                    if entries and not problems:
                        found.extend(entries)
                        pos = view.find(magic, container_end, end)
                        continue
                pos = view.find(magic, pos + 4, end)
    return found


def _entries(fd: int, start: int, length: int, problems: list[str]) -> list[FatbinEntry]:
    found: list[FatbinEntry] = []
    end = start + length
    pos = start
    while pos + _CONTAINER.size <= end:
        magic, _version, header_size, files_size = _CONTAINER.unpack(os.pread(fd, _CONTAINER.size, pos))
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
            raw = os.pread(fd, _ENTRY_MIN, q)
            kind, _ev, entry_header, padded = _ENTRY.unpack_from(raw)
            arch = struct.unpack_from("<I", raw, 0x1C)[0]
            flags = struct.unpack_from("<Q", raw, 0x28)[0]
            if entry_header < _ENTRY_MIN or q + entry_header + padded > container_end:
                problems.append(f"entry at offset {q} runs past its container")
                break
            found.append(_entry(kind, arch, flags))
            if len(found) > _MAX_ENTRIES:
                problems.append("absurd number of fatbin entries")
                return found
            q += entry_header + padded
        pos = container_end
    return found


def _entry(kind: int, arch: int, flags: int) -> FatbinEntry:
    suffix = "a" if flags & _FLAG_SUFFIX_A else "f" if flags & _FLAG_SUFFIX_F else ""
    compression = "zstd" if flags & _FLAG_ZSTD else "lz4" if flags & _FLAG_LZ4 else None
    name = {_KIND_PTX: "ptx", _KIND_ELF: "sass"}.get(kind, "other")
    return FatbinEntry(kind=name, arch=arch, suffix=suffix, compression=compression)


def read_fatbin(path: str | os.PathLike[str]) -> Fatbin:
    """The fatbin entries of an ELF file (``.nv_fatbin``, ``__nv_relfatbin``) or a standalone ``.fatbin``.

    A file without GPU code gives no entries. A malformed container is a problem of the result; only a
    file that cannot be read at all raises :class:`ElfError`.
    """
    name = os.fspath(path)
    fd, _st = open_regular(name)
    try:
        problems: list[str] = []
        entries: list[FatbinEntry] = []
        named, other = _section_ranges(fd, name)
        for start, length in named:
            entries.extend(_entries(fd, start, length, problems))
        entries.extend(_embedded(fd, other))
        return Fatbin(path=name, entries=tuple(entries), problems=tuple(problems))
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
