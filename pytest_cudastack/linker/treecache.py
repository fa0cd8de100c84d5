"""On-disk cache of resolved closures: ``cudastack tree --json``'s rows, valid while what they were read from is.

One JSON file (``treecache-v1.json``) next to the ELF cache (same directory, same ``CUDASTACK_NO_CACHE=1``
switch, same atomic write; a corrupt, foreign or malformed file is ignored and rebuilt, never trusted).

It holds *buckets*, one per search environment (:func:`environment_key`: this package's version and the
sources of the modules that compute an answer, LD_LIBRARY_PATH as given, ``/etc/ld.so.cache``'s status, the
machine, what the CPU decides (``$PLATFORM``, the glibc-hwcaps levels and the legacy hwcap subdirectories,
:func:`pytest_cudastack.linker.hwcaps.host_search`), whether the multiarch directory exists). A bucket holds
a table of *dependencies* and, per root path as given, the row ``tree --json`` printed for it (compact JSON
text), the dependencies it was read from, and the provider context it was printed under. A dependency is:

* ``"s" + path``: the status (:func:`stat_value`: device, inode, size, mode, mtime, ctime; or the errno of a
  failure) of every file the resolution read and every directory whose listing it searched, absent ones
  included (a directory's mtime and ctime change whenever an entry is added, removed or renamed);
* ``"r" + path``: the real path of a library path (normalised, absolute) whose provider was looked up
  (owners are found by real path when the path itself is not in a RECORD);
* ``"c"``: the current directory, when a relative path made the answer depend on it.

A row is printed from the cache only when every one of its dependencies, taken now, equals what was recorded,
so any change to a file or directory the answer was read from (a new library in an earlier search directory,
a replaced library, a new ld.so.cache, another LD_LIBRARY_PATH) recomputes it. Providers depend on the site
directories of the whole invocation: a row's providers are reused only under an equal context (site
directories and the status of their RECORD/METADATA files, :meth:`OwnerIndex.stamp`), else filled again.

Timestamps have a granularity (a kernel tick, or a second on some file systems): a change made in the same
tick as an earlier one may leave a status unchanged. So nothing is stored whose recorded mtime or ctime is
within :data:`RACY_NS` of the moment the resolution started (as git treats "racily clean" index entries): a
later change to such a file gets a later ctime, which the next run sees. Limits: a file system whose clock is
more than :data:`RACY_NS` behind this machine's (a skewed NFS server), and a content change that keeps inode,
size, mtime and ctime (impossible without resetting the clock) go unnoticed.
"""

from __future__ import annotations

import json
import os
import sys
import zlib

from pytest_cudastack import __version__
from pytest_cudastack._sysio import read_owned, real_path, untrusted_dir, write_atomic
from pytest_cudastack.errors import UnreadableFile
from pytest_cudastack.linker.hwcaps import host_search

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~5 ms) on tree's warm path
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CACHE_FILE", "RACY_NS", "TreeCache", "dep_value", "environment_key", "racy", "stat_value"]

CACHE_FILE = "treecache-v1.json"
_SCHEMA = "pytest-cudastack-treecache"
_VERSION = 1
RACY_NS = 2_000_000_000  # a recorded timestamp this close to the start of the run is not trusted
_BUCKETS_KEPT = 4  # search environments remembered
MAX_FILE = 256 << 20  # a larger file is refused, not read
_ENTRY_KEYS = frozenset(("deps", "row", "fail", "ctx", "paths"))
_LIBRARY_KEYS = ["soname", "path", "needed_by", "provider"]  # a row's library object, in Tree.to_json's order
_GPU_LIBRARY_KEYS = [*_LIBRARY_KEYS, "gpu_code"]  # ... with `tree --gpu-code`
# the modules whose code decides a row: a changed source (an upgrade, an edit of an editable install)
# makes every stored row foreign (paths relative to the package root)
_SOURCES = (
    "_sysio.py",
    "linker/elf.py",
    "linker/elfcache.py",
    "linker/hwcaps.py",
    "linker/ldcache.py",
    "linker/resolver.py",
    "wheels/sitepaths.py",
    "linker/treecache.py",
    "cli/tree.py",
    "linker/fatbin.py",  # the rows carry each library's GPU code (cli/tree.py)
    "cuda/gpucode.py",
)


