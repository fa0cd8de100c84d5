"""resolver: glibc's search order, rule by rule, on gcc-built fixtures and fake root trees."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.hwcaps import host_search, legacy_hwcap_subdirs
from pytest_cudastack.linker.ldcache import LdCache, LdCacheEntry
from pytest_cudastack.linker.resolver import Library, Resolver, Route, SearchConfig, Tree
from tests.helpers.elfbuild import Scenarios, build_lib, get_scenarios, needs_cc, patch

pytestmark = needs_cc
LDSO = "/lib64/ld-linux-x86-64.so.2"
needs_ldso = pytest.mark.skipif(not os.path.exists(LDSO), reason="needs the x86-64 ld.so")


@pytest.fixture(scope="session")
def scen(tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    return get_scenarios(tmp_path_factory)


def host(llp: tuple[str, ...] = (), **kw: object) -> Resolver:
    env = {"LD_LIBRARY_PATH": ":".join(llp)} if llp else {}
    cfg = SearchConfig.from_environment(env)
    if kw:
        import dataclasses

        cfg = dataclasses.replace(cfg, **kw)  # type: ignore[arg-type]
    return Resolver(cfg, reader=read_elf)


def lib(tree: Tree, soname: str) -> Library:
    return next(x for x in tree.libraries if x.soname == soname)


# ---------------------------------------------------------------- search order
def test_rpath_is_inherited_down_the_loader_chain(scen: Scenarios) -> None:
    t = host().tree(str(scen.rpath_inherit))
    mid, leaf = lib(t, "libmid.so.1"), lib(t, "libleaf.so.1")
    assert (mid.route, mid.path) == (Route.RPATH, str(scen.base / "a" / "libmid.so.1"))
    assert leaf.route == Route.RPATH
    assert leaf.route_detail == f"rpath of {scen.rpath_inherit}"
    assert leaf.path == str(scen.base / "b" / "libleaf.so.1")
    assert leaf.needed_by == (mid.path,)
    assert t.chain("libleaf.so.1") == (str(scen.rpath_inherit), mid.path)


def test_runpath_is_not_inherited(scen: Scenarios) -> None:
    t = host().tree(str(scen.runpath_not_inherited))
    assert lib(t, "libmid.so.1").route == Route.RUNPATH
    leaf = lib(t, "libleaf.so.1")
    assert leaf.path is None
    assert leaf.route == Route.NOT_FOUND
    assert not any(str(scen.base / "b") in p for p in leaf.tried)
    assert leaf in t.missing
    assert "/usr/lib/libleaf.so.1" in leaf.tried  # default directories were tried, in order


@pytest.mark.parametrize(
    ("root", "with_llp", "expect_dir", "route"),
    [
        pytest.param("prec_rpath", True, "d_rpath", Route.RPATH, id="RPATH beats LD_LIBRARY_PATH"),
        pytest.param("prec_runpath", True, "d_llp", Route.LD_LIBRARY_PATH, id="LD_LIBRARY_PATH beats RUNPATH"),
        pytest.param("prec_runpath", False, "d_runpath", Route.RUNPATH, id="RUNPATH alone"),
        pytest.param("prec_both", True, "d_llp", Route.LD_LIBRARY_PATH, id="RPATH ignored next to RUNPATH"),
        pytest.param("prec_both", False, "d_runpath", Route.RUNPATH, id="RUNPATH used when both"),
    ],
)
def test_precedence(scen: Scenarios, root: str, with_llp: bool, expect_dir: str, route: Route) -> None:
    r = host((str(scen.d_llp),) if with_llp else ())
    got = lib(r.tree(str(getattr(scen, root))), "libprec.so.1")
    assert got.route == route
    assert got.path == str(getattr(scen, expect_dir) / "libprec.so.1")


def test_ld_library_path_separators_and_empty_element(scen: Scenarios) -> None:
    cfg = SearchConfig.from_environment({"LD_LIBRARY_PATH": f"/nonexistent;{scen.d_llp}"})
    assert cfg.ld_library_path == ("/nonexistent", str(scen.d_llp))
    got = lib(Resolver(cfg, reader=read_elf).tree(str(scen.prec_runpath)), "libprec.so.1")
    assert got.path == str(scen.d_llp / "libprec.so.1")
    assert got.tried[0].startswith("/nonexistent/")
    cfg = SearchConfig.from_environment({"LD_LIBRARY_PATH": "/nonexistent:"})
    import dataclasses

    cfg = dataclasses.replace(cfg, cwd=str(scen.d_llp))
    got = lib(Resolver(cfg, reader=read_elf).tree(str(scen.prec_runpath)), "libprec.so.1")
    assert got.route == Route.LD_LIBRARY_PATH
    assert got.path == "libprec.so.1"
    assert got.realpath == str(scen.d_llp / "libprec.so.1")


def test_origin_is_the_directory_the_object_was_opened_from(scen: Scenarios) -> None:
    t = host().tree(str(scen.origin_link))  # a symlink whose target has no deps/ beside it
    dep = lib(t, "libodep.so.1")
    assert dep.path == str(scen.base / "o_link" / "deps" / "libodep.so.1")
    t = host().tree(str(scen.origin_mid))
    sdep = lib(t, "libsdep.so.1")  # ${ORIGIN} of a library found through a symlink
    assert sdep.route == Route.RPATH
    assert sdep.route_detail == f"rpath of {scen.base / 's_link' / 'libsym.so.1'}"
    assert sdep.path == str(scen.base / "s_link" / "sub" / "libsdep.so.1")


def test_nodeflib_skips_cache_and_default_dirs(scen: Scenarios) -> None:
    t = host().tree(str(scen.nodeflib))
    z = lib(t, "libz.so.1")
    assert z.path is None
    assert z.problem
    assert "NODEFLIB" in z.problem
    assert not any(p.startswith("/usr/lib/") for p in z.tried)


@pytest.mark.parametrize(
    ("root", "soname", "why"), [("wrong_machine", "libwm.so", "machine"), ("wrong_class", "libwc.so", "class")]
)
def test_incompatible_candidate_is_skipped(scen: Scenarios, root: str, soname: str, why: str) -> None:
    got = lib(host().tree(str(getattr(scen, root))), soname)
    assert got.path == str(scen.base / "good" / soname)
    assert got.problem
    assert why in got.problem
    assert len(got.tried) == 2


def test_missing_library_deep_in_the_chain(scen: Scenarios) -> None:
    t = host().tree(str(scen.missing_deep))
    assert [x.soname for x in t.missing] == ["libgone.so.1"]
    m1, m2 = str(scen.base / "m" / "libm1.so.1"), str(scen.base / "m" / "libm2.so.1")
    assert t.chain("libgone.so.1") == (str(scen.missing_deep), m1, m2)
    gone = lib(t, "libgone.so.1")
    assert gone.tried[0] == str(scen.base / "m" / "libgone.so.1")  # $ORIGIN of libm2
    assert t.chain("libnothing.so") == ()


@pytest.mark.parametrize("which", ["not_elf_candidate", "dir_candidate"])
def test_invalid_candidate_stops_the_search(scen: Scenarios, which: str) -> None:
    t = host().tree(str(getattr(scen, which)))
    first = t.libraries[0]
    assert first.path is None
    assert first.problem
    assert len(first.tried) == 1  # ld.so does not go on to good/
    assert t.problems


def test_soname_with_slash_is_a_path(scen: Scenarios) -> None:
    t = host().tree(str(scen.needs_slash))
    got = lib(t, "$ORIGIN/sub/libslash.so")
    assert got.route == Route.DIRECT
    assert got.path == str(scen.base / "sl" / "sub" / "libslash.so")


def test_loaded_object_satisfies_by_soname_and_inode(scen: Scenarios) -> None:
    t = host().tree(str(scen.dedupe))
    link, target = lib(t, "liblink.so"), lib(t, "libtarget.so.1")
    assert link.route == Route.RPATH
    assert target.route == Route.ALREADY_LOADED
    assert target.path == link.path
    assert target.tried == ()


def test_missing_name_is_searched_again_for_a_later_requester(scen: Scenarios) -> None:
    t = host().tree(str(scen.refound))
    rx = [x for x in t.libraries if x.soname == "librx.so.1"]
    assert [x.path for x in rx] == [None, str(scen.base / "rx" / "librx.so.1")]
    assert rx[0].needed_by == (str(scen.refound),)
    assert rx[1].route == Route.RPATH
    assert rx[1].needed_by == (str(scen.base / "ry" / "librq.so.1"),)
    assert [x.soname for x in t.missing] == ["librx.so.1"]


def test_symlink_loop_abandons_the_list(scen: Scenarios) -> None:
    got = lib(host().tree(str(scen.loop_candidate)), "liblp.so")
    assert got.path is None
    assert str(scen.base / "good" / "liblp.so") not in got.tried
    assert got.problem
    assert "abandoned" in got.problem
    got = lib(host((str(scen.base / "good"),)).tree(str(scen.loop_candidate)), "liblp.so")
    assert got.route == Route.LD_LIBRARY_PATH  # the next list still runs


def test_executable_rpath_serves_its_libraries(scen: Scenarios) -> None:
    t = host().tree(str(scen.exe))
    xdep = lib(t, "libxdep.so.1")
    assert xdep.route == Route.RPATH
    assert xdep.route_detail == f"rpath of {scen.exe}"
    assert xdep.needed_by == (str(scen.base / "x_mid" / "libxmid.so.1"),)


def test_interpreter_is_already_loaded_and_vdso_absent(scen: Scenarios) -> None:
    t = host().tree(str(scen.exe))
    ld = lib(t, "ld-linux-x86-64.so.2")
    assert ld.route == Route.ALREADY_LOADED
    assert ld.path == LDSO
    assert not any("vdso" in x.soname for x in t.libraries)
    assert all(x.path != str(scen.exe) for x in t.libraries)


def test_bfs_load_order(scen: Scenarios) -> None:
    t = host().tree(str(scen.rpath_inherit))
    names = [x.soname for x in t.libraries]
    # root's needs first (libmid, libc), then libmid's (libleaf), then libc's (ld-linux)
    assert names.index("libmid.so.1") < names.index("libc.so.6") < names.index("libleaf.so.1")


def test_preloaded_object_wins(scen: Scenarios) -> None:
    pre = str(scen.d_llp / "libprec.so.1")
    t = host().tree(str(scen.prec_rpath), preloaded=[pre])
    got = lib(t, "libprec.so.1")
    assert got.route == Route.ALREADY_LOADED
    assert got.path == pre


# ---------------------------------------------------------------- fake roots, cache, conf, hwcaps
def _fake_root(tmp_path: Path, scen: Scenarios) -> Path:
    root = tmp_path / "root"
    for d in ("lib/x86_64-linux-gnu", "usr/lib", "opt/conf", "opt/cached"):
        (root / d).mkdir(parents=True)
    shutil.copyfile(scen.leaf, root / "usr/lib/libleaf.so.1")
    shutil.copyfile(scen.leaf, root / "opt/conf/libleaf.so.1")
    shutil.copyfile(scen.leaf, root / "opt/cached/libleaf.so.1")
    (root / "opt/app").mkdir()
    shutil.copyfile(scen.base / "a" / "libmid.so.1", root / "opt/app/libmid.so.1")
    return root


APP = "/opt/app/libmid.so.1"  # logical path inside the fake root


def test_fake_root_default_dirs(tmp_path: Path, scen: Scenarios) -> None:
    root = _fake_root(tmp_path, scen)
    r = Resolver(SearchConfig(root=str(root)), reader=read_elf)
    t = r.tree(APP)
    got = lib(t, "libleaf.so.1")
    assert (got.route, got.path) == (Route.DEFAULT, "/usr/lib/libleaf.so.1")
    assert got.realpath == "/usr/lib/libleaf.so.1"
    assert got.tried[:2] == ("/lib/x86_64-linux-gnu/libleaf.so.1", "/usr/lib/x86_64-linux-gnu/libleaf.so.1")


def test_fake_root_cache_then_conf_fallback(tmp_path: Path, scen: Scenarios) -> None:
    root = _fake_root(tmp_path, scen)
    cache = LdCache("/etc/ld.so.cache", (LdCacheEntry("libleaf.so.1", "/opt/cached/libleaf.so.1", 0x303, 0),), "new")
    r = Resolver(SearchConfig(root=str(root), ld_cache=cache), reader=read_elf)
    got = lib(r.tree(APP), "libleaf.so.1")
    assert (got.route, got.path) == (Route.LD_CACHE, "/opt/cached/libleaf.so.1")
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("/opt/conf\n")
    cfg = SearchConfig.from_environment({}, root=str(root))
    assert cfg.ld_cache is None
    assert cfg.conf_dirs == ("/opt/conf",)
    got = lib(Resolver(cfg, reader=read_elf).tree(APP), "libleaf.so.1")
    assert (got.route, got.path) == (Route.LD_CACHE, "/opt/conf/libleaf.so.1")
    assert got.route_detail == "ld.so.conf (no ld.so.cache)"


def test_stale_cache_entry_falls_through(tmp_path: Path, scen: Scenarios) -> None:
    root = _fake_root(tmp_path, scen)
    cache = LdCache("c", (LdCacheEntry("libleaf.so.1", "/opt/gone/libleaf.so.1", 0x303, 0),), "new")
    got = lib(Resolver(SearchConfig(root=str(root), ld_cache=cache), reader=read_elf).tree(APP), "libleaf.so.1")
    assert got.route == Route.DEFAULT
    assert "/opt/gone/libleaf.so.1" in got.tried


def test_glibc_hwcaps_subdirectory_preferred(tmp_path: Path) -> None:
    d = tmp_path / "hw"
    plain = build_lib(d / "libhw.so.1", soname="libhw.so.1")
    v2 = build_lib(d / "glibc-hwcaps" / "x86-64-v2" / "libhw.so.1", soname="libhw.so.1")
    root = build_lib(tmp_path / "r" / "libhwroot.so", needed=[plain], rpath=str(d))
    for caps, expect in ((("x86-64-v3", "x86-64-v2"), v2), ((), plain)):
        r = Resolver(dataclasses_replace(SearchConfig.from_environment({}), hwcaps=caps), reader=read_elf)
        assert lib(r.tree(str(root)), "libhw.so.1").path == str(expect)


def dataclasses_replace(cfg: SearchConfig, **kw: object) -> SearchConfig:
    import dataclasses

    return dataclasses.replace(cfg, **kw)  # type: ignore[arg-type]


def test_lib_and_platform_expansion(tmp_path: Path) -> None:
    cfg = SearchConfig.from_environment({})
    for token, value in (("$LIB", cfg.lib), ("${PLATFORM}", cfg.platform)):
        d = tmp_path / token.strip("${}")
        dep = build_lib(d / value / "libdst.so.1", soname="libdst.so.1")
        root = build_lib(d / "libroot.so", needed=[dep], rpath=f"{d}/{token}")
        got = lib(Resolver(cfg, reader=read_elf).tree(str(root)), "libdst.so.1")
        assert got.path == str(dep), token


@needs_ldso
def test_platform_and_lib_match_this_glibc(tmp_path: Path) -> None:
    """ld.so --help names AT_PLATFORM; ldd decides what $LIB expands to."""
    cfg = SearchConfig.from_environment({})
    out = subprocess.run([LDSO, "--help"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"^\s+(\S+) \(AT_PLATFORM", out, re.M)
    assert cfg.platform == (m.group(1) if m else "x86_64")
    dep = build_lib(tmp_path / cfg.lib / "libdstlib.so.1", soname="libdstlib.so.1")
    root = build_lib(tmp_path / "libr.so", needed=[dep], rpath=f"{tmp_path}/$LIB")
    ldd = subprocess.run(["ldd", str(root)], capture_output=True, text=True, check=False).stdout
    assert str(dep) in ldd


@needs_ldso
def test_default_dirs_match_ld_so_help() -> None:
    out = subprocess.run([LDSO, "--help"], capture_output=True, text=True, check=False).stdout
    dirs = tuple(re.findall(r"^\s+(/\S+) \(system search path\)", out, re.M))
    assert SearchConfig.from_environment({}).default_dirs == dirs


# every legacy subdirectory some x86-64 CPU has ld.so search (tls, a platform, avx512_1, x86_64), so that
# the oracle shows any that ld.so searches here and we do not
_ANY_LEGACY = sorted(
    {
        sub
        for platform in ("haswell", "xeon_phi", "x86_64")
        for sub in legacy_hwcap_subdirs(("tls", platform, "avx512_1", "x86_64"))
    }
)


@needs_ldso
def test_hwcap_subdirectory_order_matches_ld_debug(tmp_path: Path) -> None:
    """Differential against this host's ld.so: a directory holding every glibc-hwcaps and legacy hwcap
    subdirectory any x86-64 CPU uses, each with a copy of the library for another machine (skipped, the
    search goes on), the real one in the directory itself. ``LD_DEBUG=libs`` lists every candidate ld.so
    tries, duplicates included; the resolver, configured from this host's CPU alone (no ld.so.cache),
    must try the same ones in the same order and find the same file."""
    d = tmp_path / "d"
    real = build_lib(tmp_path / "src" / "libhwq.so.1", soname="libhwq.so.1")
    root = build_lib(tmp_path / "r" / "libhwqroot.so", needed=[real])
    subdirs = [*(f"glibc-hwcaps/x86-64-v{n}" for n in (2, 3, 4)), *_ANY_LEGACY]
    for sub in subdirs:
        (d / sub).mkdir(parents=True)
        patch(real, d / sub / "libhwq.so.1", 18, (183).to_bytes(2, "little"))  # e_machine AArch64
    shutil.copyfile(real, d / "libhwq.so.1")

    env = {"LD_LIBRARY_PATH": str(d), "LD_DEBUG": "libs", "PATH": os.environ.get("PATH", "")}
    proc = subprocess.run([LDSO, "--list", str(root)], capture_output=True, text=True, env=env, check=False)
    out = proc.stdout + proc.stderr
    search = out.split("find library=libhwq.so.1", 1)[-1].split("find library=", 1)[0]
    theirs = re.findall(r"trying file=(\S+)", search)
    assert theirs, out[-2000:]
    m = re.search(r"search path=(\S+)\s+\(LD_LIBRARY_PATH\)", search)
    assert m, out[-2000:]
    assert f"libhwq.so.1 => {d}/libhwq.so.1 " in out

    platform, levels, legacy = host_search()
    cfg = SearchConfig(ld_library_path=(str(d),), hwcaps=levels, platform=platform, legacy_subdirs=legacy)
    got = lib(Resolver(cfg, reader=read_elf).tree(str(root)), "libhwq.so.1")
    assert got.path == f"{d}/libhwq.so.1"
    assert list(got.tried) == theirs
    ours = [f"{d}/glibc-hwcaps/{h}" for h in levels] + [f"{d}/{sub}" for sub in legacy] + [str(d)]
    assert m.group(1).split(":") == ours


def test_legacy_subdirs_enumeration() -> None:
    assert legacy_hwcap_subdirs(("tls", "x86_64")) == ("tls/x86_64", "tls", "x86_64")
    assert legacy_hwcap_subdirs(()) == ()


# ---------------------------------------------------------------- find, owner, bad roots, JSON
def test_find_from_the_interpreter() -> None:
    got = Resolver(SearchConfig.from_environment({}), reader=read_elf).find("libc.so.6")
    assert got.path is not None
    assert got.route in (Route.LD_CACHE, Route.DEFAULT, Route.RPATH)
    assert got.needed_by == (os.path.realpath(sys.executable),)
    missing = Resolver(SearchConfig.from_environment({}), reader=read_elf).find("libdoesnotexist.so.42")
    assert missing.path is None
    assert missing.route == Route.NOT_FOUND
    assert missing.tried


def test_find_with_explicit_loader(scen: Scenarios) -> None:
    got = host().find("libprec.so.1", loader=str(scen.prec_rpath))
    assert got.route == Route.RPATH
    assert got.path == str(scen.d_rpath / "libprec.so.1")


def test_owner_callback_and_failures(scen: Scenarios) -> None:
    def owner(p: str) -> str | None:
        if "libmid" in p:
            return "mid-dist 1.0"
        if "libleaf" in p:
            raise RuntimeError("inventory broke")
        return None

    r = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=owner)
    t = r.tree(str(scen.rpath_inherit))
    assert lib(t, "libmid.so.1").provider == "mid-dist 1.0"
    assert lib(t, "libleaf.so.1").provider is None


@pytest.mark.parametrize("kind", ["text", "dir", "fifo", "missing"])
def test_bad_root_is_a_problem_not_an_exception(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "root.so"
    if kind == "text":
        p.write_text("hello")
    elif kind == "dir":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    t = host().tree(str(p))
    assert t.info is None
    assert t.libraries == ()
    assert t.problems
    assert str(p) in t.problems[0]


def test_to_json_schema(scen: Scenarios) -> None:
    data = host().tree(str(scen.runpath_not_inherited)).to_json()
    assert set(data) == {"path", "libraries"}
    for entry in data["libraries"]:
        assert set(entry) == {"soname", "path", "needed_by", "provider"}
        assert isinstance(entry["needed_by"], list)
    assert {
        "soname": "libleaf.so.1",
        "path": None,
        "needed_by": [str(scen.base / "a" / "libmid.so.1")],
        "provider": None,
    } in data["libraries"]


def test_resolver_reuses_listings(scen: Scenarios, monkeypatch: pytest.MonkeyPatch) -> None:
    r = host()
    r.tree(str(scen.rpath_inherit))
    calls: list[str] = []
    real = os.listdir

    def counting(p: str) -> list[str]:
        calls.append(p)
        return real(p)

    monkeypatch.setattr(os, "listdir", counting)
    r.tree(str(scen.rpath_inherit))
    assert calls == []
