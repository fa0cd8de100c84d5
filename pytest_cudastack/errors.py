"""The one exception tree of pytest-cudastack.

Absent facts (no driver, a soname not found) are results, never exceptions; these are raised only for
malformed input the caller handed us.
"""

from __future__ import annotations

__all__ = ["CudaStackError", "DataError", "ElfError", "LdCacheError", "OptionError", "RuleError"]


class CudaStackError(Exception):
    """Root of every error pytest-cudastack raises on purpose."""


class ElfError(CudaStackError, ValueError):
    """A file is not a readable ELF object; the message names the file and what is wrong."""


class LdCacheError(CudaStackError, ValueError):
    """An ld.so.cache file is malformed."""


class DataError(CudaStackError, ValueError):
    """The shipped compatibility data (or a snapshot) failed validation; names the file and the row."""


class RuleError(CudaStackError, ValueError):
    """A marker or requirement was used wrongly (bad specifier, missing argument)."""


class OptionError(CudaStackError, ValueError):
    """An option or ini value is invalid; the message names the option."""
