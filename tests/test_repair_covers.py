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
from pytest_cudastack.model.repair import plan_repairs
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from tests.helpers.elfbuild import build_exe, build_lib
from tests.helpers.imagebuild import Entry, build_image
from tests.helpers.sitebuild import CC, HAVE_CC, compile_so, site_packages, write_dist
from tests.test_bounds_remedy import jitlink
from tests.test_fleet_node import fake_root, probed
from tests.test_frameworks_files import cudnn as cudnn_wheel
from tests.test_frameworks_files import jax, plugin
from tests.test_repair import cuda13_torch, cudnn, venv
from tests.test_repair_dlopen import SUBS, cudnn_site
from tests.test_schemas import validate
from tests.test_shadow import build as shadow_build
from tests.test_toolchain import JAXLIB_FILES, fake_tool

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
    site = site_packages(tmp_path / "venv")
    write_dist(site, "jaxlib", "0.4.35", JAXLIB_FILES)
    write_dist(site, "jax", "0.4.35", {"jax/__init__.py": ""})
    tools = ("ptxas", "nvlink", "fatbinary")
    line = "echo 'Cuda compilation tools, release 12.6, V12.6.85'"
    files = {f"nvidia/cuda_nvcc/bin/{t}": f"#!/bin/sh\nexit 1\n{line}\n" for t in tools}
    write_dist(site, "nvidia-cuda-nvcc-cu12", "12.6.85", {**files, "nvidia/cuda_nvcc/__init__.py": ""})
    for t in tools:
        (site / "nvidia/cuda_nvcc/bin" / t).chmod(0o755)
        fake_tool(tmp_path / "old" / "bin" / t, "12.2.140", tmp_path / "RAN")
    return site, ["--cudastack"], {"CUDA_ROOT": str(tmp_path / "old"), "PATH": os.environ.get("PATH", "/usr/bin")}


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


def assert_carried(doc: dict) -> None:
    """Every error of ``doc`` (``check --json``) is carried by a step of its plans: automatic ones are pip
    commands in the environment's interpreter, manual ones a structured remedy."""
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


@pytest.mark.parametrize("name", list(STATES))
def test_every_error_is_carried_by_a_step_of_the_plan(tmp_path, monkeypatch, capsys, name):
    assert_carried(check_json(tmp_path, STATES[name], monkeypatch, capsys))


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


LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
LDSO = Path("/lib64/ld-linux-x86-64.so.2")


