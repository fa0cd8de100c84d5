"""`cudastack tree` / `cudastack why`: JSON schema, human view, exit status, providers."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.cli import tree as treeview
from pytest_cudastack.cli import why as whyview
from tests.helpers.elfbuild import Scenarios, get_scenarios, needs_cc
from tests.helpers.sitebuild import compile_so, site_packages, write_dist

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
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1  # libgone.so.1 is missing
    assert set(doc) == {"schema", "version", "trees"}
    assert (doc["schema"], doc["version"]) == ("pytest-cudastack/tree", 1)
    data = doc["trees"]
    assert [d["path"] for d in data] == [str(scen.rpath_inherit), str(scen.missing_deep)]
    for tree in data:
        assert set(tree) == {"path", "libraries"}
        for lib in tree["libraries"]:
            assert set(lib) == {"soname", "path", "needed_by", "provider"}  # "gpu_code" only with --gpu-code
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


class FakeIndex(FakeInventory):
    site_dirs = ("/fake-site",)

    def stamp(self) -> list[str]:
        return ["fake"]


def test_tree_providers(scen: Scenarios, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    mid = os.path.realpath(scen.base / "a" / "libmid.so.1")
    monkeypatch.setattr(treeview, "_owner_index", lambda site: FakeIndex({mid: "mid-wheel 1.0"}, {}))
    monkeypatch.setattr(treeview, "_site_dirs_for", lambda paths: ["/fake-site"])
    main(["tree", "--json", str(scen.rpath_inherit)])
    libs = {x["soname"]: x for x in json.loads(capsys.readouterr().out)["trees"][0]["libraries"]}
    assert libs["libmid.so.1"]["provider"] == "mid-wheel 1.0"
    assert libs["libleaf.so.1"]["provider"] is None
    main(["tree", str(scen.rpath_inherit)])
    assert "(mid-wheel 1.0)" in capsys.readouterr().out


def test_tree_without_inventory(
    scen: Scenarios, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(treeview, "_owner_index", lambda site: None)
    monkeypatch.setattr(treeview, "_site_dirs_for", lambda paths: ["/fake-site"])
    assert main(["tree", "--json", str(scen.rpath_inherit)]) == 0
    assert all(x["provider"] is None for x in json.loads(capsys.readouterr().out)["trees"][0]["libraries"])


def test_site_dirs_for() -> None:
    assert treeview._site_dirs_for(["/v/lib/python3.11/site-packages/torch/lib/x.so", "/usr/lib/y.so"]) == [
        "/v/lib/python3.11/site-packages"
    ]


def test_why_found(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(whyview, "_inventory", lambda site, reader: None)
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
    monkeypatch.setattr(whyview, "_inventory", lambda site, reader: inv)
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
    monkeypatch.setattr(whyview, "_inventory", lambda site, reader: None)
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
    os.environ.pop("CUDASTACK_NO_CACHE", None)  # cli sets it for the process (monkeypatch would restore it)
    capsys.readouterr()
    assert not (tmp_path / "cache").exists()


def _venv_with_lib(tmp_path: Path) -> tuple[Path, Path]:
    """A venv prefix whose wheel ships libcudastackfake.so.9 (under an rpath the loader does not know)."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "nvidia-fake-cu13",
        "9.1",
        {"nvidia/fake/lib/libcudastackfake.so.9": compile_so("libcudastackfake.so.9")},
    )
    return tmp_path / "venv", site


