from __future__ import annotations

import copy
import os

import pytest

from pytest_cudastack.checks.arch import arch_coverage
from pytest_cudastack.checks.baseline import baseline_findings, diff_snapshots, snapshot_drift
from pytest_cudastack.checks.driver import driver_findings
from pytest_cudastack.checks.scan import binary_findings, scan_targets
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.resolver import Library, Route, Tree
from pytest_cudastack.model.needs import CudaNeed, Inference
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc

ROOT = "/app/bin/train"


def missing(soname: str) -> Library:
    return Library(soname, None, None, Route.NOT_FOUND, "", (f"/app/lib/{soname}", f"/usr/lib/{soname}"), (ROOT,))


def test_binary_findings_reports_every_missing_soname_at_once():
    tree = Tree(ROOT, None, (missing("libcublas.so.13"), missing("libcublasLt.so.13")), (), {})
    findings = binary_findings(tree, "bin/train")
    assert [f.severity for f in findings] == [Severity.ERROR, Severity.ERROR]
    first = findings[0]
    assert first.message == "needs libcublas.so.13, which the dynamic linker does not find"
    assert first.where == (("/usr/lib",) if os.path.isdir("/usr/lib") else ())  # /app/lib does not exist
    assert first.chain == (ROOT,)
    assert "rebuild against the CUDA this image has" in first.fix


def test_scan_where_names_the_directories_searched(tmp_path):
    # "looked in" lists directories a loader searches: not candidate file names, not missing directories,
    # each once (ld.so tries a directory on two lists twice)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    tried = [str(tmp_path / d / "libx.so.1") for d in ("a", "gone", "b", "a")]
    lib = Library("libx.so.1", None, None, Route.NOT_FOUND, "", tuple(tried), (ROOT,))
    (finding,) = binary_findings(Tree(ROOT, None, (lib,), (), {}), "bin/train")
    assert finding.where == (str(tmp_path / "a"), str(tmp_path / "b"))


class _Dist:
    name, label = "nvidia-cublas", "nvidia-cublas 13.1.1.3"


class _Inventory:
    def __init__(self, path: str) -> None:
        self.path = path

    def shipping(self, soname: str) -> tuple[tuple[_Dist, str], ...]:
        return ((_Dist(), self.path),)


def test_binary_findings_names_the_wheel_that_claims_a_missing_soname(tmp_path):
    tree = Tree(ROOT, None, (missing("libcublas.so.13"),), (), {})
    gone = str(tmp_path / "libcublas.so.13")
    (f,) = binary_findings(tree, "bin/train", _Inventory(gone))  # type: ignore[arg-type]
    assert f.details == (f"nvidia-cublas 13.1.1.3 ships it at {gone} (missing)",)
    assert f.fix == "reinstall nvidia-cublas (pip install --force-reinstall --no-deps nvidia-cublas)"
    (tmp_path / "libcublas.so.13").write_bytes(b"x")
    (f,) = binary_findings(tree, "bin/train", _Inventory(gone))  # type: ignore[arg-type]
    assert f.fix == f"add {tmp_path} to the binary's RUNPATH (-Wl,-rpath) or to LD_LIBRARY_PATH"


@pytest.mark.parametrize(
    ("source", "severity"),
    [
        pytest.param("absent", Severity.INFO, id="driverless machine"),
        pytest.param("declared", Severity.INFO, id="declared deployment driver"),
        pytest.param("probed", Severity.ERROR, id="driver here but libcuda unresolvable"),
    ],
)
def test_driver_soname_missing(source, severity):
    tree = Tree(ROOT, None, (missing("libcuda.so.1"),), (), {})
    (f,) = binary_findings(tree, "bin/train", driver=DriverInfo(source, None, None))
    assert f.severity is severity


def test_not_an_elf_problem_is_an_error():
    (f,) = binary_findings(Tree(ROOT, None, (), ("not an ELF file",), {}), "bin/train")
    assert f.failing
    assert "not an ELF file" in f.message


@needs_cc
def test_scan_targets_walks_directories_and_keeps_missing_paths(tmp_path):
    lib = build_lib(tmp_path / "lib" / "liba.so.1", soname="liba.so.1")
    build_exe(tmp_path / "bin" / "sub" / "b", needed=[lib])
    build_exe(tmp_path / "bin" / "a", needed=[lib])
    (tmp_path / "bin" / "notes.txt").write_text("x")
    targets = scan_targets(["bin", str(tmp_path / "lib" / "liba.so.1"), "gone"], str(tmp_path))
    assert [name for name, _ in targets] == ["bin/a", "bin/sub/b", "lib/liba.so.1", "gone"]
    assert targets[0][1] == str(tmp_path / "bin" / "a")


def inf(subject: str, major: int, minor: int | None) -> Inference:
    return Inference(subject, (CudaNeed(major, minor, subject, f"links x (CUDA {major})"),))


def test_driver_findings_groups_and_grades():
    driver = DriverInfo("declared", "550.54.15", "12.4")
    findings = driver_findings([inf("bin/a", 13, None), inf("bin/b", 13, None), inf("bin/c", 12, 4)], driver)
    assert len(findings) == 1
    (f,) = findings
    assert f.severity is Severity.ERROR
    assert f.subject == "2 components"
    assert "CUDA 13 needs driver" in f.message
    assert f.details == ("bin/a: links x (CUDA 13)", "bin/b: links x (CUDA 13)")


def test_driver_findings_minor_version_compat_is_a_warning():
    (f,) = driver_findings([inf("torch", 12, 8)], DriverInfo("declared", "550.54.15", "12.4"))
    assert f.severity is Severity.WARNING
    assert "minor-version compatibility" in f.message
    assert f.cause.startswith("torch is built for CUDA 12.8, newer than the driver's")
    assert f.fix.endswith("then use a driver that supports CUDA 12.8")


