"""Symbol binding (linker/symbols.py, checks/symbols.py) on gcc-built fixtures, against the real loader.

The differential tests run only the fixtures built here: the fixture executables themselves (with and
without ``LD_BIND_NOW=1``) and a tiny host program that ``dlopen``\\ s a module with ``RTLD_NOW``, as Python
does. Never anything from an installed distribution.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_cudastack.checks.symbols import binary_symbol_findings, extension_symbol_findings
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Finding
from pytest_cudastack.linker.elfcache import SYMBOL_CACHE_FILE, ElfCache
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.symbols import ScopeIndex, SymbolFacts, read_symbols
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.elfbuild import CC, needs_cc
from tests.helpers.sitebuild import site_packages, write_dist

pytestmark = needs_cc

LOADER = "/lib64/ld-linux-x86-64.so.2"
needs_loader = pytest.mark.skipif(not os.path.exists(LOADER), reason="needs the x86-64 dynamic linker")


def _cc(out: Path, source: str, args: Sequence[str] = (), *, shared: bool = True, script: str | None = None) -> Path:
    assert CC is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / (out.name.replace(".", "_") + ".c")
    src.write_text(source)
    cmd = [CC, "-o", str(out), str(src)]
    if shared:
        cmd[1:1] = ["-shared", "-fPIC"]
    if script is not None:
        vs = out.parent / (out.name + ".map")
        vs.write_text(script)
        cmd.append(f"-Wl,--version-script,{vs}")
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


def _resolver(llp: Sequence[str] = ()) -> Resolver:
    return Resolver(SearchConfig.from_environment({"LD_LIBRARY_PATH": ":".join(llp)} if llp else {}))


def _env(llp: Sequence[str] = (), bind_now: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_BIND_NOW", "LD_PRELOAD")}
    if llp:
        env["LD_LIBRARY_PATH"] = ":".join(llp)
    if bind_now:
        env["LD_BIND_NOW"] = "1"
    return env


def _run(exe: Path, *args: str, llp: Sequence[str] = (), bind_now: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=_env(llp, bind_now), check=False)


def _text(findings: Sequence[Finding]) -> str:
    return "\n\n".join(f.render() for f in findings)


V1 = "VERS_1 { global: x_old; local: *; };\n"
V2 = "VERS_1 { global: x_old; local: *; };\nVERS_2 { global: x_new; } VERS_1;\n"
V2_EMPTY = "VERS_1 { global: x_old; local: *; };\nVERS_2 { global: x_other; } VERS_1;\n"
X_SRC = "int x_old(void) { return 1; }\nint x_new(void) { return 2; }\nint x_other(void) { return 3; }\n"
Y_NEW = "int y_old(void) { return 1; }\nint y_new(void) { return 2; }\n"
Y_OLD = "int y_old(void) { return 1; }\n"
MAIN = """
int x_new(void); int y_old(void); int y_new(void);
extern int w_missing(void) __attribute__((weak));
int main(int argc, char **argv) {
    (void)argv;
    if (w_missing) return 7;
    if (argc > 1) return x_new() + y_new();
    return y_old() - 1;
}
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """new/ (libx with VERS_2, liby with y_new), old/ (libx without VERS_2, liby without y_new),
    hollow/ (libx whose VERS_2 lacks x_new), and executables built against new/."""
    base = tmp_path_factory.mktemp("symbols")
    for d, script in (("new", V2), ("old", V1), ("hollow", V2_EMPTY)):
        _cc(base / d / "libx.so.1", X_SRC, ["-Wl,-soname,libx.so.1"], script=script)
    _cc(base / "new" / "liby.so.1", Y_NEW, ["-Wl,-soname,liby.so.1"])
    _cc(base / "old" / "liby.so.1", Y_OLD, ["-Wl,-soname,liby.so.1"])
    _cc(base / "hollow" / "liby.so.1", Y_NEW, ["-Wl,-soname,liby.so.1"])
    new = base / "new"
    link = [str(new / "libx.so.1"), str(new / "liby.so.1")]
    _cc(
        base / "runpath_lazy", MAIN, [*link, "-Wl,--enable-new-dtags", f"-Wl,-rpath,{new}", "-Wl,-z,lazy"], shared=False
    )
    _cc(base / "runpath_now", MAIN, [*link, "-Wl,--enable-new-dtags", f"-Wl,-rpath,{new}", "-Wl,-z,now"], shared=False)
    _cc(base / "rpath_lazy", MAIN, [*link, "-Wl,--disable-new-dtags", f"-Wl,-rpath,{new}", "-Wl,-z,lazy"], shared=False)
    return base


