"""Hostile ld.so.cache files (issue #14): LdCacheError is the only error, in bounded memory."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pytest_cudastack.errors import LdCacheError
from pytest_cudastack.linker.ldcache import parse_ld_cache, read_ld_cache
from tests.helpers.guarded import run_guarded


def _long_strings_cache(size: int = 680_000, nlibs: int = 10_000) -> bytes:
    """A new-format cache of 680 KB whose entries name strings running nearly to the end of the file
    (each at its own offset): 10,000 entries x 2 x ~440 KB decoded was the MemoryError."""
    strings_at = 48 + 24 * nlibs
    hdr = b"glibc-ld.so.cache1.1" + struct.pack("<II", nlibs, 0) + bytes([2, 0, 0, 0])
    hdr += struct.pack("<IIII", 0, 0, 0, 0)
    body = b"".join(
        struct.pack("<iIIIQ", 0x303, strings_at + i % 997, strings_at + i % 991, 0, 0) for i in range(nlibs)
    )
    data = hdr + body
    return data + b"a" * (size - len(data) - 1) + b"\0"


def test_680k_cache_of_long_strings_is_an_ldcacheerror(tmp_path: Path) -> None:
    bad = tmp_path / "ld.so.cache"
    bad.write_bytes(_long_strings_cache())
    out = run_guarded("pytest_cudastack.linker.ldcache", "read_ld_cache", bad)
    assert out.startswith("LdCacheError "), out
    assert "longer than 4096 bytes" in out, out


def test_a_string_of_path_max_still_parses() -> None:
    nlibs = 1
    strings_at = 48 + 24 * nlibs
    hdr = b"glibc-ld.so.cache1.1" + struct.pack("<II", nlibs, 0) + bytes([2, 0, 0, 0]) + bytes(16)
    data = hdr + struct.pack("<iIIIQ", 0x303, strings_at, strings_at, 0, 0) + b"/" * 4096 + b"\0"
    assert parse_ld_cache(data).entries[0].path == "/" * 4096


@pytest.mark.parametrize("exc", [MemoryError, RecursionError])
def test_memory_and_recursion_errors_never_escape(monkeypatch: pytest.MonkeyPatch, exc: type) -> None:
    from pytest_cudastack.linker import ldcache

    def boom(*_a: object) -> None:
        raise exc()

    monkeypatch.setattr(ldcache, "_parse_new", boom)
    with pytest.raises(LdCacheError, match=exc.__name__):
        parse_ld_cache(_long_strings_cache(2000, 10))


def test_fifo_and_device_are_ldcacheerrors(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p in (fifo, Path("/dev/zero")):
        with pytest.raises(LdCacheError, match="not a regular file"):
            read_ld_cache(str(p))
