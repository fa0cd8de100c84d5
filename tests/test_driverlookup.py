"""A framework's own driver lookup (triton's ``libcuda_dirs``), read from its file and replayed; the oracle is
the function itself, run in a child with ``subprocess.check_output`` answered by the real ``ldconfig -p``
over a private ld.so.cache built by ``ldconfig -C``.

Two layouts stand in for triton's releases: 3.x (``backends/nvidia/driver.py``, the variable behind a knob
in ``knobs.py``, matching and asserting ``libcuda.so.1``) and 2.x (``common/build.py``, ``os.getenv``,
matching and asserting the unversioned ``libcuda.so``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_cudastack.checks.driverlookups import Machine, driver_lookup_findings
from pytest_cudastack.cuda.driverlookup import (
    LookupCode,
    load_driver_lookups,
    read_lookup_code,
    replay_lookup,
    validate_driver_lookups,
)
from pytest_cudastack.errors import DataError
from pytest_cudastack.findings import Env, Manual, Severity
from pytest_cudastack.linker.ldcache import read_ld_cache
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from tests.helpers.realenv import torch_site, torch_venv
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist
from tests.helpers.tritonbuild import BUILD_2X, DRIVER_3X, KNOBS_3X

LDCONFIG = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
needs_tools = pytest.mark.skipif(not HAVE_CC or LDCONFIG is None, reason="needs a C compiler and ldconfig")

LAYOUTS = {
    "3.x": {"triton/backends/nvidia/driver.py": DRIVER_3X, "triton/knobs.py": KNOBS_3X},
    "2.x": {"triton/common/build.py": BUILD_2X},
}
ROW = load_driver_lookups()[0]

# the oracle: the installed function's own statements, run with its program answered by the real ldconfig
ORACLE = r"""
import ast, json, os, subprocess, sys, types
path, function, cache, program_exists = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
real = subprocess.check_output
def check_output(argv, *a, **k):
    if not program_exists:
        raise FileNotFoundError(2, "No such file or directory", argv[0])
    return real([os.environ["ORACLE_LDCONFIG"], "-C", cache, *argv[1:]], *a, stderr=subprocess.DEVNULL, **k)
tree = ast.parse(open(path).read())
func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
func.decorator_list = []
knobs = types.SimpleNamespace(nvidia=types.SimpleNamespace(libcuda_path=os.getenv("TRITON_LIBCUDA_PATH")))
scope = {"os": os, "subprocess": types.SimpleNamespace(check_output=check_output), "knobs": knobs}
exec(compile(ast.Module([func], []), path, "exec"), scope)
try:
    print(json.dumps({"ok": True, "dirs": scope[function]()}))
except Exception as e:
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    name = type(e).__module__ + "." + type(e).__name__ if type(e).__module__ == "subprocess" else type(e).__name__
    print(json.dumps({"ok": False, "error": text, "type": name}))
