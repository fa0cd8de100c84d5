"""Where glibc's ld.so would load each needed library from, and why (a static ``ldd``).

Semantics follow glibc 2.36 ``elf/dl-load.c`` (``_dl_map_object``, ``open_path``, ``open_verify``,
``fillin_rpath``, ``_dl_dst_substitute``), ``elf/dl-deps.c`` (``_dl_map_object_deps``: breadth-first load
order) and ``elf/dl-object.c`` (``l_origin``), checked against ``ldd`` in tests/test_ldd_oracle.py:

0. an object already loaded whose name (DT_NEEDED string it was loaded as, or the path it was opened as) or
   DT_SONAME equals the request satisfies it without a search; a found file that is the same inode as a
   loaded object is that object;
1. a name containing ``/`` is opened as is (after DST expansion);
2. DT_RPATH of the requesting object, then of the object that loaded it, and so on up to the main program,
   only when the requesting object has no DT_RUNPATH (an object with DT_RUNPATH has its DT_RPATH ignored);
3. LD_LIBRARY_PATH (``:`` and ``;`` separate, an empty element is the current directory, DSTs expand with
   the main program's origin);
4. DT_RUNPATH of the requesting object only;
5. ld.so.cache (entries under a default directory dropped when the requester has DF_1_NODEFLIB);
6. the default directories, unless the requester has DF_1_NODEFLIB.

Every directory is tried with its ``glibc-hwcaps/<level>/`` and legacy hwcap subdirectories first, in the
order :mod:`pytest_cudastack.linker.hwcaps` derives from the CPU. A candidate of the wrong ELF class or
machine is skipped and the search goes on; a candidate that cannot be opened (missing, dangling link) is
skipped; a candidate that is not a valid ELF object (a directory, a truncated or non-ELF file) makes ld.so
stop with an error, recorded as ``problem``. ``$ORIGIN`` is the
directory of the path an object was opened as (symlinks are NOT resolved, dl-object.c), for the root the
path as given (as ``ldd``/``ld.so FILE`` does).

Also modelled: a name not found for one requester is searched again for a later one (ld.so never reuses
its placeholder for a missing object, so ``ldd`` may list a soname as "not found" and later as found); an
open error other than ENOENT/EACCES (e.g. a symlink loop) abandons the rest of that search list; the program
interpreter is already loaded, so ``ld-linux-x86-64.so.2`` in DT_NEEDED is satisfied by it (and listed, as
``ldd`` lists it); ``preloaded`` objects behave like LD_PRELOAD; :meth:`Resolver.dlopen` is one run-time
load by name from a calling object (dlopen), :meth:`Resolver.opened_tree` what it maps with it (the new
object has no loader: ``__RTLD_CALLMAP``). ``Library.tried`` lists every candidate opened, in order,
except glibc-hwcaps/legacy hwcap subdirectories that do not exist (ld.so tries those once and then
remembers them as missing). Not modelled: secure-execution (setuid) rules, ``--inhibit-cache``,
audit modules.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pytest_cudastack._sysio import open_span
from pytest_cudastack.errors import ElfError, LdCacheError
from pytest_cudastack.linker.elf import ElfInfo, read_elf
from pytest_cudastack.linker.hwcaps import host_search
from pytest_cudastack.linker.ldcache import LdCache, read_ld_cache, read_ld_so_conf

__all__ = ["Library", "Resolver", "Route", "SearchConfig", "Tree"]

log = logging.getLogger(__name__)

DEBIAN_DEFAULT_DIRS: tuple[str, ...] = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib")
DEFAULT_INTERPRETER = "/lib64/ld-linux-x86-64.so.2"


class Route(str, Enum):
    """How the linker found (or failed to find) a library."""

    ALREADY_LOADED = "already loaded"
    DIRECT = "direct path"
    RPATH = "rpath"
    LD_LIBRARY_PATH = "LD_LIBRARY_PATH"
    RUNPATH = "runpath"
    LD_CACHE = "ld.so.cache"
    DEFAULT = "default"
    NOT_FOUND = "not found"


@dataclass(frozen=True)
class SearchConfig:
    """Everything outside the objects themselves that decides a search."""

    root: str = "/"
    ld_library_path: tuple[str, ...] = ()
    ld_cache: LdCache | None = None
    default_dirs: tuple[str, ...] = DEBIAN_DEFAULT_DIRS
    hwcaps: tuple[str, ...] = ()  # glibc-hwcaps levels, best first (linker/hwcaps.py)
    platform: str = "x86_64"  # $PLATFORM: GLRO(dl_platform)
    lib: str = "lib64"
    cwd: str = "."
    legacy_subdirs: tuple[str, ...] = ()  # legacy hwcap subdirectories, best first ("" excluded, duplicates kept)
    conf_dirs: tuple[str, ...] = ()  # ld.so.conf directories, searched only when there is no ld.so.cache
    interpreter: str = DEFAULT_INTERPRETER  # the dynamic linker used when the root has no PT_INTERP

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, root: str = "/") -> SearchConfig:
        """This machine's configuration: LD_LIBRARY_PATH from *environ*, /etc/ld.so.cache under *root*."""
        env = os.environ if environ is None else environ
        llp_raw = env.get("LD_LIBRARY_PATH")
        llp = tuple(llp_raw.replace(";", ":").split(":")) if llp_raw else ()
        cache_path = os.path.join(root, "etc/ld.so.cache")
        cache: LdCache | None = None
        conf: tuple[str, ...] = ()
        try:
            cache = read_ld_cache(cache_path)
        except LdCacheError as e:
            log.info("no usable ld.so.cache (%s); using ld.so.conf", e)
            conf = read_ld_so_conf("/etc/ld.so.conf", root=root)
        platform, levels, legacy = host_search()
        hwcaps = levels if root in ("", "/") else ()
        multiarch = os.path.isdir(os.path.join(root, "lib/x86_64-linux-gnu"))
        return cls(
            root=root,
            ld_library_path=llp,
            ld_cache=cache,
            default_dirs=DEBIAN_DEFAULT_DIRS if multiarch else ("/lib64", "/usr/lib64", "/lib", "/usr/lib"),
            hwcaps=hwcaps,
            platform=platform,
            lib="lib/x86_64-linux-gnu" if multiarch else "lib64",
            cwd=os.getcwd(),
            legacy_subdirs=legacy,
            conf_dirs=conf,
        )


