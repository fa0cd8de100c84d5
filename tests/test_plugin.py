"""End-to-end tests of the pytest layer with pytester: markers, options, ini, items, header, JUnit, xdist."""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc
from tests.helpers.sitebuild import HAVE_CC, compile_so, write_dist


@pytest.fixture
def pt(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> pytest.Pytester:
    """pytester isolated from installed plugins and from the caller's cudastack environment."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cudastack-cache"))
    return pytester


def run(pt: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pt.runpytest("-p", "pytest_cudastack.plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


# -- markers ------------------------------------------------------------------------------------------


def test_markers_registered_with_signature_and_example(pt):
    result = run(pt, "--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.requires_soname(*sonames): *Example: @pytest.mark.requires_soname('libcudnn.so.9')",
            "@pytest.mark.requires_wheel(*requirements): *",
            "@pytest.mark.requires_driver(spec): *",
            "@pytest.mark.requires_cuda(spec): *",
            "@pytest.mark.requires_gpu(count=1, arch=None, memory=None): *",
        ]
    )


SONAME_TESTS = """
    import pytest

    @pytest.mark.requires_soname("libc.so.6")
    def test_found():
        pass

    @pytest.mark.requires_soname("libc.so.6", "libnowhere-cudastack.so.7")
    def test_missing():
        pass
"""


def test_requires_soname_fails_by_default_naming_where_it_looked(pt):
    pt.makepyfile(SONAME_TESTS)
    result = run(pt, "--strict-markers")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*requires_soname('libc.so.6', 'libnowhere-cudastack.so.7') unmet: libnowhere-cudastack.so.7 not found "
            "by the dynamic linker (looked in: *libnowhere-cudastack.so.7*); no installed wheel ships it*"
        ]
    )
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize(
    ("how", "args", "ini"),
    [
        pytest.param("option", ["--cudastack-unmet=skip"], None, id="option"),
        pytest.param("ini", [], "cudastack_unmet = skip", id="ini"),
        pytest.param("env", [], None, id="env CUDASTACK_UNMET"),
    ],
)
def test_requires_soname_skips_with_unmet_skip(pt, monkeypatch, how, args, ini):
    pt.makepyfile(SONAME_TESTS)
    if ini:
        pt.makeini(f"[pytest]\n{ini}\n")
    if how == "env":
        monkeypatch.setenv("CUDASTACK_UNMET", "skip")
    result = run(pt, "-rs", *args)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*cudastack: requires_soname(*libnowhere-cudastack.so.7 not found*"])


def test_unmet_option_beats_ini(pt):
    pt.makepyfile(SONAME_TESTS)
    pt.makeini("[pytest]\ncudastack_unmet = skip\n")
    run(pt, "--cudastack-unmet=fail").assert_outcomes(passed=1, failed=1)


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_requires_soname_shipped_by_wheel_and_claimed_but_missing(pt):
    site = pt.mkdir("site")
    write_dist(
        site, "nvidia-fake-cu12", "12.9.79", {"nvidia/fake/lib/libfakecuda.so.12": compile_so("libfakecuda.so.12")}
    )
    write_dist(
        site,
        "nvidia-gone-cu12",
        "9.1.0",
        {"nvidia/gone/lib/libgonecuda.so.9": compile_so("libgonecuda.so.9")},
        write_files=False,
    )
    pt.syspathinsert(site)
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_soname("libfakecuda.so.12")
        def test_shipped():
            pass

        @pytest.mark.requires_soname("libgonecuda.so.9")
        def test_gone():
            pass
        """
    )
    result = run(pt)
    result.assert_outcomes(passed=1, failed=1)
    # a long reason is wrapped: one part ("; ") a line
    result.stdout.fnmatch_lines(
        [
            "*libgonecuda.so.9 not found*",
            "*nvidia-gone-cu12 9.1.0 claims it at*",
            "*libgonecuda.so.9*",
            "*but the file is missing",
        ]
    )