"""


def _site(tmp_path: Path, layout: str) -> Path:
    site = site_packages(tmp_path / f"venv-{layout}")
    write_dist(site, "triton", "3.8.0" if layout == "3.x" else "2.3.1", dict(LAYOUTS[layout]))
    return site


def _oracle(code: LookupCode, cache: Path, env: dict[str, str], program: bool) -> dict[str, object]:
    environ = {"PATH": os.environ.get("PATH", ""), "ORACLE_LDCONFIG": str(LDCONFIG), **env}
    argv = [sys.executable, "-c", ORACLE, code.path, code.function, str(cache), "1" if program else "0"]
    out = subprocess.run(argv, env=environ, capture_output=True, text=True, check=True).stdout
    result: dict[str, object] = json.loads(out)
    return result


def _cache(tmp_path: Path, name: str, dirs: list[Path]) -> Path:
    conf = tmp_path / f"{name}.conf"
    conf.write_text("".join(f"{d}\n" for d in dirs))
    cache = tmp_path / f"{name}.cache"
    subprocess.run([str(LDCONFIG), "-X", "-C", str(cache), "-f", str(conf)], check=True, capture_output=True)
    return cache


def test_the_lookup_is_read_from_each_layouts_own_file(tmp_path: Path) -> None:
    new = read_lookup_code(str(_site(tmp_path, "3.x")), ROW)
    assert new is not None
    assert new.path.endswith("triton/backends/nvidia/driver.py")
    assert (new.argv, new.match, new.required) == (("/sbin/ldconfig", "-p"), "libcuda.so.1", "libcuda.so.1")
    assert (new.env, new.fallback, new.fallback_file) == ("TRITON_LIBCUDA_PATH", "LD_LIBRARY_PATH", "libcuda.so.1")
    assert new.says == "AssertionError: libcuda.so cannot found!"
    old = read_lookup_code(str(_site(tmp_path, "2.x")), ROW)
    assert old is not None
    assert (old.match, old.required, old.env, old.fallback) == ("libcuda.so", "libcuda.so", "TRITON_LIBCUDA_PATH", None)


def test_a_function_that_no_longer_says_its_rule_is_not_judged(tmp_path: Path) -> None:
    site = site_packages(tmp_path / "venv")
    source = "import ctypes.util\n\ndef libcuda_dirs():\n    return [ctypes.util.find_library('cuda')]\n"
    write_dist(site, "triton", "9.0.0", {"triton/backends/nvidia/driver.py": source})
    assert read_lookup_code(str(site), ROW) is None
    (site / "triton/backends/nvidia/driver.py").write_text("def libcuda_dirs(:\n")  # does not parse
    assert read_lookup_code(str(site), ROW) is None


def test_the_data_file_refuses_a_row_without_files() -> None:
    raw = json.loads((Path(__file__).parent.parent / "pytest_cudastack/cuda/data/driver_lookups.json").read_text())
    raw["lookups"][0]["files"] = []
    with pytest.raises(DataError, match=r"lookups\[0\]: 'files' names no file"):
        validate_driver_lookups(raw)


def _layouts(tmp_path: Path) -> dict[str, tuple[Path, Path, Path]]:
    """Case directories: a (listed in the cache), b (not listed), c (listed, its library since removed)."""
    lib = compile_so("libcuda.so.1")
    dirs = {name: tmp_path / name for name in "abc"}
    for d in dirs.values():
        d.mkdir()
        (d / "libcuda.so.1").write_bytes(lib)
        (d / "libcuda.so").symlink_to("libcuda.so.1")
    listed = _cache(tmp_path, "ac", [dirs["a"], dirs["c"]])
    (dirs["c"] / "libcuda.so.1").unlink()
    (dirs["c"] / "libcuda.so").unlink()
    (dirs["b"] / "libcuda.so").unlink()  # b: only the versioned name
    none = _cache(tmp_path, "none", [])
    return {"listed": (listed, dirs["a"], dirs["c"]), "none": (none, dirs["b"], dirs["b"])}


@needs_tools
@pytest.mark.parametrize("layout", ["3.x", "2.x"])
def test_replay_agrees_with_the_function_itself(tmp_path: Path, layout: str) -> None:
    code = read_lookup_code(str(_site(tmp_path, layout)), ROW)
    assert code is not None
    cases = _layouts(tmp_path)
    listed, _a, c = cases["listed"]
    none, b, _ = cases["none"]
    scenarios = [
        ("listed", listed, {}, True),
        ("removed-only", _cache(tmp_path, "c-only", [c]), {}, True),
        ("not-listed", none, {}, True),
        ("not-listed, LD_LIBRARY_PATH", none, {"LD_LIBRARY_PATH": f"/nonexistent:{b}"}, True),
        ("listed, LD_LIBRARY_PATH elsewhere", listed, {"LD_LIBRARY_PATH": str(b)}, True),
        ("TRITON_LIBCUDA_PATH", none, {"TRITON_LIBCUDA_PATH": str(b)}, True),
        ("no cache file", tmp_path / "absent.cache", {}, True),
        ("no program", listed, {}, False),
    ]
    seen: set[str] = set()
    for name, cache, env, program in scenarios:
        real = _oracle(code, cache, env, program)
        try:
            parsed = read_ld_cache(str(cache))
        except Exception:
            parsed = None
        got = replay_lookup(code, env, parsed, _exists(program))
        assert got.ok == real["ok"], name
        if got.ok:
            assert sorted(got.dirs) == sorted(real["dirs"]), name  # type: ignore[call-overload]
            continue
        kind = str(real["type"]).rsplit(".", 1)[-1]
        assert got.error.split(":")[0].rsplit(".", 1)[-1] == kind, (name, got.error, real)
        if kind != "CalledProcessError":  # its text quotes the argv, which the oracle rewrote
            assert got.error == real["error"], name
        seen.add(kind)
    assert seen == {"AssertionError", "CalledProcessError", "FileNotFoundError"}


def _exists(program: bool) -> Callable[[str], bool]:
    """This machine's files, but for the program the lookup runs: there or not, as the case says."""
    return lambda p: program if p == "/sbin/ldconfig" else os.path.exists(p)


def _inventory(tmp_path: Path, layout: str = "3.x") -> Inventory:
    return installed_wheels([str(_site(tmp_path, layout))])


