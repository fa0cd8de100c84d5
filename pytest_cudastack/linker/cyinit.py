"""The names a Cython (>= 3.1) extension module's init passes to the import machinery, read from its
machine code: its module-level ``import`` statements, not those inside its functions.

Only the module's exec function runs when the module is imported (CPython's multi-phase init:
``PyInit_<name>`` returns ``PyModuleDef_Init(&def)`` and the import runs the ``Py_mod_exec`` slot of
``def.m_slots``); Cython puts the module's top-level code there. Cython >= 3.1 keeps every Python string
constant of a module (the names of its ``import`` statements among them) in one table,
``__pyx_string_tab[i]`` of the module state, sorted and filled at init from one concatenated (optionally
compressed) byte string and an index of lengths (``Compiler/Code.py``'s ``generate_pystring_constants``).
A name imported at module level and one imported inside a function look the same in that table; what tells
them apart is which code reads the slot and what it passes it to. :func:`init_names` reads, from the file
alone (x86-64 ELF64, the static module state Cython uses unless ``CYTHON_USE_MODULE_STATE``):

1. ``PyInit_<name>`` in ``.dynsym``: its first ``lea r64, [rip+disp32]`` is the ``PyModuleDef``;
   ``m_slots`` (offset 72) and the slot's function pointer are read through their ``R_X86_64_RELATIVE``
   relocations (else the stored value): the ``Py_mod_exec`` (2) slot is the exec function;
2. its extent: its FDE in ``.eh_frame`` (a linear walk), plus every FDE its ``jmp``/``jcc rel32`` reach
   (gcc's ``.cold`` part of a split function);
3. the table: the function (the exec function or one it calls) that calls ``PyUnicode_DecodeUTF8``
   (through its PLT stub or GOT slot) fills it; the last ``lea`` of writable data before that call is its
   base (``stringtab``); of the ``lea``s of read-only data in that function, one is the bytes (raw, zlib,
   bz2 or Cython 3.3's LZSS: ``Utility/StringTools.c``) and one the length index, an array of 32-bit
   bitfield structs that an optimized build copies from ``.rodata`` (``rep movsd``, ``memcpy``) with a count
   the code holds (``mov ecx/edx, imm32``). A cut is taken when the lengths cover a compressed table's
   inflated bytes exactly (Cython 3.1/3.2 copy the lengths of all strings as one index), or when the strings
   are in Cython 3.3's order (at most three strictly increasing runs: non-interned text, interned text,
   bytes; 3.3 may keep the bytes strings' index apart); the longest such cut wins;
4. the slots the exec function passes to the import machinery: every RIP-relative ``disp32`` in its bytes
   (ModRM ``mod=00 rm=101``) whose target is an 8-aligned slot address, when the next call after it goes to
   ``PyImport_ImportModuleLevelObject``, ``PyImport_Import``, ``PyImport_GetModule`` (3.3's
   ``__Pyx__Import_Lookup`` looks in ``sys.modules`` first) or a function that reaches one of them in a few
   calls (Cython's ``__Pyx_Import`` helpers, ``Utility/ImportExport.c``). A variable name of a code object,
   an attribute name or a function's own name is read by the exec function too, but passed elsewhere.

:func:`init_names` returns the dotted identifiers among those slots' strings (module names, the names of a
``from`` import's list), in order of first use, or None when any step cannot be decoded (another machine, no
``PyInit_``, no ``.eh_frame``, a module-state or unoptimized build, a length index built by immediate stores
(a table of a few dozen constants), no such table: an older Cython): the caller then keeps its other
evidence. Bounded: at most :data:`MAX_FILE` bytes read, :data:`MAX_SLOTS` lengths, :data:`MAX_INFLATE`
inflated bytes; a hostile or truncated file gives None, never an exception.
"""

from __future__ import annotations

import bisect
import bz2
import itertools
import os
import re
import struct
import zlib
from typing import NamedTuple

from pytest_cudastack._sysio import Span, open_span
from pytest_cudastack.errors import ElfError

__all__ = ["MAX_FILE", "MAX_INFLATE", "MAX_SLOTS", "init_names"]

