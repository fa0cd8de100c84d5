"""The import model (model/process.py) on gcc-built stand-ins: import order, preloads, already-loaded by
SONAME, static ``if``/``try`` rules, and the dlopen targets listed as run-time loads."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

import pytest

from pytest_cudastack.cuda.dlopen import Preload
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.strings import read_strings
from pytest_cudastack.model.process import Interpreter, predict_import
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _put(root: Path, files: dict[str, bytes | str]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            p.write_text(data)
        else:
            p.write_bytes(data)


def _exe(tmp_path: Path) -> str:
    p = tmp_path / "bin" / "python"
    _put(tmp_path, {"bin/python": compile_so(None)})
    return str(p)


def predict(tmp_path: Path, site: Path, module: str, preloads: tuple[Preload, ...] = (), cache: ElfCache | None = None):
    interp = Interpreter((str(site),), _exe(tmp_path), startup=frozenset(sys.builtin_module_names))
    resolver = Resolver(SearchConfig(), reader=read_elf)  # the C library from the default directories
    return predict_import(module, interp, resolver, read_elf, lambda p: None, read_strings, preloads, cache)


GLOBAL = Preload("torchish", "_load_global_deps", "path", "RTLD_GLOBAL", "torch-init-preload", path="lib/libglobal.so")


def _torchish(site: Path, init: str) -> None:
    _put(
        site,
        {
            "torchish/__init__.py": init,
            # the global deps library pulls libdep.so.1 through its own RUNPATH ...
            "torchish/lib/libglobal.so": compile_so("libglobal.so", needed=["libdep.so.1"], runpath="$ORIGIN/../dep"),
            "torchish/dep/libdep.so.1": compile_so("libdep.so.1"),
            # ... which the extension module needs but cannot find on its own
            f"torchish/_C{SUFFIX}": compile_so(None, pyinit="_C", needed=["libdep.so.1"]),
        },
    )


def test_preload_satisfies_a_later_module_by_soname(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    _torchish(site, "import os\n_load_global_deps()\nfrom torchish import _C\n")
    p = predict(tmp_path, site, "torchish", (GLOBAL,))
    assert not p.missing
    assert not p.problems
    got = [(Path(o.path).name, o.route, o.reason) for o in p.objects]
    assert got == [
        ("libglobal.so", "preload", "preload by path (torchish._load_global_deps, RTLD_GLOBAL)"),
        ("libdep.so.1", "DT_NEEDED", "DT_NEEDED of libglobal.so"),
        (f"_C{SUFFIX}", "extension module", "extension module torchish._C (dlopen RTLD_NOW|RTLD_LOCAL)"),
    ]
    assert p.modules[:2] == ("torchish", "torchish._C")


def test_without_the_preload_the_soname_is_missing(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    _torchish(site, "from torchish import _C\n")
    p = predict(tmp_path, site, "torchish", (GLOBAL,))
    assert p.missing == ("libdep.so.1",)


def test_a_path_preload_made_by_a_submodule_is_relative_to_the_top_level_package(tmp_path: Path):
    """torchaudio's pattern: ``pkgx._ext``'s top-level code loads ``<pkgx>/lib/libpkgx.so`` by path (a
    helper of its own, RTLD_LOCAL), then imports ``pkgx.lib._C``, whose DT_NEEDED libpkgx.so (no RPATH)
    it matches by soname. The row's path is relative to the top-level package, wherever the call is."""
    site = site_packages(tmp_path / "venv")
    _put(
        site,
        {
            "pkgx/__init__.py": "from pkgx import _ext\n",
            "pkgx/_ext/__init__.py": (
                "from .utils import _load_lib\nif _AVAILABLE:\n    _load_lib('libpkgx')\n    import pkgx.lib._C\n"
            ),
            "pkgx/_ext/utils.py": "def _load_lib(name):\n    pass\n",
            "pkgx/lib/__init__.py": "",
            "pkgx/lib/libpkgx.so": compile_so("libpkgx.so"),
            f"pkgx/lib/_C{SUFFIX}": compile_so(None, pyinit="_C", needed=["libpkgx.so"]),
        },
    )
    row = Preload("pkgx._ext", "_load_lib", "path", "RTLD_LOCAL", "torchaudio-extension", path="lib/libpkgx.so")
    p = predict(tmp_path, site, "pkgx", (row,))
    assert not p.missing
    assert not p.problems
    assert [Path(o.path).name for o in p.objects] == ["libpkgx.so", f"_C{SUFFIX}"]
    assert predict(tmp_path, site, "pkgx").missing == ("libpkgx.so",)  # without the row: the real miss


