"""Options of the pytest layer: help texts, value parsers and the frozen ``Settings`` they resolve into.

Each option has one help constant, used by the pytest option, its ini key and the ``cudastack check``
command. Values are resolved once, with the precedence command line > environment > ini > default
(``resolve``); a bad value raises ``OptionError`` naming the option and where the value came from.
No pytest here: the plugin turns ``OptionError`` into a usage error (exit 4), argparse ``type=`` functions
(``cuda_version_type`` ...) turn it into ``argparse.ArgumentTypeError``. Versions and archs are read by
:mod:`pytest_cudastack.cuda.versions`, as the markers and the compatibility data read them, so a value that
passes here never fails later; ``Settings`` keeps their normal spelling ("R580" -> "580", "9.0" -> "sm_90").
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_cudastack.checks import enabled_checks
from pytest_cudastack.errors import OptionError

__all__ = [
    "ENV",
    "HELP",
    "INI_TYPES",
    "UNMET_CHOICES",
    "Settings",
    "absolute_paths",
    "add_arguments",
    "arch_list_type",
    "cuda_version_type",
    "driver_version_type",
    "option_specs",
    "parse_unmet",
    "resolve",
]

UNMET_CHOICES = ("fail", "skip")

# option dest (= ini key) -> help text. Defined once; the plugin and the CLI both read from here.
HELP: dict[str, str] = {
    "cudastack": "run all built-in CUDA stack invariant items (integrity, closure, driver, ...)",
    "cuda_max": "nothing in the stack may require a CUDA newer than VER (e.g. 12.9); turns on that item",
    "cuda_min": "nothing in the stack may be built for a CUDA older than VER (e.g. 12.0); turns on that item",
    "cuda_driver": "evaluate against this NVIDIA driver version (e.g. 550.54.15, or a branch: R580) instead of probing",
    "cuda_arch": "evaluate against these GPU architectures (e.g. sm_80,sm_90a or 9.0) instead of probing",
    "cudastack_scan": "file or directory of binaries whose shared libraries must all resolve here "
    "(repeatable); turns on the scan items",
    "cudastack_unmet": "outcome of a test whose requires_* marker is unmet: fail (default) or skip",
    "cudastack_snapshot": "write the CUDA stack as JSON to FILE",
    "cudastack_baseline": "fail on drift from the CUDA stack snapshot recorded in FILE; turns on that item",
    "cudastack_no_cache": "do not read or write the on-disk ELF cache (also CUDASTACK_NO_CACHE=1)",
}

# ini key -> pytest ini type (keys absent here have no ini form)
INI_TYPES: dict[str, str] = {
    "cudastack": "bool",
    "cuda_max": "string",
    "cuda_min": "string",
    "cuda_driver": "string",
    "cuda_arch": "string",
    "cudastack_scan": "linelist",
    "cudastack_unmet": "string",
    "cudastack_snapshot": "string",
    "cudastack_baseline": "string",
    "cudastack_no_cache": "string",  # read by parse_bool, as from the environment ("invalid boolean ...")
}

# option dest -> environment variable (between the command line and the ini file in precedence)
ENV: dict[str, str] = {
    "cudastack": "CUDASTACK",
    "cuda_max": "CUDASTACK_CUDA_MAX",
    "cuda_min": "CUDASTACK_CUDA_MIN",
    "cuda_driver": "CUDASTACK_CUDA_DRIVER",
    "cuda_arch": "CUDASTACK_CUDA_ARCH",
    "cudastack_scan": "CUDASTACK_SCAN",
    "cudastack_unmet": "CUDASTACK_UNMET",
    "cudastack_baseline": "CUDASTACK_BASELINE",
    "cudastack_no_cache": "CUDASTACK_NO_CACHE",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def _cuda_option(value: str) -> str:
    """``--cuda-max`` / ``--cuda-min``: MAJOR[.MINOR] (the bounds compare no patch level)."""
    # lazy: the option types are registered in every pytest session; the parser loads when a value is given
    from pytest_cudastack.cuda.versions import parse_cuda

    return str(parse_cuda(value, patch=False))


def _driver_option(value: str) -> str:
    # lazy: as in _cuda_option
    from pytest_cudastack.cuda.versions import parse_driver

    return str(parse_driver(value))


def _arch_option(value: str | Iterable[str]) -> tuple[str, ...]:
    # lazy: as in _cuda_option
    from pytest_cudastack.cuda.versions import parse_arch_list

    return tuple(str(arch) for arch in parse_arch_list(value))


def parse_unmet(value: str) -> str:
    text = value.strip().lower()
    if text not in UNMET_CHOICES:
        raise ValueError(f"invalid value {value!r} (choose from {', '.join(UNMET_CHOICES)})")
    return text


def parse_bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid boolean {value!r} (expected 1/0, true/false, yes/no)")


def _argparse_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    convert.__name__ = name  # argparse names the type in some of its messages
    return convert


cuda_version_type = _argparse_type(_cuda_option, "cuda_version")
driver_version_type = _argparse_type(_driver_option, "driver_version")
arch_list_type = _argparse_type(_arch_option, "arch_list")

_VERSIONED = ("cuda_max", "cuda_min", "cuda_driver", "cuda_arch")
_PARSERS: dict[str, Callable[[Any], Any]] = {
    "cudastack": parse_bool,
    "cuda_max": _cuda_option,
    "cuda_min": _cuda_option,
    "cuda_driver": _driver_option,
    "cuda_arch": _arch_option,
    "cudastack_unmet": parse_unmet,
    "cudastack_no_cache": parse_bool,
}


def option_specs() -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """``(flags, argparse keyword arguments)`` of every option, shared by pytest and ``cudastack check``."""
    specs: list[tuple[str | tuple[str, ...], dict[str, Any]]] = [
        ("--cudastack", {"action": "store_true", "default": None, "help": HELP["cudastack"]}),
        ("--cuda-max", {"metavar": "VER", "type": cuda_version_type, "help": HELP["cuda_max"]}),
        ("--cuda-min", {"metavar": "VER", "type": cuda_version_type, "help": HELP["cuda_min"]}),
        ("--cuda-driver", {"metavar": "VER", "type": driver_version_type, "help": HELP["cuda_driver"]}),
        ("--cuda-arch", {"metavar": "sm_XX[,sm_YY]", "type": arch_list_type, "help": HELP["cuda_arch"]}),
        ("--cudastack-scan", {"metavar": "PATH", "action": "append", "help": HELP["cudastack_scan"]}),
        ("--cudastack-unmet", {"choices": UNMET_CHOICES, "help": HELP["cudastack_unmet"]}),
        ("--cudastack-snapshot", {"metavar": "FILE", "help": HELP["cudastack_snapshot"]}),
        ("--cudastack-baseline", {"metavar": "FILE", "help": HELP["cudastack_baseline"]}),
        # design.md spells it --no-cache; the prefixed spelling matches every other option of the plugin.
        (
            ("--cudastack-no-cache", "--no-cache"),
            {"action": "store_true", "default": None, "dest": "cudastack_no_cache", "help": HELP["cudastack_no_cache"]},
        ),
    ]
    return [((flags,) if isinstance(flags, str) else flags, kwargs) for flags, kwargs in specs]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options to an argparse parser (``cudastack check``); ``Settings.from_namespace`` reads them."""
    for flags, kwargs in option_specs():
        parser.add_argument(*flags, **kwargs)


