"""The frozen ``Settings`` the options of the pytest layer resolve into, once per run.

The options themselves are the rows of :data:`pytest_cudastack.options.OPTIONS`; ``resolve`` reads them
from every source with the precedence command line > environment > ini > default, and a bad value raises
``OptionError`` naming the option and where the value came from. No pytest here: the plugin turns
``OptionError`` into a usage error (exit 4), the argparse ``type=`` functions (``cuda_version_type`` ...) turn
a bad command-line value into ``argparse.ArgumentTypeError``. Versions and archs are read by
:mod:`pytest_cudastack.cuda.versions`, as the markers and the compatibility data read them, so a value that
passes here never fails later; ``Settings`` keeps their normal spelling ("R580" -> "580", "9.0" -> "sm_90").
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from pytest_cudastack import options
from pytest_cudastack.checks import enabled_checks
from pytest_cudastack.errors import OptionError
from pytest_cudastack.options import (
    UNMET_CHOICES,
    add_arguments,
    arch_list_type,
    cuda_version_type,
    driver_version_type,
    parse_bool,
    parse_unmet,
)

__all__ = [
    "ENV",
    "UNMET_CHOICES",
    "Settings",
    "absolute_paths",
    "add_arguments",
    "arch_list_type",
    "cuda_version_type",
    "driver_version_type",
    "parse_bool",
    "parse_unmet",
    "resolve",
]

ENV: Mapping[str, str] = MappingProxyType({o.key: o.env for o in options.OPTIONS if o.env is not None})
"""option key -> its environment variable (a view of ``options.OPTIONS``, for callers that clear them)."""


def _default(key: str) -> Any:
    return options.row(key).default


@dataclass(frozen=True)
class Settings:
    """Every option of the pytest layer (``options.OPTIONS``: one field per row, its default the row's),
    resolved once (command line > environment > ini > default).

    ``sources`` maps each option that was set to where it came from ("command line", "CUDASTACK_CUDA_MAX",
    "ini"), so messages can say "--cuda-max (ini) is 12.9".
    """

    cudastack: bool = _default("cudastack")
    cuda_max: str | None = _default("cuda_max")
    cuda_min: str | None = _default("cuda_min")
    cuda_driver: str | None = _default("cuda_driver")
    cuda_arch: tuple[str, ...] = _default("cuda_arch")
    cudastack_scan: tuple[str, ...] = _default("cudastack_scan")
    cudastack_imports: tuple[str, ...] = _default("cudastack_imports")
    cudastack_imports_scan: bool = _default("cudastack_imports_scan")
    cudastack_unmet: str = _default("cudastack_unmet")
    cudastack_snapshot: str | None = _default("cudastack_snapshot")
    cudastack_baseline: str | None = _default("cudastack_baseline")
    cudastack_image: str | None = _default("cudastack_image")
    cudastack_image_platform: str = _default("cudastack_image_platform")
    cudastack_no_cache: bool = _default("cudastack_no_cache")
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @classmethod
    def from_values(cls, **values: Any) -> Settings:
        """Build from plain values (the ``cudastack check`` command); ``None`` means unset.

        Strings are parsed as on the command line; a bad one raises ``OptionError`` naming the option.
        """
        return resolve(cli=values)

    @classmethod
    def from_namespace(
        cls,
        args: argparse.Namespace,
        environ: Mapping[str, str] | None = None,
        ini: Mapping[str, Any] | Callable[[str], Any] | None = None,
    ) -> Settings:
        """From ``add_arguments``' parsed options, with the environment and then ``ini`` (a getter such as
        :meth:`pytest_cudastack.inifile.ProjectConfig.getter`'s) below them (``cudastack check``, ``snapshot``)."""
        env = os.environ if environ is None else environ
        return resolve(cli={o.key: getattr(args, o.key, None) for o in options.OPTIONS}, env=env, ini=ini)

    # which generated items run --------------------------------------------------------------------
    @property
    def items(self) -> tuple[str, ...]:
        """Names of the invariant items turned on, in run order (``checks.CHECKS``). A per-target check
        (scan) is not among them: its items are named after its targets (``scan[bin/train]``)."""
        return tuple(check.name for check in enabled_checks(self) if check.targets is None)

    @property
    def active(self) -> bool:
        """True when any option asks for work (checks, snapshot, declared facts)."""
        return bool(enabled_checks(self) or self.cudastack_snapshot or self.cuda_driver or self.cuda_arch)

    def source(self, key: str) -> str:
        return dict(self.sources).get(key, "default")

    def named(self, key: str) -> str:
        """``"--cuda-max (from ini)"``: the option and, when not the command line or the default, its source."""
        src = self.source(key)
        return options.row(key).name + ("" if src in ("command line", "default") else f" (from {src})")

    def describe(self, key: str) -> str:
        """``"--cuda-max=12.9 (from ini)"``: the option, its value and where the value came from."""
        value = getattr(self, key)
        if isinstance(value, tuple):
            value = ",".join(value)
        src = self.source(key)
        suffix = "" if src in ("command line", "default") else f" (from {src})"
        return f"{options.row(key).name}={value}{suffix}"

    def with_values(self, **values: Any) -> Settings:
        return replace(self, **values)


def absolute_paths(settings: Settings, invocation_dir: str, ini_dir: str | None) -> Settings:
    """``settings`` with its path options (``Option.path``) made absolute as the plugin makes them: a value
    from the ini file relative to the file's directory, any other relative to the invocation directory."""

    def absolute(key: str, path: str) -> str:
        base = ini_dir if settings.source(key) == "ini" and ini_dir is not None else invocation_dir
        return os.path.normpath(os.path.join(base, os.path.expanduser(path)))

    changes: dict[str, Any] = {}
    for option in options.OPTIONS:
        value = getattr(settings, option.key)
        if not option.path or value is None:
            continue
        if isinstance(value, tuple):
            changes[option.key] = tuple(absolute(option.key, p) for p in value)
        else:
            changes[option.key] = absolute(option.key, value)
    return settings.with_values(**changes)


def resolve(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    ini: Mapping[str, Any] | Callable[[str], Any] | None = None,
) -> Settings:
    """Resolve every option of ``options.OPTIONS`` once: ``cli`` (already parsed or plain strings), then
    ``env``, then ``ini``, then the row's default.

    ``ini`` is a mapping or a getter such as pytest's ``config.getini`` (asked only for the options that have
    an ini form, and only for those the command line and environment leave unset); a ``ValueError`` it
    raises (pytest's own reading of a "bool" value) is a bad value of that option. ``None``, ``False``,
    ``""`` and empty sequences count as unset (``options.is_unset``). Raises ``OptionError`` naming the
    option and its source.
    """
    cli_values = cli or {}
    env_values = env or {}

    def from_ini(option: options.Option) -> Any:
        if ini is None or option.ini is None:  # getini refuses an unregistered key
            return None
        return ini(option.key) if callable(ini) else ini.get(option.key)

    layers: Sequence[tuple[Callable[[options.Option], str], Callable[[options.Option], Any]]] = (
        (lambda o: "command line", lambda o: cli_values.get(o.key)),
        (lambda o: o.env or "environment", lambda o: options.env_value(o, env_values)),
        (lambda o: "ini", from_ini),
    )
    values: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    for option in options.OPTIONS:
        for where, layer in layers:
            src = where(option)
            try:
                raw = layer(option)
                if options.is_unset(raw, option):
                    continue
                values[option.key] = option.parse(raw)
            except ValueError as e:
                raise OptionError(f"{option.name} (from {src}): {e}") from e
            sources.append((option.key, src))
            break
    return Settings(**values, sources=tuple(sources))
