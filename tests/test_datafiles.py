"""Every shipped data file is checked by the one header rule (``cuda/datafile.check_data``) and its schema.

For each of the nine files: an unknown top-level key, an empty ``sources`` (or an empty citation in it) and a
duplicated row each raise ``DataError`` naming the file; the shipped file itself passes, and its schema is a
valid draft 2020-12 schema that jsonschema agrees with.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import pytest_cudastack
from pytest_cudastack.cuda import compat, container, dlopen, driverlookup, driversyms, frameworks, gpucode, toolchain
from pytest_cudastack.errors import DataError
from pytest_cudastack.model import torchindex

PACKAGE = Path(pytest_cudastack.__file__).parent
SCHEMAS = PACKAGE / "cuda" / "data" / "schemas"

# file (under the package), its validator, the first row table, the header key that holds its citations
FILES: list[tuple[str, Callable[[Any, str], object], str, str]] = [
    ("cuda/data/cuda_compat.json", compat.validate_compat, "toolkit_drivers", "sources"),
    ("cuda/data/framework_rules.json", frameworks.validate_rules, "libraries", "sources"),
    ("cuda/data/gpu_code.json", gpucode.validate_gpu_code, "ptx_isa", "sources"),
    ("cuda/data/toolchain.json", toolchain.validate_toolchain, "frameworks", "sources"),
    ("cuda/data/dlopen_targets.json", dlopen.validate_dlopen_targets, "targets", "sources"),
    ("cuda/data/dlopen_targets.json", dlopen.validate_preloads, "preloads", "sources"),
    ("cuda/data/driver_symbols.json", driversyms.validate_entry_points, "rows", "source"),
    ("model/data/torch_indexes.json", torchindex.validate_indexes, "indexes", "sources"),
    ("cuda/data/container_runtime.json", container.validate_runtime, "driver_libraries", "sources"),
    ("cuda/data/driver_lookups.json", driverlookup.validate_driver_lookups, "lookups", "sources"),
]
IDS = [f"{Path(f).stem}:{table}" for f, _, table, _ in FILES]


def _raw(name: str) -> Any:
    return json.loads((PACKAGE / name).read_text())


@pytest.mark.parametrize(("name", "validate", "table", "header"), FILES, ids=IDS)
def test_shipped_file_passes_and_its_schema_agrees_with_jsonschema(name, validate, table, header) -> None:
    raw = _raw(name)
    validate(copy.deepcopy(raw), name)
    schema = json.loads((SCHEMAS / f"{Path(name).stem}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(raw)


def _unknown_key(raw: dict[str, Any], table: str, header: str) -> None:
    raw["bogus"] = 1


def _empty_sources(raw: dict[str, Any], table: str, header: str) -> None:
    raw[header] = {}


def _empty_citation(raw: dict[str, Any], table: str, header: str) -> None:
    if header == "source":  # driver_symbols.json: one source, the header it was generated from
        raw[header]["sha256"] = ""
    else:
        raw[header][next(iter(raw[header]))] = {}


def _duplicate_row(raw: dict[str, Any], table: str, header: str) -> None:
    raw[table].append(copy.deepcopy(raw[table][0]))


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        pytest.param(_unknown_key, r"unknown top-level key\(s\) bogus", id="unknown top-level key"),
        pytest.param(_empty_sources, r"(sources' must be a non-empty object|source\.file: missing)", id="no source"),
        pytest.param(_empty_citation, r"(sources\[.*\] needs|source\.sha256: '' does not match)", id="empty source"),
        pytest.param(_duplicate_row, r"\[\d+\]: duplicate row .* \(as \w+\[0\]\)", id="duplicate row"),
    ],
)
@pytest.mark.parametrize(("name", "validate", "table", "header"), FILES, ids=IDS)
def test_broken_header_names_the_file(name, validate, table, header, mutate, says: str) -> None:
    raw = _raw(name)
    mutate(raw, table, header)
    with pytest.raises(DataError, match=f"^{name}: .*{says}"):
        validate(raw, name)


def test_object_rows_cite_a_listed_source() -> None:
    raw = _raw("cuda/data/cuda_compat.json")
    raw["wheels"]["local_version"]["source"] = "nowhere"
    with pytest.raises(DataError, match=r"^c\.json: wheels\.local_version: source 'nowhere' is not listed"):
        compat.validate_compat(raw, "c.json")


def test_schemas_load_once_on_first_use() -> None:
    from pytest_cudastack.cuda import datafile

    datafile._schema.cache_clear()
    for name, validate, _, _ in FILES:
        validate(_raw(name), name)
    assert datafile._schema.cache_info().misses == 9