def test_why_uses_the_site_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    venv, site = _venv_with_lib(tmp_path)
    assert main(["why", "libcudastackfake.so.9"]) == 1
    assert "shipped by: no installed distribution" in capsys.readouterr().out
    for given in (venv, site):
        assert main(["why", "--site", str(given), "libcudastackfake.so.9"]) == 1
        out = capsys.readouterr().out
        assert f"nvidia-fake-cu13 9.1: {site / 'nvidia/fake/lib/libcudastackfake.so.9'}" in out
        assert "MISSING" not in out
    assert main(["why", "--json", "--site", str(venv), "libcudastackfake.so.9"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["shipped_by"] == [
        {
            "distribution": "nvidia-fake-cu13 9.1",
            "path": str(site / "nvidia/fake/lib/libcudastackfake.so.9"),
            "exists": True,
        }
    ]


def test_tree_providers_from_records_and_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    site = site_packages(tmp_path / "venv")
    lib = compile_so("libcudastackdep.so.1")
    ext = compile_so(None, needed=["libcudastackdep.so.1"], rpath="$ORIGIN/../dep/lib", pyinit="ext")
    write_dist(site, "dep-wheel", "1.0", {"dep/lib/libcudastackdep.so.1": lib})
    write_dist(site, "ext-wheel", "2.0", {"ext/ext.so": ext})
    root = str(site / "ext" / "ext.so")

    def providers() -> dict[str, str | None]:
        assert main(["tree", "--json", root]) == 0
        data = json.loads(capsys.readouterr().out)
        return {x["soname"]: x["provider"] for x in data["trees"][0]["libraries"]}

    got = providers()
    assert got["libcudastackdep.so.1"] == "dep-wheel 1.0"
    assert got["libc.so.6"] is None
    cache = json.loads((tmp_path / "cache" / "elfcache-v1.json").read_text())
    assert cache["extra"]["treeview-owners"]
    # warm: answers come from the cache file, no RECORD is parsed
    from pytest_cudastack.wheels import inventory

    monkeypatch.setattr(inventory.OwnerIndex, "_build", lambda self: pytest.fail("RECORD parsed"))
    assert providers() == got
    monkeypatch.undo()
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    # a changed RECORD invalidates the cached answers
    write_dist(site, "dep-wheel", "1.0", {"dep/lib/libcudastackdep.so.1": lib}, extra_rows=["x/y.py,,"])
    (site / "dep_wheel-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: dep-wheel\nVersion: 1.1\n")
    assert providers()["libcudastackdep.so.1"] == "dep-wheel 1.1"
    # site given (cli's --site, when the tree command gets it): owners from there only
    other = site_packages(tmp_path / "other")
    for given, want in ((other, None), (tmp_path / "venv", "dep-wheel 1.1")):
        ns = argparse.Namespace(paths=[root], json=True, site=[str(given)])
        assert treeview.cmd_tree(ns) == 0
        libs = {x["soname"]: x["provider"] for x in json.loads(capsys.readouterr().out)["trees"][0]["libraries"]}
        assert libs["libcudastackdep.so.1"] == want


# ---------------------------------------------------------------------------------------------------- closure cache


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch) -> float:
    """A short racy window for these tests (the default is 2 s): wait settle() after changing files."""
    from pytest_cudastack.linker import treecache

    monkeypatch.setattr(treecache, "RACY_NS", 50_000_000)
    return 0.06


def settle(seconds: float) -> None:
    import time

    time.sleep(seconds)


def _no_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_cudastack.linker.resolver import Resolver

    def fail(self: Resolver, path: str) -> None:
        raise AssertionError(f"resolved {path}: the closure cache was not used")

    monkeypatch.setattr(Resolver, "tree_deps", fail)


def _tree(capsys: pytest.CaptureFixture[str], *paths: object) -> tuple[int, str]:
    rc = main(["tree", "--json", *(str(p) for p in paths)])
    return rc, capsys.readouterr().out


def test_closure_cache_warm_equals_cold(
    scen: Scenarios, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, window: float
) -> None:
    roots = [
        scen.rpath_inherit,
        scen.runpath_not_inherited,
        scen.prec_both,
        scen.origin_link,
        scen.origin_mid,
        scen.wrong_class,
        scen.missing_deep,
        scen.not_elf_candidate,
        scen.dir_candidate,
        scen.needs_slash,
        scen.dedupe,
        scen.exe,
        scen.refound,
        scen.loop_candidate,
        scen.base / "no-such-file.so",
        scen.leaf,  # twice: printed twice
        scen.leaf,
    ]
    settle(window)
    cold = _tree(capsys, *roots)
    assert json.loads(cold[1])["trees"]  # the rows are JSON
    cache = Path(os.environ["CUDASTACK_CACHE_DIR"]) / "treecache-v1.json"
    assert cache.is_file()
    with monkeypatch.context() as m:
        _no_resolver(m)
        assert _tree(capsys, *roots) == cold
        doc = json.loads(cold[1])
        doc["trees"].reverse()
        assert _tree(capsys, *reversed(roots)) == (cold[0], json.dumps(doc) + "\n")
    # disabled: neither read nor written
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    cache.unlink()
    assert _tree(capsys, *roots) == cold
    assert not cache.exists()


def _two_dirs(tmp_path: Path) -> tuple[Path, Path, Path, bytes]:
    """root.so (RPATH $ORIGIN/first:$ORIGIN/second) needing libcsdep.so.1, present in second/ only."""
    from tests.helpers.sitebuild import compile_so

    app = tmp_path / "app"
    (app / "first").mkdir(parents=True)
    (app / "second").mkdir()
    dep = compile_so("libcsdep.so.1")
    (app / "second" / "libcsdep.so.1").write_bytes(dep)
    root = app / "root.so"
    root.write_bytes(compile_so(None, needed=["libcsdep.so.1"], rpath="$ORIGIN/first:$ORIGIN/second"))
    return root, app / "first", app / "second", dep


def _paths(out: str) -> dict[str, str | None]:
    return {x["soname"]: x["path"] for x in json.loads(out)["trees"][0]["libraries"]}


def test_closure_cache_new_library_in_earlier_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, window: float
) -> None:
    root, first, second, dep = _two_dirs(tmp_path)
    settle(window)
    assert _paths(_tree(capsys, root)[1])["libcsdep.so.1"] == str(second / "libcsdep.so.1")
    with monkeypatch.context() as m:
        _no_resolver(m)  # warm: from the cache
        assert _paths(_tree(capsys, root)[1])["libcsdep.so.1"] == str(second / "libcsdep.so.1")
    (first / "libcsdep.so.1").write_bytes(dep)  # the linker now stops at the first RPATH directory
    settle(window)
    assert _paths(_tree(capsys, root)[1])["libcsdep.so.1"] == str(first / "libcsdep.so.1")
    # and an earlier directory that did not exist, created with the library in it
    (first / "libcsdep.so.1").unlink()
    settle(window)
    assert _paths(_tree(capsys, root)[1])["libcsdep.so.1"] == str(second / "libcsdep.so.1")
    first.rmdir()
    settle(window)
    assert _paths(_tree(capsys, root)[1])["libcsdep.so.1"] == str(second / "libcsdep.so.1")
    first.mkdir()
    (first / "libcsdep.so.1").write_bytes(dep)
    settle(window)
    assert _paths(_tree(capsys, root)[1])["libcsdep.so.1"] == str(first / "libcsdep.so.1")


