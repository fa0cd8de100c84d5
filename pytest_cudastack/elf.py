"""What an ELF file declares: class, machine, soname, DT_NEEDED, RPATH/RUNPATH, CUDA sections, PyInit.

Only the ELF header, the program/section header tables and the few small sections that hold these facts are
read (pyelftools reads lazily from the stream), so a 700 MB library costs a few kilobytes of I/O. Files are
opened with ``O_NONBLOCK`` and checked to be regular files before anything is read, so FIFOs, sockets and
devices never block. Every failure becomes an :class:`~pytest_cudastack.errors.ElfError` naming the file.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
from dataclasses import dataclass
from typing import IO, Any

from .errors import ElfError

__all__ = [
    "CUDA_SECTIONS",
    "EM_NAMES",
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
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
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
    def from_json(cls, d: dict[str, Any]) -> ElfInfo:
        """Inverse of :meth:`to_json`; raises ``ValueError`` (ElfError) on a malformed mapping."""
        try:
            return cls(
                path=str(d["path"]),
                elf_class=int(d["elf_class"]),
                little_endian=bool(d["little_endian"]),
                machine=int(d["machine"]),
                osabi=int(d["osabi"]),
                elf_type=str(d["elf_type"]),
                interpreter=_opt_str(d["interpreter"]),
                soname=_opt_str(d["soname"]),
                needed=tuple(str(x) for x in d["needed"]),
                rpath=tuple(str(x) for x in d["rpath"]),
                runpath=tuple(str(x) for x in d["runpath"]),
                nodeflib=bool(d["nodeflib"]),
                version_needs=tuple(
                    VersionNeed(str(v["file"]), tuple(str(x) for x in v["versions"])) for v in d["version_needs"]
                ),
                cuda_sections=tuple(str(x) for x in d["cuda_sections"]),
                pyinit=_opt_str(d["pyinit"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ElfError(f"malformed ElfInfo mapping: {e!r}") from e


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """Open without blocking and insist on a regular file; returns (fd, stat)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise ElfError(f"{path}: cannot open: {e.strerror or e}") from e
    except ValueError as e:  # an embedded NUL byte
        raise ElfError(f"{path!r}: cannot open: {e}") from e
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise ElfError(f"{path}: cannot stat: {e.strerror or e}") from e
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "is a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ElfError(f"{path}: {kind}")
    return fd, st


def looks_like_elf(path: str | os.PathLike[str]) -> bool:
    """True when *path* is a regular file starting with ``\\x7fELF``; never blocks, never raises."""
    try:
        fd, _st = _open_regular(os.fspath(path))
    except (ElfError, TypeError, ValueError):
        return False
    try:
        return os.read(fd, 4) == b"\x7fELF"
    except OSError:
        return False
    finally:
        os.close(fd)


def exports(path: str | os.PathLike[str], symbol: str) -> bool:
    """Whether the ELF file at *path* defines the dynamic symbol *symbol* (hash-table lookup, a few reads;
    False when it has no hash table). Raises :class:`ElfError` naming the file."""
    from elftools.elf.elffile import ELFFile

    p = os.fspath(path)
    fd, st = _open_regular(p)
    with os.fdopen(fd, "rb", buffering=4096) as stream:
        try:
            elf_class, little = _check_ident(p, stream.read(16), st.st_size)
            stream.seek(0)
            elf: Any = ELFFile(stream)
            _check_tables(p, elf.header, st.st_size)
            headers = [elf._get_section_header(i) for i in range(min(elf.num_sections(), 65536))]
            gnu = [i for i, h in enumerate(headers) if h["sh_type"] == "SHT_GNU_HASH"]
            sysv = [i for i, h in enumerate(headers) if h["sh_type"] == "SHT_HASH"]
            idx = gnu[0] if gnu else (sysv[0] if sysv else -1)
            if idx < 0:
                return False
            return _hash_lookup(p, stream, elf_class, little, headers, idx, bool(gnu), symbol.encode())
        except ElfError:
            raise
        except Exception as e:  # pyelftools raises many kinds on corrupt input
            raise ElfError(f"{p}: corrupt ELF file: {type(e).__name__}: {e}") from e


def read_elf(path: str | os.PathLike[str]) -> ElfInfo:
    """Read the declared facts of the ELF file at *path*; raises :class:`ElfError` naming the file."""
    p = os.fspath(path)
    fd, st = _open_regular(p)
    try:
        stream = os.fdopen(fd, "rb", buffering=4096)
    except OSError as e:
        os.close(fd)
        raise ElfError(f"{p}: cannot open: {e}") from e
    with stream:
        try:
            return _parse(p, stream, st.st_size)
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


