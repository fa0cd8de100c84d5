"""Re-checking an image whose top layer changed takes over the root last built on the same lower layers: its
top layer, journaled when it was applied, is undone, and the new top layer applied in its place. Wrong undo
would give silently wrong verdicts, so every taken-over root is compared with the root a cold build of the
same image makes: names, kinds, modes, link texts, bytes (placeholders read in place), and the facts (which
layer wrote each file, the entries skipped). The top layers are drawn from a pool of what layers do to the
layers below them: files replaced, whiteouts of files, links and directories, opaque directories, a directory
replaced by a file and the reverse, hard links to lower and to new files, writes and whiteouts through a
symbolic link to a directory, large files read in place. Also: a root that a reader holds is not taken, and a
journal that does not undo is dropped for a copy of the lower layers' root."""

from __future__ import annotations

import gc
import json
import os
import random
import stat
from pathlib import Path

import pytest

from pytest_cudastack.image.rootfs import open_image
from pytest_cudastack.image.store import ImageError
from tests.helpers.imagebuild import Entry, build_image, is_placeholder, read_root_file

BIG = 300 << 10  # a plain layer's file this large is a placeholder read in place

LOWER = [
    [
        Entry("usr", "dir"),
        Entry("usr/lib", "dir"),
        Entry("usr/lib/libx.so.1", data=b"\x7fELF libx"),
        Entry("usr/lib/libx.so", "symlink", target="libx.so.1"),
        Entry("lib", "symlink", target="usr/lib"),
        Entry("etc/ld.so.conf", data=b"/opt/a\n"),
        Entry("opt/a/f1", data=b"f1"),
        Entry("opt/a/sub/f2", data=b"f2"),
        Entry("opt/b/f3", data=b"f3"),
        Entry("opt/b/h3", "hardlink", target="opt/b/f3"),
        Entry("opt/alink", "symlink", target="/opt/a"),
        Entry("opt/big.bin", data=b"B" * BIG),
    ],
    [
        Entry("opt/a/f4", data=b"f4"),
        Entry("opt/b/f3", "whiteout"),
        Entry("opt/c", "symlink", target="a/sub"),
        Entry("dev/null0", "fifo"),
    ],
]

POOL: dict[str, list[Entry]] = {
    "new file in a new directory": [Entry("new/dir/file", data=b"new")],
    "a lower file replaced": [Entry("opt/a/f1", data=b"f1 again")],
    "a lower file whited out": [Entry("opt/a/sub/f2", "whiteout")],
    "a lower directory whited out": [Entry("opt/b", "whiteout")],
    "an opaque lower directory": [Entry("opt/a", "opaque"), Entry("opt/a/g", data=b"g")],
    "a directory replaced by a file": [Entry("opt/a/sub", data=b"was a directory")],
    "a file replaced by a directory": [Entry("usr/lib/libx.so.1", "dir"), Entry("usr/lib/libx.so.1/inner", data=b"i")],
    "a file replaced by a link": [Entry("etc/ld.so.conf", "symlink", target="/opt/a/f1")],
    "a hard link to a lower file": [Entry("opt/hl", "hardlink", target="opt/a/f4")],
    "a hard link to a new file": [Entry("n2/x", data=b"x"), Entry("n2/y", "hardlink", target="n2/x")],
    "a write through a linked directory": [Entry("lib/libnew.so.2", data=b"\x7fELF new")],
    "large files": [Entry("opt/big.bin", data=b"b" * BIG), Entry("opt/big2.bin", data=b"c" * (BIG + 1))],
    "a link whited out": [Entry("usr/lib/libx.so", "whiteout")],
    "an existing directory listed again": [Entry("usr/lib", "dir"), Entry("usr/lib/liby.so.1", data=b"y")],
    "a whiteout through a linked directory": [Entry("opt/c/f2", "whiteout")],
    "a link to a directory replaced by a directory": [Entry("opt/alink", "dir"), Entry("opt/alink/z", data=b"z")],
    "an opaque new directory": [Entry("fresh", "dir"), Entry("fresh", "opaque"), Entry("fresh/k", data=b"k")],
    "a file written twice": [Entry("twice", data=b"1"), Entry("twice", data=b"2")],
    "a new file whited out again": [Entry("gone/x", data=b"x"), Entry("gone/x", "whiteout")],
    "a device node": [Entry("dev/fifo1", "fifo")],
}