def test_closure_cache_replaced_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, window: float
) -> None:
    from tests.helpers.sitebuild import compile_so

    root, _first, second, _dep = _two_dirs(tmp_path)
    settle(window)
    rc, out = _tree(capsys, root)
    assert rc == 0
    assert "libcsextra.so.1" not in _paths(out)
    new = second / "new.tmp"
    new.write_bytes(compile_so("libcsdep.so.1", needed=["libcsextra.so.1"]))
    os.replace(new, second / "libcsdep.so.1")  # a new inode, as an installer replaces a file
    settle(window)
    rc, out = _tree(capsys, root)
    assert rc == 1
    assert _paths(out)["libcsextra.so.1"] is None
    # rewritten in place (same inode): its mtime and ctime change
    (second / "libcsdep.so.1").write_bytes(compile_so("libcsdep.so.1", payload="x" * 64))
    settle(window)
    rc, out = _tree(capsys, root)
    assert rc == 0
    assert "libcsextra.so.1" not in _paths(out)


def test_closure_cache_ld_library_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, window: float
) -> None:
    from tests.helpers.sitebuild import compile_so

    dep = compile_so("libcsllp.so.1")
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "libcsllp.so.1").write_bytes(dep)
    root = tmp_path / "root.so"
    root.write_bytes(compile_so(None, needed=["libcsllp.so.1"]))
    settle(window)
    assert _paths(_tree(capsys, root)[1])["libcsllp.so.1"] is None
    for d in ("x", "y", "x"):
        monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / d))
        assert _paths(_tree(capsys, root)[1])["libcsllp.so.1"] == str(tmp_path / d / "libcsllp.so.1")
    # a relative element: the current directory is part of the answer (x/sub has the library, y/sub not)
    monkeypatch.setenv("LD_LIBRARY_PATH", "sub")
    for d in ("x", "y"):
        (tmp_path / d / "sub").mkdir()
    (tmp_path / "x" / "sub" / "libcsllp.so.1").write_bytes(dep)
    settle(window)
    for d, want in (("x", "sub/libcsllp.so.1"), ("y", None), ("x", "sub/libcsllp.so.1"), ("y", None)):
        monkeypatch.chdir(tmp_path / d)
        assert _paths(_tree(capsys, root)[1])["libcsllp.so.1"] == want


