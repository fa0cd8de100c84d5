"""``Resolver.dlopen`` against glibc's own ``dlopen()``, in a child process, on crafted layouts.

Each case builds, with gcc, a caller library whose ``cudastack_try(name)`` calls ``dlopen(name, RTLD_NOW)``
(so the caller glibc sees is that library, found from the return address) and prints the real path of what
it got or that it failed; a small program opens the libraries a case preloads and the top of the caller's
chain by path, then calls it. The child runs under a copy of this machine's dynamic linker whose
``/etc/ld.so.cache`` string points at the case's own cache (built with ``ldconfig -C CACHE -f CONF``, or
none), so nothing depends on the host's cache; every library name is unique to these tests, so nothing is
found in the host's default directories either. The resolver is given the same facts (the program, the
chain of loaders, what is loaded and by which names, LD_LIBRARY_PATH, the cache file, the current directory)
and must give the same answer.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.ldcache import read_ld_cache
from pytest_cudastack.linker.resolver import Resolver, Route, SearchConfig
from tests.helpers.sitebuild import CC, HAVE_CC

INTERP = "/lib64/ld-linux-x86-64.so.2"
CACHE_STRING = b"/etc/ld.so.cache"
HAVE_LDCONFIG = shutil.which("ldconfig") is not None or os.path.exists("/sbin/ldconfig")

pytestmark = pytest.mark.skipif(
    not (HAVE_CC and os.path.exists(INTERP)), reason="needs a C compiler and an x86-64 glibc dynamic linker"
)

CALLER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
int cudastack_try(const char *name) {
    void *h = dlopen(name, RTLD_NOW);
    if (!h) { printf("FAIL %s\n", dlerror()); return 1; }
    struct link_map *lm = 0;
    dlinfo(h, RTLD_DI_LINKMAP, &lm);
    char *r = realpath(lm->l_name, 0);
    printf("OK %s\n", r ? r : lm->l_name);
    return 0;
}
"""

PROG_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
/* prog TOP NAMES [PRELOAD...]: open each PRELOAD, then TOP, by path; call cudastack_try(NAME) in TOP's scope
   for each of the comma-separated NAMES in turn */