def test_requires_wheel(pt):
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_wheel("pytest>=8")
        def test_met():
            pass

        @pytest.mark.requires_wheel("pytest<1")
        def test_version():
            pass

        @pytest.mark.requires_wheel("nvidia-nothere-cu12>=9")
        def test_absent():
            pass

        @pytest.mark.requires_wheel("pytest<1; python_version < '3'")
        def test_marker_not_applicable():
            pass
        """
    )
    result = run(pt)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*requires_wheel('pytest<1') unmet: pytest<1: installed pytest 9* does not satisfy <1*",
            "*requires_wheel('nvidia-nothere-cu12>=9') unmet: *no distribution 'nvidia-nothere-cu12' installed*",
        ],
        consecutive=False,
    )


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_requires_wheel_not_intact(pt):
    site = pt.mkdir("site")
    write_dist(
        site,
        "nvidia-cudnn-cu12",
        "9.19.0.56",
        {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9")},
        write_files=False,
    )
    pt.syspathinsert(site)
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_wheel("nvidia-cudnn-cu12>=9")
        def test_cudnn():
            pass
        """
    )
    result = run(pt)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*nvidia-cudnn-cu12 9.19.0.56 is installed but not intact: *libcudnn.so.9*missing*"])


DRIVER_TESTS = """
    import pytest

    @pytest.mark.requires_driver(">=550")
    def test_driver_met():
        pass

    @pytest.mark.requires_driver(">=580")
    def test_driver_unmet():
        pass

    @pytest.mark.requires_cuda(">=12.4")
    def test_cuda_met():
        pass

    @pytest.mark.requires_cuda(">=13.0")
    def test_cuda_unmet():
        pass

    @pytest.mark.requires_gpu(arch=">=8.0")
    def test_gpu_met():
        pass

    @pytest.mark.requires_gpu(1, arch="sm_100")
    def test_gpu_unmet():
        pass
"""


def test_driver_cuda_gpu_markers_against_declared_driver(pt):
    pt.makepyfile(DRIVER_TESTS)
    result = run(pt, "--cuda-driver=550.54.15", "--cuda-arch=sm_90", "-rs")
    result.assert_outcomes(passed=3, failed=3, skipped=2)  # the driver and arch items: nothing to judge here
    result.stdout.fnmatch_lines(
        [
            "*requires_driver('>=580') unmet: driver 550.54.15 (declared); requires >=580*",
            "*requires_cuda('>=13.0') unmet: driver 550.54.15 (declared) supports CUDA <= 12.4; requires >=13.0*",
            "*requires_gpu(count=1, arch='sm_100') unmet: declared archs sm_90*requires 1 GPU, arch sm_100*",
        ],
        consecutive=False,
    )


def test_driver_markers_from_ini(pt):
    pt.makepyfile(DRIVER_TESTS)
    pt.makeini("[pytest]\ncuda_driver = 580.65.06\ncuda_arch = sm_100\n")
    run(pt).assert_outcomes(passed=6, skipped=2)  # driver 580 supports CUDA 13.0; sm_100 matches both arch markers


