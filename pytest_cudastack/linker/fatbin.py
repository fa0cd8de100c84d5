"""What GPU code an ELF file carries: the entries of its CUDA fatbinary containers.

Layout (little-endian) per NVIDIA's ``fatbinary_section.h`` and checked against nvcc 13.0 output:
a container is a 16-byte header (magic 0xBA55ED50, version, header size, payload size) followed by
entries, each a header of at least 0x40 bytes (kind, header size, padded payload size, the code's version
as minor at 0x18 and major at 0x1A, arch at 0x1C, flags at 0x28) and its payload. Only headers are read,
seeking from one to the next (``pread`` in a fatbin section): a multi-GB cuBLAS costs a few KB per
container. Which sections are read is :func:`_section_ranges`' rule. Two payloads are looked into, and only
when stored uncompressed: a SASS cubin's section headers, until one cubin of that arch and flags proves to
hold a kernel (an image without a ``.text.*`` section holds none: cuFFTW ships such an sm_75 image), and a
PTX text's ``.version`` line. A compressed payload is never decompressed; its PTX ISA is the entry header's
version (the PTX ``.version`` nvcc 13.0 writes there), or unknown when that is 0.0.
"""

from __future__ import annotations

import functools
import mmap
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_cudastack._sysio import Span, open_span
from pytest_cudastack.errors import ElfError

__all__ = ["Fatbin", "FatbinEntry", "read_fatbin", "runs_on"]

CONTAINER_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")
# An entry header's fields read at once: kind, (its version), header size, padded payload size, (8 bytes),
# the code's version minor and major, arch, (8 bytes), flags.
_ENTRY_HEAD = struct.Struct("<H2xIQ8xHHI8xQ")
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
# Alignment padding between containers in other data; a longer run of zeros ends a walk there.
_PAD = 64
# One read in a fatbin section: a container's header and the first entry's, and small entries after it.
_WINDOW = 4096
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


_Read = Callable[[int, int], bytes]
"""``read(offset, n)``: up to ``n`` bytes of a file (or of a payload in it) from ``offset``."""


def _elf64_sections(read: _Read, size: int) -> list[tuple[bytes, int, int, int, int]] | None:
    """(name, type, flags, offset, size) of each section of a little-endian ELF64 file, read with ``struct``
    (System V gABI, "Sections"); None when the headers are not plainly that, for pyelftools to judge."""
    head = read(0, _ELF64.size)
    if size < _ELF64.size or len(head) < _ELF64.size or head[:6] != b"\x7fELF\x02\x01":
        return None
    *_, shoff, _flags, _ehsize, _phes, _phn, shes, shnum, shstrndx = _ELF64.unpack_from(head, 0)
    if shes < _SHDR64.size or not 0 < shnum < 0xFF00 or shstrndx >= shnum or shoff + shes * shnum > size:
        return None
    table = read(shoff, shes * shnum)
    if len(table) < shes * shnum:
        return None
    headers = [_SHDR64.unpack_from(table, i * shes) for i in range(shnum)]
    str_off, str_size = headers[shstrndx][4], headers[shstrndx][5]
    if str_off + str_size > size:
        return None
    names = read(str_off, str_size)
    out = []
    for name_at, kind, flags, _addr, offset, length, *_ in headers:
        if name_at >= max(str_size, 1):
            return None
        out.append((names[name_at : names.find(b"\0", name_at)], kind, flags, offset, length))
    return out


# Sections whose format is defined by the toolchain (unwind tables, GOT, relocated pointers, thread data,
# constructors, cudart's registration records) or which are only ever small: never a byte array, never a
# container. Scanning them cost a third of the data-section scan on the torch venv and never found one.
_NOT_DATA = frozenset(
    (
        b".eh_frame",
        b".eh_frame_hdr",
        b".gcc_except_table",
        b".got",
        b".got.plt",
        b".data.rel.ro",
        b".tdata",
        b".ctors",
        b".dtors",
        b".interp",
        b".nvFatBinSegment",
        b".tm_clone_table",
        b".stapsdt.base",
        b".relro_padding",
        b"__nv_module_id",
    )
)
# The standard data sections of gcc/clang output (and their -ffunction-sections/-fdata-sections and
# -mcmodel=medium large-data forms): scanned only in a file that registers no code through cudart.
_STANDARD = (b".rodata", b".data", b".ldata", b".lrodata", b".bss")
_SEGMENT = b".nvFatBinSegment"


