"""On-disk cache of parsed ELF facts, keyed by (path, st_dev, st_ino, st_size, st_mtime_ns).

One JSON file (``elfcache-v1.json``) in ``$CUDASTACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/pytest-cudastack``,
else ``~/.cache/pytest-cudastack``. ``CUDASTACK_NO_CACHE=1`` disables it. The file is written atomically
(temporary file + ``os.replace``). A file that is not valid JSON, has another schema or version, or holds
malformed entries is ignored (entry by entry) and rebuilt, never trusted. Read errors are cached too, so a
broken file is not re-parsed on every run while it is unchanged. Besides ELF facts the file holds ``extra``
values other layers store and validate themselves (the owners ``cudastack tree`` looked up), so a warm run
reads one file.

A second entry kind, dynamic symbol facts (:func:`~pytest_cudastack.linker.symbols.read_symbols`, for the
``symbols`` check), is keyed and validated the same way but kept in its own file (``symcache-v1.json``) next
to the first, read only when symbols are first asked for: it is tens of megabytes for a torch venv, which
``cudastack tree``'s warm path and every other check must not parse.

There is no process-wide cache: the owner of a run (the pytest session's ``Stack``, a ``cudastack``
subcommand) creates one :class:`ElfCache`, hands its :meth:`ElfCache.read` down to every layer that parses
ELF files, and flushes it once. Two caches flushing one file would each overwrite the other's entries.
"""

from __future__ import annotations

import json
import os

from pytest_cudastack._sysio import read_owned, untrusted_dir, write_atomic
from pytest_cudastack.errors import ElfError, UnreadableFile

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~5 ms) on tree's warm path
if TYPE_CHECKING:
    import logging
    from collections.abc import Callable
    from typing import Any, Protocol, TypeVar

    from pytest_cudastack.linker.elf import ElfInfo
    from pytest_cudastack.linker.fatbin import Fatbin
    from pytest_cudastack.linker.strings import StringFacts
    from pytest_cudastack.linker.symbols import SymbolFacts
    from pytest_cudastack.linker.toolversion import ToolVersion

    class _Storable(Protocol):
        @property
        def path(self) -> str: ...

        def to_json(self) -> dict[str, Any]: ...

    _Fact = TypeVar("_Fact", bound=_Storable)

__all__ = ["CACHE_FILE", "SYMBOL_CACHE_FILE", "ElfCache", "default_cache_dir"]


def _log() -> logging.Logger:
    """This module's logger, imported when first needed: ``cudastack tree``'s warm path imports this module
    for :func:`default_cache_dir` and :func:`write_atomic` and never logs."""
    # lazy: tree's warm path imports this module and never parses or logs
    import logging

    return logging.getLogger(__name__)


CACHE_FILE = "elfcache-v1.json"
SYMBOL_CACHE_FILE = "symcache-v1.json"
_SCHEMA = "pytest-cudastack-elfcache"
_SYMBOL_SCHEMA = "pytest-cudastack-symcache"
_VERSION = 1

_Key = tuple[int, int, int, int]
MAX_FILE = 256 << 20  # a cache of 100,000 libraries is ~50 MB; a larger file is refused, not read
MAX_SYMBOL_FILE = 1 << 30  # the torch venv's symbol facts are ~55 MB
_MAX_ERROR = 4096  # a cached ElfError message longer than this was not written by read_elf


def default_cache_dir(environ: dict[str, str] | None = None) -> str:
    """``$CUDASTACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/pytest-cudastack``, else ``~/.cache/pytest-cudastack``."""
    env = os.environ if environ is None else environ
    explicit = env.get("CUDASTACK_CACHE_DIR")
    if explicit:
        return explicit
    xdg = env.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pytest-cudastack")


def _encodes(value: Any) -> bool:
    try:
        json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


def _is_error_of(error: Any, path: str) -> bool:
    """Whether a cached error is one read_elf could have raised for *path*: it names the file, fits on a
    line and holds no control characters (the message is printed; the file could have been edited)."""
    return type(error) is str and len(error) <= _MAX_ERROR and error.startswith(path + ":") and error.isprintable()


