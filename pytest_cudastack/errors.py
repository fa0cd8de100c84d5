"""The one exception tree of pytest-cudastack.

Absent facts (no driver, a soname not found) are results, never exceptions; these are raised only for
malformed input the caller handed us.
"""

from __future__ import annotations

__all__ = [
    "CudaStackError",
    "DataError",
    "ElfError",
    "LdCacheError",
    "OptionError",
    "RuleError",
    "UnreadableFile",
]


class CudaStackError(Exception):
    """Root of every error pytest-cudastack raises on purpose."""


class UnreadableFile(CudaStackError):
    """A file we were pointed at cannot be read: missing, not a regular file (a FIFO, a device, a
    directory), over a size cap, not this user's alone (a cache), or an I/O error. The message names the file
    and what is wrong. Raised by :mod:`pytest_cudastack._sysio` for snapshots, caches and ``/proc`` files;
    callers turn it into their own terms (a snapshot's :class:`DataError`, a cache turned off)."""


class ElfError(UnreadableFile, ValueError):
    """A file is not a readable ELF object; the message names the file and what is wrong. An
    :class:`UnreadableFile` (an ELF reader that cannot open its file raises this), so that catching
    ``UnreadableFile`` covers both a file that cannot be read and one that is no ELF object."""


class LdCacheError(CudaStackError, ValueError):
    """An ld.so.cache file is malformed."""


class DataError(CudaStackError, ValueError):
    """The shipped compatibility data (or a snapshot) failed validation; names the file and the row."""


class RuleError(CudaStackError, ValueError):
    """A marker or requirement was used wrongly (bad specifier, missing argument)."""


class OptionError(CudaStackError, ValueError):
    """An option or ini value is invalid; the message names the option."""
