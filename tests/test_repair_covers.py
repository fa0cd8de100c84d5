"""Every ERROR any check produces is carried by the repair plan: a verified automatic step (a pip command with
its argv) or a structured manual step, each naming the findings it resolves.

The states are the error-producing ones of the other tests (gcc-built stand-ins), each run through
``cudastack check --json`` as a user runs it: the items the options turn on, the plans over all of them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.cli.check import CHECK_SCHEMA
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist
from tests.test_bounds_remedy import jitlink
from tests.test_repair import cuda13_torch, cudnn, venv
from tests.test_repair_dlopen import SUBS, cudnn_site
from tests.test_schemas import validate
from tests.test_shadow import build as shadow_build

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

EXT = "_C.cpython-311-x86_64-linux-gnu.so"
# (site, extra arguments for `cudastack check`, LD_LIBRARY_PATH or None)
State = tuple[Path, list[str], str | None]


def files_gone(tmp_path: Path) -> State:
    site = venv(tmp_path)
    (site / "nvidia/cudnn/lib/libcudnn.so.9").unlink()
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    return site, [], None


def cu12_over_cu13(tmp_path: Path) -> State:
    site = venv(tmp_path)
    write_dist(site, "nvidia-cudnn-cu12", "9.19.0.56", cudnn("cu12"))
    return site, [], None


def two_required_variants(tmp_path: Path) -> State:
    """No pip command repairs it: both variants are required (manual steps only)."""
    site = venv(tmp_path)
    write_dist(site, "nvidia-cudnn-cu12", "9.19.0.56", cudnn("cu12"))
    write_dist(site, "old-tool", "1.0", {"old_tool/__init__.py": ""}, requires=["nvidia-cudnn-cu12==9.19.0.56"])
    return site, [], None


def unshipped_soname(tmp_path: Path) -> State:
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "m",
        "1",
        {
            "m/__init__.py": "from m import _m\n",
            "m/_m.abi3.so": compile_so(None, pyinit="_m", needed=["libnowhere.so.7"]),
        },
    )
    return site, [], None


def unmet_pin(tmp_path: Path) -> State:
    site = venv(tmp_path)
    write_dist(
        site, "nvidia-nccl-cu13", "2.28.9", {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2", payload="old")}
    )
    for old in site.glob("nvidia_nccl_cu13-2.30.7.dist-info"):
        for p in old.iterdir():
            p.unlink()
        old.rmdir()
    return site, [], None


def _reached_cudnn(tmp_path: Path) -> Path:
    site = cudnn_site(tmp_path)
    (site / "netlib/__init__.py").write_text("from netlib import _C\n")
    return site


def dlopen_target_gone(tmp_path: Path) -> State:
    site = _reached_cudnn(tmp_path)
    (site / "nvidia/cudnn/lib/libcudnn_ops.so.9").unlink()
    return site, [], None


def dlopen_target_never_shipped(tmp_path: Path) -> State:
    site = _reached_cudnn(tmp_path)
    files = {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", rpath="$ORIGIN")}
    files.update(
        {
            f"nvidia/cudnn/lib/libcudnn_{s}.so.9": compile_so(f"libcudnn_{s}.so.9", rpath="$ORIGIN")
            for s in SUBS
            if s != "adv"
        }
    )
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43", files)
    (site / "nvidia/cudnn/lib/libcudnn_adv.so.9").unlink()
    return site, [], None


def cuda_max_torch(tmp_path: Path) -> State:
    return cuda13_torch(tmp_path), ["--cuda-max=12.9"], None


def cuda_max_wheel_within_major(tmp_path: Path) -> State:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "nvidia-nvjitlink", "13.5.37", jitlink())
    write_dist(site, "tk", "13.0.3", requires=["nvidia-nvjitlink<14,>=13.0.88"])
    return site, ["--cuda-max=13.0"], None


def cuda_min_wheel(tmp_path: Path) -> State:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "nvidia-nvjitlink", "13.0.88", jitlink())
    return site, ["--cuda-min=13.2"], None


def driver_too_old(tmp_path: Path) -> State:
    return cuda13_torch(tmp_path), ["--cudastack", "--cuda-driver=550.54.15"], None


def shadowed_copy(tmp_path: Path) -> State:
    site, llp = shadow_build(tmp_path, "libcudnn.so.9.19.0")
    return site, [], str(llp)


def scanned_binary(tmp_path: Path) -> State:
    site = venv(tmp_path)
    tool = tmp_path / "bin" / "tool.so"
    tool.parent.mkdir()
    tool.write_bytes(compile_so("libtool.so", needed=["libabsent.so.4"]))
    return site, [f"--cudastack-scan={tool}"], None


def other_major_library(tmp_path: Path) -> State:
    """A CUDA 12 consumer resolving the CUDA 13 wheel's libcusparse.so.12 (mixed majors, closure)."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site, "nvidia-cusparse", "12.6.3.3", {"nvidia/cu13/lib/libcusparse.so.12": compile_so("libcusparse.so.12")}
    )
    ops = compile_so(None, pyinit="_ops", needed=["libcusparse.so.12"], rpath="$ORIGIN/../nvidia/cu13/lib")
    write_dist(
        site,
        "kernelish-cu12",
        "0.3.0",
        {"kernelish/__init__.py": "from kernelish import _ops\n", "kernelish/_ops.abi3.so": ops},
    )
    return site, [], None