def test_driver_hook_fakes_the_probe(pt):
    pt.makeconftest(
        """
        from pytest_cudastack.cuda.driver import DriverInfo, Gpu

        def pytest_cudastack_driver(config):
            gpus = tuple(Gpu(i, "NVIDIA H100", None, "9.0", 80 * 2**30, None) for i in range(2))
            return DriverInfo("probed", "570.86.10", "12.8", gpus, ("sm_90",), "probed")
        """
    )
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_gpu(2, arch=">=9.0", memory="40GiB")
        def test_two():
            pass

        @pytest.mark.requires_gpu(4)
        def test_four():
            pass

        def test_fixture(cuda_driver):
            assert cuda_driver.version == "570.86.10"
            assert len(cuda_driver.gpus) == 2
        """
    )
    result = run(pt)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*requires_gpu(count=4) unmet: 2 of 2 GPUs*requires 4 GPUs*"])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        pytest.param("requires_soname()", "requires_soname: needs at least one soname*", id="soname no args"),
        pytest.param("requires_soname('/usr/lib/libc.so.6')", "*not a soname*", id="soname path"),
        pytest.param("requires_wheel('torch>>2')", "*invalid PEP 508 requirement*", id="wheel bad"),
        pytest.param("requires_driver()", "*requires_driver: takes exactly one specifier*", id="driver no args"),
        pytest.param("requires_cuda('>=twelve')", "*invalid CUDA version specifier*", id="cuda bad spec"),
        pytest.param("requires_gpu(memory='lots')", "*invalid memory 'lots'*", id="gpu bad memory"),
        pytest.param("requires_gpu(colour='green')", "*requires_gpu: signature is*", id="gpu bad kwarg"),
    ],
)
def test_marker_misuse_fails_that_test_only(pt, marker, message):
    pt.makepyfile(
        f"""
        import pytest

        @pytest.mark.{marker}
        def test_misused():
            pass

        def test_other():
            pass
        """
    )
    result = run(pt)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"cudastack: *{message.lstrip('*')}"])
    assert "During handling" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_markers_importable_from_package(pt):
    pt.makepyfile(
        """
        from pytest_cudastack import requires_soname

        @requires_soname("libnowhere-cudastack.so.1")
        def test_x():
            pass
        """
    )
    run(pt, "--strict-markers").assert_outcomes(failed=1)


def test_strict_markers_and_disabled_plugin(pt, monkeypatch):
    pt.makepyfile(SONAME_TESTS)
    run(pt, "--strict-markers").assert_outcomes(passed=1, failed=1)
    # with the plugin disabled by name, its markers are unknown: --strict-markers reports that
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    # (in a subprocess: in-process runs share pytest.mark's cache of known marker names)
    result = pt.runpytest_subprocess("-p", "no:cudastack", "--strict-markers", "-p", "no:xdist")
    result.stdout.fnmatch_lines(["*'requires_soname' not found in `markers` configuration option*"])
    result = pt.runpytest_subprocess("-p", "no:cudastack", "-p", "no:xdist", "--co", "-q", "--cuda-max=12.9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


# -- options and ini ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "ini", "env", "named"),
    [
        pytest.param(["--cuda-max=twelve"], None, None, "--cuda-max", id="cuda-max"),
        pytest.param(["--cuda-min=1.2.3"], None, None, "--cuda-min", id="cuda-min"),
        pytest.param(["--cuda-driver=latest"], None, None, "--cuda-driver", id="cuda-driver"),
        pytest.param(["--cuda-arch=hopper"], None, None, "--cuda-arch", id="cuda-arch"),
        pytest.param(["--cudastack-unmet=maybe"], None, None, "--cudastack-unmet", id="unmet"),
        pytest.param([], "cuda_max = twelve", None, "--cuda-max (from ini)", id="ini cuda_max"),
        pytest.param([], "cuda_arch = hopper", None, "--cuda-arch (from ini)", id="ini cuda_arch"),
        pytest.param([], "cudastack_unmet = maybe", None, "--cudastack-unmet (from ini)", id="ini unmet"),
        pytest.param([], None, ("CUDASTACK_CUDA_MAX", "x"), "--cuda-max (from CUDASTACK_CUDA_MAX)", id="env"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(pt, monkeypatch, args, ini, env, named):
    pt.makepyfile("def test_x(): pass")
    if ini:
        pt.makeini(f"[pytest]\n{ini}\n")
    if env:
        monkeypatch.setenv(*env)
    result = run(pt, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert named in result.stderr.str()


def test_cli_beats_env_beats_ini(pt, monkeypatch):
    pt.makepyfile(
        """
        def test_settings(cuda_stack):
            s = cuda_stack.settings
            print("SETTINGS", s.cuda_max, s.source("cuda_max"), s.cuda_min, s.source("cuda_min"), s.cuda_driver)
        """
    )
    pt.makeini("[pytest]\ncuda_max = 12.4\ncuda_min = 11.8\ncuda_driver = 550\n")
    monkeypatch.setenv("CUDASTACK_CUDA_MIN", "12.0")
    result = run(pt, "-s", "--cuda-max=12.9", "-k", "test_settings")
    result.stdout.fnmatch_lines(["*SETTINGS 12.9 command line 12.0 CUDASTACK_CUDA_MIN 550"])


def test_help_lists_group_and_ini(pt):
    result = run(pt, "--help")
    result.stdout.fnmatch_lines(
        [
            "pytest-cudastack:",
            "*--cudastack *run all built-in CUDA stack invariant items*",
            "*--cuda-max=VER*",
        ]
    )
    for name in ("cuda_max (string)", "cudastack_scan (linelist)", "cudastack (bool)", "cudastack_baseline"):
        assert name in result.stdout.str()


# -- generated items ----------------------------------------------------------------------------------


def test_no_items_and_no_header_when_unused(pt):
    pt.makeconftest(
        """
        def pytest_cudastack_driver(config):
            raise AssertionError("probed although unused")
        """
    )
    pt.makepyfile("def test_x(): pass")
    for args in ([], ["-v"]):
        result = run(pt, *args)
        result.assert_outcomes(passed=1)
        assert not [line for line in result.outlines if line.startswith("cudastack")]
    pt.makeconftest("")
    run(pt, "-vv").stdout.fnmatch_lines(["cudastack: driver*"])  # asked for all the detail


def test_cudastack_items_collected_with_readable_ids(pt):
    pt.makepyfile("def test_x(): pass")
    result = run(pt, "--cudastack", "--cuda-max=13.0", "--cuda-min=12.0", "--co", "-q")
    result.stdout.fnmatch_lines(
        [
            "cudastack::integrity",
            "cudastack::closure",
            "cudastack::symbols",
            "cudastack::cuda-max",
            "cudastack::cuda-min",
            "cudastack::driver",
            "cudastack::arch",
            "test_*.py::test_x",
        ]
    )


def test_items_pass_on_this_environment_and_k_selects(pt):
    pt.makepyfile("def test_x(): pass")
    result = run(pt, "--cudastack", "--cuda-driver=580.65.06", "-v")
    result.assert_outcomes(
        passed=6, skipped=3
    )  # integrity, closure, dlopen, symbols, requirements, the test; driver, arch, toolchain skip
    result = run(pt, "--cudastack", "--cuda-max=13.0", "-k", "cuda-max", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["cudastack::cuda-max PASSED*"])


def test_ini_cudastack_bool_turns_items_on(pt):
    pt.makepyfile("def test_x(): pass")
    pt.makeini("[pytest]\ncudastack = true\n")
    result = run(pt, "--co", "-q")
    result.stdout.fnmatch_lines(["cudastack::integrity"])


@needs_cc
def test_header_one_line_and_verbose(pt):
    # a declared driver keeps the probed GPUs: none probed, whatever this host has
    pt.makeconftest(
        "from pytest_cudastack.cuda.driver import DriverInfo\n"
        "def pytest_cudastack_driver(config):\n"
        "    return DriverInfo('absent', None, None, reason='no NVML here')\n"
    )
    pt.makepyfile("def test_x(): pass")
    result = run(pt, "--cuda-driver=550.54.15", "--cuda-max=12.9")
    result.stdout.fnmatch_lines(
        ["cudastack: driver 550.54.15 (declared) | CUDA <= 12.4 | GPUs: none | * CUDA wheels* | --cuda-max=12.9"]
    )
    result = run(pt, "--cuda-driver=550.54.15", "--cuda-arch=sm_80,sm_90", "-v")
    result.stdout.fnmatch_lines(["cudastack: driver 550.54.15 (declared) | CUDA <= 12.4 | GPUs: archs sm_80,sm_90 *"])


def test_junit_properties(pt):
    pt.makepyfile("def test_x(): pass")
    run(pt, "--cudastack", "--cuda-driver=550.54.15", "--cuda-arch=sm_90", "--junitxml=out.xml")
    root = ET.parse(pt.path / "out.xml").getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["cudastack.driver"] == "550.54.15 (declared)"
    assert props["cudastack.cuda"] == "12.4"
    assert props["cudastack.gpus"] == "archs sm_90"
    names = {tc.get("name") for tc in root.iter("testcase")}
    assert {"integrity", "closure", "driver", "arch", "test_x"} <= names


@needs_cc
@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
def test_junit_testcase_carries_warnings(seed, family):
    # train_tft needs CUDA 13.x: within --cuda-max=13.0 or not cannot be told (13.1 exists): a warning
    seed.runpytest(
        "-p", "pytest_cudastack.plugin", "--cuda-max=13.0", "--cudastack-scan=bin", "--junitxml=o.xml",
        "-o", f"junit_family={family}",
    )  # fmt: skip
    root = ET.parse(seed.path / "o.xml").getroot()
    case = next(tc for tc in root.iter("testcase") if tc.get("name") == "cuda-max")
    warning = "bin/train_tft: require CUDA 13.x: cannot tell whether"
    assert case.findtext("system-out", "").startswith(f"[warning] {warning}")
    props = list(case.iter("property"))
    if family == "xunit1":  # xunit2's testcase has no properties
        (prop,) = props
        assert prop.get("name") == "cudastack.finding"
        assert prop.get("value", "").startswith(f"warning: {warning}")
    else:
        assert props == []


def _junit(path: Path) -> tuple[ET.Element, dict[str, ET.Element]]:
    """The suite and its testcases by name, read as CI tools read a JUnit file."""
    (suite,) = ET.parse(path).getroot().iter("testsuite")
    return suite, {f"{tc.get('classname')}::{tc.get('name')}": tc for tc in suite.iter("testcase")}


@needs_cc
@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="xunit2"),
        pytest.param(["-o", "junit_family=xunit1"], id="xunit1"),
        pytest.param(["-o", "junit_family=legacy"], id="legacy"),
        pytest.param(["-p", "xdist.plugin", "-n", "2"], id="xdist"),
        pytest.param(["-o", "junit_logging=all"], id="captured-output-too"),
    ],
)
def test_junit_failure_message_and_system_out_carry_the_findings(seed, args):
    result = seed.runpytest(
        "-p", "pytest_cudastack.plugin", "-W", "error::pytest.PytestWarning", "--junitxml=o.xml",
        "--cuda-max=12.9", "--cudastack-scan=bin", *args,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "PytestWarning" not in result.stdout.str()
    suite, cases = _junit(seed.path / "o.xml")
    error = "bin/train_tft: links libcublas.so.13 (CUDA 13.x) but --cuda-max=12.9"
    failure = cases["cudastack::cuda-max"].find("failure")
    assert failure is not None
    assert failure.get("message") == error  # the error itself, not the short summary's "1 error: bin/train_tft"
    assert f"[error] {error}" in (failure.text or "")
    out = cases["cudastack::cuda-max"].findall("system-out")
    assert len(out) == 1  # one element, after any captured output
    assert f"[error] {error}\n" in (out[0].text or "")
    assert "fix: rebuild bin/train_tft with a CUDA 12.9 toolkit" in (out[0].text or "")
    if "junit_logging=all" not in args:  # (pytest's captured output goes to every testcase's)
        assert cases["cudastack::scan[bin/train_tft]"].find("system-out") is None  # nothing found, nothing said
    plan = suite.findtext("system-out", "")
    assert plan.startswith("cudastack repair plan\nrepair plan for ")
    assert "1. [by hand] rebuild bin/train_tft with a CUDA 12.9 toolkit" in plan


def test_junit_quiet_when_clean(pt):
    pt.makepyfile("def test_x(): pass")
    run(pt, "--cuda-max=13.0", "--junitxml=o.xml").assert_outcomes(passed=2)
    suite, cases = _junit(pt.path / "o.xml")
    assert suite.find("system-out") is None
    assert all(tc.find("system-out") is None for tc in cases.values())


# -- the seed scenario with gcc-built stubs --------------------------------------------------------


@pytest.fixture
def seed(pt: pytest.Pytester) -> pytest.Pytester:
    """bin/train_tft links libcublas.so.13 (CUDA 13), bin/train_ppo links libcudart.so.12 (CUDA 12)."""
    lib = pt.path / "lib"
    cublas = build_lib(lib / "libcublas.so.13", soname="libcublas.so.13")
    cudart = build_lib(lib / "libcudart.so.12", soname="libcudart.so.12")
    build_exe(pt.path / "bin" / "train_tft", needed=[cublas], runpath="$ORIGIN/../lib")
    build_exe(pt.path / "bin" / "train_ppo", needed=[cudart], runpath="$ORIGIN/../lib")
    (pt.path / "bin" / "README").write_text("not a binary\n")
    pt.makepyfile("def test_x(): pass")
    return pt


@needs_cc
def test_seed_cuda_max_fails_on_cuda13_binary_only(seed):
    result = run(seed, "--cuda-max=12.9", "--cudastack-scan=bin", "-v")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "cudastack::cuda-max FAILED*",
            "cudastack::scan[[]bin/train_ppo] PASSED*",
            "cudastack::scan[[]bin/train_tft] PASSED*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(["*[[]error] bin/train_tft: links libcublas.so.13 (CUDA 13.x) but --cuda-max=12.9"])
    # a CUDA 12 binary is within 12.9: 12.9 is the last 12.x release (a closed series), so not even a warning
    assert "train_ppo:" not in result.stdout.str()


@needs_cc
def test_seed_cuda_max_13_passes_and_ini_scan(seed):
    seed.makepyprojecttoml('[tool.pytest.ini_options]\ncuda_max = "13.0"\ncudastack_scan = ["bin"]\n')
    result = run(seed, "-v")
    result.assert_outcomes(passed=4)


@needs_cc
def test_seed_cuda_min_fails_on_cuda12_binary(seed):
    result = run(seed, "--cuda-min=13.0", "--cudastack-scan=bin/train_ppo", "--cudastack-scan=bin/train_tft")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*bin/train_ppo: links libcudart.so.12 (CUDA 12.x) but --cuda-min=13.0*"])


@needs_cc
def test_seed_missing_library_reports_chain_and_places(seed):
    (seed.path / "lib" / "libcublas.so.13").unlink()
    result = run(seed, "--cudastack-scan=bin", "-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "cudastack::scan[[]bin/train_tft] FAILED*",
            "*[[]error] bin/train_tft: needs libcublas.so.13, which the dynamic linker does not find",
            "*needed by: */bin/train_tft",
            "*looked in: */test_seed_missing_library_reports_chain_and_places0/lib, /*",  # directories searched
        ],
        consecutive=False,
    )


@needs_cc
def test_seed_driver_item_against_declared_driver(seed):
    result = run(seed, "--cudastack", "--cudastack-scan=bin", "--cuda-driver=550.54.15", "-k", "driver and not test_x")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*bin/train_tft: CUDA 13 is required; driver 550.54.15 (declared)*CUDA 13 needs driver*580*"]
    )
    result = run(seed, "--cudastack", "--cudastack-scan=bin", "--cuda-driver=580.65.06", "-k", "driver and not test_x")
    result.assert_outcomes(passed=1)


def test_scan_path_that_does_not_exist_fails(pt):
    pt.makepyfile("def test_x(): pass")
    result = run(pt, "--cudastack-scan=nothere/train")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*nothere/train: no such file"])


@needs_cc
def test_xdist_runs_each_generated_item_once(seed):
    result = run(seed, "-p", "xdist.plugin", "-n", "2", "--cuda-max=12.9", "--cudastack-scan=bin", "--cuda-driver=550")
    result.assert_outcomes(passed=3, failed=2)  # cuda-max and driver: CUDA 13 on R550
    assert result.stdout.str().count("bin/train_tft: links libcublas.so.13") >= 1


def test_xdist_workers_get_controller_driver(pt):
    pt.makeconftest(
        """
        import os
        from pytest_cudastack.cuda.driver import DriverInfo

        def pytest_cudastack_driver(config):
            # only the controller may probe; workers must use what it sent
            assert not hasattr(config, "workerinput"), "worker probed the driver"
            return DriverInfo("probed", "570.1", "12.8")
        """
    )
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("i", range(4))
        def test_driver(cuda_driver, i):
            assert cuda_driver.version == "570.1"
        """
    )
    result = run(pt, "-p", "xdist.plugin", "-n", "2", "--cudastack")
    result.assert_outcomes(
        passed=9, skipped=3
    )  # 8 invariant items (driver, arch, toolchain: nothing to check) + 4 tests


