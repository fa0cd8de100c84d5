"""What an ELF file's dynamic symbol table defines and needs, and how glibc's ld.so binds one to the other.

The reader follows the dynamic linker, not the section headers: ld.so finds ``.dynsym`` (DT_SYMTAB),
``.dynstr`` (DT_STRTAB, DT_STRSZ), ``.gnu.version`` (DT_VERSYM), ``.gnu.version_d`` (DT_VERDEF, DT_VERDEFNUM)
and ``.gnu.version_r`` (DT_VERNEED, DT_VERNEEDNUM) through PT_DYNAMIC, their addresses mapped to file offsets
through PT_LOAD, and knows how many symbols there are only from the hash table (DT_GNU_HASH: the last chain
of the highest bucket; DT_HASH: ``nchain``). So only the ELF header, the program headers, the dynamic table
and exactly the bytes of those tables are read (``os.pread``, every offset and count checked against the
file), a few megabytes for libtorch_cpu.so, never the whole file. Every irregularity raises
:class:`~pytest_cudastack.errors.ElfError` naming the file.

Binding rules, from glibc 2.36 ``elf/dl-lookup.c``:

* ``_dl_lookup_symbol_x`` walks the lookup scopes in order and ``do_lookup_x`` each object of a scope in
  order; the first object with a matching definition wins. A reference that nothing matches is the error
  "undefined symbol: NAME, version V" unless the reference is STB_WEAK (then it binds to 0).
* ``do_lookup_x`` only sees symbols its hash table chains reach (with DT_GNU_HASH those from ``symoffset``
  on), keeps STB_GLOBAL, STB_WEAK (``dl_dynamic_weak`` is off: a weak definition binds like a global one)
  and STB_GNU_UNIQUE, and drops STB_LOCAL. ``check_match`` drops a symbol with no value (``st_value == 0``
  unless SHN_ABS or STT_TLS), one that is undefined, and types other than NOTYPE, OBJECT, FUNC, COMMON, TLS
  and GNU_IFUNC. STV_HIDDEN/STV_INTERNAL definitions are not exported (gABI: not visible outside the
  component), so they are dropped too.
* ``check_match`` with a versioned reference (name V, from ``.gnu.version_r``): a definition binds when its
  version is named V, hidden (``@``) or default (``@@``) alike; or, unless the reference's version is hidden,
  when the definition is unversioned (index 0 or 1, or the file's base version: ``l_versions[ndx].hash`` is
  0) and not hidden. An object without DT_VERSYM binds any version (a library built without versions).
* ``check_match`` with an unversioned reference: a definition with version index 0, 1 or 2 binds; one with
  a higher index only when it is the one non-hidden (default) version of that name in that object
  (``num_versions == 1`` in ``do_lookup_x``).

Version needs, from ``elf/dl-version.c`` (``_dl_check_map_versions``, ``match_symbol``): every version an
object's DT_VERNEED requires from a file must be defined (DT_VERDEF) by the object that soname resolved to,
else "version `V' not found (required by X)" (fatal unless VER_FLG_WEAK); a file with no DT_VERDEF at all
only earns "no version information available" (not fatal).

BIND_NOW: DT_BIND_NOW, DF_BIND_NOW in DT_FLAGS or DF_1_NOW in DT_FLAGS_1 (``elf/dl-reloc.c`` binds every
PLT entry at load time); else functions bind lazily, at their first call.

Which unbound reference the loader names (:func:`relocation_order`): ``_dl_relocate_object`` processes an
object's relocations in table order (``elf/dynamic-link.h`` ``_ELF_DYNAMIC_DO_RELOC``, ``elf/do-rel.h``): the
DT_RELA (or DT_REL) range first, its DT_RELACOUNT relative records skipped, then DT_JMPREL (the PLT) when
binding now; the first record whose symbol no scope defines raises "undefined symbol" and ends the load, so
the loader reports one symbol, the first in that order, not the first by name.
"""

from __future__ import annotations

import array
import base64
import os
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_cudastack._sysio import Span, open_span
from pytest_cudastack.errors import ElfError

__all__ = [
    "Binding",
    "Definition",
    "Reference",
    "ScopeIndex",
    "SymbolFacts",
    "VersionDef",
    "VersionNeed",
    "read_symbols",
    "relocation_order",
]

