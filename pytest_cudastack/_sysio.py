"""The ground floor's file-system primitives: every layer reads and writes files through these.

Inspected files are hostile until proven otherwise: a FIFO named like a library must not hang a run, a
device must not be read forever, and a cache must never be half written. So every read opens with
``O_NONBLOCK`` and insists on a regular file, reads are size-capped, and writes go to a private temporary
file that replaces the target in one ``os.replace``. This module imports nothing but what the interpreter's
start has loaded already and ``mmap`` (``cudastack tree``'s warm path imports it), and it never logs: callers
decide what a failure means.

A file of an image's cached root may be a *layer-backed placeholder*: an image's multi-GB libraries are not
copied out of its layer tars (that write, the same as ``tar -x``'s, would be most of a cold check's cost), so
the file is created sparse, at its size, with the extended attribute :data:`LAYER_XATTR` naming where its
bytes lie in a layer blob the cache holds a hard link to. :func:`open_span` reads such a file in place: its
:class:`Span` is the blob's descriptor and the file's range in it, so the byte readers (ELF, fatbin, strings,
hashes) read the same bytes at the same offsets as from the file itself. :func:`open_regular`, for readers that
need a plain descriptor, fills the placeholder from its blob first (once: the attribute is removed after).
"""

from __future__ import annotations

import errno
import io
import mmap
import os
import stat
from collections.abc import Iterator

from pytest_cudastack.errors import ElfError, UnreadableFile

__all__ = [
    "LAYER_XATTR",
    "Span",
    "append_text",
    "copy_range",
    "make_placeholder",
    "open_regular",
    "open_span",
    "output_problem",
    "read_cpuinfo_block",
    "read_owned",
    "read_regular",
    "read_text",
    "real_path",
    "untrusted_dir",
    "write_atomic",
]

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

# "OFFSET SIZE MTIME_NS PATH": the file's bytes are PATH's [OFFSET, OFFSET + st_size), PATH being a layer blob
# of SIZE bytes last modified at MTIME_NS (a blob changed since, e.g. an archive saved again over the same
# inode, is refused, never read as the file)
LAYER_XATTR = "user.cudastack.layer"
_MAX_XATTR = 4096


class Span:
    """A regular file's bytes: ``size`` of them from ``base`` of the descriptor ``fd`` (0 for a file read
    directly, the file's offset in its blob for a layer-backed placeholder). Reads never go past the file's
    end, so a reader that reads to EOF stops where the file stops, not in the next tar member."""

    __slots__ = ("base", "fd", "size")

    def __init__(self, fd: int, base: int, size: int) -> None:
        self.fd = fd
        self.base = base
        self.size = size

    def pread(self, n: int, offset: int) -> bytes:
        """At most ``n`` bytes from ``offset`` of the file (fewer at its end, none past it)."""
        n = min(n, self.size - offset)
        if n <= 0 or offset < 0:
            return b""
        return os.pread(self.fd, n, self.base + offset)

    def chunks(self, n: int = 1 << 20) -> Iterator[bytes]:
        """The file's bytes in order, ``n`` at a time."""
        offset = 0
        while chunk := self.pread(n, offset):
            offset += len(chunk)
            yield chunk

    def stream(self) -> io.BufferedReader:
        """A buffered, seekable binary stream of the file, for readers that take a file object (pyelftools);
        closing it leaves ``fd`` open."""
        return io.BufferedReader(_SpanRaw(self), 4096)

    def map(self) -> tuple[mmap.mmap, int]:
        """The file mapped read-only, and where the file starts in the mapping: 0 for a file, the offset of
        ``base`` in its page for a placeholder (a mapping starts on a page boundary, a tar member on a
        512-byte one). The caller closes the mapping."""
        shift = self.base % mmap.ALLOCATIONGRANULARITY
        view = mmap.mmap(self.fd, self.size + shift, access=mmap.ACCESS_READ, offset=self.base - shift)
        return view, shift

    def close(self) -> None:
        os.close(self.fd)