def test_driver_findings_unknown_driver_is_one_info_for_every_requirement():
    """No driver facts: one cause, said once (the highest requirement decides), not once per CUDA version."""
    needs = [inf("torch", 13, 0), inf("bin/a", 12, 8), inf("nvjitlink", 13, 5)]
    (f,) = driver_findings(needs, DriverInfo("absent", None, None, reason="no NVML"))
    assert f.severity is Severity.INFO
    assert f.subject == "3 components"
    assert f.message.startswith("CUDA 13.5 is required; cannot tell whether the driver supports it: no NVML")
    assert f.cause == "the stack requires CUDA 12.8, 13.0, 13.5 (the highest decides)"
    assert f.fix == "pass --cuda-driver=VER to check a deployment target"
    assert len(f.details) == 3


def test_driver_findings_unknown_driver_is_info():
    (f,) = driver_findings([inf("torch", 12, 8)], DriverInfo("absent", None, None, reason="no NVML"))
    assert f.severity is Severity.INFO


def test_arch_coverage_without_archs_is_info():
    (f,) = arch_coverage(["/x"], DriverInfo("absent", None, None, reason="no NVML"))
    assert f.severity is Severity.INFO
    assert "--cuda-arch" in f.message
    assert arch_coverage([], DriverInfo("absent", None, None)) == ()  # nothing to check, nothing to say


SNAP = {
    "format": 1,
    "driver": {"version": "550.54.15", "cuda_version": "12.4", "archs": ["sm_80"], "gpus": []},
    "wheels": [{"name": "nvidia-cudnn-cu12", "version": "9.19.0.56", "missing": []}],
    "binaries": [{"path": "bin/a", "libraries": [{"soname": "libcublas.so.12", "path": "/l/libcublas.so.12"}]}],
}


def test_diff_snapshots_equal():
    assert diff_snapshots(SNAP, copy.deepcopy(SNAP)) == ()


def test_diff_snapshots_names_every_change():
    new = copy.deepcopy(SNAP)
    new["driver"]["version"] = "580.65.06"
    new["wheels"][0]["version"] = "9.24.0.43"
    new["wheels"][0]["missing"] = ["/s/libcudnn.so.9"]
    new["wheels"].append({"name": "nvidia-nccl-cu13", "version": "2.30.7"})
    new["binaries"][0]["libraries"][0]["path"] = None
    assert diff_snapshots(SNAP, new) == (
        "driver version: 550.54.15 -> 580.65.06",
        "wheel nvidia-cudnn-cu12: 9.19.0.56 -> 9.24.0.43",
        "wheel nvidia-cudnn-cu12: /s/libcudnn.so.9 went missing",
        "wheel nvidia-nccl-cu13 2.30.7: added",
        "binary bin/a: libcublas.so.12: /l/libcublas.so.12 -> not found",
    )
    findings = baseline_findings("base.json", SNAP, new)
    assert len(findings) == 5
    assert all(f.failing and f.check == "baseline" for f in findings)
    # the stack now has a missing library and an unresolved soname: never proposed as the new baseline
    assert "--cudastack-snapshot" not in findings[0].fix
    assert "/s/libcudnn.so.9 is missing" in findings[0].remedies[0].why
    # each drift is its own finding id (what the repair plan's steps resolve), the baseline file its place
    assert len({f.id for f in findings}) == 5
    assert findings[2].id == "baseline: wheel nvidia-cudnn-cu12 /s/libcudnn.so.9"
    assert all(f.where == ("base.json",) for f in findings)
    assert (
        findings[4]
        .remedies[0]
        .render()
        .startswith("restore bin/a as recorded (libcublas.so.12: /l/libcublas.so.12 recorded, not found now)")
    )
    clean = copy.deepcopy(SNAP)
    clean["driver"]["version"] = "580.65.06"
    (finding,) = baseline_findings("base.json", SNAP, clean)
    assert "--cudastack-snapshot=base.json" in finding.fix


def test_snapshot_drift_records_what_each_line_says():
    new = copy.deepcopy(SNAP)
    new["driver"]["gpus"] = [{"name": "NVIDIA H200", "compute_capability": "9.0"}]
    new["wheels"][0]["missing"] = ["/s/libcudnn.so.9"]
    new["wheels"].append({"name": "nvidia-nccl-cu13", "version": "2.30.7"})
    new["binaries"][0]["libraries"][0]["path"] = None
    new["binaries"][0]["libraries"].append({"soname": "libnew.so.1", "path": "/l/libnew.so.1"})
    new["binaries"].append({"path": "bin/b", "libraries": []})
    drift = snapshot_drift(SNAP, new)
    assert tuple(d.text for d in drift) == diff_snapshots(SNAP, new)
    assert [(d.kind, d.subject, d.item, d.change, d.before, d.after) for d in drift] == [
        ("driver", "gpus", None, "changed", [], [{"name": "NVIDIA H200", "compute_capability": "9.0"}]),
        ("wheel", "nvidia-cudnn-cu12", "/s/libcudnn.so.9", "removed", "/s/libcudnn.so.9", None),
        ("wheel", "nvidia-nccl-cu13", None, "added", None, "2.30.7"),
        ("binary", "bin/a", "libcublas.so.12", "changed", "/l/libcublas.so.12", None),
        ("binary", "bin/a", "libnew.so.1", "added", None, "/l/libnew.so.1"),
        ("binary", "bin/b", None, "added", None, None),
    ]
    assert drift[0].to_json()["text"] == "GPUs: none -> [('NVIDIA H200', '9.0')]"
