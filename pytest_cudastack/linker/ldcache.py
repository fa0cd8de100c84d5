"""Read ``/etc/ld.so.cache`` directly (no ``ldconfig -p``) and ``/etc/ld.so.conf`` as a fallback.

Formats (glibc ``sysdeps/generic/dl-cache.h``): the old ``ld.so-1.7.0`` format, the new
``glibc-ld.so.cache1.1`` format alone (what glibc >= 2.32 writes), and old + new combined (the new header
follows the old entry array, 8-byte aligned). Lookup follows glibc ``elf/dl-cache.c:search_cache``: entries
whose flags the dynamic linker of the requesting architecture rejects are skipped (x86-64 accepts only
``0x0303``); glibc-hwcaps extension entries are used only when the CPU supports their level, the best
supported level winning; the first plain entry with the default flags ends the search.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_cudastack._sysio import open_regular
from pytest_cudastack.errors import LdCacheError, UnreadableFile
from pytest_cudastack.linker.hwcaps import host_search

__all__ = [
    "LdCache",
    "LdCacheEntry",
    "read_ld_cache",
    "read_ld_so_conf",
    "required_flags",
]

log = logging.getLogger(__name__)

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_EXT_MAGIC = 0xEAA42174
_EXT_TAG_HWCAPS = 1
_HWCAP_EXTENSION_MASK = (1 << 62) | (1 << 63)

# (elf_class, e_machine) -> the exact entry flags that architecture's ld.so accepts (_dl_cache_check_flags).
_REQUIRED_FLAGS: dict[tuple[int, int], tuple[int, ...]] = {
    (64, 62): (0x0303,),  # x86-64: FLAG_X8664_LIB64 | FLAG_ELF_LIBC6
    (32, 62): (0x0803,),  # x32: FLAG_X8664_LIBX32 | FLAG_ELF_LIBC6
    (32, 3): (0x0001, 0x0003),  # i386: FLAG_ELF or FLAG_ELF_LIBC6 (generic check)
    (64, 183): (0x0A03,),  # aarch64: FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6
    (64, 21): (0x0503,),  # ppc64: FLAG_POWERPC_LIB64 | FLAG_ELF_LIBC6
    (64, 22): (0x0403,),  # s390x: FLAG_S390_LIB64 | FLAG_ELF_LIBC6
    (64, 43): (0x0103,),  # sparc64
}


def required_flags(elf_class: int = 64, machine: int = 62) -> tuple[int, ...]:
    """Entry flags the dynamic linker for (class, machine) accepts; empty when unknown (accept libc6 type)."""
    return _REQUIRED_FLAGS.get((elf_class, machine), ())


@dataclass(frozen=True)
class LdCacheEntry:
    """One cache entry: the soname key, the full path, the entry flags and the hwcap word."""

    soname: str
    path: str
    flags: int
    hwcap: int
    hwcaps_name: str | None = None  # glibc-hwcaps subdirectory of an extension entry, e.g. "x86-64-v3"


@dataclass(frozen=True)
class LdCache:
    """A parsed ld.so.cache; ``fmt`` is "new", "old" or "old+new"."""

    path: str
    entries: tuple[LdCacheEntry, ...]
    fmt: str
    generator: str | None = None
    _index: dict[str, tuple[LdCacheEntry, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        idx: dict[str, list[LdCacheEntry]] = {}
        for e in self.entries:
            idx.setdefault(e.soname, []).append(e)
        self._index.update({k: tuple(v) for k, v in idx.items()})

    def candidates(self, soname: str) -> tuple[LdCacheEntry, ...]:
        """Every entry for *soname*, in cache order."""
        return self._index.get(soname, ())

    def lookup(
        self,
        soname: str,
        elf_class: int = 64,
        machine: int = 62,
        hwcaps: Sequence[str] | None = None,
    ) -> str | None:
        """The path ld.so would take from the cache for *soname*, or None (glibc ``search_cache``).

        *hwcaps*: the supported glibc-hwcaps subdirectories, best first (default: this CPU's,
        :func:`pytest_cudastack.linker.hwcaps.glibc_hwcaps`).
        """
        supported = tuple(host_search()[1] if hwcaps is None else hwcaps)
        accept = required_flags(elf_class, machine)
        default_id = accept[-1] if accept else None
        best: str | None = None
        best_prio = 0
        for e in self._index.get(soname, ()):
            if accept:
                if e.flags not in accept:
                    continue
            elif e.flags & 0xFF != 0x03:
                continue
            named = e.hwcaps_name is not None or (e.hwcap >> 32) & ~0x3FF == 1 << 30
            if named:
                name = e.hwcaps_name
                if name is None or name not in supported:
                    continue
                prio = supported.index(name) + 1
                if best is None or prio < best_prio:
                    best, best_prio = e.path, prio
                continue
            if best is not None:
                break  # extension entries come first; a supported one beats the plain entry
            if e.hwcap & ~_HWCAP_EXTENSION_MASK:
                continue  # legacy hwcap/platform entry: not evaluated here, never offered
            best = e.path
            if default_id is not None and e.flags == default_id:
                break
        return best


# ldconfig writes sonames and paths of at most PATH_MAX bytes; a longer "string" is the file's damage, and
# decoding one per entry is how a 680 KB file asked for gigabytes.
MAX_STRING = 4096
MAX_FILE = 256 << 20  # a real cache is a few MB; read_ld_cache reads no more than this
_MAX_HWCAPS = 1 << 16  # glibc-hwcaps subdirectory names in the extension (glibc defines a handful)


def _cstr(data: bytes, off: int, what: str, path: str) -> str:
    if off < 0 or off >= len(data):
        raise LdCacheError(f"{path}: {what} string offset {off} past end of file")
    end = data.find(b"\0", off, off + MAX_STRING + 1)
    if end < 0:
        if data.find(b"\0", off) < 0:
            raise LdCacheError(f"{path}: unterminated {what} string at {off}")
        raise LdCacheError(f"{path}: {what} string at {off} longer than {MAX_STRING} bytes")
    return data[off:end].decode("utf-8", "surrogateescape")


def _parse_new(data: bytes, base: int, path: str) -> tuple[list[LdCacheEntry], str | None]:
    if len(data) < base + 48:
        raise LdCacheError(f"{path}: truncated new-format header")
    flags_byte = data[base + 0x1C] & 3
    if flags_byte == 3:
        raise LdCacheError(f"{path}: big-endian cache not supported on this host")
    if flags_byte == 1:
        raise LdCacheError(f"{path}: cache marks its endianness as invalid")
    nlibs, len_strings = struct.unpack_from("<II", data, base + 0x14)
    (ext_off,) = struct.unpack_from("<I", data, base + 0x20)
    if base + 48 + nlibs * 24 > len(data):
        raise LdCacheError(f"{path}: {nlibs} entries do not fit in {len(data)} bytes")
    strings = data[base:]
    # extension: glibc-hwcaps names (tag 1), generator (tag 0)
    hwcap_names: list[str] = []
    generator: str | None = None
    if ext_off:
        if ext_off % 4 or ext_off + 8 > len(data):
            raise LdCacheError(f"{path}: bad extension offset {ext_off}")
        magic, count = struct.unpack_from("<II", data, ext_off)
        if magic == _EXT_MAGIC:
            if ext_off + 8 + count * 16 > len(data):
                raise LdCacheError(f"{path}: extension directory past end of file")
            for i in range(count):
                tag, _fl, off, size = struct.unpack_from("<IIII", data, ext_off + 8 + i * 16)
                if off + size > len(data):
                    raise LdCacheError(f"{path}: extension section {tag} past end of file")
                if tag == 0:
                    generator = data[off : off + size].decode("utf-8", "replace")
                elif tag == _EXT_TAG_HWCAPS:
                    if size // 4 > _MAX_HWCAPS:
                        raise LdCacheError(f"{path}: more than {_MAX_HWCAPS} glibc-hwcaps names")
                    for j in range(size // 4):
                        (soff,) = struct.unpack_from("<I", data, off + 4 * j)
                        hwcap_names.append(_cstr(strings, soff, "hwcaps", path))
    entries: list[LdCacheEntry] = []
    for i in range(nlibs):
        fl, key, value, _osv, hwcap = struct.unpack_from("<iIIIQ", data, base + 48 + 24 * i)
        hname: str | None = None
        if (hwcap >> 32) & ~0x3FF == 1 << 30:
            idx = hwcap & 0xFFFFFFFF
            hname = hwcap_names[idx] if idx < len(hwcap_names) else f"<hwcaps #{idx}>"
        entries.append(
            LdCacheEntry(_cstr(strings, key, "soname", path), _cstr(strings, value, "path", path), fl, hwcap, hname)
        )
    _ = len_strings
    return entries, generator


def _parse_old(data: bytes, path: str) -> tuple[list[LdCacheEntry], int]:
    if len(data) < 16:
        raise LdCacheError(f"{path}: truncated old-format header")
    # header: char magic[11]; (1 pad byte, struct alignment) u32 nlibs
    (nlibs,) = struct.unpack_from("<I", data, 12)
    table_end = 16 + nlibs * 12
    if table_end > len(data):
        raise LdCacheError(f"{path}: {nlibs} old-format entries do not fit in {len(data)} bytes")
    strings = data[table_end:]
    entries: list[LdCacheEntry] = []
    for i in range(nlibs):
        fl, key, value = struct.unpack_from("<iII", data, 16 + 12 * i)
        entries.append(LdCacheEntry(_cstr(strings, key, "soname", path), _cstr(strings, value, "path", path), fl, 0))
    return entries, table_end


def parse_ld_cache(data: bytes, path: str = "<bytes>") -> LdCache:
    """Parse the bytes of an ld.so.cache file; raises :class:`LdCacheError`."""
    try:
        if data.startswith(NEW_MAGIC):
            entries, gen = _parse_new(data, 0, path)
            return LdCache(path, tuple(entries), "new", gen)
        if data.startswith(OLD_MAGIC):
            old, table_end = _parse_old(data, path)
            new_base = (table_end + 7) & ~7
            if data[new_base : new_base + len(NEW_MAGIC)] == NEW_MAGIC:
                entries, gen = _parse_new(data, new_base, path)
                return LdCache(path, tuple(entries), "old+new", gen)
            return LdCache(path, tuple(old), "old", None)
    except struct.error as e:
        raise LdCacheError(f"{path}: truncated cache: {e}") from e
    except (MemoryError, RecursionError) as e:  # hostile input like any other: the caller gets LdCacheError
        raise LdCacheError(f"{path}: malformed cache: {type(e).__name__} while parsing it") from e
    raise LdCacheError(f"{path}: not an ld.so.cache file (unknown magic)")


def read_ld_cache(path: str = "/etc/ld.so.cache") -> LdCache:
    """Read and parse an ld.so.cache file; raises :class:`LdCacheError` (also when it cannot be read)."""
    try:
        fd, _st = open_regular(path, UnreadableFile)
    except UnreadableFile as e:
        raise LdCacheError(str(e)) from e
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_FILE + 1)
    except OSError as e:
        raise LdCacheError(f"{path}: cannot read: {e}") from e
    except MemoryError as e:
        raise LdCacheError(f"{path}: cannot read: MemoryError") from e
    if len(data) > MAX_FILE:
        raise LdCacheError(f"{path}: larger than {MAX_FILE} bytes")
    return parse_ld_cache(data, path)


def read_ld_so_conf(path: str = "/etc/ld.so.conf", root: str = "/") -> tuple[str, ...]:
    """Directories listed by ld.so.conf (``include`` globs followed, ``hwcap`` lines ignored), in order.

    *path* is the logical path; files are read under *root*. Returned directories are logical paths.
    """
    out: list[str] = []
    seen_files: set[str] = set()

    def under(p: str) -> str:
        return os.path.join(root, p.lstrip("/")) if root not in ("", "/") else p

    def parse(conf: str, depth: int) -> None:
        if depth > 16 or conf in seen_files:
            return
        seen_files.add(conf)
        try:
            with open(under(conf), encoding="utf-8", errors="surrogateescape") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for raw in lines:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include") and line[7:8] in (" ", "\t"):
                for pattern in line[8:].split():
                    if not pattern.startswith("/"):
                        pattern = os.path.join(os.path.dirname(conf), pattern)
                    import glob  # lazy: only without an ld.so.cache

                    hits = sorted(glob.glob(under(pattern)))
                    for h in hits:
                        logical = "/" + os.path.relpath(h, root).lstrip("/") if root not in ("", "/") else h
                        parse(logical, depth + 1)
                continue
            if line.startswith("hwcap") and line[5:6] in (" ", "\t"):
                continue
            for d in line.replace(",", " ").replace(":", " ").split():
                d = d.rstrip("/") or "/"
                if d not in out:
                    out.append(d)

    parse(path, 0)
    return tuple(out)
