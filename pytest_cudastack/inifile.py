"""The configuration file pytest would pick, read without pytest: what ``cudastack check`` and ``snapshot``
resolve their options against, so that the command and the plugin agree in the same directory.

The search is pytest's (docs: "Configuration > Initialization: determining rootdir and configfile"; source:
``_pytest/config/findpaths.py``, ``determine_setup`` and ``locate_config``): with ``-c FILE`` that file, the
rootdir its directory; else, from the common ancestor of the arguments (the invocation directory when there
are none) upwards, the first directory holding one of ``pytest.toml``, ``.pytest.toml`` (pytest >= 9),
``pytest.ini``, ``.pytest.ini``, ``pyproject.toml`` with ``[tool.pytest.ini_options]`` (or, pytest >= 9,
``[tool.pytest]``), ``tox.ini`` with ``[pytest]``, ``setup.cfg`` with ``[tool:pytest]``; a ``pyproject.toml``
without a pytest table is the config file only when nothing else is found; with no file at all the rootdir is
the nearest ancestor holding ``setup.py``, else the common ancestor. ``--rootdir`` overrides the rootdir;
``-o key=value`` overrides a value. Values convert as ``Config.getini`` converts them for their ini type:
in "ini mode" (ini files, ``[tool.pytest.ini_options]``) strings are split or read as truth values; in TOML
mode (``[tool.pytest]``, ``[pytest]`` of ``pytest.toml``) the native type must match.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import PurePath
from typing import Any

import iniconfig

from pytest_cudastack.errors import OptionError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself requires tomli before 3.11
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

__all__ = ["ConfigValue", "ProjectConfig", "config_names", "find_config", "load_config_file"]


@dataclass(frozen=True)
class ConfigValue:
    """One value as the file holds it; ``mode`` is "ini" (strings, lists of strings) or "toml" (native)."""

    value: object
    mode: str


@dataclass(frozen=True)
class ProjectConfig:
    """pytest's rootdir, the config file (None when there is none) and its values."""

    rootdir: str
    inipath: str | None
    values: tuple[tuple[str, ConfigValue], ...] = ()

    def get(self, key: str, kind: str) -> Any:
        """``key`` converted as ``Config.getini`` converts an ini option of type ``kind`` ("string",
        "bool", "linelist", "args"); None when the file does not set it. ``ValueError`` for a value of the
        wrong type (pytest: a usage error)."""
        found = dict(self.values).get(key)
        if found is None:
            return None
        value, where = found.value, self.inipath
        if found.mode == "toml":
            expected = {"string": str, "bool": bool, "linelist": list, "args": list}[kind]
            if not isinstance(value, expected) or (
                kind in ("linelist", "args") and not all(isinstance(x, str) for x in value)  # type: ignore[attr-defined]
            ):
                raise ValueError(f"{where}: config option {key!r} expects a {kind}, got {_short(value)}")
            return list(value) if isinstance(value, list) else value
        if not isinstance(value, str) and not all(isinstance(x, str) for x in value):  # type: ignore[attr-defined]
            # INI mode keeps a TOML list as it is: pytest's argument parser stops on [1, 2] with a TypeError
            raise ValueError(f"{where}: config option {key!r} expects a list of strings, got {_short(value)}")
        if kind == "linelist":
            if isinstance(value, str):
                return [stripped for line in value.split("\n") if (stripped := line.strip())]
            return list(value)  # type: ignore[call-overload]
        if kind == "args":
            return shlex.split(value) if isinstance(value, str) else list(value)  # type: ignore[call-overload]
        if kind == "bool":
            return strtobool(str(value).strip())
        return value

    def getter(self, types: Mapping[str, str]) -> Callable[[str], Any]:
        """A ``config.getini``-like reader of the keys in ``types`` (ini key -> ini type), for
        :func:`pytest_cudastack.settings.resolve`."""

        def get(key: str) -> Any:
            return self.get(key, types[key]) if key in types else None

        return get

    @property
    def ini_dir(self) -> str | None:
        """Where relative paths set in the file start (pytest's ``config.inipath.parent``)."""
        return os.path.dirname(self.inipath) if self.inipath else None