# -- fixtures -----------------------------------------------------------------------------------------


def test_fixtures(pt):
    pt.makepyfile(
        """
        import json

        def test_libs(cuda_libs):
            lib = cuda_libs.resolve("libc.so.6")
            assert lib.path is not None and lib.route
            missing = cuda_libs.resolve("libnowhere-cudastack.so.3")
            assert missing.path is None and missing.tried

        def test_wheels(cuda_wheels):
            assert all(d.cuda_major is not None for d in cuda_wheels)
            assert cuda_wheels.get("pytest") is not None

        def test_stack(cuda_stack, cuda_driver):
            data = json.loads(json.dumps(cuda_stack.to_json()))
            assert data["driver"]["version"] == "550.54.15" == cuda_driver.version
        """
    )
    run(pt, "--cuda-driver=550.54.15").assert_outcomes(passed=3, skipped=1)  # the driver item: nothing to judge


def test_fixtures_documented(pt):
    result = run(pt, "--fixtures")
    result.stdout.fnmatch_lines(
        [
            "cuda_stack [[]session scope]*",
            "*The CUDA stack of this machine*",
            "cuda_driver [[]session scope]*",
            "cuda_libs [[]session scope]*",
            "cuda_wheels [[]session scope]*",
        ],
        consecutive=False,
    )


