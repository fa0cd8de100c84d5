"""What GPU code an ELF file carries: the entries of its CUDA fatbinary containers.

Layout (little-endian) per NVIDIA's ``fatbinary_section.h`` and checked against nvcc 13.0 output:
a container is a 16-byte header (magic 0xBA55ED50, version, header size, payload size) followed by
entries, each a header of at least 0x40 bytes (kind, header size, padded payload size, arch at 0x1C,
flags at 0x28) and its payload. Only headers are read: a multi-GB cuBLAS costs a few KB per entry.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass

from .errors import ElfError

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


def _open_regular(path: str) -> int:
    # O_NONBLOCK: a FIFO named like a library must not hang us.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ElfError(f"{path}: cannot open: {e.strerror}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ElfError(f"{path}: not a regular file")
    return fd


def _section_ranges(fd: int, path: str) -> list[tuple[int, int]]:
    """(offset, size) of the fatbin sections, or the whole file for a standalone .fatbin."""
    head = os.pread(fd, 64, 0)
    size = os.fstat(fd).st_size
    if len(head) >= 4 and struct.unpack_from("<I", head)[0] == CONTAINER_MAGIC:
        return [(0, size)]
    if head[:4] != b"\x7fELF":
        raise ElfError(f"{path}: neither an ELF file nor a fatbinary")
    from elftools.common.exceptions import ELFError as PyElfError
    from elftools.elf.elffile import ELFFile

    with os.fdopen(os.dup(fd), "rb") as stream:
        try:
            elf = ELFFile(stream)
            ranges = []
            for name in _SECTIONS:
                section = elf.get_section_by_name(name)
                if section is not None and section["sh_type"] != "SHT_NOBITS":
                    ranges.append((int(section["sh_offset"]), int(section["sh_size"])))
        except (PyElfError, struct.error, ValueError, IndexError, UnicodeDecodeError) as e:
            raise ElfError(f"{path}: corrupt ELF headers: {e}") from e
    for offset, length in ranges:
        if offset + length > size:
            raise ElfError(f"{path}: fatbin section runs past the end of the file")
    return ranges


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
    fd = _open_regular(name)
    try:
        problems: list[str] = []
        entries: list[FatbinEntry] = []
        for start, length in _section_ranges(fd, name):
            entries.extend(_entries(fd, start, length, problems))
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
