"""What an ELF file declares: class, machine, soname, DT_NEEDED, RPATH/RUNPATH, CUDA sections, PyInit.

Only the ELF header, the program/section header tables and the few small tables that hold these facts are
read, so a 700 MB library costs a few kilobytes of I/O. Files are opened with ``O_NONBLOCK`` and checked to be
regular files before anything is read, so FIFOs, sockets and devices never block. Every failure becomes an
:class:`~pytest_cudastack.errors.ElfError` naming the file.

Two readers, one answer. A fast reader (``_Fast``, in the style of packaging's ``_elffile``: ``struct``
layouts for ELF32/ELF64, little and big endian, and bounded ``os.pread`` calls) handles the common case: ELF
header; program headers (PT_INTERP, PT_DYNAMIC, PT_LOAD); section headers and their name table (only to find
the CUDA sections and the tables below); the dynamic table of the SHT_DYNAMIC section with strings from the
string table it links to (or, in a file without section headers, PT_DYNAMIC with DT_STRTAB mapped through
PT_LOAD); SHT_GNU_verneed; the GNU/SysV hash table for ``PyInit_<mod>``. It costs about a tenth of a
millisecond per file and never imports pyelftools. It checks every offset and count against the file and the
table it belongs to, and on anything unusual (an entry outside its table, an unterminated string, a compressed
or foreign-typed linked section, e_shnum/e_phnum escapes, Solaris tags, an unknown e_type, ...) it declines:
pyelftools (a declared dependency, the reference reader) then reads the file and gives the result or the
precise :class:`ElfError`. The fast reader raises only for a bad identification (magic, class, data, size),
with the same words. Where it answers, the answer is the one pyelftools gives (tests/test_elf.py compares
both readers on gcc-built files, system libraries, fuzzed files and, in the ``real`` tier, a torch venv).
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, fields
from typing import IO, Any, NamedTuple

from pytest_cudastack._sysio import Span, open_span
from pytest_cudastack.errors import ElfError

__all__ = [
    "CUDA_SECTIONS",
    "EM_NAMES",
    "MAX_NEEDED",
    "MAX_PATH_ELEMENTS",
    "MAX_STRING_BYTES",
    "ElfInfo",
    "VersionNeed",
    "exports",
    "looks_like_elf",
    "machine_name",
    "read_elf",
]

log = logging.getLogger(__name__)

CUDA_SECTIONS: tuple[str, ...] = (".nv_fatbin", "__nv_relfatbin", ".nvFatBinSegment")

EM_NAMES: dict[int, str] = {
    0: "none",
    2: "SPARC",
    3: "i386",
    8: "MIPS",
    20: "PowerPC",
    21: "PowerPC64",
    22: "S390",
    40: "ARM",
    43: "SPARC V9",
    50: "IA-64",
    62: "x86-64",
    183: "AArch64",
    243: "RISC-V",
    258: "LoongArch",
}

_ET_NAMES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}
_DF_1_NODEFLIB = 0x800
_SHN_UNDEF = 0


def machine_name(machine: int) -> str:
    """Human name of an ``e_machine`` value, e.g. ``machine_name(62) == "x86-64"``."""
    return EM_NAMES.get(machine, f"machine {machine}")


@dataclass(frozen=True)
class VersionNeed:
    """One DT_VERNEED entry: the file (soname) and the symbol versions needed from it."""

    file: str
    versions: tuple[str, ...]


@dataclass(frozen=True)
class ElfInfo:
    """The facts one ELF file declares; see the module docstring."""

    path: str
    elf_class: int
    little_endian: bool
    machine: int
    osabi: int
    elf_type: str
    interpreter: str | None
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    nodeflib: bool
    version_needs: tuple[VersionNeed, ...]
    cuda_sections: tuple[str, ...]
    pyinit: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "elf_class": self.elf_class,
            "little_endian": self.little_endian,
            "machine": self.machine,
            "osabi": self.osabi,
            "elf_type": self.elf_type,
            "interpreter": self.interpreter,
            "soname": self.soname,
            "needed": list(self.needed),
            "rpath": list(self.rpath),
            "runpath": list(self.runpath),
            "nodeflib": self.nodeflib,
            "version_needs": [{"file": v.file, "versions": list(v.versions)} for v in self.version_needs],
            "cuda_sections": list(self.cuda_sections),
            "pyinit": self.pyinit,
        }

    @classmethod
    def from_json(cls, d: Any) -> ElfInfo:
        """Inverse of :meth:`to_json`; raises ``ValueError`` (ElfError) on a malformed mapping. The mapping
        may come from a cache file anyone could have written, so every field must have exactly the type
        :meth:`to_json` writes: nothing is coerced (``"needed": "libc.so.6"`` is malformed, not the needed
        names ``l``, ``i``, ``b``, ...)."""
        try:
            if not isinstance(d, dict) or set(d) != _JSON_FIELDS:
                raise TypeError("not a mapping of the ElfInfo fields")
            vns = d["version_needs"]
            if not isinstance(vns, list) or not all(
                isinstance(v, dict) and set(v) == {"file", "versions"} and type(v["file"]) is str for v in vns
            ):
                raise TypeError("version_needs")
            return cls(
                path=_typed(d, "path", str),
                elf_class=_typed(d, "elf_class", int),
                little_endian=_typed(d, "little_endian", bool),
                machine=_typed(d, "machine", int),
                osabi=_typed(d, "osabi", int),
                elf_type=_typed(d, "elf_type", str),
                interpreter=_opt_str(d, "interpreter"),
                soname=_opt_str(d, "soname"),
                needed=_strs(d["needed"], "needed"),
                rpath=_strs(d["rpath"], "rpath"),
                runpath=_strs(d["runpath"], "runpath"),
                nodeflib=_typed(d, "nodeflib", bool),
                version_needs=tuple(VersionNeed(v["file"], _strs(v["versions"], "versions")) for v in vns),
                cuda_sections=_strs(d["cuda_sections"], "cuda_sections"),
                pyinit=_opt_str(d, "pyinit"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ElfError(f"malformed ElfInfo mapping: {e!r}") from e


_JSON_FIELDS = frozenset(f.name for f in fields(ElfInfo))


def _typed(d: dict[str, Any], key: str, kind: type[Any]) -> Any:
    """``d[key]`` when its type is exactly *kind* (``True`` is not an int here), else TypeError."""
    v = d[key]
    if type(v) is not kind:
        raise TypeError(f"{key}: {type(v).__name__}, not {kind.__name__}")
    return v


def _opt_str(d: dict[str, Any], key: str) -> str | None:
    v = d[key]
    if v is not None and type(v) is not str:
        raise TypeError(f"{key}: {type(v).__name__}, not str or null")
    return v


def _strs(v: Any, key: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(type(x) is str for x in v):
        raise TypeError(f"{key}: not a list of strings")
    return tuple(v)


def looks_like_elf(path: str | os.PathLike[str]) -> bool:
    """True when *path* is a regular file starting with ``\\x7fELF``; never blocks, never raises."""
    try:
        span, _st = open_span(os.fspath(path))
    except (ElfError, TypeError, ValueError):
        return False
    try:
        return span.pread(4, 0) == b"\x7fELF"
    except OSError:
        return False
    finally:
        span.close()


def exports(path: str | os.PathLike[str], symbol: str) -> bool:
    """Whether the ELF file at *path* defines the dynamic symbol *symbol* (hash-table lookup, a few reads;
    False when it has no hash table). Raises :class:`ElfError` naming the file."""
    p = os.fspath(path)
    span, st = open_span(p)
    try:
        try:
            head = span.pread(64, 0)
        except OSError as e:
            raise ElfError(f"{p}: cannot read: {e.strerror or e}") from e
        elf_class, little = _check_ident(p, head[:16], st.st_size)
        try:
            fast = _Fast(p, span, st.st_size, elf_class, little, head)
            fast.sections()
            gnu = fast.first_of(_SHT_GNU_HASH)
            idx = gnu if gnu >= 0 else fast.first_of(_SHT_HASH)
            if idx < 0:
                return False
            return _hash_lookup(p, span, elf_class, little, fast.secs, idx, gnu >= 0, symbol.encode())
        except _DECLINE:
            pass
        return _exports_pyelftools(p, span, st.st_size, symbol)
    except _EXHAUSTED as e:
        raise _exhausted(p, e) from e
    finally:
        span.close()


def _exports_pyelftools(p: str, span: Span, size: int, symbol: str) -> bool:
    # lazy: pyelftools is the fallback and error-message path; the fast reader never needs it
    from elftools.elf.elffile import ELFFile

    with span.stream() as stream:
        try:
            elf_class, little = _check_ident(p, stream.read(16), size)
            stream.seek(0)
            elf: Any = ELFFile(stream)
            _check_tables(p, elf.header, size, elf_class)
            headers = [elf._get_section_header(i) for i in range(min(elf.num_sections(), 65536))]
            gnu = [i for i, h in enumerate(headers) if h["sh_type"] == "SHT_GNU_HASH"]
            sysv = [i for i, h in enumerate(headers) if h["sh_type"] == "SHT_HASH"]
            idx = gnu[0] if gnu else (sysv[0] if sysv else -1)
            if idx < 0:
                return False
            return _hash_lookup(p, span, elf_class, little, _sec_hdrs(headers), idx, bool(gnu), symbol.encode())
        except ElfError:
            raise
        except Exception as e:  # pyelftools raises many kinds on corrupt input
            raise ElfError(f"{p}: corrupt ELF file: {type(e).__name__}: {e}") from e


def read_elf(path: str | os.PathLike[str]) -> ElfInfo:
    """Read the declared facts of the ELF file at *path*; raises :class:`ElfError` naming the file."""
    p = os.fspath(path)
    span, st = open_span(p)
    try:
        info = _fast_read(p, span, st.st_size)
        return info if info is not None else _pyelftools_read(p, span, st.st_size)
    except _EXHAUSTED as e:
        raise _exhausted(p, e) from e
    finally:
        span.close()


# Input that exhausts memory or the stack is hostile input like any other: the caller gets ElfError.
_EXHAUSTED = (MemoryError, RecursionError)


def _exhausted(p: str, e: BaseException) -> ElfError:
    return ElfError(f"{p}: corrupt ELF file: {type(e).__name__} while reading it")


def _read_elf_fast(path: str | os.PathLike[str]) -> ElfInfo | None:
    """The fast reader alone: None where it declines (tests compare it with :func:`_read_elf_pyelftools`)."""
    p = os.fspath(path)
    span, st = open_span(p)
    try:
        return _fast_read(p, span, st.st_size)
    except _EXHAUSTED as e:
        raise _exhausted(p, e) from e
    finally:
        span.close()


def _read_elf_pyelftools(path: str | os.PathLike[str]) -> ElfInfo:
    """The pyelftools reader alone (the reference the fast reader must agree with)."""
    p = os.fspath(path)
    span, st = open_span(p)
    try:
        return _pyelftools_read(p, span, st.st_size)
    except _EXHAUSTED as e:
        raise _exhausted(p, e) from e
    finally:
        span.close()


def _pyelftools_read(p: str, span: Span, size: int) -> ElfInfo:
    try:
        stream = span.stream()
    except OSError as e:
        raise ElfError(f"{p}: cannot open: {e}") from e
    with stream:
        try:
            return _parse(p, span, stream, size)
        except ElfError:
            raise
        except Exception as e:  # pyelftools raises many kinds on corrupt input
            raise ElfError(f"{p}: corrupt ELF file: {type(e).__name__}: {e}") from e


def _check_ident(p: str, ident: bytes, size: int) -> tuple[int, bool]:
    if ident[:4] != b"\x7fELF"[: len(ident[:4])] or not ident:
        raise ElfError(f"{p}: not an ELF file (bad magic)" if ident else f"{p}: not an ELF file (empty)")
    if len(ident) < 16:
        raise ElfError(f"{p}: file too short for an ELF header ({len(ident)} bytes)")
    cls = {1: 32, 2: 64}.get(ident[4])
    if cls is None:
        raise ElfError(f"{p}: invalid ELF class byte {ident[4]}")
    if ident[5] not in (1, 2):
        raise ElfError(f"{p}: invalid ELF data encoding byte {ident[5]}")
    hdr_size = 52 if cls == 32 else 64
    if size < hdr_size:
        raise ElfError(f"{p}: truncated ELF header ({size} bytes)")
    return cls, ident[5] == 1


def _check_tables(p: str, header: Any, size: int, elf_class: int) -> None:
    """Reject header tables that point past EOF, have absurd counts or entries smaller than the gABI's
    before pyelftools walks them (it parses e_phnum entries e_phentsize bytes apart, even 0 bytes apart:
    a 53-byte file with e_phnum 37,684 took it 3 s)."""
    for what, off, num, ent, least in (
        ("program header", header["e_phoff"], header["e_phnum"], header["e_phentsize"], 32 if elf_class == 32 else 56),
        ("section header", header["e_shoff"], header["e_shnum"], header["e_shentsize"], 40 if elf_class == 32 else 64),
    ):
        if num == 0 or off == 0:
            continue
        if ent < least:
            raise ElfError(f"{p}: {what} entries of {ent} bytes (the gABI's are {least})")
        if off + num * ent > size:
            raise ElfError(f"{p}: {what} table past end of file (offset {off}, {num} x {ent} bytes, size {size})")


# ---------------------------------------------------------------------------------------------- fast reader
# Constants of the ELF gABI (and the GNU extensions), as numbers; pyelftools gives the same values names.
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_SHT_STRTAB, _SHT_HASH, _SHT_DYNAMIC, _SHT_DYNSYM = 3, 5, 6, 11
_SHT_GNU_HASH, _SHT_GNU_VERNEED = 0x6FFFFFF6, 0x6FFFFFFE
_SHF_COMPRESSED = 0x800
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 15, 29
_DT_FLAGS_1 = 0x6FFFFFFB
_ELFOSABI_SOLARIS = 6  # pyelftools decodes Solaris dynamic tags differently (DT_SUNW_*): left to it
_CHECKED_TYPES = frozenset((_SHT_DYNAMIC, _SHT_STRTAB, _SHT_GNU_VERNEED, _SHT_DYNSYM, _SHT_GNU_HASH, _SHT_HASH))
_CUDA_NAMES = {s.encode(): s for s in CUDA_SECTIONS}
_MAX_DYN = 1_000_000
# Caps on what one file may declare, far above any real library (libtorch_cuda.so: 30 DT_NEEDED, one
# RPATH of 8 elements), each hit an ElfError naming the cap: 100,000 DT_NEEDED entries naming one 100 KB
# string would otherwise be 10 GB of strings. Both readers apply them with the same words.
MAX_NEEDED = 4096
MAX_PATH_ELEMENTS = 4096
MAX_STRING_BYTES = 16 << 20  # all the strings of one file together (names, paths, versions)
_MAX_CHAIN = 1 << 16  # hash chain entries visited for one lookup (real chains hold a few)
_MAX_VERNEED = 100_000
_MAX_VERNAUX = 1_000_000
# What the fast reader may trip over on input it did not foresee; it then declines and pyelftools decides.
_FAST_ERRORS: tuple[type[Exception], ...] = (struct.error, ValueError, IndexError, OverflowError, OSError)


class _Fallback(Exception):
    """The fast reader declines this file: pyelftools reads it (and words any error)."""


class _Capped(Exception):
    """The file declares more than a cap allows (the message says which, as the ElfError will)."""


class _Budget:
    """The caps of one file's read (see MAX_NEEDED); *error* is the exception a hit raises."""

    def __init__(self, p: str, error: type[Exception]) -> None:
        self.p = p
        self.error = error
        self.needed = 0
        self.bytes = 0

    def need(self) -> None:
        self.needed += 1
        if self.needed > MAX_NEEDED:
            raise self.error(f"{self.p}: more than {MAX_NEEDED} DT_NEEDED entries (the reader's cap)")

    def text(self, s: str) -> str:
        self.bytes += len(s)
        if self.bytes > MAX_STRING_BYTES:
            raise self.error(f"{self.p}: more than {MAX_STRING_BYTES} bytes of strings (the reader's cap)")
        return s

    def path_list(self, tag: str, s: str) -> tuple[str, ...]:
        if s.count(":") >= MAX_PATH_ELEMENTS:
            raise self.error(f"{self.p}: {tag} of more than {MAX_PATH_ELEMENTS} elements (the reader's cap)")
        return tuple(self.text(s).split(":"))


