"""The pytest front-end's output and selection (issue 9): quiet when green, each finding once, short facts,
selection like pytest, nothing-to-check items skipped, every option an ini key, marker reprs, colour."""

from __future__ import annotations

import json
import re

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc
from tests.helpers.sitebuild import HAVE_CC, compile_so, write_dist

NVML_MISSING = (
    "nvmlInit: the NVML library libnvidia-ml.so.1 was not found (no NVIDIA driver installed) "
    "(NVML_ERROR_LIBRARY_NOT_FOUND)"
)
NO_DRIVER_HOOK = f"""
from pytest_cudastack.cuda.driver import DriverInfo

def pytest_cudastack_driver(config):
    return DriverInfo("absent", None, None, reason={NVML_MISSING!r})
"""
DRIVER_HOOK = """
from pytest_cudastack.cuda.driver import DriverInfo

def pytest_cudastack_driver(config):
    return DriverInfo("probed", "580.65.06", "13.0")
"""
ANSI_RED, ANSI_YELLOW = "\x1b[31m", "\x1b[33m"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def pt(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> pytest.Pytester:
    """pytester isolated from installed plugins and the caller's cudastack environment; no NVML probe."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cudastack-cache"))
    return pytester


def run(pt: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pt.runpytest("-p", "pytest_cudastack.plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


@pytest.fixture
def seed(pt: pytest.Pytester) -> pytest.Pytester:
    """bin/train_tft links libcublas.so.13 (CUDA 13), bin/train_ppo links libcudart.so.12 (CUDA 12)."""
    lib = pt.path / "lib"
    cublas = build_lib(lib / "libcublas.so.13", soname="libcublas.so.13")
    cudart = build_lib(lib / "libcudart.so.12", soname="libcudart.so.12")
    build_exe(pt.path / "bin" / "train_tft", needed=[cublas], runpath="$ORIGIN/../lib")
    build_exe(pt.path / "bin" / "train_ppo", needed=[cudart], runpath="$ORIGIN/../lib")
    pt.makeconftest(DRIVER_HOOK)
    pt.makepyfile("def test_x(): pass")
    return pt


# -- 1. quiet when green, once when red ------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_green_run_adds_only_the_header_and_the_items_line(pt):
    # an optional plugin library of a wheel needs a soname absent here: an INFO of the closure item
    site = pt.mkdir("site")
    plug = compile_so("libcudastackplug.so.1", needed=["libcudastack-absent.so.7"])
    write_dist(site, "optplug", "1.0", {"optplug/plugins/libcudastackplug.so.1": plug})
    pt.syspathinsert(site)
    pt.makeconftest(DRIVER_HOOK)
    pt.makepyfile("def test_x(): pass")
    plain = run(pt, "-p", "no:cudastack")  # the plugin module loaded, no option: what "without" prints
    plain.assert_outcomes(passed=1)
    result = run(pt, "--cudastack")
    result.assert_outcomes(
        passed=6, skipped=3
    )  # integrity, closure, dlopen, symbols, requirements, the test; driver, arch, toolchain skip
    lines = result.stdout.lines
    assert len(lines) <= len(plain.stdout.lines) + 2, "\n".join(lines)  # the header, the items' progress line
    assert [line for line in lines if line.startswith("cudastack: ")] == [lines[2]]
    assert "= cudastack =" not in result.stdout.str()
    assert "optional librar" not in result.stdout.str()
    verbose = run(pt, "--cudastack", "-v")
    verbose.stdout.fnmatch_lines(["*= cudastack =*", "cudastack::closure (passed)", "  info: optplug 1.0: 1 optional*"])


@needs_cc
@pytest.mark.parametrize(("color", "escapes"), [("yes", True), ("no", False)])
def test_each_finding_once_errors_red_in_the_failure_warnings_yellow_in_the_section(seed, color, escapes):
    result = run(seed, "--cuda-max=13.0", "--cuda-min=13.0", "--cudastack-scan=bin", f"--color={color}")
    result.assert_outcomes(passed=4, failed=1)
    out = result.stdout.str()
    error = "bin/train_ppo: links libcudart.so.12 (CUDA 12.x) but --cuda-min=13.0"
    warning = "bin/train_tft: require CUDA 13.x: cannot tell whether that is within --cuda-max=13.0"
    assert out.count(error) == 1, out  # in the item's failure only
    assert out.count(warning) == 1, out  # in the cudastack section only
    assert out.index(error) < out.index("= FAILURES") + 400
    assert out.index(warning) > out.index(" cudastack ")
    assert (f"{ANSI_RED}[error] {error}" in out.replace("\x1b[1m", "")) is escapes
    assert (f"{ANSI_YELLOW}  warning: {warning}" in out) is escapes
    assert ("\x1b[" in out) is escapes
    # the short summary: pytest's one line per item, naming the errors' subjects, not their text again
    plain = [ANSI.sub("", line) for line in result.stdout.lines]
    summary = [line for line in plain if line.startswith("FAILED") and "cudastack::cuda-min" in line]
    assert len(summary) == 1
    assert summary[0].endswith("cudastack::cuda-min - 1 error: bin/train_ppo")


@needs_cc
def test_failure_below_v_is_compact_and_complete_with_v(pt):
    site = pt.mkdir("site")
    files = {f"nvidia/gone/lib/libgone{i}.so.1": b"x" for i in range(8)}
    write_dist(site, "nvidia-gone-cu12", "1.0", files, write_files=False)
    pt.syspathinsert(site)
    pt.makeconftest(DRIVER_HOOK)
    pt.makepyfile("def test_x(): pass")
    result = run(pt, "--cudastack", "-k", "integrity")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["  nvidia/gone/lib/libgone2.so.1", "  ... 5 more (-v or --json)"])
    assert "libgone7.so.1" not in result.stdout.str()
    verbose = run(pt, "--cudastack", "-k", "integrity", "-v")
    assert "  nvidia/gone/lib/libgone7.so.1" in verbose.stdout.lines


# -- 3. short facts --------------------------------------------------------------------------------------


@needs_cc
def test_header_is_one_line_in_120_columns_and_the_probe_story_at_v(seed):
    seed.makeconftest(NO_DRIVER_HOOK)
    args = ("--cudastack", "--cuda-max=12.9", "--cuda-min=12.0", "--cudastack-scan=bin", "--co")
    result = run(seed, *args)
    (header,) = [line for line in result.stdout.lines if line.startswith("cudastack:")]
    assert header.startswith("cudastack: driver none (no libnvidia-ml.so.1) | CUDA: unknown")
    assert "--cuda-max=12.9" in header
    assert len(header) <= 120, header
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" not in result.stdout.str()
    verbose = run(seed, *args, "-v")
    assert verbose.stdout.str().count("NVML_ERROR_LIBRARY_NOT_FOUND") == 1
    verbose.stdout.fnmatch_lines([f"  driver: {NVML_MISSING}"])


def test_header_drops_the_least_informative_parts_first(seed):
    seed.makeconftest(DRIVER_HOOK)
    result = run(seed, "--cuda-max=12.9", "--cuda-min=12.0", "--cudastack-scan=bin", "--cudastack-scan=lib", "--co")
    (header,) = [line for line in result.stdout.lines if line.startswith("cudastack:")]
    assert len(header) <= 120, header
    assert "GPUs: none" not in header
    assert "--cuda-max=12.9 | --cuda-min=12.0 | scan: " in header


def test_no_driver_named_in_a_few_words_in_every_marker_reason(pt):
    pt.makeconftest(NO_DRIVER_HOOK)
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_driver(">=550")
        def test_driver(): pass

        @pytest.mark.requires_cuda(">=12.4")
        def test_cuda(): pass

        @pytest.mark.requires_gpu
        def test_gpu(): pass
        """
    )
    result = run(pt)
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "cudastack: requires_driver('>=550') unmet: no driver (no libnvidia-ml.so.1); requires driver >=550",
            "cudastack: requires_cuda('>=12.4') unmet: no driver: CUDA version unknown (no libnvidia-ml.so.1)*",
            "cudastack: requires_gpu(count=1) unmet: no GPU (no libnvidia-ml.so.1); requires 1 GPU",
        ],
        consecutive=False,
    )
    assert "NVML_ERROR" not in result.stdout.str()