def _check_tables(p: str, header: Any, size: int) -> None:
    """Reject header tables that point past EOF or have absurd counts before pyelftools walks them."""
    for what, off, num, ent in (
        ("program header", header["e_phoff"], header["e_phnum"], header["e_phentsize"]),
        ("section header", header["e_shoff"], header["e_shnum"], header["e_shentsize"]),
    ):
        if num == 0 or off == 0:
            continue
        if ent == 0 or off + num * ent > size:
            raise ElfError(f"{p}: {what} table past end of file (offset {off}, {num} x {ent} bytes, size {size})")


def _parse(p: str, stream: IO[bytes], size: int) -> ElfInfo:
    from elftools.elf.elffile import ELFFile  # lazy: keeps `import pytest_cudastack.elf` cheap

    ident = stream.read(16)
    elf_class, little = _check_ident(p, ident, size)
    stream.seek(0)
    elf: Any = ELFFile(stream)
    header = elf.header
    _check_tables(p, header, size)
    machine = _machine_number(header["e_machine"])
    etype = str(header["e_type"])
    if etype.startswith("ET_") is False:
        etype = _ET_NAMES.get(int(etype) if etype.isdigit() else -1, etype)

    interpreter: str | None = None
    dyn_seg_idx = -1
    nseg = elf.num_segments()
    if nseg > 65536:
        raise ElfError(f"{p}: absurd program header count {nseg}")
    # program *headers* only: pyelftools' DynamicSegment object would build every section to find .dynstr
    for i in range(nseg):
        ph = elf._get_segment_header(i)
        t = ph["p_type"]
        if t == "PT_INTERP":
            off, n = int(ph["p_offset"]), int(ph["p_filesz"])
            if off + n > size or n > 4096:
                raise ElfError(f"{p}: PT_INTERP past end of file or too long")
            stream.seek(off)
            interpreter = stream.read(n).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif t == "PT_DYNAMIC":
            dyn_seg_idx = i

    # Walk section *headers* only: building every Section object would make pyelftools parse whole
    # hash tables (hundreds of thousands of entries in a large library).
    section_names: list[str] = []
    headers: list[Any] = []
    dyn_idx = verneed_idx = gnu_hash_idx = sysv_hash_idx = -1
    nsec = elf.num_sections()
    if nsec > 65536:
        raise ElfError(f"{p}: absurd section count {nsec}")
    for i in range(nsec):
        hdr = elf._get_section_header(i)
        name = elf._get_section_name(hdr)
        headers.append(hdr)
        section_names.append(name)
        st = hdr["sh_type"]
        if st == "SHT_DYNAMIC":
            dyn_idx = i
        elif st == "SHT_GNU_verneed":
            verneed_idx = i
        elif st == "SHT_GNU_HASH":
            gnu_hash_idx = i
        elif st == "SHT_HASH":
            sysv_hash_idx = i
        if st in ("SHT_DYNAMIC", "SHT_STRTAB", "SHT_GNU_verneed", "SHT_DYNSYM", "SHT_GNU_HASH", "SHT_HASH") and (
            hdr["sh_offset"] + hdr["sh_size"] > size
        ):
            raise ElfError(f"{p}: section {name!r} past end of file")
    dyn_sec: Any = elf.get_section(dyn_idx) if dyn_idx >= 0 else None
    verneed_sec: Any = elf.get_section(verneed_idx) if verneed_idx >= 0 else None

    soname: str | None = None
    needed: list[str] = []
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    nodeflib = False
    dyn: Any = dyn_sec
    if dyn is None and dyn_seg_idx >= 0:  # no section headers (stripped): the segment finds .dynstr itself
        dyn = elf.get_segment(dyn_seg_idx)
    if dyn is not None:
        for count, tag in enumerate(dyn.iter_tags()):
            if count > 1_000_000:
                raise ElfError(f"{p}: absurd dynamic section")
            d_tag = tag.entry.d_tag
            if d_tag == "DT_NEEDED":
                needed.append(str(tag.needed))
            elif d_tag == "DT_SONAME":
                soname = str(tag.soname)
            elif d_tag == "DT_RPATH":
                rpath = tuple(str(tag.rpath).split(":"))
            elif d_tag == "DT_RUNPATH":
                runpath = tuple(str(tag.runpath).split(":"))
            elif d_tag == "DT_FLAGS_1":
                nodeflib = bool(int(tag.entry.d_val) & _DF_1_NODEFLIB)
            elif d_tag == "DT_NULL":
                break

    version_needs: list[VersionNeed] = []
    if verneed_sec is not None:
        for n, (verneed, aux_iter) in enumerate(verneed_sec.iter_versions()):
            versions = tuple(str(aux.name) for aux in aux_iter)
            version_needs.append(VersionNeed(str(verneed.name), versions))
            if n > 100_000:
                raise ElfError(f"{p}: absurd version-needs section")

    cuda = tuple(s for s in CUDA_SECTIONS if s in section_names)
    hash_idx = gnu_hash_idx if gnu_hash_idx >= 0 else sysv_hash_idx
    pyinit = _pyinit(p, stream, elf_class, little, headers, hash_idx, hash_idx == gnu_hash_idx)
    return ElfInfo(
        path=p,
        elf_class=elf_class,
        little_endian=little,
        machine=machine,
        osabi=_osabi_number(header["e_ident"]["EI_OSABI"]),
        elf_type=etype,
        interpreter=interpreter,
        soname=soname,
        needed=tuple(needed),
        rpath=rpath,
        runpath=runpath,
        nodeflib=nodeflib,
        version_needs=tuple(version_needs),
        cuda_sections=cuda,
        pyinit=pyinit,
    )


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