MAX_FILE = 256 << 20  # an extension module: a few MB (cuda-bindings' driver: 0.5 MB)
MAX_INFLATE = 16 << 20
MAX_SLOTS = 1 << 16
_MAX_NAMES = 4096
_MAX_CANDIDATES = 64  # read-only leas tried as length index or bytes in the table's init function
_MAX_COUNTS = 16  # the largest element counts its code holds, tried as the length index's
_WORK = 1 << 22  # strings cut and LZSS bytes inflated while looking for the table, per file
_HELPER_DEPTH = 4  # Cython's __Pyx_ImportDottedModule > __Pyx__ImportDottedModule > __Pyx_Import > __Pyx__Import
# the C API functions Cython's import helpers end in (ImportExport.c; 3.3's __Pyx__Import_Lookup first asks
# sys.modules with PyImport_GetModule)
_IMPORTS = ("PyImport_ImportModuleLevelObject", "PyImport_ImportModuleLevel", "PyImport_Import", "PyImport_GetModule")
_EM_X86_64 = 62
_SHT_NOBITS = 8
_SHF_WRITE = 1
_SHF_ALLOC = 2
_R_RELATIVE = 8
_R_GLOB_DAT = 6
_R_JUMP_SLOT = 7
_PY_MOD_EXEC = 2
_M_SLOTS = 72  # offsetof(PyModuleDef, m_slots) on LP64
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# lea r64, [rip+disp32]: REX.W (48/4C), 8D, ModRM mod=00 rm=101
_LEA_RIP = re.compile(rb"[\x48\x4c]\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", re.DOTALL)
_RIP_MODRM = re.compile(rb"[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]")  # ModRM mod=00 rm=101: [rip+disp32]
_JUMP = re.compile(rb"\xe9|\x0f[\x80-\x8f]", re.DOTALL)


class _Section(NamedTuple):
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int


class _Elf:
    """The few tables of one x86-64 ELF64 file this reader needs, from its bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        ident = data[:16]
        if len(data) < _EHDR.size or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ValueError("not little-endian ELF64")
        h = _EHDR.unpack_from(data, 0)
        if h[2] != _EM_X86_64:
            raise ValueError("not x86-64")
        shoff, shentsize, shnum, shstrndx = h[6], h[11], h[12], h[13]
        if shentsize != _SHDR.size or shnum == 0 or shoff + shnum * shentsize > len(data):
            raise ValueError("no section headers")
        raw = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
        if shstrndx >= shnum:
            raise ValueError("no section names")
        names = raw[shstrndx]
        self.sections = [
            _Section(self._cstr(names[4] + s[0], names[4] + names[5]), s[1], s[2], s[3], s[4], s[5], s[6]) for s in raw
        ]

    def _cstr(self, at: int, limit: int) -> str:
        end = self.data.find(b"\0", at, min(limit, len(self.data)))
        return self.data[at:end].decode("ascii", "replace") if 0 <= at < end else ""

    def section(self, name: str) -> _Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def at(self, addr: int) -> _Section | None:
        """The allocated section holding ``addr``."""
        for s in self.sections:
            if s.flags & _SHF_ALLOC and s.addr <= addr < s.addr + s.size:
                return s
        return None

    def read(self, addr: int, n: int) -> bytes | None:
        """``n`` bytes at virtual address ``addr`` from the file (None in NOBITS or outside the file)."""
        s = self.at(addr)
        if s is None or s.type == _SHT_NOBITS or addr + n > s.addr + s.size:
            return None
        off = s.offset + addr - s.addr
        return self.data[off : off + n] if off + n <= len(self.data) else None

    def writable(self, addr: int) -> bool:
        s = self.at(addr)
        return s is not None and bool(s.flags & _SHF_WRITE)

    def read_only(self, addr: int) -> bool:
        s = self.at(addr)
        return s is not None and not s.flags & _SHF_WRITE and s.type != _SHT_NOBITS

    def symbols(self) -> list[tuple[str, int, int]]:
        """``.dynsym``'s defined symbols: name, value, size."""
        sym = self.section(".dynsym")
        if sym is None or sym.link >= len(self.sections):
            return []
        strs = self.sections[sym.link]
        out = []
        for off in range(sym.offset, min(sym.offset + sym.size, len(self.data)) - _SYM.size + 1, _SYM.size):
            name, _info, _other, shndx, value, size = _SYM.unpack_from(self.data, off)
            if shndx:
                out.append((self._cstr(strs.offset + name, strs.offset + strs.size), value, size))
        return out

    def relocations(self) -> tuple[dict[int, int], dict[str, int]]:
        """The RELATIVE relocations (place: addend) and the GOT slot of each imported function."""
        relative: dict[int, int] = {}
        got: dict[str, int] = {}
        sym = self.section(".dynsym")
        for s in self.sections:
            if s.type != 4:  # SHT_RELA
                continue
            for off in range(s.offset, min(s.offset + s.size, len(self.data)) - _RELA.size + 1, _RELA.size):
                where, info, addend = _RELA.unpack_from(self.data, off)
                kind, index = info & 0xFFFFFFFF, info >> 32
                if kind == _R_RELATIVE:
                    relative[where] = addend
                elif kind in (_R_GLOB_DAT, _R_JUMP_SLOT) and sym is not None and sym.link < len(self.sections):
                    at = sym.offset + index * _SYM.size
                    if at + _SYM.size <= len(self.data):
                        strs = self.sections[sym.link]
                        name = _SYM.unpack_from(self.data, at)[0]
                        got[self._cstr(strs.offset + name, strs.offset + strs.size)] = where
        return relative, got

    def pointer(self, addr: int, relative: dict[int, int]) -> int | None:
        """The pointer stored at ``addr``: its RELATIVE relocation's addend, else the stored value."""
        if addr in relative:
            return relative[addr]
        raw = self.read(addr, 8)
        return struct.unpack("<Q", raw)[0] if raw is not None and raw != bytes(8) else None


