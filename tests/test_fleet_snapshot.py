"""The snapshot's node facts and fingerprint, and bytes compared: a cu12 cuDNN installed over the cu13 one (the
same paths, real gcc-built libraries) is replaced bytes in diff and in the baseline, and a baseline with errors
is never proposed as the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_cudastack.checks.baseline import baseline_findings, snapshot_drift
from pytest_cudastack.cli import main
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.model.fingerprint import file_hash, stack_fingerprint
from pytest_cudastack.model.fleet import snapshot_problems
from pytest_cudastack.stack import Stack, load_snapshot, write_snapshot
from tests.helpers.fleetbuild import CUDNN, clobber, cudnn_site, node_driver, snap
from tests.helpers.sitebuild import HAVE_CC, compile_so, record_hash

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


def test_snapshot_has_node_facts_and_a_fingerprint(tmp_path: Path):
    doc = snap(cudnn_site(tmp_path))
    host = doc["host"]
    assert host["name"]
    assert (host["kernel_module"], host["libcuda_version"], host["nvml_version"]) == ("580.95.05",) * 3
    assert host["mismatch"] == []
    assert host["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "uuid": "GPU-a"}]
    assert doc["fingerprint"] == stack_fingerprint(doc)
    (wheel,) = doc["wheels"]
    (file,) = wheel["files"]
    assert file["path"] == CUDNN
    assert file["sha256"] == file["record"] == record_hash(compile_so("libcudnn.so.9", payload="cu13"))
    assert {"soname": "libcudnn.so.9", "path": None, "provider": None} in doc["resolved"]
    assert doc["needs"]  # the cuDNN wheel names the CUDA it needs


def test_written_snapshot_reads_against_its_schema(tmp_path: Path):
    stack = Stack(driver_info=node_driver(), site_paths=(str(cudnn_site(tmp_path)),), cache=ElfCache(enabled=False))
    out = tmp_path / "snap.json"
    write_snapshot(stack, str(out))
    assert load_snapshot(str(out))["host"]["kernel_module"] == "580.95.05"
    write_snapshot(stack, str(out), host=False)
    assert "host" not in load_snapshot(str(out))


def test_fingerprint_ignores_the_host_name_and_order(tmp_path: Path):
    doc = snap(cudnn_site(tmp_path))
    other = json.loads(json.dumps(doc))
    other["host"]["name"] = "another-node"
    other["resolved"].reverse()
    other["driver"]["notes"] = ["something else"]
    assert stack_fingerprint(other) == doc["fingerprint"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: d["host"].update(kernel_module="570.124.06"), id="kernel module"),
        pytest.param(lambda d: d["host"].update(nvml_version="570.124.06"), id="NVML"),
        pytest.param(lambda d: d["host"]["gpus"][0].update(compute_capability="10.0"), id="GPU arch"),
        pytest.param(lambda d: d["wheels"][0].update(version="9.14.0.64"), id="wheel version"),
        pytest.param(lambda d: d["wheels"][0]["files"][0].update(sha256="sha256=other"), id="bytes"),
        pytest.param(lambda d: d["resolved"][0].update(path="/usr/lib/libcuda.so.1"), id="resolution"),
    ],
)
def test_fingerprint_changes_with_what_decides_a_run(tmp_path: Path, change):
    doc = snap(cudnn_site(tmp_path))
    changed = json.loads(json.dumps(doc))
    change(changed)
    assert stack_fingerprint(changed) != doc["fingerprint"]


def test_same_venv_at_another_prefix_has_the_same_fingerprint(tmp_path: Path):
    a = snap(cudnn_site(tmp_path / "a"))
    b = snap(cudnn_site(tmp_path / "b"))
    assert a["fingerprint"] == b["fingerprint"]


def test_no_host_fingerprint_is_the_environment(tmp_path: Path):
    site = cudnn_site(tmp_path)
    a = snap(site, node_driver("580.95.05"), host=False)
    b = snap(site, node_driver("570.124.06", "570.124.06"), host=False)
    assert "host" not in a
    assert a["fingerprint"] == b["fingerprint"]


def test_cu12_over_cu13_is_replaced_bytes_not_just_added(tmp_path: Path):
    site = cudnn_site(tmp_path)
    before = snap(site)
    clobber(site)
    after = snap(site)
    lines = [d.text for d in snapshot_drift(before, after)]
    assert "wheel nvidia-cudnn-cu12 9.10.2.21: added" in lines
    replaced = [line for line in lines if line.startswith(f"wheel nvidia-cudnn-cu13: {CUDNN}: ")]
    assert len(replaced) == 1
    assert "replaced by nvidia-cudnn-cu12 9.10.2.21's bytes" in replaced[0]
    assert before["fingerprint"] != after["fingerprint"]
    assert [p.check for p in snapshot_problems(after)] == ["integrity"]


def test_bytes_no_record_lists(tmp_path: Path):
    site = cudnn_site(tmp_path)
    before = snap(site)
    target = site / CUDNN
    data = target.read_bytes()
    target.unlink()
    target.write_bytes(data[:-4] + b"XXXX")  # patched by hand, same size
    (line,) = (d.text for d in snapshot_drift(before, snap(site)))
    assert "replaced by bytes no installed RECORD lists" in line


def test_unchanged_bytes_are_no_drift(tmp_path: Path):
    site = cudnn_site(tmp_path)
    assert snapshot_drift(snap(site), snap(site)) == ()


def test_version_1_snapshot_compares_without_bytes(tmp_path: Path):
    site = cudnn_site(tmp_path)
    old = snap(site, host=False)
    for wheel in old["wheels"]:
        del wheel["files"]
    clobber(site)
    lines = [d.text for d in snapshot_drift(old, snap(site, host=False))]
    assert lines == ["wheel nvidia-cudnn-cu12 9.10.2.21: added"]


def test_baseline_with_errors_is_never_proposed(tmp_path: Path):
    site = cudnn_site(tmp_path)
    recorded = snap(site)
    clobber(site)
    findings = baseline_findings("stack.json", recorded, snap(site))
    assert findings
    for f in findings:
        assert "re-record" not in f.fix
        assert len(f.remedies[0].steps) == 1  # restoring it, step by step: nothing else
        assert "other bytes than its RECORD's" in f.remedies[0].why
    restore = {f.remedies[0].steps[0] for f in findings}
    assert "uninstall nvidia-cudnn-cu12 (not in the recorded stack)" in restore


def test_clean_baseline_drift_proposes_re_recording(tmp_path: Path):
    recorded = snap(cudnn_site(tmp_path / "a"))
    now = snap(cudnn_site(tmp_path / "b", major=12))
    findings = baseline_findings("stack.json", recorded, now)
    assert findings
    assert all(f.remedies[0].steps[-1] == "or re-record it: pytest --cudastack-snapshot=stack.json" for f in findings)
    # each difference names what restores it: the recorded wheel, at its recorded version
    restore = [f.remedies[0].steps[0] for f in findings]
    assert any(s.startswith("install nvidia-") and "(recorded" in s for s in restore), restore


def test_driver_mismatch_is_a_snapshot_problem(tmp_path: Path):
    doc = snap(cudnn_site(tmp_path), node_driver("570.124.06", "580.95.05"))
    assert doc["host"]["mismatch"] == [
        {"soname": "libcuda.so.1", "version": "580.95.05"},
        {"soname": "libnvidia-ml.so.1", "version": "580.95.05"},
    ]
    assert [p.check for p in snapshot_problems(doc)] == ["driver", "driver"]


def test_file_hash_is_cached_by_stat(tmp_path: Path):
    f = tmp_path / "lib.so"
    f.write_bytes(b"one")
    cache = ElfCache(str(tmp_path / "cache"), enabled=True)
    first = file_hash(str(f), cache)
    assert first == record_hash(b"one")
    cache.put_extra(f"sha256:{f}", {**cache.get_extra(f"sha256:{f}"), "sha256": "sha256=cached"})
    assert file_hash(str(f), cache) == "sha256=cached"  # a hit while the stat key agrees
    f.unlink()
    f.write_bytes(b"two")
    assert file_hash(str(f), cache) == record_hash(b"two")
    assert file_hash(str(tmp_path / "gone"), cache) is None


def test_cli_snapshot_no_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    site = cudnn_site(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "s.json"
    args = ["snapshot", "--site", str(site), "--cuda-driver=580.95.05", "--cuda-arch=sm_90", "-o", str(out)]
    assert main([*args, "--no-host"]) == 0
    assert "host" not in load_snapshot(str(out))
    assert main(args) == 0
    assert load_snapshot(str(out))["host"]["driver_version"] is None  # declared, not this node's
