"""The image reader: the four formats, layers applied with whiteouts and links kept inside the root, digests
checked, hostile and broken archives refused with a clear ImageError (never written outside the cache)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from pytest_cudastack.image.layers import RootWriter
from pytest_cudastack.image.manifest import Layer
from pytest_cudastack.image.rootfs import open_image
from pytest_cudastack.image.store import BlobStore, ImageError
from tests.helpers.imagebuild import FORMATS, Entry, blob_files, build_image, walk

BASE = [
    Entry("usr", "dir"),
    Entry("usr/lib", "dir"),
    Entry("usr/lib/libkeep.so.1", data=b"keep"),
    Entry("usr/lib/libgone.so.1", data=b"gone"),
    Entry("lib", "symlink", target="usr/lib"),
    Entry("opt/app/old.txt", data=b"old"),
    Entry("etc/hostname", data=b"base"),
]
TOP = [
    Entry("usr/lib", "whiteout"),  # deleted, then re-created below: lower files gone
    Entry("usr/lib/libkeep.so.1", data=b"keep2"),
    Entry("opt/app", "opaque"),
    Entry("opt/app/new.txt", data=b"new"),
    Entry("etc/hosts", "hardlink", target="etc/hostname"),
    Entry("etc/abs", "symlink", target="/usr/lib/libkeep.so.1"),
    Entry("etc/climb", "symlink", target="../../../../usr/lib"),
    Entry("dev/fifo", "fifo"),
]


def _open(path: Path, cache: Path, **kw):  # type: ignore[no-untyped-def]
    return open_image(str(path), cache_dir=str(cache), **kw)


@pytest.mark.parametrize("fmt", FORMATS)
def test_four_formats_give_one_tree(tmp_path: Path, fmt: str) -> None:
    out = tmp_path / ("img" if fmt == "oci-layout" else "img.tar")
    build_image(out, [BASE, TOP], fmt, env=["PATH=/opt/app:/usr/bin", "CUDA_VERSION=12.9.1"])
    image = _open(out, tmp_path / "cache")
    tree = walk(image.root)
    assert tree["usr/lib/libkeep.so.1"] == "keep2"
    assert "usr/lib/libgone.so.1" not in tree
    assert "opt/app/old.txt" not in tree
    assert tree["opt/app/new.txt"] == "new"
    assert tree["lib"] == "-> usr/lib"
    assert tree["etc/hosts"] == "base"
    assert (
        os.stat(os.path.join(image.root, "etc/hosts")).st_ino
        == os.stat(os.path.join(image.root, "etc/hostname")).st_ino
    )
    # an absolute link, and a relative one climbing past the root, stay inside the root
    assert tree["etc/abs"] == "-> ../usr/lib/libkeep.so.1"
    assert tree["etc/climb"] == "-> ../usr/lib"
    assert "dev/fifo" not in tree
    assert image.skipped == 1
    assert image.env["CUDA_VERSION"] == "12.9.1"
    assert image.env["PATH"] == "/opt/app:/usr/bin"
    assert image.reference == "example.com/app:1"
    origin = image.origin("/usr/lib/libkeep.so.1")
    assert origin is not None
    assert origin.created_by == "RUN step 1"
    assert origin.layer == image.layers[1].name
    assert image.origin("/etc/hostname").created_by == "RUN step 0"  # type: ignore[union-attr]


def test_second_open_reuses_the_cached_root(tmp_path: Path) -> None:
    out = build_image(tmp_path / "img", [BASE, TOP])
    root = _open(out, tmp_path / "cache").root  # no reader holds it after this (see test_image_takeover.py)
    marker = Path(root) / "marker"
    marker.write_text("x")
    assert _open(out, tmp_path / "cache").root == root
    assert marker.exists()
    rebuilt = _open(out, tmp_path / "cache", no_cache=True)
    assert rebuilt.root == root
    assert not marker.exists()
    # the image's root and its lower layers' root (kept for an image whose top layer changes)
    assert len(os.listdir(tmp_path / "cache" / "images")) == 2
    assert os.path.basename(os.path.dirname(root)) in os.listdir(tmp_path / "cache" / "images")


def test_a_changed_top_layer_is_the_only_layer_read_again(tmp_path: Path) -> None:
    first = build_image(tmp_path / "v1", [BASE, TOP])
    _open(first, tmp_path / "cache")
    second = build_image(tmp_path / "v2", [BASE, [*TOP, Entry("opt/app/v2", data=b"2")]])
    base_blob = json.loads((second / "index.json").read_text())  # corrupt the unchanged lower layer's blob:
    manifest = json.loads((second / "blobs" / "sha256" / base_blob["manifests"][0]["digest"][7:]).read_bytes())
    (second / "blobs" / "sha256" / manifest["layers"][0]["digest"][7:]).write_bytes(b"not read again")
    image = _open(second, tmp_path / "cache")
    tree = walk(image.root)
    assert tree["opt/app/v2"] == "2"
    assert tree["usr/lib/libkeep.so.1"] == "keep2"
    assert "usr/lib/libgone.so.1" not in tree
    assert image.origin("/etc/hostname").created_by == "RUN step 0"  # type: ignore[union-attr]
    with pytest.raises(ImageError, match=r"digest mismatch|truncated or corrupt"):  # read when not cached
        _open(second, tmp_path / "other-cache")


def test_rootfs_directory_is_mirrored_with_links_kept_inside(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "lib").mkdir(parents=True)
    (rootfs / "usr" / "lib" / "libx.so.1.2").write_bytes(b"x")
    (rootfs / "usr" / "lib" / "libx.so.1").symlink_to("/usr/lib/libx.so.1.2")  # absolute: the host's path
    (rootfs / "lib").symlink_to("usr/lib")
    (rootfs / "up").symlink_to("../../../../etc")
    image = _open(rootfs, tmp_path / "cache")
    assert image.kind == "rootfs"
    assert image.reference == str(rootfs)
    assert image.layers == ()
    tree = walk(image.root)
    assert tree["usr/lib/libx.so.1"] == "-> libx.so.1.2"
    assert tree["lib"] == "-> usr/lib"
    assert tree["up"] == "-> etc"
    assert os.path.realpath(os.path.join(image.root, "lib/libx.so.1")) == os.path.join(
        image.root, "usr/lib/libx.so.1.2"
    )
    assert _open(rootfs, tmp_path / "cache").root == image.root  # unchanged: reused
    (rootfs / "usr" / "lib" / "liby.so.1").write_bytes(b"y")
    changed = _open(rootfs, tmp_path / "cache")
    assert changed.root != image.root
    assert walk(changed.root)["usr/lib/liby.so.1"] == "y"


def test_multi_platform_index_picks_amd64_or_the_platform_asked(tmp_path: Path) -> None:
    out = build_image(tmp_path / "img", [BASE], extra_platforms=["linux/arm64"])
    assert os.path.exists(os.path.join(_open(out, tmp_path / "c").root, "usr/lib/libgone.so.1"))
    arm = _open(out, tmp_path / "c", platform="linux/arm64")
    assert not os.path.exists(os.path.join(arm.root, "usr/lib"))
    with pytest.raises(
        ImageError, match=r"no image for platform linux/s390x \(the index has: linux/arm64, linux/amd64\)"
    ):
        _open(out, tmp_path / "c", platform="linux/s390x")


def test_symlinked_parent_is_followed_inside_the_root(tmp_path: Path) -> None:
    # a layer writing through /lib (-> /usr/lib) and through an absolute link to / lands inside the root
    top = [
        Entry("lib/libx.so.1", data=b"x"),
        Entry("escape", "symlink", target="/"),
        Entry("escape/etc/passwd-like", data=b"inside"),
        Entry("up", "symlink", target="../../.."),
        Entry("up/tmp/evil", data=b"inside"),
    ]
    out = build_image(tmp_path / "img", [BASE, top])
    image = _open(out, tmp_path / "cache")
    tree = walk(image.root)
    assert tree["usr/lib/libx.so.1"] == "x"
    assert tree["etc/passwd-like"] == "inside"
    assert tree["tmp/evil"] == "inside"
    assert tree["escape"] == "-> ."
    assert tree["up"] == "-> ."
    assert not (tmp_path / "tmp").exists()


def _corrupt(tmp_path: Path, layers: list[list[Entry]]) -> Path:
    return build_image(tmp_path / "img", layers)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        pytest.param([Entry("../evil", data=b"x")], r"entry '\.\./evil' escapes the image root", id="dotdot"),
        pytest.param([Entry("a/../../evil", data=b"x")], r"escapes the image root", id="inner-dotdot"),
        pytest.param([Entry("h", "hardlink", target="../etc/passwd")], r"escapes the image root", id="hardlink-out"),
        pytest.param([Entry("h", "hardlink", target="nothere")], r"which is no file", id="hardlink-missing"),
        pytest.param(
            [Entry("f", data=b"x"), Entry("f/g", data=b"y")], r"f/g: f is not a directory", id="file-as-parent"
        ),
    ],
)
@pytest.mark.parametrize("gz", [True, False], ids=["streamed", "in-place"])
def test_hostile_entries_refuse_the_image(tmp_path: Path, entries: list[Entry], message: str, gz: bool) -> None:
    out = build_image(tmp_path / "img", [entries], gzip_layers=gz)
    with pytest.raises(ImageError, match=message):
        _open(out, tmp_path / "cache")
    assert not (tmp_path / "evil").exists()
    assert os.listdir(tmp_path / "cache" / "images") == []  # the half-built root is removed


def test_symlink_loop_is_an_error_not_a_hang(tmp_path: Path) -> None:
    layers = [[Entry("a", "symlink", target="b"), Entry("b", "symlink", target="a"), Entry("a/x", data=b"")]]
    with pytest.raises(ImageError, match="too many levels of symbolic links"):
        _open(build_image(tmp_path / "img", layers), tmp_path / "cache")


def _blob_of_layer(image_dir: Path) -> Path:
    return max(blob_files(image_dir), key=lambda p: p.stat().st_size)


def test_truncated_gzip_layer(tmp_path: Path) -> None:
    out = build_image(tmp_path / "img", [[Entry("big", data=os.urandom(200_000))]])
    blob = _blob_of_layer(out)
    blob.write_bytes(blob.read_bytes()[:5000])
    with pytest.raises(ImageError, match=r"layer sha256:[0-9a-f]{64}: truncated or corrupt layer"):
        _open(out, tmp_path / "cache")


def test_digest_mismatch_of_a_layer(tmp_path: Path) -> None:
    out = build_image(tmp_path / "img", [[Entry("f", data=b"one")]], gzip_layers=False)
    blob = _blob_of_layer(out)
    data = blob.read_bytes()
    blob.write_bytes(data.replace(b"one", b"two"))
    with pytest.raises(ImageError, match="digest mismatch"):
        _open(out, tmp_path / "cache")


def test_diff_id_mismatch_of_a_legacy_layer(tmp_path: Path) -> None:
    out = build_image(tmp_path / "img.tar", [[Entry("f", data=b"one")]], "docker-legacy")
    with tarfile.open(out) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf}  # type: ignore[union-attr]
    name = next(n for n in members if n.endswith("layer.tar"))
    members[name] = members[name].replace(b"one", b"two")
    with tarfile.open(out, "w") as tf:
        for n, d in members.items():
            info = tarfile.TarInfo(n)
            info.size = len(d)
            tf.addfile(info, io.BytesIO(d))
    with pytest.raises(ImageError, match="the config's diff_id is sha256:"):
        _open(out, tmp_path / "cache")


def test_manifest_digest_mismatch(tmp_path: Path) -> None:
    out = build_image(tmp_path / "img", [[Entry("f", data=b"one")]])
    index = json.loads((out / "index.json").read_text())
    manifest = out / "blobs" / "sha256" / index["manifests"][0]["digest"].split(":")[1]
    manifest.write_bytes(manifest.read_bytes().replace(b'"schemaVersion": 2', b'"schemaVersion":  2'))
    with pytest.raises(ImageError, match=r"manifest sha256:[0-9a-f]+: digest mismatch"):
        _open(out, tmp_path / "cache")


def test_zstd_layer_without_zstd_names_the_layer(tmp_path: Path) -> None:
    out = build_image(tmp_path / "img", [[Entry("f", data=b"one")]], gzip_layers=False)
    blob = _blob_of_layer(out)
    blob.write_bytes(b"\x28\xb5\x2f\xfd" + blob.read_bytes())
    try:
        import compression.zstd  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        with pytest.raises(ImageError, match=r"layer sha256:[0-9a-f]{64} is zstd-compressed and this Python"):
            _open(out, tmp_path / "cache")
    else:  # pragma: no cover - Python >= 3.14
        with pytest.raises(ImageError):
            _open(out, tmp_path / "cache")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        pytest.param(lambda p: p.write_bytes(b"not a tar at all" * 100), "not a tar archive", id="not-tar"),
        pytest.param(lambda p: p.write_bytes(gzip.compress(b"x" * 1000)[:20]), "not a tar archive", id="bad-gzip"),
        pytest.param(lambda p: p.mkdir(), "not an image", id="empty-dir-is-rootfs"),
    ],
)
def test_not_an_image(tmp_path: Path, setup, message: str) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "thing"
    setup(target)
    if target.is_dir():  # a directory without image files is a root file system
        assert _open(target, tmp_path / "c").kind == "rootfs"
        return
    with pytest.raises(ImageError, match=message):
        _open(target, tmp_path / "c")


def test_truncated_archive(tmp_path: Path) -> None:
    out = build_image(tmp_path / "img.tar", [[Entry("big", data=os.urandom(100_000))]], "oci-archive")
    data = out.read_bytes()
    out.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError):
        _open(out, tmp_path / "cache")


def test_concurrent_opens_share_one_root(tmp_path: Path) -> None:
    """xdist workers opening one image at once: each gets a usable root, the first one installed is kept."""
    from concurrent.futures import ThreadPoolExecutor

    out = build_image(tmp_path / "img", [BASE, TOP])
    with ThreadPoolExecutor(4) as pool:
        roots = list(pool.map(lambda _: _open(out, tmp_path / "cache").root, range(4)))
    assert len(set(roots)) == 1
    assert walk(roots[0])["usr/lib/libkeep.so.1"] == "keep2"
    assert not [n for n in os.listdir(tmp_path / "cache" / "images") if n.startswith(".build-")]


@pytest.mark.parametrize("fmt", ["oci-layout", "docker-legacy"])
def test_plain_layers_are_read_in_place_and_give_the_gzip_tree(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain layer in a directory's blob or an uncompressed archive's member is read where it lies (headers
    in place, file data copied by the kernel), never streamed: the same tree as its gzip twin's."""
    layers = [BASE, TOP, [Entry("opt/big", data=os.urandom(300_000))]]
    gz = walk(_open(build_image(tmp_path / "gz", layers), tmp_path / "c1").root)
    suffix = ".tar" if fmt != "oci-layout" else ""
    plain = build_image(tmp_path / f"plain{suffix}", layers, fmt, gzip_layers=False)

    def no_stream(*_a: object, **_k: object) -> None:
        raise AssertionError("a plain layer was streamed")

    monkeypatch.setattr("pytest_cudastack.image.layers._decompressor", no_stream)
    assert walk(_open(plain, tmp_path / "c2").root) == gz