STATES: dict[str, Callable[[Path], State]] = {
    f.__name__: f
    for f in (
        files_gone,
        cu12_over_cu13,
        two_required_variants,
        unshipped_soname,
        unmet_pin,
        dlopen_target_gone,
        dlopen_target_never_shipped,
        cuda_max_torch,
        cuda_max_wheel_within_major,
        cuda_min_wheel,
        driver_too_old,
        shadowed_copy,
        scanned_binary,
        other_major_library,
    )
}


def check_json(tmp_path: Path, state: Callable[[Path], State], monkeypatch, capsys) -> dict:
    site, args, llp = state(tmp_path)
    for var in [v for v in os.environ if v.startswith("CUDASTACK")] + ["LD_LIBRARY_PATH"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    if llp is not None:
        monkeypatch.setenv("LD_LIBRARY_PATH", llp)
    monkeypatch.chdir(tmp_path)  # no configuration file: only these options
    capsys.readouterr()
    assert main(["check", "--json", "--site", str(site), *args]) == 1
    doc: dict = validate(json.loads(capsys.readouterr().out), CHECK_SCHEMA)  # facts and remedies as shipped
    return doc


@pytest.mark.parametrize("name", list(STATES))
def test_every_error_is_carried_by_a_step_of_the_plan(tmp_path, monkeypatch, capsys, name):
    doc = check_json(tmp_path, STATES[name], monkeypatch, capsys)
    errors = {f["id"] for found in doc["items"].values() for f in found if f["severity"] == "error"}
    assert errors
    steps = [s for plan in doc["repair"] for s in plan["steps"]]
    carried = {i for s in steps for i in s["resolves"]}
    assert errors <= carried, sorted(errors - carried)
    for s in steps:
        assert s["resolves"]
        assert s["kind"] in ("automatic", "manual")
        if s["kind"] == "automatic":  # a pip command, run in the environment's interpreter
            assert s["action"]["kind"] == "pip"
            assert s["argv"] == s["action"]["argv"]
        else:  # structured: a remedy's kind and its fields, never prose alone
            assert s["argv"] is None
            assert s["action"]["kind"] in ("env", "search-path", "driver", "rebuild", "use-build", "manual")
    for plan in doc["repair"]:  # what is not repaired automatically is carried by a manual step
        manual = {i for s in plan["steps"] if s["kind"] == "manual" for i in s["resolves"]}
        assert set(plan["unresolved"]) <= manual


def test_the_states_cover_every_check_that_reports_errors_here(tmp_path_factory, monkeypatch, capsys):
    """The set above is representative: between them, these states give errors of each of these checks."""
    checks: set[str] = set()
    for name, state in STATES.items():
        with monkeypatch.context() as m:
            doc = check_json(tmp_path_factory.mktemp(name), state, m, capsys)
        checks |= {f["check"] for found in doc["items"].values() for f in found if f["severity"] == "error"}
    assert checks >= {
        "integrity",
        "closure",
        "dlopen",
        "requirements",
        "cuda-max",
        "cuda-min",
        "driver",
        "scan",
    }
