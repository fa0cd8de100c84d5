"""A directory tree listed without recursion, for the walks whose tree comes from the user or an image.

``os.walk`` recurses once a directory level (CPython 3.11 and older), so a 2,000-deep tree under a scanned
directory, a snapshot share or an image's root raised ``RecursionError``. :func:`walk_tree` lists what
``os.walk(top)`` lists, in the order it lists it when each ``dirnames`` is sorted (depth first: a directory's
files, then each subdirectory's tree in name order), from an explicit stack:

* it follows no symbolic link to a directory (``os.walk``'s default), and such a link is no file either;
  a link to a file, a dangling link and a looping link are files, as ``os.walk`` lists them;
* it reads each real directory once, by ``(st_dev, st_ino)``: a bind mount of a directory inside its own tree
  (or beside it) is not read again under a second path (``os.walk`` read it twice: a snapshot counted as two
  nodes, a binary scanned under two names);
* it enters no directory deeper than ``max_depth`` levels below ``top``: each one it does not enter is named
  in its parent's :class:`Listing` (``deep``), for the caller to report the way it reports what it did not
  read;
* a directory that cannot be listed is passed over, as ``os.walk`` does without ``onerror``.

The ground floor holds it: the checks, the model and the image reader may all walk with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["MAX_DEPTH", "Listing", "walk_tree"]

MAX_DEPTH = 64  # directory levels below the top entered (as the rootdir's scan): real trees stay well under it


@dataclass(frozen=True)
class Listing:
    """One directory a walk read: its ``path`` (``top``, then ``os.path.join(parent, name)``, as ``os.walk``'s
    ``dirpath``), its ``depth`` below ``top`` (``top``: 0), the names of its ``files`` (everything but the
    directories and the links to one), sorted, and the paths of its subdirectories not entered because they are
    deeper than the walk's ``max_depth`` (``deep``), sorted."""

    path: str
    depth: int
    files: tuple[str, ...]
    deep: tuple[str, ...] = ()


def _entries(here: str) -> tuple[tuple[str, ...], list[os.DirEntry[str]]] | None:
    """The file names and the real subdirectories of ``here``, sorted by name; None when it cannot be listed."""
    try:
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
    except (OSError, ValueError):  # ValueError: a NUL byte in a ``top`` given by a caller
        return None
    files: list[str] = []
    dirs: list[os.DirEntry[str]] = []
    for e in entries:
        try:
            is_dir = e.is_dir()  # follows a link: a link to a directory is listed by os.walk as one, not a file
        except OSError:  # os.walk counts an entry it cannot stat as a file
            is_dir = False
        if not is_dir:
            files.append(e.name)
            continue
        try:
            if e.is_symlink():
                continue
        except OSError:  # pragma: no cover - d_type-less file system whose lstat fails: not entered, as a link
            continue
        dirs.append(e)
    return tuple(files), dirs


def walk_tree(
    top: str, max_depth: int = MAX_DEPTH, skip: Callable[[str, str], bool] | None = None
) -> Iterator[Listing]:
    """Each directory under ``top`` (``top`` first; a link given as ``top`` is followed, as ``os.walk`` does),
    as a :class:`Listing`, in ``os.walk``'s top-down order with sorted names (see the module's docstring).
    ``skip(parent, name)`` true: the subdirectory ``name`` of ``parent`` is neither entered nor named."""
    try:
        st = os.stat(top)
    except (OSError, ValueError):
        return
    seen = {(st.st_dev, st.st_ino)}  # marked when queued: a directory reachable twice is queued once
    stack = [(top, 0)]
    while stack:
        here, depth = stack.pop()
        listed = _entries(here)
        if listed is None:
            continue
        files, subdirs = listed
        below: list[str] = []
        deep: list[str] = []
        for e in subdirs:
            if skip is not None and skip(here, e.name):
                continue
            if depth >= max_depth:  # named, not entered (and not stat'ed: a deep wide tree costs one listing)
                deep.append(e.path)
                continue
            try:
                sub = e.stat(follow_symlinks=False)
            except OSError:  # gone since it was listed: os.walk's listing of it would fail, silently, too
                continue
            key = (sub.st_dev, sub.st_ino)
            if key not in seen:
                seen.add(key)
                below.append(e.path)
        yield Listing(here, depth, files, tuple(deep))
        # reversed: the stack pops the first name first, the order os.walk's recursion reads them in
        stack.extend((path, depth + 1) for path in reversed(below))
