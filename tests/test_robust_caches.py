"""Untrusted cache files (issue #14): malformed entries are misses, never coerced; files and directories
that are not this user's alone turn the cache off for the run with one warning; FIFOs and devices never
block; tree rows are printed as we encode them, never as the file holds them."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_cudastack.linker import elf
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.elfcache import CACHE_FILE, SYMBOL_CACHE_FILE, ElfCache
from pytest_cudastack.linker.treecache import CACHE_FILE as TREE_FILE
from pytest_cudastack.linker.treecache import TreeCache
from tests.helpers.elfbuild import build_lib, needs_cc, synth_elf
from tests.helpers.guarded import run_guarded

ROOT = os.geteuid() == 0


class Blocked(Exception):
    """Not an OSError: the code under test must not be able to swallow it."""


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: a blocking open of a FIFO is interrupted (PEP 475 does not retry a call
    whose signal handler raised)."""

    def expire(*_a: object) -> None:
        raise Blocked(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    return synth_elf(tmp_path / "libsynth.so.1", needed=("libc.so.6", "libm.so.6"))


def _warm(cache_dir: Path, lib: Path) -> dict:
    c = ElfCache(str(cache_dir), enabled=True)
    c.read(str(lib))
    c.flush()
    return json.loads((cache_dir / CACHE_FILE).read_text())


def _forbid_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(path: str) -> None:
        raise AssertionError(f"parsed {path} although cached")

    monkeypatch.setattr(elf, "read_elf", boom)


@pytest.mark.parametrize(
    ("field", "value"),
    [("needed", "libc.so.6"), ("needed", [7]), ("elf_class", "64"), ("nodeflib", 0), ("soname", ["x"])],
)
def test_wrong_typed_entry_is_a_miss_never_coerced(lib: Path, tmp_path: Path, field: str, value: object) -> None:
    raw = _warm(tmp_path / "c", lib)
    raw["entries"][str(lib)]["info"][field] = value
    (tmp_path / "c" / CACHE_FILE).write_text(json.dumps(raw))
    c = ElfCache(str(tmp_path / "c"), enabled=True)
    assert c.read(str(lib)) == read_elf(lib)
    assert c.read(str(lib)).needed == ("libc.so.6", "libm.so.6")
    assert c.misses == 1


def test_a_valid_entry_is_still_a_hit(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _warm(tmp_path / "c", lib)
    _forbid_parsing(monkeypatch)
    c = ElfCache(str(tmp_path / "c"), enabled=True)
    assert c.read(str(lib)).needed == ("libc.so.6", "libm.so.6")
    assert c.hits == 1


@pytest.mark.parametrize("error", ["\x1b[2Jforged", "other.so: not an ELF file", "x" * 5000, 5])
def test_forged_cached_error_is_a_miss(lib: Path, tmp_path: Path, error: object) -> None:
    raw = _warm(tmp_path / "c", lib)
    entry = raw["entries"][str(lib)]
    entry.pop("info")
    entry["error"] = error if not isinstance(error, str) or error.startswith("other") else f"{lib}: {error}"
    (tmp_path / "c" / CACHE_FILE).write_text(json.dumps(raw))
    assert ElfCache(str(tmp_path / "c"), enabled=True).read(str(lib)) == read_elf(lib)


def _refused(caplog: pytest.LogCaptureFixture, cache_dir: Path, lib: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    calls: list[str] = []
    real = elf.read_elf

    def counting(path: str) -> elf.ElfInfo:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(elf, "read_elf", counting)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pytest_cudastack.linker.elfcache"), deadline(10):
        c = ElfCache(str(cache_dir), enabled=True)
        assert c.read(str(lib)).needed == ("libc.so.6", "libm.so.6")
        assert c.read(str(lib)).needed == ("libc.so.6", "libm.so.6")
        c.flush()
    assert not c.enabled
    assert len(calls) == 2  # parsed each time: nothing from the file, nothing remembered
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("cache disabled for this run: ")
    return warnings[0]


def test_group_writable_cache_file_is_refused(
    lib: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _warm(tmp_path / "c", lib)
    os.chmod(tmp_path / "c" / CACHE_FILE, 0o664)
    assert "writable by its group or others (mode 0664)" in _refused(caplog, tmp_path / "c", lib, monkeypatch)


def test_world_writable_cache_dir_is_refused(
    lib: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _warm(tmp_path / "c", lib)
    os.chmod(tmp_path / "c", 0o1777)
    msg = _refused(caplog, tmp_path / "c", lib, monkeypatch)
    assert f"{tmp_path / 'c'}: writable by its group or others" in msg


@pytest.mark.skipif(not ROOT, reason="chown to another user needs root")
@pytest.mark.parametrize("what", ["file", "dir"])
def test_cache_owned_by_another_user_is_refused(
    lib: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    _warm(tmp_path / "c", lib)
    os.chown(tmp_path / "c" / CACHE_FILE if what == "file" else tmp_path / "c", 12345, -1)
    assert "owned by uid 12345" in _refused(caplog, tmp_path / "c", lib, monkeypatch)


def test_new_cache_dir_is_private(lib: Path, tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        _warm(tmp_path / "new" / "c", lib)
    finally:
        os.umask(old)
    assert (tmp_path / "new" / "c").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "new" / "c" / CACHE_FILE).stat().st_mode & 0o077 == 0


def test_fifo_as_elf_cache_never_blocks(
    lib: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "c").mkdir(mode=0o700)
    os.mkfifo(tmp_path / "c" / CACHE_FILE, 0o600)
    assert "not a regular file" in _refused(caplog, tmp_path / "c", lib, monkeypatch)


def caches_in_child(spec: str) -> None:
    """``CACHE_DIR:LIB``: read LIB through both caches of CACHE_DIR (run in a memory-limited child:
    /dev/zero read whole would take every byte of the machine)."""
    cache_dir, _, lib = spec.partition(":")
    c = ElfCache(cache_dir, enabled=True)
    assert c.read(lib).needed == ("libc.so.6", "libm.so.6")
    c.flush()
    t = TreeCache(cache_dir, "env")
    assert t.lookup([lib]) == {}
    assert t.flush() is None


@pytest.mark.parametrize("which", [CACHE_FILE, TREE_FILE])
def test_dev_zero_as_a_cache_is_refused(lib: Path, tmp_path: Path, which: str) -> None:
    (tmp_path / "c").mkdir(mode=0o700)
    os.symlink("/dev/zero", tmp_path / "c" / which)
    out = run_guarded(
        "tests.test_robust_caches", "caches_in_child", f"{tmp_path / 'c'}:{lib}", timeout=30, memory=1 << 30
    )
    assert out.startswith("OK"), out


# ------------------------------------------------------------------------------------------- tree cache
def _stored_tree(tmp_path: Path, lib: Path, row: str) -> Path:
    d = tmp_path / "t"
    d.mkdir(mode=0o700, exist_ok=True)
    t = TreeCache(str(d), "env")
    assert t.store(str(lib), row, False, [], {"s" + str(lib)}, None, time.time_ns() + 100 * 10**9)
    assert t.flush() is None
    return d / TREE_FILE


def _row(lib: Path, **extra: object) -> str:
    return json.dumps(
        {"path": str(lib), "libraries": [{"soname": "libc.so.6", "path": "/lib/libc.so.6", "needed_by": [str(lib)]}]}
    ).replace('"needed_by": ["' + str(lib) + '"]', '"needed_by": ["' + str(lib) + '"], "provider": null')


def _forge(file: Path, root: str, row: str) -> None:
    """Make the file hold *row* for *root*, under a CRC anyone can recompute."""
    body = file.read_bytes().partition(b"\n")[2]
    header = json.loads(body.partition(b"\n")[0])
    header["buckets"]["env"]["roots"][root]["row"] = [0, len(row)]
    new = json.dumps(header).encode() + b"\n" + row.encode()
    file.write_bytes(b"%08x\n" % zlib.crc32(new) + new)


def test_tree_row_is_reencoded_and_a_forged_one_is_a_miss(lib: Path, tmp_path: Path) -> None:
    good = _row(lib)
    f = _stored_tree(tmp_path, lib, good)
    hit = TreeCache(str(f.parent), "env").lookup([str(lib)])
    assert hit[str(lib)]["row"] == good
    for forged in [
        good[:-2] + ', "injected": {"x": 1}]}',  # an object added to the libraries
        good[:-2] + '], "extra": 1}',  # a key added to the row
        good.replace('"provider": null', '"provider": 5'),
        good.replace('"provider": null', '"provider": null, "soname2": 1'),
        good.replace('"needed_by": [', '"needed_by": [1, '),
        good.replace('"provider": null', '"provider": null, "gpu_code": {"sass": [1], "ptx": []}'),
        good.replace('"provider": null', '"provider": null, "gpu_code": {"ptx": [], "sass": []}'),
        good + "\n$(rm -rf ~)",  # not one JSON value
        good.replace('"libraries": [', '"libraries": [' * 5000).replace("]}", "]" * 5000 + "}"),  # deep
    ]:
        _forge(f, str(lib), forged)
        assert TreeCache(str(f.parent), "env").lookup([str(lib)]) == {}, forged[:200]
    with_gpu = good.replace('"provider": null', '"provider": null, "gpu_code": {"sass": ["sm_80"], "ptx": []}')
    _forge(f, str(lib), with_gpu)  # `tree --gpu-code`'s row shape
    assert TreeCache(str(f.parent), "env").lookup([str(lib)])[str(lib)]["row"] == with_gpu
    # a valid value in other bytes: printed as we encode it, not as the file holds it
    _forge(f, str(lib), good.replace('"soname": ', '"soname":    '))
    (entry,) = TreeCache(str(f.parent), "env").lookup([str(lib)]).values()
    assert entry["row"] == good


@pytest.mark.parametrize("kind", ["fifo", "mode"])
def test_tree_cache_fifo_device_or_writable_is_refused(lib: Path, tmp_path: Path, kind: str) -> None:
    d = tmp_path / "t"
    d.mkdir(mode=0o700)
    if kind == "fifo":
        os.mkfifo(d / TREE_FILE, 0o600)
    else:
        _stored_tree(tmp_path, lib, _row(lib))
        os.chmod(d / TREE_FILE, 0o666)
    with deadline(10):
        t = TreeCache(str(d), "env")
    assert not t.enabled
    assert t.refused is not None
    assert t.lookup([str(lib)]) == {}
    assert not t.store(str(lib), _row(lib), False, [], {"s" + str(lib)}, None, time.time_ns() + 10**11)


@pytest.mark.parametrize("kind", ["dir-mode", "tree-fifo"])
def test_tree_command_warns_once_and_answers(
    lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    from pytest_cudastack.cli import main

    d = tmp_path / "shared"
    d.mkdir()
    if kind == "dir-mode":
        os.chmod(d, 0o777)
    else:
        d.chmod(0o700)
        os.mkfifo(d / TREE_FILE, 0o600)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(d))
    monkeypatch.delenv("CUDASTACK_NO_CACHE", raising=False)
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING), deadline(60):
            main(["tree", "--json", str(lib)])
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len([w for w in warnings if "cache disabled for this run" in w]) == 1, warnings
    assert not (d / CACHE_FILE).exists()


@pytest.fixture
def symlib(tmp_path: Path) -> Path:
    return build_lib(tmp_path / "libsym.so.1", soname="libsym.so.1")


@needs_cc
def test_fifo_as_symbol_cache_never_blocks(symlib: Path, tmp_path: Path) -> None:
    # the symbol facts live in a file of their own; it is opened as the ELF cache is (never blocking)
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    os.mkfifo(d / SYMBOL_CACHE_FILE, 0o600)
    with deadline(10):
        c = ElfCache(str(d), enabled=True)
        facts = c.read_symbols(str(symlib))
    assert facts.path == str(symlib)
    assert not c.enabled  # refused for the run, with one warning


@needs_cc
def test_symbol_cache_entry_of_the_wrong_shape_is_a_miss(symlib: Path, tmp_path: Path) -> None:
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    c = ElfCache(str(d), enabled=True)
    first = c.read_symbols(str(symlib))
    c.flush()
    raw = json.loads((d / SYMBOL_CACHE_FILE).read_text())
    raw["entries"][str(symlib)]["symbols"] = "not facts"
    (d / SYMBOL_CACHE_FILE).write_text(json.dumps(raw))
    again = ElfCache(str(d), enabled=True)
    assert again.read_symbols(str(symlib)) == first
    assert (again.hits, again.misses) == (0, 1)


# ------------------------------------------------------------------------- tree cache, round 3 (#23)
def test_warm_tree_json_under_another_site_reuses_the_closure(
    lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a cached closure found under other site directories is re-filled with providers and stored again:
    # its dependencies are the stored *keys*, not the bucket's indexes into them
    from pytest_cudastack.cli import main
    from pytest_cudastack.linker import treecache

    d = tmp_path / "cache"
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(d))
    monkeypatch.delenv("CUDASTACK_NO_CACHE", raising=False)
    monkeypatch.setattr(treecache, "RACY_NS", 0)  # rows of files made just now are stored
    sites = []
    for name in ("site-a", "site-b"):
        (tmp_path / name).mkdir()
        sites.append(str(tmp_path / name))
    outs = []
    for site in (sites[0], sites[1], sites[1], sites[0]):
        main(["tree", "--json", "--site", site, str(lib)])
        outs.append(json.loads(capsys.readouterr().out))
    assert all(o == outs[0] for o in outs)
    assert [x["soname"] for x in outs[0]["trees"][0]["libraries"]][:2] == ["libc.so.6", "libm.so.6"]
    stored = json.loads((d / TREE_FILE).read_bytes().split(b"\n")[1])
    (bucket,) = stored["buckets"].values()
    assert all(isinstance(k, str) for k in bucket["keys"])


def test_malformed_row_with_a_valid_checksum_never_breaks_pruning(lib: Path, tmp_path: Path) -> None:
    # another run (or an editor) wrote a row whose dependencies are lists; storing a changed dependency
    # prunes the rows that read it, and that must skip, not crash on, the malformed one
    f = _stored_tree(tmp_path, lib, _row(lib))
    body = f.read_bytes().partition(b"\n")[2]
    header, _, blob = body.partition(b"\n")
    raw = json.loads(header)
    bucket = raw["buckets"]["env"]
    good = bucket["roots"][str(lib)]
    for i, deps in enumerate([[[0]], [{"a": 1}], [0, [1]], "ab", 7, None, [0.5], [True]]):
        bucket["roots"][f"/forged/{i}"] = {**good, "deps": deps}
    new = json.dumps(raw).encode() + b"\n" + blob
    f.write_bytes(b"%08x\n" % zlib.crc32(new) + new)
    t = TreeCache(str(f.parent), "env")
    assert list(t.lookup([str(lib)] + [f"/forged/{i}" for i in range(8)])) == [str(lib)]
    os.utime(lib, ns=(1, 1))  # the dependency changed: the rows that read it are stale
    t = TreeCache(str(f.parent), "env")
    assert t.store(str(lib), _row(lib), False, [], {"s" + str(lib)}, None, time.time_ns() + 100 * 10**9)
    assert t.flush() is None
    again = TreeCache(str(f.parent), "env")
    assert list(again.lookup([str(lib)] + [f"/forged/{i}" for i in range(8)])) == [str(lib)]
