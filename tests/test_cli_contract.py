"""The `cudastack` command's contract with scripts: exit statuses as the README's table says, for every
subcommand and unreadable input; files written honour the umask; `why` takes a soname."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("CUDASTACK_SITE", raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def umask():
    """Sets the process umask for one test, then restores it."""
    saved = os.umask(0o022)
    os.umask(saved)

    def set_umask(mask: int) -> None:
        os.umask(mask)

    yield set_umask
    os.umask(saved)


def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "fifo")
    return str(tmp_path / "fifo")


# (argv, the expected status); "{tmp}" is the test's temporary directory
USAGE = [
    pytest.param(["tree", "{tmp}/absent"], id="tree missing file"),
    pytest.param(["tree", "--json", "{tmp}/absent"], id="tree --json missing file"),
    pytest.param(["tree", "{tmp}"], id="tree directory"),
    pytest.param(["tree", "{tmp}/fifo"], id="tree fifo"),
    pytest.param(["why", "{tmp}/bin/app"], id="why path"),
    pytest.param(["why", "--site", "{tmp}/absent", "libc.so.6"], id="why missing site"),
    pytest.param(["report", "--site", "{tmp}/absent"], id="report missing site"),
    pytest.param(["check", "--site", "{tmp}/absent"], id="check missing site"),
    pytest.param(["check", "-c", "{tmp}/absent.ini"], id="check missing config"),
    pytest.param(["check", "--cuda-max=twelve"], id="check bad value"),
    pytest.param(["snapshot", "-o", "{tmp}"], id="snapshot to a directory"),
    pytest.param(["diff", "{tmp}/absent", "{tmp}/absent"], id="diff missing"),
    pytest.param(["diff", "{tmp}/bin/app", "{tmp}/bin/app"], id="diff not a snapshot"),
    pytest.param(["tree", "--frobnicate", "x"], id="unknown option"),
]


@needs_cc
@pytest.mark.parametrize("argv", USAGE)
def test_usage_and_unreadable_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]):
    build_exe(tmp_path / "bin" / "app", needed=[build_lib(tmp_path / "lib" / "liba.so.1", soname="liba.so.1")])
    _fifo(tmp_path)
    words = [w.replace("{tmp}", str(tmp_path)) for w in argv]
    try:
        code = main(words)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    assert code == 2
    assert capsys.readouterr().err.strip()  # says why, on standard error


@needs_cc
def test_tree_unreadable_among_readable_still_prints_every_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    lib = build_lib(tmp_path / "lib" / "liba.so.1", soname="liba.so.1")
    app = build_exe(tmp_path / "bin" / "app", needed=[lib], runpath="$ORIGIN/../lib")
    assert main(["tree", "--json", str(app), str(tmp_path / "absent")]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert [t["path"] for t in doc["trees"]] == [str(app), str(tmp_path / "absent")]
    assert f"cudastack tree: error: {tmp_path / 'absent'}: cannot open: No such file or directory" in captured.err
    assert main(["tree", str(app)]) == 0  # and a clean one is clean


@needs_cc
def test_tree_of_a_file_that_is_not_elf_is_a_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "notes.txt").write_text("not a library\n")
    assert main(["tree", str(tmp_path / "notes.txt")]) == 1
    assert "not an ELF file" in capsys.readouterr().out


@needs_cc
def test_why_a_path_says_it_takes_a_soname(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    app = build_exe(tmp_path / "bin" / "app", needed=[build_lib(tmp_path / "lib" / "liba.so.1", soname="liba.so.1")])
    assert main(["why", str(app)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "why takes a soname" in captured.err
    assert f"cudastack tree {app}" in captured.err


def test_why_json_names_its_schema(capsys: pytest.CaptureFixture[str]):
    assert main(["why", "--json", "libnowhere-cudastack.so.9"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["schema"], doc["version"]) == ("pytest-cudastack/why", 1)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_snapshot_honours_the_umask(tmp_path: Path, umask, mask: int, mode: int):
    umask(mask)
    assert main(["snapshot", "--site", str(tmp_path), "-o", str(tmp_path / "out" / "s.json")]) in (0, 1)
    assert stat.S_IMODE((tmp_path / "out" / "s.json").stat().st_mode) == mode


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_plugin_snapshot_and_step_summary_honour_the_umask(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, umask, mask: int, mode: int
):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    pytester.makepyfile("def test_x(): pass")
    umask(mask)
    result = pytester.runpytest("-p", "pytest_cudastack.plugin", "--cudastack-snapshot=s.json", "--cuda-driver=550")
    assert result.ret == 0
    assert stat.S_IMODE((pytester.path / "s.json").stat().st_mode) == mode
    assert stat.S_IMODE((pytester.path / "summary.md").stat().st_mode) == mode