class ElfCache:
    """Cached :func:`~pytest_cudastack.linker.elf.read_elf`; see the module docstring. ``directory`` defaults
    to :func:`default_cache_dir`, ``enabled`` to ``CUDASTACK_NO_CACHE != "1"``, both as the environment is
    when the cache is created."""

    def __init__(self, directory: str | None = None, enabled: bool | None = None, root: str | None = None) -> None:
        self.directory = directory if directory is not None else default_cache_dir()
        # an image's root: every absolute path read through this cache names a file of the image (a model's
        # path such as /usr/lib/x is read under the root; a path already under it is read as it is)
        self.root = root.rstrip("/") if root is not None and root.rstrip("/") else None
        self.enabled = enabled if enabled is not None else os.environ.get("CUDASTACK_NO_CACHE", "") != "1"
        self.file = os.path.join(self.directory, CACHE_FILE)
        self._entries: dict[str, dict[str, Any]] | None = None
        self._extra: dict[str, Any] = {}
        self._dirty = False
        self.hits = 0
        self.misses = 0
        # facts computed this run, in memory only, kept whether or not the file is used (the cache object
        # is the run's): what several model processes of one run would otherwise compute again
        self.memo: dict[str, Any] = {}
        self.symbol_file = os.path.join(self.directory, SYMBOL_CACHE_FILE)
        self._symbols: dict[str, dict[str, Any]] | None = None
        self._symbols_dirty = False

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is not None:
            return self._entries
        refused = untrusted_dir(self.directory) if self.enabled else None
        if refused is not None:
            self.refuse(refused)
        raw, self._dirty = self._read_file(self.file, _SCHEMA, MAX_FILE, "ELF cache")
        extra = raw.get("extra")
        if isinstance(extra, dict):
            self._extra = extra
        self._entries = {k: v for k, v in raw.get("entries", {}).items() if isinstance(v, dict)}
        return self._entries

    def _read_file(self, file: str, schema: str, limit: int, what: str) -> tuple[dict[str, Any], bool]:
        """The top-level object of one cache file and whether it must be rewritten; ``{}`` (a cache of
        nothing) when the cache is off, the file is missing, refused (not this user's alone, not a regular
        file: the cache goes off for the run), unreadable, or of another schema or version."""
        if not self.enabled:
            return {}, False
        try:
            data = read_owned(file, limit)  # never blocks: a FIFO or a device is refused
        except UnreadableFile as e:
            self.refuse(str(e))
            return {}, False
        if data is None:
            return {}, False
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError, MemoryError) as e:
            _log().info("ignoring unreadable %s %s: %s", what, file, e)
            return {}, True
        if (
            isinstance(raw, dict)
            and raw.get("schema") == schema
            and raw.get("version") == _VERSION
            and isinstance(raw.get("entries"), dict)
        ):
            return raw, False
        _log().info("ignoring foreign or outdated %s %s", what, file)
        return {}, True

    def _slot(self, path: str, host: str) -> str:
        return self.file_slot(host)

    def file_slot(self, host: str) -> str:
        """The name facts about the file ``host`` are kept under (ELF facts, and the extras of other layers
        keyed by a file: its lookups, its imports, its hash): an image file's is its image path
        (``image:/usr/lib/x``), so that the root of an image whose top layer changed, at another directory
        of the cache, finds them; its unchanged files are hard links to the same inodes there, so the
        (device, inode, size, mtime) key each entry carries still holds, and a file that changed is
        another inode: read again."""
        if self.root is None or not host.startswith(self.root + "/"):
            return host
        return "image:" + host[len(self.root) :]

    def in_root(self, path: str) -> str:
        """``path`` as this cache reads it: under ``root`` for an image (see ``__init__``), else as given."""
        if self.root is None or not path.startswith("/") or path.startswith(self.root + "/"):
            return path
        return self.root + path

    @staticmethod
    def _as_asked(path: str, facts: _Fact) -> _Fact:
        """``facts`` read from an image's file, naming it as the model asked (its image path), as a read of
        ``path`` itself would: the checks key what they read by the paths their trees name."""
        if getattr(facts, "path", path) != path:
            # lazy: tree's warm path imports this module and never reads an image (no dataclasses import)
            import dataclasses

            if dataclasses.is_dataclass(facts):
                return dataclasses.replace(facts, path=path)
        return facts

    def refuse(self, why: str) -> None:
        """The cache file or its directory is not this user's alone (or is no regular file): a forged entry
        could decide a check, so the cache is off for this run, with one warning (the first call's; the
        closure cache of the same directory reports its refusal here too)."""
        if self.enabled:
            self.enabled = False
            _log().warning("cache disabled for this run: %s", why)

    def read(self, path: str) -> ElfInfo:
        """Cached read_elf; raises ElfError (errors are cached too)."""
        # lazy: tree's warm path imports this module and never parses or logs
        from pytest_cudastack.linker.elf import ElfInfo, read_elf

        host = self.in_root(path)
        return self._as_asked(
            path, self._cached(host, self._slot(path, host), "info", read_elf, ElfInfo.from_json, symbols=False)
        )

    def fatbin(self, path: str) -> Fatbin:
        """Cached :func:`~pytest_cudastack.linker.fatbin.read_fatbin`, under the same key and rules as
        :meth:`read` (its own entry, ``fatbin:PATH``; errors cached too). Raises ElfError."""
        # lazy: tree's warm path imports this module and never reads GPU code
        from pytest_cudastack.linker.fatbin import Fatbin, read_fatbin

        # the key names the reader's rule (v2: header to header, other data sections only of files with a
        # fatbin section): a fact cached by an earlier rule is not this reader's answer
        host = self.in_root(path)
        return self._as_asked(
            path,
            self._cached(
                host, f"fatbin-v2:{self._slot(path, host)}", "fatbin", read_fatbin, Fatbin.from_json, symbols=False
            ),
        )

    def tool_version(self, path: str) -> ToolVersion:
        """Cached :func:`~pytest_cudastack.linker.toolversion.read_tool_version` (the version line a CUDA tool
        embeds), under the same key and rules as :meth:`read` (its own entry, ``tool:PATH``). Raises ElfError."""
        # lazy: tree's warm path imports this module and never reads compiler tools
        from pytest_cudastack.linker.toolversion import ToolVersion, read_tool_version

        host = self.in_root(path)
        return self._as_asked(
            path,
            self._cached(
                host, f"tool:{self._slot(path, host)}", "tool", read_tool_version, ToolVersion.from_json, symbols=False
            ),
        )

    def read_strings(self, path: str) -> StringFacts:
        """Cached :func:`~pytest_cudastack.linker.strings.read_strings` (library names in read-only data),
        under the same key and rules as :meth:`read` (its own entry, ``strings:PATH``; errors cached too): a
        multi-GB library is scanned once while unchanged. Raises ElfError."""
        # lazy: tree's warm path imports this module and never scans strings
        from pytest_cudastack.linker.strings import StringFacts, read_strings

        host = self.in_root(path)
        return self._as_asked(
            path,
            self._cached(
                host, f"strings:{self._slot(path, host)}", "strings", read_strings, StringFacts.from_json, symbols=False
            ),
        )

    def read_symbols(self, path: str) -> SymbolFacts:
        """Cached :func:`~pytest_cudastack.linker.symbols.read_symbols`, keyed and validated as :meth:`read`
        is, in the symbol file (``symcache-v1.json``: large, so the other readers never parse it); raises
        ElfError (errors are cached too)."""
        # lazy: tree's warm path imports this module and never reads symbols
        from pytest_cudastack.linker.symbols import SymbolFacts, read_symbols

        host = self.in_root(path)
        return self._as_asked(
            path,
            self._cached(host, self._slot(path, host), "symbols", read_symbols, SymbolFacts.from_json, symbols=True),
        )

    def _cached(
        self,
        path: str,
        slot: str,
        field: str,
        parse: Callable[[str], _Fact],
        from_json: Callable[[Any], _Fact],
        *,
        symbols: bool,
    ) -> _Fact:
        """The one cache rule of every kind of fact: an entry is used only while (st_dev, st_ino, st_size,
        st_mtime_ns) of *path* are unchanged, and only when it decodes (``from_json`` raises ElfError on a
        malformed value: a miss, never coerced) to facts about *path*; errors are cached as the message
        the parser raised, and raised again only when they name *path*."""
        if not self.enabled:
            return parse(path)
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return parse(path)  # raises the ElfError naming what is wrong
        key = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
        entries = self._load_symbols() if symbols else self._load()
        hit = entries.get(slot)
        if hit is not None and hit.get("key") == key:
            error = hit.get("error")
            if _is_error_of(error, path):
                self.hits += 1
                raise ElfError(error)
            value = hit.get(field)
            if isinstance(value, dict):
                try:
                    got = from_json(value)
                except ElfError:
                    got = None
                if got is not None and got.path != path and "image:/" in slot:
                    # the same inode, size and mtime under another root of the image: the same file
                    got = self._as_asked(path, got)
                if got is not None and got.path == path:
                    self.hits += 1
                    return got
        self.misses += 1
        try:
            result = parse(path)
        except ElfError as e:
            entries[slot] = {"key": key, "error": str(e)}
            self._mark(symbols)
            raise
        entries[slot] = {"key": key, field: result.to_json()}
        self._mark(symbols)
        return result

    def _mark(self, symbols: bool) -> None:
        if symbols:
            self._symbols_dirty = True
        else:
            self._dirty = True

    def _load_symbols(self) -> dict[str, dict[str, Any]]:
        """The symbol file's entries, read as :meth:`_load` reads the ELF file (the directory's ownership,
        checked there, decides for both files)."""
        if self._symbols is not None:
            return self._symbols
        self._load()
        raw, self._symbols_dirty = self._read_file(self.symbol_file, _SYMBOL_SCHEMA, MAX_SYMBOL_FILE, "symbol cache")
        self._symbols = {k: v for k, v in raw.get("entries", {}).items() if isinstance(v, dict)}
        return self._symbols

    def get_extra(self, key: str) -> Any:
        """A JSON value stored with :meth:`put_extra` (None when absent or the cache is disabled). Callers
        validate what they get: the file may be corrupt."""
        if not self.enabled:
            return None
        self._load()
        return self._extra.get(key)

    def put_extra(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable *value* with the ELF facts (written by :meth:`flush`), for other facts
        that are cheap to validate but dear to compute (e.g. the owners of library paths)."""
        if not self.enabled:
            return
        self._load()
        self._extra[key] = value
        self._dirty = True

    def flush(self) -> None:
        """Write the cache atomically; a no-op when unchanged or disabled. Never raises on I/O errors."""
        if self.enabled and self._symbols_dirty and self._symbols is not None:
            payload = {"schema": _SYMBOL_SCHEMA, "version": _VERSION, "entries": self._symbols}
            error = write_atomic(self.directory, self.symbol_file, json.dumps(payload, separators=(",", ":")))
            if error is not None:
                _log().warning("cannot write symbol cache %s: %s", self.symbol_file, error)
            else:
                self._symbols_dirty = False
        if not self.enabled or not self._dirty or self._entries is None:
            return
        refused = untrusted_dir(self.directory)
        if refused is not None:
            self.refuse(refused)
            return
        try:  # noqa: SIM105 - private from the start: a directory others can write is refused on the next load
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except OSError:
            pass  # write_atomic reports it
        payload = {"schema": _SCHEMA, "version": _VERSION, "entries": self._entries, "extra": self._extra}
        try:  # one C-encoder call, one write
            text = json.dumps(payload, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError):  # a value read from the file nests too deep
            self._extra = {}
            self._entries = {k: v for k, v in self._entries.items() if _encodes(v)}
            payload = {"schema": _SCHEMA, "version": _VERSION, "entries": self._entries, "extra": {}}
            text = json.dumps(payload, separators=(",", ":"))
        error = write_atomic(self.directory, self.file, text)
        if error is not None:
            _log().warning("cannot write ELF cache %s: %s", self.file, error)
        else:
            self._dirty = False
