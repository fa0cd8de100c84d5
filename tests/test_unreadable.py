"""A snapshot, cache or /proc file that cannot be read is an ``UnreadableFile``, not an ``ElfError``
(issue #18): ``_sysio``'s readers raise it, their callers turn it into their own terms, and the ELF readers
keep raising ``ElfError`` (an ``UnreadableFile`` too) for a file they cannot open. Messages are unchanged."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_cudastack._sysio import read_owned, read_regular
from pytest_cudastack.errors import DataError, ElfError, LdCacheError, UnreadableFile
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.ldcache import read_ld_cache
from pytest_cudastack.stack import load_snapshot


def _missing(tmp: Path) -> tuple[Path, str]:
    return tmp / "gone.json", "cannot open: No such file or directory"


def _directory(tmp: Path) -> tuple[Path, str]:
    (tmp / "d").mkdir()
    return tmp / "d", "is a directory"


def _fifo(tmp: Path) -> tuple[Path, str]:
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo", "not a regular file"


def _too_large(tmp: Path) -> tuple[Path, str]:
    (tmp / "big.json").write_bytes(b"x" * 65)
    return tmp / "big.json", "larger than 64 bytes"


BAD_FILES = [
    pytest.param(_missing, id="missing"),
    pytest.param(_directory, id="directory"),
    pytest.param(_fifo, id="FIFO (never waited on)"),
    pytest.param(_too_large, id="over the cap"),
]


@pytest.mark.parametrize("make", BAD_FILES)
def test_read_regular_raises_unreadable_file_not_elf_error(
    tmp_path: Path, make: Callable[[Path], tuple[Path, str]]
) -> None:
    path, why = make(tmp_path)
    with pytest.raises(UnreadableFile) as info:
        read_regular(str(path), 64)
    assert not isinstance(info.value, ElfError)
    assert str(info.value) == f"{path}: {why}"


def test_read_owned_refuses_a_writable_cache_with_unreadable_file(tmp_path: Path) -> None:
    cache = tmp_path / "cache.json"
    cache.write_text("{}")
    cache.chmod(0o666)
    with pytest.raises(UnreadableFile) as info:
        read_owned(str(cache), 1024)
    assert not isinstance(info.value, ElfError)
    assert str(info.value) == f"{cache}: writable by its group or others (mode 0666)"
    assert read_owned(str(tmp_path / "none.json"), 1024) is None  # a missing cache is no error


@pytest.mark.parametrize("make", BAD_FILES)
def test_unreadable_snapshot_is_a_data_error_from_unreadable_file(
    tmp_path: Path, make: Callable[[Path], tuple[Path, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_cudastack import stack

    monkeypatch.setattr(stack, "SNAPSHOT_LIMIT", 64)
    path, why = make(tmp_path)
    with pytest.raises(DataError) as info:
        load_snapshot(str(path))
    assert str(info.value) == f"{path}: cannot read cudastack snapshot: {why}"
    cause = info.value.__cause__
    assert isinstance(cause, UnreadableFile)
    assert not isinstance(cause, ElfError)


def test_unreadable_ld_cache_is_an_ld_cache_error_from_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "ld.so.cache"
    with pytest.raises(LdCacheError) as info:
        read_ld_cache(str(path))
    assert str(info.value) == f"{path}: cannot open: No such file or directory"
    assert isinstance(info.value.__cause__, UnreadableFile)
    assert not isinstance(info.value.__cause__, ElfError)


def test_elf_readers_still_raise_elf_error_for_a_file_they_cannot_open(tmp_path: Path) -> None:
    path = tmp_path / "libgone.so.1"
    with pytest.raises(ElfError, match="cannot open: No such file or directory") as info:
        read_elf(str(path))
    assert isinstance(info.value, UnreadableFile)  # one except clause covers both