def _standard(name: bytes) -> bool:
    return any(name == s or name.startswith(s + b".") for s in _STANDARD)


def _section_ranges(
    span: Span, read: _Read, size: int, path: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(offset, size) of the fatbin sections, and of the other data sections that may embed containers.

    A standalone .fatbin file is one range. Only a file with a fatbin section plausibly carries device code;
    in such a file NVIDIA's libraries keep more containers outside ``.nv_fatbin``, in data sections their
    own code loads through the driver API (measured on the torch 2.14.1 venv's CUDA 13 wheels):

    * a section of a name of its own (cuBLASLt, cuDNN and cuSPARSELt's ``.cask_resource``): always scanned,
      it is nearly all containers;
    * the standard data sections (cuFFT's ``.ldata``: 11 of its 12 SASS archs): scanned only in a file with no
      ``.nvFatBinSegment``, i.e. that registers none of its code through cudart's ``__cudaRegisterFatBinary``
      (cuFFT). A library that does (cuBLASLt, cuRAND, cuDNN, torch) has its kernels in ``.nv_fatbin`` and
      hundreds of MB of tables in ``.rodata``/``.ldata``: scanning them was 0.6 s of a 1 s cold ``tree`` and
      found nothing but cuSPARSE's copies of sm_50-sm_70 code that CUDA 13 cannot run.

    A file without a fatbin section is not scanned: containers a program only embeds as data (CUPTI's, in
    ``.rodata``) are not listed. Reading them cost a scan of every host library's data (libtorch_cpu,
    libtriton, nvrtc: 230 MB) for about 1 MB of them.
    """
    head = read(0, 64)
    if len(head) >= 4 and struct.unpack_from("<I", head)[0] == CONTAINER_MAGIC:
        return [(0, size)], []
    if head[:4] != b"\x7fELF":
        raise ElfError(f"{path}: neither an ELF file nor a fatbinary")
    named: list[tuple[int, int]] = []
    standard: list[tuple[int, int]] = []
    custom: list[tuple[int, int]] = []
    segment = False
    sections = _elf64_sections(read, size)
    if sections is None:
        sections = _pyelftools_sections(span, path)
    wanted = {n.encode() for n in _SECTIONS}
    for name, kind, flags, offset, length in sections:
        segment = segment or name == _SEGMENT
        if kind != _SHT_PROGBITS:
            continue
        if name in wanted:
            named.append((offset, length))
        elif flags & _SHF_ALLOC and not flags & _SHF_EXECINSTR and name not in _NOT_DATA:
            (standard if _standard(name) else custom).append((offset, length))
    if any(offset + length > size for offset, length in named):
        raise ElfError(f"{path}: fatbin section runs past the end of the file")
    if not named:
        return [], []
    other = custom if segment else custom + standard
    return named, [(offset, length) for offset, length in other if offset + length <= size and length]


def _pyelftools_sections(span: Span, path: str) -> list[tuple[bytes, int, int, int, int]]:
    """:func:`_elf64_sections` for the files it leaves to pyelftools (32-bit, big-endian, odd headers)."""
    # lazy: pyelftools only for files the section scan cannot read directly
    from elftools.common.exceptions import ELFError as PyElfError
    from elftools.elf.elffile import ELFFile

    out: list[tuple[bytes, int, int, int, int]] = []
    with span.stream() as stream:
        try:
            for section in ELFFile(stream).iter_sections():
                kind = _SHT_PROGBITS if section["sh_type"] == "SHT_PROGBITS" else 0
                extent = (int(section["sh_offset"]), int(section["sh_size"]))
                out.append((section.name.encode(), kind, int(section["sh_flags"]), *extent))
        except (PyElfError, struct.error, ValueError, IndexError, UnicodeDecodeError, OSError) as e:
            raise ElfError(f"{path}: corrupt ELF headers: {e}") from e
    return out


def _embedded(
    view: mmap.mmap,
    read: _Read,
    ranges: list[tuple[int, int]],
    memo: dict[tuple[int, ...], FatbinEntry],
    shift: int = 0,
) -> list[FatbinEntry]:
    """Entries of well-formed containers found by their magic inside ``ranges``.

    The magic can occur by chance in data, so a match counts only when its header (version 1, header size 16,
    the only headers accepted) and every entry fit; a match that does not is data, not a malformed container.
    The needle is the 4-byte magic alone: CPython's search skips 5 bytes per step on its rare last byte 0xBA,
    where the 8-byte magic+version+size needle (ending in 0x00) took 1.7x as long on the same sections. From
    a match the containers are walked header to header (cuFFT's .ldata: 24,000 of them back to back); the
    search resumes where the walk stops.
    """
    found: list[FatbinEntry] = []
    magic = struct.pack("<I", CONTAINER_MAGIC)
    # the file's bytes start at ``shift`` in the mapping (a layer-backed file, mapped from its page): the
    # search runs on the mapping, the walk on the file's offsets
    data: mmap.mmap | memoryview = memoryview(view)[shift:] if shift else view
    try:
        for start, length in ranges:
            end = start + length
            pos = view.find(magic, start + shift, end + shift) - shift
            while pos >= 0:
                got, stop = _walk(read, pos, end, memo, data=True, view=data)
                found.extend(got)
                pos = view.find(magic, max(stop, pos + 1) + shift, end + shift) - shift
    finally:
        if isinstance(data, memoryview):
            data.release()
    return found


def _walk(
    read: _Read,
    start: int,
    end: int,
    memo: dict[tuple[int, ...], FatbinEntry],
    problems: list[str] | None = None,
    *,
    data: bool = False,
    view: mmap.mmap | memoryview | None = None,
) -> tuple[list[FatbinEntry], int]:
    """The entries of the containers from ``start``, header to header, and the offset where the walk stopped.

    Only entry headers are read, and an uncompressed payload's first bytes only while its (kind, arch, flags)
    is not yet known to hold code (``memo``). In a fatbin section (``data`` false) what does not parse is
    a problem. In other data (``data`` true) the walk ends quietly at the first thing that is not a container
    (more than :data:`_PAD` zeros, other bytes, a header other than version 1 and size 16) and a container
    whose entries do not fit is data: its entries are dropped and the keys it settled forgotten.

    Without a ``view`` (a fatbin section) the headers are read with ``read`` (``pread``), 4 KB at a time: they
    lie one every 100 KB or so, and a read costs a third of what faulting in (and unmapping) a page of a
    mapping does. With one (other data, where containers lie back to back) they are read from the mapping.
    """

    container: Callable[[int], tuple[int, ...]]
    entry_head: Callable[[int], tuple[int, ...]]
    if view is not None:
        container = functools.partial(_CONTAINER.unpack_from, view)
        entry_head = functools.partial(_ENTRY_HEAD.unpack_from, view)
    else:
        window: list[Any] = [b"", 0]  # the bytes last read and their offset

        def fields(layout: struct.Struct, offset: int) -> tuple[int, ...]:
            buf, base = window
            rel = offset - base
            if rel < 0 or rel + layout.size > len(buf):
                buf = window[0] = read(offset, _WINDOW)
                window[1] = offset
                rel = 0
                if len(buf) < layout.size:
                    raise ElfError(f"file shrank while read (offset {offset})")
            return layout.unpack_from(buf, rel)

        container = functools.partial(fields, _CONTAINER)
        entry_head = functools.partial(fields, _ENTRY_HEAD)

    found: list[FatbinEntry] = []
    pos = start
    padding: int | None = None  # where the zeros before ``pos`` began
    while pos + _CONTAINER.size <= end:
        magic, version, header_size, files_size = container(pos)
        if magic != CONTAINER_MAGIC:
            # Containers are padded to alignment; zeros between them are normal, anything else is not.
            if magic == 0:
                if padding is None:
                    padding = pos
                if data and pos - padding >= _PAD:
                    break
                pos += 8
                continue
            if problems is not None:
                problems.append(f"bad container magic 0x{magic:08x} at offset {pos}")
            break
        padding = None
        container_end = pos + header_size + files_size
        if data and (version != 1 or header_size != _CONTAINER.size or not files_size or container_end > end):
            break
        if header_size < _CONTAINER.size or container_end > end:
            if problems is not None:
                problems.append(f"container at offset {pos} declares {files_size} bytes past its section")
            break
        mark = len(found)
        settled: list[tuple[int, ...]] = []
        q = pos + header_size
        bad = False
        while q + _ENTRY_MIN <= container_end:
            kind, entry_header, padded, minor, major, arch, flags = entry_head(q)
            if entry_header < _ENTRY_MIN or q + entry_header + padded > container_end:
                if problems is not None:
                    problems.append(f"entry at offset {q} runs past its container")
                bad = True
                break
            payload = q + entry_header
            q = payload + padded
            # the header alone settles an entry whose like was read before: nearly every one of a library's
            raw = (kind, arch, flags & _FLAGS_READ, major, minor)
            if raw in memo:
                continue
            entry = _new_entry(read, payload, padded, raw)
            if entry is None:
                continue
            if kind != _KIND_PTX or entry.compression is not None:
                memo[raw] = entry  # an uncompressed PTX text's .version is read each time
                settled.append(raw)
            found.append(entry)
            if len(found) > _MAX_ENTRIES:
                if problems is not None:
                    problems.append("absurd number of fatbin entries")
                return found, container_end
        if bad:
            if data:
                for key in settled:
                    del memo[key]
                del found[mark:]
                return found, pos
            break
        pos = container_end
    return found, pos


def _new_entry(read: _Read, payload: int, padded: int, raw: tuple[int, ...]) -> FatbinEntry | None:
    """The entry of a header not met before; None for an uncompressed cubin without a kernel."""
    kind, arch, flags, major, minor = raw
    compressed = bool(flags & (_FLAG_LZ4 | _FLAG_ZSTD))
    isa = (major, minor) if kind == _KIND_PTX else (0, 0)
    if kind == _KIND_PTX and not compressed:
        isa = _ptx_text_version(read, payload, padded) or isa
    if kind == _KIND_ELF and not compressed and not _has_kernels(read, payload, padded):
        return None
    return _entry(kind, arch, flags, isa)


def _has_kernels(read: _Read, start: int, length: int) -> bool:
    """Whether an uncompressed cubin has a ``.text.*`` section (a kernel). Anything not a readable 64-bit ELF
    counts as code: only a cubin proven empty is skipped."""

    def inside(offset: int, n: int) -> bytes:
        return read(start + offset, max(0, min(n, length - offset)))

    sections = _elf64_sections(inside, length)
    return sections is None or any(name.startswith(b".text.") for name, *_ in sections)


def _ptx_text_version(read: _Read, start: int, length: int) -> tuple[int, int] | None:
    """The ``.version`` of an uncompressed PTX text: what the driver's JIT reads."""
    m = _PTX_VERSION.search(read(start, min(length, _PTX_HEAD)))
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
    span, st = open_span(name)
    try:
        if st.st_size == 0:
            raise ElfError(f"{name}: neither an ELF file nor a fatbinary (empty)")
        read = _reader(span)

        problems: list[str] = []
        entries: list[FatbinEntry] = []
        memo: dict[tuple[int, ...], FatbinEntry] = {}
        try:
            named, other = _section_ranges(span, read, st.st_size, name)
            for start, length in named:
                entries.extend(_walk(read, start, start + length, memo, problems)[0])
        except OSError as e:
            raise ElfError(f"{name}: cannot read: {e}") from e
        except ElfError as e:
            if str(e).startswith(name):
                raise
            raise ElfError(f"{name}: {e}") from e
        if other:  # mapped only to search other data: a page of it is faulted in only where the search runs
            try:
                view, shift = span.map()
            except (OSError, ValueError) as e:
                raise ElfError(f"{name}: cannot map: {e}") from e
            with view:
                entries.extend(_embedded(view, read, other, memo, shift))
        return Fatbin(path=name, entries=tuple(dict.fromkeys(entries)), problems=tuple(problems))
    finally:
        span.close()


def _reader(span: Span) -> _Read:
    def read(offset: int, n: int) -> bytes:
        return span.pread(n, offset)

    return read


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
