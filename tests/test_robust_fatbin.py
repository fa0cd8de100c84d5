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

    lib = build_lib(tmp_path / "build" / "librodata.so", source='const char msg[] = "hello";\n')
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
