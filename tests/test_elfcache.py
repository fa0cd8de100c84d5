"""elfcache: keyed by (path, dev, inode, size, mtime_ns), atomic, never trusts a corrupt or foreign file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker import elf
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.elfcache import CACHE_FILE, ElfCache, default_cache_dir
from tests.helpers.elfbuild import Scenarios, get_scenarios, needs_cc

pytestmark = needs_cc


@pytest.fixture(scope="session")
def scen(tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    return get_scenarios(tmp_path_factory)


@pytest.fixture
def lib(scen: Scenarios, tmp_path: Path) -> Path:
    p = tmp_path / "libc1.so"
    shutil.copyfile(scen.rpath_inherit, p)
    return p


def _forbid_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(path: str) -> None:
        raise AssertionError(f"parsed {path} although cached")

    monkeypatch.setattr(elf, "read_elf", boom)  # elfcache imports it when it reads


def test_roundtrip_across_instances(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = ElfCache(str(tmp_path / "c"), enabled=True)
    info = c.read(str(lib))
    assert info == read_elf(lib)
    assert c.read(str(lib)) == info
    assert c.hits == 1
    assert c.misses == 1
    c.flush()
    raw = json.loads((tmp_path / "c" / CACHE_FILE).read_text())
    assert raw["schema"] == "pytest-cudastack-elfcache"
    assert raw["version"] == 1
    _forbid_parsing(monkeypatch)
    c2 = ElfCache(str(tmp_path / "c"), enabled=True)
    assert c2.read(str(lib)) == info
    assert c2.hits == 1


def test_changed_file_is_reparsed(lib: Path, scen: Scenarios, tmp_path: Path) -> None:
    c = ElfCache(str(tmp_path / "c"), enabled=True)
    assert c.read(str(lib)).needed[0] == "libmid.so.1"
    shutil.copyfile(scen.leaf, lib)  # other content, other size
    assert c.read(str(lib)).soname == "libleaf.so.1"
    st = lib.stat()
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same size, other mtime
    c.read(str(lib))
    assert c.misses == 3


def test_same_key_other_path_is_separate(lib: Path, tmp_path: Path) -> None:
    link = tmp_path / "liblink.so"
    link.symlink_to(lib)
    c = ElfCache(str(tmp_path / "c"), enabled=True)
    assert c.read(str(link)).path == str(link)
    assert c.read(str(lib)).path == str(lib)


def test_errors_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "libbad.so"
    bad.write_text("not elf")
    c = ElfCache(str(tmp_path / "c"), enabled=True)
    with pytest.raises(ElfError, match="not an ELF"):
        c.read(str(bad))
    c.flush()
    _forbid_parsing(monkeypatch)
    c2 = ElfCache(str(tmp_path / "c"), enabled=True)
    with pytest.raises(ElfError, match="not an ELF"):
        c2.read(str(bad))
    assert c2.hits == 1


def test_missing_file_raises_and_is_not_cached(tmp_path: Path) -> None:
    c = ElfCache(str(tmp_path / "c"), enabled=True)
    with pytest.raises(ElfError, match="cannot open"):
        c.read(str(tmp_path / "nope.so"))
    c.flush()
    assert not (tmp_path / "c" / CACHE_FILE).exists()


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"\x00\xffgarbage", id="not json"),
        pytest.param(b"[1, 2]", id="json list"),
        pytest.param(b'{"schema": "other", "version": 1, "entries": {}}', id="foreign schema"),
        pytest.param(b'{"schema": "pytest-cudastack-elfcache", "version": 99, "entries": {}}', id="future version"),
        pytest.param(b'{"schema": "pytest-cudastack-elfcache", "version": 1, "entries": []}', id="bad entries"),
    ],
)
def test_corrupt_or_foreign_cache_is_ignored_and_rebuilt(lib: Path, tmp_path: Path, content: bytes) -> None:
    d = tmp_path / "c"
    d.mkdir()
    (d / CACHE_FILE).write_bytes(content)
    c = ElfCache(str(d), enabled=True)
    assert c.read(str(lib)) == read_elf(lib)
    assert c.misses == 1
    c.flush()
    raw = json.loads((d / CACHE_FILE).read_text())
    assert raw["version"] == 1
    assert str(lib) in raw["entries"]


def test_poisoned_entry_is_not_trusted(lib: Path, tmp_path: Path) -> None:
    d = tmp_path / "c"
    c = ElfCache(str(d), enabled=True)
    c.read(str(lib))
    c.flush()
    raw = json.loads((d / CACHE_FILE).read_text())
    raw["entries"][str(lib)]["info"]["needed"] = 42  # wrong type
    (d / CACHE_FILE).write_text(json.dumps(raw))
    c2 = ElfCache(str(d), enabled=True)
    assert c2.read(str(lib)).needed[0] == "libmid.so.1"
    assert c2.misses == 1
    raw["entries"][str(lib)]["info"] = dict(read_elf(lib).to_json(), path="/elsewhere")
    (d / CACHE_FILE).write_text(json.dumps(raw))
    assert ElfCache(str(d), enabled=True).read(str(lib)).path == str(lib)


def test_disabled(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    c = ElfCache(str(tmp_path / "c"))
    assert not c.enabled
    assert c.read(str(lib)) == read_elf(lib)
    c.flush()
    assert not (tmp_path / "c").exists()


def test_atomic_write_leaves_no_temporaries(lib: Path, tmp_path: Path) -> None:
    c = ElfCache(str(tmp_path / "c"), enabled=True)
    c.read(str(lib))
    c.flush()
    c.flush()  # unchanged: no-op
    assert os.listdir(tmp_path / "c") == [CACHE_FILE]


def test_unwritable_directory_does_not_raise(lib: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    c = ElfCache(str(blocker / "sub"), enabled=True)
    c.read(str(lib))
    c.flush()  # logs, never raises


def test_default_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert default_cache_dir({"CUDASTACK_CACHE_DIR": "/x"}) == "/x"
    assert default_cache_dir({"XDG_CACHE_HOME": "/xdg"}) == "/xdg/pytest-cudastack"
    assert default_cache_dir({"XDG_CACHE_HOME": "relative"}).endswith(".cache/pytest-cudastack")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir({}) == str(tmp_path / ".cache" / "pytest-cudastack")


def _run_child(code: str, cache_dir: Path) -> str:
    """Run *code* in a fresh interpreter whose default cache directory is *cache_dir* (exit handlers run)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDASTACK_NO_CACHE"}
    env["CUDASTACK_CACHE_DIR"] = str(cache_dir)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout


