"""Which Python environment's wheels ``cudastack report``, ``check`` and ``snapshot`` inspect.

``args.site`` (a list; the CLI's repeatable ``--site DIR``), else ``$CUDASTACK_SITE`` (``os.pathsep``-separated),
else None: this interpreter's ``sys.path`` (see :func:`pytest_cudastack.wheels.sitepaths.site_dirs`).
"""

from __future__ import annotations

import argparse
import os

__all__ = ["site_dirs_from"]


def site_dirs_from(args: argparse.Namespace | None) -> tuple[str, ...] | None:
    """``args.site``, else ``$CUDASTACK_SITE``, else None (this interpreter)."""
    site = getattr(args, "site", None) if args is not None else None
    if site:
        return tuple(str(s) for s in site)
    env = os.environ.get("CUDASTACK_SITE", "")
    dirs = tuple(p for p in env.split(os.pathsep) if p)
    return dirs or None
