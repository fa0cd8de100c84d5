"""Every option, every route: a good value reaches the stack, a bad one is a usage error naming the option.

pytest: command line, environment variable and ini key, each a usage error (exit 4) before collection, with
one message and no traceback.  ``cudastack check``: the same options and environment, exit 2 with the same
message.  ``--cuda-driver=R580`` end to end: a declared driver of branch 580 whose minor is unknown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack.cli import build_parser, main
from pytest_cudastack.options import ini_types
from pytest_cudastack.settings import ENV, Settings
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc

# flag options: no value on the command line, a boolean in the environment / ini
FLAGS = {"cudastack", "cudastack_no_cache"}

# (option key, value, what Settings keeps)
GOOD: list[tuple[str, str, str]] = [
    ("cuda_max", "12.9", "12.9"),
    ("cuda_max", " 13 ", "13"),
    ("cuda_min", "11.8", "11.8"),
    ("cuda_driver", "550.54.15", "550.54.15"),
    ("cuda_driver", "570.26", "570.26"),
    ("cuda_driver", "580", "580"),
    ("cuda_driver", "R580", "580"),
    ("cuda_arch", "sm_90", "sm_90"),
    ("cuda_arch", "sm_90a", "sm_90a"),
    ("cuda_arch", "sm_100f", "sm_100f"),
    ("cuda_arch", "compute_80", "sm_80"),
    ("cuda_arch", "9.0", "sm_90"),
    ("cuda_arch", "sm_80,sm_90", "sm_80,sm_90"),
    ("cudastack_unmet", "skip", "skip"),
    ("cudastack", "yes", "True"),
    ("cudastack_no_cache", "1", "True"),
]

# (option key, value, what the message says after the option's name)
BAD: list[tuple[str, str, str]] = [
    ("cuda_max", "twelve", "invalid CUDA version 'twelve'"),
    ("cuda_max", "12.9.1", "invalid CUDA version '12.9.1' (expected MAJOR[.MINOR]"),
    ("cuda_max", "v12", "invalid CUDA version 'v12'"),
    ("cuda_min", "1.2.3", "invalid CUDA version '1.2.3'"),
    ("cuda_min", "12.", "invalid CUDA version '12.'"),
    ("cuda_driver", "latest", "invalid NVIDIA driver version 'latest'"),
    ("cuda_driver", "12.9.1", "invalid NVIDIA driver version '12.9.1'"),
    ("cuda_driver", "55", "invalid NVIDIA driver version '55'"),
    ("cuda_driver", "R580.65", "invalid NVIDIA driver version 'R580.65'"),
    ("cuda_arch", "hopper", "invalid GPU architecture 'hopper'"),
    ("cuda_arch", "sm_9", "invalid GPU architecture 'sm_9'"),
    ("cuda_arch", "sm_8", "invalid GPU architecture 'sm_8'"),
    ("cuda_arch", "sm_90b", "invalid GPU architecture 'sm_90b'"),
    ("cuda_arch", "sm_80,volta", "invalid GPU architecture 'volta'"),
    ("cuda_arch", ",", "invalid GPU architecture list ','"),
    ("cudastack_unmet", "maybe", "'maybe'"),
    ("cudastack", "maybe", "'maybe'"),  # pytest reads the "bool" ini type itself: "invalid truth value"
    ("cudastack_no_cache", "maybe", "invalid boolean 'maybe'"),
]


def _option(key: str) -> str:
    return "--" + key.replace("_", "-")


def _routes(key: str) -> list[str]:
    routes = [] if key in FLAGS else ["command line"]
    routes.append("environment")
    if key in ini_types():
        routes.append("ini")
    return routes


def _params(table: list[tuple[str, str, str]]) -> list[Any]:
    return [
        pytest.param(route, key, value, expected, id=f"{route}: {_option(key)}={value.strip()}")
        for key, value, expected in table
        for route in _routes(key)
    ]


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
    pytester.makeconftest(
        """
        from pytest_cudastack.cuda.driver import DriverInfo

        def pytest_cudastack_driver(config):
            return DriverInfo("absent", None, None, reason="not probed in this test")
        """
    )
    return pytester


def run(pt: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pt.runpytest("-p", "pytest_cudastack.plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def _set(pt: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, route: str, key: str, value: str) -> list[str]:
    """Give ``key`` the ``value`` by ``route``; the command-line arguments that takes."""
    if route == "environment":
        monkeypatch.setenv(ENV[key], value)
        return []
    if route == "ini":
        pt.makeini(f"[pytest]\n{key} = {value}\n")
        return []
    return [f"{_option(key)}={value}"]


USES_THE_STACK = """
    import pytest

    @pytest.mark.parametrize("key", [{key!r}])
    def test_value(cuda_stack, cuda_driver, key):
        print("VALUE", cuda_stack.settings.describe(key), "|", cuda_driver.summary(), "|", ",".join(cuda_driver.archs))
