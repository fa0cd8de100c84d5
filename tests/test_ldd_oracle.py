"""Differential tier: the resolver's closure must equal ldd's, soname -> realpath, exactly.

``ldd`` (glibc's own dynamic linker in trace mode) is the oracle; it runs only here, never in package code.
Marker ``ldd`` for the gcc fixtures and a sample of system libraries, plus ``real`` for every ELF file of
the torch venv in ``$CUDASTACK_TORCH_VENV``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.elf import looks_like_elf, read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig, Tree
from tests.helpers.elfbuild import Scenarios, get_scenarios, needs_cc, needs_ldd

pytestmark = [pytest.mark.ldd, needs_ldd]

_LINE = re.compile(r"^\s*(\S+) => (?:not found|(\S+) \(0x[0-9a-f]+\))\s*$")
_BARE = re.compile(r"^\s*(\S+) \(0x[0-9a-f]+\)\s*$")


@pytest.fixture(scope="session")
def scen(tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    return get_scenarios(tmp_path_factory)


def _env(llp: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    if llp is not None:
        env["LD_LIBRARY_PATH"] = llp
    return env


def ldd_closure(path: str, env: dict[str, str]) -> tuple[int, dict[str, str | None]]:
    """(exit status, soname -> realpath or None) from ldd; the vDSO is dropped."""
    proc = subprocess.run(["ldd", path], capture_output=True, text=True, env=env, check=False, timeout=60)
    out: dict[str, str | None] = {}
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(1)] = os.path.realpath(m.group(2)) if m.group(2) else None
            continue
        m = _BARE.match(line)
        if m and not m.group(1).startswith("linux-vdso"):
            out[m.group(1)] = os.path.realpath(m.group(1))  # printed when the name is the path
    return proc.returncode, out


def ours(tree: Tree) -> dict[str, str | None]:
    """soname -> realpath, plus path -> realpath (ldd prints a bare path when name and path agree)."""
    out: dict[str, str | None] = {lib.soname: lib.realpath for lib in tree.libraries}
    out.update({lib.path: lib.realpath for lib in tree.libraries if lib.path is not None})
    return out


def assert_same(path: str, tree: Tree, theirs: dict[str, str | None]) -> None:
    mine = ours(tree)
    # ldd prints one line per loaded object; a second DT_NEEDED name for the same file is an alias
    extra = {k: v for k, v in mine.items() if k not in theirs}
    mism = {k: (mine.get(k, "<absent>"), v) for k, v in theirs.items() if mine.get(k, "<absent>") != v}
    assert not mism, f"{path}: ours vs ldd differ: {mism}"
    loaded = {v for v in theirs.values() if v is not None}
    stray = {k: v for k, v in extra.items() if v is None or v not in loaded}
    assert not stray, f"{path}: entries ldd does not have: {stray}"


def _compare(paths: list[str], llp: str | None = None) -> None:
    env = _env(llp)
    resolver = Resolver(SearchConfig.from_environment(env), reader=read_elf)
    for p in paths:
        rc, theirs = ldd_closure(p, env)
        assert rc == 0, f"ldd {p} failed"
        assert_same(p, resolver.tree(p), theirs)


@needs_cc
@pytest.mark.parametrize("llp", [None, "LLP"], ids=["no-LD_LIBRARY_PATH", "LD_LIBRARY_PATH"])
def test_fixtures_match_ldd(scen: Scenarios, llp: str | None) -> None:
    roots = [
        str(v)
        for k, v in vars(scen).items()
        if k not in ("base", "d_rpath", "d_llp", "d_runpath", "not_elf_candidate", "dir_candidate")
    ]
    _compare(roots, str(scen.d_llp) if llp else None)


@needs_cc
def test_fixture_llp_empty_element_is_cwd(scen: Scenarios, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(scen.d_llp)
    _compare([str(scen.prec_runpath)], ":")


@needs_cc
@pytest.mark.parametrize("which", ["not_elf_candidate", "dir_candidate"])
def test_invalid_candidate_is_fatal_like_ldd(scen: Scenarios, which: str) -> None:
    path = str(getattr(scen, which))
    rc, _ = ldd_closure(path, _env(None))
    assert rc != 0  # ld.so stops with an error instead of going on to the good copy
    tree = Resolver(SearchConfig.from_environment(_env(None)), reader=read_elf).tree(path)
    assert tree.missing
    assert tree.missing[0].problem
    assert tree.problems


def _system_sample(n: int = 40) -> list[str]:
    base = Path("/usr/lib/x86_64-linux-gnu")
    if not base.is_dir():
        return []
    files = sorted(str(p) for p in base.iterdir() if ".so" in p.name and p.is_file() and not p.is_symlink())
    elfs = [f for f in files if looks_like_elf(f)]
    step = max(1, len(elfs) // n)
    return elfs[::step][:n]


def test_system_sample_matches_ldd() -> None:
    sample = _system_sample()
    if len(sample) < 10:
        pytest.skip("no system library sample")
    _compare(sample)


def _venv_elfs() -> list[str]:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("CUDASTACK_TORCH_VENV unset or absent")
    out: list[str] = []
    for dirpath, _dirs, files in os.walk(venv):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p) and looks_like_elf(p):
                try:
                    info = read_elf(p)
                except ElfError:
                    continue
                if info.elf_type == "ET_DYN" and info.machine == 62:
                    out.append(p)
    return sorted(out)


@pytest.mark.real
def test_torch_venv_matches_ldd() -> None:
    paths = _venv_elfs()
    assert len(paths) >= 100
    _compare(paths)


@needs_cc
def test_fixture_llp_with_origin(scen: Scenarios) -> None:
    """$ORIGIN in LD_LIBRARY_PATH expands to the main program's directory."""
    _compare([str(scen.prec_runpath), str(scen.prec_both)], "$ORIGIN/../p_llp")
