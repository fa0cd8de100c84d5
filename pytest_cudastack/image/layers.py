"""One layer's tar stream applied to a root directory, as a container runtime's snapshotter applies it.

Entries take effect in the archive's order. A compressed blob is read once as a stream, its digests computed
as it goes. A plain (uncompressed) tar that lies in a file is read in place: its headers where they lie
(:mod:`~pytest_cudastack.image.tarheaders`), each new file created and filled by the kernel
(``copy_file_range``) from writer threads, so that the file system's waits overlap, while another thread
computes the digest. Where the layer's file can be hard-linked into the cache, a large file is not filled at
all: it is a layer-backed placeholder (:mod:`pytest_cudastack._sysio`) that the readers read in place, so a
multi-GB image's libraries are never written out again (that write was most of a cold check's cost). An
entry that touches a path handed to the writers (the same path, a child of it, a hard link, a whiteout, a
removal) waits for them first, which keeps the archive's order. The digest is checked before the layer
counts, and a failure leaves nothing the caller keeps (its half-built root is removed). Either way:
- ``.wh.NAME`` deletes NAME from the layers below, ``.wh..wh..opq`` hides everything the layers below put in
  its directory (what this layer puts there stays), as the OCI image spec's "Whiteouts" section says;
- every path is taken from the image root: a leading ``/`` is dropped, a ``..`` component refuses the layer
  (Docker's ``breakoutError``); a parent directory reached through a symbolic link is followed *inside* the
  root (as ``filepath-securejoin`` does for runc), so nothing is ever written outside it;
- a symbolic link is kept as a link whose text is rewritten relative to its own directory, computed inside
  the root (an absolute target is taken from the image root, ``..`` stops at the root): whoever follows it
  later, ld.so's model or a plain ``open``, stays inside the image. ``a/../b`` is read lexically there;
- a hard link links to the file of the layers so far that it names (never through a final symbolic link);
- device nodes, FIFOs and sockets are not created (nothing here reads them); set-id bits are dropped.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import os
import shutil
import stat
import tarfile
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from pytest_cudastack._sysio import Span, copy_range, make_placeholder
from pytest_cudastack.image.manifest import Layer
from pytest_cudastack.image.store import BlobStore, ImageError
from pytest_cudastack.image.tarheaders import Handover, read_members

__all__ = ["RootWriter", "link_text", "undo"]

_MAX_LINKS = 40  # symbolic links followed in one path, Linux's MAXSYMLINKS
_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20
_TAR_BUFFER = 64 << 10
_WRITERS = 4  # threads creating and filling a plain layer's files: each creation waits on the file system
_PENDING = 512  # files handed to them before the reader waits for all (bounded memory for huge layers)
# a file of a kept plain layer at least this large is a placeholder read in place, not a copy: the few large
# libraries hold nearly all of an image's bytes, and a small file's copy costs less than its attribute
_PLACEHOLDER_MIN = 256 << 10


class _Hashing:
    """A read-only stream that hashes what is read through it (``hashing``, else it only counts); ``prefix``
    is returned first (bytes already peeked at)."""

    def __init__(self, inner: Any, prefix: bytes = b"", hashing: bool = True) -> None:
        self._inner = inner
        self._prefix = prefix
        self.hash = hashlib.sha256()
        self._hashing = hashing
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        if self._prefix:
            data = self._prefix if size < 0 else self._prefix[:size]
            self._prefix = self._prefix[len(data) :]
            if size < 0:
                data += self._inner.read()
        else:
            data = self._inner.read(size)
        if self._hashing:
            self.hash.update(data)
        self.size += len(data)
        return bytes(data)

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    @property
    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


def _digest_range(fd: int, base: int, size: int, stop: threading.Event | None = None) -> tuple[str, int]:
    """The sha256 digest of ``size`` bytes of ``fd`` from ``base`` and how many could be read (fewer: the
    file ends early, or ``stop`` was set)."""
    h = hashlib.sha256()
    done = 0
    while done < size and not (stop is not None and stop.is_set()):
        chunk = os.pread(fd, min(_CHUNK * 8, size - done), base + done)
        if not chunk:
            break
        h.update(chunk)
        done += len(chunk)
    return "sha256:" + h.hexdigest(), done


def _check_digests(layer: Layer, digest: str, size: int, plain_digest: str) -> None:
    """ImageError when the blob's bytes (``digest``, ``size``) are not those its descriptor names, or its
    uncompressed tar's (``plain_digest``) not the config's diff_id."""
    if layer.digest is not None and digest != layer.digest:
        raise ImageError(f"layer {layer.name}: digest mismatch (the blob's bytes hash to {digest})")
    if layer.size is not None and size != layer.size:
        raise ImageError(f"layer {layer.name}: size {size}, its descriptor says {layer.size}")
    if layer.diff_id is not None and plain_digest != layer.diff_id:
        raise ImageError(
            f"layer {layer.name}: its uncompressed tar hashes to {plain_digest}, the config's diff_id is "
            f"{layer.diff_id}"
        )


class _KeptLayer(NamedTuple):
    """A layer's file, hard-linked into the cache, that placeholders read from: its path and status."""

    path: str
    stat: os.stat_result
    new: bool  # linked by this call (a failed build removes it), not by an earlier run


