"""Snapshots are read as a schema (issue #14, Deliver 4): ``load_snapshot`` checks a file against the shipped
``snapshot.schema.json`` with ``pytest_cudastack.schemacheck`` (no jsonschema at run time), and a bad file
is exit 2 of ``cudastack diff`` / a usage error of ``--cudastack-baseline``, naming the file and the first
wrong field. The validator's verdicts are checked against jsonschema's."""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import pytest_cudastack
from pytest_cudastack import schemacheck
from pytest_cudastack.cli import main
from pytest_cudastack.errors import DataError
from pytest_cudastack.schemacheck import KEYWORDS, first_error
from pytest_cudastack.stack import SnapshotReader, load_snapshot

pytest_plugins = ["pytester"]

SCHEMAS = Path(pytest_cudastack.__file__).parent / "schemas"
SCHEMA = json.loads((SCHEMAS / "snapshot.schema.json").read_text())
GPU = {
    "index": 0,
    "name": "NVIDIA H200",
    "uuid": "GPU-1",
    "compute_capability": "9.0",
    "memory_total": 150 << 30,
    "mig_mode": None,
}
SNAP_V1: dict[str, Any] = {
    "schema": "pytest-cudastack/snapshot",
    "version": 1,
    "format": 1,
    "generator": "pytest-cudastack 0.2.0",
    "driver": {
        "source": "probed",
        "version": "580.65.06",
        "cuda_version": "13.0",
        "gpus": [GPU],
        "archs": ["sm_90"],
        "arch_source": "probed",
        "reason": None,
        "notes": ["NVML"],
        "libcuda": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "kernel_module": None,
        "forward_compat": None,
    },
    "wheels": [
        {
            "name": "nvidia-cublas",
            "version": "13.0.0.19",
            "cuda_major": 13,
            "cuda_evidence": "name",
            "libraries": ["libcublas.so.13"],
            "missing": [],
            "problems": [],
            "gpu_code": {"sass": ["sm_90"], "ptx": ["compute_90"]},
        }
    ],
    "binaries": [
        {
            "path": "bin/app",
            "libraries": [
                {
                    "soname": "libcublas.so.13",
                    "path": "/site/libcublas.so.13",
                    "needed_by": ["bin/app"],
                    "provider": "x",
                },
                {"soname": "libgone.so.1", "path": None, "needed_by": ["bin/app"], "provider": None},
            ],
        }
    ],
}
# version 2 (the written format): version 1's facts, plus node facts, bytes, resolution, needs, fingerprint
SNAP: dict[str, Any] = {
    **copy.deepcopy(SNAP_V1),
    "version": 2,
    "format": 2,
    "resolved": [{"soname": "libcuda.so.1", "path": None, "provider": None}],
    "needs": [{"subject": "nvidia-cublas 13.0.0.19", "distribution": "nvidia-cublas", "cuda": "13.0"}],
    "fingerprint": "sha256:" + "0" * 64,
    "host": {
        "name": "node1",
        "driver_version": "580.65.06",
        "cuda_version": "13.0",
        "kernel_module": "580.65.06",
        "libcuda_version": "580.65.06",
        "nvml_version": "580.65.06",
        "mismatch": [],
        "gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0", "uuid": "GPU-1"}],
    },
}
SNAP["driver"].update(libcuda_version="580.65.06", nvml_version="580.65.06")
SNAP["wheels"][0]["files"] = [
    {"path": "nvidia/cu13/lib/libcublas.so.13", "record": "sha256=x", "record_size": 3, "sha256": "sha256=x", "size": 3}
]
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def test_the_sample_is_valid():
    VALIDATOR.validate(SNAP)
    assert first_error(SNAP, SCHEMA) is None


def _set(doc: Any, path: str, value: Any) -> Any:
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value
    return doc


def _drop(doc: Any, path: str) -> Any:
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = doc
    for key in parents:
        node = node[key]
    del node[last]
    return doc


def _deep(n: int) -> Any:
    value: Any = []
    for _ in range(n):
        value = [value]
    return value