def _uleb(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos
    raise ValueError("bad LEB128")


def _encoded(data: bytes, pos: int, enc: int, here: int) -> tuple[int, int]:
    """A DWARF EH pointer of encoding ``enc`` at ``pos`` (section address ``here``): value, next position."""
    fmt = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q"}.get(enc & 0x0F)
    if fmt is None or enc & 0x70 not in (0x00, 0x10):
        raise ValueError("unsupported pointer encoding")
    size = struct.calcsize(fmt)
    if pos + size > len(data):
        raise ValueError("truncated")
    value = struct.unpack_from(fmt, data, pos)[0]
    if enc & 0x70 == 0x10:  # pc-relative
        value += here
    return value & 0xFFFFFFFFFFFFFFFF, pos + size


def _functions(elf: _Elf) -> list[tuple[int, int]]:
    """Every FDE's address range in ``.eh_frame`` (a linear walk), sorted."""
    sec = elf.section(".eh_frame")
    if sec is None or sec.type == _SHT_NOBITS or sec.offset + sec.size > len(elf.data):
        return []
    data = elf.data[sec.offset : sec.offset + sec.size]
    encodings: dict[int, int] = {}
    out: list[tuple[int, int]] = []
    pos = 0
    while pos + 8 <= len(data):
        length = struct.unpack_from("<I", data, pos)[0]
        if length == 0 or length == 0xFFFFFFFF or pos + 4 + length > len(data):
            break
        body, end = pos + 4, pos + 4 + length
        cie_id = struct.unpack_from("<I", data, body)[0]
        try:
            if cie_id == 0:
                encodings[pos] = _cie_encoding(data, body + 4, end)
            else:
                enc = encodings.get(body - cie_id, 0)
                start, p = _encoded(data, body + 4, enc, sec.addr + body + 4)
                size, _p = _encoded(data, p, enc & 0x0F, 0)
                out.append((start, start + size))
        except ValueError:
            pass
        pos = end
    return sorted(out)


def _cie_encoding(data: bytes, pos: int, end: int) -> int:
    """The FDE pointer encoding a CIE's augmentation names (``R``), DW_EH_PE_absptr without one."""
    version = data[pos]
    aug_end = data.find(b"\0", pos + 1, end)
    if aug_end < 0:
        raise ValueError("bad CIE")
    aug = data[pos + 1 : aug_end]
    p = aug_end + 1
    _, p = _uleb(data, p)  # code alignment
    _, p = _uleb(data, p)  # data alignment (sleb: only skipped)
    p = p + 1 if version == 1 else _uleb(data, p)[1]  # return address register
    if not aug.startswith(b"z"):
        return 0
    _, p = _uleb(data, p)
    for c in aug[1:]:
        if p >= end:
            raise ValueError("bad CIE")
        if c == ord("R"):
            return data[p]
        if c == ord("L"):
            p += 1
        elif c == ord("P"):
            p = _encoded(data, p + 1, data[p], 0)[1]
    return 0


def _exec_function(elf: _Elf, relative: dict[int, int]) -> int | None:
    """The address of the ``Py_mod_exec`` slot's function of the module's ``PyModuleDef`` (step 1)."""
    inits = [(v, n) for n, v, _s in elf.symbols() if n.startswith("PyInit_")]
    if len(inits) != 1:
        return None
    head = elf.read(inits[0][0], 32)
    leas = _rip_targets(head or b"", inits[0][0])
    if not leas:  # lea rdi, [rip+disp32] (lea rax and mov rdi, rax unoptimized)
        return None
    moddef = leas[0][2]
    slots = elf.pointer(moddef + _M_SLOTS, relative)
    if slots is None:
        return None
    for k in range(32):
        raw = elf.read(slots + 16 * k, 4)
        if raw is None:
            return None
        slot = struct.unpack("<i", raw)[0]
        if slot == 0:
            return None
        if slot == _PY_MOD_EXEC:
            return elf.pointer(slots + 16 * k + 8, relative)
    return None


def _code(elf: _Elf, start: int, end: int) -> bytes:
    return elf.read(start, end - start) or b""


def _containing(functions: list[tuple[int, int]], addr: int) -> tuple[int, int] | None:
    """The function (sorted ``functions``) holding ``addr``."""
    k = bisect.bisect_right(functions, (addr, 1 << 64)) - 1
    return functions[k] if k >= 0 and addr < functions[k][1] else None


def _exec_parts(elf: _Elf, functions: list[tuple[int, int]], start: int) -> list[tuple[int, int]]:
    """The exec function's FDE range and those its rel32 jumps reach (its ``.cold`` part) (step 2)."""
    own = next((f for f in functions if f[0] == start), None)
    if own is None:
        return []
    parts = [own]
    code = _code(elf, *own)
    for m in _JUMP.finditer(code):
        at = m.end()
        if at + 4 > len(code):
            continue
        target = own[0] + at + 4 + struct.unpack_from("<i", code, at)[0]
        if own[0] <= target < own[1]:
            continue
        other = _containing(functions, target)
        if other is not None and other not in parts and len(parts) < 8:
            parts.append(other)
    return parts


def _rip_targets(code: bytes, base: int) -> list[tuple[int, int, int]]:
    """The ``lea r64, [rip+disp32]`` in ``code``: (address, register, target)."""
    out = []
    for m in _LEA_RIP.finditer(code):
        at = m.start()
        if at + 7 > len(code):
            continue
        reg = (code[at + 2] >> 3 & 7) | (8 if code[at] == 0x4C else 0)
        out.append((base + at, reg, base + at + 7 + struct.unpack_from("<i", code, at + 3)[0]))
    return out


def _inflate(elf: _Elf, addr: int) -> bytes | None:
    """The zlib or bz2 stream at ``addr``, inflated (bounded), or None."""
    sec = elf.at(addr)
    if sec is None:
        return None
    off = sec.offset + addr - sec.addr
    raw = elf.data[off : sec.offset + sec.size]
    try:
        if raw[:1] == b"\x78":
            z = zlib.decompressobj()
            out = z.decompress(raw, MAX_INFLATE)
            return out if z.eof else None
        if raw[:3] == b"BZh":
            b = bz2.BZ2Decompressor()
            out = b.decompress(raw, MAX_INFLATE)
            return out if b.eof else None
    except (zlib.error, OSError, ValueError, EOFError):
        return None
    return None


def _lengths(elf: _Elf, addr: int, limit: int) -> list[int]:
    """Up to :data:`MAX_SLOTS` 32-bit lengths from ``addr`` while each is below ``limit``."""
    if addr % 4 or not elf.read_only(addr):
        return []
    sec = elf.at(addr)
    assert sec is not None
    avail = min(MAX_SLOTS, (sec.addr + sec.size - addr) // 4)
    raw = elf.read(addr, 4 * avail) or b""
    out = []
    for (v,) in struct.iter_unpack("<I", raw):
        if v >= limit:
            break
        out.append(v)
    return out


def _counts(code: bytes) -> set[int]:
    """The element counts the code may copy the length index with: ``mov ecx, imm32`` (``rep movsd``'s
    count) and ``mov edx, imm32`` divided by 4 (``memcpy``'s size)."""
    out: set[int] = set()
    for m in re.finditer(rb"[\xb9\xba]", code):
        if m.start() + 5 <= len(code):
            v = struct.unpack_from("<I", code, m.start() + 1)[0]
            n = v if code[m.start()] == 0xB9 else v // 4 if v % 4 == 0 else 0
            if 0 < n <= MAX_SLOTS:
                out.add(n)
    return out


def _cut(data: bytes, lengths: list[int]) -> list[bytes]:
    out, pos = [], 0
    for n in lengths:
        out.append(data[pos : pos + n])
        pos += n
    return out


def _sorted(strings: list[bytes]) -> bool:
    """Cython >= 3.3's order: the non-interned and the interned text strings, each sorted by text (UTF-8
    keeps code point order), then the bytes strings sorted: at most three strictly increasing runs."""
    runs = 1
    for a, b in itertools.pairwise(strings):
        if b <= a:
            runs += 1
    return runs <= 3


def _lzss(src: bytes, size: int) -> bytes | None:
    """Cython 3.3's LZSS stream (``StringTools.c``'s ``__pyx_lzss_decompress``) inflated to ``size`` bytes;
    None when it does not decode."""
    out = bytearray()
    pos = 0
    try:
        while len(out) < size:
            flags = src[pos] | 0xFF00
            pos += 1
            while flags & 0x100 and len(out) < size:
                if flags & 1:
                    out.append(src[pos])
                    pos += 1
                else:
                    lo, hi = src[pos], src[pos + 1]
                    pos += 2
                    if not lo & 0x80:
                        back, n = lo, hi
                    elif not hi & 0x80:
                        back, n = 0x80 + (((hi << 2) & 0x180) | (lo & 0x7F)), hi & 0x1F
                    else:
                        back, n = 0x80 + ((hi & 0x7F) << 7 | (lo & 0x7F)), src[pos]
                        pos += 1
                    n += 3
                    ref = len(out) - back - n
                    if ref < 0:
                        return None
                    for i in range(n):
                        out.append(out[ref + i])
                flags >>= 1
    except IndexError:
        return None
    return bytes(out[:size])


def _split(inflated: bytes | None, raw: bytes, lengths: list[int], total: int, budget: list[int]) -> list[bytes] | None:
    """The table's strings when ``lengths`` (summing to ``total``) cut the bytes as Cython's init does: all
    of a zlib or bz2 stream's ``inflated`` bytes (Cython 3.1/3.2 copy one index of all lengths); else a prefix
    of them, of the ``raw`` C string (no NUL before the lengths' end) or of Cython 3.3's LZSS stream, whose
    strings must then be in Cython 3.3's order (its index of the bytes strings' lengths may be apart).
    ``budget`` bounds the work (strings cut, bytes inflated) over all tries."""
    budget[0] -= len(lengths)
    if inflated is not None:
        if total == len(inflated):
            return _cut(inflated, lengths)
        found = _cut(inflated, lengths) if total < len(inflated) else []
        return found if found and _sorted(found) else None
    if total < len(raw) and b"\0" not in raw[:total]:
        found = _cut(raw, lengths)
        return found if _sorted(found) else None
    budget[0] -= total
    data = _lzss(raw, total) if budget[0] > 0 and total <= MAX_INFLATE else None
    found = _cut(data, lengths) if data is not None else []
    return found if found and _sorted(found) else None


def _table(elf: _Elf, fn: tuple[int, int], call: int) -> tuple[int, list[bytes]] | None:
    """The string table's base address and its strings, from its init function ``fn`` (step 3): a
    read-only ``lea`` target as the bytes, another as the length index whose first N entries (N: one of the
    largest counts the code holds) cut the bytes as the table's init does (:func:`_split`); the longest cut
    (a few small numbers may cut a few bytes by chance)."""
    code = _code(elf, *fn)
    leas = _rip_targets(code, fn[0])
    bases = [t for a, _r, t in leas if a < call and elf.writable(t)]
    counts = sorted(_counts(code), reverse=True)[:_MAX_COUNTS]
    if not bases or not counts:
        return None
    ro = list(dict.fromkeys(t for _a, _r, t in leas if elf.read_only(t)))[:_MAX_CANDIDATES]
    indexes = {i: _lengths(elf, i, 1 << 20) for i in ro}
    sums = {i: list(itertools.accumulate(v)) for i, v in indexes.items()}
    blobs: list[tuple[int, bytes | None]] = [(b, _inflate(elf, b)) for b in ro]
    blobs.sort(key=lambda b: b[1] is None)  # a compressed table first: its inflated size is exact
    best: list[bytes] = []
    budget = [_WORK]
    for blob, inflated in blobs:
        sec = elf.at(blob)
        assert sec is not None
        raw = b"" if inflated is not None else elf.read(blob, min(sec.addr + sec.size - blob, MAX_INFLATE + 1))
        for index in ro:
            for n in counts if index != blob else ():
                if len(best) < n <= len(indexes[index]) and budget[0] > 0:
                    found = _split(inflated, raw or b"", indexes[index][:n], sums[index][n - 1], budget)
                    best = found if found is not None else best
    return (bases[-1], best) if best else None


class _Calls:
    """The direct calls of the file's code, as :func:`_decode` needs them: ``call rel32`` to an FDE's start
    (a function) or to a PLT stub (``jmp [rip+disp32]`` through a GOT slot, after an optional ``endbr64``
    and ``bnd``), and ``call [rip+disp32]`` through a GOT slot (``-fno-plt``). A callee is a function's start
    address or, for an imported function, its GOT slot's address. Each function is scanned when asked."""

    def __init__(self, elf: _Elf, functions: list[tuple[int, int]], got: dict[str, int]) -> None:
        self.elf = elf
        self.functions = {f[0]: f for f in functions}
        self.slots = set(got.values())
        self.stubs: dict[int, int] = {}
        self.scanned: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for sec in elf.sections:
            if sec.name.startswith(".plt") and sec.type != _SHT_NOBITS:
                code = elf.data[sec.offset : sec.offset + sec.size]
                for m in re.finditer(rb"\xff\x25", code):
                    if m.start() + 6 <= len(code):
                        slot = sec.addr + m.start() + 6 + struct.unpack_from("<i", code, m.start() + 2)[0]
                        if slot in self.slots:
                            for entry in range(sec.addr + m.start() - 5, sec.addr + m.start() + 1):
                                self.stubs.setdefault(entry, slot)

    def sites(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The calls in ``[lo, hi)``: (address, callee), in address order."""
        hit = self.scanned.get((lo, hi))
        if hit is not None:
            return hit
        code = _code(self.elf, lo, hi)
        out = []
        for m in re.finditer(rb"\xe8|\xff\x15", code):
            i = m.start()
            callee: int | None = None
            if code[i] == 0xE8 and i + 5 <= len(code):
                target = lo + i + 5 + struct.unpack_from("<i", code, i + 1)[0]
                callee = target if target in self.functions else self.stubs.get(target)
            elif code[i] == 0xFF and i + 6 <= len(code):
                slot = lo + i + 6 + struct.unpack_from("<i", code, i + 2)[0]
                callee = slot if slot in self.slots else None
            if callee is not None:
                out.append((lo + i, callee))
        self.scanned[(lo, hi)] = out
        return out

    def reaches(self, callee: int, sinks: set[int], depth: int, memo: dict[tuple[int, int], bool]) -> bool:
        """Whether a call to ``callee`` reaches one of ``sinks`` through at most ``depth`` calls."""
        if callee in sinks:
            return True
        fn = self.functions.get(callee)
        if fn is None or depth <= 0:
            return False
        key = (callee, depth)
        if key not in memo:
            memo[key] = False  # a recursive call reaches nothing new
            memo[key] = any(self.reaches(c, sinks, depth - 1, memo) for _a, c in self.sites(*fn) if c != callee)
        return memo[key]


def _decode(data: bytes) -> tuple[str, ...] | None:
    elf = _Elf(data)
    relative, got = elf.relocations()
    start = _exec_function(elf, relative) if "PyUnicode_DecodeUTF8" in got else None
    functions = _functions(elf) if start is not None else []
    if start is None or not functions:
        return None
    parts = _exec_parts(elf, functions, start)
    if not parts:
        return None
    calls = _Calls(elf, functions, got)
    sites = sorted(site for lo, hi in parts for site in calls.sites(lo, hi))
    # the table's init: in the exec function, or in a function it calls
    found: tuple[tuple[int, int], int] | None = None
    for fn in [parts[0], *(calls.functions[c] for _a, c in sites if c in calls.functions)]:
        decode = [a for a, c in calls.sites(*fn) if c == got["PyUnicode_DecodeUTF8"]]
        if decode:
            found = (fn, decode[0])
            break
    if found is None:
        return None
    table = _table(elf, *found)
    if table is None:
        return None
    base, strings = table
    sinks = {got[n] for n in _IMPORTS if n in got}
    own = {lo for lo, _hi in parts}
    memo: dict[tuple[int, int], bool] = {}
    at = [a for a, _c in sites]
    order: dict[int, None] = {}
    for lo, hi in parts:
        code = _code(elf, lo, hi)
        for m in _RIP_MODRM.finditer(code, 0, max(0, len(code) - 4)):
            i = m.end()
            disp = struct.unpack_from("<i", code, i)[0]
            for imm in (0, 1, 4):
                k, rem = divmod(lo + i + 4 + imm + disp - base, 8)
                if rem or not 0 <= k < len(strings):
                    continue
                nxt = bisect.bisect_right(at, lo + i)
                callee = sites[nxt][1] if nxt < len(sites) else None
                if callee is not None and callee not in own and calls.reaches(callee, sinks, _HELPER_DEPTH, memo):
                    order.setdefault(k, None)  # the slot is an argument of an import
    names: list[str] = []
    for k in order:
        try:
            text = strings[k].decode("ascii")
        except UnicodeDecodeError:
            continue
        if _DOTTED.fullmatch(text) and len(names) < _MAX_NAMES:
            names.append(text)
    return tuple(dict.fromkeys(names))


def _may_hold_table(span: Span, size: int) -> bool:
    """Whether the file's dynamic string table names both a ``PyInit_`` and ``PyUnicode_DecodeUTF8`` (the
    table's init): read first, so that a large library that is no such module is never read whole."""
    head = span.pread(_EHDR.size, 0)
    if len(head) < _EHDR.size or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return False
    h = _EHDR.unpack(head)
    shoff, shentsize, shnum = h[6], h[11], h[12]
    if shentsize != _SHDR.size or not 0 < shnum < 0xFF00 or shoff + shnum * shentsize > size:
        return False
    table = span.pread(shnum * shentsize, shoff)
    headers = [_SHDR.unpack_from(table, i * shentsize) for i in range(len(table) // shentsize)]
    for sh in headers:
        if sh[1] == 11 and sh[6] < len(headers):  # SHT_DYNSYM, its sh_link: .dynstr
            strtab = headers[sh[6]]
            if strtab[5] > MAX_FILE or strtab[4] + strtab[5] > size:
                return False
            names = span.pread(strtab[5], strtab[4])
            return b"\0PyInit_" in names and b"\0PyUnicode_DecodeUTF8\0" in names
    return False


def init_names(path: str | os.PathLike[str]) -> tuple[str, ...] | None:
    """The dotted identifiers among the string-table constants the module's exec function passes to the
    import machinery (module docstring), in order of first use; None when the file does not show them (not
    Cython >= 3.1 with a static module state on x86-64, or anything not decoded). ElfError only when the
    file cannot be read."""
    p = os.fspath(path)
    span, st = open_span(p)
    try:
        if st.st_size > MAX_FILE or not _may_hold_table(span, st.st_size):
            return None
        data = b""
        while len(data) < st.st_size:
            chunk = span.pread(st.st_size - len(data), len(data))
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise ElfError(f"{p}: cannot read: {e.strerror or e}") from e
    finally:
        span.close()
    try:
        return _decode(data)
    except (ValueError, IndexError, struct.error, KeyError):
        return None