# -- snapshot, baseline, GitHub summary --------------------------------------------------------------


def test_snapshot_then_baseline_then_drift(pt):
    pt.makepyfile("def test_x(): pass")
    run(pt, "--cuda-driver=550.54.15", "--cudastack-snapshot=stack.json").assert_outcomes(passed=1, skipped=1)
    snap = json.loads((pt.path / "stack.json").read_text())
    assert snap["driver"]["version"] == "550.54.15"
    result = run(pt, "--cuda-driver=550.54.15", "--cudastack-baseline=stack.json")
    result.assert_outcomes(passed=2, skipped=1)
    result = run(pt, "--cuda-driver=580.65.06", "--cudastack-baseline=stack.json")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*drift from baseline: driver version: 550.54.15 -> 580.65.06*"])


def test_baseline_that_is_not_a_snapshot(pt):
    pt.makepyfile("def test_x(): pass")
    (pt.path / "bad.json").write_text("[]")
    result = run(pt, "--cudastack-baseline=bad.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # found before the run (issue #14): a usage error
    result.stderr.fnmatch_lines(["ERROR: --cudastack-baseline: *bad.json: not a cudastack snapshot*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_github_step_summary(pt, monkeypatch):
    summary = pt.path / "summary.md"
    summary.write_text("earlier\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pt.makepyfile("def test_x(): pass")
    run(pt, "--cudastack", "--cuda-driver=550.54.15")
    text = summary.read_text()
    assert text.startswith("earlier\n### cudastack")
    assert "| `cudastack::integrity` | passed |" in text


@needs_cc
def test_terminal_summary_lists_findings(seed):
    result = run(seed, "--cuda-max=13.0", "--cuda-min=13.0", "--cudastack-scan=bin")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*= cudastack =*",
            "cudastack::cuda-max (passed)",
            "  warning: bin/train_tft: require CUDA 13.x: cannot tell whether that is within --cuda-max=13.0",
            "      cause: *",
            "*bin/train_tft: links libcublas.so.13 (CUDA 13.x)",
        ]
    )
    out = result.stdout.str()
    # each finding once: the error in its item's failure, the warning in the section, never both
    assert out.count("bin/train_ppo: links libcudart.so.12 (CUDA 12.x) but --cuda-min=13.0") == 1
    assert out.count("bin/train_tft: require CUDA 13.x") == 1
    assert "cudastack::cuda-min (failed)" not in out  # an item with errors only has no entry in the section
    result.stdout.fnmatch_lines(["FAILED cudastack::cuda-min - 1 error: bin/train_ppo"])


@needs_cc
@pytest.mark.parametrize(
    ("args", "written"),
    [
        pytest.param([], True, id="cache written"),
        pytest.param(["--cudastack-no-cache"], False, id="--cudastack-no-cache"),
        # the scan items run on the workers, which read the binary but never write the cache
        pytest.param(["-p", "xdist.plugin", "-n", "2"], False, id="xdist workers never write"),
    ],
)
def test_elf_cache_writes(seed, monkeypatch, args, written):
    cache = seed.path / "elfcache"
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(cache))
    run(seed, "--cudastack-scan=bin", *args).assert_outcomes(passed=3)
    cache_file = cache / "elfcache-v1.json"
    entries = json.loads(cache_file.read_text())["entries"] if cache_file.exists() else {}
    assert (str(seed.path / "bin" / "train_tft") in entries) is written


PARSE_SPY = """
import os

from pytest_cudastack.linker import elf, resolver
from pytest_cudastack.wheels import inventory

_read_elf = elf.read_elf


def _spy(path):
    with open(os.environ["CUDASTACK_TEST_PARSED"], "a", encoding="utf-8") as f:
        f.write(path + "\\n")
    return _read_elf(path)


# every parse, cached or not: elfcache looks read_elf up on each miss, the others hold their own name
elf.read_elf = resolver.read_elf = inventory.read_elf = _spy
"""


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_cold_session_caches_every_file_it_parsed(pt, monkeypatch):
    """With the driver probe (no --cuda-driver) the probe's linker search reads through the session's cache:
    the file holds every ELF file the run parsed (the probe's own process-wide cache, flushed at exit, used to
    overwrite it with its one entry)."""
    site = pt.mkdir("site")
    lib = compile_so("libcudastackspy.so.1")
    ext = compile_so(None, needed=["libcudastackspy.so.1"], runpath="$ORIGIN/lib", pyinit="_spy")
    write_dist(site, "spy-wheel", "1.0", {"spy/lib/libcudastackspy.so.1": lib, "spy/_spy.so": ext})
    monkeypatch.setenv("PYTHONPATH", str(site))
    cache = pt.path / "cache"
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(cache))
    parsed_log = pt.path / "parsed.txt"
    monkeypatch.setenv("CUDASTACK_TEST_PARSED", str(parsed_log))
    pt.makeconftest(PARSE_SPY)
    pt.makepyfile("def test_x(): pass")
    result = pt.runpytest_subprocess("-p", "pytest_cudastack.plugin", "-p", "no:cacheprovider", "--cudastack")
    assert result.ret == 0, result.stdout.str()
    parsed = set(parsed_log.read_text().splitlines())
    assert {os.path.realpath(sys.executable), str(site / "spy" / "_spy.so")} <= parsed  # probe and closure
    entries = json.loads((cache / "elfcache-v1.json").read_text())["entries"]
    # strings: the dlopen check's scans; fatbin-: GPU code, read only where a GPU (its arch) is known
    assert {e for e in entries if not e.startswith(("strings:", "fatbin-"))} == parsed


