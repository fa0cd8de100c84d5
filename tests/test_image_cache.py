"""An image's ELF facts are cached by what identifies its file (the inode a layer wrote, its size and the
time it was written): a root whose top layer changed reuses the lower layers' facts, and a file whose bytes
changed (the same path and size, another layer) is read again, never answered from the cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_cudastack.image.rootfs import open_image
from pytest_cudastack.linker.elfcache import ElfCache
from tests.helpers.elfbuild import build_lib
from tests.helpers.imagebuild import Entry, build_image

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """Two libraries of one size whose sonames differ (libfoo.so.1, libbar.so.1)."""
    foo = build_lib(tmp_path_factory.mktemp("lib") / "libfoo.so.1", soname="libfoo.so.1").read_bytes()
    bar = foo.replace(b"libfoo.so.1", b"libbar.so.1")
    assert len(bar) == len(foo)
    assert bar != foo
    return foo, bar


def _soname(image: Path, cache: Path) -> tuple[str | None, int]:
    root = open_image(str(image), cache_dir=str(cache))
    elf = ElfCache(directory=str(cache), enabled=True, root=root.root)
    soname = elf.read("/usr/lib/libfoo.so.1").soname
    elf.flush()
    return soname, elf.misses


BASE = [Entry("usr", "dir"), Entry("usr/lib", "dir"), Entry("etc/hostname", data=b"base")]


@needs_cc
@pytest.mark.parametrize("roots_removed", [False, True], ids=["roots-kept", "roots-removed"])
def test_a_changed_file_of_the_same_size_is_read_again(
    tmp_path: Path, libs: tuple[bytes, bytes], roots_removed: bool
) -> None:
    """The second image's top layer writes other bytes of the same size at the same path: its facts are
    its own, also after the cached roots were removed (their inodes free to be reused by the new root)."""
    foo, bar = libs
    v1 = build_image(tmp_path / "v1", [BASE, [Entry("usr/lib/libfoo.so.1", data=foo)]])
    v2 = build_image(tmp_path / "v2", [BASE, [Entry("usr/lib/libfoo.so.1", data=bar)]])
    cache = tmp_path / "cache"
    assert _soname(v1, cache) == ("libfoo.so.1", 1)
    assert _soname(v1, cache) == ("libfoo.so.1", 0)  # unchanged: from the cache
    if roots_removed:
        shutil.rmtree(cache / "images")
    assert _soname(v2, cache) == ("libbar.so.1", 1)


@needs_cc
def test_a_top_layer_change_reuses_the_lower_layers_facts(tmp_path: Path, libs: tuple[bytes, bytes]) -> None:
    """The library is the lower layer's: the second image's root holds the same inode (a hard link of the
    kept lower root), so its facts are not parsed again."""
    foo, _bar = libs
    lower = [*BASE, Entry("usr/lib/libfoo.so.1", data=foo)]
    v1 = build_image(tmp_path / "v1", [lower, [Entry("opt/app/VERSION", data=b"1")]])
    v2 = build_image(tmp_path / "v2", [lower, [Entry("opt/app/VERSION", data=b"2")]])
    cache = tmp_path / "cache"
    assert _soname(v1, cache) == ("libfoo.so.1", 1)
    assert _soname(v2, cache) == ("libfoo.so.1", 0)


@needs_cc
def test_a_top_layer_change_reuses_the_lower_layers_lookups_imports_and_hashes(
    tmp_path: Path, libs: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The facts other layers keep in the cache's extras about a file (its run-time lookups, a module's
    imports, its hash) are found under the second root too, named by its path there; a changed file is
    read again."""
    from pytest_cudastack.linker import lookups
    from pytest_cudastack.model import fingerprint, pysource

    foo, bar = libs
    lower = [*BASE, Entry("usr/lib/libfoo.so.1", data=foo), Entry("opt/app/mod.py", data=b"import json\n")]
    cache = tmp_path / "cache"
    reads: list[str] = []
    for name, func in (
        ("read_lookups", lookups.read_lookups),
        ("read_module_source", pysource.read_module_source),
    ):
        module = lookups if name == "read_lookups" else pysource
        monkeypatch.setattr(module, name, lambda p, *a, _f=func, **k: reads.append(p) or _f(p, *a, **k))
    digest = fingerprint._digest
    monkeypatch.setattr(fingerprint, "_digest", lambda p: reads.append(p) or digest(p))

    def facts(top: list[Entry], version: bytes) -> tuple[str, tuple[object, ...]]:
        image = build_image(tmp_path / version.decode(), [lower, [*top, Entry("opt/app/VERSION", data=version)]])
        root = open_image(str(image), cache_dir=str(cache)).root
        elf = ElfCache(directory=str(cache), enabled=True, root=root)
        lib, mod = f"{root}/usr/lib/libfoo.so.1", f"{root}/opt/app/mod.py"
        found = (
            lookups.cached_lookups(lib, elf).path == lib,
            pysource.module_imports(mod, "mod", False, elf),
            fingerprint.file_hash(lib, elf),
        )
        elf.flush()
        return root, found

    first_root, first = facts([], b"1")
    assert len(reads) == 3
    reads.clear()
    second_root, second = facts([], b"2")
    assert second_root != first_root
    assert second == first
    assert reads == []  # nothing read again: the same inodes under the new root
    third_root, third = facts([Entry("usr/lib/libfoo.so.1", data=bar)], b"3")
    assert reads == [f"{third_root}/usr/lib/libfoo.so.1"] * 2  # the changed library: its lookups and hash
    assert third[2] != first[2]
