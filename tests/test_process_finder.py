"""The import model finds modules as importlib's FileFinder does, with its cost: each ``sys.path`` directory
listed once, and a name stat'ed only when the listing holds it (a warm ``cudastack image`` of a venv ran
~100,000 stats a run, one for each candidate file of each lookup)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_cudastack.model.process import Interpreter, ModuleFinder

EXT = ".cpython-311-x86_64-linux-gnu.so"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    for i in range(50):
        (site / f"plain{i}.py").write_text("")
    (site / "pkg").mkdir()
    (site / "pkg" / "__init__.py").write_text("")
    (site / "pkg" / "sub.py").write_text("")
    (site / f"fast{EXT}").write_bytes(b"")
    (site / "ns").mkdir()  # a namespace portion: no __init__.py
    (site / "ns" / "mod.py").write_text("")
    (site / "notes.txt").write_text("")  # a file on sys.path: listed as nothing
    return site


def test_finds_what_importlib_finds(site: Path) -> None:
    interp = Interpreter((str(site / "notes.txt"), str(site)), sys.executable, suffixes=(EXT,))
    finder = ModuleFinder(interp)
    assert finder.find("plain7")
    assert finder.files["plain7"] == str(site / "plain7.py")
    assert finder.find("pkg.sub")
    assert finder.files["pkg"] == str(site / "pkg" / "__init__.py")
    assert finder.find("fast")
    assert finder.files["fast"] == str(site / f"fast{EXT}")
    assert finder.find("ns.mod")
    assert finder.files["ns"] is None  # a namespace package
    assert not finder.find("absent")
    assert not finder.find("pkg.absent")


def test_each_directory_is_listed_once_and_only_listed_names_are_looked_at(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked: list[str] = []
    listed: list[str] = []
    isfile, isdir, listdir = os.path.isfile, os.path.isdir, os.listdir
    monkeypatch.setattr(os.path, "isfile", lambda p: looked.append(str(p)) or isfile(p))
    monkeypatch.setattr(os.path, "isdir", lambda p: looked.append(str(p)) or isdir(p))
    monkeypatch.setattr(os, "listdir", lambda p: listed.append(str(p)) or listdir(p))
    finder = ModuleFinder(Interpreter((str(site),), sys.executable, suffixes=(EXT,)))
    for i in range(50):
        assert finder.find(f"plain{i}")
    for i in range(50):
        assert not finder.find(f"missing{i}")
    assert listed == [str(site)]
    assert len(looked) == 50  # one stat for each module found, none for the missing names