def test_python_executable_is_elf():
    # the requires_soname search runs as the Python executable's DT_NEEDED
    assert Path(os.path.realpath(sys.executable)).read_bytes()[:4] == b"\x7fELF"


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_cuda_max_covers_wheels_and_their_extension_modules(pt):
    site = pt.mkdir("site")
    write_dist(site, "nvidia-cuda-runtime-cu12", "12.9.79", {"nvidia/cuda_runtime/lib/libcudart.so.12": b"x"})
    ext = compile_so(None, needed=["libcudart.so.13"], pyinit="_kernels")
    write_dist(site, "mykernels", "1.0", {"mykernels/_kernels.cpython-311-x86_64-linux-gnu.so": ext})
    pt.syspathinsert(site)
    result = run(pt, "--cuda-max=12.4", "-k", "cuda-max")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*[[]error] mykernels 1.0: mykernels/_kernels.cpython-311-x86_64-linux-gnu.so links libcudart.so.13 "
            "(CUDA 13.x) but --cuda-max=12.4",
            "*[[]error] nvidia-cuda-runtime-cu12 12.9.79: needs CUDA 12.9: name suffix -cu12 * but --cuda-max=12.4",
        ],
        consecutive=False,
    )
    run(pt, "--cuda-max=13.0", "-k", "cuda-max").assert_outcomes(passed=1)


