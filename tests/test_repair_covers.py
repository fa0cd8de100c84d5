"""Every ERROR any check produces is carried by the repair plan: a verified automatic step (a pip command with
its argv) or a structured manual step, each naming the findings it resolves.

The states are the error-producing ones of the other tests (gcc-built stand-ins), each run through
``cudastack check --json`` as a user runs it: the items the options turn on, the plans over all of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.cli.check import CHECK_SCHEMA
from pytest_cudastack.cuda.compat import min_driver_for_cuda
from tests.helpers.sitebuild import CC, HAVE_CC, compile_so, site_packages, write_dist
from tests.test_bounds_remedy import jitlink
from tests.test_frameworks_files import cudnn as cudnn_wheel
from tests.test_frameworks_files import jax, plugin
from tests.test_repair import cuda13_torch, cudnn, venv
from tests.test_repair_dlopen import SUBS, cudnn_site
from tests.test_schemas import validate
from tests.test_shadow import build as shadow_build
from tests.test_toolchain import _old_bin as old_tools
from tests.test_toolchain import _site as jax_site

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

EXT = "_C.cpython-311-x86_64-linux-gnu.so"
# (site, extra arguments for `cudastack check`, LD_LIBRARY_PATH (or the environment variables to set) or None)
State = tuple[Path, list[str], str | dict[str, str] | None]


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


def _cc(out: Path, source: str, *args: str) -> Path:
    """A shared object built by gcc from ``source`` (``args``: the link line's libraries and flags)."""
    assert CC is not None
    src = out.with_name(out.name.replace(".", "_") + ".c")
    src.write_text(source)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True, capture_output=True)
    return out


def _module_over(tmp_path: Path, new: str, old: str, nodes: tuple[str, str] | None = None) -> Path:
    """A wheel ``app`` whose extension module calls ``foo_new`` of ``libfoo.so.1`` as built from ``new``,
    beside a wheel ``foo`` shipping the build of ``old``; ``nodes``: the version scripts of the two builds."""
    build = tmp_path / "build"
    (build / "old").mkdir(parents=True)

    def so(out: Path, source: str, script: str | None) -> Path:
        flags = []
        if script is not None:
            (out.parent / "foo.map").write_text(script)
            flags = [f"-Wl,--version-script={out.parent / 'foo.map'}"]
        return _cc(out, source, "-Wl,-soname,libfoo.so.1", *flags)

    lib = so(build / "libfoo.so.1", new, nodes[0] if nodes else None)
    mod = _cc(
        build / "_app.so",
        "int foo_new(void);\nvoid *PyInit__app(void) { return (void *)(long)foo_new(); }\n",
        str(lib),
        "-Wl,-rpath,$ORIGIN/../foo/lib",
    )
    shipped = so(build / "old" / "libfoo.so.1", old, nodes[1] if nodes else None)
    site = site_packages(tmp_path / "venv")
    write_dist(site, "foo", "1.0", {"foo/lib/libfoo.so.1": shipped.read_bytes()})
    write_dist(site, "app", "2.0", {"app/__init__.py": "from app import _app\n", "app/_app.abi3.so": mod.read_bytes()})
    return site


def symbols_unbound_reference(tmp_path: Path) -> State:
    site = _module_over(tmp_path, "int foo_new(void) { return 1; }\n", "int foo_old(void) { return 1; }\n")
    return site, [], None


def symbols_missing_version_node(tmp_path: Path) -> State:
    nodes = (
        "FOO_1 { global: foo_old; local: *; };\nFOO_2 { global: foo_new; } FOO_1;\n",
        "FOO_1 { global: foo_old; foo_new; local: *; };\n",
    )
    both = "int foo_old(void) { return 1; }\nint foo_new(void) { return 2; }\n"
    site = _module_over(tmp_path, both, both, nodes)
    return site, [], None


def symbols_driver_entry_point(tmp_path: Path) -> State:
    """A binary calling cuGreenCtxDestroy (CUDA 12.4) on a declared driver for CUDA 12.2, no libcuda here."""
    full = tmp_path / "full"
    full.mkdir()
    libcuda = _cc(full / "libcuda.so.1", "int cuGreenCtxDestroy(void *c) { return 0; }\n", "-Wl,-soname,libcuda.so.1")
    app = _cc(
        tmp_path / "libapp.so",
        "int cuGreenCtxDestroy(void *);\nint app(void) { return cuGreenCtxDestroy(0); }\n",
        str(libcuda),
        "-Wl,-z,now",
    )
    libcuda.unlink()
    site = site_packages(tmp_path / "venv")
    return site, ["--cudastack", f"--cudastack-scan={app}", "--cuda-driver=535.104.05"], None


