"""The Python environments of an image, found from its files: each ``python3*`` on the image's ``PATH``
(its prefix is the directory above ``bin``) and the site directories that interpreter reads, its version
taken from the ``lib/pythonX.Y`` directory it has (nothing is run).

Site directories per layout, as each interpreter's ``site.py`` builds them: a venv (``pyvenv.cfg`` beside
``bin``): ``PREFIX/lib/pythonX.Y/site-packages``, and its base interpreter's when
``include-system-site-packages = true``; Debian's patched CPython (``/usr``): ``/usr/local/lib/pythonX.Y/
dist-packages``, ``/usr/lib/python3/dist-packages``, ``/usr/lib/pythonX.Y/dist-packages``; any other
CPython: ``PREFIX/lib/pythonX.Y/site-packages``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from pytest_cudastack.image.rootfs import ImageRoot

__all__ = ["image_interpreter", "image_site_dirs"]

_PYTHON = re.compile(r"python3(\.\d+)?")
_LIBDIR = re.compile(r"python3\.\d+")


def _versions(image: ImageRoot, prefix: str) -> list[str]:
    try:
        names = os.listdir(image.host(os.path.join(prefix, "lib")))
    except OSError:
        return []
    return sorted(n for n in names if _LIBDIR.fullmatch(n))


def _cfg(image: ImageRoot, prefix: str) -> Mapping[str, str] | None:
    try:
        with open(image.host(os.path.join(prefix, "pyvenv.cfg")), encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def _prefix_dirs(image: ImageRoot, prefix: str) -> list[str]:
    out: list[str] = []
    for pydir in _versions(image, prefix):
        if prefix == "/usr":  # Debian's site.py
            out += [f"/usr/local/lib/{pydir}/dist-packages", "/usr/lib/python3/dist-packages"]
            out += [f"/usr/lib/{pydir}/dist-packages"]
        out.append(f"{prefix}/lib/{pydir}/site-packages")
    return out


def image_site_dirs(image: ImageRoot) -> tuple[str, ...]:
    """The site directories (host paths under the image root) of every Python on the image's PATH, in PATH
    order, each once; existing directories only."""
    found: list[str] = []
    for bindir in image.env.get("PATH", "").split(":"):
        if not bindir.startswith("/"):
            continue
        try:
            names = sorted(os.listdir(image.host(bindir)))
        except OSError:
            continue
        if not any(_PYTHON.fullmatch(n) for n in names):
            continue
        prefix = os.path.dirname(os.path.normpath(bindir)) or "/"
        cfg = _cfg(image, prefix)
        dirs = _prefix_dirs(image, prefix)
        if cfg is not None and cfg.get("include-system-site-packages", "").lower() == "true":
            home = cfg.get("home", "")
            dirs += _prefix_dirs(image, os.path.dirname(os.path.normpath(home))) if home.startswith("/") else []
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
