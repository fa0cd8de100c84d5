"""Where installed distributions live and which RECORD lists a path, without reading them whole.

Site directories (``site_dirs``), RECORD path resolution (``record_abspath``, ``install_prefix``) and the
RECORD-only owner index (:class:`OwnerIndex`) that ``cudastack tree`` uses for its provider column. Split out
of :mod:`pytest_cudastack.wheels.inventory` (which re-exports every name) so that the tree command's warm path
imports none of the inventory's dataclasses: this module defines none. Nothing here reads an ELF file or a
flavour rule.
"""

from __future__ import annotations

import functools
import glob
import os
import site
import sys
import sysconfig

from pytest_cudastack._sysio import read_text
from pytest_cudastack.wheels.distinfo import is_plain_record_path, metadata_headers, name_version, parse_record

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~5 ms) on tree's warm path
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = [
    "OwnerIndex",
    "dist_info_dirs",
    "externally_managed",
    "install_prefix",
    "owner_index",
    "record_abspath",
    "site_dirs",
    "site_twin",
    "split_site_dirs",
]


@functools.lru_cache(maxsize=256)
def install_prefix(location: str) -> str:
    """The installation prefix of a site directory: ``P`` for ``P/lib/python3.11/site-packages``, else the
    site directory itself."""
    loc = os.path.normpath(location)
    parts = loc.split(os.sep)
    if (
        len(parts) >= 4
        and parts[-1] in ("site-packages", "dist-packages")
        and parts[-2].startswith("python")
        and parts[-3] in ("lib", "lib64", "lib32", "libx32")
    ):
        return os.sep.join(parts[:-3]) or os.sep
    return loc


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=256)
def _norm_location(location: str) -> str:
    return os.path.normpath(location)


def record_abspath(location: str, path: str) -> str | None:
    """Resolve a RECORD path against its site directory; None when the result leaves the install prefix.

    A site directory that is no scheme's ``lib/pythonX.Y/site-packages`` (its own install prefix) may be a
    ``pip install --target`` directory, where a ``../../<path>`` row names ``<site dir>/<path>``."""
    if not path or "\x00" in path:
        return None
    loc = _norm_location(location)
    if is_plain_record_path(path):
        return path if loc == "." else (loc + path if loc == "/" else f"{loc}/{path}")  # fast path
    full = os.path.normpath(os.path.join(loc, path))
    prefix = install_prefix(location)
    if _within(full, loc) or _within(full, prefix):
        return full
    if prefix == loc and path.startswith(_TARGET_UP):
        # ``pip install --target DIR``: pip installs into the home scheme of a temporary directory H (purelib
        # ``H/lib/python``, scripts ``H/bin``, data ``H``), writing RECORD relative to ``H/lib/python``, then
        # moves each item of purelib and of H (but ``lib``) into DIR (pip's ``_handle_target_dir``): a row
        # ``../../bin/x`` names ``DIR/bin/x``
        moved = os.path.normpath(os.path.join(loc, path[len(_TARGET_UP) :]))
        if _within(moved, loc):
            return moved
    return None


_TARGET_UP = "../../"  # from the home scheme's purelib (``H/lib/python``) up to the home H


EXTERNALLY_MANAGED = "EXTERNALLY-MANAGED"  # PEP 668's marker, in the interpreter's stdlib directory
_LIB_DIRS = ("lib", "lib64", "lib32", "libx32")