# --------------------------------------------------------------------------------------------- the reader
def test_reader_versions_bindings_and_bind_now(libs: Path, tmp_path: Path):
    x = read_symbols(libs / "new" / "libx.so.1")
    assert [(v.name, v.base) for v in x.verdefs] == [("libx.so.1", True), ("VERS_1", False), ("VERS_2", False)]
    assert {(d.name, d.version, d.default) for d in x.definitions()} >= {
        ("x_old", "VERS_1", True),
        ("x_new", "VERS_2", True),
    }
    assert "x_other" not in x.def_names  # local: * in the version script
    assert x.defined_versions() == {"VERS_1", "VERS_2"}

    lazy, now = read_symbols(libs / "runpath_lazy"), read_symbols(libs / "runpath_now")
    assert (lazy.bind_now, now.bind_now) == (False, True)
    refs = {r.name: r for r in lazy.references()}
    assert (refs["x_new"].version, refs["x_new"].file, refs["x_new"].weak) == ("VERS_2", "libx.so.1", False)
    assert (refs["y_new"].version, refs["y_new"].file) == (None, None)
    assert refs["w_missing"].weak
    assert ("libx.so.1", "VERS_2") in {(n.file, n.name) for n in lazy.verneeds}

    special = _cc(
        tmp_path / "libspecial.so",
        """
        __thread int tls_var = 1;
        static int impl(void) { return 1; }
        static void *resolve(void) { return (void *)impl; }
        int picked(void) __attribute__((ifunc("resolve")));
        __attribute__((visibility("hidden"))) int hidden_fn(void) { return 2; }
        __attribute__((weak)) int weak_fn(void) { return 3; }
        int old_impl(void) { return 4; }
        int new_impl(void) { return 5; }
        __asm__(".symver old_impl, both@VERS_1");
        __asm__(".symver new_impl, both@@VERS_2");
        """,
        script="VERS_1 { global: tls_var; picked; weak_fn; }; VERS_2 { } VERS_1;\n",
    )
    defs = {(d.name, d.version): d for d in read_symbols(special).definitions()}
    assert defs[("tls_var", "VERS_1")].type == "TLS"
    assert defs[("picked", "VERS_1")].type == "IFUNC"
    assert defs[("weak_fn", "VERS_1")].binding == "WEAK"
    assert not defs[("both", "VERS_1")].default
    assert defs[("both", "VERS_2")].default
    assert not any(name == "hidden_fn" for name, _ in defs)


def test_gnu_unique_is_a_definition(tmp_path: Path):
    if subprocess.run([str(CC), "-x", "c++", "-E", "-"], input="", capture_output=True, check=False).returncode:
        pytest.skip("no C++ compiler")
    out = tmp_path / "libuniq.so"
    src = tmp_path / "u.cc"
    src.write_text(
        "template <class T> struct S { static int v; }; template <class T> int S<T>::v = 1;\n"
        "inline int &f() { static int x = 0; return x; } int g() { return f() + S<int>::v; }\n"
    )
    proc = subprocess.run(
        [str(CC), "-x", "c++", "-shared", "-fPIC", "-o", str(out), str(src)], capture_output=True, check=False
    )
    if proc.returncode:
        pytest.skip("no C++ compiler")
    bindings = {d.name: d.binding for d in read_symbols(out).definitions()}
    assert bindings.get("_ZZ1fvE1x") == "UNIQUE"