def _write_new(host: str, src: int, offset: int, size: int, mode: int, name: str, kept: _KeptLayer | None) -> None:
    """Create the file ``host`` (which does not exist) with ``size`` bytes of ``src`` from ``offset``: a
    layer-backed placeholder where the layer is ``kept`` and the file is large (see
    :mod:`pytest_cudastack._sysio`), else a copy."""
    fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        placed = (
            size >= _PLACEHOLDER_MIN and kept is not None and make_placeholder(fd, size, offset, kept.path, kept.stat)
        )
        if not placed and copy_range(src, fd, offset, size) != size:
            raise EOFError(f"the layer ends inside {name}")
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _keep_layer(path: str, directory: str) -> _KeptLayer | None:
    """A hard link to ``path`` (a blob, or an archive holding an uncompressed layer) in ``directory``, which
    this user owns, so that the cached root's placeholders can read the layer's bytes whatever becomes of the
    image. None where it cannot be linked (another file system, another user's file under
    ``fs.protected_hardlinks``, a file that is not this user's): then the files are copied."""
    try:
        st = os.stat(path)
        if st.st_uid != os.geteuid():
            return None
        key = f"{os.path.abspath(path)}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"
        link = os.path.join(directory, hashlib.sha256(key.encode()).hexdigest()[:32])
        os.makedirs(directory, mode=0o700, exist_ok=True)
        new = True
        try:
            os.link(path, link)
        except FileExistsError:  # kept by an earlier run
            new = False
        lst = os.stat(link)
    except OSError:
        return None
    if (lst.st_dev, lst.st_ino) != (st.st_dev, st.st_ino):
        return None
    return _KeptLayer(link, st, new)


def _parts(name: str, layer: str) -> list[str]:
    """The components of an entry's path from the image root; ImageError for one that climbs out."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageError(f"layer {layer}: entry {name!r} escapes the image root (a '..' component)")
    return parts


def _decompressor(raw: _Hashing, layer: Layer) -> tuple[Any, bool]:
    """The uncompressed stream of the blob ``raw`` reads, and whether the blob is compressed (a plain tar's
    bytes are the blob's: its one hash serves as both digest and diff_id)."""
    head = raw.read(4)
    peeked = _Hashing(raw, head, hashing=False)  # raw hashes every byte once; this only puts the head back
    if head.startswith(_GZIP):
        return gzip.GzipFile(fileobj=peeked, mode="rb"), True  # type: ignore[call-overload]
    if head.startswith(_ZSTD):
        try:
            zstd = importlib.import_module("compression.zstd")  # lazy: only where the Python has it (>= 3.14)
        except ImportError:
            raise ImageError(
                f"layer {layer.name} is zstd-compressed and this Python has no zstd decompressor (Python >= 3.14's "
                "compression.zstd); re-export the image with gzip layers"
            ) from None
        return zstd.ZstdFile(peeked, mode="rb"), True
    return peeked, False


def link_text(parent: list[str], target: str) -> str:
    """A symbolic link's text rewritten to stay inside the root, relative to its directory ``parent`` (the
    link's real directory, as components from the root): an absolute target is taken from the root, ``..``
    stops at the root, the rest is read lexically."""
    base = [] if target.startswith("/") else list(parent)
    for part in target.split("/"):
        if part == "..":
            if base:
                base.pop()
        elif part not in ("", "."):
            base.append(part)
    return os.path.relpath("/" + "/".join(base), "/" + "/".join(parent))


def undo(root: str, stash: str, journal: Any) -> None:
    """Take a journaled layer (:meth:`RootWriter.journal_into`) off the tree ``root``, its records undone from
    the last: a created entry removed (a directory it created is empty again by then), a moved one renamed back
    from ``stash``. OSError or ValueError, leaving the tree half undone, when it is not what the journal says
    (the caller then drops the tree)."""
    records = journal if isinstance(journal, list) else None
    if records is None or not all(isinstance(r, list) and all(isinstance(x, str) for x in r) for r in records):
        raise ValueError("not a journal")
    for record in reversed(records):
        parts = record[1].split("/") if len(record) >= 2 else [""]
        if any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"a journal record names no path in the root: {record!r}")
        host = os.path.join(root, *parts)
        if record[0] == "N" and len(record) == 2:
            if stat.S_ISDIR(os.lstat(host).st_mode):
                os.rmdir(host)
            else:
                os.unlink(host)
        elif record[0] == "S" and len(record) == 3 and record[2].isdigit():
            if os.path.lexists(host):
                raise FileExistsError(host)
            os.rename(os.path.join(stash, record[2]), host)
        else:
            raise ValueError(f"not a journal record: {record!r}")