_DECLINE: tuple[type[Exception], ...] = (_Fallback, ElfError, *_FAST_ERRORS)


class _SecHdr(NamedTuple):
    """The section header fields the readers use (both readers build these)."""

    name: int
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


class _Dynamic(NamedTuple):
    """What a dynamic table declares (both readers build this)."""

    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    nodeflib: bool


class _Layout(NamedTuple):
    ehdr: struct.Struct
    phdr: struct.Struct
    shdr: struct.Struct
    dyn: struct.Struct
    verneed: struct.Struct
    vernaux: struct.Struct
    ph_fields: tuple[int, int, int, int]  # indexes of p_type, p_offset, p_vaddr, p_filesz


def _layout(elf_class: int, little: bool) -> _Layout:
    e = "<" if little else ">"
    if elf_class == 64:
        return _Layout(
            struct.Struct(e + "16sHHIQQQIHHHHHH"),
            struct.Struct(e + "IIQQQQQQ"),
            struct.Struct(e + "IIQQQQIIQQ"),
            struct.Struct(e + "qQ"),
            struct.Struct(e + "HHIII"),
            struct.Struct(e + "IHHII"),
            (0, 2, 3, 5),
        )
    return _Layout(
        struct.Struct(e + "16sHHIIIIIHHHHHH"),
        struct.Struct(e + "IIIIIIII"),
        struct.Struct(e + "IIIIIIIIII"),
        struct.Struct(e + "iI"),
        struct.Struct(e + "HHIII"),
        struct.Struct(e + "IHHII"),
        (0, 1, 2, 4),
    )


