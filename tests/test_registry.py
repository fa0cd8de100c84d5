"""The checks registry: ``CHECKS`` is the one list the items, ``Settings.items``, ``Stack`` and ``cudastack check``
read, so adding a check is one module plus one registry line."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack import checks
from pytest_cudastack.checks import CHECKS, Check, registry
from pytest_cudastack.checks.facts import StackView, Target
from pytest_cudastack.cli import main
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Finding, Severity, manual
from pytest_cudastack.settings import ENV, Settings
from pytest_cudastack.stack import Stack, write_snapshot

DRIVER = DriverInfo("declared", "550.54.15", "12.4", archs=("sm_90",), arch_source="declared")


def _dummy(stack: StackView, target: Target | None) -> tuple[Finding, ...]:
    return (Finding("dummy", Severity.ERROR, "the stack", "dummy says no", remedies=manual("drop the dummy check")),)


def _each(stack: StackView, target: Target | None) -> tuple[Finding, ...]:
    assert target is not None
    return (Finding("each", Severity.INFO, target[0], f"looked at {target[1]}"),)


DUMMY = Check("dummy", "the dummy invariant holds", _dummy, lambda o: o.cudastack)
EACH = Check(
    "each", "one item per target", _each, lambda o: o.cudastack, targets=lambda stack: (("a", "/t/a"), ("b", "/t/b"))
)


@pytest.fixture
def dummy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in registry with two more checks: ``dummy`` (always an ERROR) and per-target ``each``."""
    monkeypatch.setattr(checks, "CHECKS", registry(*CHECKS.values(), DUMMY, EACH))


def test_registry_order_and_descriptions_are_the_items():
    options = Settings(cuda_max="12.9", cuda_min="12.0", cudastack_baseline="b.json")
    assert {name: check.describe(options) for name, check in CHECKS.items()} == {
        "integrity": "every RECORD-listed shared library is present, intact and owned by one distribution",
        "closure": "every Python extension module resolves all its DT_NEEDED",
        "dlopen": "every library loaded at run time (dlopen) is found, for the CUDA its caller is built for",
        "symbols": "every undefined symbol binds, with its version",
        "cuda-max": "nothing requires a CUDA newer than 12.9",
        "cuda-min": "nothing is built for a CUDA older than 12.0",
        "driver": "the driver supports the CUDA the stack requires",
        "container": "the NVIDIA container runtime starts the image on the declared host, with the host's driver",
        "arch": "GPU code runs on the target architectures",
        "requirements": "Requires-Dist present and pins met, framework version rules hold, no shadowed copy",
        "toolchain": "the compiler tools each framework runs accept what the stack emits",
        "baseline": "the stack matches the snapshot b.json",
        "scan": "every DT_NEEDED resolves here",
    }
    assert [name for name, check in CHECKS.items() if check.targets is not None] == ["scan"]


def test_registry_rejects_a_name_twice_and_is_read_only():
    with pytest.raises(ValueError, match="'driver' registered twice"):
        registry(CHECKS["driver"], CHECKS["driver"])
    with pytest.raises(TypeError):
        CHECKS["x"] = DUMMY  # type: ignore[index]


def test_a_registered_check_is_in_settings_items_and_stack(dummy: None, tmp_path: Path):
    assert Settings(cudastack=True).items == (
        "integrity",
        "closure",
        "dlopen",
        "symbols",
        "driver",
        "arch",
        "requirements",
        "toolchain",
        "dummy",
    )
    assert Settings(cuda_max="12.9").items == ("cuda-max",)
    stack = Stack(Settings(cudastack=True), driver_info=DRIVER, rootdir=str(tmp_path), site_paths=(str(tmp_path),))
    results = stack.run_checks()
    every = ["integrity", "closure", "dlopen", "symbols", "driver", "arch", "requirements", "toolchain", "dummy"]
    assert list(stack.skipped) == ["driver", "arch", "requirements", "toolchain"]  # an empty site: nothing to check
    assert list(results) == [n for n in every if n not in stack.skipped] + ["each[a]", "each[b]"]
    assert results["each[b]"][0].message == "looked at /t/b"
    assert stack.findings("dummy")[0].message == "dummy says no"


