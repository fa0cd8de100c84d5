"""An image as a root directory: ``open_image`` materialises the merged file system of its layers once, in
``$CUDASTACK_CACHE_DIR/images/<key>/`` keyed by the chain of its layer digests (a changed layer is a new
key), and returns the ``ImageRoot`` the stack is built on: the directory, the config's environment and
command, and which layer (digest and ``history`` step) wrote each file.

A directory that holds no ``oci-layout``/``index.json``/``manifest.json`` is a root file system itself: it
is mirrored the same way, keyed by its path and every entry's status (each regular file hard-linked where
the file system allows, else copied; its symbolic links rewritten to stay inside the root, as a layer's are;
it has no layers, so its findings name none). A half-built root is never used: layers are applied in a
private directory renamed into place once every digest has been checked; a failure removes it.

The large files of an uncompressed layer are placeholders read from that layer in place (see
:mod:`pytest_cudastack._sysio`): the layer's file is hard-linked into ``images/layers/``, so it stays what
the root was built from whatever becomes of the image, and a root whose linked layer has changed since (an
archive saved again over the same file) is not valid: it is built again. So the root is for this package's
readers; a program given its path (``cp``, ``chroot``) sees such a file as zeros.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_cudastack.findings import Provenance
from pytest_cudastack.image.layers import RootWriter, link_text
from pytest_cudastack.image.manifest import DEFAULT_PLATFORM, ImageSource, Layer, read_source
from pytest_cudastack.image.store import ImageError, open_store
from pytest_cudastack.linker.elfcache import default_cache_dir

__all__ = ["DEFAULT_PATH", "ImageRoot", "open_image"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Docker's, when Env has none
_FORMAT = 1  # of image.json in a cached root; another value is rebuilt


@dataclass(frozen=True)
class ImageRoot:
    """An image's merged file system at ``root`` (a host directory), its ``reference``, ``kind`` (``rootfs``,
    ``oci-layout``, ``oci-archive``, ``docker-archive``), the config's ``env`` (``PATH`` defaulted as Docker
    does), ``entrypoint``/``cmd``/``workdir``, its layers (``digest``, ``created_by``) and each file's layer
    index (``owner``: ``usr/lib/x`` -> index)."""

    root: str
    reference: str
    kind: str
    env: Mapping[str, str]
    layers: tuple[Layer, ...] = ()
    owner: Mapping[str, int] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str = "/"
    skipped: int = 0
    path: str = ""  # what was opened: the directory or archive
    platform: str = DEFAULT_PLATFORM

    def host(self, path: str) -> str:
        """The host path of the image path ``path`` (``/usr/lib/x``)."""
        return os.path.join(self.root, path.lstrip("/"))

    def to_json(self) -> dict[str, Any]:
        """What ``cudastack image --json`` says of the image (check.schema.json's ``image``)."""
        return {
            "path": self.path,
            "reference": self.reference,
            "kind": self.kind,
            "platform": self.platform,
            "layers": [{"digest": x.name, "diff_id": x.diff_id, "created_by": x.created_by} for x in self.layers],
        }

    def image_path(self, host: str) -> str | None:
        """The image path of a host path under the root, else None."""
        root = self.root.rstrip("/")
        if host == root:
            return "/"
        if host.startswith(root + "/"):
            return host[len(root) :]
        return None

    def origin(self, path: str) -> Provenance | None:
        """The layer that wrote the image path ``path`` (or a host path under the root), None when unknown."""
        logical = self.image_path(path) if path.startswith(self.root.rstrip("/") + "/") else path
        if logical is None:
            return None
        index = self.owner.get(logical.lstrip("/"))
        if index is None or not 0 <= index < len(self.layers):
            return None
        layer = self.layers[index]
        return Provenance(logical, layer.name, layer.created_by)


def _env(config: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    entries = config.get("Env")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, str) and "=" in entry:
            key, _, value = entry.partition("=")
            env[key] = value
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def _words(value: Any) -> tuple[str, ...]:
    return tuple(str(w) for w in value) if isinstance(value, list) else ()


def _chain_key(layers: tuple[Layer, ...]) -> str:
    """The cache key of the root these layers make, bottom first."""
    chain = "\n".join(f"{layer.digest}|{layer.diff_id}|{layer.member}" for layer in layers)
    return hashlib.sha256(f"{_FORMAT}\n{chain}".encode()).hexdigest()[:32]


def _cache_key(source: ImageSource) -> str:
    return _chain_key(source.layers)


def _link_copy(src: str, dst: str) -> None:
    """A copy of the tree ``src`` at ``dst`` whose files are hard links (both in the cache directory): applying
    a layer replaces a file, never writes into it, so the copy shares the unchanged files' bytes. One system
    call an entry: the kind of each comes from its directory entry (``scandir``'s d_type), not a stat."""
    os.mkdir(dst, 0o755)
    todo = [(src, dst)]
    while todo:
        here, there = todo.pop()
        with os.scandir(here) as entries:
            for entry in entries:
                target = os.path.join(there, entry.name)
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), target)
                elif entry.is_dir(follow_symlinks=False):
                    os.mkdir(target, 0o755)
                    todo.append((entry.path, target))
                else:
                    os.link(entry.path, target, follow_symlinks=False)