_LAYOUTS = {(c, le): _layout(c, le) for c in (32, 64) for le in (True, False)}


def _fast_read(p: str, span: Span, size: int) -> ElfInfo | None:
    """ElfInfo from positional reads of the headers and the few tables that hold the facts, or None where
    the file is unusual in any way (then pyelftools reads it). Raises ElfError only for a bad identification
    (the first check both readers make, with the same words)."""
    try:
        head = span.pread(64, 0)
    except OSError:
        return None
    elf_class, little = _check_ident(p, head[:16], size)
    try:
        return _Fast(p, span, size, elf_class, little, head).info()
    except _Capped as e:
        raise ElfError(str(e)) from None  # pyelftools would read the same entries: no fallback
    except _DECLINE as e:
        log.debug("%s: fast ELF reader declined (%s: %s); using pyelftools", p, type(e).__name__, e)
        return None


class _Fast:
    """One file, read with bounded ``os.pread`` calls; every irregularity raises _Fallback."""

    def __init__(self, p: str, span: Span, size: int, elf_class: int, little: bool, head: bytes) -> None:
        self.p = p
        self.span = span
        self.size = size
        self.elf_class = elf_class
        self.little = little
        self.lay = _LAYOUTS[(elf_class, little)]
        if len(head) < self.lay.ehdr.size:
            raise _Fallback("short header")
        (
            _ident,
            self.e_type,
            self.machine,
            _version,
            _entry,
            self.phoff,
            self.shoff,
            _flags,
            _ehsize,
            self.phentsize,
            self.phnum,
            self.shentsize,
            self.shnum,
            self.shstrndx,
        ) = self.lay.ehdr.unpack_from(head)
        self.osabi = head[7]
        self.secs: list[_SecHdr] = []
        self.cuda: tuple[str, ...] = ()
        self.window: tuple[int, bytes] = (0, b"")
        self.budget = _Budget(p, _Capped)

    def read(self, offset: int, n: int) -> bytes:
        """Exactly *n* bytes at *offset*, inside the file, else _Fallback."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise _Fallback(f"read of {n} bytes at {offset} leaves the file")
        data = self.span.pread(n, offset) if n else b""
        if len(data) != n:
            raise _Fallback("short read")
        return data

    def sections(self) -> None:
        """Section headers, checked as the pyelftools reader checks them, and the CUDA section names."""
        if self.shoff == 0:
            return  # pyelftools: no sections at all, whatever e_shnum says
        lay = self.lay
        if self.shnum == 0 or self.shentsize != lay.shdr.size or not 0 < self.shstrndx < self.shnum:
            raise _Fallback("unusual section header table")
        raw = self.read(self.shoff, self.shnum * self.shentsize)
        secs = [_SecHdr(*(h[0], h[1], h[2], h[4], h[5], h[6], h[7], h[9])) for h in lay.shdr.iter_unpack(raw)]
        size = self.size
        for s in secs:
            if s.type in _CHECKED_TYPES and s.offset + s.size > size:
                raise _Fallback("a section past end of file")  # pyelftools' reader words the ElfError
        strtab = secs[self.shstrndx]
        if strtab.size > 1 << 22:
            raise _Fallback("huge section name table")
        names = self.read(strtab.offset, strtab.size)
        cuda: list[str] = []
        for s in secs:
            end = names.find(b"\0", s.name)
            if s.name >= len(names) or end < 0:
                raise _Fallback("section name outside its table")
            hit = _CUDA_NAMES.get(names[s.name : end])
            if hit is not None and hit not in cuda:
                cuda.append(hit)
        self.secs = secs
        self.cuda = tuple(s for s in CUDA_SECTIONS if s in cuda)

    def first_of(self, sh_type: int) -> int:
        return next((i for i, s in enumerate(self.secs) if s.type == sh_type), -1)

    def last_of(self, sh_type: int) -> int:
        found = -1
        for i, s in enumerate(self.secs):
            if s.type == sh_type:
                found = i
        return found

    def strtab_of(self, sec: _SecHdr) -> _SecHdr:
        """The SHT_STRTAB section *sec* links to."""
        if sec.flags & _SHF_COMPRESSED or sec.link >= len(self.secs):
            raise _Fallback("unusual link")
        strtab = self.secs[sec.link]
        if strtab.type != _SHT_STRTAB or strtab.flags & _SHF_COMPRESSED:
            raise _Fallback("link to a section that is not a string table")
        return strtab

    def cstr(self, base: int, limit: int, offset: int, strict: bool) -> str:
        """The NUL-terminated string at *offset* of the table at *base* (*limit* bytes long). The last 4 KiB
        read is kept: the strings one file needs sit close together in its .dynstr."""
        if offset >= limit:
            raise _Fallback("string outside its table")
        start = base + offset
        w0, wdata = self.window
        if w0 <= start < w0 + len(wdata):
            end = wdata.find(b"\0", start - w0)
            if end >= 0 and w0 + end < base + limit:
                return wdata[start - w0 : end].decode("utf-8", "strict" if strict else "replace")
        n = min(limit - offset, 4096)
        while True:
            data = self.read(start, n)
            end = data.find(b"\0")
            if end >= 0:
                self.window = (start, data)
                return data[:end].decode("utf-8", "strict" if strict else "replace")
            if n >= limit - offset or n >= 1 << 20:
                raise _Fallback("unterminated string")
            n = min(limit - offset, n * 8)

    def info(self) -> ElfInfo:
        """The facts of this file, or _Fallback wherever pyelftools must decide."""
        etype = _ET_NAMES.get(self.e_type)
        if etype is None or self.osabi == _ELFOSABI_SOLARIS:
            raise _Fallback("unusual e_type or OS ABI")
        interpreter, dyn_seg, loads = self.segments()
        self.sections()
        dyn = self.dynamic(dyn_seg, loads)
        vn_idx = self.last_of(_SHT_GNU_VERNEED)
        version_needs = self.verneeds(self.secs[vn_idx]) if vn_idx >= 0 else []
        gnu_idx = self.last_of(_SHT_GNU_HASH)
        hash_idx = gnu_idx if gnu_idx >= 0 else self.last_of(_SHT_HASH)
        pyinit = _pyinit(self.p, self.span, self.elf_class, self.little, self.secs, hash_idx, hash_idx == gnu_idx)
        return ElfInfo(
            path=self.p,
            elf_class=self.elf_class,
            little_endian=self.little,
            machine=self.machine,
            osabi=self.osabi,
            elf_type=etype,
            interpreter=interpreter,
            soname=dyn.soname,
            needed=dyn.needed,
            rpath=dyn.rpath,
            runpath=dyn.runpath,
            nodeflib=dyn.nodeflib,
            version_needs=tuple(version_needs),
            cuda_sections=self.cuda,
            pyinit=pyinit,
        )

    def segments(self) -> tuple[str | None, tuple[int, int] | None, list[tuple[int, int, int]]]:
        """PT_INTERP's path, the last PT_DYNAMIC's (offset, size) and each PT_LOAD's (vaddr, offset, size)."""
        interpreter: str | None = None
        dyn_seg: tuple[int, int] | None = None
        loads: list[tuple[int, int, int]] = []
        if not self.phnum:
            return interpreter, dyn_seg, loads
        lay = self.lay
        if self.phoff == 0 or self.phentsize != lay.phdr.size or self.phnum >= 0xFFFF:
            raise _Fallback("unusual program header table")
        it, io_, iv, iz = lay.ph_fields
        for ph in lay.phdr.iter_unpack(self.read(self.phoff, self.phnum * self.phentsize)):
            pt = ph[it]
            if pt == _PT_INTERP:
                off, n = ph[io_], ph[iz]
                if off + n > self.size or n > 4096:
                    raise _Fallback("PT_INTERP past end of file")
                interpreter = self.read(off, n).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif pt == _PT_DYNAMIC:
                dyn_seg = (ph[io_], ph[iz])
            elif pt == _PT_LOAD:
                loads.append((ph[iv], ph[io_], ph[iz]))
        return interpreter, dyn_seg, loads

    def dynamic_table(
        self, dyn_seg: tuple[int, int] | None, loads: list[tuple[int, int, int]]
    ) -> tuple[list[tuple[int, int]], int, int, bool]:
        """The dynamic entries and their string table (base, size, strict UTF-8): the last SHT_DYNAMIC's,
        else (no section headers) PT_DYNAMIC's with DT_STRTAB mapped through PT_LOAD."""
        dyn_idx = self.last_of(_SHT_DYNAMIC)
        if dyn_idx >= 0:
            dsec = self.secs[dyn_idx]
            strtab = self.strtab_of(dsec)
            return self.dyn_entries(dsec.offset, dsec.size), strtab.offset, strtab.size, False
        if dyn_seg is None or dyn_seg[1] <= 0:
            return [], 0, 0, False
        if self.secs:
            raise _Fallback("dynamic segment without a dynamic section")
        entries = self.dyn_entries(dyn_seg[0], self.size - dyn_seg[0])
        ptr = next((v for t, v in entries if t == _DT_STRTAB), None)
        str_base = next((ptr - va + off for va, off, sz in loads if ptr is not None and va <= ptr < va + sz), -1)
        if str_base < 0:
            raise _Fallback("DT_STRTAB outside every PT_LOAD")
        return entries, str_base, self.size - str_base, True

    def dynamic(self, dyn_seg: tuple[int, int] | None, loads: list[tuple[int, int, int]]) -> _Dynamic:
        """The soname, DT_NEEDED, RPATH, RUNPATH and DF_1_NODEFLIB the dynamic table declares."""
        entries, str_base, str_limit, strict = self.dynamic_table(dyn_seg, loads)
        soname: str | None = None
        needed: list[str] = []
        rpath: tuple[str, ...] = ()
        runpath: tuple[str, ...] = ()
        nodeflib = False
        budget = self.budget
        for tag, val in entries:
            if tag == _DT_NEEDED:
                budget.need()
                needed.append(budget.text(self.cstr(str_base, str_limit, val, strict)))
            elif tag == _DT_SONAME:
                soname = budget.text(self.cstr(str_base, str_limit, val, strict))
            elif tag == _DT_RPATH:
                rpath = budget.path_list("DT_RPATH", self.cstr(str_base, str_limit, val, strict))
            elif tag == _DT_RUNPATH:
                runpath = budget.path_list("DT_RUNPATH", self.cstr(str_base, str_limit, val, strict))
            elif tag == _DT_FLAGS_1:
                nodeflib = bool(val & _DF_1_NODEFLIB)
        return _Dynamic(soname, tuple(needed), rpath, runpath, nodeflib)

    def dyn_entries(self, offset: int, limit: int) -> list[tuple[int, int]]:
        """(d_tag, d_val) up to and including DT_NULL, which must come within *limit* bytes."""
        st = self.lay.dyn
        out: list[tuple[int, int]] = []
        chunk = 64 * st.size
        pos = 0
        while pos < limit and len(out) <= _MAX_DYN:
            n = min(chunk, limit - pos)
            n -= n % st.size
            if n <= 0:
                break
            for tag, val in st.iter_unpack(self.read(offset + pos, n)):
                out.append((tag, val))
                if tag == _DT_NULL:
                    if len(out) > _MAX_DYN + 1:
                        break  # pyelftools' reader calls this absurd
                    return out
            pos += n
            chunk *= 4
        raise _Fallback("no DT_NULL within the dynamic table")

    def verneeds(self, sec: _SecHdr) -> list[VersionNeed]:
        """SHT_GNU_verneed entries (sh_info of them), every record inside the section."""
        strtab = self.strtab_of(sec)
        # every entry and every auxiliary holds 16 bytes of its own: a walk visiting more loops
        limit = sec.size // 16
        if sec.info > _MAX_VERNEED or sec.info > limit:
            raise _Fallback("absurd version-needs count")
        data = self.read(sec.offset, sec.size)
        vn, va = self.lay.verneed, self.lay.vernaux
        out: list[VersionNeed] = []
        off = 0
        total = 0
        for _ in range(sec.info):
            if off + vn.size > len(data):
                raise _Fallback("version-needs entry outside its section")
            _version, cnt, vfile, aux, nxt = vn.unpack_from(data, off)
            if cnt == 0:
                raise _Fallback("version-needs entry without auxiliaries")
            total += cnt
            if total > _MAX_VERNAUX or total > limit:
                raise _Fallback("absurd version-needs auxiliaries")
            versions: list[str] = []
            aoff = off + aux
            for _ in range(cnt):
                if aoff + va.size > len(data):
                    raise _Fallback("version-needs auxiliary outside its section")
                _hash, _flags, _other, name, anext = va.unpack_from(data, aoff)
                versions.append(self.budget.text(self.cstr(strtab.offset, strtab.size, name, False)))
                aoff += anext
            vname = self.budget.text(self.cstr(strtab.offset, strtab.size, vfile, False))
            out.append(VersionNeed(vname, tuple(versions)))
            off += nxt
        return out


