"""``cudastack image PATH [--cuda-driver VER] [--cuda-arch sm_XX] [--platform OS/ARCH] [--json]``: the checks
of ``cudastack check`` judging a deployment image instead of this machine (a root file system directory, an
OCI image layout, an oci-archive or a ``docker save`` tarball, read offline: :mod:`pytest_cudastack.image`).
It is ``cudastack check --cudastack-image=PATH``: the same items, exit codes and JSON document, which names
the image (``"image"``) and, for each finding about an image file, its layer and history step.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from pytest_cudastack.cli.check import add_options as add_check_options
from pytest_cudastack.cli.check import cmd_check

if TYPE_CHECKING:
    from pytest_cudastack.stack import Stack

__all__ = ["add_options", "cmd_image", "image_stack"]

PLATFORM_HELP = "the image to pick from a multi-platform index (default linux/amd64)"


def image_stack(args: argparse.Namespace) -> Stack:
    """The stack of ``args.image`` (``tree --image``, ``why --image``): its search, its wheels; opened on first
    use (ImageError, a CudaStackError, when it cannot be read)."""
    # lazy: tree's warm path imports no stack
    from pytest_cudastack.settings import Settings
    from pytest_cudastack.stack import Stack

    settings = Settings.from_values(
        cudastack_image=os.path.abspath(args.image),
        cudastack_image_platform=getattr(args, "platform", None),
        cudastack_no_cache=bool(getattr(args, "no_cache", False)) or None,
    )
    return Stack(settings)


def add_options(parser: argparse.ArgumentParser) -> None:
    """``check``'s options, the image's PATH and ``--platform``."""
    add_check_options(parser)
    parser.add_argument("image_path", metavar="PATH", help="the image: rootfs directory, OCI layout or tarball")
    parser.add_argument(
        "--platform",
        metavar="OS/ARCH[/VARIANT]",
        help=PLATFORM_HELP + " (as --cudastack-image-platform)",
    )


def cmd_image(args: argparse.Namespace) -> int:
    """``cudastack image PATH``: ``cudastack check`` with ``--cudastack-image=PATH``."""
    args.cudastack_image = args.image_path
    if args.platform:
        args.cudastack_image_platform = args.platform
    return cmd_check(args, prog="image")