def _stdlib_dirs(site_dir: str) -> list[str]:
    """The stdlib directories (``sysconfig.get_path("stdlib")``) of the interpreters a site directory
    belongs to, read from its path: ``P/lib/python3.X`` for ``P/lib/python3.X/site-packages``; every
    ``P/lib/python3.*`` for Debian's version-less ``P/lib/python3/dist-packages``; and, for Debian's
    ``/usr/local/lib/python3.X/dist-packages`` (where its pip installs), ``/usr/lib/python3.X`` too, whose
    ``/usr/bin/python3.X`` reads it. This interpreter's own site directory adds its sysconfig stdlib."""
    loc = os.path.normpath(site_dir)
    parts = loc.split(os.sep)
    out: list[str] = []
    if (
        len(parts) >= 4
        and parts[-1] in ("site-packages", "dist-packages")
        and parts[-2].startswith("python")
        and parts[-3] in _LIB_DIRS
    ):
        prefix = os.sep.join(parts[:-3]) or os.sep
        prefixes = [prefix]
        if parts[-1] == "dist-packages" and prefix.endswith(os.sep + os.path.join("usr", "local")):
            prefixes.append(os.path.dirname(prefix))
        for pre in prefixes:
            lib = os.path.join(pre, parts[-3])
            if parts[-2] == "python3":
                out += sorted(glob.glob(os.path.join(glob.escape(lib), "python3.[0-9]*")))
            else:
                out.append(os.path.join(lib, parts[-2]))
    if sys.prefix == sys.base_prefix and loc in {os.path.normpath(p) for p in site.getsitepackages()}:
        out.append(sysconfig.get_path("stdlib"))
    return list(dict.fromkeys(out))


def externally_managed(site_dir: str, stdlib: str | None = None) -> str | None:
    """PEP 668: the ``EXTERNALLY-MANAGED`` file that makes pip refuse to install into or uninstall from
    ``site_dir`` (pip's ``check_externally_managed``: the marker in ``sysconfig.get_path("stdlib")``,
    ignored under a virtual environment), else None. ``stdlib``: the owning interpreter's stdlib directory
    when known; else it is read from the path (:func:`_stdlib_dirs`). A site directory of a prefix with a
    ``pyvenv.cfg`` is a venv's: None. (pip also skips the check for ``--target``, ``--prefix``, ``--root``.)"""
    prefix = install_prefix(site_dir)
    if prefix != os.path.normpath(site_dir) and os.path.isfile(os.path.join(prefix, "pyvenv.cfg")):
        return None
    for d in [stdlib] if stdlib is not None else _stdlib_dirs(site_dir):
        marker = os.path.join(d, EXTERNALLY_MANAGED)
        if os.path.isfile(marker):
            return marker
    return None


def _pth_dirs(site_dir: str, root: str | None = None) -> list[str]:
    """Directories a site dir's ``.pth`` files add, as CPython's ``site.addpackage`` reads them: files in
    name order, hidden ones (``.x.pth``) skipped; per line, trailing whitespace dropped, ``#`` comments and
    ``import`` lines skipped (never executed), the rest made absolute against the site directory and kept
    when it exists. ``root``: the root the site directory is in (an image's, a host directory): a line is a
    path of that system, so an absolute one names ``root``/line and none leaves ``root`` (``..`` stops at
    its ``/``, as it does at the system's); None: this machine's."""
    out: list[str] = []
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth") and not n.startswith("."))
    except OSError:
        return out
    base = None if root is None else os.path.normpath(os.path.abspath(root))
    inner = None if base is None else _inside(os.path.normpath(os.path.abspath(site_dir)), base)
    if base is not None and inner is None:
        return out  # a site directory outside the root: none of its lines can be resolved inside it
    for n in names:
        text = read_text(os.path.join(site_dir, n))
        if text is None:
            continue
        for line in text.splitlines():
            line = line.rstrip()
            if not line or line.startswith("#") or line.startswith(("import ", "import\t")) or "\x00" in line:
                continue
            if base is None or inner is None:  # this machine's paths
                d = os.path.normpath(os.path.join(site_dir, line))
            else:
                logical = os.path.normpath(os.path.join(inner, line))  # "/.." is "/": no escape
                d = os.path.join(base, logical.lstrip("/")) if logical != "/" else base
            if os.path.exists(d):
                out.append(d)
    return out


