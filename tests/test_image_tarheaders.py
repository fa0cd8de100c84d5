"""The in-place tar header reader reads what ``tarfile`` reads (names, link names, sizes, modes, types, data
offsets) for every format, handing the members it does not decode to ``tarfile``; a corrupt or cut header
is an error where ``tarfile`` would end the archive silently."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from pytest_cudastack.image.tarheaders import Handover, read_members

LONG = "opt/" + "/".join(["segment-of-a-long-path"] * 8) + "/libfoo.so.1"
UNICODE = "usr/share/caf\u00e9/r\u00e9sum\u00e9.txt"


def _tar(fmt: int, entries: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for entry in entries:
            info, data = entry if isinstance(entry, tuple) else (entry, b"")
            tf.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "", mode: int = 0o644):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.linkname = link
    info.mode = mode
    info.mtime = 1_700_000_000.5  # a fraction: Python's pax writer records it, one pax header a member
    return info


def _entries() -> list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]:
    return [
        _info("usr", tarfile.DIRTYPE, mode=0o755),
        (_info("usr/lib/libx.so.1", size=5, mode=0o755), b"hello"),
        (_info(LONG, size=700), os.urandom(700)),
        (_info(UNICODE, size=3), b"abc"),
        _info("usr/lib/libx.so", tarfile.SYMTYPE, link="libx.so.1"),
        _info("usr/lib/hard", tarfile.LNKTYPE, link="usr/lib/libx.so.1"),
        _info("usr/lib/" + "l" * 120, tarfile.SYMTYPE, link="../" + "t" * 150),
        _info("dev/fifo", tarfile.FIFOTYPE),
        _info("dev/null", tarfile.CHRTYPE),
        (_info("empty", size=0), b""),
    ]


def _fields(m: tarfile.TarInfo, base: int = 0) -> tuple[object, ...]:
    return (m.name, m.type, m.size if m.isreg() else 0, m.linkname, m.mode, m.offset_data + base)


def _by_tarfile(data: bytes) -> list[tuple[object, ...]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [_fields(m) for m in tf]


def _by_reader(tmp_path: Path, data: bytes) -> tuple[list[tuple[object, ...]], int | None]:
    """What read_members reads, then tarfile from where it hands over (as the layer writer does)."""
    path = tmp_path / "layer.tar"
    path.write_bytes(data)
    out: list[tuple[object, ...]] = []
    with open(path, "rb") as f:
        try:
            out.extend(_fields(m) for m in read_members(f.fileno(), 0, len(data)))
        except Handover as e:
            with tarfile.open(fileobj=io.BytesIO(data[e.offset :]), mode="r:") as tf:
                out.extend(_fields(m, e.offset) for m in tf)
            return out, e.offset
    return out, None


@pytest.mark.parametrize(
    "fmt",
    [tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT],
    ids=["pax", "ustar-prefix", "gnu-longname"],
)
def test_members_are_those_tarfile_reads(tmp_path: Path, fmt: int) -> None:
    entries = _entries()
    if fmt == tarfile.USTAR_FORMAT:  # ustar: a name fits its prefix + name fields, a link 100 bytes
        entries = [e for e in entries if "t" * 150 not in (e[0] if isinstance(e, tuple) else e).linkname]
    data = _tar(fmt, entries)
    got, handed = _by_reader(tmp_path, data)
    assert got == _by_tarfile(data)
    # GNU's long names are tarfile's to read: handed over at the first one; pax and ustar are read here
    assert (handed is not None) == (fmt == tarfile.GNU_FORMAT)


def test_v7_directory_and_base256_size(tmp_path: Path) -> None:
    """A v7 directory (a file whose name ends in "/") and a size in GNU's base-256 form, as tarfile reads
    them."""
    v7 = bytearray(_tar(tarfile.USTAR_FORMAT, [_info("olddir/", tarfile.AREGTYPE)]))
    big = bytearray(_tar(tarfile.USTAR_FORMAT, [(_info("f", size=3), b"abc")]))
    for raw, patch in ((v7, None), (big, b"\x80" + b"\0" * 10 + b"\x03")):
        if patch is not None:
            raw[124:136] = patch
        raw[148:156] = b" " * 8
        raw[148:156] = b"%06o\0 " % sum(raw[:512])
    for data in (bytes(v7), bytes(big)):
        got, handed = _by_reader(tmp_path, data)
        assert handed is None
        assert got == _by_tarfile(data)


@pytest.mark.parametrize(
    "special",
    [
        pytest.param("global", id="pax-global-header"),
        pytest.param("hdrcharset", id="pax-hdrcharset"),
        pytest.param("sparse", id="gnu-sparse"),
    ],
)
def test_what_it_does_not_decode_is_handed_to_tarfile(tmp_path: Path, special: str) -> None:
    first = _tar(tarfile.PAX_FORMAT, [(_info("first", size=2), b"ok")])
    head = first[: _by_tarfile(first)[0][-1] + 512]  # the member, not the end-of-archive blocks
    if special == "global":
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "g"}) as tf:
            tf.addfile(_info("after-global", size=1), io.BytesIO(b"x"))
        tail = buf.getvalue()
    elif special == "hdrcharset":
        tail = _tar(tarfile.PAX_FORMAT, [(_info("bad-\udcff-name", size=1), b"x")])
    else:
        sparse = bytearray(_tar(tarfile.GNU_FORMAT, [(_info("sparse", size=1), b"x")]))
        sparse[156:157] = tarfile.GNUTYPE_SPARSE
        sparse[148:156] = b" " * 8
        sparse[148:156] = b"%06o\0 " % sum(sparse[:512])
        tail = bytes(sparse)
    data = head + tail
    got, handed = _by_reader(tmp_path, data)
    assert handed == len(head)
    assert got == _by_tarfile(data)
    assert got[0][0] == "first"


def test_bad_checksum_after_the_first_member_is_an_error(tmp_path: Path) -> None:
    """tarfile ends the archive silently at a later corrupt header (the rest of the layer lost); Go's
    archive/tar, which pulls the layer, refuses it: so does the reader."""
    data = bytearray(_tar(tarfile.USTAR_FORMAT, [(_info("a", size=1), b"x"), (_info("b", size=1), b"y")]))
    data[1024] ^= 0xFF  # the second header's name
    assert [m[0] for m in _by_tarfile(bytes(data))] == ["a"]  # tarfile: silently one member
    path = tmp_path / "t.tar"
    path.write_bytes(bytes(data))
    with open(path, "rb") as f, pytest.raises(tarfile.ReadError, match="bad checksum"):
        list(read_members(f.fileno(), 0, len(data)))


def test_cut_header_is_an_error_and_an_exact_end_is_not(tmp_path: Path) -> None:
    data = _tar(tarfile.USTAR_FORMAT, [(_info("a", size=1), b"x"), (_info("b", size=1), b"y")])
    path = tmp_path / "t.tar"
    path.write_bytes(data)
    with open(path, "rb") as f:
        with pytest.raises(tarfile.ReadError, match="truncated header"):
            list(read_members(f.fileno(), 0, 1024 + 200))
        # no end-of-archive blocks: the bytes end where a header would start
        assert [m.name for m in read_members(f.fileno(), 0, 2048)] == ["a", "b"]


def test_window_of_a_larger_file(tmp_path: Path) -> None:
    """A layer that is a member of an uncompressed archive: its tar starts at ``base``, offsets relative."""
    data = _tar(tarfile.PAX_FORMAT, _entries())
    path = tmp_path / "outer"
    path.write_bytes(b"\xff" * 1536 + data + b"\xee" * 4096)
    with open(path, "rb") as f:
        got = [_fields(m) for m in read_members(f.fileno(), 1536, len(data))]
    assert got == _by_tarfile(data)


@pytest.mark.parametrize("where", ["base-256", "pax"])
def test_negative_size_is_an_error_not_a_loop(tmp_path: Path, where: str) -> None:
    """A size that points back at the member's own header would read it again for ever."""
    if where == "pax":
        info = _info("f", size=1)
        info.pax_headers = {"size": "-512"}
        data = bytearray(_tar(tarfile.PAX_FORMAT, [(info, b"x")]))
    else:
        data = bytearray(_tar(tarfile.USTAR_FORMAT, [(_info("f", size=1), b"x")]))
        data[124:136] = b"\xff" * 10 + b"\xfe\x00"  # -512 in base-256: the next header is this one
        data[148:156] = b" " * 8
        data[148:156] = b"%06o\0 " % sum(data[:512])
    path = tmp_path / "t.tar"
    path.write_bytes(bytes(data))
    with open(path, "rb") as f, pytest.raises(tarfile.ReadError, match="negative size"):
        list(read_members(f.fileno(), 0, len(data)))
