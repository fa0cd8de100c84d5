"""The members of a plain (uncompressed) tar read where they lie: one header after another, their data skipped.

``tarfile`` spends most of a layer's reading in its per-member machinery (a stream object per read, every
field of every header decoded); a layer of a venv has tens of thousands of members. :func:`read_members`
decodes only the fields a layer's application uses (name, link name, size, mode, type), with ``tarfile``'s
rules for them, for the formats real layers use (ustar and its ``prefix``, v7, pax extended headers as
Python's tarfile, Go's archive/tar of BuildKit and containerd, and GNU tar's ``--format=posix`` write them),
and hands everything else to ``tarfile`` itself from that header on (:class:`Handover`): GNU long names,
global pax headers, sparse files, a ``hdrcharset``, a record ``tarfile`` must judge. A header whose
checksum is wrong, or one cut short, is an error (``tarfile.ReadError``), as it is for Go's archive/tar
(``ErrHeader``, ``ErrUnexpectedEOF``) that pulls the layer in a container engine; ``tarfile`` itself would
end the archive there silently. The end is a block of zeros, or the end of the bytes at a header's place.
"""

from __future__ import annotations

import os
import re
import struct
import tarfile
from collections.abc import Iterator

__all__ = ["Handover", "read_members"]

_BLOCK = 512
_AHEAD = 64 << 10  # bytes read at a time: a run of small members' headers (and data) in one pread
_PLAIN = frozenset(b"01234567\x00")  # types decoded here: files, links, directories, devices, FIFOs
_NO_DATA = frozenset(b"123456")  # types tarfile reads no data for (SUPPORTED_TYPES less the regular ones)
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_SIGNED = struct.Struct("148b8x356b")


class Handover(Exception):
    """The member at ``offset`` (of the tar) is one :func:`read_members` leaves to ``tarfile``."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


class _Ahead:
    """Reads of ``fd`` in ``[base, base + size)`` through a read-ahead buffer."""

    def __init__(self, fd: int, base: int, size: int) -> None:
        self._fd = fd
        self._base = base
        self._size = size
        self._start = 0
        self._buf = b""

    def read(self, pos: int, n: int) -> bytes:
        end = min(pos + n, self._size)
        if pos < self._start or end > self._start + len(self._buf):
            self._start = pos
            self._buf = os.pread(self._fd, max(n, min(_AHEAD, self._size - pos)), self._base + pos)
        return self._buf[pos - self._start : end - self._start]


def _nts(field: bytes) -> str:
    """tarfile's ``nts``: up to the first NUL, as the file system's encoding with surrogate escapes."""
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def _nti(field: bytes) -> int:
    """tarfile's ``nti``: octal digits, or GNU's base-256 (first byte 0o200 or 0o377)."""
    if field[0] in (0o200, 0o377):
        n = 0
        for i in range(len(field) - 1):
            n = (n << 8) + field[i + 1]
        return n - (256 ** (len(field) - 1)) if field[0] == 0o377 else n
    end = field.find(b"\0")
    text = (field if end < 0 else field[:end]).decode("ascii").strip()
    return int(text or "0", 8)


def _header(buf: bytes, offset: int) -> tarfile.TarInfo:
    """One 512-byte header as tarfile's ``frombuf`` reads it (the fields used here)."""
    try:
        chksum = _nti(buf[148:156])
        mode = _nti(buf[100:108])
        size = _nti(buf[124:136])
        for start, end in ((108, 116), (116, 124), (136, 148), (329, 337), (337, 345)):
            _nti(buf[start:end])  # uid, gid, mtime, devmajor, devminor: unused, but tarfile refuses bad ones
    except (ValueError, UnicodeDecodeError):
        raise tarfile.ReadError(f"invalid header at offset {offset}") from None
    if size < 0:  # base-256 can say so: the next header would be this one again, a loop
        raise tarfile.ReadError(f"negative size in the header at offset {offset}")
    # the sum of the bytes with the checksum field as spaces; tarfile also accepts it summed as signed bytes
    if chksum != sum(buf) - sum(buf[148:156]) + 256 and chksum != 256 + sum(_SIGNED.unpack_from(buf)):
        raise tarfile.ReadError(f"bad checksum of the header at offset {offset}")
    info = tarfile.TarInfo(_nts(buf[0:100]))
    info.mode = mode
    info.size = size
    info.type = buf[156:157]
    info.linkname = _nts(buf[157:257])
    if info.type == tarfile.AREGTYPE and info.name.endswith("/"):  # v7: a directory is a file named "x/"
        info.type = tarfile.DIRTYPE
    if info.isdir():
        info.name = info.name.rstrip("/")
    prefix = _nts(buf[345:500])
    if prefix and info.type not in tarfile.GNU_TYPES:
        info.name = prefix + "/" + info.name
    info.offset = offset
    info.offset_data = offset + _BLOCK
    return info


def _pax(records: bytes) -> dict[str, str] | None:
    """A pax extended header's records; None when tarfile must read it (a charset, sparse files, a record
    it would decode another way)."""
    out: dict[str, str] = {}
    pos = 0
    while (match := _PAX_RECORD.match(records, pos)) is not None:
        length = int(match.group(1))
        if length == 0:
            return None
        try:
            keyword = match.group(2).decode("utf-8")
            value = records[match.end(2) + 1 : match.start(1) + length - 1].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if keyword == "hdrcharset" or keyword.startswith("GNU.sparse"):
            return None
        out[keyword] = value
        pos += length
    return out


def read_members(fd: int, base: int, size: int) -> Iterator[tarfile.TarInfo]:
    """The members of the tar at ``[base, base + size)`` of ``fd``, in order, each with ``offset_data``
    relative to ``base``; raises :class:`Handover` at the first member tarfile must read, and
    ``tarfile.ReadError`` for a corrupt or cut header."""
    src = _Ahead(fd, base, size)
    pos = 0
    while True:
        buf = src.read(pos, _BLOCK)
        if not buf:
            return  # the bytes end where a header would start
        if len(buf) < _BLOCK:
            raise tarfile.ReadError(f"truncated header at offset {pos}")
        if buf.count(0) == _BLOCK:
            return  # end-of-archive block
        info = _header(buf, pos)
        pax: dict[str, str] | None = {}
        if info.type == tarfile.XHDTYPE:
            pax = _pax(src.read(info.offset_data, info.size)) if info.size <= (1 << 20) else None
            nxt = src.read(info.offset_data + -(-info.size // _BLOCK) * _BLOCK, _BLOCK)
            if pax is None or len(nxt) < _BLOCK or nxt.count(0) == _BLOCK:
                raise Handover(pos)
            member = _header(nxt, info.offset_data + -(-info.size // _BLOCK) * _BLOCK)
        else:
            member = info
        if member.type[0] not in _PLAIN:
            raise Handover(pos)
        if pax:
            if "path" in pax:
                member.name = pax["path"].rstrip("/")
            if "linkpath" in pax:
                member.linkname = pax["linkpath"]
            if "size" in pax:
                try:
                    member.size = int(pax["size"])
                except ValueError:
                    raise Handover(pos) from None
                if member.size < 0:
                    raise tarfile.ReadError(f"negative size in the pax header at offset {pos}")
            member.pax_headers = pax
        member.offset = pos
        yield member
        pos = member.offset_data
        if member.type[0] not in _NO_DATA:
            pos += -(-member.size // _BLOCK) * _BLOCK