def _inside(path: str, root: str) -> str | None:
    """``path`` (absolute, normalised) as a path of the system ``root`` is the root of, None when outside."""
    if root == os.sep:
        return path
    if path == root:
        return os.sep
    return path[len(root) :] if path.startswith(root + os.sep) else None


def _expand_prefix(path: str) -> list[str]:
    found = sorted(glob.glob(os.path.join(glob.escape(path), "lib*", "python3*", "site-packages")))
    if not found:
        return [path]
    if os.path.exists(os.path.join(path, "pyvenv.cfg")) or not dist_info_dirs(path):
        return found
    return [path]


def site_twin(path: str) -> str | None:
    """The other one of a prefix's purelib / platlib pair: ``P/lib64/python3.X/site-packages`` for
    ``P/lib/python3.X/site-packages`` and back (as spelt; whether it exists or is the same directory through
    a ``lib64 -> lib`` link is the caller's to check), else None."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    if len(parts) >= 4 and parts[-1] == "site-packages" and parts[-3] in ("lib", "lib64"):
        return os.sep.join([*parts[:-3], "lib64" if parts[-3] == "lib" else "lib", *parts[-2:]])
    return None


def split_site_dirs(a: str, b: str) -> bool:
    """Are ``a`` and ``b`` one prefix's purelib and platlib, and two different directories (a RHEL-family
    system Python: ``lib/`` and ``lib64/``; a venv's ``lib64`` is a link to ``lib``)?"""
    twin = site_twin(a)
    if twin is None or os.path.normpath(twin) != os.path.normpath(os.path.abspath(b)):
        return False
    return os.path.isdir(a) and os.path.isdir(b) and os.path.realpath(a) != os.path.realpath(b)


def _twins(path: str) -> list[str]:
    twin = site_twin(path)
    return [twin] if twin is not None else []


def site_dirs(paths: Sequence[str] | None = None, root: str | None = None) -> tuple[str, ...]:
    """Directories to look in, in search order, without duplicates (by realpath).

    ``paths=None``: every directory on this interpreter's ``sys.path`` (which already holds ``.pth``-added
    paths and the user site), plus ``site.getsitepackages()`` and the user site. Explicit ``paths``: those,
    each followed by its ``lib``/``lib64`` twin (``P/lib64/python3.11/site-packages`` for
    ``P/lib/python3.11/site-packages``, when it is another directory) and the directories its ``.pth``
    files add (``root``: the root of the system the paths belong to, an image's, whose paths the ``.pth``
    lines name: :func:`_pth_dirs`). A path that is an environment prefix (``pyvenv.cfg`` or
    ``lib/python3*/site-packages`` in it, no dist-info of its own) stands for its site directories.
    """
    candidates: list[str] = []
    if paths is None:
        candidates.extend(p or os.getcwd() for p in sys.path)
        getsitepackages = getattr(site, "getsitepackages", None)  # old virtualenv site.py lacks it
        if getsitepackages is not None:
            candidates.extend(getsitepackages())
        user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
        if isinstance(user, str):
            candidates.append(user)
    else:
        for given in paths:
            for p in _expand_prefix(given):
                for q in (p, *_twins(p)):
                    candidates.append(q)
                    candidates.extend(_pth_dirs(q, root))
    seen: set[str] = set()
    out: list[str] = []
    for c in candidates:
        a = os.path.normpath(os.path.abspath(c))
        if not os.path.isdir(a):
            continue
        r = os.path.realpath(a)
        if r in seen:
            continue
        seen.add(r)
        out.append(a)
    return tuple(out)


def dist_info_dirs(location: str) -> list[str]:
    """The ``*.dist-info`` directories in a site directory, sorted by name ([] when it cannot be listed)."""
    try:
        names = os.listdir(location)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(".dist-info") and os.path.isdir(os.path.join(location, n)))


# ----------------------------------------------------------------------------------------------------
# owners only