@dataclass(frozen=True)
class Library:
    """One needed soname and where the linker would load it from."""

    soname: str
    path: str | None
    realpath: str | None
    route: Route
    route_detail: str
    tried: tuple[str, ...]
    needed_by: tuple[str, ...]
    provider: str | None = None
    problem: str | None = None

    @property
    def searched(self) -> tuple[str, ...]:
        """The directories the search looked in: those of ``tried`` that exist, once each, in order (ld.so
        retries a directory on two lists; one that does not exist holds nothing to search)."""
        return self.searched_in({})

    def searched_in(self, memo: dict[str, str | None]) -> tuple[str, ...]:
        """:attr:`searched`, with *memo* (the caller's, shared by the libraries of one tree, whose search
        lists are the same thousands of directories for an RPATH at the ELF reader's cap) mapping each
        candidate's directory as written to that directory normalised, or None when it does not exist."""
        out: dict[str, None] = {}
        for t in self.tried:
            raw, _, name = t.rpartition("/")
            if name in ("", ".", ".."):  # normpath(t)'s directory is not normpath(raw)'s
                d = os.path.dirname(os.path.normpath(t))
                if os.path.isdir(d):
                    out[d] = None
                continue
            if raw in memo:
                known = memo[raw]
            else:
                d = os.path.dirname(os.path.normpath(t))
                known = memo[raw] = d if os.path.isdir(d) else None
            if known is not None:
                out[known] = None
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "soname": self.soname,
            "path": self.path,
            "realpath": self.realpath,
            "route": self.route.value,
            "route_detail": self.route_detail,
            "tried": list(self.tried),
            "needed_by": list(self.needed_by),
            "provider": self.provider,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Tree:
    """The transitive closure of one root ELF file, in load order."""

    path: str
    info: ElfInfo | None
    libraries: tuple[Library, ...]
    problems: tuple[str, ...]
    _parents: dict[str, str] = field(default_factory=dict, repr=False, compare=False, hash=False)

    @property
    def missing(self) -> tuple[Library, ...]:
        return tuple(lib for lib in self.libraries if lib.path is None)

    def chain(self, soname: str) -> tuple[str, ...]:
        """Root, ..., the object that first needed *soname* (paths); () when not in the tree.

        A soname can appear twice: missing for one requester, found later through another requester's
        RPATH/RUNPATH (ld.so searches again, as ldd shows); ``chain`` follows the first."""
        lib = next((x for x in self.libraries if x.soname == soname), None)
        if lib is None or not lib.needed_by:
            return ()
        out = [lib.needed_by[0]]
        seen = {out[0]}
        while out[-1] != self.path:
            parent = self._parents.get(out[-1])
            if parent is None or parent in seen:
                break
            out.append(parent)
            seen.add(parent)
        return tuple(reversed(out))

    def to_json(self) -> dict[str, Any]:
        """design.md's ``cudastack tree --json`` object."""
        return {
            "path": self.path,
            "libraries": [
                {"soname": x.soname, "path": x.path, "needed_by": list(x.needed_by), "provider": x.provider}
                for x in self.libraries
            ],
        }


class _Obj:
    """A loaded object (plain class with slots: built thousands of times, never compared)."""

    __slots__ = ("file_id", "info", "loader", "origin", "path", "rpath_dirs", "runpath_dirs")

    def __init__(
        self, path: str, info: ElfInfo, loader: _Obj | None, origin: str | None, file_id: tuple[int, int] | None
    ) -> None:
        self.path = path  # logical path it was opened as
        self.info = info
        self.loader = loader
        self.origin = origin
        self.file_id = file_id
        self.rpath_dirs: list[str] | None = None
        self.runpath_dirs: list[str] | None = None


class _Rec:
    """One search result in a closure (plain class with slots)."""

    __slots__ = ("detail", "needed_by", "obj", "path", "problem", "route", "soname", "tried")

    def __init__(
        self,
        soname: str,
        path: str | None,
        route: Route,
        detail: str,
        tried: list[str],
        needed_by: list[str],
        problem: str | None,
        obj: _Obj | None,
    ) -> None:
        self.soname = soname
        self.path = path
        self.route = route
        self.detail = detail
        self.tried = tried
        self.needed_by = needed_by
        self.problem = problem
        self.obj = obj


def _add_requester(rec: _Rec, path: str) -> None:
    """Record *path* as one more requester of *rec* (once)."""
    if path not in rec.needed_by:
        rec.needed_by.append(path)


