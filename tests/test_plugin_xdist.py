"""Under xdist the findings travel with the reports: the controller builds its summary and repair plan from
them and runs no check (issue #18). Also: what an unused plugin imports, and what a used one does."""

from __future__ import annotations

import ast
import collections
import subprocess
import sys

import pytest

from pytest_cudastack.settings import ENV

# Every check's run, and a dummy check that fails with an error and a warning, append "ROLE CHECK TARGET"
# to $CUDASTACK_TEST_RUNS: ROLE is the xdist worker's id, or "controller" (each process loads this conftest).
COUNTING_CONFTEST = """
import dataclasses
import os

from pytest_cudastack import checks
from pytest_cudastack.checks import Check, registry
from pytest_cudastack.findings import Finding, Severity


def _dummy(stack, target):
    return (
        Finding("dummy", Severity.ERROR, "dummy-subject", "the dummy invariant is broken"),
        Finding("dummy", Severity.WARNING, "dummy-subject", "a dummy warning travels with its report"),
    )


def _counted(check):
    def run(stack, target):
        role = os.environ.get("PYTEST_XDIST_WORKER", "controller")
        with open(os.environ["CUDASTACK_TEST_RUNS"], "a", encoding="utf-8") as f:
            f.write(f"{role} {check.name} {target}\\n")
        return check.run(stack, target)

    return dataclasses.replace(check, run=run)


dummy = Check("dummy", "the dummy invariant holds", _dummy, lambda o: o.cudastack)
checks.CHECKS = registry(*(_counted(c) for c in (*checks.CHECKS.values(), dummy)))
"""


@pytest.fixture
def pt(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> pytest.Pytester:
    """pytester isolated from installed plugins and the caller's cudastack (and xdist worker) environment."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in (*ENV.values(), "GITHUB_STEP_SUMMARY", "PYTEST_XDIST_WORKER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cudastack-cache"))
    return pytester


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["-p", "xdist.plugin", "-n", "2"], id="-n 2"),
        pytest.param(["-p", "no:xdist"], id="-p no:xdist"),
    ],
)
def test_each_check_runs_once_and_never_on_the_controller(pt, monkeypatch, args: list[str]):
    runs = pt.path / "runs.txt"
    monkeypatch.setenv("CUDASTACK_TEST_RUNS", str(runs))
    pt.makeconftest(COUNTING_CONFTEST)
    pt.makepyfile("def test_x(): pass")
    # a subprocess: the conftest replaces the registry of the process it runs in
    result = pt.runpytest_subprocess(
        "-p", "pytest_cudastack.plugin", "-p", "no:cacheprovider", "--cudastack", "--cuda-driver=550.54.15",
        "--cuda-arch=sm_90", *args,
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out + result.stderr.str()
    lines = [line.split(" ", 1) for line in runs.read_text(encoding="utf-8").splitlines()]
    by_role = collections.Counter(role for role, _ in lines)
    per_check = collections.Counter(check for _, check in lines)
    assert "dummy None" in per_check
    assert set(per_check.values()) == {1}, per_check  # each check once in the whole run
    if "-n" in args:
        assert by_role["controller"] == 0, lines  # the summary and repair plan read the reports' findings
        assert set(by_role) <= {"gw0", "gw1"}
    # the dummy's data reached the end of the run: its warning in the cudastack section, its error in the failure
    result.stdout.fnmatch_lines(
        [
            "*= cudastack =*",
            "cudastack::dummy (failed)",
            "  warning: dummy-subject: a dummy warning travels with its report",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED cudastack::dummy - *dummy-subject*"])


def _modules_after(pt: pytest.Pytester, *args: str) -> set[str]:
    """The pytest_cudastack modules a pytest run in a fresh interpreter has imported when it ends."""
    code = (
        "import sys, pytest\n"
        f"pytest.main(['-q', '-p', 'pytest_cudastack.plugin', '-p', 'no:cacheprovider', *{list(args)!r}])\n"
        "print(sorted(m for m in sys.modules if m.startswith('pytest_cudastack')), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=pt.path, capture_output=True, text=True, check=True)
    return set(ast.literal_eval(done.stderr.strip().splitlines()[-1]))


def test_unused_plugin_imports_only_the_option_table(pt):
    pt.makepyfile("def test_x(): pass")
    assert _modules_after(pt) == {"pytest_cudastack", "pytest_cudastack.plugin", "pytest_cudastack.options"}


@pytest.mark.parametrize(
    ("source", "args"),
    [
        pytest.param("def test_x(): pass", ["--cudastack-unmet=skip"], id="an option"),
        pytest.param(
            "import pytest\n@pytest.mark.requires_driver('>=1')\ndef test_x(): pass", ["--cudastack-unmet=skip"],
            id="a marker",
        ),
        pytest.param("def test_x(cuda_stack): pass", [], id="a fixture"),
    ],
)  # fmt: skip
def test_first_active_use_imports_the_session(pt, source: str, args: list[str]):
    pt.makeconftest(
        "from pytest_cudastack.cuda.driver import DriverInfo\n\n"
        "def pytest_cudastack_driver(config):\n"
        "    return DriverInfo('absent', None, None, reason='not probed in this test')\n"
    )
    pt.makepyfile(source)
    assert "pytest_cudastack.session" in _modules_after(pt, *args)


def test_bad_ini_bool_is_still_a_usage_error(pt):
    # no option given anywhere else: the plugin still resolves (and names) a value pytest cannot read
    pt.makeini("[pytest]\ncudastack = maybe\n")
    pt.makepyfile("def test_x(): pass")
    result = pt.runpytest("-p", "pytest_cudastack.plugin")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cudastack (from ini): *maybe*"])


def test_report_carries_the_findings_as_data(pt):
    # pytest's own serialisation (as xdist and report-log use it) keeps them: ItemResult's JSON
    pt.makepyfile(
        """
        def test_round_trip(pytestconfig):
            from pytest_cudastack.findings import Finding, Severity
            from pytest_cudastack.items import REPORT_RESULT, ItemResult
            import pytest

            finding = Finding("integrity", Severity.WARNING, "x", "y", where=("a",))
            report = pytest.TestReport("cudastack::integrity", ("cudastack", None, ""), {}, "passed", None, "call")
            setattr(report, REPORT_RESULT, ItemResult("integrity", None, (finding,)))
            hook = pytestconfig.hook
            data = hook.pytest_report_to_serializable(config=pytestconfig, report=report)
            assert data[REPORT_RESULT]["findings"][0]["where"] == ["a"]
            back = hook.pytest_report_from_serializable(config=pytestconfig, data=data)
            assert getattr(back, REPORT_RESULT) == ItemResult("integrity", None, (finding,))
        """
    )
    result = pt.runpytest("-p", "pytest_cudastack.plugin", "--cuda-driver=550.54.15", "--cuda-arch=sm_90", "-k", "trip")
    result.assert_outcomes(passed=1)
