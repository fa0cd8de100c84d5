"""The ``cudastack`` command: the plugin's checks for humans and scripts.

Exit status: 0 clean, 1 findings, 2 usage or environment error (``EPILOG``). This module only parses
arguments and dispatches: subcommand NAME is ``cmd_NAME`` in ``pytest_cudastack/cli/NAME.py``, which holds
its work or calls the layer that does.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from pytest_cudastack import __version__
from pytest_cudastack.cli.sites import site_dirs_from

__all__ = ["EPILOG", "build_parser", "main"]

EPILOG = """exit status:
  0  clean: no findings (tree/why: everything resolves; diff: no drift)
  1  findings: an ERROR finding, a library not found, a failed import, drift
  2  usage or environment error: a bad option or value, an unreadable file or configuration"""

_OPTIONS_OF = ("check", "snapshot", "image")  # subcommands that take pytest's cudastack options


def _subcommand(name: str) -> ModuleType:
    # Imported when its subcommand runs, not here: `cudastack --help` and tree's warm path (tests/test_cli.py,
    # tests/test_treeview.py) must not pay for every subcommand's imports.
    return importlib.import_module(f"{__name__}.{name}")  # lazy: see above


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter with the width worked out here: argparse's own asks shutil, an import (with
    bz2 and lzma) that every run pays for because add_argument builds a formatter to validate arguments."""

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ["COLUMNS"])
        except (KeyError, ValueError):
            try:
                columns = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 80
            except (OSError, ValueError):
                columns = 80
        super().__init__(prog, width=max(columns - 2, 20))


class _EpilogFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """Keeps the exit-status table's lines as written."""


def _common_options(suppress: bool, no_cache: bool = True) -> argparse.ArgumentParser:
    """``--no-cache`` and ``--color``, taken before or after the subcommand name. After it, their defaults are
    SUPPRESS: argparse copies a subparser's defaults over the values the main parser already set."""
    common = argparse.ArgumentParser(add_help=False, formatter_class=_Formatter)
    if no_cache:
        common.add_argument(
            "--no-cache",
            action="store_true",
            default=argparse.SUPPRESS if suppress else False,
            help="do not read or write the on-disk ELF cache",
        )
    common.add_argument(
        "--color",
        choices=("auto", "yes", "no"),
        default=argparse.SUPPRESS if suppress else "auto",
        help="colour errors red and warnings yellow: auto (on a terminal, unless NO_COLOR is set), yes, no",
    )
    return common


