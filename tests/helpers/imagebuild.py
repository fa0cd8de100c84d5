"""Build container images in the four formats ``cudastack image`` reads, with ``tarfile`` and ``json`` only
(no container runtime): an OCI image layout directory, an oci-archive, a legacy ``docker save`` archive
(``manifest.json`` + ``<id>/layer.tar``) and Docker >= 25's hybrid (OCI layout plus ``manifest.json``).

A layer is a list of ``Entry``; ``build_image`` lays the same layers out in a format, so the four formats
of one image can be compared.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack._sysio import LAYER_XATTR, make_placeholder, open_span

__all__ = ["FORMATS", "Entry", "blob_files", "build_image", "config_for", "layer_tar", "sha256", "walk"]

FORMATS = ("oci-layout", "oci-archive", "docker-legacy", "docker-hybrid")


@dataclass(frozen=True)
class Entry:
    """One tar entry: ``kind`` is file, dir, symlink, hardlink, fifo, whiteout (``.wh.`` + the name's last
    part), opaque (``.wh..wh..opq`` in the directory ``name``); ``data`` a file's bytes or a Path to copy."""

    name: str
    kind: str = "file"
    data: bytes | Path = b""
    target: str = ""
    mode: int = 0o644


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(entries: Sequence[Entry], tar_format: int = tarfile.PAX_FORMAT) -> bytes:
    """The uncompressed tar of ``entries``, in order (``tar_format``: tarfile's, pax by default)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tar_format) as tf:
        for e in entries:
            name = e.name
            if e.kind == "whiteout":
                head, _, tail = name.rpartition("/")
                name = f"{head}/.wh.{tail}" if head else f".wh.{tail}"
            elif e.kind == "opaque":
                name = f"{name.rstrip('/')}/.wh..wh..opq"
            info = tarfile.TarInfo(name)
            info.mode = e.mode
            data = b""
            if e.kind == "file":
                data = e.data.read_bytes() if isinstance(e.data, Path) else e.data
                info.size = len(data)
                info.mode = e.mode if e.mode != 0o644 or not data.startswith(b"\x7fELF") else 0o755
            elif e.kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
            elif e.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = e.target
            elif e.kind == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = e.target
            elif e.kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tf.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def config_for(
    diff_ids: Sequence[str],
    env: Sequence[str] = (),
    history: Sequence[str] = (),
    arch: str = "amd64",
    cmd: Sequence[str] = (),
) -> dict[str, Any]:
    return {
        "architecture": arch,
        "os": "linux",
        "config": {"Env": list(env), **({"Cmd": list(cmd)} if cmd else {})},
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
        "history": [{"created_by": h} for h in history]
        or [{"created_by": f"RUN step {i}"} for i in range(len(diff_ids))],
    }


def _put(files: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = sha256(data)
    files["blobs/sha256/" + digest.split(":", 1)[1]] = data
    return {"digest": digest, "size": len(data)}


def _write_dir(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _write_tar(out: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(out, "w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def build_image(
    out: Path,
    layers: Sequence[Sequence[Entry]],
    fmt: str = "oci-layout",
    *,
    env: Sequence[str] = (),
    history: Sequence[str] = (),
    cmd: Sequence[str] = (),
    gzip_layers: bool = True,
    ref: str = "example.com/app:1",
    extra_platforms: Sequence[str] = (),
    tar_format: int = tarfile.PAX_FORMAT,
) -> Path:
    """The image of ``layers`` in format ``fmt`` (``FORMATS``) at ``out`` (a directory for oci-layout, else a
    tar file). ``extra_platforms`` ("linux/arm64") adds images of those platforms (one empty layer) to a
    multi-platform index, listed before this one."""
    tars = [layer_tar(entries, tar_format) for entries in layers]
    diff_ids = [sha256(t) for t in tars]
    config = json.dumps(config_for(diff_ids, env, history, cmd=cmd)).encode()
    files: dict[str, bytes] = {}
    if fmt == "docker-legacy":
        members = []
        for i, tar in enumerate(tars):
            name = f"{hashlib.sha256(tar + bytes([i])).hexdigest()}/layer.tar"
            files[name] = tar
            members.append(name)
        cfg_name = hashlib.sha256(config).hexdigest() + ".json"
        files[cfg_name] = config
        files["manifest.json"] = json.dumps([{"Config": cfg_name, "RepoTags": [ref], "Layers": members}]).encode()
        _write_tar(out, files)
        return out
    blobs = [gzip.compress(t, mtime=0) if gzip_layers else t for t in tars]
    media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzip_layers else "")
    layer_descs = [{"mediaType": media, **_put(files, b)} for b in blobs]
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **_put(files, config)},
        "layers": layer_descs,
    }
    descs = []
    for platform in extra_platforms:
        os_, arch = platform.split("/")[:2]
        empty = layer_tar([])
        other_cfg = json.dumps(config_for([sha256(empty)], arch=arch)).encode()
        other = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **_put(files, other_cfg)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **_put(files, empty)}],
        }
        descs.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_put(files, json.dumps(other).encode()),
                "platform": {"os": os_, "architecture": arch},
            }
        )
    descs.append(
        {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            **_put(files, json.dumps(manifest).encode()),
            "platform": {"os": "linux", "architecture": "amd64"},
            "annotations": {"org.opencontainers.image.ref.name": ref},
        }
    )
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"}
    if fmt == "docker-hybrid":  # Docker >= 25: index.json -> a nested index -> the manifest
        nested = {**index, "manifests": descs}
        index["manifests"] = [
            {
                "mediaType": "application/vnd.oci.image.index.v1+json",
                **_put(files, json.dumps(nested).encode()),
                "annotations": {"io.containerd.image.name": ref},
            }
        ]
        cfg_digest = manifest["config"]["digest"].split(":", 1)[1]  # type: ignore[index]
        layer_names = ["blobs/sha256/" + d["digest"].split(":", 1)[1] for d in layer_descs]
        files["manifest.json"] = json.dumps(
            [{"Config": f"blobs/sha256/{cfg_digest}", "RepoTags": [ref], "Layers": layer_names}]
        ).encode()
    else:
        index["manifests"] = descs
    files["index.json"] = json.dumps(index).encode()
    files["oci-layout"] = b'{"imageLayoutVersion": "1.0.0"}'
    if fmt == "oci-layout":
        out.mkdir(parents=True, exist_ok=True)
        _write_dir(out, files)
    else:
        _write_tar(out, files)
    return out


def blob_files(image_dir: Path) -> list[Path]:
    return sorted(p for p in (image_dir / "blobs" / "sha256").iterdir() if p.is_file())


def walk(root: str) -> dict[str, str]:
    """Every path under ``root`` -> ``dir``, ``-> TARGET`` for a link, or the file's bytes decoded."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = "-> " + os.readlink(full)
            elif os.path.isdir(full):
                out[rel] = "dir"
            else:
                out[rel] = read_root_file(full).decode("latin-1")
    return out