def stat_value(path: str) -> list[int] | int:
    """``[st_dev, st_ino, st_size, st_mode, st_mtime_ns, st_ctime_ns]`` of *path* (symlinks followed), or the
    negative errno when it cannot be stat'ed (absent, not searchable, ...)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return -(e.errno or 1)
    except ValueError:  # an embedded NUL
        return -1
    return [st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns]


def dep_value(key: str, dirs: dict[str, str] | None = None) -> Any:
    """The current value of a dependency key (see the module docstring); *dirs* memoises the real paths of
    directories for ``"r"`` keys."""
    kind = key[:1]
    if kind == "s":
        return stat_value(key[1:])
    if kind == "r":
        try:
            return real_path(key[1:], {} if dirs is None else dirs)
        except (OSError, ValueError):
            return None
    if kind == "c":
        try:
            return os.getcwd()
        except OSError:
            return None
    return None


def racy(value: Any, since_ns: int) -> bool:
    """Whether a recorded status (:func:`stat_value`) is too close to *since_ns* (the start of the run) to
    prove that a later change would alter it."""
    return isinstance(value, list) and max(value[4], value[5]) + RACY_NS > since_ns


def environment_key(environ: dict[str, str] | None = None) -> tuple[str, list[int] | int]:
    """(key, ld.so.cache status): everything outside the files themselves that decides a closure for the
    root ``/`` (the inputs of SearchConfig.from_environment and of the resolver's code)."""
    env = os.environ if environ is None else environ
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ldcache = stat_value("/etc/ld.so.cache")
    key = [
        _VERSION,
        __version__,
        sys.implementation.cache_tag,
        [stat_value(os.path.join(here, name)) for name in _SOURCES],
        env.get("LD_LIBRARY_PATH", ""),
        ldcache,
        os.uname().machine,
        host_search(),  # $PLATFORM, glibc-hwcaps levels, legacy subdirectories: what the CPU decides
        os.path.isdir("/lib/x86_64-linux-gnu"),
    ]
    return json.dumps(key, separators=(",", ":")), ldcache


class TreeCache:
    """The closure cache file of *directory* for one search environment (see the module docstring).

    ``lookup(roots)`` validates the stored rows of *roots* (each dependency taken once); ``store`` records
    new rows; ``flush`` writes the file when something changed. Disabled (``enabled=False``) it stores and
    returns nothing. In memory a bucket is ``keys``/``vals`` (dependency table), ``ctxs`` (provider contexts)
    and ``roots`` (root -> ``{"deps": [index, ...], "row": JSON text, "fail": bool, "ctx": index | None,
    "paths": [index of the ``"r"`` key of each library path, in load order]}``); entries are checked when used,
    the file as a whole by its checksum."""

    def __init__(self, directory: str, env_key: str, enabled: bool = True) -> None:
        self.directory = directory
        self.file = os.path.join(directory, CACHE_FILE)
        self.env_key = env_key
        self.enabled = enabled
        self.writable = True  # False: rows are read, none stored (e.g. ld.so.cache itself is racy)
        self._others: dict[str, Any] = {}  # the other environments' buckets, kept as read
        self._dirty = False
        self.keys: list[str] = []
        self.vals: list[Any] = []
        self.ctxs: list[str] = []
        self.roots: dict[str, Any] = {}
        self._index: dict[str, int] | None = None
        self.now: dict[str, Any] = {}  # dependency values taken during this run
        self._dirs: dict[str, str] = {}  # real paths of directories, taken during this run
        self._after: dict[str, Any] = {}  # dependency values taken when storing, after every resolution
        self._after_dirs: dict[str, str] = {}
        self._blob = ""  # the rows' text, as read
        self.refused: str | None = None  # why the file or directory is not trusted (then: disabled)
        if enabled:
            self._load()

    def _load(self) -> None:
        why = untrusted_dir(self.directory)
        if why is None:
            try:
                data = read_owned(self.file, MAX_FILE)  # never blocks: a FIFO or a device is refused
            except UnreadableFile as e:
                why = str(e)
        if why is not None:
            # not this user's alone: a forged row could decide an answer; off for this run (the ELF cache
            # of the same directory says so: this module does not log on tree's warm path)
            self.refused, self.enabled = why, False
            return
        try:
            if data is None:
                raise FileNotFoundError(self.file)
            # "<crc32 of the rest>\n<JSON header>\n<rows>": a damaged file is not trusted even where it
            # still parses; rows are kept out of the JSON (as [offset, length] into <rows>), so reading the
            # file parses no row
            head, _, body = data.partition(b"\n")
            if head != b"%08x" % zlib.crc32(body):
                raise ValueError("checksum mismatch")
            header, _, blob = body.partition(b"\n")
            raw = json.loads(header)
            self._blob = blob.decode("ascii")
        except FileNotFoundError:
            return
        except (OSError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
            self._dirty = True  # unreadable: rebuilt
            return
        if not (
            isinstance(raw, dict)
            and raw.get("schema") == _SCHEMA
            and raw.get("version") == _VERSION
            and isinstance(raw.get("buckets"), dict)
        ):
            self._dirty = True  # foreign or outdated: rebuilt
            return
        buckets: dict[str, Any] = raw["buckets"]
        mine = buckets.pop(self.env_key, None)
        self._others = buckets
        if mine is None:
            return
        try:
            keys, vals, ctxs, roots = mine["keys"], mine["vals"], mine["ctxs"], mine["roots"]
            if not (
                isinstance(keys, list)
                and isinstance(vals, list)
                and len(keys) == len(vals)
                and all(isinstance(k, str) and k[:1] in ("s", "r", "c") for k in keys)
                and isinstance(ctxs, list)
                and all(isinstance(c, str) for c in ctxs)
                and isinstance(roots, dict)
            ):
                raise TypeError("malformed bucket")
        except (KeyError, TypeError):
            self._dirty = True
            return
        self.keys, self.vals, self.ctxs, self.roots = keys, vals, ctxs, roots

    def value(self, key: str) -> Any:
        """The value of dependency *key* now (taken once per run)."""
        if key in self.now:
            return self.now[key]
        v = self.now[key] = dep_value(key, self._dirs)
        return v

    def _entry(self, root: str) -> dict[str, Any] | None:
        """The stored entry of *root* when well formed (its row as text)."""
        e = self.roots.get(root)
        if not isinstance(e, dict) or not _ENTRY_KEYS.issubset(e):  # ctx_of and lookup index every key
            return None
        ix, row, fail, ctx, paths = e.get("deps"), e.get("row"), e.get("fail"), e.get("ctx"), e.get("paths")
        if isinstance(row, list):  # [offset, length] in the rows read
            if not (len(row) == 2 and type(row[0]) is int and type(row[1]) is int and row[0] >= 0 <= row[1]):
                return None
            row = e["row"] = self._blob[row[0] : row[0] + row[1]]
        if not (
            _indexes(ix, len(self.keys))
            and isinstance(row, str)
            and row.startswith('{"path": ' + json.dumps(root) + ', "libraries": [')
            and row.endswith("]}")
            and type(fail) is bool
            and (ctx is None or (type(ctx) is int and 0 <= ctx < len(self.ctxs)))
            and isinstance(paths, list)
        ):
            return None
        keys, n = self.keys, len(self.keys)
        for i in paths:
            if type(i) is not int or not 0 <= i < n or keys[i][:1] != "r":
                return None
        rebuilt = _row_of(row, root)
        if rebuilt is None:
            return None
        e["row"] = rebuilt
        return e

    def deps_of(self, entry: dict[str, Any]) -> set[str]:
        """The dependency keys of an entry from :meth:`lookup` (the entry holds their indexes)."""
        keys = self.keys
        return {keys[i] for i in entry["deps"]}

    def paths_of(self, entry: dict[str, Any]) -> list[str]:
        """The library paths of an entry from :meth:`lookup`, in load order."""
        keys = self.keys
        return [keys[i][1:] for i in entry["paths"]]

    def lookup(self, roots: list[str]) -> dict[str, dict[str, Any]]:
        """The stored entries of *roots* whose every dependency holds now; each dependency is taken once."""
        if not self.enabled:
            return {}
        entries: dict[str, dict[str, Any]] = {}
        need: set[Any] = set()
        for root in roots:
            e = self._entry(root)
            if e is None:
                continue
            need.update(e["deps"])  # indexes of the bucket's keys (checked by _entry)
            entries[root] = e
        keys, vals = self.keys, self.vals
        bad = set()
        for i in need:
            if self.value(keys[i]) != vals[i]:
                bad.add(i)
        return {r: e for r, e in entries.items() if bad.isdisjoint(e["deps"])}

    def ctx_of(self, entry: dict[str, Any]) -> str | None:
        i = entry["ctx"]
        return self.ctxs[i] if isinstance(i, int) and 0 <= i < len(self.ctxs) else None

    def store(
        self,
        root: str,
        row: str,
        fail: bool,
        paths: list[str],
        deps: set[str] | frozenset[str],
        ctx: str | None,
        since_ns: int,
    ) -> bool:
        """Record *row* for *root*, read from *deps* under provider context *ctx* (None:
        providers are filled again when it is read). Call once every root of the run is resolved: each
        dependency is taken at the first call. Not stored (False) when a dependency is racy or changed
        during this run."""
        if not self.enabled or not self.writable:
            return False
        values: dict[str, Any] = {}
        after = self._after
        for k in deps:
            # taken after the resolution (callers store once every root is resolved, so once per key): a
            # change during it is racy, or differs from the value taken before
            v = after[k] if k in after else after.setdefault(k, dep_value(k, self._after_dirs))
            if racy(v, since_ns) or (k in self.now and self.now[k] != v):
                return False
            values[k] = v
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.keys)}
        index = self._index
        stale: set[int] = set()
        ix: list[int] = []
        for k, v in values.items():
            i = index.get(k)
            if i is None:
                i = index[k] = len(self.keys)
                self.keys.append(k)
                self.vals.append(v)
            elif self.vals[i] != v:  # rows that read the older value are stale
                stale.add(i)
                self.vals[i] = v
            ix.append(i)
        if stale:  # malformed rows go too: whatever another run wrote, pruning reads only lists of indexes
            n = len(self.keys)
            self.roots = {
                r: e
                for r, e in self.roots.items()
                if isinstance(e, dict) and _indexes(e.get("deps"), n) and stale.isdisjoint(e["deps"])
            }
        cix: int | None = None
        if ctx is not None:
            if ctx not in self.ctxs:
                self.ctxs.append(ctx)
            cix = self.ctxs.index(ctx)
        pix = [index.get("r" + p) for p in paths]
        if None in pix:  # callers list every library path among the dependencies
            return False
        self.roots[root] = {"deps": sorted(ix), "row": row, "fail": fail, "ctx": cix, "paths": pix}
        self._dirty = True
        return True

    def flush(self) -> OSError | None:
        """Write the file (atomically) when something changed, keeping only well-formed rows and the
        dependencies and contexts they use. Returns the write error for the caller to report (logging is
        not imported on the warm path)."""
        if not self.enabled or not self._dirty:
            return None

        roots = {r: e for r in self.roots if (e := self._entry(r)) is not None}
        roots = {r: e for r, e in roots.items() if set(e["deps"]).issuperset(e["paths"])}  # both checked
        used = {i for e in roots.values() for i in e["deps"]}
        order = sorted(used)
        renum = {old: new for new, old in enumerate(order)}
        ctx_used = sorted({e["ctx"] for e in roots.values() if e["ctx"] is not None})
        cnum = {old: new for new, old in enumerate(ctx_used)}
        blob: list[str] = []
        offset = 0

        def put(text: str) -> list[int]:
            nonlocal offset
            blob.append(text)
            offset += len(text)
            return [offset - len(text), len(text)]

        mine = {
            "keys": [self.keys[i] for i in order],
            "vals": [self.vals[i] for i in order],
            "ctxs": [self.ctxs[i] for i in ctx_used],
            "roots": {
                r: {
                    **e,
                    "deps": [renum[i] for i in e["deps"]],
                    "paths": [renum[i] for i in e["paths"]],
                    "ctx": cnum.get(e["ctx"]),
                    "row": put(e["row"]),
                }
                for r, e in roots.items()
            },
        }
        buckets: dict[str, Any] = {}
        for env, b in list(self._others.items())[-(_BUCKETS_KEPT - 1) :]:
            moved = _move_rows(b, self._blob, put)
            if moved is not None:
                buckets[env] = moved
        buckets[self.env_key] = mine
        header = json.dumps({"schema": _SCHEMA, "version": _VERSION, "buckets": buckets}, separators=(",", ":"))
        body = header + "\n" + "".join(blob)
        text = f"{zlib.crc32(body.encode('ascii', 'backslashreplace')):08x}\n{body}"
        error = write_atomic(self.directory, self.file, text)
        if error is None:
            self._dirty = False
        return error