def test_reader_errors_name_the_file(tmp_path: Path):
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"\x7fELF" + b"\0" * 10)
    with pytest.raises(ElfError, match=r"bad\.so"):
        read_symbols(bad)
    static = (
        _cc(tmp_path / "static", "int main(void) { return 0; }\n", ["-static"], shared=False) if _can_static() else None
    )
    if static is not None:
        facts = read_symbols(static)  # binds nothing, needs nothing
        assert (facts.def_names, facts.ref_names, facts.verneeds) == ((), (), ())


def _can_static() -> bool:
    return os.path.exists("/usr/lib/x86_64-linux-gnu/libc.a")


def test_facts_json_round_trip_and_validation(libs: Path):
    facts = read_symbols(libs / "runpath_lazy")
    assert SymbolFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    broken = facts.to_json()
    broken["def_codes"] = broken["ref_codes"]
    with pytest.raises(ElfError):
        SymbolFacts.from_json(broken)
    with pytest.raises(ElfError):
        SymbolFacts.from_json({**facts.to_json(), "verdefs": [["1", "x", True]]})


def test_symbol_cache_hits_and_ignores_corrupt_entries(libs: Path, tmp_path: Path):
    path = str(libs / "new" / "libx.so.1")
    first = ElfCache(str(tmp_path))
    facts = first.read_symbols(path)
    first.flush()
    assert (tmp_path / SYMBOL_CACHE_FILE).is_file()
    second = ElfCache(str(tmp_path))
    assert second.read_symbols(path) == facts
    assert second.hits == 1
    raw = json.loads((tmp_path / SYMBOL_CACHE_FILE).read_text())
    raw["entries"][path]["symbols"]["def_codes"] = "!!"
    (tmp_path / SYMBOL_CACHE_FILE).write_text(json.dumps(raw))
    third = ElfCache(str(tmp_path))
    assert third.read_symbols(path) == facts
    assert third.misses == 1
    (tmp_path / SYMBOL_CACHE_FILE).write_text("{not json")
    assert ElfCache(str(tmp_path)).read_symbols(path) == facts


# -------------------------------------------------------------------------------------------- check_match
def test_check_match_rules(tmp_path: Path):
    lib = _cc(
        tmp_path / "libm2.so",
        """
        int a_old(void) { return 1; } int a_new(void) { return 2; }
        __asm__(".symver a_old, a@VERS_1"); __asm__(".symver a_new, a@@VERS_2");
        int h_old(void) { return 1; } __asm__(".symver h_old, h@VERS_2");
        int e_old(void) { return 1; } __asm__(".symver e_old, e@VERS_1");
        int plain(void) { return 0; }
        """,
        script="VERS_1 { global: plain; }; VERS_2 { } VERS_1;\n",
    )
    facts = read_symbols(lib)
    index = ScopeIndex(["a", "h", "e", "plain", "nope"])
    index.add(facts)
    scope = {facts.path: 0}
    assert index.lookup("a", "VERS_1", scope) == facts.path  # hidden version, exact match
    assert index.lookup("a", "VERS_2", scope) == facts.path
    assert index.lookup("a", "VERS_3", scope) is None
    assert index.lookup("a", None, scope) == facts.path  # the one default version
    assert index.lookup("h", None, scope) is None  # only a hidden version with index >= 3: glibc refuses
    assert index.lookup("h", "VERS_2", scope) == facts.path
    assert index.lookup("e", None, scope) == facts.path  # index 2 binds an unversioned reference, hidden or not
    assert index.lookup("plain", None, scope) == facts.path
    assert index.lookup("nope", None, scope) is None
    assert index.lookup("a", "VERS_2", {}) is None  # not in scope


