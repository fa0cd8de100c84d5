"""A directory chain thousands of levels deep, built and removed without recursion (Python 3.11's ``os.walk``
and ``shutil.rmtree`` recurse once per level) and without long paths: every step goes through a directory
file descriptor. The robust-walk tests read such trees."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_cudastack.settings import ENV

__all__ = ["build_chain", "clean_run", "remove_chain"]

_DIR = os.O_RDONLY | os.O_DIRECTORY


def _write(name: str, data: bytes, dir_fd: int) -> None:
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
    try:
        os.write(out, data)
    finally:
        os.close(out)


def build_chain(top: Path, depth: int, files_at: Callable[[int], Mapping[str, bytes]]) -> None:
    """``top/d/d/.../d``, ``depth`` levels below ``top``; at each level, the files ``files_at(level)`` names
    (name -> bytes)."""
    fd = os.open(top, _DIR)
    try:
        for level in range(1, depth + 1):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
            for name, data in files_at(level).items():
                _write(name, data, fd)
    finally:
        os.close(fd)


def remove_chain(top: Path) -> None:
    """Remove the chain under ``top`` bottom up (``top`` itself stays)."""
    fds = [os.open(top, _DIR)]
    try:
        while "d" in os.listdir(fds[-1]):
            fds.append(os.open("d", _DIR, dir_fd=fds[-1]))
        while len(fds) > 1:
            fd = fds.pop()
            for name in os.listdir(fd):
                os.unlink(name, dir_fd=fd)
            os.close(fd)
            os.rmdir("d", dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


def clean_run(
    argv: Sequence[str], cwd: Path | None = None, cache: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` in a child with none of this package's settings from the test's environment (``cache``: its
    CUDASTACK_CACHE_DIR); the caller checks it ended without a traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ENV.values() and k != "PYTEST_ADDOPTS"}
    if cache is not None:
        env["CUDASTACK_CACHE_DIR"] = str(cache)
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