def _option_name(key: str) -> str:
    return "--" + key.replace("_", "-")


@dataclass(frozen=True)
class Settings:
    """Every option of the pytest layer, resolved once (command line > environment > ini > default).

    ``sources`` maps each option that was set to where it came from ("command line", "CUDASTACK_CUDA_MAX",
    "ini"), so messages can say "--cuda-max (ini) is 12.9".
    """

    cudastack: bool = False
    cuda_max: str | None = None
    cuda_min: str | None = None
    cuda_driver: str | None = None
    cuda_arch: tuple[str, ...] = ()
    cudastack_scan: tuple[str, ...] = ()
    cudastack_unmet: str = "fail"
    cudastack_snapshot: str | None = None
    cudastack_baseline: str | None = None
    cudastack_no_cache: bool = False
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
        return resolve(cli={key: getattr(args, key, None) for key in HELP}, env=env, ini=ini)

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

    def describe(self, key: str) -> str:
        """``"--cuda-max=12.9 (ini)"``: the option, its value and where the value came from."""
        value = getattr(self, key)
        if isinstance(value, tuple):
            value = ",".join(value)
        src = self.source(key)
        suffix = "" if src in ("command line", "default") else f" (from {src})"
        return f"{_option_name(key)}={value}{suffix}"

    def with_values(self, **values: Any) -> Settings:
        return replace(self, **values)


