"""What dpkg, Debian's package manager, records about the files it installed: which package lists a
``*.dist-info`` directory, and that package's md5sums.

dpkg keeps one file list per installed package, ``<root>/var/lib/dpkg/info/<package>.list`` (``<package>``
may carry its architecture, ``python3-yaml:amd64``): one absolute path per line, directories included. Its
``<package>.md5sums`` holds ``<md5 hex>  <path>`` lines (md5sum's text format; the path relative to the root,
without the leading ``/``) for the package's regular files (conffiles aside). A distro Python's distributions
(``/usr/lib/python3/dist-packages/PyYAML-6.0.dist-info``) are such files: their RECORD was written before
the package build stripped the shared libraries (dh_strip), so pip's RECORD hashes and sizes do not match,
and the owner's record is the md5sums.

``root`` is a parameter (tests give a fake tree, never the host's ``/var/lib/dpkg``). Reads are bounded
(file count and bytes per file) and malformed lines are skipped: nothing here raises for what it reads.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType

from pytest_cudastack._sysio import read_text

__all__ = [
    "INFO_DIR",
    "dist_info_package",
    "file_packages",
    "library_packages",
    "listing_packages",
    "md5sums",
    "md5sums_path",
    "recorded_md5",
    "reinstall_command",
]

INFO_DIR = "var/lib/dpkg/info"
_MAX_LISTS = 100_000  # .list files read (a full desktop has ~3,000)
_MAX_LIST_BYTES = 32 << 20  # bytes read of one .list / .md5sums file
_MD5_LINE = re.compile(r"([0-9a-fA-F]{32}) [ *](.+)")
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.\-]*(:[a-z0-9\-]+)?")  # Debian policy 5.6.1 package name, ":arch"


def _info_dir(root: str) -> str:
    return os.path.join(root, INFO_DIR)


def _list_texts(root: str) -> Iterator[tuple[str, str]]:
    """``(package, text)`` of each ``.list`` under ``root``, by name, at most ``_MAX_LISTS`` of them and
    ``_MAX_LIST_BYTES`` each; nothing without a dpkg database."""
    info = _info_dir(root)
    try:
        names = sorted(n for n in os.listdir(info) if n.endswith(".list"))[:_MAX_LISTS]
    except OSError:
        return
    for n in names:
        package = n[: -len(".list")]
        text = read_text(os.path.join(info, n), limit=_MAX_LIST_BYTES) if _PACKAGE.fullmatch(package) else None
        if text is not None:
            yield package, text


def _listed_paths(text: str) -> Iterator[str]:
    """The paths a ``.list`` names (absolute as written), normalised; malformed lines skipped."""
    for line in text.splitlines():
        if line.startswith("/") and "\x00" not in line:
            yield os.path.normpath(line)


@functools.lru_cache(maxsize=8)
def _dist_info_owners(root: str) -> Mapping[str, str]:
    """Every ``*.dist-info`` / ``*.egg-info`` path any ``.list`` under ``root`` names (as written, normalised)
    -> its package (the first ``.list`` by name wins); empty when there is no dpkg database."""
    out: dict[str, str] = {}
    for package, text in _list_texts(root):
        if ".dist-info" not in text and ".egg-info" not in text:  # most packages ship none: skip their lines
            continue
        for path in _listed_paths(text):
            if path.endswith((".dist-info", ".egg-info")):
                out.setdefault(path, package)
    return MappingProxyType(out)


def file_packages(root: str) -> Mapping[str, str]:
    """Every path the ``.list`` files under ``root`` name (as written: absolute in the system ``root`` is the
    root of, normalised) -> its package (the first ``.list`` by name wins); empty without a dpkg database.
    What an image's check asks of the files it finds: which ones a ``.deb`` installed."""
    out: dict[str, str] = {}
    for package, text in _list_texts(root):
        for path in _listed_paths(text):
            out.setdefault(path, package)
    return MappingProxyType(out)