@needs_cc
def test_the_plan_reaches_the_step_summary_and_junit(seed, monkeypatch):
    # a failing run: the numbered plan (its manual steps: the binary built for CUDA 12 must be rebuilt) in the
    # GitHub step summary and as JUnit global properties, not only the findings
    summary = seed.path / "summary.md"
    summary.write_text("")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = run(seed, "--cuda-min=13.0", "--cudastack-scan=bin", "--junitxml=o.xml")
    result.assert_outcomes(passed=3, failed=1)
    text = summary.read_text()
    assert "#### repair plan for `this machine`" in text
    assert "1. by hand: `rebuild bin/train_ppo with a CUDA 13.0 toolkit`" in text
    root = ET.parse(seed.path / "o.xml").getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["cudastack.repair.this machine.1"] == "[by hand] rebuild bin/train_ppo with a CUDA 13.0 toolkit"
    # and on the terminal: before the failures, the cause, the step; the failure points at it
    out = result.stdout.str()
    assert out.index("cudastack repair plan") < out.index("FAILURES")
    assert out.count("rebuild bin/train_ppo with a CUDA 13.0 toolkit") == 1


# -- a misspelt requires_* mark ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        pytest.param("requires_sonam", "requires_soname", id="deletion"),
        pytest.param("requires_sonames", "requires_soname", id="insertion"),
        pytest.param("require_wheels", "requires_wheel", id="two"),
        pytest.param("requires_drvier", "requires_driver", id="transposition"),
        pytest.param("requires_gpus", "requires_gpu", id="plural"),
        pytest.param("requires_cuda", None, id="ours"),
        pytest.param("requires_network", None, id="far"),
        pytest.param("slow", None, id="unrelated"),
    ],
)
def test_meant_marker(name, meant):
    from pytest_cudastack.plugin import meant_marker

    assert meant_marker(name, frozenset()) == meant


