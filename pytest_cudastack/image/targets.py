"""What of an image is its own software to check: the program its ``Entrypoint``/``Cmd`` runs (looked up on
the image's ``PATH`` as ``execvp`` looks a bare name up) and every ELF executable in its ``PATH``
directories that no OS package installed (the distribution's own binaries are consistent by construction,
and there are hundreds of them).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping

from pytest_cudastack.image.rootfs import ImageRoot
from pytest_cudastack.linker.elf import looks_like_elf

__all__ = ["image_binaries"]


def _elf_executable(host: str) -> bool:
    try:
        st = os.stat(host)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111) and looks_like_elf(host)


def _program(image: ImageRoot) -> str | None:
    """The image path of the program the container runs first, None when there is none or it is not found."""
    words = image.entrypoint or image.cmd
    if not words:
        return None
    first = words[0]
    if first.startswith("/"):
        return first
    if "/" in first:
        return os.path.normpath(os.path.join(image.workdir, first))
    for d in image.env.get("PATH", "").split(":"):
        candidate = os.path.join(d or ".", first)
        if d.startswith("/") and os.path.isfile(image.host(candidate)):
            return candidate
    return None


def _real_paths(image: ImageRoot, paths: Iterable[str]) -> frozenset[str]:
    """The image paths ``paths`` name once their directories' symbolic links are followed inside the image: a
    merged-/usr image's dpkg lists ``/bin/bash`` (the path the ``.deb`` holds) for the file at ``/usr/bin/bash``
    (``/bin`` is a link to ``usr/bin``). Each directory is resolved once; the final name is kept as written."""
    real_dirs: dict[str, str | None] = {}
    out: set[str] = set()
    for path in paths:
        directory, name = os.path.split(path)
        if directory not in real_dirs:
            real_dirs[directory] = image.image_path(os.path.realpath(image.host(directory)))
        real = real_dirs[directory]
        if real is not None:
            out.add(os.path.join(real, name))
    return frozenset(out)


def image_binaries(image: ImageRoot, packaged: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """``(image path, host path)`` of each binary to check, the container's program first; ``packaged`` is
    what the OS package databases list (``wheels.dpkg.file_packages``, ``wheels.apk.file_packages``), by
    image path as listed (the real path of each is compared, so a merged-/usr image's ``/bin/x`` is its
    ``/usr/bin/x``)."""
    owned = _real_paths(image, packaged)
    out: dict[str, str] = {}  # host realpath -> image path
    program = _program(image)
    candidates: list[tuple[str, bool]] = [(program, True)] if program else []
    for d in image.env.get("PATH", "").split(":"):
        try:
            names = sorted(os.listdir(image.host(d))) if d.startswith("/") else []
        except OSError:
            continue
        candidates.extend((os.path.join(d, n), False) for n in names)
    for path, always in candidates:
        host = image.host(path)
        real = os.path.realpath(host)
        real_image = image.image_path(real)
        if real_image is None or real in out or not _elf_executable(real):
            continue
        if not always and (path in packaged or real_image in packaged or real_image in owned):
            continue
        out[real] = path
    return tuple((path, host) for host, path in out.items())