# ------------------------------------------------------------------------------------------ pyelftools reader
def _parse(p: str, span: Span, stream: IO[bytes], size: int) -> ElfInfo:
    """The facts of one file as pyelftools reads it; ElfError for anything malformed."""
    from elftools.elf.elffile import ELFFile  # lazy: keeps `import pytest_cudastack.linker.elf` cheap

    ident = stream.read(16)
    elf_class, little = _check_ident(p, ident, size)
    stream.seek(0)
    elf: Any = ELFFile(stream)
    header = elf.header
    _check_tables(p, header, size, elf_class)
    machine = _machine_number(header["e_machine"])
    etype = _pe_etype(header)
    interpreter, dyn_seg_idx = _pe_segments(p, elf, stream, size)
    secs = _pe_sections(p, elf, size)
    dyn: Any = elf.get_section(secs.dyn_idx) if secs.dyn_idx >= 0 else None
    verneed_sec: Any = elf.get_section(secs.verneed_idx) if secs.verneed_idx >= 0 else None
    if dyn is None and dyn_seg_idx >= 0:  # no section headers (stripped): the segment finds .dynstr itself
        dyn = elf.get_segment(dyn_seg_idx)
    budget = _Budget(p, ElfError)
    dynamic = _pe_dynamic(p, dyn, budget) if dyn is not None else _Dynamic(None, (), (), (), False)
    version_needs = _pe_verneeds(p, verneed_sec, budget) if verneed_sec is not None else []
    hash_idx = secs.gnu_hash_idx if secs.gnu_hash_idx >= 0 else secs.sysv_hash_idx
    gnu = hash_idx == secs.gnu_hash_idx
    pyinit = _pyinit(p, span, elf_class, little, _sec_hdrs(secs.headers), hash_idx, gnu)
    return ElfInfo(
        path=p,
        elf_class=elf_class,
        little_endian=little,
        machine=machine,
        osabi=_osabi_number(header["e_ident"]["EI_OSABI"]),
        elf_type=etype,
        interpreter=interpreter,
        soname=dynamic.soname,
        needed=dynamic.needed,
        rpath=dynamic.rpath,
        runpath=dynamic.runpath,
        nodeflib=dynamic.nodeflib,
        version_needs=tuple(version_needs),
        cuda_sections=tuple(s for s in CUDA_SECTIONS if s in secs.names),
        pyinit=pyinit,
    )