# ----------------------------------------------------------------------------- programs against the loader
@needs_loader
def test_clean_program_binds_and_runs(libs: Path):
    for exe in ("runpath_lazy", "runpath_now", "rpath_lazy"):
        tree = _resolver().tree(str(libs / exe))
        assert binary_symbol_findings(tree, exe, read_symbols) == ()
        assert _run(libs / exe, "call", bind_now=True).returncode == 4  # x_new() + y_new(); w_missing stays 0


@needs_loader
def test_ld_library_path_shadows_runpath_with_an_old_copy(libs: Path):
    old = str(libs / "old")
    tree = _resolver([old]).tree(str(libs / "runpath_now"))
    findings = binary_symbol_findings(tree, "runpath_now", read_symbols)
    text = _text(findings)
    assert "version `VERS_2' not found (required by" in text
    assert f"libx.so.1 resolved to {old}/libx.so.1 (LD_LIBRARY_PATH" in text
    assert "undefined symbol: y_new" in text
    assert f"{old}/liby.so.1" in text
    assert all(f.failing for f in findings)
    proc = _run(libs / "runpath_now", llp=[old])
    assert proc.returncode != 0
    assert "version `VERS_2' not found" in proc.stderr


@needs_loader
def test_rpath_beats_ld_library_path(libs: Path):
    old = str(libs / "old")
    tree = _resolver([old]).tree(str(libs / "rpath_lazy"))
    assert binary_symbol_findings(tree, "rpath_lazy", read_symbols) == ()
    assert _run(libs / "rpath_lazy", "call", llp=[old], bind_now=True).returncode == 4


@needs_loader
def test_version_node_present_but_symbol_gone(libs: Path):
    hollow = str(libs / "hollow")
    tree = _resolver([hollow]).tree(str(libs / "runpath_now"))
    text = _text(binary_symbol_findings(tree, "runpath_now", read_symbols))
    assert "undefined symbol: x_new, version VERS_2" in text
    assert "not found (required" not in text
    proc = _run(libs / "runpath_now", llp=[hollow])
    assert proc.returncode != 0
    assert "undefined symbol: x_new, version VERS_2" in proc.stderr


@needs_loader
def test_lazy_binding_fails_at_first_call_bind_now_at_start(libs: Path, tmp_path: Path):
    old = tmp_path / "yold"
    old.mkdir()
    (old / "liby.so.1").symlink_to(libs / "old" / "liby.so.1")
    (old / "libx.so.1").symlink_to(libs / "new" / "libx.so.1")
    lazy = binary_symbol_findings(_resolver([str(old)]).tree(str(libs / "runpath_lazy")), "lazy", read_symbols)
    now = binary_symbol_findings(_resolver([str(old)]).tree(str(libs / "runpath_now")), "now", read_symbols)
    assert len(lazy) == len(now) == 1
    assert "fails at its first call" in lazy[0].cause
    assert "fails to load" in now[0].cause
    assert "undefined symbol: y_new" in _text(lazy)
    assert _run(libs / "runpath_lazy", llp=[str(old)]).returncode == 0  # never calls y_new
    assert "undefined symbol: y_new" in _run(libs / "runpath_lazy", llp=[str(old)], bind_now=True).stderr
    assert "undefined symbol: y_new" in _run(libs / "runpath_now", llp=[str(old)]).stderr


# ------------------------------------------------------------------------------ extension modules (RTLD_NOW)
HOST = """
#include <dlfcn.h>
#include <stdio.h>
int Py_FakeApi(void) { return 1; }
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int global = argv[i][0] == '+';
        if (!dlopen(argv[i] + global, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL))) {
            printf("%s\\n", dlerror());
            return 1;
        }
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for python: exports its C API (-rdynamic) and dlopens modules with RTLD_NOW."""
    return _cc(tmp_path_factory.mktemp("host") / "fakepython", HOST, ["-rdynamic", "-ldl"], shared=False)