def test_misspelt_mark_is_a_collection_error_naming_the_one_meant(pt):
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_sonam("libcudnn.so.9")
        def test_typo():
            pass

        def test_other():
            pass
        """
    )
    result = run(pt, "-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(errors=1)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting test_misspelt_mark_is_a_collection_error_naming_the_one_meant.py*",
            "cudastack: *::test_typo: unknown marker 'requires_sonam': did you mean requires_soname?*",
        ]
    )


def test_misspelt_mark_on_a_class_or_module(pt):
    pt.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.requires_whel("nvidia-cudnn-cu12")

        class TestX:
            def test_a(self):
                pass

            def test_b(self):
                pass
        """
    )
    result = run(pt, "-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown marker 'requires_whel': did you mean requires_wheel?*"])
    # once for the module, not once per test it marks (the short summary repeats it whole where CI is set)
    errors = result.stdout.str().split("short test summary info")[0]
    assert errors.count("unknown marker 'requires_whel'") == 1


def test_a_registered_close_mark_is_the_users(pt):
    pt.makeini("[pytest]\nmarkers =\n    requires_gpus(n): my own marker\n")
    pt.makepyfile(
        """
        import pytest

        @pytest.mark.requires_gpus(2)
        def test_mine():
            pass
        """
    )
    result = run(pt, "--strict-markers")
    result.assert_outcomes(passed=1)
