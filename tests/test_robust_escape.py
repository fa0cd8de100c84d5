"""Strings from files never reach a terminal raw (issue #23): one function (``escape.printable``) escapes them
in every command's text and in the plugin's pytest output; ``--json`` keeps the values as they are."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.escape import printable, printable_data
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import synth_elf
from tests.helpers.sitebuild import site_packages, write_dist
from tests.test_robust_snapshot import SNAP

pytest_plugins = ["pytester"]

HOSTILE = "libevil\x1b[2J\x1b]0;owned\x07\r\u202e.so.1"
SHOWN = "libevil\\x1b[2J\\x1b]0;owned\\x07\\r\\u202e.so.1"


@pytest.mark.parametrize(
    ("text", "newlines", "shown"),
    [
        pytest.param("libc.so.6", False, "libc.so.6", id="plain"),
        pytest.param(HOSTILE, False, SHOWN, id="csi-osc-bel-cr-bidi"),
        pytest.param("a\nb\tc\x7f\x9b", False, "a\\nb\\tc\\x7f\\x9b", id="c0-del-c1"),
        pytest.param("a\nb", True, "a\nb", id="lines"),
        pytest.param("lib\udcff\udc80.so", False, "lib\\xff\\x80.so", id="undecodable-bytes"),
        pytest.param("\ud800x\u2028\ufeff", False, "\\ud800x\\u2028\\ufeff", id="surrogate-separator-bom"),
        pytest.param("ünïcödé ✓ 漢字", False, "ünïcödé ✓ 漢字", id="printable-unicode"),
    ],
)
def test_printable(text: str, newlines: bool, shown: str) -> None:
    out = printable(text, newlines=newlines)
    assert out == shown
    assert printable(out, newlines=newlines) == out  # escaping twice changes nothing more
    assert (out.replace("\n", "") if newlines else out).isprintable()


def test_printable_data_escapes_every_string() -> None:
    doc = {"a\x1b": [HOSTILE, ("x\r", 3)], "n": None}
    assert printable_data(doc) == {"a\\x1b": [SHOWN, ("x\\r", 3)], "n": None}


def test_finding_render_escapes_every_field() -> None:
    f = Finding(
        "closure",
        Severity.ERROR,
        HOSTILE,
        f"{HOSTILE} is not found",
        cause=HOSTILE,
        where=(HOSTILE,),
        chain=(HOSTILE,),
        details=(HOSTILE,),
    )
    for compact in (False, True):
        text = f.render(compact=compact)
        _raw_free(text)
        assert SHOWN in text
    assert f.to_json()["subject"] == HOSTILE  # data stays data: --json is not a terminal


@pytest.fixture
def hostile_lib(tmp_path: Path) -> Path:
    return synth_elf(tmp_path / "libhost.so.1", needed=("libc.so.6", HOSTILE))


def _raw_free(text: str) -> None:
    for c in ("\x1b", "\x07", "\r", "\u202e"):
        assert c not in text, repr(text[:500])


def test_tree_escapes_needed_entries(
    hostile_lib: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    assert main(["tree", str(hostile_lib)]) == 1  # the hostile soname is missing
    out = capsys.readouterr().out
    _raw_free(out)
    assert SHOWN in out
    assert main(["tree", "--json", str(hostile_lib)]) == 1
    doc = json.loads(capsys.readouterr().out)  # JSON escapes control characters itself
    assert HOSTILE in [x["soname"] for x in doc["trees"][0]["libraries"]]


def test_check_report_and_why_escape(
    hostile_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "evil\x1b-pkg",
        "1.0",
        metadata=f"Metadata-Version: 2.1\nName: evil-pkg\x1b[31m\nVersion: 1.0\nRequires-Dist: {HOSTILE}\n\n",
    )
    main(["check", "--site", str(site), f"--cudastack-scan={hostile_lib}", "-v", "--color=yes"])
    out = capsys.readouterr().out
    assert "\x1b[31m" in out  # our own colour is still there
    _raw_free(out.replace("\x1b[31m", "").replace("\x1b[33m", "").replace("\x1b[0m", "").replace("\x1b[1m", ""))
    assert SHOWN in out
    main(["report", "--site", str(site), "-v"])
    out = capsys.readouterr().out
    _raw_free(out)
    main(["why", "--site", str(site), HOSTILE])
    _raw_free(capsys.readouterr().out)


def test_diff_escapes_snapshot_strings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = copy.deepcopy(SNAP)
    new = copy.deepcopy(SNAP)
    new["wheels"][0]["name"] = "nvidia-\x1b[2Jcublas"
    new["wheels"][0]["version"] = "13.0\r\u202e"
    (tmp_path / "a.json").write_text(json.dumps(old))
    (tmp_path / "b.json").write_text(json.dumps(new))
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    out = capsys.readouterr().out
    _raw_free(out)
    assert "nvidia-\\x1b[2Jcublas" in out


def test_fleet_text_escapes_snapshot_strings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fleet's text view names hosts and drift read from the snapshots: escaped as diff's; JSON keeps them."""
    odd = copy.deepcopy(SNAP)
    odd["wheels"][0]["name"] = "nvidia-\x1b[2Jcublas"
    odd["host"]["name"] = "node\x1b]0;owned\x07"
    odd["fingerprint"] = "sha256:" + "1" * 64
    (tmp_path / "a.json").write_text(json.dumps(SNAP))
    (tmp_path / "b.json").write_text(json.dumps(SNAP))
    (tmp_path / "c.json").write_text(json.dumps(odd))
    assert main(["fleet", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    _raw_free(out)
    assert "node\\x1b]0;owned\\x07" in out
    assert main(["fleet", "--format", "json", str(tmp_path)]) == 1
    assert "node\\u001b]0;owned\\u0007" in capsys.readouterr().out  # JSON's own escape of the value as it is


def test_pytest_output_escapes(
    pytester: pytest.Pytester, hostile_lib: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cudastack-cache"))
    odd = pytester.path / "bin\x1b[2J"
    odd.mkdir()
    os.link(hostile_lib, odd / "libhost.so.1")
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.requires_soname({HOSTILE!r})
        def test_x():
            pass
        """
    )
    result = pytester.runpytest(
        "-p", "pytest_cudastack.plugin", "--cuda-driver=550.54.15", f"--cudastack-scan={odd}", "-rA", "-v"
    )
    text = result.stdout.str() + result.stderr.str()
    _raw_free(text)
    assert SHOWN in text
    assert "bin\\x1b[2J" in text  # the scan item's name
