"""Property-based checks of this round's new parsers (issue #14, Deliver 7; the long runs are fuzz/'s):
the snapshot validator agrees with jsonschema on snapshots with any subtree replaced by any JSON value;
``load_snapshot`` lets only DataError out, whatever the bytes; ``cudastack loaded``'s report parser
accepts only well-typed reports."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_cudastack.cli.loaded import parse_report
from pytest_cudastack.errors import DataError
from pytest_cudastack.schemacheck import first_error
from pytest_cudastack.stack import load_snapshot
from tests.test_robust_snapshot import SCHEMA, SNAP, VALIDATOR

SETTINGS = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["sm_90", "compute_90", "probed", "declared", "absent", "pytest-cudastack x", "9.0"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


PATHS = [p for p in _paths(SNAP) if p]


@SETTINGS
@given(path=st.sampled_from(PATHS), value=json_values, drop=st.booleans())
def test_validator_agrees_with_jsonschema(path: tuple[Any, ...], value: Any, drop: bool) -> None:
    doc = copy.deepcopy(SNAP)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if drop and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    assert (first_error(doc, SCHEMA) is None) == VALIDATOR.is_valid(doc)


@SETTINGS
@given(data=st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()))
def test_load_snapshot_only_raises_data_error(tmp_path_factory: Any, data: bytes) -> None:
    path = tmp_path_factory.mktemp("snap") / "s.json"
    path.write_bytes(data)
    error: DataError | None = None
    try:
        doc = load_snapshot(str(path))
    except DataError as e:
        error = e
    if error is not None:
        assert str(error).startswith(f"{path}: ")
    else:
        assert VALIDATOR.is_valid(doc) or "schema" not in doc


@SETTINGS
@given(data=st.binary(max_size=200) | json_values.map(lambda v: json.dumps({"paths": v, "error": None}).encode()))
def test_loaded_report_parser(data: bytes) -> None:
    got = parse_report(data)
    if got is not None:
        paths, error = got
        assert all(isinstance(p, str) and p.startswith("/") for p in paths)
        assert error is None or error.isprintable()
