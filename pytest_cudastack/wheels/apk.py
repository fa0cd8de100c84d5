"""What apk, Alpine's package manager, records about the files it installed: which package lists a path.

apk keeps its installed database in ``<root>/lib/apk/db/installed`` (apk-tools ``src/database.c``:
``apk_db_layer_name`` gives ``lib/apk/db`` for the root layer, ``apk_db_fdb_write`` writes it): one block per
package, blocks separated by an empty line, each line ``<letter>:<value>``: ``P:`` the package's name,
``F:`` a directory it owns (relative to the root, without a leading ``/``), then ``R:`` each file of that
directory it owns (the name only), with its ``a:`` attributes and ``Z:`` checksum. A file's path is its
``F:`` line's directory joined with its ``R:`` name.

``root`` is a parameter (an image's root; never read on this machine). Reads are bounded and malformed
lines are skipped: nothing here raises for what it reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

from pytest_cudastack._sysio import read_text

__all__ = ["INSTALLED", "file_packages"]

INSTALLED = "lib/apk/db/installed"
_MAX_BYTES = 64 << 20  # a full Alpine desktop's installed file is a few MB


def file_packages(root: str) -> Mapping[str, str]:
    """Every file the installed database under ``root`` lists (as an absolute path of the system ``root``
    is the root of, normalised) -> its package (the first block that lists it); empty without a database."""
    text = read_text(os.path.join(root, INSTALLED), limit=_MAX_BYTES)
    if text is None:
        return MappingProxyType({})
    out: dict[str, str] = {}
    package = ""
    directory: str | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not line:  # the end of a package's block
            package, directory = "", None
        elif not sep or len(key) != 1 or "\x00" in value:
            continue
        elif key == "P":
            package = value
        elif key == "F":
            directory = value.strip("/")
        elif key == "R" and package and directory is not None and value and "/" not in value:
            path = os.path.normpath("/" + os.path.join(directory, value))
            out.setdefault(path, package)
    return MappingProxyType(out)