int main(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (!dlopen(argv[i], RTLD_NOW)) { printf("SETUP %s\n", dlerror()); return 2; }
    void *top = dlopen(argv[1], RTLD_NOW);
    if (!top) { printf("SETUP %s\n", dlerror()); return 2; }
    int (*f)(const char *) = (int (*)(const char *))dlsym(top, "cudastack_try");
    if (!f) { printf("SETUP no cudastack_try\n"); return 2; }
    for (char *name = strtok(argv[2], ","); name; name = strtok(0, ",")) f(name);
    return 0;
}
"""

PLAIN_C = "int cudastack_plain(void) { return 1; }\n"


def _cc(args: Sequence[str]) -> None:
    assert CC is not None
    subprocess.run([CC, *args], check=True, capture_output=True)


@dataclass
class Lab:
    """A case's directory, its compiler, its patched dynamic linker and its private cache name."""

    root: Path
    ldso: Path
    cache_link: Path  # 16 characters, the patched linker's cache path
    src: Path = field(init=False)

    def __post_init__(self) -> None:
        self.src = self.root / "src"
        self.src.mkdir(parents=True, exist_ok=True)
        (self.src / "caller.c").write_text(CALLER_C)
        (self.src / "plain.c").write_text(PLAIN_C)

    def lib(
        self,
        rel: str,
        soname: str | None,
        *,
        rpath: str | None = None,
        runpath: str | None = None,
        needed: Sequence[str] = (),
        caller: bool = False,
        nodeflib: bool = False,
    ) -> Path:
        """A shared library at ``root/rel``; ``needed``: libraries (paths under root) linked by their names."""
        out = self.root / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        args = ["-shared", "-fPIC", "-o", str(out), str(self.src / ("caller.c" if caller else "plain.c"))]
        if soname:
            args.append(f"-Wl,-soname,{soname}")
        if rpath is not None:
            args += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
        if runpath is not None:
            args += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"]
        if nodeflib:
            args.append("-Wl,-z,nodeflib")
        args.append("-Wl,--no-as-needed")
        for n in needed:
            args += [f"-L{(self.root / n).parent}", f"-l:{Path(n).name}"]
        _cc(args)
        return out

    def prog(self, rpath: str | None = None) -> Path:
        out = self.root / "bin/prog"
        out.parent.mkdir(parents=True, exist_ok=True)
        (self.src / "prog.c").write_text(PROG_C)
        args = ["-o", str(out), str(self.src / "prog.c"), "-ldl"]
        if rpath is not None:
            args += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
        _cc(args)
        return out

    def cache(self, dirs: Sequence[str]) -> Path:
        """A private ld.so.cache of ``dirs`` (under root), built by ldconfig, the patched linker's cache."""
        conf = self.root / "ld.so.conf"
        conf.write_text("".join(f"{self.root / d}\n" for d in dirs))
        cache = self.root / "ld.so.cache"
        ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
        subprocess.run([ldconfig, "-X", "-C", str(cache), "-f", str(conf)], check=True, capture_output=True)
        self.cache_link.unlink(missing_ok=True)
        self.cache_link.symlink_to(cache)
        return cache


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A case directory and a copy of the dynamic linker reading a cache of the test's own at a 16-character
    path under /tmp (a link made per case, removed afterwards; absent: no cache)."""
    data = Path(INTERP).resolve().read_bytes()
    if data.count(CACHE_STRING) == 0:
        pytest.skip("this dynamic linker does not name /etc/ld.so.cache")
    link = Path(f"/tmp/csc{secrets.token_hex(4)}")
    assert len(str(link)) == len(CACHE_STRING)
    ldso = tmp_path / "ld.so"
    ldso.write_bytes(data.replace(CACHE_STRING, str(link).encode()))
    ldso.chmod(0o755)
    try:
        yield Lab(tmp_path / "case", ldso, link)
    finally:
        link.unlink(missing_ok=True)


def _child_all(
    lab: Lab, prog: Path, top: Path, names: str, preload: Sequence[Path], llp: str | None
) -> list[str | None]:
    """What glibc's dlopen gave in the child for each of the comma-separated ``names``, in turn: the real
    path, or None when it failed."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if llp is not None:
        env["LD_LIBRARY_PATH"] = llp
    out = subprocess.run(
        [str(lab.ldso), str(prog), str(top), names, *map(str, preload)],
        capture_output=True,
        text=True,
        env=env,
        cwd=lab.root,
        check=False,
    )
    lines = out.stdout.strip().splitlines()
    assert lines, (out.stdout, out.stderr)
    assert all(x.startswith(("OK ", "FAIL ")) for x in lines), (out.stdout, out.stderr)
    return [x[3:] if x.startswith("OK ") else None for x in lines]


def _child(lab: Lab, prog: Path, top: Path, name: str, preload: Sequence[Path], llp: str | None) -> str | None:
    """What glibc's dlopen of ``name`` gave in the child: the real path, or None when it failed."""
    (got,) = _child_all(lab, prog, top, name, preload, llp)
    return got


def _ours(
    lab: Lab,
    prog: Path,
    top: Path,
    caller: Path,
    name: str,
    preload: Sequence[Path],
    llp: str | None,
    cache: Path | None,
) -> tuple[str | None, Route]:
    """The resolver's answer for the same process: loaded objects and the names they were opened as from
    the closures of the preloads and the top, the caller's loaders from the top's closure."""
    config = SearchConfig(
        ld_library_path=tuple(llp.replace(";", ":").split(":")) if llp is not None else (),
        ld_cache=read_ld_cache(str(cache)) if cache is not None else None,
        default_dirs=(),
        cwd=str(lab.root),
    )
    r = Resolver(config, reader=read_elf)
    loaded: list[str] = []
    names: dict[str, str] = {}
    loaders: tuple[str, ...] = ()
    for p in (*preload, top):
        t = r.tree(str(p), loaded=loaded)
        loaded.append(str(p))
        for x in t.libraries:
            if x.path is not None and x.route is not Route.ALREADY_LOADED:
                loaded.append(x.path)
                names.setdefault(x.soname, x.path)
        if p == top and caller != top:
            soname = next(x.soname for x in t.libraries if x.path and Path(x.path).resolve() == caller.resolve())
            loaders = tuple(reversed(t.chain(soname)))
    # the program opened the preloads and the top by path: their loader is the program
    lib = r.dlopen(name, str(caller), loaded, (*loaders, str(prog)), program=str(prog), names=names)
    return lib.realpath, lib.route


@dataclass(frozen=True)
class Case:
    """One layout: a builder that returns (program, top, caller, name, preloads, LD_LIBRARY_PATH, cache)."""

    id: str
    route: Route  # the resolver's route, to show the case tests what it says


def _t(lab: Lab, rel: str, soname: str | None = "libcsp_t.so.1") -> Path:
    return lab.lib(rel, soname)


