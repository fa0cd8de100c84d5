"""Read-only access to an image's files: blobs and JSON documents in a directory or inside a tar archive.

An archive's members are read in place (``tarfile`` random access); a member must be a regular file, and a
name is looked up as the archive spells it, with or without a leading ``./``. Nothing is extracted.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from typing import IO, Any

from pytest_cudastack.errors import CudaStackError

__all__ = ["JSON_LIMIT", "BlobStore", "ImageError", "blob_path", "open_store"]

JSON_LIMIT = 16 << 20  # bytes: an index, manifest or config of a real image is a few KB
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class ImageError(CudaStackError, ValueError):
    """An image cannot be read: not one of the formats, a missing or malformed document or blob, a digest
    that does not match, a hostile or truncated layer. The message names the image and what is wrong."""


def blob_path(digest: object) -> str:
    """``blobs/sha256/HEX`` for a ``sha256:HEX`` digest; ImageError for any other spelling (a digest is the
    only name a descriptor gives, so nothing else can reach a path)."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ImageError(f"unsupported or malformed digest {digest!r} (sha256:<64 hex digits> expected)")
    return "blobs/sha256/" + digest.split(":", 1)[1]


class BlobStore:
    """The files of an image directory (``archive`` None) or of a tar archive, by relative name."""

    def __init__(self, path: str, archive: tarfile.TarFile | None) -> None:
        self.path = path
        self._archive = archive
        self._members: dict[str, tarfile.TarInfo] = {}
        if archive is not None:
            for member in archive:  # the index of names, read once
                name = os.path.normpath(member.name.lstrip("/"))
                self._members.setdefault(name, member)

    def close(self) -> None:
        if self._archive is not None:
            self._archive.close()

    def exists(self, name: str) -> bool:
        if self._archive is None:
            return os.path.isfile(self._local(name))
        return name in self._members

    def _local(self, name: str) -> str:
        # names come from this module's callers: fixed names or blob_path(); never "..".
        return os.path.join(self.path, name)

    def open(self, name: str) -> IO[bytes]:
        """The member or file ``name`` opened for reading; ImageError when absent or not a regular file."""
        if self._archive is None:
            local = self._local(name)
            if os.path.islink(local) or not os.path.isfile(local):
                raise ImageError(f"{self.path}: {name} is missing or not a regular file")
            try:
                return open(local, "rb")
            except OSError as e:
                raise ImageError(f"{self.path}: cannot read {name}: {e.strerror or e}") from e
        member = self._members.get(name)
        if member is None or not member.isfile():
            raise ImageError(f"{self.path}: {name} is missing from the archive or not a regular file")
        try:
            f = self._archive.extractfile(member)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ImageError(f"{self.path}: cannot read {name} from the archive: {e}") from e
        if f is None:
            raise ImageError(f"{self.path}: cannot read {name} from the archive")
        return f

    def locate(self, name: str) -> tuple[str, int, int] | None:
        """``(file, offset, size)``: where the bytes of ``name`` lie in a plain file (a blob of a directory, a
        member of an uncompressed archive), so that they can be read in place; None when they do not (a
        compressed archive, a missing or irregular member)."""
        if self._archive is None:
            local = self._local(name)
            if os.path.islink(local) or not os.path.isfile(local):
                return None
            return local, 0, os.path.getsize(local)
        member = self._members.get(name)
        if member is None or not member.isfile() or member.issparse():
            return None
        if not isinstance(self._archive.fileobj, io.BufferedReader):  # the archive is compressed
            return None
        return self.path, member.offset_data, member.size

    def size(self, name: str) -> int | None:
        if self._archive is None:
            try:
                return os.stat(self._local(name)).st_size
            except OSError:
                return None
        member = self._members.get(name)
        return member.size if member is not None else None

    def read_json(self, name: str) -> Any:
        """The JSON document ``name`` (at most ``JSON_LIMIT`` bytes); ImageError naming it otherwise."""
        with self.open(name) as f:
            try:
                raw = f.read(JSON_LIMIT + 1)
            except (OSError, EOFError, tarfile.TarError) as e:
                raise ImageError(f"{self.path}: cannot read {name}: {e}") from e
        if len(raw) > JSON_LIMIT:
            raise ImageError(f"{self.path}: {name} is larger than {JSON_LIMIT} bytes")
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise ImageError(f"{self.path}: {name} is not JSON: {e}") from e


def open_store(path: str) -> BlobStore:
    """A directory as itself, a regular file as a tar archive (plain or compressed, as ``tarfile`` reads it);
    ImageError when it is neither."""
    if os.path.isdir(path):
        return BlobStore(path, None)
    if not os.path.isfile(path):
        raise ImageError(f"{path}: not a directory or a regular file")
    try:
        archive = tarfile.open(path, "r:*")  # noqa: SIM115 - kept open by the BlobStore, closed by its close()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ImageError(f"{path}: not a tar archive or image directory: {e}") from e
    try:
        return BlobStore(path, archive)
    except (tarfile.TarError, OSError, EOFError) as e:
        archive.close()
        raise ImageError(f"{path}: truncated or corrupt archive: {e}") from e