class _Walk:
    """The state of one closure walk: loaded objects by name and inode, records by name and in load order,
    the queue of objects whose DT_NEEDED are still to be walked (plain class with slots)."""

    __slots__ = ("by_id", "by_name", "main", "ordered", "parents", "problems", "queue", "recs", "rtld", "want")

    def __init__(self, main: _Obj, want: ElfInfo) -> None:
        self.main = main
        self.want = want
        self.problems: list[str] = []
        self.by_name: dict[str, _Obj] = {}  # names (DT_NEEDED strings, sonames, paths) of loaded objects
        self.by_id: dict[tuple[int, int], _Obj] = {}
        self.recs: dict[str, _Rec] = {}  # latest record per (expanded) name
        self.ordered: list[_Rec] = []  # every record, in load order
        self.parents: dict[str, str] = {}
        self.queue: list[_Obj] = [main]
        self.rtld: _Obj | None = None
        self.register(main)

    def register(self, o: _Obj, name: str | None = None) -> None:
        """Make *o* findable by its path, its soname, *name*, and its inode."""
        by_name = self.by_name
        for n in (o.path, o.info.soname, name):
            if n and n not in by_name:
                by_name[n] = o
        if o.file_id is not None:
            self.by_id.setdefault(o.file_id, o)

    def already_loaded(self, name: str, raw: str, obj: _Obj) -> bool:
        """Whether a loaded object answers to *name*; if so its record (requested by *obj*) is added."""
        hit = self.by_name.get(name)
        if hit is None:
            return False
        detail = "the dynamic linker" if hit is self.rtld else f"as {hit.path}"
        r = _Rec(raw, hit.path, Route.ALREADY_LOADED, detail, [], [obj.path], None, None)
        self.recs[name] = r
        self.ordered.append(r)
        return True


_Verdict = tuple[str, Any]  # ("ok", ElfInfo) | ("absent", reason) | ("skip", reason) | ("fatal", reason)


_Hit = tuple[str | None, Route, str, str | None]
"""One search step's answer: the path found (None: stop, not found), its route, detail and a fatal problem."""