def _site_options(common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    # Which Python environment's wheels to inspect: another venv can be checked without activating it.
    site = argparse.ArgumentParser(add_help=False, formatter_class=_Formatter, parents=[common])
    site.add_argument(
        "--site",
        action="append",
        metavar="DIR",
        help="a site-packages directory or venv prefix to inspect (repeatable; default: this interpreter's)",
    )
    return site


def _image_option(parser: argparse.ArgumentParser) -> None:
    """``--image PATH`` and ``--platform`` of ``tree`` and ``why`` (here, not in ``image.py``: building the
    parser must not import the checks)."""
    parser.add_argument(
        "--image",
        metavar="PATH",
        help="answer inside this deployment image (rootfs directory, OCI layout, oci-archive, docker save)",
    )
    parser.add_argument("--platform", metavar="OS/ARCH[/VARIANT]", help="the image to pick from a multi-platform index")


def build_parser(check_options: bool = True) -> argparse.ArgumentParser:
    """The whole parser; ``check_options=False`` leaves out ``check``'s and ``snapshot``'s pytest options,
    whose import the other subcommands need not pay for."""
    parser = argparse.ArgumentParser(
        prog="cudastack",
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=_EpilogFormatter,
        parents=[_common_options(suppress=False)],
    )
    parser.add_argument("--version", action="version", version=f"cudastack (pytest-cudastack) {__version__}")
    # An explicit prog keeps argparse from building a help formatter (and importing shutil) on every run.
    sub = parser.add_subparsers(dest="command", prog="cudastack")
    common = _common_options(suppress=True)
    site = _site_options(common)
    # check's and snapshot's --no-cache is the plugin's (the alias of --cudastack-no-cache in options.OPTIONS)
    project_site = _site_options(_common_options(suppress=True, no_cache=not check_options))
    as_json = argparse.ArgumentParser(add_help=False)  # every subcommand that prints data
    as_json.add_argument("--json", action="store_true", help="print JSON instead of text")

    report = sub.add_parser(
        "report",
        formatter_class=_Formatter,
        parents=[site, as_json],
        help="the stack on one screen, findings first (default)",
    )
    report.add_argument("-v", "--verbose", action="count", default=0, help="show more detail")

    tree = sub.add_parser(
        "tree",
        formatter_class=_Formatter,
        parents=[site, as_json],
        help="where the dynamic linker would load every needed library from",
    )
    tree.add_argument("paths", nargs="+", metavar="PATH")
    _image_option(tree)
    tree.add_argument(
        "--gpu-code",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also list each library's SASS and PTX (fatbin headers, cached; a cold run reads ~2x as long)",
    )

    why = sub.add_parser(
        "why",
        formatter_class=_Formatter,
        parents=[site, as_json],
        help="where SONAME would load from, and which distributions ship it",
    )
    why.add_argument("soname")
    _image_option(why)

    loaded = sub.add_parser(
        "loaded",
        formatter_class=_Formatter,
        parents=[common, as_json],
        help="import MODULE in a child process and list the shared objects it maps",
    )
    loaded.add_argument("module")
    loaded.add_argument(
        "--static",
        action="store_true",
        help="predict the objects the import maps from the files (import order, preloads, DT_NEEDED, already "
        "loaded by SONAME) without importing anything; each with its route and reason",
    )

    check = sub.add_parser(
        "check",
        formatter_class=_Formatter,
        parents=[project_site, as_json],
        help="run the invariant checks as the plugin would here; exit 1 on findings",
    )

    snapshot = sub.add_parser(
        "snapshot",
        formatter_class=_Formatter,
        parents=[project_site],
        help="write the stack as JSON, as the plugin's --cudastack-snapshot would here",
    )
    snapshot.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of standard output")
    image = sub.add_parser(
        "image",
        formatter_class=_Formatter,
        parents=[project_site, as_json],
        help="run the invariant checks on a deployment image (rootfs, OCI layout, oci-archive, docker save)",
    )
    if check_options:
        _subcommand("check").add_options(check)
        _subcommand("snapshot").add_options(snapshot)
        _subcommand("image").add_options(image)
        for takes_image in (check, snapshot):  # --image: the CLI's spelling of --cudastack-image
            takes_image.add_argument("--image", dest="cudastack_image", metavar="PATH", help=argparse.SUPPRESS)

    diff = sub.add_parser("diff", formatter_class=_Formatter, parents=[common, as_json], help="compare two snapshots")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")

    fleet = sub.add_parser(
        "fleet",
        formatter_class=_Formatter,
        parents=[common],
        help="group nodes' snapshots by stack fingerprint and name the odd ones out; exit 1 when groups differ",
    )
    fleet.add_argument("snapshots", nargs="+", metavar="SNAPSHOT", help="snapshot files, or directories of them")
    fleet.add_argument(
        "--against", metavar="SNAPSHOT", help="an environment's snapshot: would it run on each group's nodes?"
    )
    fleet.add_argument(
        "--format",
        choices=("text", "json", "prometheus", "nfd", "junit"),
        default="text",
        help="text (default), json (schemas/fleet.schema.json), prometheus (node-exporter textfile), "
        "nfd (node-feature-discovery feature file), junit (a testcase per node)",
    )
    return parser


def _missing_site(args: argparse.Namespace) -> str | None:
    """Why a ``--site DIR`` (or ``$CUDASTACK_SITE`` entry) of a subcommand that takes one cannot be read."""
    if not hasattr(args, "site"):
        return None
    source = "--site" if args.site else "$CUDASTACK_SITE"
    for directory in site_dirs_from(args) or ():
        if not os.path.isdir(directory):
            what = "no such directory" if not os.path.lexists(directory) else "not a directory"
            return f"{source} {directory}: {what}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(check_options=any(w in _OPTIONS_OF for w in words))
    args = parser.parse_args(words)
    if getattr(args, "no_cache", False):
        os.environ["CUDASTACK_NO_CACHE"] = "1"
    if args.command is None:
        args = parser.parse_args([*words, "report"])
    bad_site = _missing_site(args)
    if bad_site is not None:  # an unreadable input is a usage error (exit 2), not "no distributions"
        print(f"cudastack {args.command}: error: {bad_site}", file=sys.stderr)
        return 2
    try:
        handler: Callable[[argparse.Namespace], int] = getattr(_subcommand(args.command), f"cmd_{args.command}")
        return handler(args)
    except BrokenPipeError:
        # `cudastack tree ... | head` closed our stdout: not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
