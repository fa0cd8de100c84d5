"""``cudastack fleet``: nodes' snapshots of real lab-like venvs (clean, a cu12 cuDNN installed over cu13's, a
driver upgraded without a reboot, an older driver) grouped by fingerprint, the odd ones out named in diff's
words; ``--against``; the exporters, read back by their consumers' parsers (prometheus_client's own)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from xml.etree import ElementTree

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pytest_cudastack
from pytest_cudastack.cli import main
from pytest_cudastack.model.fleet import would_run
from tests.helpers.fleetbuild import B200, CUDNN, H100, clobber, cudnn_site, node_driver, snap, write_node
from tests.helpers.sitebuild import HAVE_CC

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

SCHEMA = json.loads((Path(pytest_cudastack.__file__).parent / "schemas" / "fleet.schema.json").read_text())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five nodes: three alike, one whose cu13 cuDNN a cu12 one overwrote, one on an older driver whose
    user-space libraries were upgraded without a reboot."""
    root = tmp_path_factory.mktemp("cluster")
    nodes = root / "nodes"
    clean = cudnn_site(root / "clean")
    for name in ("gpu01", "gpu02", "gpu03"):
        write_node(nodes, name, snap(clean, name=name))
    broken = cudnn_site(root / "broken")
    clobber(broken)
    write_node(nodes, "gpu04", snap(broken, name="gpu04"))
    write_node(nodes, "gpu05", snap(clean, node_driver("570.124.06", "580.95.05"), name="gpu05"))
    return nodes


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["fleet", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_groups_and_names_the_odd_nodes_out(cluster: Path, capsys: pytest.CaptureFixture[str]):
    code, out, err = run(capsys, str(cluster))
    assert code == 1
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "cudastack fleet: 5 nodes, 3 stacks"
    assert re.match(
        r"majority [0-9a-f]{12}: 3 nodes \(driver 580\.95\.05, CUDA 13\.0\): gpu01, gpu02, gpu03$", lines[1]
    )
    assert "    wheel nvidia-cudnn-cu12 9.10.2.21: added" in lines
    assert any(f"wheel nvidia-cudnn-cu13: {CUDNN}: replaced by nvidia-cudnn-cu12 9.10.2.21's bytes" in x for x in lines)
    assert "    host kernel_module: 580.95.05 -> 570.124.06" in lines
    assert any(x.startswith("  ERROR gpu04: nvidia-cudnn-cu13 9.13.0.50: ") for x in lines)
    assert any(
        x.startswith("  ERROR gpu05: libcuda.so.1 580.95.05 is not the kernel module's 570.124.06") for x in lines
    )


def test_one_stack_is_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    site = cudnn_site(tmp_path)
    files = [str(write_node(tmp_path / "n", f"n{i}", snap(site, name=f"n{i}"))) for i in range(3)]
    code, out, _ = run(capsys, *files)
    assert code == 0
    assert out.splitlines()[0] == "cudastack fleet: 3 nodes, 1 stack"


def test_a_file_that_is_not_a_snapshot_is_exit_2(cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    code, out, err = run(capsys, str(cluster), str(bad))
    assert code == 2
    assert f"{bad}: not a cudastack snapshot" in err
    assert "5 nodes" in out  # the others are still grouped


def test_json_follows_its_schema(cluster: Path, capsys: pytest.CaptureFixture[str]):
    code, out, _ = run(capsys, str(cluster), "--format", "json")
    assert code == 1
    doc = json.loads(out)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert doc["nodes"] == 5
    assert [len(g["nodes"]) for g in doc["groups"]] == [3, 1, 1]
    assert doc["groups"][0]["majority"]
    assert doc["groups"][0]["drift"] == []
    assert doc["majority"] == doc["groups"][0]["fingerprint"]


def test_prometheus_textfile_parses(cluster: Path, capsys: pytest.CaptureFixture[str]):
    _, out, _ = run(capsys, str(cluster), "--format", "prometheus")
    families = {f.name: f for f in text_string_to_metric_families(out)}
    info = families["cudastack_stack_info"].samples
    assert len(info) == 5
    gpu05 = next(s for s in info if s.labels["node"] == "gpu05")
    assert gpu05.labels["kernel_module"] == "570.124.06"
    assert gpu05.labels["majority"] == "false"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", gpu05.labels["fingerprint"])
    findings = {
        (s.labels["node"], s.labels["check"], s.labels["severity"]): s.value
        for s in families["cudastack_findings"].samples
    }
    assert findings[("gpu05", "driver", "error")] == 2
    assert findings[("gpu04", "integrity", "error")] == 1
    assert findings[("gpu01", "integrity", "error")] == 0
    assert findings[("gpu01", "fleet", "warning")] == 0
    assert findings[("gpu04", "fleet", "warning")] == 1
    assert families["cudastack_fleet_groups"].samples[0].value == 3


def test_prometheus_label_values_are_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    doc = snap(cudnn_site(tmp_path), name='odd "node"\\name')
    _, out, _ = run(capsys, str(write_node(tmp_path / "n", "odd", doc)), "--format", "prometheus")
    families = {f.name: f for f in text_string_to_metric_families(out)}
    assert families["cudastack_stack_info"].samples[0].labels["node"] == 'odd "node"\\name'


LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def test_nfd_feature_lines_are_valid_labels(cluster: Path, capsys: pytest.CaptureFixture[str]):
    _, out, _ = run(capsys, str(cluster), "--format", "nfd")
    blocks: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("# node "):
            current = blocks.setdefault(line.removeprefix("# node "), {})
            continue
        name, _, value = line.partition("=")
        assert LABEL_NAME.match(name), line  # NFD's local source: name=value, the default prefix added
        assert LABEL_VALUE.match(value), line
        current[name] = value
    assert sorted(blocks) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
    assert blocks["gpu05"]["cudastack.kernel-module"] == "570.124.06"
    assert blocks["gpu04"]["cudastack.majority"] == "false"
    assert blocks["gpu01"]["cudastack.errors"] == "0"


def test_junit_a_testcase_per_node(cluster: Path, capsys: pytest.CaptureFixture[str]):
    _, out, _ = run(capsys, str(cluster), "--format", "junit")
    suite = ElementTree.fromstring(out.split("?>", 1)[1]).find("testsuite")
    assert suite is not None
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert sorted(cases) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
    assert suite.get("failures") == "2"
    assert cases["gpu01"].find("failure") is None
    failure = cases["gpu04"].find("failure")
    assert failure is not None
    assert "replaced by nvidia-cudnn-cu12" in (failure.text or "")


# --------------------------------------------------------------------------------------------- --against


def environment(tmp_path: Path, sass: list[str]) -> dict:
    """An environment's snapshot (--no-host) needing CUDA 13 (its cuDNN wheel's flavour), carrying ``sass``."""
    env = snap(cudnn_site(tmp_path / "env"), host=False)
    env["wheels"][0]["gpu_code"] = {"sass": sass, "ptx": []}
    assert {n["cuda"] for n in env["needs"]} == {"13.x"}
    return env


def test_against_driver_and_archs(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    env = environment(tmp_path, ["sm_90"])
    site = cudnn_site(tmp_path / "nodes")
    nodes = tmp_path / "snaps"
    write_node(nodes, "h100", snap(site, node_driver("580.95.05"), name="h100"))
    write_node(nodes, "old", snap(site, node_driver("570.124.06"), name="old"))
    write_node(nodes, "b200", snap(site, node_driver("580.95.05", gpus=(B200,)), name="b200"))
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps(env))
    code, out, _ = run(capsys, str(nodes), "--against", str(env_file))
    assert code == 1
    assert f"  {env_file}: runs here" in out
    assert "would NOT run here: nvidia-cudnn-cu13 9.13.0.50 has no GPU code for sm_100 (it carries sm_90)" in out
    assert re.search(r"would NOT run here: .*needs CUDA 13; driver 570\.124\.06", out)


def test_against_clean_twin(tmp_path: Path):
    env = environment(tmp_path, ["sm_80", "sm_90"])
    node = snap(cudnn_site(tmp_path / "n"), node_driver("580.95.05", gpus=(H100,)))
    assert would_run(env, node).runs
    ptx_env = copy.deepcopy(env)
    ptx_env["wheels"][0]["gpu_code"] = {"sass": ["sm_90"], "ptx": ["compute_90"]}
    assert would_run(ptx_env, snap(cudnn_site(tmp_path / "b"), node_driver("580.95.05", gpus=(B200,)))).runs


def test_against_a_mismatched_node(tmp_path: Path):
    env = environment(tmp_path, ["sm_90"])
    node = snap(cudnn_site(tmp_path / "n"), node_driver("580.95.05", "590.48.01"))
    verdict = would_run(env, node)
    assert not verdict.runs
    assert any("is not the kernel module's 580.95.05" in r for r in verdict.reasons)


def test_against_an_image_is_refused(cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    image = tmp_path / "rootfs"
    image.mkdir()
    code, _, err = run(capsys, str(cluster), "--against", str(image))
    assert code == 2
    assert "--against takes a snapshot file, not an image" in err
    tarball = tmp_path / "image.tar"
    tarball.write_bytes(b"\0" * 1024)
    code, _, err = run(capsys, str(cluster), "--against", str(tarball))
    assert code == 2
    assert "an image needs its snapshot written first" in err
