"""Where installed distributions live and which RECORD lists a path, without reading them whole.

Site directories (``site_dirs``), RECORD path resolution (``record_abspath``, ``install_prefix``) and the
RECORD-only owner index (:class:`OwnerIndex`) that ``cudastack tree`` uses for its provider column. Split out
of :mod:`pytest_cudastack.wheels.inventory` (which re-exports every name) so that the tree command's warm path
imports none of the inventory's dataclasses: this module defines none. Nothing here reads an ELF file or a
flavour rule.
"""

from __future__ import annotations

import functools
import os
import sys

from pytest_cudastack._sysio import read_text

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~5 ms) on tree's warm path
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["OwnerIndex", "install_prefix", "owner_index", "record_abspath", "site_dirs"]


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
    """Resolve a RECORD path against its site directory; None when the result leaves the install prefix."""
    if not path or "\x00" in path:
        return None
    loc = _norm_location(location)
    if (
        path[0] != "/"
        and ".." not in path
        and "//" not in path
        and "/./" not in path
        and not path.startswith("./")
        and not path.endswith(("/.", "/"))
    ):
        return path if loc == "." else (loc + path if loc == "/" else f"{loc}/{path}")  # fast path
    full = os.path.normpath(os.path.join(loc, path))
    if _within(full, loc) or _within(full, install_prefix(location)):
        return full
    return None


def _pth_dirs(site_dir: str) -> list[str]:
    """Directories a site dir's ``.pth`` files add (``import`` lines are never executed)."""
    out: list[str] = []
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth"))
    except OSError:
        return out
    for n in names:
        text = read_text(os.path.join(site_dir, n))
        if text is None:
            continue
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
                continue
            d = os.path.normpath(os.path.join(site_dir, line))
            if os.path.isdir(d):
                out.append(d)
    return out


def _expand_prefix(path: str) -> list[str]:
    import glob

    found = sorted(glob.glob(os.path.join(glob.escape(path), "lib*", "python3*", "site-packages")))
    if not found:
        return [path]
    if os.path.exists(os.path.join(path, "pyvenv.cfg")) or not _dist_info_dirs(path):
        return found
    return [path]


def _twins(path: str) -> list[str]:
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    if len(parts) >= 4 and parts[-1] == "site-packages" and parts[-3] in ("lib", "lib64"):
        twin = [*parts[:-3], "lib64" if parts[-3] == "lib" else "lib", *parts[-2:]]
        return [os.sep.join(twin)]
    return []


def site_dirs(paths: Sequence[str] | None = None) -> tuple[str, ...]:
    """Directories to look in, in search order, without duplicates (by realpath).

    ``paths=None``: every directory on this interpreter's ``sys.path`` (which already holds ``.pth``-added
    paths and the user site), plus ``site.getsitepackages()`` and the user site. Explicit ``paths``: those,
    each followed by its ``lib``/``lib64`` twin (``P/lib64/python3.11/site-packages`` for
    ``P/lib/python3.11/site-packages``, when it is another directory) and the directories its ``.pth``
    files add. A path that is an environment prefix (``pyvenv.cfg`` or ``lib/python3*/site-packages`` in it,
    no dist-info of its own) stands for its site directories.
    """
    candidates: list[str] = []
    if paths is None:
        import site

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
                    candidates.extend(_pth_dirs(q))
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


def _name_version_from_dirname(dirname: str) -> tuple[str, str]:
    stem = dirname[: -len(".dist-info")]
    name, sep, version = stem.partition("-")
    return name, version if sep else ""


def _dist_info_dirs(location: str) -> list[str]:
    try:
        names = os.listdir(location)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(".dist-info") and os.path.isdir(os.path.join(location, n)))


# ----------------------------------------------------------------------------------------------------
# owners only


def _meta_name_version(text: str) -> tuple[str, str]:
    """First ``Name:`` and ``Version:`` header values (stripped; "" when absent) of a METADATA text, with
    plain string operations (what the email parser gives for these one-line headers)."""
    name: str | None = None
    version: str | None = None
    for line in text.splitlines():
        if not line:
            break  # end of the header block
        head = line[:8].lower()
        if name is None and head.startswith("name:"):
            name = line[5:].strip()
        elif version is None and head == "version:":
            version = line[8:].strip()
        if name is not None and version is not None:
            break
    return name or "", version or ""


def _nonplain(paths: list[str]) -> list[str]:
    """The paths that are not plain (see :func:`_is_plain_record_path`): a cheap inline screen first (a
    superset: a leading ``/`` or ``.``, ``..``, ``//``, ``/.``, a trailing ``/``, NUL), the exact test only on
    what it lets through. Most RECORD paths fail the screen's every test."""
    return [
        x
        for x in paths
        if (not x or x[0] in "/." or ".." in x or "//" in x or "/." in x or x[-1] == "/" or "\x00" in x)
        and not _is_plain_record_path(x)
    ]


def _is_plain_record_path(path: str) -> bool:
    """record_abspath's fast-path condition: the path resolves to ``<site dir>/<path>`` unchanged."""
    return not (
        not path
        or "\x00" in path
        or path.startswith(("/", "./"))
        or ".." in path
        or "//" in path
        or "/./" in path
        or path.endswith(("/.", "/"))
    )


def _record_paths(text: str) -> tuple[list[str], list[str]]:
    """(every path of a RECORD text, the subset that is not plain), as _parse_record reads them."""
    if '"' in text:  # quoted fields: the csv module decides, exactly as the full inventory reads them
        from pytest_cudastack.wheels.inventory import _parse_record  # csv, rare

        entries, _problems = _parse_record(text)
        paths = [e.path for e in entries]
        return paths, _nonplain(paths)
    # a row is kept when its path is not empty and not every field is blank (see _parse_record)
    paths = [
        x
        for line in text.splitlines()
        if (x := line.partition(",")[0]) and (x.strip() or line.replace(",", "").strip())
    ]
    return paths, _nonplain(paths)


class OwnerIndex:
    """``path -> "name version"`` from RECORD files alone, for the provider column of ``cudastack tree``.

    Reads each dist-info's RECORD (plain string operations) and the Name/Version lines of its METADATA, but no
    ELF file and no flavour rule, so it costs a fraction of :func:`installed_wheels`. ``owner`` agrees with
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
            for dirname in _dist_info_dirs(loc):
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
            for dirname in _dist_info_dirs(loc):
                order += 1
                fallback_name, fallback_version = _name_version_from_dirname(dirname)
                meta = read_text(os.path.join(loc, dirname, "METADATA"))
                name, version = _meta_name_version(meta) if meta is not None else ("", "")
                label = f"{name or fallback_name} {version or fallback_version}"
                text = read_text(os.path.join(loc, dirname, "RECORD"))
                if text is None:
                    continue
                paths, special = _record_paths(text)
                value = (order, label)
                new = dict.fromkeys(paths, value)
                special = [x for x in special if x in new]
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