def _site_with(tmp_path: Path, libs: Path, *, old: bool, preload: bool) -> Path:
    """A site with module ``pkg/mod.so`` (uses the host's Py_FakeApi, x_new@VERS_2 through RUNPATH, and
    g_fn, defined by libg, which only torch's RTLD_GLOBAL preload needs) and optionally that preload."""
    site = site_packages(tmp_path / "venv")
    build = tmp_path / "build"
    libx = libs / ("old" if old else "new") / "libx.so.1"
    libg = _cc(build / "libg.so", "int g_fn(void) { return 5; }\n", ["-Wl,-soname,libg.so"])
    mod = _cc(
        build / "mod.so",
        "int Py_FakeApi(void); int x_new(void); int g_fn(void);\n"
        "int PyInit_mod(void) { return Py_FakeApi() + x_new() + g_fn(); }\n",
        [
            str(libs / "new" / "libx.so.1"),
            "-Wl,--enable-new-dtags",
            "-Wl,-rpath,$ORIGIN/../xlib",
            "-Wl,--allow-shlib-undefined",
        ],
    )
    files = {"pkg/mod.so": mod.read_bytes(), "xlib/libx.so.1": libx.read_bytes()}
    write_dist(site, "xlib-old" if old else "xlib", "1.0", files)
    if preload:
        deps = _cc(
            build / "libtorch_global_deps.so",
            "int td(void) { return 0; }\n",
            ["-Wl,--no-as-needed", str(libg), "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN"],
        )
        write_dist(
            site,
            "torch",
            "9.9",
            {"torch/lib/libtorch_global_deps.so": deps.read_bytes(), "torch/lib/libg.so": libg.read_bytes()},
        )
    return site


def _module_findings(site: Path, host: Path) -> tuple[Finding, ...]:
    inv = installed_wheels([str(site)], reader=None)
    resolver = Resolver(SearchConfig.from_environment({}), owner=inv.owner)
    return extension_symbol_findings(inv, resolver, read_symbols, interpreter=str(host))


def _dlopen(host: Path, site: Path, preload: bool) -> subprocess.CompletedProcess[str]:
    args = [f"+{site}/torch/lib/libtorch_global_deps.so"] if preload else []
    return _run(host, *args, str(site / "pkg" / "mod.so"))


@needs_loader
def test_module_binds_in_the_interpreter_and_preload_scope(tmp_path: Path, libs: Path, host: Path):
    site = _site_with(tmp_path, libs, old=False, preload=True)
    assert _module_findings(site, host) == ()
    assert _dlopen(host, site, preload=True).returncode == 0


@needs_loader
def test_module_without_the_rtld_global_preload_misses_its_symbol(tmp_path: Path, libs: Path, host: Path):
    site = _site_with(tmp_path, libs, old=False, preload=False)
    findings = _module_findings(site, host)
    text = _text(findings)
    assert len(findings) == 1
    assert "undefined symbol: g_fn" in text
    assert "pkg/mod.so" in text
    assert "Py_FakeApi" not in text  # the interpreter's global scope defines it
    proc = _dlopen(host, site, preload=False)
    assert proc.returncode == 1
    assert "undefined symbol: g_fn" in proc.stdout


@needs_loader
def test_module_with_an_old_wheel_copy_names_version_file_and_wheel(tmp_path: Path, libs: Path, host: Path):
    site = _site_with(tmp_path, libs, old=True, preload=True)
    findings = _module_findings(site, host)
    text = _text(findings)
    assert len(findings) == 1, text
    assert "version `VERS_2' not found (required by pkg/mod.so)" in text
    assert "libx.so.1 resolved to xlib/libx.so.1 (runpath, runpath of pkg/mod.so, from xlib-old 1.0)" in text
    assert "xlib-old 1.0" in text
    proc = _dlopen(host, site, preload=True)
    assert proc.returncode == 1
    assert "version `VERS_2' not found" in proc.stdout