def test_truncated_plain_layer_whose_digest_matches(tmp_path: Path) -> None:
    """A plain layer whose tar ends inside a file's data, its digest and diff_id those of the truncated
    bytes (so every digest check passes), is an error naming the layer, not a short file."""
    from tests.helpers.imagebuild import layer_tar

    cut = layer_tar([Entry("big", data=os.urandom(100_000))])[:20_000]
    digest = "sha256:" + hashlib.sha256(cut).hexdigest()
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "blob").write_bytes(cut)
    (tmp_path / "root").mkdir()
    with pytest.raises(ImageError, match=f"layer {digest}: truncated or corrupt layer"):
        RootWriter(str(tmp_path / "root")).apply(
            BlobStore(str(tmp_path / "store"), None), Layer("blob", digest, digest, len(cut)), 0
        )


REPLACED = [
    Entry("a", data=b"first"),
    Entry("a", data=b"second"),  # the same path twice: the later entry wins
    Entry("b", data=b"file"),
    Entry("b", "symlink", target="a"),  # a file replaced by a link
    Entry("c", data=b"c"),
    Entry("d", "hardlink", target="c"),  # a link to a file written just before
    Entry("e", "dir"),
    Entry("e/x", data=b"x"),
    Entry("e", data=b"e"),  # a directory replaced by a file
    Entry("f", data=b"f"),
    Entry("f", "dir"),  # a file replaced by a directory
    Entry("f/y", data=b"y"),
    Entry("g", data=b"g"),
    Entry(".wh.g", "file"),  # a whiteout of a file just handed to the writers: removed
]


