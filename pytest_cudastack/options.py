"""The options of the pytest layer, declared once: ``OPTIONS``, one row per option.

A row carries everything an option is: its flags (``--cudastack-no-cache`` and its alias ``--no-cache``),
its ini key (or none), its environment variable (or none), its value parser, its default, how the command
line takes it (metavar, action, choices) and its help. From the rows come pytest's ``addoption``/``addini``
(``pytest_cudastack.plugin``), the ``cudastack check``/``snapshot`` arguments (``add_arguments``), the
``Settings`` resolution (``pytest_cudastack.settings.resolve``: command line > environment > ini > default)
and the ini keys ``cudastack check`` reads (``ini_types``). Adding an option is adding a row (and, for code
that reads it by name, its ``Settings`` field).

This module is read by every pytest session with the plugin installed, so it stays light: standard library
only, no dataclass; the version parsers (:mod:`pytest_cudastack.cuda.versions`) load when a value is parsed.
No pytest here: a parser raises ``ValueError``, which ``resolve`` turns into ``OptionError`` naming the option
and its source and the argparse ``type=`` functions into ``argparse.ArgumentTypeError``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

__all__ = [
    "OPTIONS",
    "UNMET_CHOICES",
    "Option",
    "add_arguments",
    "arch_list_type",
    "argparse_kwargs",
    "cuda_version_type",
    "driver_version_type",
    "env_value",
    "ini_types",
    "is_unset",
    "parse_bool",
    "parse_unmet",
    "row",
]

UNMET_CHOICES = ("fail", "skip")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class Option(NamedTuple):
    """One option of the pytest layer.

    ``key`` is its ``Settings`` field and argparse dest; ``flags`` its command-line spellings, the first the
    one messages name. ``parse`` turns a value from any source (a command-line string, an ini string or
    TOML value, an environment string, a plain value given to ``Settings.from_values``) into the value kept,
    raising ``ValueError`` for a bad one. ``ini`` is pytest's type of its ini key (named ``key``), None when it
    has no ini form; ``env`` its environment variable, None when it has none. ``action``: "store" (a value,
    checked by ``parse`` as argparse's ``type=`` unless ``choices`` are given), "store_true" (a flag) or
    "append" (repeatable; its environment variable holds the values separated by ``os.pathsep``). ``path``:
    its value names files, made absolute as ``settings.absolute_paths`` says.
    """

    key: str
    flags: tuple[str, ...]
    help: str
    parse: Callable[[Any], Any]
    default: Any = None
    ini: str | None = "string"
    env: str | None = None
    metavar: str | None = None
    action: str = "store"
    choices: tuple[str, ...] | None = None
    path: bool = False

    @property
    def name(self) -> str:
        """The spelling messages use: ``--cuda-max``."""
        return self.flags[0]


# parsers ---------------------------------------------------------------------------------------------


def parse_bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid boolean {value!r} (expected 1/0, true/false, yes/no)")


def parse_unmet(value: str) -> str:
    text = value.strip().lower()
    if text not in UNMET_CHOICES:
        raise ValueError(f"invalid value {value!r} (choose from {', '.join(UNMET_CHOICES)})")
    return text


def _text(raw: Any, *, numbers: bool = False) -> Any:
    """``raw`` as a parser of text takes it: a string or a bool; a TOML number read as written when
    ``numbers`` (``cuda_driver = 580``); anything else a ``ValueError``."""
    if numbers and isinstance(raw, int | float) and not isinstance(raw, bool):
        return str(raw)
    if not isinstance(raw, str | bool):
        raise ValueError(f"invalid value {raw!r} (expected a string)")
    return raw


def _flag(raw: Any) -> bool:
    return parse_bool(_text(raw))


def _unmet(raw: Any) -> str:
    return parse_unmet(_text(raw))


def _cuda(raw: Any) -> str:
    """``--cuda-max`` / ``--cuda-min``: MAJOR[.MINOR] (the bounds compare no patch level)."""
    # lazy: the options are registered in every pytest session; the parser loads when a value is given
    from pytest_cudastack.cuda.versions import parse_cuda

    return str(parse_cuda(_text(raw, numbers=True), patch=False))


def _driver(raw: Any) -> str:
    # lazy: as in _cuda
    from pytest_cudastack.cuda.versions import parse_driver

    return str(parse_driver(_text(raw, numbers=True)))


def _archs(raw: Any) -> tuple[str, ...]:
    # lazy: as in _cuda
    from pytest_cudastack.cuda.versions import parse_arch_list

    value: str | Iterable[str] = _text(raw, numbers=True) if not isinstance(raw, list | tuple) else raw
    return tuple(str(arch) for arch in parse_arch_list(value))


def _file(raw: Any) -> str:
    return str(raw)


def _files(raw: Any) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) else list(raw)
    return tuple(str(p) for p in items if str(p).strip())


def _modules(raw: Any) -> tuple[str, ...]:
    """``cudastack_imports``: dotted module names, each value split at commas and white space
    (``cupy.fft, cupyx.scipy.linalg``); a name that is not a dotted identifier is a ``ValueError``."""
    items = [raw] if isinstance(raw, str) else list(raw)
    out: list[str] = []
    for item in items:
        for name in str(item).replace(",", " ").split():
            if not all(part.isidentifier() for part in name.split(".")):
                raise ValueError(f"invalid module name {name!r} (expected a dotted name such as cupy.fft)")
            if name not in out:
                out.append(name)
    return tuple(out)


def _platform(raw: Any) -> str:
    """``linux/amd64``, ``linux/arm64/v8``: an OCI platform, os/architecture[/variant]."""
    text = str(_text(raw)).strip()
    parts = text.split("/")
    if not 2 <= len(parts) <= 3 or not all(p and p.replace("_", "").isalnum() for p in parts):
        raise ValueError(f"{text!r} is not a platform (os/architecture[/variant], e.g. linux/amd64)")
    return text


# the table -------------------------------------------------------------------------------------------

OPTIONS: tuple[Option, ...] = (
    Option(
        "cudastack",
        ("--cudastack",),
        "run all built-in CUDA stack invariant items (integrity, closure, driver, ...)",
        _flag,
        default=False,
        ini="bool",
        env="CUDASTACK",
        action="store_true",
    ),
    Option(
        "cuda_max",
        ("--cuda-max",),
        "nothing in the stack may require a CUDA newer than VER (e.g. 12.9); turns on that item",
        _cuda,
        env="CUDASTACK_CUDA_MAX",
        metavar="VER",
    ),
    Option(
        "cuda_min",
        ("--cuda-min",),
        "nothing in the stack may be built for a CUDA older than VER (e.g. 12.0); turns on that item",
        _cuda,
        env="CUDASTACK_CUDA_MIN",
        metavar="VER",
    ),
    Option(
        "cuda_driver",
        ("--cuda-driver",),
        "evaluate against this NVIDIA driver version (e.g. 550.54.15, or a branch: R580) instead of probing",
        _driver,
        env="CUDASTACK_CUDA_DRIVER",
        metavar="VER",
    ),
    Option(
        "cuda_arch",
        ("--cuda-arch",),
        "evaluate against these GPU architectures (e.g. sm_80,sm_90a or 9.0) instead of probing",
        _archs,
        default=(),
        env="CUDASTACK_CUDA_ARCH",
        metavar="sm_XX[,sm_YY]",
    ),
    Option(
        "cudastack_scan",
        ("--cudastack-scan",),
        "file or directory of binaries whose shared libraries must all resolve here (repeatable); "
        "turns on the scan items",
        _files,
        default=(),
        ini="linelist",
        env="CUDASTACK_SCAN",
        metavar="PATH",
        action="append",
        path=True,
    ),
    Option(
        "cudastack_imports",
        ("--cudastack-imports",),
        "module the project under test imports (repeatable; comma or space separated): a load failure it "
        "reaches is an error, not a warning",
        _modules,
        default=(),
        ini="linelist",
        env="CUDASTACK_IMPORTS",
        metavar="MODULE",
        action="append",
    ),
    # default true: the ini key is a "string" read by parse_bool (a "bool" key reads False when unset)
    Option(
        "cudastack_imports_scan",
        ("--cudastack-imports-scan",),
        "read the imports of the rootdir's own Python files (default true); false: only cudastack_imports "
        "and the installed packages' own top-level imports decide which load failures are errors",
        _flag,
        default=True,
        env="CUDASTACK_IMPORTS_SCAN",
        metavar="BOOL",
    ),
    Option(
        "cudastack_unmet",
        ("--cudastack-unmet",),
        "outcome of a test whose requires_* marker is unmet: fail (default) or skip",
        _unmet,
        default="fail",
        env="CUDASTACK_UNMET",
        choices=UNMET_CHOICES,
    ),
    Option(
        "cudastack_snapshot",
        ("--cudastack-snapshot",),
        "write the CUDA stack as JSON to FILE",
        _file,
        metavar="FILE",
        path=True,
    ),
    Option(
        "cudastack_baseline",
        ("--cudastack-baseline",),
        "fail on drift from the CUDA stack snapshot recorded in FILE; turns on that item",
        _file,
        env="CUDASTACK_BASELINE",
        metavar="FILE",
        path=True,
    ),
    Option(
        "cudastack_image",
        ("--cudastack-image",),
        "judge this deployment image instead of this machine: a root file system directory, an OCI image "
        "layout, an oci-archive or a docker save tarball (read offline; nothing in it is run)",
        _file,
        env="CUDASTACK_IMAGE",
        metavar="PATH",
        path=True,
    ),
    Option(
        "cudastack_image_platform",
        ("--cudastack-image-platform",),
        "the platform to pick from a multi-platform image index (default linux/amd64)",
        _platform,
        default="linux/amd64",
        env="CUDASTACK_IMAGE_PLATFORM",
        metavar="OS/ARCH[/VARIANT]",
    ),
    # design.md spells it --no-cache; the prefixed spelling matches every other option of the plugin. Its ini
    # key is a "string" read by parse_bool, as the environment is ("invalid boolean ...").
    Option(
        "cudastack_no_cache",
        ("--cudastack-no-cache", "--no-cache"),
        "do not read or write the on-disk ELF cache (also CUDASTACK_NO_CACHE=1)",
        _flag,
        default=False,
        env="CUDASTACK_NO_CACHE",
        action="store_true",
    ),
)


def row(key: str) -> Option:
    """The row of option ``key``; ``KeyError`` when there is none."""
    for option in OPTIONS:
        if option.key == key:
            return option
    raise KeyError(key)


def is_unset(raw: Any, option: Option | None = None) -> bool:
    """Whether a source leaves the option unset: ``None``, ``False``, ``""`` and empty sequences do; ``False``
    sets an ``option`` whose default is true (a TOML ``cudastack_imports_scan = false``)."""
    if raw is False and option is not None and option.default is True:
        return False
    return raw is None or raw is False or raw == "" or raw == () or raw == []


def env_value(option: Option, environ: Mapping[str, str]) -> Any:
    """The option's value in ``environ`` (a repeatable option's split at ``os.pathsep``), None when unset."""
    text = environ.get(option.env) if option.env else None
    if not text:
        return None
    if option.action == "append":
        return tuple(p for p in text.split(os.pathsep) if p)
    return text


def ini_types() -> dict[str, str]:
    """ini key -> pytest's ini type, for every option that has an ini form."""
    return {option.key: option.ini for option in OPTIONS if option.ini is not None}