@needs_loader
def test_the_way_out_names_the_wheel_copy_that_has_it(tmp_path: Path, libs: Path):
    """LD_LIBRARY_PATH's old copy shadows the RUNPATH one the wheel ships: remove it from LD_LIBRARY_PATH."""
    site = site_packages(tmp_path / "venv")
    write_dist(site, "xlib", "2.0", {"xlib/libx.so.1": (libs / "new" / "libx.so.1").read_bytes()})
    exe = _cc(
        tmp_path / "prog",
        MAIN.replace("y_new()", "0").replace("y_old() - 1", "0"),
        [str(libs / "new" / "libx.so.1"), "-Wl,--enable-new-dtags", f"-Wl,-rpath,{site}/xlib"],
        shared=False,
    )
    inv = installed_wheels([str(site)])
    old = str(libs / "old")
    tree = Resolver(SearchConfig.from_environment({"LD_LIBRARY_PATH": old}), owner=inv.owner).tree(str(exe))
    findings = binary_symbol_findings(tree, "prog", read_symbols, inv)
    assert len(findings) == 1
    assert findings[0].fix == f"remove {old} from LD_LIBRARY_PATH: xlib 2.0's copy at xlib/libx.so.1 defines it"
    assert "version `VERS_2' not found" in _run(exe, llp=[old]).stderr


@needs_loader
def test_verdicts_are_remembered_until_a_file_changes(libs: Path, tmp_path: Path):
    old = tmp_path / "old"
    shutil.copytree(libs / "old", old)
    tree = _resolver([str(old)]).tree(str(libs / "runpath_now"))
    reads: list[str] = []

    def read(path: str) -> SymbolFacts:
        reads.append(path)
        return read_symbols(path)

    cache = ElfCache(str(tmp_path / "cache"))
    first = binary_symbol_findings(tree, "now", read, verdicts=cache)
    assert first
    assert reads
    cache.flush()
    reads.clear()
    warm = ElfCache(str(tmp_path / "cache"))
    assert binary_symbol_findings(tree, "now", read, verdicts=warm) == first
    assert reads == []
    (old / "libx.so.1").unlink()
    shutil.copy(libs / "new" / "libx.so.1", old / "libx.so.1")
    again = binary_symbol_findings(tree, "now", read, verdicts=warm)
    assert reads
    assert "version `VERS_2' not found" not in _text(again)


@needs_loader
def test_copy_relocated_data_binds_to_the_programs_copy(tmp_path: Path):
    """A non-PIE program copies versioned data into its own .bss (R_X86_64_COPY): the program's dynsym then
    defines ``x_data@VERS_2`` with a verneed index, which check_match accepts by name."""
    lib = _cc(
        tmp_path / "libd.so.1",
        "int x_data = 41;\nint get(void) { return x_data; }\n",
        ["-Wl,-soname,libd.so.1"],
        script="VERS_2 { global: x_data; get; local: *; };\n",
    )
    exe = _cc(
        tmp_path / "copyreloc",
        "extern int x_data; int get(void);\nint main(void) { return x_data + get() - 82; }\n",
        ["-no-pie", "-fno-pic", str(lib), "-Wl,--enable-new-dtags", f"-Wl,-rpath,{tmp_path}", "-Wl,-z,now"],
        shared=False,
    )
    facts = read_symbols(exe)
    assert ("x_data", "VERS_2") in {(d.name, d.version) for d in facts.definitions()}
    tree = _resolver().tree(str(exe))
    assert binary_symbol_findings(tree, "copyreloc", read_symbols) == ()
    assert _run(exe).returncode == 0


def test_an_unreadable_interpreter_is_one_warning_not_a_flood(tmp_path: Path, libs: Path):
    site = site_packages(tmp_path / "venv")
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n")
    inv = installed_wheels([str(site)])
    findings = extension_symbol_findings(inv, _resolver(), read_symbols, interpreter=str(fake))
    assert [(f.severity.value, f.subject) for f in findings] == [("warning", str(fake))]