"""


@pytest.mark.parametrize(("route", "key", "value", "kept"), _params(GOOD))
def test_good_value_reaches_the_stack(pt, monkeypatch, route: str, key: str, value: str, kept: str):
    pt.makepyfile(USES_THE_STACK.format(key=key))
    args = _set(pt, monkeypatch, route, key, value)
    result = run(pt, "-s", "-p", "no:randomly", "-k", "test_value", *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    where = "" if route == "command line" else f" (from {'ini' if route == 'ini' else ENV[key]})"
    result.stdout.fnmatch_lines([f"*VALUE {_option(key)}={kept}{where} |*"])


@pytest.mark.parametrize(("route", "key", "value", "message"), _params(BAD))
def test_bad_value_is_a_usage_error_naming_the_option(pt, monkeypatch, route: str, key: str, value: str, message: str):
    pt.makepyfile("def test_never_collected(): pass")
    args = _set(pt, monkeypatch, route, key, value)
    result = run(pt, *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    named = _named(route, key)
    assert named in result.stderr.str()
    assert message in result.stderr.str().split(named, 1)[1].splitlines()[0]
    assert "Traceback" not in out
    assert "collected" not in out
    assert "test_never_collected" not in out


def _named(route: str, key: str) -> str:
    """How a route's message starts: argparse's "argument --x: ", resolve's "--x (from SOURCE): "."""
    if route == "command line":
        return f"argument {_option(key)}: "
    return f"{_option(key)} (from {'ini' if route == 'ini' else ENV[key]}): "


# cudastack check: the same options and environment ------------------------------------------------


def _cli_params(table: list[tuple[str, str, str]]) -> list[Any]:
    return [p for p in _params(table) if p.values[0] != "ini"]  # `cudastack check` reads no ini file


@pytest.mark.parametrize(("route", "key", "value", "kept"), _cli_params(GOOD))
def test_check_reads_the_good_value(monkeypatch, route: str, key: str, value: str, kept: str):
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    args = ["check"]
    if route == "environment":
        monkeypatch.setenv(ENV[key], value)
    else:
        args.append(f"{_option(key)}={value}")
    settings = Settings.from_namespace(build_parser(check_options=True).parse_args(args))
    expected = f"{_option(key)}={kept}"
    assert settings.describe(key) == (expected if route == "command line" else f"{expected} (from {ENV[key]})")


@pytest.mark.parametrize(("route", "key", "value", "message"), _cli_params(BAD))
def test_check_bad_value_exits_2_with_the_same_message(
    monkeypatch, capsys, tmp_path: Path, route: str, key: str, value: str, message: str
):
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    args = ["check", "--site", str(tmp_path)]
    if route == "environment":
        monkeypatch.setenv(ENV[key], value)
        assert main(args) == 2
    else:
        with pytest.raises(SystemExit) as exc:
            main([*args, f"{_option(key)}={value}"])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    named = _named(route, key)
    assert "cudastack check: error: " in err
    assert message in err.split(named, 1)[1].splitlines()[0]
    assert "Traceback" not in err


# --cuda-driver=R580 end to end ----------------------------------------------------------------------

R580_TESTS = """
    import pytest

    @pytest.mark.requires_driver(">=575")
    def test_older_branches_met():
        pass

    @pytest.mark.requires_driver("==580.*")
    def test_the_branch_met():
        pass

    @pytest.mark.requires_cuda(">=13.0")
    def test_cuda_of_the_branch_met():
        pass

    @pytest.mark.requires_driver(">=580.65")
    def test_a_minor_inside_the_branch_unknown():
        pass

    @pytest.mark.requires_driver(">=590")
    def test_newer_branch_unmet():
        pass

    def test_fixture(cuda_driver):
        assert (cuda_driver.source, cuda_driver.version, cuda_driver.cuda_version) == ("declared", "580", "13.0")
        assert any("minor version is unknown" in n for n in cuda_driver.notes)
"""


def test_r580_is_a_declared_driver_of_branch_580(pt):
    pt.makepyfile(R580_TESTS)
    result = run(pt, "--cuda-driver=R580", "-p", "no:randomly")
    result.assert_outcomes(passed=4, failed=2, skipped=1)  # the driver item: nothing to judge
    result.stdout.fnmatch_lines(
        [
            "*requires_driver('>=580.65') unmet: driver branch R580 (declared), minor version unknown: "
            "cannot tell whether it meets >=580.65*",
            "*requires_driver('>=590') unmet: driver branch R580 (declared); requires >=590*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(["cudastack: driver 580 (declared) | CUDA <= 13.0 |*"])


@needs_cc
@pytest.mark.parametrize(
    ("driver", "outcome", "line"),
    [
        pytest.param("R580", "passed", "*cudastack::driver PASSED*", id="R580 runs CUDA 13"),
        pytest.param(
            "R575", "failed", "*CUDA 13 is required; driver 575 (declared)*CUDA 13 needs driver ≥ 580*", id="R575"
        ),
    ],
)
def test_driver_item_with_a_declared_branch(pt, driver: str, outcome: str, line: str):
    lib = build_lib(pt.path / "lib" / "libcublas.so.13", soname="libcublas.so.13")
    build_exe(pt.path / "bin" / "train", needed=[lib], runpath="$ORIGIN/../lib")
    pt.makepyfile("def test_x(): pass")
    result = run(
        pt, "--cudastack", "--cudastack-scan=bin", f"--cuda-driver={driver}", "-k", "driver and not test_x", "-v"
    )
    result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines([line])


def test_check_with_r580(tmp_path: Path, monkeypatch, capsys):
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["check", "--site", str(tmp_path), "--cuda-driver=R580", "--cuda-arch=sm_100f", "--json"]) == 0
    assert '"integrity"' in capsys.readouterr().out
