"""The version a CUDA compiler tool (``ptxas``, ``nvlink``, ``fatbinary``, ``nvcc``) states, read from its file.

Every CUDA tool embeds the line its ``--version`` prints ("Cuda compilation tools, release 13.0, V13.0.88");
frameworks run ``TOOL --version`` to learn it (XLA's ``GetToolVersion`` matches ``V(\\d+).(\\d+).(\\d+)``,
triton's ``NvidiaTool.from_path`` matches ``release (\\d+.\\d+)``). We never run the tool: the file is streamed
in bounded chunks and the first such line is taken. A small wrapper script that only ``exec``s an absolute
path (``exec /usr/local/cuda-13.0/bin/nvcc "$@"``, as images install into ``/usr/local/bin``) states the
version of that file (one hop). A file without either has no version (``release`` None).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from pytest_cudastack._sysio import open_span
from pytest_cudastack.errors import ElfError

__all__ = ["MAX_TOOL_FILE", "ToolVersion", "read_tool_version"]

_LINE = re.compile(rb"Cuda compilation tools, release (\d{1,3})\.(\d{1,3}), V(\d{1,3})\.(\d{1,3})\.(\d{1,6})")
_CHUNK = 1 << 20
_OVERLAP = 96  # longer than any match: a line split across two chunks is still found
MAX_TOOL_FILE = 1 << 30  # ptxas 13.0 is 38 MB; beyond this the file is not a CUDA tool we read
_RELEASE = re.compile(r"\d{1,3}\.\d{1,3}")
_WRAPPER = 4096  # a wrapper script is a few lines; a larger script is not followed
_EXEC = re.compile(rb'^\s*exec\s+(/[^\s"\'$`;&|]+)\s+"\$@"\s*$', re.MULTILINE)
_FULL = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,6}")


@dataclass(frozen=True)
class ToolVersion:
    """``release`` ("12.2", the CUDA release) and ``version`` ("12.2.140") the file states; None when none."""

    path: str
    release: str | None
    version: str | None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "release": self.release, "version": self.version}

    @classmethod
    def from_json(cls, raw: Any) -> ToolVersion:
        """The inverse of :meth:`to_json`; ElfError for anything else (a corrupt cache)."""
        if not isinstance(raw, dict) or set(raw) != {"path", "release", "version"}:
            raise ElfError("malformed tool version facts")
        path, release, version = raw["path"], raw["release"], raw["version"]
        if (
            not isinstance(path, str)
            or not (release is None or (isinstance(release, str) and _RELEASE.fullmatch(release)))
            or not (version is None or (isinstance(version, str) and _FULL.fullmatch(version)))
            or (release is None) != (version is None)
        ):
            raise ElfError("malformed tool version facts")
        return cls(path=path, release=release, version=version)


def read_tool_version(path: str, *, follow: bool = True) -> ToolVersion:
    """The version line embedded in the file at ``path``, read in 1 MiB chunks (never executed; never more
    than ``MAX_TOOL_FILE`` bytes), or that of the file a wrapper script ``exec``s (``follow``: one hop).
    ElfError naming the file when it cannot be opened or read."""
    span, st = open_span(path)
    try:
        if st.st_size > MAX_TOOL_FILE:
            raise ElfError(f"{path}: {st.st_size} bytes, larger than any CUDA tool ({MAX_TOOL_FILE} read at most)")
        tail = first = b""
        done = 0
        while done < MAX_TOOL_FILE:
            try:
                chunk = span.pread(_CHUNK, done)
            except OSError as e:
                raise ElfError(f"{path}: cannot read: {e.strerror or e}") from e
            if not chunk:
                break
            first = first or chunk
            done += len(chunk)
            window = tail + chunk
            m = _LINE.search(window)
            if m is not None:
                release = f"{int(m[1])}.{int(m[2])}"
                return ToolVersion(path, release, f"{int(m[3])}.{int(m[4])}.{int(m[5])}")
            tail = window[-_OVERLAP:]
        if follow and st.st_size <= _WRAPPER and first.startswith(b"#!"):
            target = _EXEC.findall(first)
            if len(target) == 1:
                try:
                    got = read_tool_version(os.fsdecode(target[0]), follow=False)
                except ElfError:
                    return ToolVersion(path, None, None)
                return ToolVersion(path, got.release, got.version)
        return ToolVersion(path, None, None)
    finally:
        span.close()
