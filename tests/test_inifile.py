"""pytest_cudastack.inifile: the rootdir and config file pytest would pick, with pytest itself as the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.errors import OptionError
from pytest_cudastack.inifile import config_names, find_config
from pytest_cudastack.options import ini_types

# (files relative to the project root, the directory pytest runs in): each file's text
LAYOUTS: dict[str, tuple[dict[str, str], str]] = {
    "pytest.ini first": (
        {"pytest.ini": "[pytest]\n", "pyproject.toml": "[tool.pytest.ini_options]\nx = 1\n", "tox.ini": "[pytest]\n"},
        ".",
    ),
    "empty pytest.ini still wins": ({"pytest.ini": "", "tox.ini": "[pytest]\n"}, "."),
    "dot pytest.ini": ({".pytest.ini": "[pytest]\n", "tox.ini": "[pytest]\n"}, "."),
    "pyproject with ini_options": ({"pyproject.toml": "[tool.pytest.ini_options]\n", "tox.ini": "[pytest]\n"}, "."),
    "pyproject without a table is skipped": ({"pyproject.toml": "[project]\nname='x'\n", "tox.ini": "[pytest]\n"}, "."),
    "tox.ini without [pytest] is skipped": ({"tox.ini": "[tox]\n", "setup.cfg": "[tool:pytest]\n"}, "."),
    "setup.cfg": ({"setup.cfg": "[tool:pytest]\n"}, "."),
    "found upwards": ({"tox.ini": "[pytest]\n", "a/b/.keep": ""}, "a/b"),
    "nearer dir wins": ({"tox.ini": "[pytest]\n", "a/setup.cfg": "[tool:pytest]\n", "a/b/.keep": ""}, "a/b"),
    "bare pyproject is the last resort": ({"pyproject.toml": "[project]\n", "a/setup.cfg": "[metadata]\n"}, "a"),
    "setup.py marks the rootdir": ({"setup.py": "", "a/b/.keep": ""}, "a/b"),
    "nothing at all": ({"a/.keep": ""}, "a"),
    "native toml table (pytest 9)": ({"pyproject.toml": "[tool.pytest]\nx = 1\n", "tox.ini": "[pytest]\n"}, "."),
    "pytest.toml (pytest 9)": ({"pytest.toml": "[pytest]\n", "pytest.ini": "[pytest]\n"}, "."),
}


def _lay_out(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_same_rootdir_and_configfile_as_pytest(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    files, where = LAYOUTS[name]
    _lay_out(pytester.path, files)
    monkeypatch.chdir(pytester.path / where)
    config = pytester.parseconfig("-p", "no:cacheprovider")
    ours = find_config()
    assert ours.rootdir == str(config.rootpath)
    assert ours.inipath == (str(config.inipath) if config.inipath else None)


@pytest.mark.parametrize(
    "args",
    [["-c", "other.ini"], ["-c", "/dev/null"], ["--rootdir", "sub"], ["-c", "other.ini", "--rootdir", "sub"]],
    ids=" ".join,
)
def test_same_as_pytest_with_c_and_rootdir(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    _lay_out(pytester.path, {"tox.ini": "[pytest]\ncuda_max = 12.9\n", "other.ini": "[pytest]\n", "sub/.keep": ""})
    monkeypatch.chdir(pytester.path)
    config = pytester.parseconfig("-p", "no:cacheprovider", *args)
    opts = dict(zip(args[::2], args[1::2], strict=True))
    ours = find_config(inifile=opts.get("-c"), rootdir=opts.get("--rootdir"))
    assert ours.rootdir == str(config.rootpath)
    assert ours.inipath == (str(config.inipath) if config.inipath else None)


def test_values_convert_as_getini_does(tmp_path: Path) -> None:
    (tmp_path / "tox.ini").write_text(
        "[pytest]\ncudastack = yes\ncudastack_scan =\n    bin\n    lib/x.so\ncuda_max = 12.9\n"
    )
    got = find_config(str(tmp_path)).getter(ini_types())
    assert got("cudastack") is True
    assert got("cudastack_scan") == ["bin", "lib/x.so"]
    assert got("cuda_max") == "12.9"
    assert got("cuda_min") is None
    assert got("not_a_key") is None


def test_toml_values(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ncudastack = true\ncudastack_scan = ["bin"]\ncuda_driver = 580\n'
    )
    got = find_config(str(tmp_path)).getter(ini_types())
    assert (got("cudastack"), got("cudastack_scan"), got("cuda_driver")) == (True, ["bin"], "580")


@pytest.mark.skipif("pytest.toml" not in config_names(), reason="native TOML configuration is pytest >= 9")
def test_native_toml_types_must_match(tmp_path: Path) -> None:
    (tmp_path / "pytest.toml").write_text('[pytest]\ncudastack_scan = ["bin"]\ncudastack = "yes"\n')
    got = find_config(str(tmp_path)).getter(ini_types())
    assert got("cudastack_scan") == ["bin"]
    with pytest.raises(ValueError, match="expects a bool"):
        got("cudastack")


def test_overrides_and_errors(tmp_path: Path) -> None:
    (tmp_path / "tox.ini").write_text("[pytest]\ncuda_max = 12.9\n")
    assert find_config(str(tmp_path), overrides=["cuda_max=13.0"]).get("cuda_max", "string") == "13.0"
    with pytest.raises(OptionError, match="option=value"):
        find_config(str(tmp_path), overrides=["cuda_max"])
    with pytest.raises(OptionError, match="not found"):
        find_config(str(tmp_path), inifile="nope.ini")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(OptionError, match="unsupported format"):
        find_config(str(tmp_path), inifile="x.json")
    (tmp_path / "tox.ini").unlink()
    (tmp_path / "setup.cfg").write_text("[pytest]\n")
    with pytest.raises(OptionError, match=r"\[tool:pytest\]"):
        find_config(str(tmp_path))
    (tmp_path / "setup.cfg").write_text("[tool:pytest]\nbad line without equals\n")
    with pytest.raises(OptionError):
        find_config(str(tmp_path))