def _pe_etype(header: Any) -> str:
    """The e_type name pyelftools gives, with the gABI's name for a number it leaves unnamed."""
    etype = str(header["e_type"])
    if etype.startswith("ET_") is False:
        etype = _ET_NAMES.get(int(etype) if etype.isdigit() else -1, etype)
    return etype


def _pe_segments(p: str, elf: Any, stream: IO[bytes], size: int) -> tuple[str | None, int]:
    """PT_INTERP's path and the index of the last PT_DYNAMIC holding bytes (-1 if none), from the program
    headers only: pyelftools' DynamicSegment object would build every section to find .dynstr."""
    interpreter: str | None = None
    dyn_seg_idx = -1
    # the gABI: e_phoff 0 means no program header table, whatever e_phnum says (pyelftools would parse
    # e_phnum headers at offset 0)
    nseg = elf.num_segments() if elf.header["e_phoff"] else 0
    if nseg > 65536:
        raise ElfError(f"{p}: absurd program header count {nseg}")
    for i in range(nseg):
        ph = elf._get_segment_header(i)
        t = ph["p_type"]
        if t == "PT_INTERP":
            off, n = int(ph["p_offset"]), int(ph["p_filesz"])
            if off + n > size or n > 4096:
                raise ElfError(f"{p}: PT_INTERP past end of file or too long")
            stream.seek(off)
            interpreter = stream.read(n).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif t == "PT_DYNAMIC":  # the last one, when it holds bytes: as the fast reader takes it
            dyn_seg_idx = i if int(ph["p_filesz"]) > 0 else -1
    return interpreter, dyn_seg_idx