def absolute_paths(settings: Settings, invocation_dir: str, ini_dir: str | None) -> Settings:
    """``settings`` with its path options made absolute as the plugin makes them: a value from the ini file
    relative to the file's directory, any other relative to the invocation directory."""

    def absolute(key: str, path: str) -> str:
        base = ini_dir if settings.source(key) == "ini" and ini_dir is not None else invocation_dir
        return os.path.normpath(os.path.join(base, os.path.expanduser(path)))

    changes: dict[str, Any] = {"cudastack_scan": tuple(absolute("cudastack_scan", p) for p in settings.cudastack_scan)}
    for key in ("cudastack_snapshot", "cudastack_baseline"):
        value = getattr(settings, key)
        if value is not None:
            changes[key] = absolute(key, value)
    return settings.with_values(**changes)


def _split_env(key: str, value: str) -> Any:
    if key == "cudastack_scan":
        return tuple(p for p in value.split(os.pathsep) if p)
    return value


def resolve(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    ini: Mapping[str, Any] | Callable[[str], Any] | None = None,
) -> Settings:
    """Resolve every option once: ``cli`` (already parsed or plain strings), then ``env``, then ``ini``.

    ``ini`` is a mapping or a getter such as pytest's ``config.getini`` (asked only for the keys of
    ``INI_TYPES``, and only for those the command line and environment leave unset); a ``ValueError`` it
    raises (pytest's own reading of a "bool" value) is a bad value of that option. ``None``, ``False``,
    ``""`` and empty sequences count as unset. Raises ``OptionError`` naming the option and its source.
    """
    cli_values = cli or {}
    env_values = env or {}

    def from_env(key: str) -> Any:
        var = ENV.get(key)
        return _split_env(key, env_values[var]) if var and env_values.get(var) else None

    def from_ini(key: str) -> Any:
        if ini is None:
            return None
        if callable(ini):
            return ini(key) if key in INI_TYPES else None  # getini refuses an unregistered key
        return ini.get(key)

    layers: Sequence[tuple[str, Callable[[str], Any]]] = (
        ("command line", cli_values.get),
        ("environment", from_env),
        ("ini", from_ini),
    )
    values: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    for key in HELP:
        for where, layer in layers:
            src = ENV.get(key, where) if where == "environment" else where
            try:
                raw = layer(key)
                if raw is None or raw is False or raw == "" or raw == () or raw == []:
                    continue
                values[key] = _convert(key, raw)
            except ValueError as e:
                raise OptionError(f"{_option_name(key)} (from {src}): {e}") from e
            sources.append((key, src))
            break
    return Settings(**values, sources=tuple(sources))


def _convert(key: str, raw: Any) -> Any:
    if key == "cudastack_scan":
        items = [raw] if isinstance(raw, str) else list(raw)
        return tuple(str(p) for p in items if str(p).strip())
    if key in ("cudastack_snapshot", "cudastack_baseline"):
        return str(raw)
    if key in _VERSIONED and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = str(raw)  # a TOML number (cuda_driver = 580, cuda_arch = 90): read as written
    if key == "cuda_arch":
        return _arch_option(raw)
    if not isinstance(raw, (str, bool)):
        raise ValueError(f"invalid value {raw!r} (expected a string)")
    return _PARSERS[key](raw)