def _install(work: str, final: str, replace: bool = False) -> None:
    """Rename the built directory ``work`` to ``final``. One already there (a concurrent run, an xdist worker
    beside this one) is kept and ``work`` dropped, since its reader may be using it; ``replace`` (--no-cache)
    replaces it, as is one that is no longer valid (a layer its placeholders read changed since)."""
    if os.path.isdir(final) and (replace or _cached(final) is None):
        stale = final + f".stale-{os.getpid()}"
        os.rename(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(work, final)
    except OSError:
        if not os.path.isdir(final):
            raise
        shutil.rmtree(work, ignore_errors=True)  # another run installed the same root first


def _write_facts(directory: str, writer: RootWriter) -> None:
    with open(os.path.join(directory, "image.json"), "w", encoding="utf-8") as f:
        json.dump({"format": _FORMAT, "owner": writer.owner, "skipped": writer.skipped, "kept": writer.kept}, f)


def _base(source: ImageSource, images: str, no_cache: bool) -> tuple[int, str | None, dict[str, Any] | None]:
    """The longest cached root of the image's lower layers (an image whose top layers changed, the lower
    ones not): how many layers it holds, its directory and facts; (0, None, None) when there is none."""
    for count in range(len(source.layers) - 1, 0, -1) if not no_cache else ():
        directory = os.path.join(images, _chain_key(source.layers[:count]))
        facts = _cached(directory)
        if facts is not None:
            return count, directory, facts
    return 0, None, None


def _materialise(source: ImageSource, store: Any, images: str, key: str, no_cache: bool = False) -> None:
    """Apply the layers in a private directory beside the final one, then rename it into place. The root of
    all layers but the top one is kept too (hard links): re-checking an image whose top layer changed
    applies only that layer to a copy of it."""
    os.makedirs(images, mode=0o700, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".build-", dir=images)
    writer: RootWriter | None = None
    try:
        writer = RootWriter(os.path.join(work, "rootfs"), os.path.join(images, "layers"))
        start, base, facts = _base(source, images, no_cache)
        if base is not None and facts is not None:
            _link_copy(os.path.join(base, "rootfs"), writer.root)
            writer.owner = {str(k): int(v) for k, v in facts["owner"].items() if isinstance(v, int)}
            writer.skipped = int(facts.get("skipped", 0))
            writer.kept = dict(facts.get("kept", {}))
        else:
            os.mkdir(writer.root, 0o755)
        top = len(source.layers) - 1
        for index in range(start, len(source.layers)):
            if index == top and index > 0 and index > start:  # keep the lower layers' root for next time
                lower = tempfile.mkdtemp(prefix=".build-", dir=images)
                _link_copy(writer.root, os.path.join(lower, "rootfs"))
                _write_facts(lower, writer)
                _install(lower, os.path.join(images, _chain_key(source.layers[:index])))
            writer.apply(store, source.layers[index], index)
        _write_facts(work, writer)
        _install(work, os.path.join(images, key), replace=no_cache)
    except OSError as e:
        _discard(work, writer)
        raise ImageError(f"{source.path}: cannot materialise the image under {images}: {e.strerror or e}") from e
    except BaseException:
        _discard(work, writer)
        raise


def _discard(work: str, writer: RootWriter | None) -> None:
    """Remove a failed build: its directory and the layer links it made."""
    shutil.rmtree(work, ignore_errors=True)
    for link in writer.linked if writer is not None else ():
        with contextlib.suppress(OSError):
            os.unlink(link)
            os.rmdir(os.path.dirname(link))  # when no other root keeps a layer there


def _cached(directory: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(directory, "image.json"), encoding="utf-8") as f:
            facts = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(facts, dict) and facts.get("format") == _FORMAT and isinstance(facts.get("owner"), dict)
    return (
        facts
        if ok and _kept_stand(facts.get("kept", {})) and os.path.isdir(os.path.join(directory, "rootfs"))
        else None
    )


def _kept_stand(kept: Any) -> bool:
    """Whether the layers a cached root's placeholders read are still the bytes they were (a kept link is
    the image's own file: an archive saved again over the same inode changes it); a root whose layer changed
    is built again."""
    if not isinstance(kept, dict):
        return False
    for path, recorded in kept.items():
        try:
            st = os.stat(path)
        except (OSError, TypeError, ValueError):
            return False
        if [st.st_size, st.st_mtime_ns] != recorded:
            return False
    return True


def _walk(source: str) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``source`` (relative path, lstat), parents before children; links not followed."""
    out: list[tuple[str, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames.sort()
        for name in [*dirnames, *sorted(filenames)]:
            full = os.path.join(dirpath, name)
            try:
                out.append((os.path.relpath(full, source), os.lstat(full)))
            except OSError:
                continue
    return out


def _mirror(source: str, images: str, no_cache: bool) -> str:
    """``source`` mirrored under ``images`` (see the module's docstring): the mirror's root."""
    entries = _walk(source)
    digest = hashlib.sha256(f"{_FORMAT}\nrootfs\n{source}".encode())
    for rel, st in entries:
        digest.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    key = "rootfs-" + digest.hexdigest()[:32]
    final = os.path.join(images, key)
    if not no_cache and _cached(final) is not None:
        return os.path.join(final, "rootfs")
    os.makedirs(images, mode=0o700, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".build-", dir=images)
    try:
        root = os.path.join(work, "rootfs")
        os.mkdir(root, 0o755)
        for rel, st in entries:
            src, dst = os.path.join(source, rel), os.path.join(root, rel)
            if not os.path.isdir(os.path.dirname(dst)) or os.path.islink(os.path.dirname(dst)):
                continue  # below a directory that could not be mirrored
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(dst, 0o755)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(link_text(rel.split(os.sep)[:-1], os.readlink(src)), dst)
            elif stat.S_ISREG(st.st_mode):
                try:
                    os.link(src, dst, follow_symlinks=False)
                except OSError:  # another file system, or not allowed: a copy
                    shutil.copyfile(src, dst, follow_symlinks=False)
                    os.chmod(dst, (st.st_mode & 0o755) | 0o600)
        with open(os.path.join(work, "image.json"), "w", encoding="utf-8") as f:
            json.dump({"format": _FORMAT, "owner": {}, "skipped": 0}, f)
        _install(work, final, replace=no_cache)
    except OSError as e:
        shutil.rmtree(work, ignore_errors=True)
        raise ImageError(f"{source}: cannot mirror the root file system under {images}: {e.strerror or e}") from e
    return os.path.join(final, "rootfs")


def _is_image(path: str) -> bool:
    return not os.path.isdir(path) or any(
        os.path.isfile(os.path.join(path, n)) for n in ("oci-layout", "index.json", "manifest.json")
    )


def open_image(
    path: str,
    platform: str = DEFAULT_PLATFORM,
    *,
    cache_dir: str | None = None,
    no_cache: bool = False,
) -> ImageRoot:
    """The image at ``path`` as a root directory (see the module's docstring); ImageError naming the image
    and what is wrong when it cannot be read. ``no_cache`` rebuilds the cached root (every digest checked
    again) instead of reusing it."""
    if not os.path.exists(path):
        raise ImageError(f"{path}: no such file or directory")
    if not _is_image(path):
        top = os.path.abspath(path)
        mirrored = _mirror(top, os.path.join(cache_dir or default_cache_dir(), "images"), no_cache)
        return ImageRoot(mirrored, top, "rootfs", _env({}), path=top, platform=platform)
    store = open_store(path)
    try:
        source = read_source(store, platform)
        images = os.path.join(cache_dir or default_cache_dir(), "images")
        key = _cache_key(source)
        facts = None if no_cache else _cached(os.path.join(images, key))
        if facts is None:
            _materialise(source, store, images, key, no_cache)
            facts = _cached(os.path.join(images, key))
        if facts is None:
            raise ImageError(f"{path}: the materialised image under {images} cannot be read back")
    finally:
        store.close()
    config = source.runtime_config
    owner = {str(k): int(v) for k, v in facts["owner"].items() if isinstance(v, int)}
    return ImageRoot(
        os.path.join(images, key, "rootfs"),
        source.reference,
        source.kind,
        _env(config),
        source.layers,
        owner,
        _words(config.get("Entrypoint")),
        _words(config.get("Cmd")),
        str(config.get("WorkingDir") or "/"),
        int(facts.get("skipped", 0)),
        os.path.abspath(path),
        source.platform,
    )
