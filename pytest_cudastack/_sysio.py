"""The ground floor's file-system primitives: every layer reads and writes files through these.

Inspected files are hostile until proven otherwise: a FIFO named like a library must not hang a run, a
device must not be read forever, and a cache must never be half written. So every read opens with
``O_NONBLOCK`` and insists on a regular file, reads are size-capped, and writes go to a private temporary
file that replaces the target in one ``os.replace``. This module imports nothing but ``os``, ``stat`` and ``errno``
(``cudastack tree``'s warm path imports it), and it never logs: callers decide what a failure means.
"""

from __future__ import annotations

import errno
import os
import stat

from pytest_cudastack.errors import ElfError, UnreadableFile

__all__ = [
    "append_text",
    "open_regular",
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


def open_regular(path: str, error: type[UnreadableFile] = ElfError) -> tuple[int, os.stat_result]:
    """Open without blocking (a FIFO named like a library must not hang us) and insist on a regular
    file; returns (fd, stat). The caller closes fd. Raises *error* naming the file: by default ElfError,
    for the ELF readers (each inspects a file it was pointed at, and says so in its own terms); this
    module's readers of snapshots, caches and ``/proc`` files pass :class:`UnreadableFile`."""
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
