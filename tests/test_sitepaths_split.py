"""purelib != platlib (issue 12, part 4): a RHEL-family system Python installs torch (Root-Is-Purelib: false) into
``P/lib64/python3.X/site-packages`` and the nvidia wheels into ``P/lib/python3.X/site-packages``; torch's RUNPATH
``$ORIGIN/../../nvidia/cudnn/lib`` then names a directory of lib64. The closure finding says so, and its fix is
one the resolver confirms (a real load of the gcc-built consumer is the oracle)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.checks.closure import extension_closures
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.repair import plan_repairs
from pytest_cudastack.wheels.inventory import installed_wheels
from pytest_cudastack.wheels.sitepaths import site_twin, split_site_dirs
from tests.helpers.sitebuild import HAVE_CC, compile_so, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

EXT = "_C.cpython-311-x86_64-linux-gnu.so"
PY = "python3.11"


def prefix(tmp_path: Path, *, venv_link: bool) -> tuple[Path, Path]:
    """(platlib, purelib) of a prefix; ``venv_link``: lib64 is a link to lib, as in a venv (one directory)."""
    root = tmp_path / "usr"
    purelib = root / "lib" / PY / "site-packages"
    purelib.mkdir(parents=True)
    if venv_link:
        (root / "lib64").symlink_to("lib")
    else:
        (root / "lib64" / PY / "site-packages").mkdir(parents=True)
    platlib = root / "lib64" / PY / "site-packages"
    write_dist(
        platlib,
        "torch",
        "2.14.1",
        {
            f"torch/{EXT}": compile_so(None, pyinit="_C", needed=["libtorch_x.so"], runpath="$ORIGIN/lib"),
            "torch/lib/libtorch_x.so": compile_so(
                "libtorch_x.so", needed=["libcudnn.so.9"], runpath="$ORIGIN/../../nvidia/cudnn/lib"
            ),
        },
        requires=["nvidia-cudnn-cu12==9.19.0.56"],
    )
    write_dist(
        purelib,
        "nvidia-cudnn-cu12",
        "9.19.0.56",
        {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", payload="cudnn")},
    )
    return platlib, purelib


def closure(platlib: Path, environ: dict[str, str] | None = None):
    inv = installed_wheels([str(platlib)], reader=read_elf)
    resolver = Resolver(SearchConfig.from_environment(environ or {}), reader=read_elf, owner=inv.owner)
    return extension_closures(inv, resolver), inv


def loads(path: Path, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The oracle: a real dlopen of the consumer in a child process."""
    code = f"import ctypes; ctypes.CDLL({str(path)!r})"
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True)


def test_site_twin_and_split():
    assert site_twin("/usr/lib/python3.11/site-packages") == "/usr/lib64/python3.11/site-packages"
    assert site_twin("/usr/lib64/python3.11/site-packages") == "/usr/lib/python3.11/site-packages"
    assert site_twin("/opt/x/site-packages") is None


def test_split_site_dirs_names_the_runpath_and_both_site_dirs(tmp_path):
    platlib, purelib = prefix(tmp_path, venv_link=False)
    assert split_site_dirs(str(platlib), str(purelib))
    found, inv = closure(platlib)
    (f,) = [x for x in found if x.failing]
    assert f.subject == "libcudnn.so.9"
    assert "not on the search path" not in f.cause
    assert (
        f"the RUNPATH entry $ORIGIN/../../nvidia/cudnn/lib of torch/lib/libtorch_x.so points to "
        f"{platlib}/nvidia/cudnn/lib, which does not hold it; nvidia-cudnn-cu12 9.19.0.56 installed it at "
        f"{purelib}/nvidia/cudnn/lib/libcudnn.so.9" in f.cause
    )
    assert f"different directories ({platlib} and {purelib}" in f.cause
    assert "--force-reinstall" not in f.fix
    assert f.fix.startswith(f"export LD_LIBRARY_PATH={purelib}/nvidia/cudnn/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
    assert f.remedies[0].why.startswith("checked: the linker then finds it there")
    # the naive reinstall the finding used to print is not in the run's plan either: its steps are by hand
    (plan,) = plan_repairs(found, inv)
    assert plan.automatic == ()
    assert [s.action for s in plan.steps] == list(f.remedies)
    assert plan.unresolved == ("closure: libcudnn.so.9",)
    # the oracle: the consumer fails to load as it is, and loads with the fix's LD_LIBRARY_PATH
    consumer = platlib / "torch/lib/libtorch_x.so"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    assert loads(consumer, env).returncode != 0
    fixed = dict(env, LD_LIBRARY_PATH=f"{purelib}/nvidia/cudnn/lib")
    assert loads(consumer, fixed).returncode == 0, loads(consumer, fixed).stderr
    again, _ = closure(platlib, {"LD_LIBRARY_PATH": f"{purelib}/nvidia/cudnn/lib"})
    assert not [x for x in again if x.failing]


def test_venv_lib64_link_is_one_site_dir_and_clean(tmp_path):
    platlib, purelib = prefix(tmp_path, venv_link=True)
    assert not split_site_dirs(str(platlib), str(purelib))
    found, _ = closure(platlib)
    assert not [x for x in found if x.failing], "\n".join(x.render() for x in found)


def test_not_a_split_keeps_the_generic_cause(tmp_path):
    """The library in the same site directory but in a directory no RUNPATH names: no split claimed."""
    platlib, purelib = prefix(tmp_path, venv_link=False)
    target = purelib / "nvidia/cudnn/lib/libcudnn.so.9"
    moved = platlib / "elsewhere/libcudnn.so.9"
    moved.parent.mkdir(parents=True)
    target.rename(moved)
    write_dist(platlib, "cudnn-elsewhere", "1", {"elsewhere/libcudnn.so.9": moved.read_bytes()})
    found, _ = closure(platlib)
    f = next(x for x in found if x.failing and x.subject == "libcudnn.so.9")
    assert "RUNPATH entry" not in f.cause
    assert "that directory is not on the search path" in f.cause
    assert f.remedies[0].why.startswith("no safe automatic repair is known: ")
