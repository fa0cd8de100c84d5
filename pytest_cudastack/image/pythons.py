"""The Python environments of an image, found from its files: each ``python3*`` on the image's ``PATH``
(its prefix is the directory above ``bin``) and the site directories that interpreter reads, its version
read from the files as CPython's own build fixes it (nothing is run): :func:`installation_version`.

Site directories per layout, as each interpreter's ``site.py`` builds them: a venv (``pyvenv.cfg`` beside
``bin``): ``PREFIX/lib/pythonX.Y/site-packages``, and its base interpreter's when
``include-system-site-packages = true``; Debian's patched CPython (``/usr``): ``/usr/local/lib/pythonX.Y/
dist-packages``, ``/usr/lib/python3/dist-packages``, ``/usr/lib/pythonX.Y/dist-packages``; any other
CPython: ``PREFIX/lib/pythonX.Y/site-packages``.

:func:`installation_version` takes host paths (an image's root, or this machine's ``/``): the requirement
markers of Debian's version-less ``/usr/lib/python3/dist-packages`` read it too
(:func:`~pytest_cudastack.wheels.requirements.site_python`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_cudastack._sysio import read_text
from pytest_cudastack.errors import ElfError
from pytest_cudastack.image.rootfs import ImageRoot
from pytest_cudastack.linker.elf import read_elf

__all__ = [
    "ImagePython",
    "PythonVersion",
    "image_interpreter",
    "image_pythons",
    "image_site_dirs",
    "installation_version",
]

_PYTHON = re.compile(r"python3(\.\d+t?)?")
_LIBDIR = re.compile(r"python3\.\d+t?")
_NAMED = re.compile(r"python(3)\.(\d+)(t?)")  # make install's bin/python3.X (python3.Xt: free-threaded)
_LIBPYTHON = re.compile(r"libpython(3)\.(\d+)(t?)\.so(\.[\d.]+)?")  # LDLIBRARY / INSTSONAME
_CFG_VERSION = re.compile(r"(3)\.(\d+)\.(\d+)")  # venv: "version = 3.11.2"; uv/virtualenv: version_info
_MAX_LINKS = 40  # as the kernel's limit on a chain of symbolic links


@dataclass(frozen=True)
class PythonVersion:
    """A CPython installation's ``X.Y`` (``X.Y.Z`` when a file states the micro: ``pyvenv.cfg``), whether it
    is the free-threaded build, and the file it was read from."""

    version: str
    threaded: bool
    evidence: str

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])


def _chain(exe: str) -> list[str]:
    """``exe`` and every file its symbolic links lead to, in order (an image root's links stay inside it)."""
    out = [exe]
    for _ in range(_MAX_LINKS):
        try:
            target = os.readlink(out[-1])
        except OSError:
            return out
        out.append(os.path.normpath(os.path.join(os.path.dirname(out[-1]), target)))
    return out


def _from_binary(exe: str) -> PythonVersion | None:
    """The version the interpreter file itself fixes: the ``libpython3.X.so`` it links (a shared build: the
    library is its version's), else the ``python3.X`` name ``make install`` gives the real file, here or
    along its links (``python3 -> python3.11``)."""
    chain = _chain(exe)
    try:
        needed = read_elf(chain[-1]).needed
    except (ElfError, OSError):
        needed = ()
    for name in needed:
        m = _LIBPYTHON.fullmatch(name)
        if m is not None:
            return PythonVersion(f"{m[1]}.{m[2]}", bool(m[3]), f"{os.path.basename(chain[-1])} links {name}")
    for path in reversed(chain):
        m = _NAMED.fullmatch(os.path.basename(path))
        if m is not None:
            return PythonVersion(f"{m[1]}.{m[2]}", bool(m[3]), f"the interpreter is {os.path.basename(path)}")
    return None


def _from_cfg(prefix: str) -> PythonVersion | None:
    """A venv's ``pyvenv.cfg`` ``version`` (the venv module's) or ``version_info`` (uv's, virtualenv's)."""
    text = read_text(os.path.join(prefix, "pyvenv.cfg"), limit=1 << 16)
    if text is None:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        m = _CFG_VERSION.match(value.strip()) if sep and key.strip().lower() in ("version", "version_info") else None
        if m is not None:
            return PythonVersion(m[0], False, f"pyvenv.cfg {key.strip().lower()} = {value.strip()}")
    return None


def _from_libdir(prefix: str) -> PythonVersion | None:
    """The one ``lib/python3.X[t]`` of ``prefix`` holding ``os.py`` (getpath's stdlib landmark); None when
    there is none or more than one (which one the interpreter is cannot be told)."""
    found: list[tuple[str, str]] = []
    for lib in ("lib", "lib64"):
        try:
            names = os.listdir(os.path.join(prefix, lib))
        except OSError:
            continue
        for n in names:
            if _LIBDIR.fullmatch(n) and os.path.isfile(os.path.join(prefix, lib, n, "os.py")):
                found.append((n, f"{lib}/{n}/os.py"))
    if len({n for n, _ in found}) != 1:
        return None
    name, where = found[0]
    return PythonVersion(name[len("python") :].rstrip("t"), name.endswith("t"), f"its only stdlib is {where}")


def installation_version(prefix: str, exe: str | None = None) -> PythonVersion | None:
    """The version of the CPython at ``prefix`` (a host path; ``exe``: its interpreter, default
    ``prefix/bin/python3``), read from the files as its build fixed it: the interpreter file (the
    ``libpython3.X`` it links, its ``python3.X`` name along its links); a venv's ``pyvenv.cfg`` (its micro too,
    kept when it agrees with the interpreter's ``X.Y``); else the prefix's one stdlib directory
    (``lib/python3.X/os.py``). None when the files do not say (a copied ``python3`` without a libpython, no
    pyvenv.cfg, several stdlibs or none): the version is then unknown, not guessed."""
    binary = _from_binary(exe if exe is not None else os.path.join(prefix, "bin", "python3"))
    cfg = _from_cfg(prefix)
    if binary is not None:
        if cfg is not None and cfg.minor == binary.minor and not binary.threaded:
            return PythonVersion(cfg.version, False, f"{binary.evidence}; {cfg.evidence}")
        return binary
    return cfg if cfg is not None else _from_libdir(prefix)


def _versions(image: ImageRoot, prefix: str) -> list[str]:
    try:
        names = os.listdir(image.host(os.path.join(prefix, "lib")))
    except OSError:
        return []
    return sorted(n for n in names if _LIBDIR.fullmatch(n))


def _cfg(image: ImageRoot, prefix: str) -> Mapping[str, str] | None:
    text = read_text(image.host(os.path.join(prefix, "pyvenv.cfg")), limit=1 << 16)  # never blocks on a FIFO
    if text is None:
        return None
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def _prefix_dirs(prefix: str, pydirs: list[str]) -> list[str]:
    out: list[str] = []
    for pydir in pydirs:
        if prefix == "/usr":  # Debian's site.py
            out += [f"/usr/local/lib/{pydir}/dist-packages", "/usr/lib/python3/dist-packages"]
            out += [f"/usr/lib/{pydir}/dist-packages"]
        out.append(f"{prefix}/lib/{pydir}/site-packages")
    return out


@dataclass(frozen=True)
class ImagePython:
    """A ``python3*`` on the image's ``PATH``: its image ``path`` (as found there), the ``prefix`` above its
    ``bin`` and its version (:func:`installation_version`; None: the files do not say)."""

    path: str
    prefix: str
    version: PythonVersion | None

    @property
    def pydirs(self) -> list[str]:
        """``python3.11`` (``python3.13t``): the name of its version's ``lib`` directories."""
        v = self.version
        return [f"python{v.minor}{'t' if v.threaded else ''}"] if v is not None else []


def image_pythons(image: ImageRoot) -> tuple[ImagePython, ...]:
    """Every ``python3*`` file on the image's ``PATH`` (``python3`` first in each directory), each file once
    (``python3`` and the ``python3.11`` it links to are one interpreter), with its version."""
    out: list[ImagePython] = []
    seen: set[str] = set()
    for bindir in image.env.get("PATH", "").split(":"):
        if not bindir.startswith("/"):
            continue
        try:
            names = sorted(os.listdir(image.host(bindir)), key=lambda n: (n != "python3", n))
        except OSError:
            continue
        prefix = os.path.dirname(os.path.normpath(bindir)) or "/"
        for name in names:
            host = image.host(os.path.join(bindir, name))
            real = os.path.realpath(host)
            if not _PYTHON.fullmatch(name) or not os.path.isfile(real) or real in seen:
                continue
            seen.add(real)
            version = installation_version(image.host(prefix), host)
            out.append(ImagePython(os.path.join(bindir, name), prefix, version))
    return tuple(out)


def image_site_dirs(image: ImageRoot) -> tuple[str, ...]:
    """The site directories (host paths under the image root) of every Python on the image's PATH, in PATH
    order, each once; existing directories only. An interpreter whose version the files do not say reads
    those of every ``lib/python3.X`` of its prefix (the container check says the version is unknown)."""
    found: list[str] = []
    for python in image_pythons(image):
        prefix = python.prefix
        pydirs = python.pydirs or _versions(image, prefix)
        cfg = _cfg(image, prefix)
        dirs = _prefix_dirs(prefix, pydirs)
        if cfg is not None and cfg.get("include-system-site-packages", "").lower() == "true":
            home = cfg.get("home", "")
            dirs += _prefix_dirs(os.path.dirname(os.path.normpath(home)), pydirs) if home.startswith("/") else []
        found += dirs
    out: list[str] = []
    for d in found:
        host = image.host(d)
        if os.path.isdir(host) and host not in out:
            out.append(host)
    return tuple(out)


def image_interpreter(image: ImageRoot) -> str | None:
    """The host path (under the image root) of the first ``python3*`` on the image's ``PATH`` that is a
    file, None when the image has no Python."""
    for bindir in image.env.get("PATH", "").split(":"):
        if not bindir.startswith("/"):
            continue
        try:
            names = sorted(os.listdir(image.host(bindir)), key=lambda n: (n != "python3", n))
        except OSError:
            continue
        for name in names:
            host = image.host(os.path.join(bindir, name))
            if _PYTHON.fullmatch(name) and os.path.isfile(host):
                return host
    return None