class _PeSections(NamedTuple):
    """The section headers and names pyelftools gives, with the last index of each table the reader uses."""

    headers: list[Any]
    names: list[str]
    dyn_idx: int
    verneed_idx: int
    gnu_hash_idx: int
    sysv_hash_idx: int


_PE_CHECKED_TYPES = frozenset(
    ("SHT_DYNAMIC", "SHT_STRTAB", "SHT_GNU_verneed", "SHT_DYNSYM", "SHT_GNU_HASH", "SHT_HASH")
)


def _pe_sections(p: str, elf: Any, size: int) -> _PeSections:
    """Every section header, each table the reader uses inside the file, found from the headers alone:
    building every Section object would make pyelftools parse whole hash tables (hundreds of thousands of
    entries in a large library). pyelftools has no public accessor for a bare header, hence the private
    ones and the upper pin in pyproject.toml."""
    names: list[str] = []
    headers: list[Any] = []
    last = {"SHT_DYNAMIC": -1, "SHT_GNU_verneed": -1, "SHT_GNU_HASH": -1, "SHT_HASH": -1}
    nsec = elf.num_sections()
    if nsec > 65536:
        raise ElfError(f"{p}: absurd section count {nsec}")
    for i in range(nsec):
        hdr = elf._get_section_header(i)
        name = elf._get_section_name(hdr)
        headers.append(hdr)
        names.append(name)
        st = hdr["sh_type"]
        if st in last:
            last[st] = i
        if st in _PE_CHECKED_TYPES and hdr["sh_offset"] + hdr["sh_size"] > size:
            raise ElfError(f"{p}: section {name!r} past end of file")
    return _PeSections(
        headers, names, last["SHT_DYNAMIC"], last["SHT_GNU_verneed"], last["SHT_GNU_HASH"], last["SHT_HASH"]
    )