# gABI / GNU numbers
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ, _DT_SYMENT = 0, 4, 5, 6, 10, 11
_DT_BIND_NOW, _DT_FLAGS = 24, 30
_DT_PLTRELSZ, _DT_RELA, _DT_RELASZ, _DT_REL, _DT_RELSZ, _DT_PLTREL, _DT_JMPREL = 2, 7, 8, 17, 18, 20, 23
_DT_RELACOUNT, _DT_RELCOUNT = 0x6FFFFFF9, 0x6FFFFFFA
_RELOC_CHUNK = 1 << 22  # bytes of relocation records read at once
_DT_GNU_HASH = 0x6FFFFEF5
_DT_VERSYM, _DT_FLAGS_1 = 0x6FFFFFF0, 0x6FFFFFFB
_DT_VERDEF, _DT_VERDEFNUM, _DT_VERNEED, _DT_VERNEEDNUM = 0x6FFFFFFC, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
_DF_BIND_NOW, _DF_1_NOW = 0x8, 0x1
_VER_FLG_BASE, _VER_FLG_WEAK = 0x1, 0x2
_SHN_UNDEF, _SHN_ABS = 0, 0xFFF1
_STB_LOCAL, _STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 0, 1, 2, 10
_STT_NOTYPE, _STT_OBJECT, _STT_FUNC, _STT_COMMON, _STT_TLS, _STT_GNU_IFUNC = 0, 1, 2, 5, 6, 10
_ALLOWED_STT = frozenset((_STT_NOTYPE, _STT_OBJECT, _STT_FUNC, _STT_COMMON, _STT_TLS, _STT_GNU_IFUNC))
_STV_INTERNAL, _STV_HIDDEN = 1, 2
_HIDDEN = 0x8000
_MAX_SYMS = 10_000_000
_BIT0 = bytes(b & 1 for b in range(256))  # bytes.translate table: each byte -> its bit 0
_MAX_TABLE = 1 << 30
_MAX_DYN = 100_000

_BIND_NAMES = {_STB_GLOBAL: "GLOBAL", _STB_WEAK: "WEAK", _STB_GNU_UNIQUE: "UNIQUE"}
_TYPE_NAMES = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 5: "COMMON", 6: "TLS", 10: "IFUNC"}

Binding = str
"""``"GLOBAL"``, ``"WEAK"`` or ``"UNIQUE"`` (STB_GNU_UNIQUE)."""


@dataclass(frozen=True)
class VersionDef:
    """One DT_VERDEF entry: its index (``vd_ndx``), name, and whether it is the file's base version."""

    index: int
    name: str
    base: bool


@dataclass(frozen=True)
class VersionNeed:
    """One version one object requires from one file (a ``Vernaux`` of a ``Verneed``)."""

    file: str
    name: str
    index: int  # vna_other without the hidden bit: the .gnu.version index references carry
    weak: bool  # VER_FLG_WEAK: a missing version is a warning, not an error
    hidden: bool


@dataclass(frozen=True)
class Definition:
    """One exported dynamic symbol: ``version`` None when unversioned; ``default`` False for ``name@V``."""

    name: str
    version: str | None
    default: bool
    binding: Binding
    type: str


@dataclass(frozen=True)
class Reference:
    """One undefined dynamic symbol: the version and the file it is required from (``.gnu.version_r``)."""

    name: str
    version: str | None
    file: str | None
    weak: bool
    type: str
    hidden: bool = False