def read_root_file(path: str) -> bytes:
    """The bytes of a file of an image's cached root, as the readers see them: a layer-backed placeholder is
    read from its layer in place (never filled), any other file directly."""
    span, st = open_span(path)
    try:
        return span.pread(st.st_size, 0)
    finally:
        span.close()


def placeholder(src: Path, dst: Path, shift: int) -> Path:
    """``dst``: a sparse placeholder of ``src`` whose bytes lie at ``shift`` of a blob beside it, with other
    bytes before and after them (the headers and members around a member in a layer tar)."""
    data = src.read_bytes()
    dst.parent.mkdir(parents=True, exist_ok=True)
    blob = dst.parent / f"{dst.name}.blob"
    blob.write_bytes(b"\xa5" * shift + data + b"\x5a" * 8192)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
    try:
        if not make_placeholder(fd, len(data), shift, str(blob), os.stat(blob)):
            pytest.skip("this file system takes no user extended attribute")
    finally:
        os.close(fd)
    return dst


def is_placeholder(path: Path) -> bool:
    try:
        os.getxattr(path, LAYER_XATTR)
    except OSError:
        return False
    return os.stat(path).st_blocks * 512 < os.stat(path).st_size


def needs_user_xattrs(directory: Path) -> None:
    """Skip where ``directory``'s file system takes no user extended attribute (tmpfs before Linux 6.6):
    there every file of an image's root is a copy, and nothing is read in place."""
    probe = directory / ".xattr-probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.cudastack.probe", b"1")
    except OSError:
        pytest.skip(f"{directory}: this file system takes no user extended attribute")
    finally:
        probe.unlink()