@pytest.mark.parametrize("guarded", [True, False], ids=["in a try", "bare"])
def test_an_import_in_a_try_whose_module_fails_to_load_is_caught(tmp_path: Path, guarded: bool):
    """cupy's ``try: import cupy_backends.cuda.libs.cutensor; from cupyx import cutensor`` / ``except
    ImportError``: the module is found but misses libcutensor.so.2, so its load raises ImportError, caught.
    Nothing of it stays mapped and the rest of the body does not run; bare, the import fails the package."""
    site = site_packages(tmp_path / "venv")
    body = "import pkgt._opt\nimport pkgt._after\n"
    init = (
        ("try:\n" + "".join(f"    {line}\n" for line in body.splitlines()) + "except ImportError:\n    pass\n")
        if guarded
        else body
    )
    _put(
        site,
        {
            "pkgt/__init__.py": "import pkgt._first\n" + init + "import pkgt._C\n",
            f"pkgt/_first{SUFFIX}": compile_so(None, pyinit="_first"),
            f"pkgt/_opt{SUFFIX}": compile_so(None, pyinit="_opt", needed=["libcudastack_absent.so.2"]),
            f"pkgt/_after{SUFFIX}": compile_so(None, pyinit="_after"),
            f"pkgt/_C{SUFFIX}": compile_so(None, pyinit="_C"),
        },
    )
    p = predict(tmp_path, site, "pkgt")
    names = [Path(o.path).name for o in p.objects if str(site) in o.path]
    if guarded:
        assert p.missing == ()
        assert names == [f"_first{SUFFIX}", f"_C{SUFFIX}"]
        assert "pkgt._opt" not in p.modules
    else:
        assert p.missing == ("libcudastack_absent.so.2",)
        assert f"_opt{SUFFIX}" in names


def test_import_order_of_dependencies(tmp_path: Path):
    """``import pkg`` runs pkg/__init__.py, which imports ``dep`` first: dep's extension maps libx.so.1 through
    its RPATH, and pkg's extension (no RPATH) finds it already loaded."""
    site = site_packages(tmp_path / "venv")
    _put(
        site,
        {
            "dep/__init__.py": "from dep import _ext\n",
            f"dep/_ext{SUFFIX}": compile_so(None, pyinit="_ext", needed=["libx.so.1"], rpath="$ORIGIN/lib"),
            "dep/lib/libx.so.1": compile_so("libx.so.1"),
            "pkg/__init__.py": "import dep\nfrom . import _ext\n",
            f"pkg/_ext{SUFFIX}": compile_so(None, pyinit="_ext", needed=["libx.so.1"]),
        },
    )
    p = predict(tmp_path, site, "pkg")
    assert not p.missing
    assert [Path(o.path).name for o in p.objects] == [f"_ext{SUFFIX}", "libx.so.1", f"_ext{SUFFIX}"]
    assert p.modules == ("pkg", "dep", "dep._ext", "pkg._ext")
    # the other order: pkg's module first misses libx.so.1
    (site / "pkg/__init__.py").write_text("from . import _ext\nimport dep\n")
    assert predict(tmp_path, site, "pkg").missing == ("libx.so.1",)


def test_static_if_and_try_rules(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    _put(
        site,
        {
            "pkg/__init__.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import typed_only\n"
                "if sys.platform == 'win32':\n    import win_only\nelse:\n    import posix_side\n"
                "try:\n    import absent_module\nexcept ImportError:\n    import fallback_side\n"
                "try:\n    import posix_side\nexcept ImportError:\n    import never_side\n"
                "def later():\n    import in_function\n"
            ),
            "typed_only.py": "",
            "win_only.py": "",
            "posix_side.py": "",
            "fallback_side.py": "",
            "never_side.py": "",
            "in_function.py": "",
        },
    )
    p = predict(tmp_path, site, "pkg")
    assert set(p.modules) >= {"pkg", "posix_side", "fallback_side"}
    assert not {"typed_only", "win_only", "never_side", "in_function"} & set(p.modules)