Built = tuple[Path, Path, Path, str, Sequence[Path], str | None, Path | None]


def build_case(lab: Lab, cid: str) -> Built:
    """The layouts, by id (each a few lines: what it builds is what it tests)."""
    prog = lab.prog()
    if cid == "rpath":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", rpath=str(lab.root / "a"), caller=True)
        return prog, c, c, "libcsp_t.so.1", (), None, None
    if cid == "runpath-origin":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", runpath="$ORIGIN/../a", caller=True)
        return prog, c, c, "libcsp_t.so.1", (), None, None
    if cid == "loader-rpath":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        mid = lab.lib("m/libmid.so", "libmid.so", rpath=f"{lab.root / 'a'}:{lab.root / 'c'}", needed=["c/libcaller.so"])
        return prog, mid, c, "libcsp_t.so.1", (), None, None
    if cid == "loader-rpath-two-up":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        lab.lib("c/libmid2.so", "libmid2.so", needed=["c/libcaller.so"], rpath="$ORIGIN")
        m1 = lab.lib("m/libmid1.so", "libmid1.so", rpath=f"{lab.root / 'a'}:{lab.root / 'c'}", needed=["c/libmid2.so"])
        return prog, m1, c, "libcsp_t.so.1", (), None, None
    if cid == "own-runpath-stops-loader-rpath":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, runpath="$ORIGIN")
        mid = lab.lib("m/libmid.so", "libmid.so", rpath=f"{lab.root / 'a'}:{lab.root / 'c'}", needed=["c/libcaller.so"])
        return prog, mid, c, "libcsp_t.so.1", (), None, None
    if cid == "loader-runpath-not-inherited":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        mid = lab.lib(
            "m/libmid.so", "libmid.so", runpath=f"{lab.root / 'a'}:{lab.root / 'c'}", needed=["c/libcaller.so"]
        )
        return prog, mid, c, "libcsp_t.so.1", (), None, None
    if cid == "program-rpath":
        _t(lab, "a/libcsp_t.so.1")
        prog = lab.prog(rpath=str(lab.root / "a"))
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_t.so.1", (), None, None
    if cid == "program-rpath-not-for-runpath-caller":
        _t(lab, "a/libcsp_t.so.1")
        prog = lab.prog(rpath=str(lab.root / "a"))
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, runpath="$ORIGIN")
        return prog, c, c, "libcsp_t.so.1", (), None, None
    if cid == "ld-library-path":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_t.so.1", (), str(lab.root / "a"), None
    if cid == "rpath-beats-ld-library-path":
        _t(lab, "a/libcsp_t.so.1")
        lab.lib("b/libcsp_t.so.1", "libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, rpath=str(lab.root / "b"))
        return prog, c, c, "libcsp_t.so.1", (), str(lab.root / "a"), None
    if cid == "ld-library-path-beats-runpath":
        _t(lab, "a/libcsp_t.so.1")
        lab.lib("b/libcsp_t.so.1", "libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, runpath=str(lab.root / "b"))
        return prog, c, c, "libcsp_t.so.1", (), str(lab.root / "a"), None
    if cid == "ld-library-path-empty-element-is-cwd":
        _t(lab, "libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_t.so.1", (), f"{lab.root / 'nowhere'}:", None
    if cid == "unversioned-name-absent":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, runpath=str(lab.root / "a"))
        return prog, c, c, "libcsp_t.so", (), None, None
    if cid == "file-name-not-soname":
        _t(lab, "a/libcsp_t.so")  # SONAME libcsp_t.so.1, file libcsp_t.so
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, rpath=str(lab.root / "a"))
        return prog, c, c, "libcsp_t.so", (), None, None
    if cid == "loaded-by-soname":
        other = _t(lab, "elsewhere/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_t.so.1", (other,), None, None
    if cid == "loaded-by-soname-beats-runpath":
        other = _t(lab, "elsewhere/libcsp_t.so.1")
        lab.lib("a/libcsp_t.so.1", "libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, runpath=str(lab.root / "a"))
        return prog, c, c, "libcsp_t.so.1", (other,), None, None
    if cid == "loaded-by-name-as-opened":
        lab.lib("x/libcsp_n.so", None)  # no SONAME: only the DT_NEEDED name it was opened as
        pre = lab.lib("p/libpre.so", "libpre.so", rpath=str(lab.root / "x"), needed=["x/libcsp_n.so"])
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_n.so", (pre,), None, None
    if cid == "same-inode-as-loaded":
        first = lab.lib("x/libcsp_n.so", None)
        (lab.root / "y").mkdir(parents=True)
        os.link(first, lab.root / "y/libcsp_n.so")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, runpath=str(lab.root / "y"))
        return prog, c, c, "libcsp_n.so", (first,), None, None
    if cid == "absolute-path":
        t = _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, str(t), (), None, None
    if cid == "relative-path-from-cwd":
        _t(lab, "sub/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, runpath=str(lab.root / "sub"))
        return prog, c, c, "sub/libcsp_t.so.1", (), None, None
    if cid == "cache":
        _t(lab, "a/libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_t.so.1", (), None, lab.cache(["a"])
    if cid == "cache-keyed-by-soname-not-file-name":
        _t(lab, "a/libcsp_t.so.1.2.3")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        # ldconfig -X records the SONAME's path (no link made there): neither name opens through the cache
        return prog, c, c, "libcsp_t.so.1.2.3", (), None, lab.cache(["a"])
    if cid == "cache-unversioned-name-recorded":
        _t(lab, "a/libcsp_t.so.1")
        os.symlink("libcsp_t.so.1", lab.root / "a/libcsp_t.so")  # ldconfig records the link's name too
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_t.so", (), None, lab.cache(["a"])
    if cid == "cache-unversioned-name-not-recorded":
        _t(lab, "a/libcsp_t.so.1")  # keyed by its SONAME only: the development name is no key
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_t.so", (), None, lab.cache(["a"])
    if cid == "runpath-beats-cache":
        _t(lab, "a/libcsp_t.so.1")
        lab.lib("b/libcsp_t.so.1", "libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, runpath=str(lab.root / "b"))
        return prog, c, c, "libcsp_t.so.1", (), None, lab.cache(["a"])
    if cid == "ld-library-path-beats-cache":
        _t(lab, "a/libcsp_t.so.1")
        lab.lib("b/libcsp_t.so.1", "libcsp_t.so.1")
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
        return prog, c, c, "libcsp_t.so.1", (), str(lab.root / "b"), lab.cache(["a"])
    if cid == "cache-for-nodeflib-caller":
        _t(lab, "a/libcsp_t.so.1")  # not a system directory: DF_1_NODEFLIB keeps its cache entry
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, nodeflib=True)
        return prog, c, c, "libcsp_t.so.1", (), None, lab.cache(["a"])
    if cid == "nowhere":
        c = lab.lib("c/libcaller.so", "libcaller.so", caller=True, rpath=str(lab.root / "a"))
        return prog, c, c, "libcsp_t.so.1", (), str(lab.root / "b"), None
    raise AssertionError(cid)


CASES = [
    Case("rpath", Route.RPATH),
    Case("runpath-origin", Route.RUNPATH),
    Case("loader-rpath", Route.RPATH),
    Case("loader-rpath-two-up", Route.RPATH),
    Case("own-runpath-stops-loader-rpath", Route.NOT_FOUND),
    Case("loader-runpath-not-inherited", Route.NOT_FOUND),
    Case("program-rpath", Route.RPATH),
    Case("program-rpath-not-for-runpath-caller", Route.NOT_FOUND),
    Case("ld-library-path", Route.LD_LIBRARY_PATH),
    Case("rpath-beats-ld-library-path", Route.RPATH),
    Case("ld-library-path-beats-runpath", Route.LD_LIBRARY_PATH),
    Case("ld-library-path-empty-element-is-cwd", Route.LD_LIBRARY_PATH),
    Case("unversioned-name-absent", Route.NOT_FOUND),
    Case("file-name-not-soname", Route.RPATH),
    Case("loaded-by-soname", Route.ALREADY_LOADED),
    Case("loaded-by-soname-beats-runpath", Route.ALREADY_LOADED),
    Case("loaded-by-name-as-opened", Route.ALREADY_LOADED),
    Case("same-inode-as-loaded", Route.ALREADY_LOADED),
    Case("absolute-path", Route.DIRECT),
    Case("relative-path-from-cwd", Route.DIRECT),
    Case("cache", Route.LD_CACHE),
    Case("cache-keyed-by-soname-not-file-name", Route.NOT_FOUND),
    Case("cache-unversioned-name-recorded", Route.LD_CACHE),
    Case("cache-unversioned-name-not-recorded", Route.NOT_FOUND),
    Case("runpath-beats-cache", Route.RUNPATH),
    Case("ld-library-path-beats-cache", Route.LD_LIBRARY_PATH),
    Case("cache-for-nodeflib-caller", Route.LD_CACHE),
    Case("nowhere", Route.NOT_FOUND),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_dlopen_equals_glibc(lab: Lab, case: Case):
    if "cache" in case.id and not HAVE_LDCONFIG:
        pytest.skip("needs ldconfig to build a private cache")
    prog, top, caller, name, preload, llp, cache = build_case(lab, case.id)
    real = _child(lab, prog, top, name, preload, llp)
    got, route = _ours(lab, prog, top, caller, name, preload, llp, cache)
    assert got == real, (case.id, route)
    assert route is case.route


# ------------------------------------------------------------------------------------------- what a dlopen maps


def _chain_layout(lab: Lab, cid: str) -> tuple[Path, Path, Path, Sequence[Path]]:
    """(program, top, caller, preloads): the caller opens libcsp_open.so.1, which needs libcsp_dep.so.1."""
    prog = lab.prog()
    c = lab.lib("c/libcaller.so", "libcaller.so", caller=True)
    mid = lab.lib("m/libmid.so", "libmid.so", rpath=f"{lab.root / 'x'}:{lab.root / 'c'}", needed=["c/libcaller.so"])
    lab.lib("x/libcsp_dep.so.1", "libcsp_dep.so.1")
    if cid == "dependency-not-through-the-callers-loader-rpath":
        lab.lib("x/libcsp_open.so.1", "libcsp_open.so.1", needed=["x/libcsp_dep.so.1"])
        return prog, mid, c, ()
    if cid == "dependency-through-the-program-rpath":
        prog = lab.prog(rpath=str(lab.root / "x"))
        lab.lib("x/libcsp_open.so.1", "libcsp_open.so.1", needed=["x/libcsp_dep.so.1"])
        return prog, mid, c, ()
    if cid == "dependency-through-the-opened-objects-runpath":
        lab.lib("y/libcsp_dep.so.1", "libcsp_dep.so.1")
        lab.lib("x/libcsp_open.so.1", "libcsp_open.so.1", needed=["y/libcsp_dep.so.1"], runpath="$ORIGIN/../y")
        return prog, mid, c, ()
    if cid == "dependency-already-loaded-by-soname":
        other = lab.lib("z/libcsp_dep.so.1", "libcsp_dep.so.1")
        lab.lib("x/libcsp_open.so.1", "libcsp_open.so.1", needed=["x/libcsp_dep.so.1"], runpath="$ORIGIN")
        return prog, mid, c, (other,)
    if cid == "dependency-missing":
        lab.lib("w/libcsp_dep.so.1", "libcsp_dep.so.1")
        lab.lib("x/libcsp_open.so.1", "libcsp_open.so.1", needed=["w/libcsp_dep.so.1"])
        (lab.root / "x/libcsp_dep.so.1").unlink()
        return prog, mid, c, ()
    raise AssertionError(cid)


@pytest.mark.parametrize(
    "cid",
    [
        "dependency-not-through-the-callers-loader-rpath",
        "dependency-through-the-program-rpath",
        "dependency-through-the-opened-objects-runpath",
        "dependency-already-loaded-by-soname",
        "dependency-missing",
    ],
)
def test_opened_tree_equals_glibc(lab: Lab, cid: str):
    """``Resolver.opened_tree``: the DT_NEEDED of an object a dlopen maps, searched from it (not with the
    caller's loader chain: glibc drops it), as glibc maps them (the child opens the dependency by soname
    after: the object loaded, or, when the first dlopen failed, a search of its own)."""
    prog, top, caller, preload = _chain_layout(lab, cid)
    opened, dep = _child_all(lab, prog, top, "libcsp_open.so.1,libcsp_dep.so.1", preload, None)
    r = Resolver(SearchConfig(default_dirs=(), cwd=str(lab.root)), reader=read_elf)
    loaded = [str(p) for p in preload] + [str(top), str(caller)]
    loaders = (str(top), str(prog))
    lib = r.dlopen("libcsp_open.so.1", str(caller), loaded, loaders, program=str(prog))
    assert lib.path is not None
    tree = r.opened_tree(lib.path, loaded, program=str(prog))
    (x,) = [x for x in tree.libraries if x.soname == "libcsp_dep.so.1"]
    if x.path is None:
        # a dependency missing makes the whole dlopen fail
        assert opened is None, cid
        assert cid in ("dependency-missing", "dependency-not-through-the-callers-loader-rpath")
        return
    assert lib.realpath == opened
    assert x.realpath == dep