def _pe_dynamic(p: str, dyn: Any, budget: _Budget) -> _Dynamic:
    """The soname, DT_NEEDED, RPATH, RUNPATH and DF_1_NODEFLIB of pyelftools' dynamic section or segment."""
    soname: str | None = None
    needed: list[str] = []
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    nodeflib = False
    for count, tag in enumerate(dyn.iter_tags()):
        if count > _MAX_DYN:
            raise ElfError(f"{p}: absurd dynamic section")
        d_tag = tag.entry.d_tag
        if d_tag == "DT_NEEDED":
            budget.need()
            needed.append(budget.text(str(tag.needed)))
        elif d_tag == "DT_SONAME":
            soname = budget.text(str(tag.soname))
        elif d_tag == "DT_RPATH":
            rpath = budget.path_list("DT_RPATH", str(tag.rpath))
        elif d_tag == "DT_RUNPATH":
            runpath = budget.path_list("DT_RUNPATH", str(tag.runpath))
        elif d_tag == "DT_FLAGS_1":
            nodeflib = bool(int(tag.entry.d_val) & _DF_1_NODEFLIB)
        elif d_tag == "DT_NULL":
            break
    return _Dynamic(soname, tuple(needed), rpath, runpath, nodeflib)


def _pe_verneeds(p: str, verneed_sec: Any, budget: _Budget) -> list[VersionNeed]:
    """The SHT_GNU_verneed entries pyelftools walks, within the caps a section of that size allows."""
    version_needs: list[VersionNeed] = []
    total = 0
    # every entry and every auxiliary holds 16 bytes of its own (pyelftools walks sh_info entries,
    # a vn_next of 0 included: 100,000 visits of one entry took it 13 s)
    limit = int(verneed_sec["sh_size"]) // 16
    if int(verneed_sec["sh_info"]) > limit:
        raise ElfError(f"{p}: absurd version-needs section")
    for n, (verneed, aux_iter) in enumerate(verneed_sec.iter_versions()):
        total += int(verneed["vn_cnt"])
        if total > _MAX_VERNAUX or total > limit:
            raise ElfError(f"{p}: absurd version-needs section")
        versions = tuple(budget.text(str(aux.name)) for aux in aux_iter)
        version_needs.append(VersionNeed(budget.text(str(verneed.name)), versions))
        if n > _MAX_VERNEED:
            raise ElfError(f"{p}: absurd version-needs section")
    return version_needs


def _gnu_hash(name: bytes) -> int:
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


def _sysv_hash(name: bytes) -> int:
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def _sec_hdrs(headers: list[Any]) -> list[_SecHdr]:
    """pyelftools section headers as the fields both readers use (sh_type is not needed by the users)."""
    return [
        _SecHdr(
            int(h["sh_name"]),
            -1,
            int(h["sh_flags"]),
            int(h["sh_offset"]),
            int(h["sh_size"]),
            int(h["sh_link"]),
            int(h["sh_info"]),
            int(h["sh_entsize"]),
        )
        for h in headers
    ]


class _Reader:
    """Bounded positional reads of fixed-size integers; a read past the end raises ElfError."""

    def __init__(self, p: str, span: Span, little: bool) -> None:
        self.p = p
        self.span = span
        self.end = "<" if little else ">"

    def read(self, offset: int, n: int) -> bytes:
        try:
            data = self.span.pread(n, offset) if offset >= 0 else b""
        except (OSError, OverflowError) as e:
            raise ElfError(f"{self.p}: hash table or symbol past end of file") from e
        if len(data) != n:
            raise ElfError(f"{self.p}: hash table or symbol past end of file")
        return data

    def ints(self, fmt: str, offset: int) -> tuple[int, ...]:
        st = struct.Struct(self.end + fmt)
        return st.unpack(self.read(offset, st.size))

    def cstr(self, offset: int, limit: int) -> bytes:
        try:
            data = self.span.pread(min(limit, 4096), offset)
        except (OSError, OverflowError) as e:
            raise ElfError(f"{self.p}: hash table or symbol past end of file") from e
        end = data.find(b"\0")
        return data if end < 0 else data[:end]


