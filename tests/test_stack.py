from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.errors import DataError
from pytest_cudastack.session import header_lines
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack, load_snapshot, write_snapshot
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist


@pytest.fixture
def stack(tmp_path) -> Stack:
    driver = DriverInfo("declared", "550.54.15", "12.4", archs=("sm_90",), arch_source="declared")
    return Stack(Settings(cuda_max="12.9"), driver_info=driver, rootdir=str(tmp_path), site_paths=(str(tmp_path),))


def test_driver_is_declared_without_probe():
    called = []

    def probe() -> DriverInfo:
        called.append(1)
        return DriverInfo("probed", "570.1", "12.8")

    s = Stack(Settings(cuda_driver="550.54.15", cuda_arch=("sm_90",)), probe=probe)
    assert (s.driver.version, s.driver.source, s.driver.archs) == ("550.54.15", "declared", ("sm_90",))
    assert called == []
    assert Stack(Settings(), probe=probe).driver.version == "570.1"
    merged = Stack(Settings(cuda_arch=("sm_80",)), probe=probe).driver
    assert (merged.version, merged.archs, merged.arch_source) == ("570.1", ("sm_80",), "declared")


def test_to_json_round_trips_through_json(stack, tmp_path):
    data = json.loads(json.dumps(stack.to_json()))
    assert (data["schema"], data["version"], data["format"]) == ("pytest-cudastack/snapshot", 2, 2)
    assert data["driver"]["version"] == "550.54.15"
    assert data["wheels"] == []
    assert data["binaries"] == []
    out = tmp_path / "snap.json"
    write_snapshot(stack, str(out))
    assert load_snapshot(str(out))["driver"]["version"] == "550.54.15"


def test_header_lines(stack):
    (line,) = header_lines(stack)
    assert line == (
        "cudastack: driver 550.54.15 (declared) | CUDA <= 12.4 | GPUs: archs sm_90 (declared) | 0 CUDA wheels"
        " | --cuda-max=12.9"
    )
    verbose = header_lines(stack, verbose=1)
    assert verbose[-1].startswith(f"  stack fingerprint: {stack.to_json()['fingerprint']} ")


def test_load_snapshot_rejects_other_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"format": 99}')
    with pytest.raises(DataError, match=r"x\.json: not a cudastack snapshot"):
        load_snapshot(str(bad))
    bad.write_text('{"schema": "pytest-cudastack/tree", "version": 1, "format": 1}')
    with pytest.raises(DataError, match=r"not a cudastack snapshot \(schema 'pytest-cudastack/snapshot' expected"):
        load_snapshot(str(bad))
    bad.write_text('{"schema": "pytest-cudastack/snapshot", "version": 3, "format": 3}')
    with pytest.raises(DataError, match=r"version 1 or 2 expected"):
        load_snapshot(str(bad))
    with pytest.raises(DataError, match="cannot read"):
        load_snapshot(str(tmp_path / "absent.json"))


def test_load_snapshot_reads_one_written_before_it_named_its_schema(tmp_path):
    old = tmp_path / "old.json"
    old.write_text('{"format": 1, "generator": "pytest-cudastack 0.1.0", "driver": {}, "wheels": [], "binaries": []}')
    assert load_snapshot(str(old))["wheels"] == []


def test_unknown_check_is_an_error(stack):
    with pytest.raises(ValueError, match="unknown cudastack check"):
        stack.findings("nonsense")


def test_run_checks_names_items_like_the_plugin(tmp_path):
    (tmp_path / "bin").mkdir()
    driver = DriverInfo("declared", "550.54.15", "12.4")
    s = Stack(
        Settings(cudastack=True, cuda_max="12.9", cudastack_scan=("bin", "gone")),
        driver_info=driver,
        rootdir=str(tmp_path),
        site_paths=(str(tmp_path),),
    )
    results = s.run_checks()
    every = ["integrity", "closure", "dlopen", "symbols", "cuda-max", "driver", "arch", "requirements", "toolchain"]
    assert list(results) == [n for n in every if n not in s.skipped] + ["scan[gone]"]
    assert set(s.skipped) == {"driver", "arch", "requirements", "toolchain"}
    assert results["scan[gone]"][0].message == "no such file"


def test_integrity_item_carries_inventory_problems(tmp_path):
    from tests.helpers.sitebuild import write_dist

    write_dist(tmp_path, "nvidia-x-cu12", "1.0", {"nvidia/x/include/x.h": "x"})
    (tmp_path / "nvidia_x_cu12-1.0.dist-info" / "METADATA").unlink()
    stack = Stack(Settings(cudastack=True), site_paths=(str(tmp_path),), driver_info=DriverInfo("absent", None, None))
    found = stack.findings("integrity")
    assert [f.check for f in found] == ["integrity"]
    assert "METADATA" in found[0].message


def _count_calls(monkeypatch: pytest.MonkeyPatch, function: Any) -> list[int]:
    """Wrap ``function`` wherever a pytest_cudastack module bound it by name; the list counts its calls."""
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return function(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("pytest_cudastack") and getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, counted)
    return calls


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_each_shared_fact_is_computed_once_per_run(tmp_path, monkeypatch):
    # A failing stack (an extension module missing a soname, an unmet pin): every item the repair model and the
    # other rules touch reads the Stack's one requirement facts and one set of module trees.
    import pytest_cudastack.checks.closure
    import pytest_cudastack.checks.requirements
    import pytest_cudastack.checks.symbols  # noqa: F401
    from pytest_cudastack.model.modules import module_trees
    from pytest_cudastack.wheels.requirements import requirement_facts

    site = site_packages(tmp_path / "venv")
    ext = compile_so(None, pyinit="_ext", needed=["libgone.so.1"])
    # `import pkg` loads pkg._ext: its missing soname is an ERROR (an unreached one would be a WARNING)
    write_dist(site, "pkg", "1.0", {"pkg/__init__.py": "from pkg import _ext\n", "pkg/_ext.abi3.so": ext})
    write_dist(site, "torch", "2.14.1", requires=["nvidia-nccl-cu13==2.30.7"])
    write_dist(site, "nvidia-nccl-cu13", "2.28.9")
    reqs = _count_calls(monkeypatch, requirement_facts)
    trees = _count_calls(monkeypatch, module_trees)
    stack = Stack(Settings(cudastack=True), driver_info=DriverInfo("absent", None, None), site_paths=(str(site),))
    results = stack.run_checks()
    assert any(f.failing for f in results["closure"])
    assert any(f.failing for f in results["requirements"])
    assert (reqs[0], trees[0]) == (1, 1)