# (the document, the first wrong field as the message names it): the shapes that were TypeError, KeyError,
# AttributeError or RecursionError tracebacks of `cudastack diff` and --cudastack-baseline before
BAD = [
    pytest.param(lambda d: _set(d, "driver", []), "$.driver: expected object, found array of 0", id="driver a list"),
    pytest.param(lambda d: _set(d, "driver", "550"), "$.driver: expected object, found string '550'", id="driver str"),
    pytest.param(lambda d: _set(d, "driver.gpus", {"0": GPU}), "$.driver.gpus: expected array", id="gpus a dict"),
    pytest.param(lambda d: _set(d, "driver.gpus", [7]), "$.driver.gpus[0]: expected object", id="gpu a number"),
    pytest.param(
        lambda d: _set(d, "driver.gpus.0.name", None), "$.driver.gpus[0].name: expected string", id="gpu name"
    ),
    pytest.param(lambda d: _set(d, "driver.archs", "sm_90"), "$.driver.archs: expected array", id="archs a string"),
    pytest.param(lambda d: _set(d, "driver.version", 550), "$.driver.version: expected string or null", id="version"),
    pytest.param(lambda d: _set(d, "wheels", {"a": 1}), "$.wheels: expected array", id="wheels a dict"),
    pytest.param(lambda d: _set(d, "wheels", [None]), "$.wheels[0]: expected object, found null", id="wheel null"),
    pytest.param(lambda d: _drop(d, "wheels.0.name"), "$.wheels[0].name: missing", id="wheel without name"),
    pytest.param(lambda d: _set(d, "wheels.0.name", ["x"]), "$.wheels[0].name: expected string", id="name a list"),
    pytest.param(lambda d: _set(d, "wheels.0.missing", 3), "$.wheels[0].missing: expected array", id="missing num"),
    pytest.param(lambda d: _set(d, "wheels.0.missing", [{}]), "$.wheels[0].missing[0]: expected string", id="path {}"),
    pytest.param(lambda d: _set(d, "wheels.0.cuda_major", True), "$.wheels[0].cuda_major: expected integer", id="bool"),
    pytest.param(lambda d: _set(d, "binaries", "bin/app"), "$.binaries: expected array", id="binaries a string"),
    pytest.param(lambda d: _set(d, "binaries", [[]]), "$.binaries[0]: expected object", id="binary a list"),
    pytest.param(lambda d: _drop(d, "binaries.0.path"), "$.binaries[0].path: missing", id="binary without path"),
    pytest.param(
        lambda d: _set(d, "binaries.0.libraries", {}), "$.binaries[0].libraries: expected array", id="libs {}"
    ),
    pytest.param(
        lambda d: _drop(d, "binaries.0.libraries.0.soname"),
        "$.binaries[0].libraries[0].soname: missing",
        id="no soname",
    ),
    pytest.param(
        lambda d: _set(d, "binaries.0.libraries.0.soname", {"a": "b"}),
        "$.binaries[0].libraries[0].soname: expected string",
        id="soname a dict",
    ),
    pytest.param(
        lambda d: _set(d, "wheels.0.name", _deep(500)),
        "$.wheels[0].name: expected string, found array of 1",
        id="deep value",
    ),
    pytest.param(lambda d: _set(d, "extra", 1), "$.extra: not allowed here", id="unknown key"),
    pytest.param(lambda d: _set(d, "driver.archs", ["9.0"]), "$.driver.archs[0]: '9.0' does not match", id="arch"),
    pytest.param(lambda d: _set(d, "driver.source", "guessed"), "$.driver.source: expected one of", id="enum"),
    pytest.param(lambda d: _set(d, "driver.gpus.0.index", -1), "$.driver.gpus[0].index: -1 is less than", id="min"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD)
def test_the_fleet_reader_answers_as_load_snapshot(tmp_path, mutate, message):
    """cudastack fleet's reader remembers verdicts per top-level field: a good file read before a bad one
    does not make the bad one pass, and the message is load_snapshot's."""
    reader = SnapshotReader()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SNAP))
    assert reader.read(str(good)) == SNAP
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(copy.deepcopy(SNAP))))
    with pytest.raises(DataError) as e:
        reader.read(str(bad))
    assert str(e.value).startswith(f"{bad}: not a cudastack snapshot: {message}")
    assert reader.read(str(good)) == SNAP


