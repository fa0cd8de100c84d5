"""The configuration ``cudastack check`` and ``snapshot`` run under: pytest's, read as pytest would read it
in the same directory (:mod:`pytest_cudastack.inifile`), so the command and the plugin agree.

Precedence is the plugin's (:func:`pytest_cudastack.settings.resolve`): command line > environment > the
config file pytest would pick; relative paths in the file start at its directory, others at the working
directory, and the rootdir (what scan item names are relative to) is pytest's. The options pytest adds to its
command line are added here too, in pytest's order (``Config.parse``): the file's ``addopts``, then
``$PYTEST_ADDOPTS``, then the words given (a repeatable option collects from all three, for the others the
last one wins); ``-c`` / ``--rootdir`` / ``-o`` are read from ``$PYTEST_ADDOPTS`` as pytest reads them.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence

from pytest_cudastack import options
from pytest_cudastack.errors import OptionError
from pytest_cudastack.inifile import ProjectConfig, find_config
from pytest_cudastack.settings import Settings, absolute_paths

__all__ = ["add_project_options", "project_settings"]


def add_project_options(parser: argparse.ArgumentParser, *, short_override: bool = True) -> None:
    """pytest's cudastack options (``options.OPTIONS``) plus the options that choose pytest's configuration."""
    options.add_arguments(parser)
    group = parser.add_argument_group("configuration (as pytest reads it)")
    group.add_argument(
        "-c",
        "--config-file",
        metavar="FILE",
        dest="inifile",
        help="read the configuration from FILE instead of the file pytest would find",
    )
    group.add_argument("--rootdir", metavar="DIR", help="pytest's rootdir (scan item names are relative to it)")
    flags = ("-o", "--override-ini") if short_override else ("--override-ini",)
    group.add_argument(
        *flags,
        dest="override_ini",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a configuration value, as pytest's -o does (repeatable)",
    )


def _parse_words(words: Sequence[str], where: str) -> argparse.Namespace:
    """The cudastack and configuration options among ``words`` (pytest's own and other plugins' options are
    left alone, as pytest's ``parse_known_args`` leaves them to their owners)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    add_project_options(parser)
    try:
        return parser.parse_known_args(list(words))[0]
    except argparse.ArgumentError as e:
        raise OptionError(f"{e} (via {where})") from e


def _merged(first: argparse.Namespace, then: argparse.Namespace) -> argparse.Namespace:
    """``then``'s options after ``first``'s, as argparse would read them from one command line: a repeatable
    option collects from both, for the others the later one wins."""
    out = argparse.Namespace(**vars(then))
    for option in options.OPTIONS:
        early, late = getattr(first, option.key, None), getattr(then, option.key, None)
        if option.action == "append":
            setattr(out, option.key, [*(early or ()), *(late or ())] or None)
        elif late is None:
            setattr(out, option.key, early)
    return out


def project_settings(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[Settings, ProjectConfig]:
    """The settings pytest would resolve in the working directory with these options, and the config
    they were read from. ``OptionError`` for a bad value or an unusable ``-c`` / ``--rootdir``."""
    env = os.environ if environ is None else environ
    here = os.getcwd()
    try:
        env_words = shlex.split(env.get("PYTEST_ADDOPTS", ""))
    except ValueError as e:
        raise OptionError(f"PYTEST_ADDOPTS: {e}") from e
    env_ns = _parse_words(env_words, "PYTEST_ADDOPTS")
    given = argparse.Namespace(
        inifile=getattr(args, "inifile", None) or env_ns.inifile,
        rootdir=getattr(args, "rootdir", None) or env_ns.rootdir,
        override_ini=[*env_ns.override_ini, *(getattr(args, "override_ini", None) or ())],
    )
    config = find_config(here, inifile=given.inifile, rootdir=given.rootdir, overrides=given.override_ini)
    try:
        ini_words = config.get("addopts", "args") or []
    except ValueError as e:
        raise OptionError(str(e)) from e
    added = _parse_words([*ini_words, *env_words], "addopts")
    if added.override_ini != env_ns.override_ini:  # -o in the file's addopts: applied once more (pytest #14442)
        overrides = [*added.override_ini, *(getattr(args, "override_ini", None) or ())]
        config = find_config(here, inifile=given.inifile, rootdir=given.rootdir, overrides=overrides)
    settings = Settings.from_namespace(_merged(added, args), environ=env, ini=config.getter(options.ini_types()))
    return absolute_paths(settings, here, config.ini_dir), config