def _short(value: object) -> str:
    """``repr(value)``, cut to 200 characters (a config value can be a 4000-digit integer)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__} that cannot be shown"
    return text if len(text) <= 200 else text[:200] + "..."


def strtobool(value: str) -> bool:
    """pytest's ``_strtobool`` (distutils' ``strtobool``): y/yes/t/true/on/1, n/no/f/false/off/0."""
    text = value.lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(f"invalid truth value {value!r}")


def _pytest_major() -> int:
    try:
        return int(metadata.version("pytest").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return 8


def config_names(pytest_major: int | None = None) -> tuple[str, ...]:
    """The file names pytest looks for in each directory, in its order of precedence."""
    major = _pytest_major() if pytest_major is None else pytest_major
    native = ("pytest.toml", ".pytest.toml") if major >= 9 else ()
    return (*native, "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def _text(path: str) -> str:
    """The file's text as pytest reads it (``Path.read_text(encoding="utf-8")``, iniconfig's ``open``):
    UTF-8, in universal-newlines mode (``\r\n`` and a lone ``\r`` end a line). Bytes that are not UTF-8
    (where pytest stops with a traceback) are an ``OptionError`` naming the file and the offset."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OptionError(f"cannot read {path}: {e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OptionError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _ini_sections(path: str) -> iniconfig.IniConfig:
    text = _text(path)
    try:
        return iniconfig.IniConfig(path, data=text)
    except iniconfig.ParseError as e:
        raise OptionError(str(e)) from e


def _ini_values(section: iniconfig.SectionWrapper) -> dict[str, ConfigValue]:
    return {k: ConfigValue(v, "ini") for k, v in section.items()}


def _toml(path: str) -> dict[str, Any]:
    text = _text(path)
    try:
        doc: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise OptionError(f"{path}: {e}") from e
    except RecursionError as e:  # tomllib recurses once per nested array or inline table
        raise OptionError(f"{path}: arrays or tables nested too deeply") from e
    except ValueError as e:  # an integer over the interpreter's digit limit (sys.set_int_max_str_digits)
        raise OptionError(f"{path}: {e}") from e
    return doc


def _ini_scalar(path: str, key: str, value: object) -> ConfigValue:
    """A value of ``[tool.pytest.ini_options]`` in INI mode (findpaths.py's ``make_scalar``: scalars become
    strings, lists stay); an integer too long for ``str`` or a structure too deep is an ``OptionError``
    naming the file and key (pytest stops with a traceback)."""
    try:
        return ConfigValue(tuple(value) if isinstance(value, list) else str(value), "ini")
    except (ValueError, RecursionError) as e:
        raise OptionError(f"{path}: config option {key!r}: {type(e).__name__}: {str(e)[:200]}") from e


def _tool_pytest(path: str, doc: Mapping[str, Any], major: int) -> dict[str, ConfigValue] | None:
    tool = doc.get("tool", {})
    table = tool.get("pytest", {}) if isinstance(tool, dict) else {}
    table = table if isinstance(table, dict) else {}
    native = {k: v for k, v in table.items() if k != "ini_options"} if major >= 9 else {}
    ini = table.get("ini_options")
    if native and ini is not None:
        raise OptionError(f"{path}: Cannot use both [tool.pytest] and [tool.pytest.ini_options] simultaneously")
    if native:
        return {k: ConfigValue(v, "toml") for k, v in native.items()}
    if isinstance(ini, dict):
        # INI mode: scalars become strings, lists stay (findpaths.py's make_scalar)
        return {k: _ini_scalar(path, k, v) for k, v in ini.items()}
    return None


def _pytest_table(path: str, doc: Mapping[str, Any]) -> dict[str, ConfigValue] | None:
    table = doc.get("pytest")
    if isinstance(table, dict):
        return {k: ConfigValue(v, "toml") for k, v in table.items()}
    top = [k for k, v in doc.items() if not isinstance(v, dict)]
    if top:
        raise OptionError(f"{path}: pytest configuration must be under a [pytest] table (found {', '.join(top)})")
    return None


def load_config_file(path: str, pytest_major: int | None = None) -> dict[str, ConfigValue] | None:
    """The pytest configuration in ``path``, chosen by name then by suffix as pytest chooses its loader;
    None when the file holds none (a ``pytest.ini`` always holds some, possibly empty)."""
    major = _pytest_major() if pytest_major is None else pytest_major
    name = os.path.basename(path)
    suffix = PurePath(name).suffix
    if name in ("pytest.toml", ".pytest.toml") and major >= 9:
        return _pytest_table(path, _toml(path)) or {}
    if name in ("pytest.ini", ".pytest.ini"):
        sections = _ini_sections(path)
        return _ini_values(sections["pytest"]) if "pytest" in sections else {}
    if name == "pyproject.toml":
        return _tool_pytest(path, _toml(path), major)
    if suffix == ".ini":
        sections = _ini_sections(path)
        return _ini_values(sections["pytest"]) if "pytest" in sections else None
    if suffix == ".cfg":
        sections = _ini_sections(path)
        if "tool:pytest" in sections:
            return _ini_values(sections["tool:pytest"])
        if "pytest" in sections:
            raise OptionError(
                f"{path}: [pytest] section in setup.cfg files is no longer supported, change to [tool:pytest] instead."
            )
        return None
    if suffix == ".toml":
        doc = _toml(path)
        found = _tool_pytest(path, doc, major)
        return found if found is not None or major < 9 else _pytest_table(path, doc)
    return None


def name_unknown(path: str, pytest_major: int | None = None) -> bool:
    """True when pytest has no loader for ``path`` (neither by name nor by suffix)."""
    name = os.path.basename(path)
    return name not in config_names(pytest_major) and PurePath(name).suffix not in (".ini", ".cfg", ".toml")


def _ancestors(path: str) -> Iterable[str]:
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _common_ancestor(invocation_dir: str, paths: Iterable[str]) -> str:
    existing = [p for p in paths if os.path.exists(p)]
    if not existing:
        return invocation_dir
    common = os.path.commonpath(existing)
    return os.path.dirname(common) if os.path.isfile(common) else common


def _locate(invocation_dir: str, dirs: Sequence[str], major: int) -> tuple[str, str, dict[str, ConfigValue]] | None:
    pyproject: str | None = None
    for start in dirs or [invocation_dir]:
        for base in _ancestors(start):
            for name in config_names(major):
                p = os.path.join(base, name)
                if os.path.isfile(p):
                    if name == "pyproject.toml" and pyproject is None:
                        pyproject = p
                    found = load_config_file(p, major)
                    if found is not None:
                        return base, p, found
    if pyproject is not None:
        return os.path.dirname(pyproject), pyproject, {}
    return None


def find_config(
    invocation_dir: str | None = None,
    args: Sequence[str] = (),
    *,
    inifile: str | None = None,
    rootdir: str | None = None,
    overrides: Sequence[str] = (),
    pytest_major: int | None = None,
) -> ProjectConfig:
    """pytest's ``determine_setup``: the rootdir, config file and values for a run from ``invocation_dir``
    (default: the working directory) with free arguments ``args``, ``-c inifile``, ``--rootdir`` and
    ``-o key=value`` overrides. ``OptionError`` where pytest reports a usage error."""
    major = _pytest_major() if pytest_major is None else pytest_major
    here = os.path.abspath(invocation_dir or os.getcwd())
    given = [os.path.abspath(os.path.join(here, a.split("::")[0])) for a in args if not a.startswith("-")]
    dirs = [p if os.path.isdir(p) else os.path.dirname(p) for p in given if os.path.exists(p)]
    root: str | None = None
    inipath: str | None = None
    values: dict[str, ConfigValue] = {}
    if inifile:
        inipath = os.path.abspath(os.path.join(here, inifile))
        if not os.path.exists(inipath):
            raise OptionError(f"Config file '{inipath}' not found. Check your '-c/--config-file' option.")
        if os.path.isdir(inipath):
            raise OptionError(f"Config file '{inipath}' is a directory. Check your '-c/--config-file' option.")
        if os.path.isfile(inipath):
            if name_unknown(inipath, major):
                raise OptionError(
                    f"Config file '{inipath}' has an unsupported format. Supported extensions are: .cfg, .ini, .toml."
                )
            values = load_config_file(inipath, major) or {}
            root = os.path.dirname(inipath)
        else:  # /dev/null: no configuration, and no say over the rootdir
            root = _common_ancestor(here, dirs)
            if os.path.dirname(root) == root:
                root = here
    else:
        ancestor = _common_ancestor(here, dirs)
        located = _locate(here, [ancestor], major)
        if located is not None:
            root, inipath, values = located
        elif rootdir is None:
            root = next((d for d in _ancestors(ancestor) if os.path.isfile(os.path.join(d, "setup.py"))), None)
            if root is None:
                if dirs != [ancestor] and (located := _locate(here, dirs, major)) is not None:
                    root, inipath, values = located
                if root is None:
                    root = os.path.commonpath([here, ancestor])
                    if os.path.dirname(root) == root:
                        root = ancestor
    if rootdir:
        root = os.path.abspath(os.path.join(here, os.path.expandvars(rootdir)))
        if not os.path.isdir(root):
            raise OptionError(f"Directory '{root}' not found. Check your '--rootdir' option.")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise OptionError(f"-o/--override-ini expects option=value style (got: {item!r}).")
        values[key] = ConfigValue(value, "ini")
    assert root is not None
    return ProjectConfig(root, inipath, tuple(values.items()))