def _image_base(tmp_path: Path) -> list[Entry]:
    """A Debian-like root: glibc, ld.so.conf with CUDA's directory and libcublas.so.12; a binary needing
    libcublas.so.13 (the scan item's and the driver item's error at a CUDA 12 driver)."""
    if not LIBC.exists() or not LDSO.exists():
        pytest.skip("needs the x86-64 glibc")
    cublas12 = build_lib(tmp_path / "12" / "libcublas.so.12", soname="libcublas.so.12")
    cublas13 = build_lib(tmp_path / "13" / "libcublas.so.13", soname="libcublas.so.13")
    return [
        Entry("etc/ld.so.conf", data=b"include /etc/ld.so.conf.d/*.conf\n"),
        Entry("etc/ld.so.conf.d/cuda.conf", data=b"/usr/local/cuda/lib64\n"),
        Entry("usr/lib/x86_64-linux-gnu/libc.so.6", data=LIBC.resolve()),
        Entry("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", data=LDSO.resolve()),
        Entry("lib", "symlink", target="usr/lib"),
        Entry("lib64/ld-linux-x86-64.so.2", "symlink", target="/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        Entry("usr/local/cuda/lib64/libcublas.so.12", data=cublas12),
        Entry("opt/app/bin/train", data=build_exe(tmp_path / "train", needed=[cublas13])),
    ]


def _image_check(tmp_path: Path, layers: list[list[Entry]], env: list[str], *args: str, capsys) -> dict:
    out = build_image(tmp_path / "img", layers, env=["PATH=/usr/local/bin:/opt/app/bin:/usr/bin:/bin", *env])
    capsys.readouterr()
    assert main(["image", str(out), "--json", *args]) == 1
    doc: dict = validate(json.loads(capsys.readouterr().out), CHECK_SCHEMA)
    return doc


def _step(doc: dict, check: str, word: str) -> dict:
    """The plan step carrying the error of ``check`` whose message has ``word``."""
    (error,) = [f["id"] for fs in doc["items"].values() for f in fs if f["check"] == check and word in f["message"]]
    return next(s for plan in doc["repair"] for s in plan["steps"] if error in s["resolves"])


@pytest.fixture
def image_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("CUDASTACK")] + ["LD_LIBRARY_PATH"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.usefixtures("image_env")
def test_an_images_errors_are_carried_by_a_plan_named_for_the_image(tmp_path: Path, capsys):
    """`cudastack image`: the container item's errors (the runtime's CUDA requirement, a stub libcuda in an
    ld.so.conf directory, a baked driver library, capabilities without compute), the scan's and the driver's,
    each carried by a typed step of a plan for the image, not for "this machine"."""
    stubs = build_lib(tmp_path / "stubs" / "libcuda.so", soname="libcuda.so.1")
    top = [
        Entry("usr/local/cuda/lib64/stubs/libcuda.so", data=stubs),
        Entry("etc/ld.so.conf.d/zz-stubs.conf", data=b"/usr/local/cuda/lib64/stubs\n"),
        Entry("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.104.05", data=b"\x7fELF-not-really"),
    ]
    env = ["NVIDIA_REQUIRE_CUDA=cuda>=12.9", "NVIDIA_DRIVER_CAPABILITIES=utility"]
    doc = _image_check(tmp_path, [_image_base(tmp_path), top], env, "--cuda-driver=550.54.15", capsys=capsys)
    assert_carried(doc)
    checks = {f["check"] for fs in doc["items"].values() for f in fs if f["severity"] == "error"}
    assert checks >= {"container", "scan", "driver"}
    assert {p["environment"] for p in doc["repair"]} == {"the image example.com/app:1"}
    stub = _step(doc, "container", "stub")["action"]
    assert (stub["kind"], stub["directory"], stub["path"], stub["op"]) == (
        "search-path",
        "/usr/local/cuda/lib64/stubs",
        "ld.so.conf",
        "remove",
    )
    assert _step(doc, "container", "unsatisfied condition")["action"]["kind"] == "driver"
    assert _step(doc, "container", "leaves out compute")["action"]["kind"] == "env"
    text_out = build_image(tmp_path / "img2", [_image_base(tmp_path / "b"), top], env=["PATH=/usr/bin", *env])
    assert main(["image", str(text_out), "--cuda-driver=550.54.15"]) == 1
    text = capsys.readouterr().out
    assert "repair plan for the image example.com/app:1:" in text
    assert "this machine" not in text


@pytest.mark.usefixtures("image_env")
def test_a_compat_libcuda_on_the_images_search_path_is_removed_from_it(tmp_path: Path, capsys):
    compat = build_lib(tmp_path / "compat" / "libcuda.so.575.57.08", soname="libcuda.so.1")
    top = [
        Entry("usr/local/cuda/compat/libcuda.so.575.57.08", data=compat),
        Entry("usr/local/cuda/compat/libcuda.so.1", "symlink", target="libcuda.so.575.57.08"),
    ]
    env = ["LD_LIBRARY_PATH=/usr/local/cuda/compat"]
    doc = _image_check(
        tmp_path, [_image_base(tmp_path), top], env, "--cuda-driver=580.65.06", "--cuda-arch=sm_90", capsys=capsys
    )
    assert_carried(doc)
    action = _step(doc, "container", "compat libcuda")["action"]
    assert (action["kind"], action["directory"], action["path"]) == (
        "search-path",
        "/usr/local/cuda/compat",
        "LD_LIBRARY_PATH",
    )


def test_a_driver_library_mismatch_is_carried_by_a_structured_manual_step(tmp_path: Path):
    """The driver item's kernel-module / user-space mismatch (a fleet node upgraded without a reboot): its
    plan step is the manual remedy, step by step (reboot; or the user-space driver of the module)."""
    info = probed(fake_root(tmp_path, sys_version="570.124.06"), "580.95.05", "580.95.05")
    site = site_packages(tmp_path / "venv")
    stack = Stack(Settings(cudastack=True), driver_info=info, site_paths=(str(site),), rootdir=str(tmp_path))
    found = [f for fs in stack.run_checks().values() for f in fs]
    (error,) = [f for f in found if f.failing]
    assert error.check == "driver"
    plans = plan_repairs(found, stack.inventory, machine=stack.environment)
    (plan,) = plans
    assert plan.environment == "this machine"
    (step,) = plan.steps
    assert step.kind == "manual"
    assert step.resolves == (error.id,)
    assert step.action.to_json()["steps"][0].startswith("reboot")
    assert "570.124.06" in step.action.to_json()["steps"][1]


@pytest.mark.parametrize(
    ("name", "what"),
    [("symbols_unbound_reference", "foo_new"), ("symbols_missing_version_node", "version `FOO_2'")],
)
def test_an_unbound_reference_names_the_wheel_that_ships_the_library(tmp_path, monkeypatch, capsys, name, what):
    """Not "install a libfoo.so.1 that defines them": the wheel whose library lacks it (foo), what it lacks, and
    the other way out, the needing wheel (app) built against the installed one."""
    doc = check_json(tmp_path, STATES[name], monkeypatch, capsys)
    (error,) = [f["id"] for f in doc["items"]["symbols"] if f["severity"] == "error"]
    steps = [s["action"] for plan in doc["repair"] for s in plan["steps"] if error in s["resolves"]]
    assert [a["kind"] for a in steps] == ["manual", "use-build"]
    assert steps[0]["steps"][0].startswith(f"install the release of foo whose libfoo.so.1 defines {what}: ")
    assert "foo 1.0 is installed" in steps[0]["steps"][0]
    assert (steps[1]["package"], steps[1]["build"]) == ("app", "a release built against foo 1.0")


@pytest.mark.usefixtures("image_env")
def test_an_images_pip_steps_are_steps_of_its_build_named_by_its_paths(tmp_path: Path, capsys):
    """A wheel of the image's Python lost a RECORD-listed library: the plan names the environment by its path
    in the image, and its pip command is a RUN step of the image's build in the image's interpreter, never a
    command run here (nor a path of the directory the image was unpacked in)."""
    site = site_packages(tmp_path / "prefix")
    write_dist(site, "nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2")})
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    prefix = "usr/local/lib/python3.11/site-packages"
    python = [
        Entry("usr/local/bin/python3.11", data=build_exe(tmp_path / "python3.11")),
        Entry("usr/local/bin/python3", "symlink", target="python3.11"),
        Entry("usr/local/bin/python", "symlink", target="python3.11"),
        *(Entry(f"{prefix}/{p.relative_to(site)}", data=p) for p in sorted(site.rglob("*")) if p.is_file()),
    ]
    doc = _image_check(tmp_path, [_image_base(tmp_path), python], [], "--cuda-driver=580.65.06", capsys=capsys)
    assert_carried(doc)
    (plan,) = [p for p in doc["repair"] if p["environment"] != "the image example.com/app:1"]
    assert plan["environment"] == "/usr/local in the image example.com/app:1"
    assert plan["command"] == ""  # nothing to run here
    (step,) = [s for s in plan["steps"] if "integrity: nvidia-nccl-cu13 2.30.7" in " ".join(s["resolves"])]
    assert step["kind"] == "manual"
    assert step["action"]["steps"] == [
        "RUN /usr/local/bin/python -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7"
    ]
    assert str(tmp_path) not in json.dumps(doc["repair"])
    (finding,) = doc["items"]["integrity"]  # its own remedy too: the image's interpreter, by its image path
    assert finding["remedies"][0]["python"] == "/usr/local/bin/python"


def test_a_drift_from_the_baseline_names_the_recorded_version(tmp_path, monkeypatch, capsys):
    doc = check_json(tmp_path, baseline_drift, monkeypatch, capsys)
    (step,) = [s for plan in doc["repair"] for s in plan["steps"]]
    assert step["action"]["steps"] == [
        "install nvidia-nccl-cu12 2.27.3 (recorded; 2.28.9 now)",
        f"or re-record it: pytest --cudastack-snapshot={tmp_path / 'base.json'}",
    ]