class RootWriter:
    """Applies layers, bottom first, to the directory ``root`` (empty at first); ``owner`` maps each file
    and link of the merged tree (``usr/lib/x``) to the index of the layer that wrote it."""

    def __init__(self, root: str, layers: str | None = None) -> None:
        self.root = root
        # where plain layers are hard-linked for placeholders to read (None: every file is a copy), and the
        # links this root's placeholders read (path -> [size, mtime_ns]), for the cache to check they stand
        self._layers = layers
        self.kept: dict[str, list[int]] = {}
        self.linked: list[str] = []  # links this writer made (removed when the build fails)
        self._kept: _KeptLayer | None = None
        self.owner: dict[str, int] = {}
        self.skipped = 0  # device nodes, FIFOs, sockets: not created
        self._touched: set[str] = set()
        # what _resolve answered for a parent path that exists (a directory's path -> its real components):
        # one lstat a component once, not for every entry below it; emptied whenever a directory or a
        # symbolic link is removed (nothing else can change what an existing real directory path resolves to)
        self._dirs: dict[str, list[str]] = {}
        # directories this layer created (empty then): a path under one that the layer has not written is
        # known not to exist without asking the file system; emptied with _dirs
        self._fresh: set[str] = set()
        self._source: tuple[int, int] | None = None  # (fd, offset) of the plain layer read in place
        # while a plain layer is applied: threads writing its new files, and the files handed to them (path
        # -> its future). Every other change waits for them first when it touches one of these paths, so
        # the entries still take effect in the archive's order
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future[None]] = {}
        # the undo journal of the layer being applied (see :meth:`journal_into`): ``["N", path]`` for an entry
        # created, ``["S", path, name]`` for one moved aside to ``stash/name`` instead of being deleted; None
        # when the layer is not journaled
        self.journal: list[list[str]] | None = None
        self._stash: str | None = None

    def journal_into(self, stash: str) -> None:
        """Journal the next layer applied, so that :func:`undo` can take it off again: what it removes is
        moved to the directory ``stash`` (created here; on the root's file system), and what it creates is
        recorded. The layer's entries only ever create a path that is absent and remove one that is there,
        so the journal, undone from its end, gives back the tree as it was, the same inodes at the same paths."""
        os.mkdir(stash, 0o700)
        self.journal = []
        self._stash = stash

    def _created(self, key: str) -> None:
        if self.journal is not None:
            self.journal.append(["N", key])

    def _host(self, parts: list[str]) -> str:
        return os.path.join(self.root, *parts)

    def _drain(self) -> None:
        """Wait for every file handed to the writer threads; the first failure is raised (EOFError, OSError)."""
        pending, self._pending = self._pending, {}
        failure: BaseException | None = None
        for future in pending.values():
            error = future.exception()
            failure = failure or error
        if failure is not None:
            raise failure

    def _resolve(self, parts: list[str], layer: str, create: bool = False, entry: str = "") -> list[str]:
        """``parts`` with every symbolic link followed inside the root (``..`` stops at the root): the real
        directory a path's parent names. ``create`` makes missing directories (a tar may omit them)."""
        key = "/".join(parts)
        known = self._dirs.get(key)
        if known is not None:
            return list(known)
        done: list[str] = []
        todo = list(parts)
        above = self._dirs.get(key.rpartition("/")[0]) if len(parts) > 1 else None
        if above is not None:  # the parent's answer, usually there (a tar lists a directory, then its entries)
            done, todo = list(above), todo[-1:]
        hops = 0
        while todo:
            part = todo.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            host = self._host([*done, part])
            try:
                mode = os.lstat(host).st_mode
            except FileNotFoundError:
                mode = None
            if mode is not None and stat.S_ISLNK(mode):
                hops += 1
                if hops > _MAX_LINKS:
                    raise ImageError(f"layer {layer}: too many levels of symbolic links in {'/'.join(parts)}")
                target = os.readlink(host)
                if target.startswith("/"):
                    done = []
                todo = target.split("/") + todo
                continue
            if mode is None and self._pending and "/".join([*done, part]) in self._pending:
                self._drain()  # a file handed to the writers, not yet created: it is no directory
                todo.insert(0, part)
                continue
            if mode is None:
                if not create:
                    return [*done, part, *todo]
                os.mkdir(host, 0o755)
                self._created("/".join([*done, part]))
                self._touch([*done, part])
                self._fresh.add("/".join([*done, part]))
            elif not stat.S_ISDIR(mode):
                where = entry or "/".join(parts)
                raise ImageError(f"layer {layer}: {where}: {'/'.join([*done, part])} is not a directory")
            done.append(part)
        self._dirs[key] = list(done)
        return done

    def _touch(self, parts: list[str]) -> None:
        key = "/".join(parts)
        while key and key not in self._touched:  # a path in the set has its parents there too
            self._touched.add(key)
            key = key.rpartition("/")[0]

    def _remove(self, parts: list[str]) -> None:
        """Delete what ``parts`` names (never following a final link), with its provenance."""
        if self._pending:
            self._drain()
        host = self._host(parts)
        key = "/".join(parts)
        try:
            mode: int | None = os.lstat(host).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            self._dirs.clear()
            self._fresh.clear()
            self._delete(host, key, directory=True)
            prefix = key + "/"
            for k in [k for k in self.owner if k.startswith(prefix)]:
                del self.owner[k]
        elif mode is not None:
            if stat.S_ISLNK(mode):
                self._dirs.clear()
                self._fresh.clear()
            self._delete(host, key, directory=False)
        self.owner.pop(key, None)

    def _delete(self, host: str, key: str, directory: bool) -> None:
        """Remove the entry ``host``; a journaled layer moves it to the stash instead (one rename)."""
        if self.journal is not None and self._stash is not None:
            name = str(len(self.journal))
            os.rename(host, os.path.join(self._stash, name))
            self.journal.append(["S", key, name])
        elif directory:
            shutil.rmtree(host)
        else:
            os.unlink(host)

    def _opaque(self, parts: list[str]) -> None:
        """Hide what lower layers put under ``parts``: all but what this layer wrote there."""
        host = self._host(parts)
        if not os.path.isdir(host) or os.path.islink(host):
            return
        for name in os.listdir(host):
            child = [*parts, name]
            child_host = self._host(child)
            if "/".join(child) not in self._touched:
                self._remove(child)
            elif os.path.isdir(child_host) and not os.path.islink(child_host):
                self._opaque(child)

    def _link_text(self, parent: list[str], target: str) -> str:
        return link_text(parent, target)

    def _entry(self, tf: tarfile.TarFile | None, member: tarfile.TarInfo, index: int, layer: str) -> None:
        parts = _parts(member.name, layer)
        if not parts:
            return
        base = parts[-1]
        if base.startswith(".wh."):
            if self._pending:
                self._drain()
            parent = self._resolve(parts[:-1], layer)
            if base == ".wh..wh..opq":
                self._opaque(parent)
            elif os.path.isdir(self._host(parent)):
                self._remove([*parent, base[4:]])
            return
        if not (member.isdir() or member.isreg() or member.issym() or member.islnk()):
            self.skipped += 1
            return
        parent = self._resolve(parts[:-1], layer, create=True, entry=member.name)
        here = [*parent, base]
        host = self._host(here)
        if self._pending and (member.islnk() or "/".join(here) in self._pending):
            self._drain()  # a hard link's source, or this very path, may be a file not yet written
        if member.isdir():
            try:
                os.mkdir(host, 0o755)
                self._created("/".join(here))
                self._fresh.add("/".join(here))
            except FileExistsError:  # a directory stays (its contents with it); anything else is replaced
                if not stat.S_ISDIR(os.lstat(host).st_mode):
                    self._remove(here)
                    os.mkdir(host, 0o755)
                    self._created("/".join(here))
            self._touch(here)
            return
        if member.islnk():
            source = _parts(member.linkname, layer)
            if not source:
                raise ImageError(f"layer {layer}: hard link {member.name!r} to the image root")
            src = [*self._resolve(source[:-1], layer), source[-1]]
            src_host = self._host(src)
            if not os.path.lexists(src_host) or (os.path.isdir(src_host) and not os.path.islink(src_host)):
                raise ImageError(f"layer {layer}: hard link {member.name!r} to {member.linkname!r}, which is no file")
            if src == here:
                return
            self._create(here, lambda: os.link(src_host, host, follow_symlinks=False))
        elif member.issym():
            text = self._link_text(parent, member.linkname)
            self._create(here, lambda: os.symlink(text, host))
        else:
            self._write(tf, member, host, here)
        self.owner["/".join(here)] = index
        self._touch(here)

    def _new(self, here: list[str], host: str) -> bool:
        """Whether nothing is at ``here``: under a directory this layer created and not written by it, else
        as lstat says."""
        key = "/".join(here)
        if key.rpartition("/")[0] in self._fresh and key not in self._touched:
            return True
        try:
            os.lstat(host)
        except FileNotFoundError:
            return True
        return False

    def _create(self, here: list[str], make: Any) -> Any:
        """``make()`` creating the entry ``here`` exclusively; what was there (a lower layer's file, link or
        directory) is removed first when it fails for that: one system call for a new path, the usual case."""
        try:
            made = make()
        except FileExistsError:
            self._remove(here)
            made = make()
        self._created("/".join(here))
        return made

    def _write(self, tf: tarfile.TarFile | None, member: tarfile.TarInfo, host: str, here: list[str]) -> None:
        mode = (member.mode & 0o755) | 0o600
        if self._pool is not None and self._source is not None and not member.issparse() and self._new(here, host):
            # the usual case: created and filled by a writer thread
            src, base = self._source
            if len(self._pending) >= _PENDING:  # wait for the oldest
                oldest = next(iter(self._pending))
                self._pending.pop(oldest).result()
            self._pending["/".join(here)] = self._pool.submit(
                _write_new, host, src, base + member.offset_data, member.size, mode, member.name, self._kept
            )
            self._created("/".join(here))
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = self._create(here, lambda: os.open(host, flags, 0o600))
        with os.fdopen(fd, "wb") as out:
            if self._source is not None and not member.issparse():
                src, base = self._source
                if copy_range(src, fd, base + member.offset_data, member.size) != member.size:
                    raise EOFError(f"the layer ends inside {member.name}")
            elif tf is not None:
                data = tf.extractfile(member)
                if data is not None:
                    shutil.copyfileobj(data, out, _CHUNK)
            os.fchmod(fd, mode)

    def _apply_headers(self, fd: int, base: int, size: int, index: int, layer: str) -> int | None:
        """Apply the members :func:`read_members` reads; the offset of the first it leaves to tarfile, None
        when it read them all."""
        try:
            for member in read_members(fd, base, size):
                self._entry(None, member, index, layer)
        except Handover as e:
            return e.offset
        return None

    def _apply_in_place(self, path: str, base: int, size: int, layer: Layer, index: int) -> bool:
        """Apply a plain (uncompressed) layer tar that lies at ``[base, base + size)`` of the file ``path``
        without streaming its bytes through Python: its headers are read in place and each file's data copied
        by the kernel while a second thread computes its digest (hashlib and pread release the GIL: the two
        passes overlap on two cores). The digests are checked before anything is reported, so a layer whose
        bytes are not its descriptor's fails as such, whatever else is wrong with it; a failure leaves the
        half-built root to the caller, which removes it. False (nothing done) when the blob is compressed:
        the stream reader takes it."""
        with open(path, "rb") as f:
            fd = f.fileno()
            if os.pread(fd, 4, base).startswith((_GZIP, _ZSTD)):
                return False
            stop = threading.Event()
            hashed: list[tuple[str, int] | OSError] = []

            def hash_layer() -> None:
                try:
                    hashed.append(_digest_range(fd, base, size, stop))
                except OSError as e:
                    hashed.append(e)

            worker = threading.Thread(target=hash_layer, daemon=True)
            worker.start()
            self._kept = _keep_layer(path, self._layers) if self._layers is not None else None
            if self._kept is not None:
                self.kept[self._kept.path] = [self._kept.stat.st_size, self._kept.stat.st_mtime_ns]
                if self._kept.new:
                    self.linked.append(self._kept.path)
            failure: ImageError | None = None
            self._source = (fd, base)
            self._pool = ThreadPoolExecutor(_WRITERS, thread_name_prefix="cudastack-layer")
            try:
                rest = self._apply_headers(fd, base, size, index, layer.name)
                if rest is not None:  # a member tarfile reads: tarfile reads the rest of the layer
                    self._source = (fd, base + rest)
                    # the rest of the layer as a seekable file (tarfile's random access skips each member's data)
                    window = Span(fd, base + rest, size - rest).stream()
                    with tarfile.open(fileobj=window, mode="r:") as tf:
                        member = tf.firstmember  # type: ignore[attr-defined]  # read by open(), not in the stubs
                        while member is not None:
                            self._entry(tf, member, index, layer.name)
                            tf.members.clear()  # type: ignore[attr-defined]  # not kept: a layer may hold a million entries
                            member = tf.next()
                self._drain()
            except ImageError as e:
                failure = e
            except (tarfile.TarError, EOFError, OSError, ValueError) as e:
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
                failure = ImageError(f"layer {layer.name}: truncated or corrupt layer: {why}")
                failure.__cause__ = e
            except BaseException:
                stop.set()  # interrupted: the digest is not wanted
                raise
            finally:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
                self._pending = {}
                self._source = None
                self._kept = None
                worker.join()
        if not hashed or isinstance(hashed[0], OSError):
            reason = hashed[0].strerror if hashed and isinstance(hashed[0], OSError) else None
            raise ImageError(f"layer {layer.name}: cannot read the layer: {reason or 'the read failed'}")
        digest, got = hashed[0]
        _check_digests(layer, digest, got, digest)
        if failure is not None:
            raise failure
        return True

    def apply(self, store: BlobStore, layer: Layer, index: int) -> None:
        """Apply ``layer`` (read from ``store``), checking its blob digest and size (its descriptor's) and its
        uncompressed digest (the config's diff_id); ImageError naming the layer for any failure."""
        self._touched.clear()
        self._dirs.clear()
        self._fresh.clear()
        located = store.locate(layer.member)
        if located is not None and self._apply_in_place(*located, layer, index):
            return
        with store.open(layer.member) as blob:
            raw = _Hashing(blob)
            try:
                stream, compressed = _decompressor(raw, layer)
                plain = _Hashing(stream, hashing=compressed)
                # 64 KiB reads: tarfile's default (10 KiB) costs a Python call per 10 KiB of a multi-GB layer,
                # a larger buffer is re-sliced on each 512-byte header read
                with tarfile.open(fileobj=plain, mode="r|", bufsize=_TAR_BUFFER) as tf:  # type: ignore[call-overload]
                    for member in tf:
                        self._entry(tf, member, index, layer.name)
                plain.drain()
                raw.drain()
            except ImageError:
                raise
            except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as e:
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
                raise ImageError(f"layer {layer.name}: truncated or corrupt layer: {why}") from e
        _check_digests(layer, raw.digest, raw.size, plain.digest if compressed else raw.digest)
