"""Hostile fatbin input (issue #14): read_fatbin raises nothing but ElfError."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pytest_cudastack.linker.fatbin import CONTAINER_MAGIC, read_fatbin
from tests.helpers.elfbuild import build_lib, needs_cc


@needs_cc
@pytest.mark.parametrize("tail", range(4, 16))
def test_magic_in_the_last_bytes_of_a_section_at_eof(tmp_path: Path, tail: int) -> None:
    """A data section moved to the end of the file with the container magic *tail* bytes before EOF
    (fewer than a container header's 16): was struct.error from the header unpack."""
    from elftools.elf.elffile import ELFFile

    # a fatbin section (empty) makes the file one whose other data is searched
    source = 'const char msg[] = "hello";\n__attribute__((section(".nv_fatbin"))) const char fat[8] = {0};\n'
    lib = build_lib(tmp_path / "build" / "librodata.so", source=source)
    data = bytearray(lib.read_bytes())
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        idx = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".rodata")
        shoff, shentsize = elf.header["e_shoff"], elf.header["e_shentsize"]
    blob = bytes(64 - tail) + struct.pack("<I", CONTAINER_MAGIC) + bytes(tail - 4)
    hdr = shoff + idx * shentsize
    struct.pack_into("<QQ", data, hdr + 24, len(data), len(blob))  # sh_offset, sh_size
    bad = tmp_path / "librodata.so"
    bad.write_bytes(bytes(data) + blob)
    assert read_fatbin(bad).entries == ()


def _entry(arch: int, payload: int = 16, claims: int | None = None) -> bytes:
    """An lz4-compressed SASS entry for ``arch`` (its payload never looked into), claiming ``claims`` bytes."""
    head = bytearray(0x40)
    struct.pack_into("<HHIQ", head, 0, 2, 0x0101, 0x40, payload if claims is None else claims)
    struct.pack_into("<HHI", head, 0x18, 0, 0, arch)
    struct.pack_into("<Q", head, 0x28, 0x2000)
    return bytes(head) + bytes(payload)


def _container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, len(body)) + body


@needs_cc
def test_data_section_walk_stops_at_long_zeros_and_drops_a_container_that_does_not_fit(tmp_path: Path) -> None:
    """In other data the walk goes header to header, stops at more than 64 zero bytes (the search resumes
    after them), and a container whose entry runs past it is data: its arch is not listed."""
    blob = (
        _container(_entry(80))
        + bytes(8)
        + _container(_entry(86))  # alignment padding between containers: walked over
        + bytes(256)
        + _container(_entry(90))  # after a long run of zeros: found again by the search
        + bytes(64)
        + _container(_entry(100), _entry(103, claims=1 << 20))  # its second entry claims 1 MB: all data
        + bytes(64)
        + _container(_entry(120))
    )
    array = ",".join(str(b) for b in blob)
    source = (
        f"__attribute__((aligned(8))) const unsigned char data[] = {{{array}}};\n"
        '__attribute__((section(".nv_fatbin"))) const char fat[8] = {0};\n'
    )
    lib = build_lib(tmp_path / "libwalk.so", source=source)
    fat = read_fatbin(lib)
    assert fat.sass == ("sm_120", "sm_80", "sm_86", "sm_90")
    assert fat.problems == ()