# argparse --------------------------------------------------------------------------------------------


def _argparse_type(parse: Callable[[Any], Any], name: str) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    convert.__name__ = name  # argparse names the type in some of its messages
    return convert


cuda_version_type = _argparse_type(_cuda, "cuda_version")
driver_version_type = _argparse_type(_driver, "driver_version")
arch_list_type = _argparse_type(_archs, "arch_list")


def argparse_kwargs(option: Option) -> dict[str, Any]:
    """The keyword arguments of ``add_argument(*option.flags, **...)``, for argparse and pytest's ``addoption``.

    An unset option stores None (a flag too), so resolution can tell "not given" from a value."""
    kwargs: dict[str, Any] = {"dest": option.key, "help": option.help}
    if option.action == "store_true":
        kwargs.update(action="store_true", default=None)
    elif option.action == "append":
        kwargs.update(action="append", metavar=option.metavar)
    elif option.choices is not None:
        kwargs["choices"] = option.choices
    else:
        kwargs.update(metavar=option.metavar, type=_argparse_type(option.parse, option.key))
    return kwargs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option to an argparse parser (``cudastack check``, ``snapshot``); ``Settings.from_namespace``
    reads them."""
    for option in OPTIONS:
        parser.add_argument(*option.flags, **argparse_kwargs(option))
