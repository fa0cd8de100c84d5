"""What identifies a CUDA stack across machines: the bytes of each CUDA library, and one fingerprint.

:func:`library_files` lists a distribution's shared libraries as the snapshot records them: each one's RECORD
hash and the hash of the bytes on disk now, in RECORD's own spelling (``sha256=<urlsafe base64>``), so a file
another wheel overwrote (a cu12 cuDNN installed over cu13's, same paths) shows as bytes that are not its
RECORD's, and can be named as the other wheel's. Hashes are kept in the ELF cache's extras, keyed by the
file's (device, inode, size, mtime) as every cached fact is: a multi-GB venv is hashed once while unchanged.

:func:`stack_fingerprint` hashes what decides whether a job runs on a machine, read from a snapshot document
(so a reader can recompute it): the driver, kernel module and user-space driver versions, the GPU models and
archs, each CUDA wheel with its version and its libraries' RECORD and on-disk hashes, where the key sonames
resolve, and each scanned binary's resolution. The host name, notes and reasons are not in it: two nodes with
the same stack have the same fingerprint.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pytest_cudastack._sysio import open_span
from pytest_cudastack.errors import UnreadableFile

if TYPE_CHECKING:
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.wheels.inventory import Distribution

__all__ = ["FINGERPRINT_VERSION", "file_hash", "library_files", "stack_fingerprint"]

FINGERPRINT_VERSION = 1  # part of the hashed text: a change to what is hashed changes every fingerprint
_CHUNK = 1 << 20


def _digest(path: str) -> tuple[str | None, list[int] | None]:
    """``sha256=<urlsafe b64>`` of a regular file and its cache key; (None, None) when it cannot be read."""
    try:
        span, st = open_span(path, UnreadableFile)
    except UnreadableFile:
        return None, None
    h = hashlib.sha256()
    try:
        for chunk in span.chunks(_CHUNK):
            h.update(chunk)
    except OSError:
        return None, None
    finally:
        span.close()
    text = "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii")
    return text, [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def file_hash(path: str, cache: ElfCache | None = None) -> str | None:
    """The file's SHA-256 as RECORD spells it, None when it is missing or not a readable regular file;
    through ``cache``'s extras when given (a hit only while the file's device, inode, size and mtime agree)."""
    slot = f"sha256:{cache.file_slot(path) if cache is not None else path}"
    if cache is not None:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        hit = cache.get_extra(slot)
        key = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
        if isinstance(hit, dict) and hit.get("key") == key and isinstance(hit.get("sha256"), str):
            return str(hit["sha256"])
    digest, key_read = _digest(path)
    if cache is not None and digest is not None:
        cache.put_extra(slot, {"key": key_read, "sha256": digest})
    return digest


def library_files(dist: Distribution, cache: ElfCache | None = None) -> list[dict[str, Any]]:
    """Each shared library ``dist``'s RECORD lists: its RECORD path, RECORD hash and size, and the hash and
    size of the file on disk now (None when missing), sorted by path."""
    out = []
    for lib in dist.libraries:
        record = lib.record
        out.append(
            {
                "path": record.path if record is not None else os.path.relpath(lib.path, dist.location),
                "record": record.hash if record is not None else None,
                "record_size": record.size if record is not None else None,
                "sha256": file_hash(lib.path, cache) if lib.exists else None,
                "size": lib.size,
            }
        )
    return sorted(out, key=lambda f: str(f["path"]))


def _host_facts(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The node's driver facts (``--no-host`` snapshots have none: their fingerprint is the environment's)."""
    host = doc.get("host")
    if not isinstance(host, Mapping):
        return None
    return {
        "driver": host.get("driver_version"),
        "cuda": host.get("cuda_version"),
        "kernel_module": host.get("kernel_module"),
        "libcuda": host.get("libcuda_version"),
        "nvml": host.get("nvml_version"),
        "gpus": _sorted([str(g.get("name")), str(g.get("compute_capability", ""))] for g in host.get("gpus", ())),
    }


def _sorted(rows: Iterable[Any]) -> list[Any]:
    """In a total order whatever the rows hold (None beside strings)."""
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def _wheels(wheels: Iterable[Mapping[str, Any]]) -> list[Any]:
    return _sorted(
        [
            str(w.get("name")),
            str(w.get("version")),
            _sorted([str(f.get("path")), f.get("record"), f.get("sha256")] for f in w.get("files", ())),
            sorted(str(m) for m in w.get("missing", ())),
        ]
        for w in wheels
    )


def _resolved(rows: Iterable[Mapping[str, Any]]) -> list[Any]:
    # a library a wheel provides is identified by its wheel (whose bytes are hashed above) and file name, so
    # the same venv at another prefix on another node has the same fingerprint
    out = []
    for r in rows:
        path, provider = r.get("path"), r.get("provider")
        where = f"{provider}:{os.path.basename(path)}" if provider and path else path
        out.append([str(r.get("soname")), where])
    return _sorted(out)


def stack_fingerprint(doc: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` over what decides whether a job runs on this stack (see the module docstring), read
    from a snapshot document; the same for the same facts, in any order."""
    facts = {
        "fingerprint": FINGERPRINT_VERSION,
        "host": _host_facts(doc),
        "wheels": _wheels(doc.get("wheels", ())),
        "resolved": _resolved(doc.get("resolved", ())),
        "binaries": _sorted(
            [str(b.get("path")), _sorted([str(x.get("soname")), x.get("path")] for x in b.get("libraries", ()))]
            for b in doc.get("binaries", ())
        ),
    }
    text = json.dumps(facts, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