def _pyinit(
    p: str, span: Span, elf_class: int, little: bool, headers: list[_SecHdr], hash_idx: int, gnu: bool
) -> str | None:
    """``PyInit_<mod>`` when the GNU (or SysV) hash table of .dynsym finds it defined."""
    if hash_idx < 0:
        return None
    mod = os.path.basename(p).split(".", 1)[0]
    if not mod.isidentifier() or not mod.isascii():
        return None
    want = f"PyInit_{mod}".encode()
    return want.decode() if _hash_lookup(p, span, elf_class, little, headers, hash_idx, gnu, want) else None


def _hash_lookup(
    p: str,
    span: Span,
    elf_class: int,
    little: bool,
    headers: list[_SecHdr],
    hash_idx: int,
    gnu: bool,
    want: bytes,
) -> bool:
    """Whether .dynsym defines *want*, through the hash table: a handful of positional reads (bloom word,
    bucket, the chain entries of one bucket and their symbols), never a walk over all symbols."""
    hsec = headers[hash_idx]
    link = hsec.link
    if not 0 <= link < len(headers):
        raise ElfError(f"{p}: hash section links to section {link}")
    symtab = headers[link]
    strlink = symtab.link
    if not 0 <= strlink < len(headers):
        raise ElfError(f"{p}: symbol table links to section {strlink}")
    strtab = headers[strlink]
    r = _Reader(p, span, little)
    sym_off, sym_size = symtab.offset, symtab.size
    entsize = symtab.entsize or (24 if elf_class == 64 else 16)
    str_off, str_size = strtab.offset, strtab.size
    nsyms = sym_size // entsize if entsize else 0

    def defined_match(idx: int) -> bool:
        if not 0 <= idx < nsyms:
            return False
        base = sym_off + idx * entsize
        if elf_class == 64:
            st_name, _info, _other, shndx = r.ints("IBBH", base)
        else:
            st_name, _v, _s, _info, _other, shndx = r.ints("IIIBBH", base)
        if st_name >= str_size:
            return False
        return shndx != _SHN_UNDEF and r.cstr(str_off + st_name, str_size - st_name) == want

    off = hsec.offset
    hend = off + hsec.size  # every bucket and chain entry lies inside the hash section

    def word_at(pos: int) -> int:
        if pos + 4 > hend:
            raise ElfError(f"{p}: hash chain leaves its section")
        (v,) = r.ints("I", pos)
        return int(v)

    if gnu:
        nbuckets, symoffset, bloom_size, bloom_shift = r.ints("IIII", off)
        if nbuckets == 0 or bloom_size == 0:
            return False
        h = _gnu_hash(want)
        word = 8 if elf_class == 64 else 4
        bits = word * 8
        (bloom,) = r.ints("Q" if word == 8 else "I", off + 16 + word * ((h // bits) % bloom_size))
        mask = (1 << (h % bits)) | (1 << ((h >> bloom_shift) % bits))
        if bloom & mask != mask:
            return False
        buckets_off = off + 16 + word * bloom_size
        (idx,) = r.ints("I", buckets_off + 4 * (h % nbuckets))
        if idx < symoffset:
            return False
        # a chain runs over consecutive entries of the section until one has bit 0 set: read in blocks (one
        # read per 4 KiB at first, never one per word), capped by the section's end and by the symbol count
        pos = buckets_off + 4 * nbuckets + 4 * (idx - symoffset)
        left = min(max(nsyms, 1), _MAX_CHAIN)
        block = 1 << 10
        while left > 0:
            n = min(block, left, (hend - pos) // 4)
            if n <= 0:
                raise ElfError(f"{p}: hash chain leaves its section")
            for ch in struct.unpack(f"{r.end}{n}I", r.read(pos, 4 * n)):
                if (ch | 1) == (h | 1) and defined_match(idx):
                    return True
                if ch & 1:
                    return False
                idx += 1
            pos, left, block = pos + 4 * n, left - n, block * 4
        raise ElfError(f"{p}: GNU hash chain does not terminate")
    nbucket, nchain = r.ints("II", off)
    if nbucket == 0:
        return False
    if 8 + 4 * (nbucket + nchain) > hsec.size:  # the gABI: both arrays are in the section
        raise ElfError(f"{p}: SysV hash table of {nbucket} buckets and {nchain} chains exceeds its section")
    idx = word_at(off + 8 + 4 * (_sysv_hash(want) % nbucket))
    # a chain that visits more entries than there are symbols (or than the cap) loops
    for _ in range(min(nchain, max(nsyms, 1), _MAX_CHAIN) + 1):
        if idx == 0:
            return False
        if idx >= nchain:
            raise ElfError(f"{p}: SysV hash chain index {idx} out of range")
        if defined_match(idx):
            return True
        idx = word_at(off + 8 + 4 * nbucket + 4 * idx)
    raise ElfError(f"{p}: SysV hash chain does not terminate")


_EM_BY_NAME: dict[str, int] | None = None


def _machine_number(value: Any) -> int:
    """pyelftools gives e_machine as a name ("EM_X86_64"); map it back to the number."""
    if isinstance(value, int):
        return value
    global _EM_BY_NAME
    if _EM_BY_NAME is None:
        # lazy: pyelftools is the fallback and error-message path; the fast reader never needs it
        from elftools.elf.enums import ENUM_E_MACHINE

        _EM_BY_NAME = {str(k): int(v) for k, v in ENUM_E_MACHINE.items() if isinstance(v, int)}
    s = str(value)
    if s in _EM_BY_NAME:
        return _EM_BY_NAME[s]
    if s.startswith("<unknown"):
        return 0
    try:
        return int(s)
    except ValueError:
        return 0


def _osabi_number(value: Any) -> int:
    if isinstance(value, int):
        return value
    # lazy: pyelftools is the fallback and error-message path; the fast reader never needs it
    from elftools.elf.enums import ENUM_EI_OSABI

    v = ENUM_EI_OSABI.get(str(value))
    return int(v) if isinstance(v, int) else 0
