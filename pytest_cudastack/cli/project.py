"""The configuration ``cudastack check`` and ``snapshot`` run under: pytest's, read as pytest would read it
in the same directory (:mod:`pytest_cudastack.inifile`), so the command and the plugin agree.

Precedence is the plugin's (:func:`pytest_cudastack.settings.resolve`): command line > environment > the
config file pytest would pick; relative paths in the file start at its directory, others at the working
directory, and the rootdir (what scan item names are relative to) is pytest's.
"""

from __future__ import annotations

import argparse
import os

from pytest_cudastack.inifile import ProjectConfig, find_config
from pytest_cudastack.settings import INI_TYPES, Settings, absolute_paths, add_arguments

__all__ = ["add_project_options", "project_settings"]


def add_project_options(parser: argparse.ArgumentParser, *, short_override: bool = True) -> None:
    """pytest's cudastack options plus the options that choose pytest's configuration."""
    add_arguments(parser)
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


def project_settings(args: argparse.Namespace) -> tuple[Settings, ProjectConfig]:
    """The settings pytest would resolve in the working directory with these options, and the config
    they were read from. ``OptionError`` for a bad value or an unusable ``-c`` / ``--rootdir``."""
    here = os.getcwd()
    config = find_config(
        here,
        inifile=getattr(args, "inifile", None),
        rootdir=getattr(args, "rootdir", None),
        overrides=getattr(args, "override_ini", None) or (),
    )
    settings = Settings.from_namespace(args, ini=config.getter(INI_TYPES))
    return absolute_paths(settings, here, config.ini_dir), config