def _record_path(path: str, _hash: str | None, _size: int | None) -> str:
    return path


class OwnerIndex:
    """``path -> "name version"`` from RECORD files alone, for the provider column of ``cudastack tree``.

    Reads each dist-info's RECORD and the Name/Version headers of its METADATA (with the inventory's
    parser, :mod:`pytest_cudastack.wheels.distinfo`), but no ELF file and no flavour rule, so it costs a
    fraction of :func:`installed_wheels`. ``owner`` agrees with
    :meth:`Inventory.owner` for the same directories: the first distribution (in search order) whose RECORD
    lists the path, looked up normalised, then realpath'ed. Built on the first lookup.
    """

    def __init__(self, dirs: Sequence[str]) -> None:
        self.site_dirs = tuple(dirs)
        self._plain: list[tuple[tuple[str, ...], dict[str, tuple[int, str]]]] | None = None
        self._special: dict[str, tuple[int, str]] = {}

    def stamp(self) -> list[Any]:
        """What the answers depend on: the directories, their dist-info names and the (inode, size, mtime)
        of each RECORD and METADATA (a cached answer is valid while the stamp is equal)."""
        out: list[Any] = []
        for loc in self.site_dirs:
            row: list[Any] = [loc]
            for dirname in dist_info_dirs(loc):
                row.append(dirname)
                for f in ("RECORD", "METADATA"):
                    try:
                        st = os.stat(os.path.join(loc, dirname, f))
                        row.append([st.st_ino, st.st_size, st.st_mtime_ns])
                    except OSError:
                        row.append(None)
            out.append(row)
        return out

    def _build(self) -> list[tuple[tuple[str, ...], dict[str, tuple[int, str]]]]:
        plain_by_site: list[tuple[tuple[str, ...], dict[str, tuple[int, str]]]] = []
        order = 0
        for loc in self.site_dirs:
            roots = tuple(dict.fromkeys((os.path.normpath(loc), os.path.realpath(loc))))
            plain: dict[str, tuple[int, str]] = {}
            for dirname in dist_info_dirs(loc):
                order += 1
                meta = read_text(os.path.join(loc, dirname, "METADATA"))
                name, version = name_version(metadata_headers(meta) if meta is not None else (), dirname)
                label = f"{name} {version}"
                text = read_text(os.path.join(loc, dirname, "RECORD"))
                if text is None:
                    continue
                paths, _problems = parse_record(text, _record_path)
                special = [x for x in paths if not is_plain_record_path(x)]
                value = (order, label)
                new = dict.fromkeys(paths, value)
                new.update(plain)  # an earlier distribution keeps its claim
                plain = new
                for raw in special:
                    for root in roots:
                        full = record_abspath(root, raw)
                        if full is not None:
                            self._special.setdefault(full, value)
            plain_by_site.append((roots, plain))
        return plain_by_site

    def _lookup(self, p: str) -> str | None:
        assert self._plain is not None
        best = self._special.get(p)
        for roots, plain in self._plain:
            for root in roots:
                prefix = root if root.endswith("/") else root + "/"
                if p.startswith(prefix):
                    hit = plain.get(p[len(prefix) :])
                    if hit is not None and (best is None or hit[0] < best[0]):
                        best = hit
        return best[1] if best is not None else None

    def owner(self, path: str) -> str | None:
        """``"name version"`` of the first distribution whose RECORD lists *path*, else None."""
        if self._plain is None:
            self._plain = self._build()
        p = os.path.normpath(os.path.abspath(path))
        found = self._lookup(p)
        if found is None:
            real = os.path.realpath(p)
            if real != p:
                found = self._lookup(real)
        return found


def owner_index(paths: Sequence[str] | None = None) -> OwnerIndex:
    """An :class:`OwnerIndex` over :func:`site_dirs` of *paths* (default: this interpreter's)."""
    return OwnerIndex(site_dirs(paths))
