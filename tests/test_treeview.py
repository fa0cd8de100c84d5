"""`cudastack tree` / `cudastack why`: JSON schema, human view, exit status, providers."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from elfbuild import Scenarios, get_scenarios, needs_cc

from pytest_cudastack import treeview
from pytest_cudastack.cli import main

pytestmark = needs_cc


@pytest.fixture(scope="session")
def scen(tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    return get_scenarios(tmp_path_factory)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)


@dataclass
class _Dist:
    label: str


class FakeInventory:
    def __init__(self, owners: dict[str, str], ships: dict[str, list[tuple[str, str]]]) -> None:
        self.owners = owners
        self.ships = ships

    def owner(self, path: str) -> str | None:
        return self.owners.get(os.path.realpath(path))

    def shipping(self, soname: str) -> tuple[tuple[_Dist, str], ...]:
        return tuple((_Dist(d), p) for d, p in self.ships.get(soname, []))


def test_tree_json_schema_and_exit_status(scen: Scenarios, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["tree", "--json", str(scen.rpath_inherit), str(scen.missing_deep)])
    data = json.loads(capsys.readouterr().out)
    assert rc == 1  # libgone.so.1 is missing
    assert [d["path"] for d in data] == [str(scen.rpath_inherit), str(scen.missing_deep)]
    for tree in data:
        assert set(tree) == {"path", "libraries"}
        for lib in tree["libraries"]:
            assert set(lib) == {"soname", "path", "needed_by", "provider"}
            assert lib["path"] != tree["path"]
            assert "vdso" not in lib["soname"]
    sonames = [x["soname"] for x in data[0]["libraries"]]
    assert {"libmid.so.1", "libleaf.so.1", "libc.so.6"} <= set(sonames)
    gone = next(x for x in data[1]["libraries"] if x["soname"] == "libgone.so.1")
    assert gone["path"] is None
    assert gone["needed_by"] == [str(scen.base / "m" / "libm2.so.1")]


def test_tree_clean_exit_zero(scen: Scenarios, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree", "--json", str(scen.rpath_inherit)]) == 0
    capsys.readouterr()


def test_tree_human_view(scen: Scenarios, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["tree", str(scen.missing_deep)])
    out = capsys.readouterr().out
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == str(scen.missing_deep)
    assert any("libm1.so.1 =>" in x and f"[rpath of {scen.missing_deep}]" in x for x in lines)
    m2 = next(i for i, x in enumerate(lines) if "libm2.so.1 =>" in x)
    gone = next(i for i, x in enumerate(lines) if "libgone.so.1 => NOT FOUND" in x)
    assert gone > m2
    assert len(lines[gone]) - len(lines[gone].lstrip("│ ├└─")) > len(lines[m2]) - len(lines[m2].lstrip("│ ├└─"))
    assert "tried: " + str(scen.base / "m" / "libgone.so.1") in lines[gone + 1]
    assert "1 missing: libgone.so.1" in out


def test_tree_bad_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notelf.so").write_text("x")
    assert main(["tree", str(tmp_path / "notelf.so")]) == 1
    assert "not an ELF file" in capsys.readouterr().out


def test_tree_providers(scen: Scenarios, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    mid = os.path.realpath(scen.base / "a" / "libmid.so.1")
    monkeypatch.setattr(treeview, "_inventory", lambda paths=(): FakeInventory({mid: "mid-wheel 1.0"}, {}))
    monkeypatch.setattr(treeview, "_site_dirs_for", lambda paths: ["/fake-site"])
    main(["tree", "--json", str(scen.rpath_inherit)])
    libs = {x["soname"]: x for x in json.loads(capsys.readouterr().out)[0]["libraries"]}
    assert libs["libmid.so.1"]["provider"] == "mid-wheel 1.0"
    assert libs["libleaf.so.1"]["provider"] is None
    main(["tree", str(scen.rpath_inherit)])
    assert "(mid-wheel 1.0)" in capsys.readouterr().out


def test_tree_without_inventory(
    scen: Scenarios, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(treeview, "_inventory", lambda paths=(): None)
    assert main(["tree", "--json", str(scen.rpath_inherit)]) == 0
    assert all(x["provider"] is None for x in json.loads(capsys.readouterr().out)[0]["libraries"])


def test_site_dirs_for() -> None:
    assert treeview._site_dirs_for(["/v/lib/python3.11/site-packages/torch/lib/x.so", "/usr/lib/y.so"]) == [
        "/v/lib/python3.11/site-packages"
    ]


def test_why_found(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(treeview, "_inventory", lambda paths=(): None)
    assert main(["why", "libc.so.6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("libc.so.6 => /")
    assert "shipped by: no installed distribution" in out


def test_why_missing_but_shipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    present = tmp_path / "libfake.so.9"
    present.write_bytes(b"")
    inv = FakeInventory(
        {}, {"libfake.so.9": [("nvidia-fake-cu12 9.0", str(present)), ("nvidia-fake-cu13 9.1", "/gone/libfake.so.9")]}
    )
    monkeypatch.setattr(treeview, "_inventory", lambda paths=(): inv)
    assert main(["why", "libfake.so.9"]) == 1
    out = capsys.readouterr().out
    assert "NOT FOUND by the dynamic linker" in out
    assert "tried:" in out
    assert "nvidia-fake-cu13 9.1: /gone/libfake.so.9  (listed in RECORD but MISSING on disk)" in out
    assert main(["why", "--json", "libfake.so.9"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["path"] is None
    assert data["route"] == "not found"
    assert data["shipped_by"] == [
        {"distribution": "nvidia-fake-cu12 9.0", "path": str(present), "exists": True},
        {"distribution": "nvidia-fake-cu13 9.1", "path": "/gone/libfake.so.9", "exists": False},
    ]


def test_why_uses_ld_library_path(
    scen: Scenarios, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(treeview, "_inventory", lambda paths=(): None)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(scen.d_llp))
    assert main(["why", "--json", "libprec.so.1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["path"] == str(scen.d_llp / "libprec.so.1")
    assert data["route"] == "LD_LIBRARY_PATH"


def test_cache_is_written(scen: Scenarios, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["tree", "--json", str(scen.rpath_inherit)])
    capsys.readouterr()
    assert (tmp_path / "cache" / "elfcache-v1.json").is_file()


def test_no_cache_flag(
    scen: Scenarios, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDASTACK_NO_CACHE", raising=False)
    main(["--no-cache", "tree", "--json", str(scen.rpath_inherit)])
    monkeypatch.delenv("CUDASTACK_NO_CACHE", raising=False)  # cli sets it for the process
    capsys.readouterr()
    assert not (tmp_path / "cache").exists()