@needs_tools
def test_a_driver_the_cache_does_not_list_fails_tritons_lookup_with_a_verified_fix(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    cases = _layouts(tmp_path)
    none, b, _ = cases["none"]
    machine = Machine("/", {}, read_ld_cache(str(none)), str(b))
    [f] = driver_lookup_findings(inventory, machine)
    assert f.severity is Severity.WARNING
    assert f.message.startswith("triton cannot find libcuda.so.1 at a triton kernel's first compile")
    assert "AssertionError: libcuda.so cannot found!" in f.message
    assert f"the loader finds libcuda.so.1 in {b}, which the cache does not list" in f.cause
    assert f.remedies[0] == Env("TRITON_LIBCUDA_PATH", str(b), why="triton takes the directory as given")
    # the project imports triton: the first compile is what it runs
    reached = Machine("/", {}, read_ld_cache(str(none)), str(b), imports=("triton",))
    assert [x.severity for x in driver_lookup_findings(inventory, reached)] == [Severity.ERROR]


@needs_tools
def test_clean_twins_listed_driver_or_its_variable_set(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    cases = _layouts(tmp_path)
    listed, a, _ = cases["listed"]
    none, b, _ = cases["none"]
    assert driver_lookup_findings(inventory, Machine("/", {}, read_ld_cache(str(listed)), str(a))) == ()
    env = {"TRITON_LIBCUDA_PATH": str(b)}
    assert driver_lookup_findings(inventory, Machine("/", env, read_ld_cache(str(none)), str(b))) == ()
    env = {"LD_LIBRARY_PATH": str(b)}
    assert driver_lookup_findings(inventory, Machine("/", env, read_ld_cache(str(none)), str(b))) == ()
    # no driver here: the driver item's finding, not this one
    assert driver_lookup_findings(inventory, Machine("/", {}, read_ld_cache(str(none)), None)) == ()


@needs_tools
def test_an_older_release_asks_for_the_unversioned_name_and_the_fix_is_its_link(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, "2.x")
    lib = tmp_path / "drv"
    lib.mkdir()
    (lib / "libcuda.so.1").write_bytes(compile_so("libcuda.so.1"))
    cache = read_ld_cache(str(_cache(tmp_path, "drv", [lib])))
    [f] = driver_lookup_findings(inventory, Machine("/", {}, cache, str(lib)))
    assert "asserts one holds libcuda.so" in f.cause
    assert Manual((f"ln -s libcuda.so.1 {lib}/libcuda.so",)) in f.remedies
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    assert driver_lookup_findings(inventory, Machine("/", {}, cache, str(lib))) == ()


def test_an_image_without_ldconfig_fails_at_the_first_compile_and_one_with_it_does_not(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    root = tmp_path / "rootfs"
    (root / "usr/sbin").mkdir(parents=True)
    machine = Machine(str(root), {"PATH": "/usr/bin"}, None, None, image=True)
    [f] = driver_lookup_findings(inventory, machine)
    assert "FileNotFoundError: [Errno 2] No such file or directory: '/sbin/ldconfig'" in f.message
    assert "the image has no /sbin/ldconfig" in f.cause
    assert Manual(("install /sbin/ldconfig in the image (Debian and Ubuntu: libc-bin)",)) in f.remedies
    with_var = Machine(str(root), {"TRITON_LIBCUDA_PATH": "/usr/lib/x86_64-linux-gnu"}, None, None, image=True)
    assert driver_lookup_findings(inventory, with_var) == ()
    (root / "usr/sbin/ldconfig").write_text("")
    (root / "sbin").symlink_to("usr/sbin")  # merged /usr: the link inside the root
    assert driver_lookup_findings(inventory, machine) == ()


@needs_tools
@pytest.mark.real
def test_the_real_tritons_lookup_is_read_and_replayed_as_it_runs(tmp_path: Path) -> None:
    """The torch venv's triton (3.8.0): its own driver.py and knobs.py read, its own function the oracle."""
    site = torch_site(torch_venv())
    code = read_lookup_code(site, ROW)
    assert code is not None, "triton's libcuda_dirs no longer says what it runs, matches and asserts"
    assert (code.argv[0], code.match, code.required, code.env) == (
        "/sbin/ldconfig",
        "libcuda.so.1",
        "libcuda.so.1",
        "TRITON_LIBCUDA_PATH",
    )
    cases = _layouts(tmp_path)
    listed, _a, _c = cases["listed"]
    none, b, _ = cases["none"]
    for cache, env in (
        (listed, {}),
        (none, {}),
        (none, {"LD_LIBRARY_PATH": str(b)}),
        (none, {"TRITON_LIBCUDA_PATH": "x"}),
    ):
        real = _oracle(code, cache, env, True)
        got = replay_lookup(code, env, read_ld_cache(str(cache)), _exists(True))
        assert got.ok == real["ok"], (cache, env, real)
        assert got.ok or got.error == real["error"]


@needs_tools
def test_no_cache_fails_the_lookup_but_an_unreadable_one_is_not_judged(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    root = tmp_path / "root"
    (root / "sbin").mkdir(parents=True)
    (root / "sbin/ldconfig").write_text("")
    machine = Machine(str(root), {}, None, "/usr/lib/x86_64-linux-gnu")
    [f] = driver_lookup_findings(inventory, machine)
    assert (
        "subprocess.CalledProcessError: Command '['/sbin/ldconfig', '-p']' returned non-zero exit status 1."
        in f.message
    )
    assert "which fails without an /etc/ld.so.cache" in f.cause
    (root / "etc").mkdir()
    (root / "etc/ld.so.cache").write_bytes(b"not a cache")  # there, but not read: ldconfig's output unknown
    assert driver_lookup_findings(inventory, machine) == ()