def test_a_registered_check_is_in_cudastack_check(dummy: None, tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    rc = main(["check", "--site", str(tmp_path), "--cudastack", "--cuda-driver=580.65.06", "--cuda-arch=sm_90", "-v"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL cudastack::dummy\n     error: the stack: dummy says no" in out
    assert "ok   cudastack::each[a]\n     info: a: looked at /t/a" in out
    assert main(["check", "--site", str(tmp_path), "--cuda-driver=580.65.06", "--json"]) == 1  # as --cudastack
    items = json.loads(capsys.readouterr().out)["items"]
    assert list(items) == [
        "integrity",
        "closure",
        "dlopen",
        "symbols",
        "driver",
        "arch",
        "requirements",
        "toolchain",
        "dummy",
        "each[a]",
        "each[b]",
    ]


def test_a_registered_check_is_a_pytest_item(dummy: None, pytester: pytest.Pytester, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    pytester.makepyfile("def test_x(): pass")
    args = ("-p", "pytest_cudastack.plugin", "--cudastack", "--cuda-driver=580.65.06", "--cuda-arch=sm_90")
    result = pytester.runpytest(*args, "--co", "-q")
    result.stdout.fnmatch_lines(
        [
            "cudastack::arch",
            "cudastack::requirements",
            "cudastack::dummy",
            "cudastack::each[[]a[]]",
            "cudastack::each[[]b[]]",
            "*::test_x",
        ]
    )
    result = pytester.runpytest(*args, "-k", "dummy or each", "-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*[[]error[]] the stack: dummy says no*"])


def test_every_builtin_check_runs_from_the_registry(tmp_path: Path):
    site = (str(tmp_path),)
    write_snapshot(Stack(driver_info=DRIVER, rootdir=str(tmp_path), site_paths=site), str(tmp_path / "base.json"))
    settings = Settings(
        cudastack=True, cuda_max="12.9", cuda_min="12.0", cudastack_baseline="base.json", cudastack_scan=("gone",)
    )
    stack = Stack(settings, driver_info=DRIVER, rootdir=str(tmp_path), site_paths=site)
    results = stack.run_checks()
    order = [
        "integrity",
        "closure",
        "dlopen",
        "symbols",
        "cuda-max",
        "cuda-min",
        "driver",
        "arch",
        "requirements",
        "toolchain",
        "baseline",
        "scan[gone]",
    ]
    assert list(results) == [n for n in order if n not in stack.skipped]
    assert list(stack.skipped) == ["driver", "arch", "requirements", "toolchain"]  # nothing to check: not run
    for name in stack.skipped:  # each still runs from the registry when asked
        assert stack.findings(name) == ()
    assert results["baseline"] == ()  # the same empty stack as recorded
    assert stack.findings("scan", ("gone", str(tmp_path / "gone")))[0].message == "no such file"


def test_a_check_whose_option_is_unset_cannot_run(tmp_path: Path):
    stack = Stack(Settings(), driver_info=DRIVER, rootdir=str(tmp_path), site_paths=(str(tmp_path),))
    for name, option in (("cuda-max", "--cuda-max"), ("cuda-min", "--cuda-min"), ("baseline", "--cudastack-baseline")):
        with pytest.raises(ValueError, match=f"'{name}' needs {option}"):
            stack.findings(name)
    with pytest.raises(ValueError, match="per target"):
        stack.findings("scan")


def test_reading_the_registry_imports_no_check_module():
    # Settings.items runs in every pytest session with the plugin installed; the checks' modules (ELF,
    # resolver, wheel readers) load only when a check runs.
    code = (
        "import sys\n"
        "from pytest_cudastack.settings import Settings\n"
        "s = Settings(cudastack=True, cuda_max='12.9', cudastack_scan=('bin',))\n"
        "assert s.items and s.active\n"
        "print(sorted(m for m in sys.modules if m.startswith('pytest_cudastack')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(done.stdout))
    # the registry, the option parsers and the ground floor; no check, linker or wheels module
    assert loaded <= {
        "pytest_cudastack",
        "pytest_cudastack.checks",
        "pytest_cudastack.checks.facts",
        "pytest_cudastack.cuda",
        "pytest_cudastack.cuda.versions",
        "pytest_cudastack.errors",
        "pytest_cudastack.findings",
        "pytest_cudastack.options",
        "pytest_cudastack.settings",
    }, loaded


def test_each_items_findings_are_computed_once_per_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    # the item, the run's repair plan and run_checks all read one result: a check is not run again
    calls: list[Target | None] = []

    def counting(stack: StackView, target: Target | None) -> tuple[Finding, ...]:
        calls.append(target)
        return _dummy(stack, target)

    counted = Check("dummy", "the dummy invariant holds", counting, lambda o: o.cudastack)
    monkeypatch.setattr(checks, "CHECKS", registry(counted))
    stack = Stack(Settings(cudastack=True), driver_info=DRIVER)
    first = stack.findings("dummy")
    assert stack.findings("dummy") is first
    assert stack.run_checks() == {"dummy": first}
    assert calls == [None]


def _never(stack: StackView, target: Target | None) -> tuple[Finding, ...]:
    raise AssertionError("a skipped check was run")


def test_a_skipped_item_is_not_run_by_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys):
    # cudastack check reports a skipped item with its reason and runs nothing for it (round 2 ran every check
    # and then threw the skipped ones' results away)
    idle = Check("idle", "nothing here", _never, lambda o: o.cudastack, skip=lambda stack, target: "nothing to do")
    monkeypatch.setattr(checks, "CHECKS", registry(idle))
    stack = Stack(Settings(cudastack=True), driver_info=DRIVER, rootdir=str(tmp_path), site_paths=(str(tmp_path),))
    assert stack.run_checks() == {}
    assert stack.skipped == {"idle": "nothing to do"}
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--site", str(tmp_path), "--cuda-driver=550.54.15", "--cuda-arch=sm_90"]) == 0
    assert "skip cudastack::idle: nothing to do" in capsys.readouterr().out


def test_every_finding_names_a_registered_check():
    # Finding.check is the item a finding belongs to: every literal the package constructs findings with (and
    # the repair model's list of the checks it plans for) is a name of the registry, "inventory" included no more
    import ast

    package = Path(checks.__file__).parent.parent
    named: set[str] = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "check"), None)
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    named.add(first.value)
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") in ("_CHECK", "_MODELLED") for t in node.targets
            ):
                value = node.value
                items = value.elts if isinstance(value, ast.Tuple) else [value]
                named.update(v.value for v in items if isinstance(v, ast.Constant) and isinstance(v.value, str))
    assert named, "no Finding construction found"
    assert named <= set(CHECKS), named - set(CHECKS)