@pytest.mark.parametrize(("mutate", "message"), BAD)
def test_bad_snapshot_names_the_first_wrong_field(tmp_path, capsys, mutate, message):
    doc = mutate(copy.deepcopy(SNAP))
    assert not VALIDATOR.is_valid(doc)  # jsonschema agrees it is wrong
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(DataError) as e:
        load_snapshot(str(bad))
    assert str(e.value).startswith(f"{bad}: not a cudastack snapshot: {message}")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SNAP))
    for args in (["diff", str(good), str(bad)], ["diff", str(bad), str(good)]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"{bad}: not a cudastack snapshot: {message}" in err
        assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("[" * 100_000, "not JSON: nested too deeply", id="deep nesting"),
        pytest.param('{"a": ' * 50_000 + "1" + "}" * 50_000, "not JSON: nested too deeply", id="deep objects"),
        pytest.param('{"format": 1, "wheels": [{"size": ' + "9" * 5000 + "}]}", "not JSON: Exceeds", id="5000 digits"),
        pytest.param(b"\xff\xfe{}", "not JSON: 'utf-8' codec", id="not utf-8"),
        pytest.param("[]", "not a cudastack snapshot (schema", id="a list"),
        pytest.param("", "not JSON", id="empty"),
    ],
)
def test_not_json_or_deep(tmp_path, text, message):
    bad = tmp_path / "bad.json"
    if isinstance(text, bytes):
        bad.write_bytes(text)
    else:
        bad.write_text(text)
    with pytest.raises(DataError, match="^" + str(bad).replace(".", r"\.") + ": ") as e:
        load_snapshot(str(bad))
    assert message in str(e.value)


def test_legacy_snapshot_reads_but_is_typed(tmp_path):
    old = tmp_path / "old.json"
    legacy = {k: v for k, v in copy.deepcopy(SNAP_V1).items() if k not in ("schema", "version")}
    for wheel in legacy["wheels"]:
        del wheel["gpu_code"]
    old.write_text(json.dumps(legacy))
    assert load_snapshot(str(old))["wheels"][0]["name"] == "nvidia-cublas"
    legacy["wheels"][0]["missing"] = "gone"
    old.write_text(json.dumps(legacy))
    with pytest.raises(DataError, match=r"\$\.wheels\[0\]\.missing: expected array"):
        load_snapshot(str(old))


def test_version_1_snapshot_still_reads(tmp_path):
    old = tmp_path / "v1.json"
    old.write_text(json.dumps(SNAP_V1))
    assert load_snapshot(str(old))["version"] == 1
    old.write_text(json.dumps({**SNAP_V1, "version": 3}))
    with pytest.raises(DataError, match="version 1 or 2 expected"):
        load_snapshot(str(old))


def test_fifo_snapshot_is_refused_without_waiting(tmp_path, capsys):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"fifo\.json: cannot read cudastack snapshot: not a regular file"):
        load_snapshot(str(fifo))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SNAP))
    assert main(["diff", str(fifo), str(good)]) == 2
    assert "fifo.json: cannot read cudastack snapshot: not a regular file" in capsys.readouterr().err
    with pytest.raises(DataError, match="cannot read cudastack snapshot: is a directory"):
        load_snapshot(str(tmp_path))