class _Reader:
    """Bounded positional reads of fixed-size integers; a read past the end raises ElfError."""

    def __init__(self, p: str, stream: IO[bytes], little: bool) -> None:
        self.p = p
        self.stream = stream
        self.end = "<" if little else ">"

    def read(self, offset: int, n: int) -> bytes:
        self.stream.seek(offset)
        data = self.stream.read(n)
        if len(data) != n:
            raise ElfError(f"{self.p}: hash table or symbol past end of file")
        return data

    def ints(self, fmt: str, offset: int) -> tuple[int, ...]:
        st = struct.Struct(self.end + fmt)
        return st.unpack(self.read(offset, st.size))

    def cstr(self, offset: int, limit: int) -> bytes:
        self.stream.seek(offset)
        data = self.stream.read(min(limit, 4096))
        end = data.find(b"\0")
        return data if end < 0 else data[:end]


def _pyinit(
    p: str, stream: IO[bytes], elf_class: int, little: bool, headers: list[Any], hash_idx: int, gnu: bool
) -> str | None:
    """``PyInit_<mod>`` when the GNU (or SysV) hash table of .dynsym finds it defined."""
    if hash_idx < 0:
        return None
    mod = os.path.basename(p).split(".", 1)[0]
    if not mod.isidentifier() or not mod.isascii():
        return None
    want = f"PyInit_{mod}".encode()
    return want.decode() if _hash_lookup(p, stream, elf_class, little, headers, hash_idx, gnu, want) else None


def _hash_lookup(
    p: str,
    stream: IO[bytes],
    elf_class: int,
    little: bool,
    headers: list[Any],
    hash_idx: int,
    gnu: bool,
    want: bytes,
) -> bool:
    """Whether .dynsym defines *want*, through the hash table: a handful of positional reads (bloom word,
    bucket, the chain entries of one bucket and their symbols), never a walk over all symbols."""
    hsec = headers[hash_idx]
    link = int(hsec["sh_link"])
    if not 0 <= link < len(headers):
        raise ElfError(f"{p}: hash section links to section {link}")
    symtab = headers[link]
    strlink = int(symtab["sh_link"])
    if not 0 <= strlink < len(headers):
        raise ElfError(f"{p}: symbol table links to section {strlink}")
    strtab = headers[strlink]
    r = _Reader(p, stream, little)
    sym_off, sym_size = int(symtab["sh_offset"]), int(symtab["sh_size"])
    entsize = int(symtab["sh_entsize"]) or (24 if elf_class == 64 else 16)
    str_off, str_size = int(strtab["sh_offset"]), int(strtab["sh_size"])
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

    off = int(hsec["sh_offset"])
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
        chain_off = buckets_off + 4 * nbuckets
        for _ in range(max(nsyms, 1)):
            (ch,) = r.ints("I", chain_off + 4 * (idx - symoffset))
            if (ch | 1) == (h | 1) and defined_match(idx):
                return True
            if ch & 1:
                return False
            idx += 1
        raise ElfError(f"{p}: GNU hash chain does not terminate")
    nbucket, nchain = r.ints("II", off)
    if nbucket == 0:
        return False
    (idx,) = r.ints("I", off + 8 + 4 * (_sysv_hash(want) % nbucket))
    for _ in range(nchain + 1):
        if idx == 0:
            return False
        if idx >= nchain:
            raise ElfError(f"{p}: SysV hash chain index {idx} out of range")
        if defined_match(idx):
            return True
        (idx,) = r.ints("I", off + 8 + 4 * nbucket + 4 * idx)
    raise ElfError(f"{p}: SysV hash chain does not terminate")


_EM_BY_NAME: dict[str, int] | None = None


def _machine_number(value: Any) -> int:
    """pyelftools gives e_machine as a name ("EM_X86_64"); map it back to the number."""
    if isinstance(value, int):
        return value
    global _EM_BY_NAME
    if _EM_BY_NAME is None:
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
    from elftools.elf.enums import ENUM_EI_OSABI

    v = ENUM_EI_OSABI.get(str(value))
    return int(v) if isinstance(v, int) else 0
