"""The ground floor's file-system primitives: every layer reads and writes files through these.

Inspected files are hostile until proven otherwise: a FIFO named like a library must not hang a run, a
device must not be read forever, and a cache must never be half written. So every read opens with
``O_NONBLOCK`` and insists on a regular file, reads are size-capped, and writes go to a private temporary
file that replaces the target in one ``os.replace``. This module imports nothing but ``os`` and ``stat``
(``cudastack tree``'s warm path imports it), and it never logs: callers decide what a failure means.
"""

from __future__ import annotations

import os
import stat

from pytest_cudastack.errors import ElfError

__all__ = [
    "open_regular",
    "read_cpuinfo_block",
    "read_owned",
    "read_text",
    "real_path",
    "untrusted_dir",
    "write_atomic",
]

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """Open without blocking (a FIFO named like a library must not hang us) and insist on a regular
    file; returns (fd, stat). The caller closes fd. Raises ElfError naming the file: every caller inspects
    a file it was pointed at, and says so in its own terms."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise ElfError(f"{path}: cannot open: {e.strerror or e}") from e
    except ValueError as e:  # an embedded NUL byte
        raise ElfError(f"{path!r}: cannot open: {e}") from e
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise ElfError(f"{path}: cannot stat: {e.strerror or e}") from e
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "is a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ElfError(f"{path}: {kind}")
    return fd, st


def read_text(path: str, limit: int = 64 << 20) -> str | None:
    """Text of a regular file (at most *limit* bytes), None when missing, unreadable or not a regular
    file. Never blocks on a FIFO, never raises."""
    try:
        fd, _st = open_regular(path)
    except ElfError:
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
    """The bytes of a cache file this process may trust, None when it does not exist. Raises ElfError naming
    the file otherwise: not a regular file (a FIFO or ``/dev/zero`` is refused at open, never read), owned by
    another user or writable by its group or others (see :func:`untrusted_dir`), over *limit* bytes, or
    unreadable. Never blocks."""
    try:
        fd, st = open_regular(path)
    except ElfError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return None
        raise
    try:
        why = _foreign(st)
        if why is not None:
            raise ElfError(f"{path}: {why}")
        if st.st_size > limit:
            raise ElfError(f"{path}: larger than {limit} bytes")
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
        if total > limit:  # it grew after the fstat
            raise ElfError(f"{path}: larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as e:
        raise ElfError(f"{path}: cannot read: {e.strerror or e}") from e
    finally:
        os.close(fd)


def read_cpuinfo_block(path: str = "/proc/cpuinfo", limit: int = 1 << 16) -> str | None:
    """The first block of *path* (its text up to the first blank line: /proc/cpuinfo's first processor),
    read no further. The whole file grows with the CPU count and the kernel generates every block it is
    asked for (on some kernels sampling each CPU's frequency), while the first processor's vendor and
    flags are all the search needs. At most *limit* bytes; None when it cannot be read. Never blocks,
    never raises."""
    try:
        fd, _st = open_regular(path)
    except ElfError:
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


def write_atomic(directory: str, file: str, text: str) -> OSError | None:
    """Write *text* to *file* in *directory* (created when missing) atomically: a private temporary file
    (``O_EXCL | O_NOFOLLOW``, mode 0600), then ``os.replace``. Returns the I/O error instead of raising it,
    so that each caller words the warning for what it was writing."""
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = _mkstemp(directory)
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


def _mkstemp(directory: str) -> tuple[int, str]:
    """A new private file in *directory*, as tempfile.mkstemp makes it, without importing tempfile
    (random, shutil, ...) on every run that writes a cache."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    for attempt in range(100):
        name = os.path.join(directory, f".cudastack-{os.getpid()}-{os.urandom(6).hex()}.tmp")
        try:
            return os.open(name, flags, 0o600), name
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