def _indexes(v: Any, n: int) -> bool:
    """Whether *v* is a list of indexes into a table of *n* rows (what a row's ``"deps"`` must be)."""
    return isinstance(v, list) and all(type(i) is int and 0 <= i < n for i in v)


def _row_of(text: str, root: str) -> str | None:
    """The row ``tree --json`` prints for *root*, re-encoded from *text* when that is one (the shape of
    Tree.to_json with providers: path, then libraries of soname, path, needed_by, provider), else None.
    Rows are printed, and a cache file can be edited: what is printed is what we encode, never its bytes."""
    try:
        d = json.loads(text)
    except (ValueError, RecursionError, MemoryError):
        return None
    if not (type(d) is dict and list(d) == ["path", "libraries"] and d["path"] == root):
        return None
    libs = d["libraries"]
    if type(libs) is not list:
        return None
    for x in libs:
        if not (
            type(x) is dict
            and (list(x) == _LIBRARY_KEYS or (list(x) == _GPU_LIBRARY_KEYS and _is_gpu_code(x["gpu_code"])))
            and type(x["soname"]) is str
            and (x["path"] is None or type(x["path"]) is str)
            and type(x["needed_by"]) is list
            and all(type(n) is str for n in x["needed_by"])
            and (x["provider"] is None or type(x["provider"]) is str)
        ):
            return None
    return json.dumps(d)


def _is_gpu_code(v: Any) -> bool:
    """A library's ``"gpu_code"`` as ``tree --gpu-code`` writes it: null, or SASS and PTX lists of names."""
    return v is None or (
        type(v) is dict
        and list(v) == ["sass", "ptx"]
        and all(type(a) is list and all(type(n) is str and n.isprintable() for n in a) for a in v.values())
    )


def _move_rows(bucket: Any, old: str, put: Any) -> dict[str, Any] | None:
    """Another environment's bucket, as read, with its rows moved from *old* into the file being written
    (None when malformed: dropped)."""
    if not (isinstance(bucket, dict) and isinstance(bucket.get("roots"), dict)):
        return None
    roots: dict[str, Any] = {}
    for r, e in bucket["roots"].items():
        row = e.get("row") if isinstance(e, dict) else None
        if isinstance(row, list) and len(row) == 2 and all(type(x) is int and x >= 0 for x in row):
            roots[r] = {**e, "row": put(old[row[0] : row[0] + row[1]])}
    return {**bucket, "roots": roots}