def arch_not_covered(tmp_path: Path) -> State:
    """A scanned binary with SASS for sm_80 only, on a declared sm_75 GPU (nvcc's fatbin)."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    (tmp_path / "k.cu").write_text("__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    lib = tmp_path / "libk.so"
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(tmp_path / "k.cu")]
    subprocess.run([*cmd, "-gencode", "arch=compute_80,code=sm_80"], check=True, capture_output=True)
    site = site_packages(tmp_path / "venv")
    return site, ["--cudastack", f"--cudastack-scan={lib}", "--cuda-driver=580.65.06", "--cuda-arch=sm_75"], None


def toolchain_old_tools(tmp_path: Path) -> State:
    """jax's XLA finds CUDA_ROOT's ptxas 12.2 before the nvcc wheel's 12.6 (its PTX fails to assemble)."""
    site = jax_site(tmp_path, tmp_path / "RAN")
    old = old_tools(tmp_path, tmp_path / "RAN")
    return site, ["--cudastack"], {"CUDA_ROOT": str(old), "PATH": os.environ.get("PATH", "/usr/bin")}


def framework_rule_floor(tmp_path: Path) -> State:
    """JAX's CUDA 12 plugin built against cuDNN 9.8 over cuDNN 9.5, imported by the project (checks/frameworks)."""
    site = site_packages(tmp_path / "venv")
    plugin(site, 12, "0.6.0", ">=9.8,<10.0", "libcudnn.so.9")
    cudnn_wheel(site, 12, "9.5.1.17")
    jax(site, 12, "0.6.0")
    (tmp_path / "train.py").write_text("import jax\n")
    return site, ["--cudastack", "--cuda-driver=580.65.06", "--cuda-arch=sm_90"], None


def baseline_drift(tmp_path: Path) -> State:
    """A CUDA wheel upgraded after the baseline was recorded (the recording made here, as a user makes it)."""
    site = site_packages(tmp_path / "venv")
    write_dist(site, "nvidia-nccl-cu12", "2.27.3", {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2")})
    assert main(["check", "--site", str(site), f"--cudastack-snapshot={tmp_path / 'base.json'}"]) == 0
    for old in site.glob("nvidia_nccl_cu12-*.dist-info"):
        shutil.rmtree(old)
    lib = compile_so("libnccl.so.2", payload="2.28")
    write_dist(site, "nvidia-nccl-cu12", "2.28.9", {"nvidia/nccl/lib/libnccl.so.2": lib})
    return site, [f"--cudastack-baseline={tmp_path / 'base.json'}"], None


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
        symbols_unbound_reference,
        symbols_missing_version_node,
        symbols_driver_entry_point,
        arch_not_covered,
        toolchain_old_tools,
        framework_rule_floor,
        baseline_drift,
    )
}


def check_json(tmp_path: Path, state: Callable[[Path], State], monkeypatch, capsys) -> dict:
    for var in [v for v in os.environ if v.startswith("CUDASTACK")] + ["LD_LIBRARY_PATH"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    monkeypatch.chdir(tmp_path)  # no configuration file: only these options
    site, args, env = state(tmp_path)
    for var, value in ({"LD_LIBRARY_PATH": env} if isinstance(env, str) else env or {}).items():
        monkeypatch.setenv(var, value)
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
        "symbols",
        "arch",
        "toolchain",
        "baseline",
    }


# the remedy each new item's error must carry as a plan step: (check, the step's action kind, its fields)
TYPED = {
    "symbols_driver_entry_point": ("symbols", "driver", {"minimum": min_driver_for_cuda("12.4"), "cuda": "12.4"}),
    "arch_not_covered": ("arch", "rebuild", {"flags": ["-gencode", "arch=compute_75,code=sm_75"]}),
    "toolchain_old_tools": ("toolchain", "env", {"variable": "CUDA_ROOT", "value": None}),
    "framework_rule_floor": ("requirements", "use-build", {"package": "nvidia-cudnn-cu12"}),
}


@pytest.mark.parametrize("name", list(TYPED))
def test_the_plan_carries_each_items_typed_remedy(tmp_path, monkeypatch, capsys, name):
    """Not prose: the step that carries the error is the check's own remedy, field by field (a driver entry
    point the declared driver lacks: the driver that introduced it, not "load the library that defines it")."""
    check, kind, fields = TYPED[name]
    doc = check_json(tmp_path, STATES[name], monkeypatch, capsys)
    (error,) = {
        f["id"] for found in doc["items"].values() for f in found if f["check"] == check and f["severity"] == "error"
    }
    steps = [s for plan in doc["repair"] for s in plan["steps"] if error in s["resolves"]]
    assert steps[0]["action"]["kind"] == kind, steps
    assert {k: steps[0]["action"][k] for k in fields} == fields