@functools.lru_cache(maxsize=8)
def library_packages(root: str) -> Mapping[str, tuple[tuple[str, str], ...]]:
    """Every shared-library name the ``.list`` files under ``root`` name (a basename holding ``.so``:
    ``libcudart.so.11.0``) -> ``(listed path, package)`` of each, in ``.list`` order: which ``.deb`` put a
    soname in the system, whether or not its file is still there. Read once per root."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path, package in file_packages(root).items():
        name = os.path.basename(path)
        if ".so" in name:
            out.setdefault(name, []).append((path, package))
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


@functools.lru_cache(maxsize=4)
def _line_owners(root: str, _state: int) -> Mapping[str, str]:
    """Every line of every ``.list`` under ``root`` (as dpkg writes it: an absolute, normalised path) -> the
    first package by name that lists it. Read once per state of the database (``_state``: its ``info``
    directory's mtime, which a package's install or removal changes: dpkg renames its files into place)."""
    out: dict[str, str] = {}
    for package, text in _list_texts(root):
        for line in text.splitlines():
            out.setdefault(line, package)
    return MappingProxyType(out)


def _listed(path: str, root: str) -> str | None:
    """``path`` (absolute, normalised, under ``root``) as dpkg under ``root`` lists it, None outside it."""
    if root == os.sep:
        return path
    return path[len(root) :] if path.startswith(root + os.sep) else None


def _aliases(root: str) -> list[tuple[str, str]]:
    """``(alias, target)`` of each top-level directory of ``root`` that is a link to another one, as listed
    paths (merged-/usr: ``("/lib", "/usr/lib")``): a ``.deb`` may list a file by either spelling."""
    out: list[tuple[str, str]] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        host = os.path.join(root, name)
        if os.path.islink(host) and os.path.isdir(host):
            target = _as_listed(os.path.realpath(host), root)
            if target and target[0] != "/" + name:
                out.append(("/" + name, target[0]))
    return out


def listing_packages(paths: Iterable[str], root: str = "/") -> Mapping[str, str]:
    """Each of ``paths`` (absolute, on this machine, under ``root``) that a ``.list`` under ``root`` names ->
    the package that lists it (the first ``.list`` by name): the files a ``.deb`` installed that something
    else (a wheel's RECORD) lists too. A path is matched as it is spelt, by its real path, and by the
    spelling a top-level link gives it (a merged-/usr system lists ``/lib/x86_64-linux-gnu/libc.so.6`` for the
    file at ``/usr/lib/...``). Empty without a dpkg database."""
    info = _info_dir(root)
    try:
        state = os.stat(info).st_mtime_ns
    except OSError:
        return MappingProxyType({})
    base = os.path.normpath(os.path.abspath(root))
    owners = _line_owners(base, state)
    aliases = _aliases(base)
    real_dirs: dict[str, str] = {}  # a directory's real path, once per directory (a site has thousands of files)
    out: dict[str, str] = {}
    for path in paths:
        directory, name = os.path.split(os.path.normpath(path))
        if directory not in real_dirs:
            real_dirs[directory] = os.path.realpath(directory)
        both = dict.fromkeys((f"{directory}/{name}", f"{real_dirs[directory]}/{name}"))
        spellings = [s for p in both if (s := _listed(p, base)) is not None]
        spellings += [a + s[len(t) :] for s in list(spellings) for a, t in aliases if s.startswith(t + "/")]
        package = next((p for s in spellings if (p := owners.get(s)) is not None), None)
        if package is not None:
            out.setdefault(path, package)
    return MappingProxyType(out)


def _as_listed(path: str, root: str) -> list[str]:
    """``path`` (absolute, on this machine) as dpkg under ``root`` would list it: relative to ``root``, with a
    leading ``/``; its realpath too (a merged-/usr system lists ``/usr/lib``, a site may be spelt ``/lib``)."""
    r = os.path.normpath(os.path.abspath(root))
    out: list[str] = []
    for p in dict.fromkeys((os.path.normpath(os.path.abspath(path)), os.path.realpath(path))):
        if r == os.sep:
            out.append(p)
        elif p.startswith(r + os.sep):
            out.append(p[len(r) :])
    return out


def dist_info_package(dist_info: str, root: str = "/") -> str | None:
    """The dpkg package whose file list names the ``*.dist-info`` directory ``dist_info`` (under ``root``),
    None when none does (or there is no dpkg database)."""
    owners = _dist_info_owners(os.path.normpath(os.path.abspath(root)))
    if not owners:
        return None
    for p in _as_listed(dist_info, root):
        package = owners.get(p)
        if package is not None:
            return package
    return None


def md5sums_path(package: str, root: str = "/") -> str:
    """Where dpkg keeps ``package``'s md5sums under ``root``."""
    return os.path.join(_info_dir(root), f"{package}.md5sums")


def md5sums(package: str, root: str = "/") -> Mapping[str, str] | None:
    """Absolute path (under ``root``) -> lower-case md5 hex digest, from ``<package>.md5sums``; None when the
    package has no readable md5sums file. Lines that are not ``<32 hex> <space or *><path>``, paths with
    NUL, backslash escapes (md5sum's marker for odd names) or ``..`` components are skipped."""
    if not _PACKAGE.fullmatch(package):
        return None
    text = read_text(md5sums_path(package, root), limit=_MAX_LIST_BYTES)
    if text is None:
        return None
    base = os.path.normpath(os.path.abspath(root))
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _MD5_LINE.fullmatch(line)
        if m is None:
            continue
        digest, rel = m.groups()
        rel = rel.lstrip("/")
        if not rel or "\x00" in rel or "\\" in rel or ".." in rel.split("/"):
            continue
        out.setdefault(os.path.normpath(os.path.join(base, rel)), digest.lower())
    return MappingProxyType(out)


def recorded_md5(package: str, path: str, root: str = "/") -> str | None:
    """The md5 dpkg recorded for ``path`` (absolute, under ``root``; a real path) in ``package``'s md5sums,
    None when it records none. An entry is matched by its real path too: a merged-/usr system's md5sums may
    name ``lib/x`` for the file at ``usr/lib/x``."""
    sums = md5sums(package, root)
    if sums is None:
        return None
    digest = sums.get(os.path.normpath(path))
    if digest is not None:
        return digest
    name = os.path.basename(path)
    return next((d for p, d in sums.items() if os.path.basename(p) == name and os.path.realpath(p) == path), None)


def reinstall_command(package: str) -> str:
    """The command that puts a package's files back as dpkg records them."""
    return f"apt-get install --reinstall {package}"