class Resolver:
    """Resolves closures; reuse one instance across many files (directory listings and ELF facts are
    memoised). Not thread-safe. ``reader`` parses an ELF file: default :func:`read_elf`, uncached; a run
    hands down its :class:`~pytest_cudastack.linker.elfcache.ElfCache`'s ``read``, which its owner flushes."""

    def __init__(
        self,
        config: SearchConfig | None = None,
        *,
        reader: Callable[[str], ElfInfo] | None = None,
        owner: Callable[[str], str | None] | None = None,
    ) -> None:
        self.config = config if config is not None else SearchConfig.from_environment()
        self._reader = reader if reader is not None else read_elf
        self._owner = owner
        self._listings: dict[str, frozenset[str] | None] = {}
        self._infos: dict[str, ElfInfo | ElfError] = {}
        self._ids: dict[str, tuple[int, int] | None] = {}
        self._realpaths: dict[str, str] = {}
        self._owners: dict[str, str | None] = {}
        root = self.config.root
        self._prefix = "" if root in ("", "/") else root.rstrip("/")
        self._subdirs: tuple[str, ...] = (
            *(f"glibc-hwcaps/{h}" for h in self.config.hwcaps),
            *self.config.legacy_subdirs,
        )
        self._sysdirs = tuple(d.rstrip("/") + "/" for d in self.config.default_dirs)
        self._subheads = tuple((sub, sub.split("/", 1)[0]) for sub in self._subdirs)
        self._present: dict[str, tuple[str, ...]] = {}  # directory -> hwcap subdirs whose first part exists
        self._realdirs: dict[str, str] = {}
        self._searches: dict[tuple[Any, ...], tuple[str | None, Route, str, tuple[str, ...], str | None]] = {}
        self._llp_has_dst = any("$" in x for x in self.config.ld_library_path)
        # what the closure being resolved read (see tree_deps): "s" + host path for a stat/listing/read,
        # "c" for the current directory; None when not recording
        self._deps: set[str] | None = None
        self._search_deps: dict[tuple[Any, ...], frozenset[str]] = {}

    def logical(self, path: str) -> str:
        """``path`` as this resolver names files: a host path under ``config.root`` (an image's file, as the
        wheel inventory lists it) without the root's prefix; any other path as given."""
        if self._prefix and path.startswith(self._prefix + "/"):
            return path[len(self._prefix) :]
        return path

    # ------------------------------------------------------------------ file system, memoised
    def _host(self, logical: str) -> str:
        if not self._prefix or not logical.startswith("/"):
            return logical
        return self._prefix + logical

    def _abs(self, p: str) -> str:
        if p.startswith("/"):
            return p
        if self._deps is not None:
            self._deps.add("c")
        return os.path.join(self.config.cwd, p)

    def _listing(self, directory: str) -> frozenset[str] | None:
        if directory:
            key = self._abs(directory)
        else:
            key = self.config.cwd
            if self._deps is not None:
                self._deps.add("c")
        if self._deps is not None:
            self._deps.add("s" + self._host(key))
        hit = self._listings.get(key, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        try:
            names: frozenset[str] | None = frozenset(os.listdir(self._host(key)))
        except OSError:
            names = None
        self._listings[key] = names
        return names

    def _exists(self, path: str) -> bool:
        d, sep, base = path.rpartition("/")
        if not base:
            return False
        if sep and not d:
            d = "/"
        names = self._listing(d)
        return names is not None and base in names

    def _info(self, path: str) -> ElfInfo | ElfError:
        key = self._abs(path)
        if self._deps is not None:
            self._deps.add("s" + self._host(key))
        hit = self._infos.get(key)
        if hit is None:
            try:
                hit = self._reader(self._host(key))
            except ElfError as e:
                hit = e
            except OSError as e:  # a custom reader
                hit = ElfError(f"{path}: cannot open: {e}")
            self._infos[key] = hit
        return hit

    def _file_id(self, path: str) -> tuple[int, int] | None:
        key = self._abs(path)
        if self._deps is not None:
            self._deps.add("s" + self._host(key))
        if key not in self._ids:
            try:
                st = os.stat(self._host(key))
                self._ids[key] = (st.st_dev, st.st_ino)
            except OSError:
                self._ids[key] = None
        return self._ids[key]

    def _realpath(self, path: str) -> str:
        key = self._abs(path)
        hit = self._realpaths.get(key)
        if hit is None:
            host = self._host(key)
            d, _sep, base = host.rpartition("/")
            real_d = self._realdirs.get(d)
            if real_d is None:
                real_d = self._realdirs[d] = os.path.realpath(d or "/")
            if base and base not in (".", "..") and not os.path.islink(host):
                hit = (real_d.rstrip("/") or "") + "/" + base  # one lstat, the directory resolved once
            else:
                hit = os.path.realpath(host)
            if self._prefix and hit.startswith(self._prefix + "/"):
                hit = hit[len(self._prefix) :]
            self._realpaths[key] = hit
        return hit

    def _owner_of(self, path: str | None) -> str | None:
        if path is None or self._owner is None:
            return None
        if path not in self._owners:
            try:
                self._owners[path] = self._owner(path)
            except Exception as e:  # an owner callback must never break resolution
                log.debug("owner(%s) failed: %s", path, e)
                self._owners[path] = None
        return self._owners[path]

    # ------------------------------------------------------------------ candidates
    def _verify(self, path: str, want: ElfInfo) -> _Verdict:
        """open_verify: ok, absent (open fails: continue), skip (other class/machine: continue), fatal."""
        if not self._exists(path):
            return ("absent", "")
        got = self._info(path)
        if isinstance(got, ElfError):
            msg = str(got)
            if ": cannot open:" in msg:
                # open_path goes on after ENOENT/EACCES; any other open error (a symlink loop, a name too
                # long) abandons the rest of this search list (glibc: "here_any && errno != ENOENT ...")
                try:
                    os.stat(self._host(self._abs(path)))
                    err = errno.EACCES  # stat works, open does not: a permission problem
                except OSError as e:
                    err = e.errno or errno.ENOENT
                if err in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
                    return ("absent", msg)
                return ("abandon", msg)
            peek = self._peek_ident(path)
            if peek is not None:
                cls, little, machine = peek
                if cls != want.elf_class:
                    return ("skip", f"{path}: wrong ELF class (ELF{cls}, need ELF{want.elf_class})")
                if little == want.little_endian and machine != want.machine:
                    return ("skip", f"{path}: wrong machine ({machine}, need {want.machine})")
            return ("fatal", msg)
        if got.elf_class != want.elf_class:
            return ("skip", f"{path}: wrong ELF class (ELF{got.elf_class}, need ELF{want.elf_class})")
        if got.little_endian != want.little_endian:
            return ("fatal", f"{path}: ELF file data encoding differs")
        if got.machine != want.machine:
            return ("skip", f"{path}: wrong machine ({got.machine}, need {want.machine})")
        if got.elf_type not in ("ET_DYN", "ET_EXEC"):
            return ("fatal", f"{path}: only ET_DYN and ET_EXEC can be loaded ({got.elf_type})")
        if got.osabi not in (0, 3):
            return ("fatal", f"{path}: ELF file OS ABI invalid ({got.osabi})")
        return ("ok", got)

    def _peek_ident(self, path: str) -> tuple[int, bool, int] | None:
        """(class, little endian, e_machine) from the first 20 bytes, as open_verify checks them first."""
        host = self._host(self._abs(path))
        if self._deps is not None:
            self._deps.add("s" + host)
        try:
            span, _st = open_span(host)
        except ElfError:
            return None
        try:
            head = span.pread(20, 0)
        except OSError:
            return None
        finally:
            span.close()
        if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
            return None
        little = head[5] == 1
        return (32 if head[4] == 1 else 64, little, int.from_bytes(head[18:20], "little" if little else "big"))

    def _open_path(
        self, name: str, dirs: Sequence[str], want: ElfInfo, tried: list[str], skipped: list[str]
    ) -> tuple[str | None, str | None]:
        """(path, fatal problem) over *dirs* with hwcaps subdirectories first."""
        for d in dirs:
            base = d if d.endswith("/") or not d else d + "/"
            listing = self._listing(base.rstrip("/") or ("/" if base else ""))
            if listing is None:
                tried.append(base + name)
                continue
            present = self._present.get(base)
            if present is None:
                present = tuple(sub for sub, first in self._subheads if first in listing)
                self._present[base] = present
            for sub in present:
                cand = f"{base}{sub}/{name}"
                if not self._exists(cand):
                    continue
                tried.append(cand)
                found, fatal, _abandon = self._judge(cand, want, skipped)
                if found or fatal:
                    return found, fatal
            cand = base + name
            tried.append(cand)
            if name not in listing:
                continue
            found, fatal, abandon = self._judge(cand, want, skipped)
            if found or fatal:
                return found, fatal
            if abandon:  # the last errno of this directory decides (open_path)
                skipped.append("rest of this search list abandoned")
                return None, None
        return None, None

    def _judge(self, cand: str, want: ElfInfo, skipped: list[str]) -> tuple[str | None, str | None, bool]:
        """(found path, fatal problem, abandon the rest of this list)."""
        kind, detail = self._verify(cand, want)
        if kind == "ok":
            return cand, None, False
        if kind == "fatal":
            return None, str(detail), False
        if kind in ("skip", "abandon") or detail:
            skipped.append(str(detail))
        return None, None, kind == "abandon"

    # ------------------------------------------------------------------ DSTs and path lists
    def _expand(self, s: str, origin: str | None) -> str | None:
        """_dl_dst_substitute; None when a DST cannot be expanded (the element is dropped)."""
        if "$" not in s:
            return s
        out: list[str] = []
        i = 0
        n = len(s)
        while i < n:
            c = s[i]
            if c != "$":
                out.append(c)
                i += 1
                continue
            value: str | None = None
            used = 0
            for tok in ("ORIGIN", "PLATFORM", "LIB"):
                if s.startswith("{" + tok + "}", i + 1):
                    used = len(tok) + 2
                elif s.startswith(tok, i + 1) and not (
                    i + 1 + len(tok) < n and (s[i + 1 + len(tok)].isalnum() or s[i + 1 + len(tok)] == "_")
                ):
                    used = len(tok)
                else:
                    continue
                if tok == "ORIGIN":
                    if origin is None:
                        return None
                    value = origin
                elif tok == "PLATFORM":
                    value = self.config.platform
                else:
                    value = self.config.lib
                break
            if value is None:
                out.append(c)
                i += 1
            else:
                out.append(value)
                i += 1 + used
        return "".join(out)

    def _dirlist(self, elements: Sequence[str], origin: str | None) -> list[str]:
        """fillin_rpath: expand, drop unexpandable, strip trailing '/', dedupe; "" stays (= cwd)."""
        out: list[str] = []
        seen: set[str] = set()  # linear: an LD_LIBRARY_PATH of 100,000 elements took minutes as `not in out`
        for el in elements:
            if el:
                exp = self._expand(el, origin)
                if not exp:
                    continue
                exp = exp.rstrip("/") or "/"
            else:
                exp = ""
            if exp not in seen:
                seen.add(exp)
                out.append(exp)
        return out

    def _rpath_dirs(self, o: _Obj) -> list[str]:
        if o.rpath_dirs is None:
            o.rpath_dirs = [] if o.info.runpath else self._dirlist(o.info.rpath, o.origin)
        return o.rpath_dirs

    def _runpath_dirs(self, o: _Obj) -> list[str]:
        if o.runpath_dirs is None:
            o.runpath_dirs = self._dirlist(o.info.runpath, o.origin)
        return o.runpath_dirs

    # ------------------------------------------------------------------ the search
    def _search(self, name: str, req: _Obj, main: _Obj, want: ElfInfo) -> _Rec:
        """_search_uncached, memoised on everything the search depends on (the file system is memoised by
        this instance anyway): the name, the RPATH chain (paths and directories) or the requester's RUNPATH,
        the main program's origin when LD_LIBRARY_PATH has DSTs, DF_1_NODEFLIB and the wanted class/machine.
        Trees of many files in one directory share most searches."""
        if req.info.runpath:
            chain: tuple[Any, ...] = ("runpath", req.path, tuple(self._runpath_dirs(req)))
        else:
            links: list[tuple[str, tuple[str, ...]]] = []
            o: _Obj | None = req
            did_main = False
            while o is not None:
                dirs = self._rpath_dirs(o)
                if dirs:
                    links.append((o.path, tuple(dirs)))
                    did_main |= o is main
                o = o.loader
            if not did_main and main is not req:
                dirs = self._rpath_dirs(main)
                if dirs:
                    links.append((main.path, tuple(dirs)))
            chain = ("rpath", *links)
        llp_origin = main.origin if self._llp_has_dst else None
        key = (name, chain, llp_origin, req.info.nodeflib, want.elf_class, want.little_endian, want.machine)
        hit = self._searches.get(key)
        outer = self._deps
        if outer is not None:
            known = self._search_deps.get(key)
            if hit is not None and known is not None:
                outer |= known
            else:  # not memoised, or memoised while not recording: search (again), recording what it reads
                hit = None
                self._deps = set()
        if hit is None:
            try:
                r = self._search_uncached(name, req, main, want)
            finally:
                inner, self._deps = self._deps, outer
            hit = self._searches[key] = (r.path, r.route, r.detail, tuple(r.tried), r.problem)
            if outer is not None and inner is not None:
                self._search_deps[key] = frozenset(inner)
                outer |= inner
        path, route, detail, tried, problem = hit
        return _Rec(name, path, route, detail, list(tried), [], problem, None)

    def _search_uncached(self, name: str, req: _Obj, main: _Obj, want: ElfInfo) -> _Rec:
        """Where ld.so finds ``name`` for ``req``: a path as given, else the first of the rpath chain,
        LD_LIBRARY_PATH, runpath, the cache (or ld.so.conf) and the default directories that answers."""
        tried: list[str] = []
        skipped: list[str] = []
        hit: _Hit | None
        if "/" in name:
            hit = self._search_direct(name, req, want, tried, skipped)
        else:
            hit = (
                self._search_rpath(name, req, main, want, tried, skipped)
                or self._search_env(name, main, want, tried, skipped)
                or self._search_runpath(name, req, want, tried, skipped)
                or self._search_cache(name, req, want, tried, skipped)
                or self._search_default(name, req, want, tried, skipped)
            )
        path, route, detail, fatal = hit if hit is not None else (None, Route.NOT_FOUND, "", None)
        problem = fatal
        if problem is None and path is None and skipped:
            problem = "; ".join(skipped)
        elif problem is None and skipped:
            problem = "skipped: " + "; ".join(skipped)
        return _Rec(name, path, route, detail, tried, [], problem, None)

    def _search_direct(self, name: str, req: _Obj, want: ElfInfo, tried: list[str], skipped: list[str]) -> _Hit:
        """A name with a slash: that file (its dynamic string tokens expanded), or not found; always answers."""
        exp = self._expand(name, req.origin)
        if exp is None:
            return None, Route.NOT_FOUND, "cannot expand dynamic string token", None
        tried.append(exp)
        found, fatal, _ = self._judge(exp, want, skipped) if self._exists(exp) else (None, None, False)
        return found, Route.DIRECT if found else Route.NOT_FOUND, "", fatal

    def _search_rpath(
        self, name: str, req: _Obj, main: _Obj, want: ElfInfo, tried: list[str], skipped: list[str]
    ) -> _Hit | None:
        """Without a runpath: the DT_RPATH of ``req`` and each of its loaders in turn, then the main program's."""
        if req.info.runpath:
            return None
        o: _Obj | None = req
        did_main = False
        while o is not None:
            dirs = self._rpath_dirs(o)
            if dirs:
                found, fatal = self._open_path(name, dirs, want, tried, skipped)
                if found or fatal:
                    return found, Route.RPATH if found else Route.NOT_FOUND, f"rpath of {o.path}", fatal
                did_main |= o is main
            o = o.loader
        if not did_main and main is not req:
            dirs = self._rpath_dirs(main)
            if dirs:
                found, fatal = self._open_path(name, dirs, want, tried, skipped)
                if found or fatal:
                    return found, Route.RPATH if found else Route.NOT_FOUND, f"rpath of {main.path}", fatal
        return None

    def _search_env(self, name: str, main: _Obj, want: ElfInfo, tried: list[str], skipped: list[str]) -> _Hit | None:
        """The directories of LD_LIBRARY_PATH (tokens expanded against the main program)."""
        if not self.config.ld_library_path:
            return None
        dirs = self._dirlist(self.config.ld_library_path, main.origin)
        found, fatal = self._open_path(name, dirs, want, tried, skipped)
        if found or fatal:
            return found, Route.LD_LIBRARY_PATH if found else Route.NOT_FOUND, "LD_LIBRARY_PATH", fatal
        return None

    def _search_runpath(self, name: str, req: _Obj, want: ElfInfo, tried: list[str], skipped: list[str]) -> _Hit | None:
        """The DT_RUNPATH of ``req`` itself (never its loaders')."""
        if not req.info.runpath:
            return None
        dirs = self._runpath_dirs(req)
        found, fatal = self._open_path(name, dirs, want, tried, skipped)
        if found or fatal:
            return found, Route.RUNPATH if found else Route.NOT_FOUND, f"runpath of {req.path}", fatal
        return None

    def _search_cache(self, name: str, req: _Obj, want: ElfInfo, tried: list[str], skipped: list[str]) -> _Hit | None:
        """The ld.so.cache entry (none from a system directory under DF_1_NODEFLIB), or without a cache the
        ld.so.conf directories."""
        cache = self.config.ld_cache
        if cache is not None:
            cached = cache.lookup(name, want.elf_class, want.machine, self.config.hwcaps)
            if cached is not None and req.info.nodeflib and cached.startswith(self._sysdirs):
                skipped.append(f"ld.so.cache entry {cached} ignored (DF_1_NODEFLIB)")
                cached = None
            if cached is not None:
                tried.append(cached)
                found, fatal, _ = self._judge(cached, want, skipped) if self._exists(cached) else (None, None, False)
                if found or fatal:
                    return found, Route.LD_CACHE if found else Route.NOT_FOUND, cache.path, fatal
        elif self.config.conf_dirs and not req.info.nodeflib:
            found, fatal = self._open_path(name, self.config.conf_dirs, want, tried, skipped)
            if found or fatal:
                return found, Route.LD_CACHE if found else Route.NOT_FOUND, "ld.so.conf (no ld.so.cache)", fatal
        return None

    def _search_default(self, name: str, req: _Obj, want: ElfInfo, tried: list[str], skipped: list[str]) -> _Hit | None:
        """The default directories, unless ``req`` is DF_1_NODEFLIB."""
        if req.info.nodeflib:
            return None
        found, fatal = self._open_path(name, self.config.default_dirs, want, tried, skipped)
        if found or fatal:
            return found, Route.DEFAULT if found else Route.NOT_FOUND, "default directories", fatal
        return None

    # ------------------------------------------------------------------ public
    def _new_obj(self, path: str, info: ElfInfo, loader: _Obj | None) -> _Obj:
        ap = self._abs(path)
        origin = ap.rsplit("/", 1)[0] or "/"
        return _Obj(path, info, loader, origin, self._file_id(path))

    def tree(self, path: str, preloaded: Sequence[str] = (), loaded: Sequence[str] = ()) -> Tree:
        """The whole closure of *path* in load order; problems (not exceptions) for bad input.

        ``loaded``: objects already in the process (mapped by earlier imports): they satisfy a request by
        their path or DT_SONAME, or a found file by its inode, as ``_dl_map_object`` matches the namespace's
        loaded objects, without being searched or resolved again themselves (unlike ``preloaded``)."""
        path = self.logical(os.fspath(path))
        preloaded = [self.logical(p) for p in preloaded]
        loaded = [self.logical(p) for p in loaded]
        got = self._info(path)
        if isinstance(got, ElfError):
            return Tree(path, None, (), (str(got),))
        main = self._new_obj(path, got, None)
        return self._closure(main, got, list(preloaded), loaded)

    def tree_deps(self, path: str) -> tuple[Tree, frozenset[str]]:
        """:meth:`tree`, and what its answer depends on: ``"s" + path`` for every file or directory whose
        status, listing or contents the resolution read (existing or not), ``"c"`` when a relative path made
        it depend on the current directory. The paths are those handed to the operating system (under
        ``config.root``). Memoised searches carry the dependencies they were computed with, so the set is the
        same whichever files this instance resolved before. Used by ``cudastack tree``'s closure cache."""
        outer = self._deps
        deps: set[str] = set()
        self._deps = deps
        try:
            tree = self.tree(path)
        finally:
            self._deps = outer
        if outer is not None:
            outer |= deps
        return tree, frozenset(deps)

    def _closure(self, main: _Obj, want: ElfInfo, preloaded: list[str], loaded: Sequence[str] = ()) -> Tree:
        """The load-order closure of *main*: ld.so's breadth-first walk over DT_NEEDED from its start set."""
        w = _Walk(main, want)
        self._seed(w, preloaded, loaded)
        queue = w.queue
        i = 0
        while i < len(queue):
            obj = queue[i]
            i += 1
            for raw in obj.info.needed:
                self._need(w, obj, raw)
        return Tree(main.path, main.info, self._libraries(w.ordered), tuple(w.problems), w.parents)

    def _seed(self, w: _Walk, preloaded: list[str], loaded: Sequence[str]) -> None:
        """The objects loaded before any DT_NEEDED: the program interpreter, *loaded* (matched, never walked)
        and the preloads (walked after the main object; one that cannot be read is a problem)."""
        interp = w.want.interpreter or self.config.interpreter
        rtld_info = self._info(interp)
        if isinstance(rtld_info, ElfInfo):
            w.rtld = self._new_obj(interp, rtld_info, None)
            w.register(w.rtld)
        for p in loaded:
            li = self._info(p)
            if isinstance(li, ElfInfo):
                w.register(self._new_obj(p, li, None))
        for p in preloaded:
            pi = self._info(p)
            if isinstance(pi, ElfError):
                w.problems.append(f"preload {p}: {pi}")
                continue
            po = self._new_obj(p, pi, None)
            w.register(po)
            w.queue.append(po)

    def _need(self, w: _Walk, obj: _Obj, raw: str) -> None:
        """One DT_NEEDED entry *raw* of *obj*: met by an earlier record or a loaded object, else searched
        (a found object joins the queue)."""
        name = self._expand(raw, obj.origin) if "$" in raw else raw
        if name is None:
            w.problems.append(f"{obj.path}: cannot expand {raw!r}")
            return
        prev = w.recs.get(name)
        if prev is not None and prev.path is not None:
            _add_requester(prev, obj.path)
            return
        if prev is None and w.already_loaded(name, raw, obj):
            return
        # a name not found before is searched again: ld.so's placeholder for it (l_faked) never
        # satisfies a later request, so another requester's RPATH/RUNPATH may still find it
        r = self._search(name, obj, w.main, w.want)
        r.soname = raw
        r.needed_by.append(obj.path)
        if prev is not None and r.path is None:
            _add_requester(prev, obj.path)
            return
        w.recs[name] = r
        w.ordered.append(r)
        if r.path is None:
            if r.problem:
                w.problems.append(f"{name}: {r.problem}")
            return
        self._load(w, obj, name, r, r.path)

    def _load(self, w: _Walk, obj: _Obj, name: str, r: _Rec, path: str) -> None:
        """Map the file *path* that *r* found for *obj*'s *name*: the object already loaded from that inode,
        else a new object that joins the queue."""
        fid = self._file_id(path)
        same = w.by_id.get(fid) if fid is not None else None
        if same is not None:
            w.by_name.setdefault(name, same)
            return
        info = self._info(path)
        if not isinstance(info, ElfInfo):  # verified in _search; cannot happen
            return
        new = self._new_obj(path, info, obj)
        r.obj = new
        w.register(new, name)
        w.parents[new.path] = obj.path
        w.queue.append(new)

    def _libraries(self, ordered: list[_Rec]) -> tuple[Library, ...]:
        """The closure's records, in load order, as the public Library results."""
        return tuple(
            Library(
                soname=r.soname,
                path=r.path,
                realpath=self._realpath(r.path) if r.path is not None else None,
                route=r.route,
                route_detail=r.detail,
                tried=tuple(r.tried),
                needed_by=tuple(r.needed_by),
                provider=self._owner_of(r.path),
                problem=r.problem,
            )
            for r in ordered
        )

    def dlopen(
        self,
        name: str,
        caller: str,
        loaded: Sequence[str] = (),
        loaders: Sequence[str] = (),
        *,
        program: str | None = None,
        names: Mapping[str, str] | None = None,
    ) -> Library:
        """Where ``dlopen(name)`` called from the object at ``caller`` would load from (glibc 2.36
        ``dlfcn/dlopen.c`` -> ``elf/dl-open.c`` ``dl_open_worker``, which calls ``_dl_map_object`` with the
        caller's link map as the loader, found from the return address):

        * an object already loaded (each of ``loaded`` in load order, ``caller``, the program interpreter)
          whose path, a name it was opened as (``names``: name -> path, e.g. a closure's DT_NEEDED strings,
          ``l_libname``) or DT_SONAME equals ``name`` is the answer without a search (``_dl_map_object``'s
          first loop, ``_dl_name_match_p`` and ``l_soname``);
        * a name containing ``/`` is opened as is after DST expansion, ``$ORIGIN`` being the caller's
          directory (``expand_dynamic_string_token`` with the caller as loader), a relative one from
          ``config.cwd``;
        * otherwise the search of a DT_NEEDED of the caller: the caller's DT_RPATH and its loaders' (unless
          the caller has a DT_RUNPATH) and the main program's, LD_LIBRARY_PATH, the caller's DT_RUNPATH,
          ld.so.cache by the exact name, the default directories (``_dl_map_object``'s
          ``cache_rpath``/``open_path`` sequence; the last two not from a system directory under
          DF_1_NODEFLIB). The RPATH chain goes up ``loaders``: the objects that loaded the caller, nearest
          first (``l_loader``, as a closure's ``Tree.chain`` gives them; empty: a caller loaded by the
          program itself). The main program is ``program`` (default ``sys.executable``'s resolved path);
        * a file found that is the same inode as a loaded object is that object (``_dl_map_object_from_fd``
          compares ``l_file_id``).

        ``needed_by`` is ``(caller,)``; a caller that is not a readable ELF file gives NOT_FOUND with the
        reason in ``problem``."""
        caller = os.fspath(caller)
        got = self._info(caller)
        if isinstance(got, ElfError):
            return Library(name, None, None, Route.NOT_FOUND, "", (), (caller,), None, str(got))
        req, main = self._caller_chain(caller, got, loaders, program)
        hit = self._loaded_match(name, caller, got, loaded, names or {})
        if hit is not None:
            return hit
        if "/" in name:
            exp = self._expand(name, req.origin)
            if exp is None:
                return Library(name, None, None, Route.NOT_FOUND, "cannot expand dynamic string token", (), (caller,))
            r = self._search(exp, req, main or req, got)
        else:
            r = self._search(name, req, main or req, got)
        if r.path is not None:
            fid = self._file_id(r.path)
            for p in (*loaded, *(names or {}).values(), caller):
                if fid is not None and self._file_id(p) == fid:
                    return Library(
                        name,
                        p,
                        self._realpath(p),
                        Route.ALREADY_LOADED,
                        f"same file as {p}",
                        tuple(r.tried),
                        (caller,),
                        self._owner_of(p),
                    )
        return self._library(name, r, caller)

    def _library(self, soname: str, r: _Rec, needed_by: str) -> Library:
        """The :class:`Library` a search's record gives for ``soname`` loaded by ``needed_by``."""
        return Library(
            soname=soname,
            path=r.path,
            realpath=self._realpath(r.path) if r.path is not None else None,
            route=r.route,
            route_detail=r.detail,
            tried=tuple(r.tried),
            needed_by=(needed_by,),
            provider=self._owner_of(r.path),
            problem=r.problem,
        )

    def _caller_chain(
        self, caller: str, got: ElfInfo, loaders: Sequence[str], program: str | None
    ) -> tuple[_Obj, _Obj | None]:
        """The caller's link map with its ``l_loader`` chain (``loaders``, nearest first; the program's own
        map where one of them is the program) and the program's map (None when it cannot be read)."""
        lpath = self._abs(program) if program is not None else os.path.realpath(sys.executable)
        exe = self._info(lpath)
        main = self._new_obj(lpath, exe, None) if isinstance(exe, ElfInfo) else None
        up: _Obj | None = None
        for lp in reversed(loaders):
            li = self._info(lp)
            if main is not None and self._abs(lp) == lpath:
                up = main  # the program itself: its RPATH is searched once, in the chain (did_main_map)
            elif isinstance(li, ElfInfo):
                up = self._new_obj(lp, li, up)
        return self._new_obj(caller, got, up), main

    def opened_tree(
        self,
        path: str,
        loaded: Sequence[str] = (),
        *,
        program: str | None = None,
        names: Mapping[str, str] | None = None,
    ) -> Tree:
        """What ``dlopen`` of the file ``path`` maps besides it: its DT_NEEDED closure in the process
        (``dl_open_worker`` -> ``_dl_map_object_deps`` from the new object). The caller's link map only
        chose where the file itself was searched: ``_dl_map_object`` drops it as the new object's loader
        (``if (mode & __RTLD_CALLMAP) loader = NULL``), so each dependency is searched with the RPATHs of
        its needer, up to the new object, then the program's; ``loaded`` and ``names`` as for
        :meth:`dlopen` satisfy requests without a search. The tree's ``path`` is ``path``."""
        path = os.fspath(path)
        got = self._info(path)
        if isinstance(got, ElfError):
            return Tree(path, None, (), (str(got),))
        lpath = self._abs(program) if program is not None else os.path.realpath(sys.executable)
        exe = self._info(lpath)
        new = self._new_obj(path, got, None)
        w = _Walk(self._new_obj(lpath, exe, None) if isinstance(exe, ElfInfo) else new, got)
        w.queue = [new]
        w.register(new)
        self._seed(w, [], loaded)
        for n, p in (names or {}).items():
            o = w.by_name.get(p)
            if o is not None:
                w.by_name.setdefault(n, o)
        i = 0
        while i < len(w.queue):
            obj = w.queue[i]
            i += 1
            for raw in obj.info.needed:
                self._need(w, obj, raw)
        return Tree(path, got, self._libraries(w.ordered), tuple(w.problems), w.parents)

    def _loaded_match(
        self, name: str, caller: str, got: ElfInfo, loaded: Sequence[str], names: Mapping[str, str]
    ) -> Library | None:
        """The loaded object ``dlopen(name)`` returns without a search, if any: the first, in load order,
        whose path, a name it was opened as, or DT_SONAME is ``name`` (``_dl_map_object``'s first loop)."""
        aliases: dict[str, set[str]] = {}
        for n, p in names.items():
            aliases.setdefault(p, set()).add(n)
        objs: list[tuple[str, ElfInfo]] = []
        for p in (*loaded, *(p for p in aliases if p not in loaded)):
            info = self._info(p)
            if isinstance(info, ElfInfo):
                objs.append((p, info))
        objs.append((caller, got))
        interp = got.interpreter or self.config.interpreter
        rtld = self._info(interp)
        if isinstance(rtld, ElfInfo):
            objs.append((interp, rtld))
        for p, info in objs:
            if name in (p, info.soname) or name in aliases.get(p, ()):
                return Library(
                    name, p, self._realpath(p), Route.ALREADY_LOADED, f"as {p}", (), (caller,), self._owner_of(p)
                )
        return None

    def find(self, soname: str, loader: str | None = None) -> Library:
        """Where *soname* would load from as a DT_NEEDED of *loader* (default: ``sys.executable``, whose
        origin is its resolved path, as the kernel's /proc/self/exe gives it)."""
        lpath = loader if loader is not None else os.path.realpath(sys.executable)
        got = self._info(lpath)
        if isinstance(got, ElfError):
            return Library(soname, None, None, Route.NOT_FOUND, "", (), (lpath,), None, str(got))
        main = self._new_obj(lpath, got, None)
        if soname in (main.info.soname, main.path):
            return Library(soname, main.path, self._realpath(main.path), Route.ALREADY_LOADED, "", (), (lpath,))
        return self._library(soname, self._search(soname, main, main, got), lpath)
