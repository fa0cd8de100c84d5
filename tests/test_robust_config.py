"""Hostile pytest configuration files (issue #23): ``cudastack check`` reads what pytest would read, and any
bytes there give a value (as pytest reads them) or exit 2 naming the file and the option, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.inifile import find_config

pytest_plugins = ["pytester"]

DEEP = "x = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_TABLE = "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n"

# (file name, bytes, what the error names besides the file)
HOSTILE = [
    pytest.param("pyproject.toml", b'[tool.pytest.ini_options]\ncuda_max = "\xff\xfe"\n', "UTF-8", id="toml-utf8"),
    pytest.param("tox.ini", b"[pytest]\ncuda_max = \xc3\x28\n", "UTF-8", id="tox-utf8"),
    pytest.param("setup.cfg", b"[tool:pytest]\n\x80cuda_max = 12.9\n", "UTF-8", id="cfg-utf8"),
    pytest.param("pytest.ini", b"\xed\xa0\x80[pytest]\n", "UTF-8", id="ini-surrogate"),
    pytest.param("pyproject.toml", b"[tool.pytest.ini_options]\n" + DEEP.encode(), "nested", id="toml-deep-array"),
    pytest.param("pyproject.toml", b"[tool.pytest.ini_options]\n" + DEEP_TABLE.encode(), "nested", id="deep-table"),
    pytest.param("pyproject.toml", b"[project]\nx = " + b"9" * 5000 + b"\n", "digits", id="toml-huge-int-elsewhere"),
    pytest.param(
        "pyproject.toml", b"[tool.pytest.ini_options]\ncuda_max = 0x" + b"f" * 4000 + b"\n", "cuda_max", id="hex-to-str"
    ),
    pytest.param("pyproject.toml", b"[tool.pytest.ini_options]\naddopts = [1, 2]\n", "addopts", id="addopts-ints"),
    pytest.param(
        "pyproject.toml", b'[tool.pytest.ini_options]\ncudastack_scan = ["a", 3]\n', "cudastack_scan", id="linelist-int"
    ),
]


@pytest.mark.parametrize(("name", "data", "named"), HOSTILE)
def test_hostile_config_file_is_exit_2_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    data: bytes,
    named: str,
) -> None:
    (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    assert main(["check", "--site", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cudastack check: error: "), err
    assert str(tmp_path / name) in err
    assert named in err
    assert "Traceback" not in err
    assert len(err) < 2000  # the message quotes no 4000-digit value


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("pyproject.toml", '[tool.pytest.ini_options]\rcuda_max = "12.9"\r', id="toml-cr"),
        pytest.param("pyproject.toml", '[tool.pytest.ini_options]\r\ncuda_max = "12.9"\r\n', id="toml-crlf"),
        pytest.param("tox.ini", "[pytest]\rcuda_max = 12.9\r", id="ini-cr"),
    ],
)
def test_line_ends_pytest_accepts_are_accepted(pytester: pytest.Pytester, name: str, text: str) -> None:
    # pytest reads its configuration files in universal-newlines mode: CR-only line ends are line ends
    (pytester.path / name).write_bytes(text.encode())
    pytester.chdir()
    config = pytester.parseconfig("-p", "no:cacheprovider")
    assert config.inipath == pytester.path / name
    ours = find_config(str(pytester.path))
    assert ours.inipath == str(pytester.path / name)
    assert ours.get("cuda_max", "string") == "12.9"