def test_baseline_usage_errors(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile("def test_x(): pass")
    os.mkfifo(pytester.path / "fifo.json")
    (pytester.path / "typed.json").write_text(json.dumps(_set(copy.deepcopy(SNAP), "wheels.0.missing", 3)))
    (pytester.path / "deep.json").write_text("[" * 100_000)
    for name, message in [
        ("fifo.json", "*fifo.json: cannot read cudastack snapshot: not a regular file"),
        (
            "typed.json",
            "*typed.json: not a cudastack snapshot: $.wheels[[]0[]].missing: expected array, found integer 3",
        ),
        ("deep.json", "*deep.json: not a cudastack snapshot: not JSON: nested too deeply"),
        ("absent.json", "*absent.json: cannot read cudastack snapshot: cannot open: No such file or directory"),
    ]:
        result = pytester.runpytest("-p", "pytest_cudastack.plugin", f"--cudastack-baseline={name}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"ERROR: --cudastack-baseline: {message}"])
        assert "Traceback" not in result.stderr.str() + result.stdout.str()
    monkeypatch.setenv("CUDASTACK_BASELINE", "typed.json")
    result = pytester.runpytest("-p", "pytest_cudastack.plugin")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --cudastack-baseline (from CUDASTACK_BASELINE): *typed.json: *"])


def test_check_baseline_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "typed.json"
    bad.write_text(json.dumps(_set(copy.deepcopy(SNAP), "driver", [])))
    code = main(["check", "--site", str(tmp_path / "none"), "--cuda-driver=580.65.06", f"--cudastack-baseline={bad}"])
    assert code == 2
    assert f"{bad}: not a cudastack snapshot: $.driver: expected object" in capsys.readouterr().err


# -- the validator against jsonschema ------------------------------------------------------------------


def _mutations(rng: random.Random, doc: Any) -> Any:
    """*doc* with one node replaced by a value of some type, or a key dropped or added."""
    doc = copy.deepcopy(doc)
    nodes: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                nodes.append((node, k))
                walk(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                nodes.append((node, i))
                walk(v)

    walk(doc)
    parent, key = rng.choice(nodes)
    values = [
        None,
        True,
        False,
        0,
        1,
        -1,
        1.0,
        1.5,
        "",
        "x",
        "sm_90",
        "compute_90",
        "9.0",
        [],
        [1],
        ["x"],
        {},
        {"a": 1},
    ]
    values += ["pytest-cudastack x", "probed", "declared", "absent", float("nan")]
    action = rng.random()
    if action < 0.15 and isinstance(parent, dict):
        del parent[key]
    elif action < 0.25 and isinstance(parent, dict):
        parent[rng.choice(["extra", "name", "path", "index", "soname"])] = rng.choice(values)
    else:
        parent[key] = copy.deepcopy(rng.choice(values))
    return doc


def test_verdicts_agree_with_jsonschema():
    rng = random.Random("cudastack-schema")
    seen = {True: 0, False: 0}
    for _ in range(3000):
        doc = _mutations(rng, SNAP)
        if rng.random() < 0.3:
            doc = _mutations(rng, doc)
        ours = first_error(doc, SCHEMA) is None
        assert ours == VALIDATOR.is_valid(doc), (first_error(doc, SCHEMA), json.dumps(doc)[:500])
        seen[ours] += 1
    assert seen[True] > 100
    assert seen[False] > 1000


def _schema_keywords(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            out.add(key)
            if key in ("properties", "$defs"):
                for sub in value.values():
                    _schema_keywords(sub, out)
            elif key in ("items", "additionalProperties"):
                _schema_keywords(value, out)


def test_the_snapshot_schema_uses_only_supported_keywords():
    """The schema load_snapshot checks with (the others are output schemas, checked by jsonschema in tests)."""
    keys: set[str] = set()
    _schema_keywords(SCHEMA, keys)
    unsupported = keys - KEYWORDS - schemacheck._ANNOTATIONS
    assert not unsupported, f"snapshot.schema.json: schemacheck does not implement {sorted(unsupported)}"


def test_unsupported_keyword_is_refused_not_ignored():
    with pytest.raises(ValueError, match="not supported"):
        first_error(1, {"type": "integer", "maximum": 0})
    with pytest.raises(ValueError, match="not supported"):
        first_error(1, {"$ref": "other.json#/x"})


@pytest.mark.parametrize(
    "value",
    [None, {"sass": ["sm_90"], "ptx": []}, {"sass": 3, "ptx": []}, "x", [], {"sass": ["sm_90"]}],
)
def test_any_of_agrees_with_jsonschema(value: Any) -> None:
    """``anyOf`` (the snapshot's nullable ``gpu_code``): valid when one alternative accepts, as jsonschema."""
    schema = {
        "$defs": {
            "code": {
                "type": "object",
                "required": ["sass", "ptx"],
                "properties": {"sass": {"type": "array", "items": {"type": "string"}}, "ptx": {"type": "array"}},
            }
        },
        "type": "object",
        "properties": {"gpu_code": {"anyOf": [{"$ref": "#/$defs/code"}, {"type": "null"}]}},
    }
    doc = {"gpu_code": value}
    ours = first_error(doc, schema)
    assert (ours is None) == jsonschema.Draft202012Validator(schema).is_valid(doc)
    if ours is not None:
        assert ours.startswith("$.gpu_code")
