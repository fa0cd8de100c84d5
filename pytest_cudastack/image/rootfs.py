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

An image whose top layer changed is a new key, but not a new root: the root of its lower layers is kept,
and every root's top layer is applied with an undo journal (what it removed moved aside, what it created
recorded). The next image on the same lower layers takes over the last root built on them (``heir``): it
undoes that root's top layer, which gives back the lower layers' tree, the same inodes at the same paths,
and applies its own, so that re-checking after a one-layer change creates no directory and no link but what
the new layer holds. Readers hold a shared lock on a root while its ``ImageRoot`` lives, and only a root no
reader holds is taken over; when none can be, or its journal does not undo, the lower layers' root is
copied (hard links) instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_cudastack._sysio import write_atomic
from pytest_cudastack.findings import Provenance
from pytest_cudastack.image.layers import RootWriter, link_text, undo
from pytest_cudastack.image.manifest import DEFAULT_PLATFORM, ImageSource, Layer, read_source
from pytest_cudastack.image.store import ImageError, open_store
from pytest_cudastack.linker.elfcache import default_cache_dir

__all__ = ["DEFAULT_PATH", "ImageRoot", "open_image"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Docker's, when Env has none
_FORMAT = 2  # of image.json in a cached root; another value is rebuilt
_LOCK = "lock"  # in a cached root's directory: readers hold LOCK_SH on it, whoever takes the root over LOCK_EX
_HEIR = "heir"  # in a lower layers' root: the key of the last root built on it (the one to take over)
_LEASES = 3  # tries to lease a root that is taken over (or replaced) between its lookup and its lock


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
    # a shared lock on the cached root, held while this object (or a copy of it) lives: no other run takes the
    # root over (see _take_over) while this one may read it
    lease: object = field(default=None, compare=False, repr=False)

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
    replaces it, as is one that is no longer valid (a layer its placeholders read changed since), unless a
    run reads it (holds its lock) and it is valid: the same layers, their digests checked, made it."""
    valid = os.path.isdir(final) and _cached(final) is not None
    if os.path.isdir(final) and (not valid or (replace and not _held(final))):
        stale = final + f".stale-{os.getpid()}"
        os.rename(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(work, final)
    except OSError:
        if not os.path.isdir(final):
            raise
        shutil.rmtree(work, ignore_errors=True)  # another run installed the same root first


def _write_facts(directory: str, writer: RootWriter, base: str | None = None) -> None:
    """The root's facts (``image.json``); a root whose top layer was journaled names the lower layers' root it
    was built on (``base``) and holds the journal (``journal.json``), so that the next image on that base can
    take it over. ``lock`` is what readers hold a shared lock on while they read the root."""
    facts: dict[str, Any] = {"format": _FORMAT, "owner": writer.owner, "skipped": writer.skipped, "kept": writer.kept}
    if base is not None and writer.journal is not None:
        facts["base"] = base
        with open(os.path.join(directory, "journal.json"), "w", encoding="utf-8") as f:
            json.dump(writer.journal, f)
    with open(os.path.join(directory, _LOCK), "x", encoding="utf-8"):
        pass
    with open(os.path.join(directory, "image.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(facts))  # json.dump encodes in Python, dumps in C: 22,000 owners, 50 ms less


def _base(source: ImageSource, images: str, no_cache: bool) -> tuple[int, str | None, dict[str, Any] | None]:
    """The longest cached root of the image's lower layers (an image whose top layers changed, the lower
    ones not): how many layers it holds, its directory and facts; (0, None, None) when there is none."""
    for count in range(len(source.layers) - 1, 0, -1) if not no_cache else ():
        directory = os.path.join(images, _chain_key(source.layers[:count]))
        facts = _cached(directory)
        if facts is not None:
            return count, directory, facts
    return 0, None, None


def _take_over(base: str, key: str, images: str, work: str) -> bool:
    """Whether the root last built on the lower layers' root ``base`` (its ``heir``) was taken over as
    ``work``/rootfs, its top layer undone: what the lower layers' root holds, the same inodes at the same
    paths, without creating a directory or a link. Only a root that no reader holds (its lock taken
    exclusively, without waiting) is taken; the heir is renamed into ``work`` while locked, so a reader that
    looks it up after finds it gone and one that locked it before keeps it. False, nothing changed or the
    half-undone heir dropped, when there is none to take or its journal does not undo."""
    try:
        with open(os.path.join(base, _HEIR), encoding="utf-8") as f:
            heir = f.read().strip()
    except OSError:
        return False
    previous = os.path.join(images, heir)
    if not heir or heir == key or "/" in heir or heir.startswith("."):
        return False
    if os.path.lexists(os.path.join(previous, _HEIR)):
        return False  # the lower layers' root of other images (a longer one was built on it): kept as it is
    facts = _cached(previous)
    if facts is None or facts.get("base") != os.path.basename(base):
        return False
    fd = _open_lock(previous)
    if fd is None:
        return False
    taken = os.path.join(work, "taken")
    try:
        if not _alone(fd) or not _same_file(fd, os.path.join(previous, _LOCK)):
            return False
        os.rename(previous, taken)
    except OSError:
        return False
    finally:
        os.close(fd)
    try:
        with open(os.path.join(taken, "journal.json"), encoding="utf-8") as f:
            journal = json.load(f)
        undo(os.path.join(taken, "rootfs"), os.path.join(taken, "stash"), journal)
        os.rename(os.path.join(taken, "rootfs"), os.path.join(work, "rootfs"))
    except (OSError, ValueError, RecursionError):
        shutil.rmtree(taken, ignore_errors=True)
        shutil.rmtree(os.path.join(work, "rootfs"), ignore_errors=True)
        return False
    shutil.rmtree(taken, ignore_errors=True)
    return True


def _open_lock(directory: str) -> int | None:
    """A descriptor of the cached root ``directory``'s lock file (the caller closes it); None without one."""
    try:
        return os.open(os.path.join(directory, _LOCK), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None


def _alone(fd: int) -> bool:
    """Whether the exclusive lock on the lock file ``fd`` was taken without waiting: no run holds the root."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _held(directory: str) -> bool:
    """Whether a run holds the cached root ``directory`` (a shared lock on its lock file)."""
    fd = _open_lock(directory)
    if fd is None:
        return False
    try:
        return not _alone(fd)
    finally:
        os.close(fd)


class _Retry(Exception):
    """The lower layers' root went away while this run was about to copy it: look the image up again."""


def _same_file(fd: int, path: str) -> bool:
    """Whether the open file ``fd`` is the file at ``path`` now."""
    try:
        st, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


def _materialise(source: ImageSource, store: Any, images: str, key: str, no_cache: bool = False) -> _Lease | None:
    """Apply the layers in a private directory beside the final one, then rename it into place. The root of
    all layers but the top one is kept too (hard links), and the top layer is journaled: re-checking an
    image whose top layer changed takes over the last root built on those lower layers, its top layer undone
    (see :func:`_take_over`), or else applies the new top layer to a copy of the lower layers' root (leased
    while it is copied: no other run takes it over meanwhile). Returns a lease on the root built, taken before
    it is installed (no run takes it over between its installation and its first reader)."""
    os.makedirs(images, mode=0o700, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".build-", dir=images)
    writer: RootWriter | None = None
    top = len(source.layers) - 1
    lower_key = _chain_key(source.layers[:top]) if top > 0 else None
    try:
        writer = RootWriter(os.path.join(work, "rootfs"), os.path.join(images, "layers"))
        start, base, facts = _base(source, images, no_cache)
        if base is not None and facts is not None:
            if not (start == top and _take_over(base, key, images, work)):
                held = _lease(base)
                if held is None:  # taken over or replaced since it was looked up: every layer is applied
                    raise _Retry
                _link_copy(os.path.join(base, "rootfs"), writer.root)
                del held
            writer.owner = {str(k): int(v) for k, v in facts["owner"].items() if isinstance(v, int)}
            writer.skipped = int(facts.get("skipped", 0))
            writer.kept = dict(facts.get("kept", {}))
        else:
            os.mkdir(writer.root, 0o755)
        for index in range(start, len(source.layers)):
            if index == top and index > 0:
                if index > start:  # keep the lower layers' root for next time
                    lower = tempfile.mkdtemp(prefix=".build-", dir=images)
                    _link_copy(writer.root, os.path.join(lower, "rootfs"))
                    _write_facts(lower, writer)
                    _install(lower, os.path.join(images, _chain_key(source.layers[:index])))
                writer.journal_into(os.path.join(work, "stash"))
            writer.apply(store, source.layers[index], index)
        _write_facts(work, writer, lower_key)
        built = _lease(work)
        _install(work, os.path.join(images, key), replace=no_cache)
        if lower_key is not None:
            write_atomic(os.path.join(images, lower_key), os.path.join(images, lower_key, _HEIR), key)
        return built
    except _Retry:
        _discard(work, writer)
        return None
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


class _Lease:
    """A shared lock (``flock``) on a cached root's lock file, released when the lease is collected."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        weakref.finalize(self, os.close, fd)


def _lease(directory: str) -> _Lease | None:
    """A shared lock on the cached root ``directory``, None when that root is gone or was replaced before it
    was locked (a concurrent run took it over): then the caller looks it up again."""
    fd = _open_lock(directory)
    if fd is None:
        return None
    lease = _Lease(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for a run that is taking it over (an undo: milliseconds)
    except OSError:
        return None
    return lease if _same_file(fd, os.path.join(directory, _LOCK)) else None


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
        # canonical: the root's path is what image paths are cut from (a symbolic link in the cache's path would
        # leave the interpreter's real path outside it)
        images = os.path.join(os.path.realpath(cache_dir or default_cache_dir()), "images")
        key = _cache_key(source)
        facts, lease = _leased(source, store, images, key, no_cache)
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
        lease,
    )


def _leased(source: ImageSource, store: Any, images: str, key: str, no_cache: bool) -> tuple[dict[str, Any], _Lease]:
    """The facts of the image's cached root (materialised when it is not cached, or ``no_cache``), with a
    lease on it."""
    final = os.path.join(images, key)
    for _ in range(_LEASES):
        facts = None if no_cache else _cached(final)
        built = None
        if facts is None:
            built = _materialise(source, store, images, key, no_cache)
            facts = _cached(final)
        if facts is None:
            continue  # the lower layers' root went away meanwhile, or the root was taken over at once
        lease = built if built is not None and _same_file(built.fd, os.path.join(final, _LOCK)) else _lease(final)
        if lease is not None:
            return facts, lease
        no_cache = False
    raise ImageError(f"{source.path}: its root under {images} cannot be read back: another run replaced it each time")
