"""ldcache: the binary ld.so.cache formats (ldconfig as the oracle, in tests only), lookup rules, ld.so.conf."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.errors import LdCacheError
from pytest_cudastack.linker.ldcache import (
    LdCache,
    LdCacheEntry,
    parse_ld_cache,
    read_ld_cache,
    read_ld_so_conf,
    required_flags,
)
from tests.helpers.elfbuild import build_lib, needs_cc

LDCONFIG = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
needs_ldconfig = pytest.mark.skipif(LDCONFIG is None, reason="needs ldconfig")


def _ldconfig_formats() -> set[str]:
    if LDCONFIG is None:
        return set()
    out = subprocess.run([LDCONFIG, "--help"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"new \(default\), (\w+), or (\w+)", out)
    return {"new", *(m.groups() if m else ())}


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ldcache")
    lib = d / "lib"
    build_lib(lib / "libalpha.so.1", soname="libalpha.so.1")
    build_lib(lib / "libbeta.so.2", soname="libbeta.so.2")
    build_lib(lib / "glibc-hwcaps" / "x86-64-v2" / "libbeta.so.2", soname="libbeta.so.2")
    (d / "ld.so.conf").write_text(f"{lib}\n")
    return d


def _make_cache(libdir: Path, fmt: str) -> Path:
    assert LDCONFIG is not None
    out = libdir / f"{fmt}.cache"
    subprocess.run(
        [LDCONFIG, "-X", "-C", str(out), "-f", str(libdir / "ld.so.conf"), "-c", fmt],
        check=True,
        capture_output=True,
    )
    return out


@needs_cc
@needs_ldconfig
@pytest.mark.parametrize(("fmt", "expect"), [("new", "new"), ("compat", "old+new"), ("old", "old")])
def test_formats_written_by_ldconfig(libdir: Path, fmt: str, expect: str) -> None:
    if fmt not in _ldconfig_formats():
        pytest.skip(f"this ldconfig cannot write {fmt}")
    cache = read_ld_cache(str(_make_cache(libdir, fmt)))
    assert cache.fmt == expect
    assert cache.lookup("libalpha.so.1") == str(libdir / "lib" / "libalpha.so.1")
    assert cache.lookup("libnothere.so.9") is None
    assert all(e.flags == 0x0303 for e in cache.candidates("libalpha.so.1"))
    assert cache.lookup("libalpha.so.1", elf_class=32, machine=3) is None


@needs_cc
@needs_ldconfig
def test_new_format_hwcaps_extension(libdir: Path) -> None:
    cache = read_ld_cache(str(_make_cache(libdir, "new")))
    entries = cache.candidates("libbeta.so.2")
    assert {e.hwcaps_name for e in entries} == {"x86-64-v2", None}
    plain = str(libdir / "lib" / "libbeta.so.2")
    v2 = str(libdir / "lib" / "glibc-hwcaps" / "x86-64-v2" / "libbeta.so.2")
    assert cache.lookup("libbeta.so.2", hwcaps=("x86-64-v3", "x86-64-v2")) == v2
    assert cache.lookup("libbeta.so.2", hwcaps=()) == plain  # a CPU without v2 never gets the v2 entry
    assert cache.generator is None or "ldconfig" in cache.generator


@needs_cc
@needs_ldconfig
def test_old_and_new_agree(libdir: Path) -> None:
    formats = _ldconfig_formats()
    if "old" not in formats:
        pytest.skip("no old format")
    new = read_ld_cache(str(_make_cache(libdir, "new")))
    old = read_ld_cache(str(_make_cache(libdir, "old")))
    plain_new = {(e.soname, e.path) for e in new.entries if e.hwcaps_name is None}
    old_pairs = {(e.soname, e.path) for e in old.entries}
    # the old format has no hwcap word: ldconfig lists glibc-hwcaps copies as plain entries there
    assert plain_new <= old_pairs
    assert old_pairs <= {(e.soname, e.path) for e in new.entries}


def test_system_cache_parses() -> None:
    if not os.path.exists("/etc/ld.so.cache"):
        pytest.skip("no /etc/ld.so.cache")
    cache = read_ld_cache()
    assert cache.entries
    assert cache.lookup("libc.so.6") is not None


# ---------------------------------------------------------------- crafted bytes
def craft_new(entries: list[tuple[str, str, int, int]], hwcaps: list[str] = ()) -> bytes:  # type: ignore[assignment]
    """A new-format cache: entries (soname, path, flags, hwcap); hwcaps names for the extension."""
    strings = bytearray()
    offsets: dict[str, int] = {}
    header_len = 48 + 24 * len(entries)

    def s(x: str) -> int:
        if x not in offsets:
            offsets[x] = header_len + len(strings)
            strings.extend(x.encode() + b"\0")
        return offsets[x]

    body = b"".join(struct.pack("<iIIIQ", fl, s(so), s(p), 0, hw) for so, p, fl, hw in entries)
    hw_idx = [s(h) for h in hwcaps]
    data = bytearray(header_len + len(strings))
    data[48 : 48 + len(body)] = body
    data[header_len:] = strings
    ext = 0
    if hwcaps:
        while len(data) % 4:
            data.append(0)
        ext = len(data)
        arr_off = ext + 8 + 16
        data += struct.pack("<II", 0xEAA42174, 1) + struct.pack("<IIII", 1, 0, arr_off, 4 * len(hw_idx))
        data += b"".join(struct.pack("<I", i) for i in hw_idx)
    hdr = b"glibc-ld.so.cache" + b"1.1" + struct.pack("<II", len(entries), len(strings)) + bytes([2, 0, 0, 0])
    hdr += struct.pack("<IIII", ext, 0, 0, 0)
    data[:48] = hdr
    return bytes(data)


def _ext(i: int) -> int:
    return (1 << 62) | i


@pytest.mark.parametrize(
    ("entries", "hwcaps", "supported", "expect"),
    [
        pytest.param([("libx.so.1", "/i386/libx.so.1", 0x0003, 0)], [], (), None, id="i386 entry refused"),
        pytest.param(
            [("libx.so.1", "/i386/libx.so.1", 0x0003, 0), ("libx.so.1", "/x64/libx.so.1", 0x0303, 0)],
            [],
            (),
            "/x64/libx.so.1",
            id="search goes on past a foreign entry",
        ),
        pytest.param([("libx.so.1", "/x32/libx.so.1", 0x0803, 0)], [], (), None, id="x32 entry refused"),
        pytest.param(
            [
                ("libx.so.1", "/v4/libx.so.1", 0x0303, _ext(0)),
                ("libx.so.1", "/v3/libx.so.1", 0x0303, _ext(1)),
                ("libx.so.1", "/plain/libx.so.1", 0x0303, 0),
            ],
            ["x86-64-v4", "x86-64-v3"],
            ("x86-64-v3", "x86-64-v2"),
            "/v3/libx.so.1",
            id="best supported hwcaps level wins",
        ),
        pytest.param(
            [("libx.so.1", "/v4/libx.so.1", 0x0303, _ext(0)), ("libx.so.1", "/plain/libx.so.1", 0x0303, 0)],
            ["x86-64-v4"],
            ("x86-64-v2",),
            "/plain/libx.so.1",
            id="unsupported level never returned",
        ),
        pytest.param(
            [("libx.so.1", "/legacy/libx.so.1", 0x0303, 1 << 5), ("libx.so.1", "/p/libx.so.1", 0x0303, 0)],
            [],
            (),
            "/p/libx.so.1",
            id="legacy hwcap bits entry skipped",
        ),
    ],
)
def test_lookup_rules(
    entries: list[tuple[str, str, int, int]], hwcaps: list[str], supported: tuple[str, ...], expect: str | None
) -> None:
    cache = parse_ld_cache(craft_new(entries, hwcaps), "crafted")
    assert cache.lookup("libx.so.1", hwcaps=supported) == expect


def test_required_flags() -> None:
    assert required_flags(64, 62) == (0x0303,)
    assert required_flags(64, 183) == (0x0A03,)
    assert required_flags(32, 3) == (0x0001, 0x0003)


def test_aarch64_lookup_uses_its_flags() -> None:
    cache = parse_ld_cache(
        craft_new([("liby.so", "/a64/liby.so", 0x0A03, 0), ("liby.so", "/x64/liby.so", 0x0303, 0)]), "c"
    )
    assert cache.lookup("liby.so", 64, 183) == "/a64/liby.so"
    assert cache.lookup("liby.so") == "/x64/liby.so"


def test_old_format_crafted() -> None:
    strings = b"libo.so.1\0/old/libo.so.1\0"
    data = b"ld.so-1.7.0\0" + struct.pack("<I", 1) + struct.pack("<iII", 0x0303, 0, 10) + strings
    cache = parse_ld_cache(data, "old")
    assert cache.fmt == "old"
    assert cache.lookup("libo.so.1") == "/old/libo.so.1"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"garbage" * 20, id="bad magic"),
        pytest.param(b"glibc-ld.so.cache1.1" + b"\0" * 5, id="truncated header"),
        pytest.param(
            b"glibc-ld.so.cache1.1" + struct.pack("<II", 10**6, 0) + bytes([2, 0, 0, 0]) + b"\0" * 16,
            id="absurd count",
        ),
        pytest.param(
            b"glibc-ld.so.cache1.1"
            + struct.pack("<II", 1, 0)
            + bytes([2, 0, 0, 0])
            + b"\0" * 16
            + struct.pack("<iIIIQ", 0x303, 999999, 999999, 0, 0),
            id="string offset past end",
        ),
        pytest.param(b"ld.so-1.7.0\0" + struct.pack("<I", 1000), id="old truncated"),
        pytest.param(
            b"glibc-ld.so.cache1.1" + struct.pack("<II", 0, 0) + bytes([3, 0, 0, 0]) + b"\0" * 16, id="big endian"
        ),
    ],
)
def test_corrupt_caches_raise(data: bytes) -> None:
    with pytest.raises(LdCacheError):
        parse_ld_cache(data, "bad")


def test_read_errors_are_ldcacheerror(tmp_path: Path) -> None:
    with pytest.raises(LdCacheError, match="missing"):
        read_ld_cache(str(tmp_path / "missing"))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(LdCacheError, match="fifo"):
        read_ld_cache(str(tmp_path / "fifo"))  # never blocks
    with pytest.raises(LdCacheError):
        read_ld_cache(str(tmp_path))


def test_entries_are_plain_data() -> None:
    e = LdCacheEntry("a", "/a", 0x303, 0)
    assert LdCache("p", (e,), "new").candidates("a") == (e,)


# ---------------------------------------------------------------- ld.so.conf
def test_ld_so_conf_includes_globs(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "ld.so.conf.d").mkdir(parents=True)
    (etc / "ld.so.conf").write_text(
        "# comment\ninclude /etc/ld.so.conf.d/*.conf\n/opt/first  # trailing\nhwcap 0 nosegneg\n/opt/first\n"
        "include rel/*.conf\n"
    )
    (etc / "ld.so.conf.d" / "b.conf").write_text("/opt/b\n")
    (etc / "ld.so.conf.d" / "a.conf").write_text("/opt/a/\n\n")
    (etc / "ld.so.conf.d" / "skip.txt").write_text("/opt/never\n")
    (etc / "rel").mkdir()
    (etc / "rel" / "r.conf").write_text("/opt/rel\n")
    assert read_ld_so_conf("/etc/ld.so.conf", root=str(tmp_path)) == ("/opt/a", "/opt/b", "/opt/first", "/opt/rel")


def test_ld_so_conf_missing_and_include_loop(tmp_path: Path) -> None:
    assert read_ld_so_conf("/etc/ld.so.conf", root=str(tmp_path)) == ()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf\n/opt/x\n")
    assert read_ld_so_conf("/etc/ld.so.conf", root=str(tmp_path)) == ("/opt/x",)