def test_dlopen_targets_are_run_time_loads_not_import(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    _put(
        site,
        {
            "pkg/__init__.py": "from . import _ext\n",
            f"pkg/_ext{SUFFIX}": compile_so(None, pyinit="_ext", needed=["libcudnn.so.9"], rpath="$ORIGIN/lib"),
            "pkg/lib/libcudnn.so.9": compile_so("libcudnn.so.9", rpath="$ORIGIN"),
            "pkg/lib/libcudnn_graph.so.9": compile_so("libcudnn_graph.so.9"),
        },
    )
    p = predict(tmp_path, site, "pkg")
    assert "libcudnn_graph.so.9" not in {o.soname for o in p.objects}
    assert ("libcudnn_graph.so.9", "dlopen", "dlopen by libcudnn.so.9") in {
        (o.soname, o.route, o.reason) for o in p.run_time
    }


def test_unknown_module_is_a_problem_and_imports_are_cached(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    assert predict(tmp_path, site, "nothere").problems[0].startswith("No module named 'nothere'")
    _put(site, {"pkg/__init__.py": "import helper\n", "helper.py": ""})
    cache = ElfCache(str(tmp_path / "cache"), enabled=True)
    first = predict(tmp_path, site, "pkg", cache=cache)
    assert cache.get_extra(f"pyimports:{site / 'pkg/__init__.py'}")["items"] == [["i", ["helper"]]]
    assert predict(tmp_path, site, "pkg", cache=cache).modules == first.modules == ("pkg", "helper")
    # a corrupt entry (an import naming no module) is a miss, parsed again: never a ValueError
    key = f"pyimports:{site / 'pkg/__init__.py'}"
    entry = dict(cache.get_extra(key))
    entry["items"] = [["i", []]]
    cache.put_extra(key, entry)
    assert predict(tmp_path, site, "pkg", cache=cache).modules == ("pkg", "helper")


def test_function_bodies_are_not_parsed_but_top_level_code_is(tmp_path: Path):
    """The top-level scan drops def bodies before parsing (cost); one-line defs, multi-line headers and a body
    whose string runs at column 0 (the stripped text does not parse: the original is parsed) keep every
    top-level import."""
    site = site_packages(tmp_path / "venv")
    _put(
        site,
        {
            "pkg/__init__.py": (
                "def one(): return 1\n"
                "if True:\n    import after_one_liner\n"
                "def multi(a,\n          b=(1, 2)):\n    import in_body\n    return a\n"
                "import after_multi\n"
                "def doc():\n    x = '''\nimport in_string\n'''\n    return x\n"
                "import after_doc\n"
                "class K:\n    import in_class\n    def m(self):\n        import in_method\n"
            ),
            **{f"{m}.py": "" for m in ("after_one_liner", "in_body", "after_multi", "in_string", "after_doc")},
            "in_class.py": "",
            "in_method.py": "",
        },
    )
    p = predict(tmp_path, site, "pkg")
    assert p.modules == ("pkg", "after_one_liner", "after_multi", "after_doc", "in_class")


def test_a_deep_import_chain_is_a_problem_not_a_crash(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    _put(site, {f"m{i}.py": f"import m{i + 1}\n" for i in range(400)})
    p = predict(tmp_path, site, "m0")
    assert p.problems
    assert "levels" in p.problems[0] or "nest too deeply" in p.problems[0]


TRICKY = (
    '"""A docstring with code at column 0:\n\nimport in_docstring\nif x:\n    import in_doc_if\n"""\n'
    "# import in_comment\n"
    "import a_first  # a comment with ( an open bracket\n"
    "names = [\n    n for n in range(3)\n    if n\n]\n"  # an `if` continuation line is not a statement
    's = \'a string with ( and # and """\'\n'
    't = f"{names[0]} \\\n(continued)"\n'  # a backslash-newline inside a one-line string
    "x = 1; import b_semicolon\n"
    "import \\\n    c_backslash\n"
    "def header(\n    a,\n) -> None:\n    import in_def\n"
    "@decorator(\n    1,\n)\nclass K(\n    object,\n):\n    import d_class\n"
    "    def m(self):\n        import in_method\n"
    "for i in range(2):\n    import in_for\nelse:\n    import in_for_else\n"
    "while False:\n    pass\nelse: import in_while_else\n"
    "if sys.platform == 'nonesuch':\n    import in_false_if\nelif True:\n    pass\nelse:\n    import e_else\n"
    "try:\n    import f_try\nexcept ImportError:\n    import in_handler\nfinally:\n    import g_finally\n"
    "with ctx():\n    import h_with\n"
    "if True:\n    y = r'''\nimport in_raw\n''' + ''.format()\n    import i_after_raw\n"
    "match = 3\n"
    "import j_last\n"
)


def test_top_level_scan_equals_the_interpreter_on_tricky_text(tmp_path: Path):
    """The fast top-level scan (lexed strings and comments, continuation lines, dropped bodies) imports what
    the full parse imports: code in docstrings, comments, function and loop bodies is not followed, every
    top-level, class, if/try/with import is."""
    site = site_packages(tmp_path / "venv")
    names = ("a_first", "b_semicolon", "c_backslash", "d_class", "e_else", "f_try", "g_finally", "h_with")
    others = ("i_after_raw", "j_last", "in_docstring", "in_doc_if", "in_comment", "in_def", "in_method")
    others += ("in_for", "in_for_else", "in_while_else", "in_false_if", "in_handler", "in_raw")
    _put(site, {"pkg/__init__.py": "import sys\n" + TRICKY, **{f"{m}.py": "" for m in names + others}})
    p = predict(tmp_path, site, "pkg")
    assert p.modules == ("pkg", *names, "i_after_raw", "j_last")
    crlf = tmp_path / "crlf"
    _put(site_packages(crlf), {"pkg/__init__.py": ("import sys\n" + TRICKY).replace("\n", "\r\n")})
    _put(site_packages(crlf), {f"{m}.py": "" for m in names + others})
    assert predict(crlf, site_packages(crlf), "pkg").modules == p.modules


@pytest.mark.parametrize("other", [True, False], ids=["another-minor", "this-minor"])
def test_version_tests_are_decided_for_the_python_owning_the_site(tmp_path: Path, other: bool) -> None:
    """``if sys.version_info >= (3, N + 1)`` (N: this interpreter's minor) in a site of Python 3.N+1 (a venv's
    ``lib/python3.N+1/site-packages``, its pyvenv.cfg saying 3.N+1.2) is decided for that Python, not for
    the interpreter running the check; its clean twin, a site of this minor, takes the other branch. Each
    branch imports an extension of its own, so the mapped objects say which branch the model took."""
    newer = sys.version_info[1] + 1
    minor = newer if other else sys.version_info[1]
    venv = tmp_path / "venv"
    site = venv / "lib" / f"python3.{minor}" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = 3.{minor}.2\n")
    init = (
        f"import sys\nif sys.version_info >= (3, {newer}):\n    from pkg import _new\nelse:\n    from pkg import _old\n"
    )
    _put(
        site,
        {
            "pkg/__init__.py": init,
            f"pkg/_new{SUFFIX}": compile_so(None, pyinit="_new"),
            f"pkg/_old{SUFFIX}": compile_so(None, pyinit="_old"),
        },
    )
    interp = Interpreter.for_sites([str(site)], _exe(tmp_path))
    # another minor's extension suffix is its own (.cpython-3N-...): this interpreter's stands for both here
    interp = Interpreter(interp.path, interp.executable, (SUFFIX, ".so"), interp.startup, interp.target)
    resolver = Resolver(SearchConfig(), reader=read_elf)
    got = predict_import("pkg", interp, resolver, read_elf, lambda p: None, read_strings)
    names = {Path(o.path).name for o in got.objects}
    taken, other_branch = (f"_new{SUFFIX}", f"_old{SUFFIX}") if other else (f"_old{SUFFIX}", f"_new{SUFFIX}")
    assert taken in names
    assert other_branch not in names


def test_an_images_standard_library_is_its_own_never_this_machines(tmp_path: Path) -> None:
    """In an image (a site under another root), the standard library is the one its files show: a venv's base
    (``pyvenv.cfg``'s ``home``, an image path taken under the root), Debian's ``/usr/lib/python3.X`` for its
    ``dist-packages``; where they show none, none (the real import would not find ``os`` either)."""
    minor = sys.version_info[1]
    root = tmp_path / "rootfs"
    venv_site = root / f"opt/venv/lib/python3.{minor}/site-packages"
    venv_site.mkdir(parents=True)
    (root / "opt/venv/pyvenv.cfg").write_text(f"home = /usr/local/bin\nversion = 3.{minor}.4\n")
    stdlib = root / f"usr/local/lib/python3.{minor}"
    (stdlib / "lib-dynload").mkdir(parents=True)
    (stdlib / "os.py").write_text("")
    got = Interpreter.for_sites([str(venv_site)], root=str(root))
    assert got.path == (str(stdlib), str(stdlib / "lib-dynload"), str(venv_site))
    debian = root / "usr/lib/python3/dist-packages"
    debian.mkdir(parents=True)
    system = root / f"usr/lib/python3.{minor}"
    system.mkdir(parents=True)
    (system / "os.py").write_text("")
    got = Interpreter.for_sites([str(debian)], root=str(root))
    assert got.path[:2] == (str(system), str(system / "lib-dynload"))
    (stdlib / "os.py").unlink()
    (system / "os.py").unlink()
    (system / "lib-dynload").mkdir()
    assert Interpreter.for_sites([str(venv_site)], root=str(root)).path == (str(venv_site),)
    # this machine's site of this minor: this interpreter's own standard library, as before
    import sysconfig

    host = Interpreter.for_sites([str(tmp_path / f"v/lib/python3.{minor}/site-packages")])
    assert host.path[0] == sysconfig.get_paths()["stdlib"]