@dataclass(frozen=True)
class SymbolFacts:
    """The dynamic symbols of one ELF file, as ld.so's lookup sees them (see the module docstring).

    Symbols are kept packed, as parallel tuples: a name and ``code = versym << 8 | st_info`` (versym: the
    ``.gnu.version`` entry, 1 when the file has none). :meth:`definitions` and :meth:`references` unpack them.
    """

    path: str
    bind_now: bool
    versioned: bool  # has DT_VERSYM
    verdefs: tuple[VersionDef, ...]
    verneeds: tuple[VersionNeed, ...]
    def_names: tuple[str, ...]
    def_codes: tuple[int, ...]
    ref_names: tuple[str, ...]
    ref_codes: tuple[int, ...]

    # ---------------------------------------------------------------- unpacked views
    def definitions(self) -> tuple[Definition, ...]:
        """Every exported symbol; a copy-relocated one in a program names the version it needs."""
        names = {n.index: n.name for n in self.verneeds}
        names.update((v.index, v.name) for v in self.verdefs if not v.base)
        out: list[Definition] = []
        for name, code in zip(self.def_names, self.def_codes, strict=True):
            versym = code >> 8
            version = names.get(versym & 0x7FFF)
            out.append(
                Definition(name, version, not versym & _HIDDEN, _BIND_NAMES[(code >> 4) & 0xF], _TYPE_NAMES[code & 0xF])
            )
        return tuple(out)

    def references(self) -> tuple[Reference, ...]:
        needs = {n.index: n for n in self.verneeds}
        out: list[Reference] = []
        for name, code in zip(self.ref_names, self.ref_codes, strict=True):
            need = needs.get((code >> 8) & 0x7FFF)
            out.append(
                Reference(
                    name,
                    need.name if need is not None else None,
                    need.file if need is not None else None,
                    (code >> 4) & 0xF == _STB_WEAK,
                    _TYPE_NAMES.get(code & 0xF, str(code & 0xF)),
                    need.hidden if need is not None else False,
                )
            )
        return tuple(out)

    def defined_versions(self) -> frozenset[str]:
        """Names of the non-base version nodes this file defines (what a verneed on it may ask for)."""
        return frozenset(v.name for v in self.verdefs if not v.base)

    # ---------------------------------------------------------------- JSON (the ELF cache)
    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bind_now": self.bind_now,
            "versioned": self.versioned,
            "verdefs": [[v.index, v.name, v.base] for v in self.verdefs],
            "verneeds": [[n.file, n.name, n.index, n.weak, n.hidden] for n in self.verneeds],
            "def_names": list(self.def_names),
            "def_codes": _pack(self.def_codes),
            "ref_names": list(self.ref_names),
            "ref_codes": _pack(self.ref_codes),
        }

    @classmethod
    def from_json(cls, d: Any) -> SymbolFacts:
        """Inverse of :meth:`to_json`; raises ElfError on a malformed mapping (the cache may be corrupt)."""
        try:
            def_names = tuple(d["def_names"])
            ref_names = tuple(d["ref_names"])
            def_codes = _unpack(d["def_codes"])
            ref_codes = _unpack(d["ref_codes"])
            if (
                len(def_codes) != len(def_names)
                or len(ref_codes) != len(ref_names)
                or not all(isinstance(n, str) for n in def_names)
                or not all(isinstance(n, str) for n in ref_names)
            ):
                raise ValueError("names and codes disagree")
            return cls(
                path=str(d["path"]),
                bind_now=_bool(d["bind_now"]),
                versioned=_bool(d["versioned"]),
                verdefs=tuple(VersionDef(_int(i), _str(n), _bool(b)) for i, n, b in d["verdefs"]),
                verneeds=tuple(
                    VersionNeed(_str(f), _str(n), _int(i), _bool(w), _bool(h)) for f, n, i, w, h in d["verneeds"]
                ),
                def_names=def_names,
                def_codes=def_codes,
                ref_names=ref_names,
                ref_codes=ref_codes,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ElfError(f"malformed SymbolFacts mapping: {e!r}") from e


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"expected a boolean, got {v!r}")
    return v


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


def _pack(codes: Sequence[int]) -> str:
    """Codes as base64 of little-endian uint32s: a fraction of a JSON list's size and parse time."""
    a = array.array("I", codes)
    if sys.byteorder != "little":
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")


def _unpack(text: Any) -> tuple[int, ...]:
    if not isinstance(text, str):
        raise TypeError("codes are not a string")
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError("codes are not whole uint32s")
    a = array.array("I")
    if a.itemsize != 4:  # pragma: no cover - every CPython platform we run on has a 4-byte unsigned int
        raise ValueError("no 4-byte array type")
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return tuple(a)