def test_closure_cache_corrupt_file_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, window: float
) -> None:
    root, _first, second, _dep = _two_dirs(tmp_path)
    settle(window)
    cold = _tree(capsys, root)
    cache = Path(os.environ["CUDASTACK_CACHE_DIR"]) / "treecache-v1.json"
    good = cache.read_bytes()
    crc, header, rows = good.split(b"\n", 2)
    target = b'"path": "' + str(second / "libcsdep.so.1").encode()
    assert target in rows
    forged = b"\n".join([crc, header, rows.replace(target, target.replace(b"second", b"secxnd"))])
    for bad in (
        b"",
        b"not json at all",
        good[: len(good) // 2],  # truncated
        forged,  # a changed row: the checksum no longer matches
        b'00000000\n{"schema": "something-else"}\n',
    ):
        cache.write_bytes(bad)
        assert _tree(capsys, root) == cold
        assert cache.read_bytes() != bad  # rebuilt
        with monkeypatch.context() as m:
            _no_resolver(m)
            assert _tree(capsys, root) == cold


def test_closure_cache_racy_files_not_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files changed within the racy window (2 s) of a run are not trusted: the next run resolves again."""
    root, _first, _second, _dep = _two_dirs(tmp_path)
    cold = _tree(capsys, root)
    cache = Path(os.environ["CUDASTACK_CACHE_DIR"]) / "treecache-v1.json"
    assert str(root) not in (cache.read_text() if cache.exists() else "")
    calls: list[str] = []
    from pytest_cudastack.linker.resolver import Resolver

    orig = Resolver.tree_deps

    def spy(self: Resolver, path: str) -> Any:
        calls.append(path)
        return orig(self, path)

    monkeypatch.setattr(Resolver, "tree_deps", spy)
    assert _tree(capsys, root) == cold
    assert calls == [str(root)]


def test_closure_cache_warm_path_imports(scen: Scenarios, tmp_path: Path) -> None:
    """A warm `tree --json` imports neither the resolver nor the ELF reader, dataclasses or logging."""
    import subprocess
    import sys
    import time

    time.sleep(2.1)  # the default racy window: the fixture files may be younger
    code = (
        "import sys\nfrom pytest_cudastack.cli import main\n"
        f"rc = main(['tree', '--json', {str(scen.rpath_inherit)!r}, {str(scen.missing_deep)!r}])\n"
        "heavy = ('pytest_cudastack.linker.resolver', 'pytest_cudastack.linker.elf', 'dataclasses', 'logging',"
        " 'elftools')\n"
        "print(rc, [m for m in heavy if m in sys.modules], file=sys.stderr)\n"
    )
    env = dict(os.environ, CUDASTACK_CACHE_DIR=str(tmp_path / "own-cache"))
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout == runs[1].stdout
    assert "pytest_cudastack.linker.resolver" in runs[0].stderr  # cold
    assert runs[1].stderr.strip() == "1 []"  # warm


@pytest.mark.real
@pytest.mark.xdist_group("torch-venv")  # test_real_wheels changes the venv inodes' ctime (cp -al, pip)
def test_closure_cache_torch_venv(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Over every ELF file of the real torch venv, the warm answer is the cold one, and comes from the cache."""
    from pytest_cudastack.linker.elf import looks_like_elf
    from pytest_cudastack.linker.resolver import Resolver

    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("CUDASTACK_TORCH_VENV unset or absent")
    roots = sorted(
        p
        for d, _dirs, files in os.walk(venv)
        for f in files
        if not os.path.islink(p := os.path.join(d, f)) and (".so" in f or os.access(p, os.X_OK)) and looks_like_elf(p)
    )
    assert len(roots) >= 100
    monkeypatch.chdir(venv)  # some RUNPATHs hold a relative element: the current directory is searched
    settle(2.1)  # other real-tier tests write __pycache__ directories into the venv: outside the racy window
    cold = _tree(capsys, *roots)
    calls: list[str] = []
    orig = Resolver.tree_deps

    def spy(self: Resolver, path: str) -> Any:
        calls.append(path)
        return orig(self, path)

    monkeypatch.setattr(Resolver, "tree_deps", spy)
    assert _tree(capsys, *roots) == cold
    assert len(calls) <= len(roots) // 10, calls  # all from the cache, unless a test running beside changed some


def _consumer_venv(tmp_path: Path, *, runpath: str = "$ORIGIN/../nvidia/fake/lib") -> tuple[Path, Path]:
    """torchish's extension module needs libcudastackfake.so.9 and finds it through its RUNPATH, as torch
    finds libcudnn.so.9; nvidia-fake-cu13 ships it."""
    venv, site = _venv_with_lib(tmp_path)
    write_dist(
        site,
        "torchish",
        "2.0",
        {"torchish/_C.so": compile_so(None, needed=["libcudastackfake.so.9"], runpath=runpath, pyinit="_C")},
    )
    return venv, site


def test_why_answers_as_the_consumer_loads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    venv, site = _consumer_venv(tmp_path)
    lib = site / "torchish/../nvidia/fake/lib/libcudastackfake.so.9"
    assert main(["why", "--site", str(venv), "libcudastackfake.so.9"]) == 0
    out = capsys.readouterr().out
    consumer = site / "torchish/_C.so"
    assert out.startswith(f"libcudastackfake.so.9 => {lib} [runpath of {consumer}] (nvidia-fake-cu13 9.1)\n")
    assert f"needed by: {consumer} (torchish 2.0)" in out
    assert "as a DT_NEEDED of the Python executable" in out
    assert "NOT FOUND" in out
    assert main(["why", "--json", "--site", str(venv), "libcudastackfake.so.9"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["found"] is True
    assert (data["path"], data["route"], data["provider"]) == (str(lib), "runpath", "nvidia-fake-cu13 9.1")
    assert data["needed_by"] == [str(consumer)]
    assert data["needed_by_providers"] == ["torchish 2.0"]
    assert data["executable"]["path"] is None
    assert data["on_disk"] is None  # one RECORD lists the path: no question whose bytes they are


def test_why_says_whose_bytes_are_on_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    venv, site = _consumer_venv(tmp_path)
    # pip install nvidia-fake-cu12 over it: both RECORDs list the path, the bytes are cu12's
    rel = "nvidia/fake/lib/libcudastackfake.so.9"
    write_dist(site, "nvidia-fake-cu12", "9.0", {rel: compile_so("libcudastackfake.so.9", payload="cu12 build")})
    assert main(["why", "--site", str(venv), "libcudastackfake.so.9"]) == 0
    out = capsys.readouterr().out
    assert "bytes on disk: nvidia-fake-cu12 9.0's (the path is listed by " in out
    assert main(["why", "--json", "--site", str(venv), "libcudastackfake.so.9"]) == 0
    disk = json.loads(capsys.readouterr().out)["on_disk"]
    assert disk["bytes_of"] == ["nvidia-fake-cu12 9.0"]
    assert sorted(disk["claimed_by"]) == ["nvidia-fake-cu12 9.0", "nvidia-fake-cu13 9.1"]


def test_why_not_found_only_when_no_load_finds_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    venv, site = _consumer_venv(tmp_path, runpath="$ORIGIN/../nowhere:$ORIGIN")
    assert main(["why", "--site", str(venv), "libcudastackfake.so.9"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("libcudastackfake.so.9 => NOT FOUND\n")
    # the directories the consumer's load searched that exist: not the missing RUNPATH entry, not file names
    tried = out.split("  tried:\n")[1].split("  needed by:")[0].split()
    assert tried[0] == str(site / "torchish")
    assert all(os.path.isdir(t) for t in tried)
    assert str(site / "nowhere") not in tried
    assert len(tried) == len(set(tried))


def test_why_tried_lists_directories(scen: Scenarios, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setattr(whyview, "_inventory", lambda site, reader: None)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{scen.d_llp}:/nonexistent/dir:{scen.d_llp}")
    assert main(["why", "--json", "libcudastacknowhere.so.1"]) == 1
    tried = json.loads(capsys.readouterr().out)["tried"]
    assert tried[0] == str(scen.d_llp)
    assert "/nonexistent/dir" not in tried
    assert len(tried) == len(set(tried))
    assert all(os.path.isdir(t) for t in tried)


def test_text_tree_of_a_1000_deep_chain_renders_without_recursion() -> None:
    # issue 14: the recursive renderer ended in RecursionError; the view is now an explicit stack
    import io

    from pytest_cudastack.cli.tree import render_tree
    from pytest_cudastack.linker.resolver import Library, Route, Tree

    depth = 1000
    paths = [f"/deep/lib{i}.so" for i in range(depth + 1)]
    libs = tuple(
        Library(f"lib{i}.so", paths[i], paths[i], Route.RUNPATH, "", (), (paths[i - 1],)) for i in range(1, depth + 1)
    )
    buf = io.StringIO()
    render_tree(Tree(paths[0], None, libs, ()), buf)
    lines = buf.getvalue().splitlines()
    assert len(lines) == depth + 1
    assert lines[-1] == "    " * (depth - 1) + f"└── lib{depth}.so => {paths[depth]} [runpath]"