def test_one_layer_writing_a_path_again_applies_its_entries_in_order(tmp_path: Path) -> None:
    """A plain layer's files are written by several threads: an entry that touches a path a file was just
    handed to them for (the same path, a link to it, a child of it) still sees it written, as in the
    archive's order; the streamed twin gives the same tree."""
    plain = walk(_open(build_image(tmp_path / "p", [REPLACED], gzip_layers=False), tmp_path / "c1").root)
    assert plain == walk(_open(build_image(tmp_path / "g", [REPLACED]), tmp_path / "c2").root)
    assert plain["a"] == "second"
    assert plain["b"] == "-> a"
    assert plain["d"] == "c"
    assert plain["e"] == "e"
    assert plain["f"] == "dir"
    assert plain["f/y"] == "y"
    assert "g" not in plain


def test_a_plain_layer_read_in_place_hands_what_it_does_not_decode_to_tarfile(tmp_path: Path) -> None:
    """GNU long names are left to tarfile: from that member on, a plain layer read in place is read by tarfile
    over the rest of the layer, and gives the tree the streamed gzip twin gives (the files after the handover,
    a large one among them, with their own bytes)."""
    long_name = "opt/" + "d" * 120 + "/lib.so"
    top = [
        Entry("opt/first.txt", data=b"before"),
        Entry(long_name, data=b"long"),
        Entry("opt/after.txt", data=b"after"),
        Entry("opt/big.bin", data=bytes(range(256)) * 1200),
        Entry("usr/lib/libgone.so.1", "whiteout"),
    ]
    trees = []
    for gzip_layers in (False, True):
        out = build_image(
            tmp_path / f"img-{gzip_layers}", [BASE, top], gzip_layers=gzip_layers, tar_format=tarfile.GNU_FORMAT
        )
        trees.append(walk(open_image(str(out), cache_dir=str(tmp_path / f"cache-{gzip_layers}")).root))
    assert trees[0] == trees[1]
    assert trees[0][long_name] == "long"
    assert trees[0]["opt/after.txt"] == "after"
    assert trees[0]["opt/big.bin"] == (bytes(range(256)) * 1200).decode("latin-1")
    assert "usr/lib/libgone.so.1" not in trees[0]
