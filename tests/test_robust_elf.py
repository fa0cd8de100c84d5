"""Hostile ELF files (issue #14, bounded parsers): each input is built here by patching a gcc-built or
synthesised file, and each must end in an ElfError quickly and in bounded memory, from both readers."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker import elf
from pytest_cudastack.linker.elf import (
    MAX_NEEDED,
    MAX_PATH_ELEMENTS,
    _read_elf_fast,
    _read_elf_pyelftools,
    exports,
    read_elf,
)
from tests.helpers.elfbuild import build_lib, needs_cc, synth_elf
from tests.helpers.guarded import run_guarded


def _guarded(reader: str, path: Path, timeout: float = 60) -> str:
    return run_guarded("pytest_cudastack.linker.elf", reader, path, timeout=timeout)


def _section(path: Path, name: str) -> tuple[int, int]:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        sec = ELFFile(f).get_section_by_name(name)
        assert sec is not None, name
        return int(sec["sh_offset"]), int(sec["sh_size"])


def _sysv_lib(tmp_path: Path) -> Path:
    src = "int PyInit_other(void) { return 0; }\n" + "".join(f"int f{i}(void) {{ return {i}; }}\n" for i in range(50))
    return build_lib(tmp_path / "build" / "hashmod.so", source=src, extra=["-Wl,--hash-style=sysv"])


@needs_cc
def test_sysv_hash_with_huge_nchain_is_an_error_not_a_hang(tmp_path: Path) -> None:
    """nchain = 0xFFFFFFFF and a self-looping chain: the walk was bounded by nchain (hours), in both readers."""
    lib = _sysv_lib(tmp_path)
    off, _size = _section(lib, ".hash")
    data = bytearray(lib.read_bytes())
    nbucket = struct.unpack_from("<I", data, off)[0]
    struct.pack_into("<I", data, off + 4, 0xFFFFFFFF)
    for b in range(nbucket):
        struct.pack_into("<I", data, off + 8 + 4 * b, 1)
    struct.pack_into("<I", data, off + 8 + 4 * nbucket + 4, 1)  # chain[1] = 1
    bad = tmp_path / "hashmod.so"
    bad.write_bytes(bytes(data))
    out = _guarded("read_elf", bad, timeout=60)
    assert "ElfError" in out, out
    assert "exceeds its section" in out, out
    assert float(out.split("seconds")[1]) < 5, out
    with pytest.raises(ElfError, match="exceeds its section"):
        _read_elf_pyelftools(bad)
    with pytest.raises(ElfError, match="exceeds its section"):
        exports(bad, "f1")


@needs_cc
def test_sysv_hash_chain_loop_inside_its_section_terminates(tmp_path: Path) -> None:
    """Every chain entry points at itself (nchain left as it is): bounded by the symbols, not by nchain."""
    lib = _sysv_lib(tmp_path)
    off, _size = _section(lib, ".hash")
    data = bytearray(lib.read_bytes())
    nbucket, nchain = struct.unpack_from("<II", data, off)
    for b in range(nbucket):
        struct.pack_into("<I", data, off + 8 + 4 * b, 1)
    for i in range(nchain):
        struct.pack_into("<I", data, off + 8 + 4 * nbucket + 4 * i, i)
    bad = tmp_path / "hashmod.so"
    bad.write_bytes(bytes(data))
    t = time.monotonic()
    with pytest.raises(ElfError, match="does not terminate"):
        read_elf(bad)
    with pytest.raises(ElfError, match="does not terminate"):
        exports(bad, "no_such_symbol")
    assert time.monotonic() - t < 5


def _many_needed(tmp_path: Path, count: int, big: int) -> Path:
    """A synthesised ELF whose *count* DT_NEEDED entries all name one *big*-byte string."""
    src = synth_elf(tmp_path / "src.so", needed=["a" * big, *(["b"] * (count - 1))], soname=None)
    off, size = _section(src, ".dynamic")
    data = bytearray(src.read_bytes())
    for pos in range(off, off + size, 16):
        tag, _val = struct.unpack_from("<qQ", data, pos)
        if tag == 1:
            struct.pack_into("<Q", data, pos + 8, 1)  # the big string
    out = tmp_path / "libmany.so"
    out.write_bytes(bytes(data))
    return out


def test_100k_needed_naming_one_100k_string_is_a_capped_error(tmp_path: Path) -> None:
    """The 1.7 MB file that needed ~10 GB: an ElfError naming the cap, from both readers, under 2 GB."""
    bad = _many_needed(tmp_path, 100_000, 100_000)
    errors = set()
    for reader in ("read_elf", "_read_elf_fast", "_read_elf_pyelftools"):
        out = _guarded(reader, bad)
        assert f"ElfError {bad}: more than " in out, (reader, out)
        assert "(the reader's cap)" in out, (reader, out)
        errors.add(out.splitlines()[0])
    assert len(errors) == 1, errors  # the same words from both readers
    small = _many_needed(tmp_path, 100_000, 2)
    with pytest.raises(ElfError, match=f"more than {MAX_NEEDED} DT_NEEDED entries"):
        read_elf(small)


def test_needed_cap_and_string_budget_agree_in_both_readers(tmp_path: Path) -> None:
    few = _many_needed(tmp_path, 300, 100_000)  # 300 x 100 KB: over the 16 MiB string budget
    for reader in (read_elf, _read_elf_fast, _read_elf_pyelftools):
        with pytest.raises(ElfError, match=r"bytes of strings \(the reader's cap\)"):
            reader(few)
    ok = synth_elf(tmp_path / "libok.so", needed=[f"libn{i}.so" for i in range(MAX_NEEDED)])
    assert len(read_elf(ok).needed) == MAX_NEEDED
    over = synth_elf(tmp_path / "libover.so", needed=[f"libn{i}.so" for i in range(MAX_NEEDED + 1)])
    for reader in (read_elf, _read_elf_fast, _read_elf_pyelftools):
        with pytest.raises(ElfError, match="DT_NEEDED entries"):
            reader(over)


@pytest.mark.parametrize("tag", ["rpath", "runpath"])
def test_path_list_cap(tmp_path: Path, tag: str) -> None:
    value = ":".join(f"/d{i}" for i in range(MAX_PATH_ELEMENTS + 1))
    bad = synth_elf(tmp_path / "libp.so", **{tag: value})  # type: ignore[arg-type]
    for reader in (read_elf, _read_elf_fast, _read_elf_pyelftools):
        with pytest.raises(ElfError, match=f"DT_{tag.upper()} of more than {MAX_PATH_ELEMENTS} elements"):
            reader(bad)
    ok = synth_elf(tmp_path / "libq.so", **{tag: value.rpartition(":")[0]})  # type: ignore[arg-type]
    assert len(getattr(read_elf(ok), tag)) == MAX_PATH_ELEMENTS


@pytest.mark.parametrize("exc", [MemoryError, RecursionError])
def test_memory_and_recursion_errors_never_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: type) -> None:
    ok = synth_elf(tmp_path / "libok.so")

    def boom(*_a: object) -> None:
        raise exc()

    monkeypatch.setattr(elf, "_fast_read", boom)
    with pytest.raises(ElfError, match=exc.__name__):
        read_elf(ok)
    with pytest.raises(ElfError, match=exc.__name__):
        _read_elf_fast(ok)
    monkeypatch.setattr(elf, "_parse", boom)
    with pytest.raises(ElfError, match=exc.__name__):
        _read_elf_pyelftools(ok)


def test_from_json_coerces_nothing(tmp_path: Path) -> None:
    good = read_elf(synth_elf(tmp_path / "libok.so", verneed=[("libc.so.6", ["GLIBC_2.2.5"])])).to_json()
    assert elf.ElfInfo.from_json(good).to_json() == good
    for field, value in [
        ("needed", "libc.so.6"),
        ("needed", [1]),
        ("rpath", None),
        ("elf_class", "64"),
        ("elf_class", True),
        ("little_endian", 1),
        ("soname", 5),
        ("pyinit", ["x"]),
        ("version_needs", [{"file": "libc.so.6", "versions": "GLIBC_2.2.5"}]),
        ("version_needs", [{"file": 1, "versions": []}]),
        ("version_needs", {"file": "x"}),
    ]:
        with pytest.raises(ElfError, match="malformed ElfInfo"):
            elf.ElfInfo.from_json({**good, field: value})
    with pytest.raises(ElfError):
        elf.ElfInfo.from_json({**good, "extra": 1})
    with pytest.raises(ElfError):
        elf.ElfInfo.from_json(["not", "a", "dict"])