class _SpanRaw(io.RawIOBase):
    def __init__(self, span: Span) -> None:
        super().__init__()
        self._span = span
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self._span.pread(len(buffer), self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._span.size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


def make_placeholder(fd: int, size: int, offset: int, blob: str, blob_st: os.stat_result) -> bool:
    """Make the new, empty file ``fd`` a placeholder of ``size`` bytes lying at ``offset`` of ``blob`` (whose
    status is ``blob_st``); False (nothing done) where the blob ends before them or the file system takes no
    extended attribute."""
    value = f"{offset} {blob_st.st_size} {blob_st.st_mtime_ns} {blob}".encode()
    if len(value) > _MAX_XATTR or offset + size > blob_st.st_size:
        return False
    try:
        os.setxattr(fd, LAYER_XATTR, value)
    except OSError:
        return False
    os.ftruncate(fd, size)
    return True


def copy_range(src: int, dst: int, offset: int, count: int) -> int:
    """Copy ``count`` bytes of ``src`` from ``offset`` to ``dst`` (at its position) in the kernel
    (copy_file_range, else pread/write); the bytes copied (fewer: the source ends early)."""
    done = 0
    while done < count:
        try:
            n = os.copy_file_range(src, dst, count - done, offset + done)
        except OSError:  # not on this file system or kernel: through user space
            data = os.pread(src, min(1 << 20, count - done), offset + done)
            n = os.write(dst, data) if data else 0
        if n <= 0:
            break
        done += n
    return done


def _sparse(st: os.stat_result) -> bool:
    """Fewer bytes allocated than the file holds: a placeholder (its blocks, if any, are its attribute's)."""
    return st.st_blocks * 512 < st.st_size


def _backing(fd: int, st: os.stat_result) -> tuple[int, int, int, str] | None:
    """``(offset, blob size, blob mtime_ns, blob)`` of a layer-backed placeholder (see the module's
    docstring), None for any other file. Only a sparse file is asked (one ``fgetxattr``; a file whose bytes
    are allocated never is), and only one this user owns: an attribute on anyone else's file is ignored."""
    if not _sparse(st) or st.st_uid != os.geteuid():
        return None
    try:
        value = os.getxattr(fd, LAYER_XATTR)
    except OSError:  # no attribute, or a file system without them
        return None
    try:
        offset, size, mtime, blob = value[:_MAX_XATTR].decode().split(" ", 3)
        return int(offset), int(size), int(mtime), blob
    except (UnicodeDecodeError, ValueError):
        return None


def _open_blob(path: str, backing: tuple[int, int, int, str], st: os.stat_result, error: type[UnreadableFile]) -> int:
    """The blob's descriptor, checked: this user's regular file, of the size and time recorded, holding the
    placeholder's whole range."""
    offset, size, mtime, blob = backing
    bfd, bst = open_regular(blob, error, fill=False)
    same = bst.st_uid == os.geteuid() and bst.st_size == size and bst.st_mtime_ns == mtime
    if not same or offset < 0 or offset + st.st_size > size:
        os.close(bfd)
        raise error(f"{path}: the image layer it lies in ({blob}) changed since it was read: check with --no-cache")
    return bfd


def open_span(path: str, error: type[UnreadableFile] = ElfError) -> tuple[Span, os.stat_result]:
    """:func:`open_regular`, read in place where the file is a layer-backed placeholder: the file's bytes as a
    :class:`Span` and the file's own status (its size, identity and times). The caller closes the span."""
    fd, st = open_regular(path, error, fill=False)
    backing = _backing(fd, st)
    if backing is None:
        return Span(fd, 0, st.st_size), st
    os.close(fd)
    return Span(_open_blob(path, backing, st, error), backing[0], st.st_size), st


def _fill(path: str, fd: int, st: os.stat_result, error: type[UnreadableFile]) -> None:
    """Write a placeholder's bytes from its blob (then drop the attribute), for a reader that needs a plain
    descriptor. Two runs filling one file write the same bytes."""
    backing = _backing(fd, st)
    if backing is None:
        return
    bfd = _open_blob(path, backing, st, error)
    try:
        wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        os.close(bfd)
        raise error(f"{path}: cannot fill from its image layer: {e.strerror or e}") from e
    try:
        if copy_range(bfd, wfd, backing[0], st.st_size) != st.st_size:
            raise OSError(errno.EIO, "the layer ends early")
        os.removexattr(wfd, LAYER_XATTR)
    except OSError as e:
        raise error(f"{path}: cannot fill from its image layer: {e.strerror or e}") from e
    finally:
        os.close(wfd)
        os.close(bfd)


def open_regular(path: str, error: type[UnreadableFile] = ElfError, fill: bool = True) -> tuple[int, os.stat_result]:
    """Open without blocking (a FIFO named like a library must not hang us) and insist on a regular
    file; returns (fd, stat). The caller closes fd. Raises *error* naming the file: by default ElfError,
    for the ELF readers (each inspects a file it was pointed at, and says so in its own terms); this
    module's readers of snapshots, caches and ``/proc`` files pass :class:`UnreadableFile`. A layer-backed
    placeholder is filled first (``fill``), so that the descriptor reads the file's bytes."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise error(f"{path}: cannot open: {e.strerror or e}") from e
    except ValueError as e:  # an embedded NUL byte
        raise error(f"{path!r}: cannot open: {e}") from e
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise error(f"{path}: cannot stat: {e.strerror or e}") from e
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "is a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise error(f"{path}: {kind}")
    if fill and _sparse(st):
        try:
            _fill(path, fd, st, error)
        except BaseException:
            os.close(fd)
            raise
    return fd, st


def read_text(path: str, limit: int = 64 << 20) -> str | None:
    """Text of a regular file (at most *limit* bytes), None when missing, unreadable or not a regular
    file. Never blocks on a FIFO, never raises."""
    try:
        fd, _st = open_regular(path, UnreadableFile)
    except UnreadableFile:
        return None
    try:
        chunks: list[bytes] = []
        total = 0
        while total < limit:
            b = os.read(fd, min(1 << 20, limit - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
        return b"".join(chunks).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _foreign(st: os.stat_result) -> str | None:
    """Why a file or directory with this status is not this user's alone (None when it is)."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def untrusted_dir(directory: str) -> str | None:
    """Why *directory* cannot hold a cache this process trusts: it exists and is not a directory, or is owned
    by another user, or is writable by its group or others (where anyone could plant a forged entry, or
    replace ours). None when it is this user's alone, or does not exist (it is created private)."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{directory}: cannot stat: {e}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory}: not a directory"
    why = _foreign(st)
    return None if why is None else f"{directory}: {why}"


def read_owned(path: str, limit: int) -> bytes | None:
    """The bytes of a cache file this process may trust, None when it does not exist. Raises UnreadableFile
    naming the file otherwise: not a regular file (a FIFO or ``/dev/zero`` is refused at open, never read), owned by
    another user or writable by its group or others (see :func:`untrusted_dir`), over *limit* bytes, or
    unreadable. Never blocks."""
    try:
        fd, st = open_regular(path, UnreadableFile)
    except UnreadableFile as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return None
        raise
    try:
        why = _foreign(st)
        if why is not None:
            raise UnreadableFile(f"{path}: {why}")
        return _read_capped(fd, st, path, limit)
    finally:
        os.close(fd)


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of a regular file we were pointed at (a snapshot, a baseline): UnreadableFile naming the
    file when it is missing, not a regular file (a FIFO is refused at open, never waited on), over *limit*
    bytes, or unreadable. Never blocks."""
    fd, st = open_regular(path, UnreadableFile)
    try:
        return _read_capped(fd, st, path, limit)
    finally:
        os.close(fd)


def _read_capped(fd: int, st: os.stat_result, path: str, limit: int) -> bytes:
    if st.st_size > limit:
        raise UnreadableFile(f"{path}: larger than {limit} bytes")
    try:
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
    except OSError as e:
        raise UnreadableFile(f"{path}: cannot read: {e.strerror or e}") from e
    if total > limit:  # it grew after the fstat
        raise UnreadableFile(f"{path}: larger than {limit} bytes")
    return b"".join(chunks)


def read_cpuinfo_block(path: str = "/proc/cpuinfo", limit: int = 1 << 16) -> str | None:
    """The first block of *path* (its text up to the first blank line: /proc/cpuinfo's first processor),
    read no further. The whole file grows with the CPU count and the kernel generates every block it is
    asked for (on some kernels sampling each CPU's frequency), while the first processor's vendor and
    flags are all the search needs. At most *limit* bytes; None when it cannot be read. Never blocks,
    never raises."""
    try:
        fd, _st = open_regular(path, UnreadableFile)
    except UnreadableFile:
        return None
    try:
        buf = b""
        while len(buf) < limit:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            start = max(0, len(buf) - 1)  # a blank line may straddle two reads
            buf += chunk
            end = buf.find(b"\n\n", start)
            if end >= 0:
                buf = buf[: end + 1]
                break
        return buf[:limit].decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def output_problem(path: str, append: bool = False) -> str | None:
    """Why *path* cannot be an output file we write, None when it can: it exists and is not a regular file
    (a directory, FIFO, socket or device; for *append*, a symbolic link too: appending would write through
    it, while :func:`write_atomic` replaces the link itself), or its directory is missing (for *append*;
    ``write_atomic`` creates it) or is not a writable directory. Checked before a run, so that a bad path is
    a usage error then, not a lost result at its end."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # the walk up below says which part is missing or a file
        st = None
    except (OSError, ValueError) as e:
        return f"cannot stat: {getattr(e, 'strerror', None) or e}"
    if st is not None and not stat.S_ISREG(st.st_mode) and (append or not stat.S_ISLNK(st.st_mode)):
        return f"is {_kind(st.st_mode)}, not a regular file"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        if append:
            return f"its directory {parent} does not exist"
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {parent} is not writable"
    return None


def append_text(path: str, text: str) -> OSError | None:
    """Append *text* to the regular file *path* (created, mode 0666 less the umask, when missing; its
    directory must exist): ``O_APPEND`` (GitHub's step summary is a file every step appends to),
    ``O_NONBLOCK`` (a FIFO without a reader fails with ENXIO instead of waiting), ``O_NOFOLLOW`` (a symbolic
    link is refused). Returns the I/O error instead of raising it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)  # less the umask, as open() does
    except OSError as e:
        return e
    except ValueError as e:  # an embedded NUL byte
        return OSError(errno.EINVAL, str(e), path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return OSError(errno.EINVAL, f"is {_kind(st.st_mode)}, not a regular file", path)
        data = text.encode("utf-8", errors="backslashreplace")
        while data:
            data = data[os.write(fd, data) :]
    except OSError as e:
        return e
    finally:
        os.close(fd)
    return None


def write_atomic(directory: str, file: str, text: str, mode: int = 0o600) -> OSError | None:
    """Write *text* to *file* in *directory* (created when missing) atomically: a new temporary file
    (``O_EXCL | O_NOFOLLOW``, created with *mode* less the umask, as ``open()`` creates a file: 0600, a
    private cache, by default; 0666 for a user's output file), then ``os.replace``, which replaces a symbolic
    link at *file* rather than writing through it. A *file* that exists and is neither a regular file nor a
    symbolic link (a directory, a FIFO, a device) is left alone: the error says what it is. Returns the I/O
    error instead of raising it, so that each caller words the warning for what it was writing."""
    try:
        st = os.lstat(file)
    except OSError:
        st = None
    except ValueError as e:  # an embedded NUL byte
        return OSError(errno.EINVAL, str(e), file)
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        return OSError(errno.EEXIST, f"is {_kind(st.st_mode)}, not a regular file", file)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = _mkstemp(directory, mode)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, file)
        except BaseException:
            try:  # noqa: SIM105 - contextlib is not imported on the warm path
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        return e
    return None


def _mkstemp(directory: str, mode: int = 0o600) -> tuple[int, str]:
    """A new file in *directory* (*mode* less the umask), as tempfile.mkstemp makes it, without importing
    tempfile (random, shutil, ...) on every run that writes a cache."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    for attempt in range(100):
        name = os.path.join(directory, f".cudastack-{os.getpid()}-{os.urandom(6).hex()}.tmp")
        try:
            return os.open(name, flags, mode), name
        except FileExistsError:
            if attempt == 99:
                raise
    raise FileExistsError(directory)  # pragma: no cover


def real_path(path: str, dirs: dict[str, str]) -> str:
    """``os.path.realpath(os.path.abspath(path))``, resolving each directory once: the real path of
    ``D/NAME`` is that of ``D`` plus ``/NAME`` when NAME is not a symbolic link, which is what realpath
    computes component by component. *dirs* memoises directories for one run (the caller owns it)."""
    path = os.path.abspath(path)
    d, _, base = path.rpartition("/")
    if not d or base in ("", ".", "..") or os.path.islink(path):
        return os.path.realpath(path)
    real = dirs.get(d)
    if real is None:
        real = dirs[d] = os.path.realpath(d)
    return ("" if real == "/" else real) + "/" + base