# --------------------------------------------------------------------------------------------- the reader
def read_symbols(path: str | os.PathLike[str]) -> SymbolFacts:
    """The dynamic symbols of the ELF file at *path* (see the module docstring); raises ElfError."""
    p = os.fspath(path)
    span, st = open_span(p)
    try:
        try:
            return _Reader(p, span, st.st_size).facts()
        except (struct.error, OverflowError, IndexError, UnicodeDecodeError) as e:
            raise ElfError(f"{p}: corrupt dynamic symbol tables: {type(e).__name__}: {e}") from e
    finally:
        span.close()


class _Reader:
    def __init__(self, p: str, span: Span, size: int) -> None:
        self.p = p
        self.span = span
        self.size = size

    def read(self, offset: int, n: int, what: str) -> bytes:
        if offset < 0 or n < 0 or offset + n > self.size or n > _MAX_TABLE:
            raise ElfError(f"{self.p}: {what} ({n} bytes at offset {offset}) is outside the file")
        try:
            data = self.span.pread(n, offset) if n else b""
        except OSError as e:
            raise ElfError(f"{self.p}: cannot read: {e.strerror or e}") from e
        if len(data) != n:
            raise ElfError(f"{self.p}: short read of {what}")
        return data

    def facts(self) -> SymbolFacts:
        """The file's dynamic symbol facts: header, segments, dynamic table, then the symbols."""
        dyn_seg, dyn = self.segments()
        if dyn_seg is None:  # a static executable or an object file: it binds nothing, needs nothing
            return SymbolFacts(self.p, False, False, (), (), (), (), (), ())
        tags, bind_now = self.dynamic(dyn_seg, dyn)
        syms, versym, first_hashed = self.symbol_table(tags)
        verdefs = self.verdefs(tags) if _DT_VERDEF in tags else ()
        verneeds = self.verneeds(tags) if _DT_VERNEED in tags else ()
        def_names, def_codes, ref_names, ref_codes = self.classify(syms, versym, first_hashed)
        return SymbolFacts(
            path=self.p,
            bind_now=bind_now,
            versioned=bool(versym),
            verdefs=tuple(verdefs),
            verneeds=tuple(verneeds),
            def_names=tuple(def_names),
            def_codes=tuple(def_codes),
            ref_names=tuple(ref_names),
            ref_codes=tuple(ref_codes),
        )

    def segments(self) -> tuple[tuple[int, int] | None, struct.Struct]:
        """The PT_DYNAMIC segment (offset, size; None when there is none) and the dynamic entry layout, after
        reading the ELF header and keeping the PT_LOAD segments (``self.loads``)."""
        p = self.p
        head = self.read(0, min(64, self.size), "ELF header")
        if len(head) < 52 or head[:4] != b"\x7fELF":
            raise ElfError(f"{p}: not an ELF file")
        cls, data = head[4], head[5]
        if cls not in (1, 2) or data not in (1, 2):
            raise ElfError(f"{p}: invalid ELF class or data encoding")
        e = "<" if data == 1 else ">"
        is64 = cls == 2
        if is64:
            if len(head) < 64:
                raise ElfError(f"{p}: truncated ELF header")
            phoff, phentsize, phnum = struct.unpack_from(e + "Q", head, 32)[0], *struct.unpack_from(e + "HH", head, 54)
            phdr = struct.Struct(e + "IIQQQQQQ")
            fields = (0, 2, 3, 5)  # p_type, p_offset, p_vaddr, p_filesz
            dyn = struct.Struct(e + "qQ")
        else:
            phoff, phentsize, phnum = struct.unpack_from(e + "I", head, 28)[0], *struct.unpack_from(e + "HH", head, 42)
            phdr = struct.Struct(e + "IIIIIIII")
            fields = (0, 1, 2, 4)
            dyn = struct.Struct(e + "iI")
        self.e, self.is64 = e, is64
        if phnum == 0:
            raise ElfError(f"{p}: no program headers (not a dynamic object)")
        if phentsize != phdr.size or phnum >= 0xFFFF:
            raise ElfError(f"{p}: unusual program header table")
        it, io_, iv, iz = fields
        loads: list[tuple[int, int, int]] = []
        dyn_seg: tuple[int, int] | None = None
        for ph in phdr.iter_unpack(self.read(phoff, phnum * phentsize, "program header table")):
            if ph[it] == _PT_LOAD:
                loads.append((ph[iv], ph[io_], ph[iz]))
            elif ph[it] == _PT_DYNAMIC:
                dyn_seg = (ph[io_], ph[iz])
        self.loads = loads
        return dyn_seg, dyn

    def dynamic(self, dyn_seg: tuple[int, int], dyn: struct.Struct) -> tuple[dict[int, int], bool]:
        """The first value of each dynamic tag, and whether the object asks to be bound at load (BIND_NOW)."""
        tags: dict[int, int] = {}
        bind_now = False
        raw = self.read(dyn_seg[0], dyn_seg[1] - dyn_seg[1] % dyn.size, "dynamic table")
        for n, (tag, val) in enumerate(dyn.iter_unpack(raw)):
            if tag == _DT_NULL or n > _MAX_DYN:
                break
            tags.setdefault(tag, val)
            if (
                tag == _DT_BIND_NOW
                or (tag == _DT_FLAGS and val & _DF_BIND_NOW)
                or (tag == _DT_FLAGS_1 and val & _DF_1_NOW)
            ):
                bind_now = True
        return tags, bind_now

    def symbol_table(self, tags: Mapping[int, int]) -> tuple[bytes, Sequence[int], int]:
        """The raw .dynsym, its version indexes (empty when unversioned) and the first hashed index, after
        reading .dynstr (``self.strtab``)."""
        p = self.p
        if _DT_SYMTAB not in tags or _DT_STRTAB not in tags:
            raise ElfError(f"{p}: no DT_SYMTAB/DT_STRTAB")
        strsz = tags.get(_DT_STRSZ, 0)
        stroff = self.offset(tags[_DT_STRTAB], strsz, "DT_STRTAB")
        self.strtab = self.read(stroff, strsz, ".dynstr")
        entsize = 24 if self.is64 else 16
        if tags.get(_DT_SYMENT, entsize) != entsize:
            raise ElfError(f"{p}: DT_SYMENT {tags[_DT_SYMENT]} is not {entsize}")
        first_hashed, count = self.symbol_count(tags)
        symoff = self.offset(tags[_DT_SYMTAB], count * entsize, "DT_SYMTAB")
        syms = self.read(symoff, count * entsize, ".dynsym")
        versym: Sequence[int] = ()
        if _DT_VERSYM in tags:
            vs = self.read(self.offset(tags[_DT_VERSYM], 2 * count, "DT_VERSYM"), 2 * count, ".gnu.version")
            versym = struct.unpack(f"{self.e}{count}H", vs)
        return syms, versym, first_hashed

    def classify(
        self, syms: bytes, versym: Sequence[int], first_hashed: int
    ) -> tuple[list[str], list[int], list[str], list[int]]:
        """The symbols ld.so can bind to (names, version << 8 | info codes), then those the file needs."""
        def_names: list[str] = []
        def_codes: list[int] = []
        ref_names: list[str] = []
        ref_codes: list[int] = []
        is64 = self.is64
        sym = struct.Struct(self.e + ("IBBHQQ" if is64 else "IIIBBH"))
        for idx, fields_ in enumerate(sym.iter_unpack(syms)):
            if idx == 0:
                continue
            if is64:
                st_name, info, other, shndx, value, _size = fields_
            else:
                st_name, value, _size, info, other, shndx = fields_
            bind, stt = info >> 4, info & 0xF
            if bind == _STB_LOCAL:
                continue
            vs_ = versym[idx] if versym else 1
            if shndx == _SHN_UNDEF:
                if bind not in (_STB_GLOBAL, _STB_WEAK):
                    continue
                ref_names.append(self.name(st_name))
                ref_codes.append(vs_ << 8 | info)
                continue
            if (
                idx < first_hashed  # the hash table does not reach it: ld.so never finds it
                or bind not in _BIND_NAMES
                or stt not in _ALLOWED_STT
                or other & 3 in (_STV_HIDDEN, _STV_INTERNAL)
                or (value == 0 and shndx != _SHN_ABS and stt != _STT_TLS)
            ):
                continue
            def_names.append(self.name(st_name))
            def_codes.append(vs_ << 8 | info)
        return def_names, def_codes, ref_names, ref_codes

    def offset(self, vaddr: int, n: int, what: str) -> int:
        """The file offset of the *n* bytes at *vaddr*, which one PT_LOAD must hold."""
        for va, off, filesz in self.loads:
            if va <= vaddr and vaddr + n <= va + filesz:
                return vaddr - va + off
        raise ElfError(f"{self.p}: {what} ({n} bytes at address {vaddr:#x}) lies outside every PT_LOAD")

    def name(self, offset: int) -> str:
        end = self.strtab.find(b"\0", offset)
        if offset >= len(self.strtab) or end < 0:
            raise ElfError(f"{self.p}: symbol name outside .dynstr")
        return self.strtab[offset:end].decode("utf-8", "surrogateescape")

    def symbol_count(self, tags: Mapping[int, int]) -> tuple[int, int]:
        """(first symbol the hash table reaches, number of symbols), from DT_GNU_HASH or DT_HASH."""
        e, p = self.e, self.p
        if _DT_GNU_HASH in tags:
            va = tags[_DT_GNU_HASH]
            nbuckets, symoffset, bloom_size, _shift = struct.unpack(e + "IIII", self._at(va, 16, "DT_GNU_HASH"))
            word = 8 if self.is64 else 4
            if nbuckets > _MAX_SYMS or bloom_size > _MAX_SYMS:
                raise ElfError(f"{p}: absurd DT_GNU_HASH header")
            bucket_va = va + 16 + word * bloom_size
            buckets = struct.unpack(f"{e}{nbuckets}I", self._at(bucket_va, 4 * nbuckets, "GNU hash buckets"))
            top = max(buckets, default=0)
            if top < symoffset:
                return symoffset, symoffset
            return symoffset, self.chain_end(bucket_va + 4 * nbuckets + 4 * (top - symoffset), top)
        if _DT_HASH in tags:
            _nbucket, nchain = struct.unpack(e + "II", self._at(tags[_DT_HASH], 8, "DT_HASH"))
            if nchain > _MAX_SYMS:
                raise ElfError(f"{p}: absurd DT_HASH nchain {nchain}")
            return 0, nchain
        raise ElfError(f"{p}: neither DT_GNU_HASH nor DT_HASH: ld.so can look up nothing in it")

    def chain_end(self, vaddr: int, idx: int) -> int:
        """One past the last symbol of the GNU hash chain of symbol *idx*, whose chain word is at *vaddr*: the
        first word with bit 0 set. Read in blocks (doubling up to 4 MiB) and capped by the PT_LOAD holding
        the chain, so a chain that never ends costs one pass over that segment's bytes, never a read per word."""
        room = next((va + filesz - vaddr for va, _off, filesz in self.loads if va <= vaddr < va + filesz), 0)
        low = 0 if self.e == "<" else 3  # the byte of each word that holds bit 0
        done, block = 0, 1 << 12
        while True:
            n = min(block, room - done) & ~3
            if n <= 0:
                raise ElfError(f"{self.p}: GNU hash chain does not terminate before the end of its PT_LOAD")
            data = self._at(vaddr + done, n, "GNU hash chain")
            hit = data[low::4].translate(_BIT0).find(1)
            if hit >= 0:
                end = idx + done // 4 + hit + 1
                if end > _MAX_SYMS:
                    raise ElfError(f"{self.p}: absurd GNU hash chain of {end} symbols")
                return end
            done += n
            block = min(block * 2, 1 << 22)

    def _at(self, vaddr: int, n: int, what: str) -> bytes:
        return self.read(self.offset(vaddr, n, what), n, what)

    def _table(self, tags: Mapping[int, int], tag: int, count_tag: int, what: str) -> tuple[bytes, int]:
        """The bytes from the table's start to the end of its PT_LOAD (records chain by offsets) and its count."""
        va = tags[tag]
        count = tags.get(count_tag, 0)
        for seg_va, off, filesz in self.loads:
            if seg_va <= va < seg_va + filesz:
                start = va - seg_va + off
                n = min(seg_va + filesz - va, 1 << 22)
                return self.read(start, n, what), count
        raise ElfError(f"{self.p}: {what} lies outside every PT_LOAD")

    def relocated(self, wanted: set[str]) -> list[str]:
        """The undefined symbols of ``wanted`` in the order of their first relocation record (see
        :func:`relocation_order`)."""
        dyn_seg, dyn = self.segments()
        if dyn_seg is None or not wanted:
            return []
        tags, _now = self.dynamic(dyn_seg, dyn)
        syms, _versym, _first = self.symbol_table(tags)
        entsize = 24 if self.is64 else 16
        sym = struct.Struct(self.e + ("IBBHQQ" if self.is64 else "IIIBBH"))
        index: dict[int, str] = {}  # .dynsym index -> wanted undefined name
        for idx, fields_ in enumerate(sym.iter_unpack(syms[: len(syms) - len(syms) % entsize])):
            shndx = fields_[3] if self.is64 else fields_[5]
            if idx and shndx == _SHN_UNDEF:
                name = self.name(fields_[0])
                if name in wanted:
                    index[idx] = name
        ranges: list[tuple[int, int, int, bool]] = []  # (vaddr, size, relative records to skip, rela?)
        if _DT_RELA in tags:
            ranges.append((tags[_DT_RELA], tags.get(_DT_RELASZ, 0), tags.get(_DT_RELACOUNT, 0), True))
        elif _DT_REL in tags:
            ranges.append((tags[_DT_REL], tags.get(_DT_RELSZ, 0), tags.get(_DT_RELCOUNT, 0), False))
        if _DT_JMPREL in tags:
            ranges.append((tags[_DT_JMPREL], tags.get(_DT_PLTRELSZ, 0), 0, tags.get(_DT_PLTREL) == _DT_RELA))
        seen: dict[str, None] = {}
        for va, size, skip, rela in ranges:
            self.scan_relocs(va, size, skip, rela, index, seen)
            if len(seen) == len(index):
                break
        return list(seen)

    def scan_relocs(
        self, va: int, size: int, skip: int, rela: bool, index: Mapping[int, str], seen: dict[str, None]
    ) -> None:
        """Add the wanted names of one relocation range's records to ``seen``, in record order."""
        word = 8 if self.is64 else 4
        rec = word * (3 if rela else 2)
        count = size // rec
        pos = min(skip, count)
        code = self.e + ("Q" if self.is64 else "I")
        shift = 32 if self.is64 else 8
        per = max(1, _RELOC_CHUNK // rec)
        while pos < count and len(seen) < len(index):
            n = min(per, count - pos)
            raw = self._at(va + pos * rec, n * rec, "relocation records")
            infos = struct.unpack(f"{code[0]}{n * rec // word}{code[1]}", raw)[1 :: rec // word]
            for info in infos:
                name = index.get(info >> shift)
                if name is not None and name not in seen:
                    seen[name] = None
            pos += n

    def verdefs(self, tags: Mapping[int, int]) -> list[VersionDef]:
        data, count = self._table(tags, _DT_VERDEF, _DT_VERDEFNUM, ".gnu.version_d")
        e = self.e
        out: list[VersionDef] = []
        off = 0
        for _ in range(count):
            _ver, flags, ndx, _cnt, _hash, aux, nxt = struct.unpack_from(e + "HHHHIII", data, off)
            (name_off,) = struct.unpack_from(e + "I", data, off + aux)
            out.append(VersionDef(ndx & 0x7FFF, self.name(name_off), bool(flags & _VER_FLG_BASE)))
            if nxt == 0:
                break
            off += nxt
        return out

    def verneeds(self, tags: Mapping[int, int]) -> list[VersionNeed]:
        data, count = self._table(tags, _DT_VERNEED, _DT_VERNEEDNUM, ".gnu.version_r")
        e = self.e
        out: list[VersionNeed] = []
        off = 0
        for _ in range(count):
            _ver, cnt, vfile, aux, nxt = struct.unpack_from(e + "HHIII", data, off)
            file = self.name(vfile)
            aoff = off + aux
            for _ in range(cnt):
                _hash, flags, other, name_off, anext = struct.unpack_from(e + "IHHII", data, aoff)
                out.append(
                    VersionNeed(
                        file, self.name(name_off), other & 0x7FFF, bool(flags & _VER_FLG_WEAK), bool(other & _HIDDEN)
                    )
                )
                if anext == 0:
                    break
                aoff += anext
            if nxt == 0:
                break
            off += nxt
        return out


def relocation_order(path: str | os.PathLike[str], names: Iterable[str]) -> tuple[str, ...]:
    """``names`` (undefined symbols of the file at ``path``) in the order ld.so's relocation processing
    looks them up when binding now (module docstring): by their first relocation record, DT_RELA/DT_REL
    before DT_JMPREL; names no record references follow in their given order. Reads only the dynamic
    table, .dynsym/.dynstr and the relocation records, and stops once every name is placed; ElfError when
    the file cannot be read."""
    p = os.fspath(path)
    wanted = list(dict.fromkeys(names))
    span, st = open_span(p)
    try:
        try:
            first = _Reader(p, span, st.st_size).relocated(set(wanted))
        except (struct.error, OverflowError, IndexError, UnicodeDecodeError) as e:
            raise ElfError(f"{p}: corrupt relocation tables: {type(e).__name__}: {e}") from e
    finally:
        span.close()
    rank = {n: i for i, n in enumerate(first)}
    return tuple(sorted(wanted, key=lambda n: rank.get(n, len(rank))))


# ------------------------------------------------------------------------------------------- binding rules
class ScopeIndex:
    """Which objects of a run define which names, for ``_dl_lookup_symbol_x`` over many scopes.

    Built from the :class:`SymbolFacts` of every object of every scope and the names anything references;
    :meth:`lookup` answers the first object of a scope (a sequence of paths, in lookup order) whose
    definition ``check_match`` accepts (module docstring), or None. Mutable while it is being built (a
    run-local helper, never stored).
    """

    def __init__(self, wanted: Iterable[str]) -> None:
        self._wanted = set(wanted)
        self._providers: dict[str, list[tuple[str, list[int]]]] = {}
        self._facts: dict[str, SymbolFacts] = {}
        self._names: dict[str, dict[int, str]] = {}

    def add(self, facts: SymbolFacts) -> None:
        """Index one object's definitions of the wanted names (once per path)."""
        if facts.path in self._facts:
            return
        self._facts[facts.path] = facts
        # l_versions (dl-version.c): every non-base verdef and every verneed of the object, by index; the
        # other indexes (0, 1, the base version) keep hash 0
        named = {n.index: n.name for n in facts.verneeds}
        named.update((v.index, v.name) for v in facts.verdefs if not v.base)
        self._names[facts.path] = named
        wanted = self._wanted
        mine: dict[str, list[int]] = {}
        for name, code in zip(facts.def_names, facts.def_codes, strict=True):
            if name in wanted:
                mine.setdefault(name, []).append(code >> 8)
        for name, versyms in mine.items():
            self._providers.setdefault(name, []).append((facts.path, versyms))

    def binds(self, path: str, versyms: Sequence[int], version: str | None, hidden_ref: bool) -> bool:
        """``check_match`` (and ``do_lookup_x``'s ``num_versions``) for the definitions of one name in one
        object, given as their .gnu.version entries."""
        facts = self._facts[path]
        if not facts.versioned:
            return True
        names = self._names[path]
        if version is not None:
            for vs in versyms:
                ndx = vs & 0x7FFF
                vname = names.get(ndx)
                if vname == version:
                    return True
                if not hidden_ref and vname is None and not vs & _HIDDEN:
                    return True
            return False
        defaults = 0
        for vs in versyms:
            if vs & 0x7FFF < 3:
                return True
            if not vs & _HIDDEN:
                defaults += 1
        return defaults == 1

    def lookup(self, name: str, version: str | None, scope: Mapping[str, int], hidden_ref: bool = False) -> str | None:
        """The first object of *scope* (path -> position, in lookup order) binding *name* (with *version*)."""
        best: tuple[int, str] | None = None
        for path, versyms in self._providers.get(name, ()):
            pos = scope.get(path)
            if pos is None or (best is not None and pos >= best[0]):
                continue
            if self.binds(path, versyms, version, hidden_ref):
                best = (pos, path)
        return best[1] if best is not None else None

    def definers(self, name: str, version: str | None) -> tuple[str, ...]:
        """Every indexed object that would bind *name* (with *version*) if it were in scope."""
        return tuple(
            path for path, versyms in self._providers.get(name, ()) if self.binds(path, versyms, version, False)
        )