def test_no_process_wide_cache(scen: Scenarios, tmp_path: Path) -> None:
    """A library caller's resolver and inventory read uncached: nothing is written behind its back (the
    process-wide cache flushed at exit overwrote the file a pytest session had just written)."""
    code = (
        "from pytest_cudastack.linker.resolver import Resolver, SearchConfig\n"
        "from pytest_cudastack.wheels.inventory import installed_wheels\n"
        f"Resolver(SearchConfig.from_environment({{}})).tree({str(scen.rpath_inherit)!r})\n"
        "installed_wheels()\n"
    )
    _run_child(code, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_driver_probe_writes_no_cache(tmp_path: Path) -> None:
    code = (
        "from pytest_cudastack.cuda.driver import driver_files\n"
        "print(any(n.startswith('libcuda.so.1: ') for n in driver_files().notes))\n"
    )
    assert _run_child(code, tmp_path / "c").strip() == "True"  # the linker search ran
    assert not (tmp_path / "c").exists()


def test_stack_probe_reads_through_the_stack_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's files are found by the stack's own linker search: its parses land in the stack's cache,
    which the stack's owner flushes once."""
    from pytest_cudastack.cuda import driver as drv
    from pytest_cudastack.settings import Settings
    from pytest_cudastack.stack import Stack

    monkeypatch.setattr(drv, "_nvml_facts_in_child", lambda: drv.DriverInfo("absent", None, None, reason="test"))
    drv.probe_nvml.cache_clear()
    try:
        stack = Stack(Settings(), cache=ElfCache(str(tmp_path / "c"), enabled=True), probe=lambda: None)
        assert any(n.startswith("libcuda.so.1: ") for n in stack.driver.notes)
    finally:
        drv.probe_nvml.cache_clear()
    assert not (tmp_path / "c").exists()  # written only by the flush
    stack.flush_cache()
    entries = json.loads((tmp_path / "c" / CACHE_FILE).read_text())["entries"]
    assert os.path.realpath(sys.executable) in entries  # the search starts from the interpreter's DT_NEEDED


def test_light_import() -> None:
    """`cudastack tree --json`'s warm path imports this module for its directory and atomic write: it must
    not pull in the ELF reader (dataclasses, struct, pyelftools) or logging."""
    code = "import sys, pytest_cudastack.linker.elfcache, pytest_cudastack.linker.treecache; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for heavy in ("'pytest_cudastack.linker.elf'", "'dataclasses'", "'logging'", "'elftools'"):
        assert heavy not in out