def _snapshot(root: str) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root``: kind, permission bits, link text or bytes (as the readers read them), and
    for a file the first path of the root that is the same inode (its hard links inside the root; links
    from other roots of the cache are not the image's)."""
    out: dict[str, tuple[object, ...]] = {}
    first: dict[int, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                data = read_root_file(full)
                same = first.setdefault(st.st_ino, rel)
                out[rel] = ("file", stat.S_IMODE(st.st_mode), same, is_placeholder(Path(full)), data)
    return out


def _opened(image: Path, cache: Path) -> tuple[object, ...]:
    """What opening the image gives, leaving no reference to it (its lease is released): the root's
    directory, its entries and facts, or the error's message."""
    try:
        got = open_image(str(image), cache_dir=str(cache))
    except ImageError as e:
        return ("error", str(e).replace(str(cache), "CACHE"))
    out = (os.path.dirname(got.root), _snapshot(got.root), dict(got.owner), got.skipped)
    del got
    gc.collect()
    return out


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> None:
    """``a`` and ``b`` are the same outcome (the roots' directories aside)."""
    assert a[0] != "error" or a == b
    assert a[1:] == b[1:]


def _draw(rng: random.Random) -> tuple[list[str], list[Entry]]:
    names = rng.sample(sorted(POOL), rng.randint(1, 5))
    return names, [e for name in names for e in POOL[name]]


@pytest.mark.parametrize("gzip_layers", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("seed", range(24))
def test_a_taken_over_root_is_the_root_a_cold_build_makes(tmp_path: Path, seed: int, gzip_layers: bool) -> None:
    rng = random.Random(seed)
    (names_a, top_a), (names_b, top_b) = _draw(rng), _draw(rng)
    while names_b == names_a:  # the same image: nothing to take over
        names_b, top_b = _draw(rng)
    a = build_image(tmp_path / "a", [*LOWER, top_a], gzip_layers=gzip_layers)
    b = build_image(tmp_path / "b", [*LOWER, top_b], gzip_layers=gzip_layers)
    cache = tmp_path / "cache"
    first = _opened(a, cache)
    taken = _opened(b, cache)  # takes over a's root
    _same(taken, _opened(b, tmp_path / "cold-b"))
    if first[0] != "error" and taken[0] != "error":
        assert not os.path.exists(str(first[0])), f"{names_a} then {names_b}: a's root was not taken over"
    again = _opened(a, cache)  # takes over b's root in turn
    _same(again, _opened(a, tmp_path / "cold-a"))
    _same(again, first)


def test_every_pool_entry_is_undone_alone(tmp_path: Path) -> None:
    """Each operation of the pool as a's top layer, then an image whose top layer writes one file: the
    taken-over root is the lower layers' root plus that file."""
    cache = tmp_path / "cache"
    b = build_image(tmp_path / "b", [*LOWER, [Entry("only", data=b"only")]], gzip_layers=False)
    cold = _opened(b, tmp_path / "cold")
    for i, name in enumerate(sorted(POOL)):
        a = build_image(tmp_path / f"a{i}", [*LOWER, POOL[name]], gzip_layers=False)
        first = _opened(a, cache)
        assert first[0] != "error", name
        taken = _opened(b, cache)
        assert not os.path.exists(str(first[0])), name
        _same(taken, cold)


def test_a_root_that_a_reader_holds_is_not_taken_over(tmp_path: Path) -> None:
    a = build_image(tmp_path / "a", [*LOWER, POOL["a lower file replaced"]])
    b = build_image(tmp_path / "b", [*LOWER, POOL["a lower directory whited out"]])
    cache = tmp_path / "cache"
    held = open_image(str(a), cache_dir=str(cache))
    before = _snapshot(held.root)
    taken = _opened(b, cache)
    assert os.path.isdir(held.root)
    assert _snapshot(held.root) == before
    _same(taken, _opened(b, tmp_path / "cold"))
    del held
    gc.collect()
    assert _opened(a, cache)[1] == before


@pytest.mark.parametrize("damage", ["journal removed", "journal not a list", "a stashed entry gone", "a record lies"])
def test_a_journal_that_does_not_undo_leaves_a_copy_of_the_lower_root(tmp_path: Path, damage: str) -> None:
    a = build_image(tmp_path / "a", [*LOWER, [*POOL["a lower file replaced"], *POOL["a lower directory whited out"]]])
    b = build_image(tmp_path / "b", [*LOWER, POOL["large files"]])
    cache = tmp_path / "cache"
    first = _opened(a, cache)
    directory = Path(str(first[0]))
    journal = directory / "journal.json"
    records = json.loads(journal.read_text())
    if damage == "journal removed":
        journal.unlink()
    elif damage == "journal not a list":
        journal.write_text('{"N": "opt"}')
    elif damage == "a stashed entry gone":
        stashed = next(r for r in records if r[0] == "S")
        os.rename(directory / "stash" / stashed[2], tmp_path / "elsewhere")
    else:
        journal.write_text(json.dumps([["N", "usr/lib"], *records]))  # usr/lib is not the layer's
    _same(_opened(b, cache), _opened(b, tmp_path / "cold"))
    assert not directory.exists()  # the damaged root was dropped, not kept as a's
    _same(_opened(a, cache), first)


def test_a_root_other_images_are_built_on_is_not_taken_over(tmp_path: Path) -> None:
    """p's root is the lower layers' root of q (q's top layer on p's layers); r shares only the first layer:
    the root r may take over (the heir of their common lower root) is p's, which q's build still needs."""
    p = build_image(tmp_path / "p", LOWER)
    q = build_image(tmp_path / "q", [*LOWER, POOL["a lower file replaced"]])
    r = build_image(tmp_path / "r", [LOWER[0], POOL["a hard link to a new file"]])
    cache = tmp_path / "cache"
    first = _opened(p, cache)
    _opened(q, cache)
    _same(_opened(r, cache), _opened(r, tmp_path / "cold-r"))
    assert os.path.isdir(str(first[0]))
    assert _opened(p, cache) == first  # still cached, at the same directory, unchanged


def test_no_cache_keeps_a_root_that_a_reader_holds(tmp_path: Path) -> None:
    a = build_image(tmp_path / "a", [*LOWER, POOL["large files"]])
    cache = tmp_path / "cache"
    held = open_image(str(a), cache_dir=str(cache))
    before = _snapshot(held.root)
    inode = os.stat(os.path.join(held.root, "opt/a/f1")).st_ino
    again = open_image(str(a), cache_dir=str(cache), no_cache=True)  # every digest checked again
    assert again.root == held.root
    assert os.stat(os.path.join(held.root, "opt/a/f1")).st_ino == inode  # not replaced under its reader
    assert _snapshot(held.root) == before


def test_a_cache_directory_reached_through_a_link_gives_the_real_root(tmp_path: Path) -> None:
    """Image paths are cut from the root's path, and the interpreter's real path must lie under it."""
    a = build_image(tmp_path / "a", LOWER)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    got = open_image(str(a), cache_dir=str(tmp_path / "link"))
    assert got.root.startswith(os.path.realpath(tmp_path / "real") + os.sep)


def test_a_root_is_held_from_the_moment_it_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a root's installation and its first reader's lease no other run may take it over: the run that
    built it leases it before it installs it (another run's takeover asks for the lock without waiting)."""
    from pytest_cudastack.image import rootfs

    held: list[bool] = []
    install = rootfs._install

    def installed(work: str, final: str, replace: bool = False) -> None:
        install(work, final, replace)
        held.append(rootfs._held(final))

    monkeypatch.setattr(rootfs, "_install", installed)
    _opened(build_image(tmp_path / "a", [*LOWER, POOL["a lower file replaced"]]), tmp_path / "cache")
    assert held == [False, True]  # the lower layers' root (never taken over while it has a heir), then a's