def test_long_marker_reason_wrapped_and_capped(pt):
    site = pt.mkdir("site")
    files = {f"nvidia/cudnn/lib/libcudnn_part{i}_with_a_long_name.so.9": b"x" for i in range(12)}
    write_dist(site, "nvidia-cudnn-cu12", "9.1.0", files, write_files=False)
    pt.syspathinsert(site)
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_wheel("nvidia-cudnn-cu12")
        def test_cudnn(): pass
        """
    )
    result = run(pt)
    result.assert_outcomes(failed=1)
    failure = result.stdout.str().split("_ test_cudnn _")[1].split("short test summary")[0]
    lines = failure.strip("_\n").splitlines()[:-1]
    assert lines[0] == "cudastack: requires_wheel('nvidia-cudnn-cu12') unmet:"
    assert all(len(line) <= 120 or len(line.split()) == 1 for line in lines), lines  # a path is not broken
    assert re.fullmatch(r"  \.\.\. \d+ more \(-v\)", lines[-1]), lines
    assert len(lines) <= 14, lines
    verbose = run(pt, "-v")
    assert "libcudnn_part11_with_a_long_name.so.9" in verbose.stdout.str()
    assert "more (-v)" not in verbose.stdout.str()


# -- 6. selection ----------------------------------------------------------------------------------------


@pytest.fixture
def ini_project(pt: pytest.Pytester) -> pytest.Pytester:
    pt.makeini("[pytest]\ncudastack = true\ncuda_max = 13.0\n")
    pt.makeconftest(DRIVER_HOOK)
    pt.makepyfile(test_a="def test_y(): pass\ndef test_z(): pass\n")
    return pt


@pytest.mark.parametrize(
    ("args", "items"),
    [
        pytest.param([], True, id="whole suite"),
        pytest.param(["."], True, id="a directory"),
        pytest.param(["test_a.py::test_y"], False, id="node ID"),
        pytest.param(["test_a.py"], False, id="a file"),
        pytest.param(["test_a.py::test_y", "--cudastack"], True, id="node ID + --cudastack"),
        pytest.param(["test_a.py::test_y", "--cuda-max=13.0"], True, id="node ID + --cuda-max"),
        pytest.param(["test_a.py", "--cudastack-unmet=skip"], True, id="file + --cudastack-unmet"),
    ],
)
def test_ini_driven_items_join_whole_suite_runs_only(ini_project, args, items):
    result = run(ini_project, "--co", "-q", *args)
    listed = [line for line in result.stdout.lines if "::" in line]
    assert ("cudastack::integrity" in listed) is items, listed
    assert ("cudastack::cuda-max" in listed) is items, listed
    if "test_a.py::test_y" in args:
        assert "test_a.py::test_z" not in listed


def test_node_id_runs_only_that_test(ini_project):
    result = run(ini_project, "test_a.py::test_y")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("conftest", "args", "skips"),
    [
        pytest.param(
            NO_DRIVER_HOOK,
            [],
            [
                "SKIPPED [1] cudastack::driver: no driver known: pass --cuda-driver=VER to check a deployment target",
                "SKIPPED [1] cudastack::arch: no GPU arch known: pass --cuda-arch=sm_XX",
                "SKIPPED [1] cudastack::toolchain: no framework that runs a CUDA compiler tool is installed "
                "(jax, triton, torch, cupy, numba-cuda; recognised by their files)",
            ],
            id="no driver",
        ),
        pytest.param(
            DRIVER_HOOK,
            ["--cuda-arch=sm_90"],
            [
                "SKIPPED [1] cudastack::driver: nothing in the stack names the CUDA version it requires",
                "SKIPPED [1] cudastack::arch: no GPU code in any installed library or scanned file",
            ],
            id="nothing requires CUDA, no GPU code",
        ),
    ],
)
def test_items_with_nothing_to_check_are_skipped_with_the_reason(pt, conftest, args, skips):
    pt.makeconftest(conftest)
    pt.makepyfile("def test_x(): pass")
    result = run(pt, "--cudastack", "-rs", "-v", *args)
    result.assert_outcomes(
        passed=6, skipped=3
    )  # integrity, closure, dlopen, symbols, requirements, the test; driver, arch, toolchain skip
    result.stdout.fnmatch_lines(["cudastack::driver SKIPPED*", "cudastack::arch SKIPPED*"], consecutive=False)
    result.stdout.fnmatch_lines(skips, consecutive=False)


@needs_cc
def test_arch_with_a_known_arch_but_no_gpu_code_anywhere_is_skipped(seed):
    # the seed's binaries are gcc-built host code: a known arch with no kernel to hold against it
    result = run(seed, "--cudastack", "--cuda-arch=sm_90", "--cudastack-scan=bin", "-rs", "-k", "arch and not test_x")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [1] cudastack::arch: no GPU code in any installed library or scanned file"])


def test_cudastack_check_prints_skip(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUDASTACK_SITE", raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    rc = main(["check", "--cudastack", "--cuda-driver=580.65.06", "--site", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "skip cudastack::driver: nothing in the stack names the CUDA version it requires" in out.splitlines()
    assert "skip cudastack::arch: no GPU arch known: pass --cuda-arch=sm_XX" in out.splitlines()
    assert "ok   cudastack::integrity" in out.splitlines()


# -- 7. ini keys, --no-cache, marker reprs ---------------------------------------------------------------


@needs_cc
@pytest.mark.parametrize(
    ("ini", "args"),
    [
        pytest.param("cudastack_no_cache = true\n", [], id="ini cudastack_no_cache"),
        pytest.param("", ["--no-cache"], id="--no-cache"),
        pytest.param("", ["--cudastack-no-cache"], id="--cudastack-no-cache"),
    ],
)
def test_no_cache_from_ini_and_the_alias(seed, monkeypatch, ini, args):
    cache = seed.path / "elfcache"
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(cache))
    seed.makeini("[pytest]\n" + ini)
    run(seed, "--cudastack-scan=bin", *args).assert_outcomes(passed=3)
    assert not (cache / "elfcache-v1.json").exists()
    run(seed, "--cudastack-scan=bin").assert_outcomes(passed=3)  # and without: written
    assert (cache / "elfcache-v1.json").exists() is not bool(ini)


def test_snapshot_from_ini_relative_to_the_ini_file(pt):
    pt.makeconftest(DRIVER_HOOK)
    pt.makeini("[pytest]\ncudastack_snapshot = stack.json\n")
    pt.makepyfile("def test_x(): pass")
    sub = pt.mkdir("sub")
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:
        m.chdir(sub)
        result = pt.runpytest("-p", "pytest_cudastack.plugin", str(pt.path))
    result.assert_outcomes(passed=1)
    assert not (sub / "stack.json").exists()
    snapshot = json.loads((pt.path / "stack.json").read_text())
    assert snapshot["driver"]["version"] == "580.65.06"


def test_marker_repr_in_output_reads_like_the_call(pt):
    pt.makeconftest(DRIVER_HOOK)
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_gpu(2, arch="sm_90", memory="40GiB")
        def test_gpu(): pass

        @pytest.mark.requires_soname("libcudastack-absent.so.9")
        def test_soname(): pass
        """
    )
    result = run(pt)
    out = result.stdout.str()
    assert "requires_gpu(count=2, arch='sm_90', memory='40GiB') unmet:" in out
    assert "requires_soname('libcudastack-absent.so.9') unmet:" in out
    assert not re.search(r"requires_gpu\(2, ", out)


def test_snapshot_into_a_missing_directory_is_created(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest(
        "--cudastack-snapshot=out/deep/stack.json", "--cuda-driver=550.54.15", "--cuda-arch=sm_80"
    )
    assert result.ret == 0
    assert (
        json.loads((pytester.path / "out" / "deep" / "stack.json").read_text())["schema"] == "pytest-cudastack/snapshot"
    )


def test_snapshot_that_cannot_be_written_is_one_line_not_internalerror(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    (pytester.path / "blocker").write_text("a file where a directory should be")
    result = pytester.runpytest(
        "--cudastack-snapshot=blocker/stack.json", "--cuda-driver=550.54.15", "--cuda-arch=sm_80"
    )
    assert "INTERNALERROR" not in result.stdout.str()
    # found before the run (issue #14): a usage error naming the option, not a lost snapshot at the end
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --cudastack-snapshot: *blocker/stack.json: *blocker is not a directory"])
