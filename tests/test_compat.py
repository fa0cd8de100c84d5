"""compat.py, flavour.py, verdicts.py: the data file's validator (shipped file and broken copies), lookups, wheel
flavours and verdicts, table-driven."""

from __future__ import annotations

import copy
import importlib.metadata
import itertools
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from pytest_cudastack.cuda import compat
from pytest_cudastack.cuda.compat import (
    arch_cuda_range,
    cuda_for_driver,
    is_driver_soname,
    load_compat,
    min_driver_for_cuda,
    mvc_floor,
    soname_cuda_majors,
    toolkit_sm_targets,
    validate_compat,
)
from pytest_cudastack.cuda.driver import DriverInfo, Gpu, declared_driver
from pytest_cudastack.cuda.flavour import cuda_major_for_soname_in_wheel, wheel_cuda_flavour, wheel_cuda_requirement
from pytest_cudastack.cuda.verdicts import driver_verdict, gpu_verdict
from pytest_cudastack.errors import DataError, RuleError


@pytest.fixture(autouse=True)
def _clear_caches():
    load_compat.cache_clear()
    yield
    load_compat.cache_clear()


def _raw() -> dict[str, Any]:
    text = resources.files("pytest_cudastack.cuda").joinpath("data/cuda_compat.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _driver(version: str | None, cuda: str | None = None, **kw: Any) -> DriverInfo:
    return DriverInfo("declared", version, cuda, **kw)


# --------------------------------------------------------------------------------------------- the data file


def test_shipped_file_validates():
    data = validate_compat(_raw(), "cuda_compat.json")
    assert data.toolkits
    assert data.branches
    assert data.sonames
    assert data.archs
    assert load_compat() is load_compat()  # cached


def test_every_row_cites_a_listed_source():
    raw = _raw()
    sources = set(raw["sources"])
    tables = [
        raw[k]
        for k in (
            "toolkit_drivers",
            "mvc_floors",
            "driver_branches",
            "sonames",
            "driver_sonames",
            "archs",
            "sm_targets",
        )
    ]
    tables += [raw["wheels"][k] for k in ("name_rules", "meta_packages", "unsuffixed", "install_dirs")]
    for table in tables:
        for row in table:
            assert row["source"] in sources, row
    for entry in raw["sources"].values():
        assert entry["url"].startswith("https://")


def test_unconfirmed_rows_are_flagged_not_used():
    raw = _raw()
    r615 = [b for b in raw["driver_branches"] if b["branch"] == 615]
    assert r615
    assert r615[0].get("unconfirmed") is True
    assert all(b.branch != 615 for b in load_compat().confirmed_branches)
    assert min_driver_for_cuda("13.4") is None  # 13.4's floor is unconfirmed: unknown, never a failure
    assert not any(t["toolkit"].startswith(("13.4", "13.5")) for t in raw["toolkit_drivers"])


def _mutate(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(_raw())
    target: Any = raw
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


_DELETE = object()


def _falling_drivers() -> dict[str, Any]:
    raw = copy.deepcopy(_raw())
    rows = raw["toolkit_drivers"]
    i = next(n for n, r in enumerate(rows) if r["toolkit"] == "12.4.1")
    rows[i]["driver"] = "545.0"
    return raw


def _unsorted_branches() -> dict[str, Any]:
    raw = copy.deepcopy(_raw())
    raw["driver_branches"][3], raw["driver_branches"][4] = raw["driver_branches"][4], raw["driver_branches"][3]
    return raw


def _duplicate_soname() -> dict[str, Any]:
    raw = copy.deepcopy(_raw())
    raw["sonames"].append(dict(raw["sonames"][0]))
    return raw


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param([], "top level must be an object", id="not an object"),
        pytest.param(_mutate(("schema",), 2), "unsupported schema", id="schema"),
        pytest.param(_mutate(("bogus",), 1), "unknown top-level key(s) bogus", id="unknown top key"),
        pytest.param(_mutate(("sources",), {}), "'sources' must be a non-empty object", id="no sources"),
        pytest.param(_mutate(("sources", "mvc", "retrieved"), "yesterday"), "sources['mvc']", id="bad date"),
        pytest.param(
            _mutate(("toolkit_drivers", 0, "source"), "nowhere"),
            "toolkit_drivers[0]: source 'nowhere'",
            id="unlisted source",
        ),
        pytest.param(
            _mutate(("toolkit_drivers", 0, "source"), ["mvc"]),
            "toolkit_drivers[0]: source ['mvc']",
            id="source a list (unhashable)",
        ),
        pytest.param(
            _mutate(("forward_compat", "source"), {"a": 1}),
            "forward_compat: source {'a': 1}",
            id="forward source an object",
        ),
        pytest.param(
            _mutate(("toolkit_drivers", 5, "driver"), "five hundred"), "toolkit_drivers[5]: 'driver'", id="bad driver"
        ),
        pytest.param(
            _mutate(("toolkit_drivers", 2, "extra"), 1),
            "toolkit_drivers[2].extra: not allowed here",
            id="unknown row key",
        ),
        pytest.param(
            _mutate(("toolkit_drivers", 1, "toolkit"), _DELETE),
            "toolkit_drivers[1].toolkit: missing",
            id="missing key",
        ),
        pytest.param(_falling_drivers(), "minimum drivers must rise", id="falling minimum driver"),
        pytest.param(_mutate(("toolkit_drivers",), []), "'toolkit_drivers' must be a non-empty list", id="empty"),
        pytest.param(_mutate(("mvc_floors", 0, "below"), "100"), "mvc_floors[0]: 'below'", id="below under floor"),
        pytest.param(_unsorted_branches(), "driver_branches[4]", id="unsorted branches"),
        pytest.param(_mutate(("driver_branches", 2, "cuda"), "eleven"), "driver_branches[2]: 'cuda'", id="bad cuda"),
        pytest.param(
            _mutate(("driver_branches", 2, "unconfirmed"), "yes"),
            "driver_branches[2].unconfirmed: expected boolean",
            id="unconfirmed not bool",
        ),
        pytest.param(_mutate(("sonames", 0, "majors"), []), "sonames[0]: 'majors'", id="empty majors"),
        pytest.param(_mutate(("sonames", 0, "regex"), "^libx$"), "sonames[0]: needs exactly one", id="soname+regex"),
        pytest.param(_duplicate_soname(), "duplicate row", id="duplicate soname"),
        pytest.param(_mutate(("wheels", "name_rules", 0, "regex"), "-cu("), "wheels.name_rules[0]", id="bad regex"),
        pytest.param(
            _mutate(("wheels", "install_dirs", 0, "regex"), "nvidia/cu13/lib"),
            "(?P<major>...) group",
            id="regex without major",
        ),
        pytest.param(
            _mutate(("wheels", "unsuffixed", 0, "min_version"), "x.y"), "wheels.unsuffixed[0]", id="bad min_version"
        ),
        pytest.param(_mutate(("archs", 0, "cc"), "sm_35"), "archs[0]: 'cc'", id="bad cc"),
        pytest.param(_mutate(("archs", 0, "last_major"), 5), "archs[0]: last_major", id="last before first"),
        pytest.param(_mutate(("sm_targets", 0, "sm"), ["sm_xx"]), "sm_targets[0]: 'sm'", id="bad sm"),
        pytest.param(_mutate(("forward_compat",), {}), "forward_compat: source None", id="forward compat"),
    ],
)
def test_validator_rejects_broken_copies(raw: Any, expected: str):
    with pytest.raises(DataError) as info:
        validate_compat(raw, "broken.json")
    assert str(info.value).startswith("broken.json")
    assert expected in str(info.value)


def test_load_compat_names_the_file_on_bad_json(monkeypatch: pytest.MonkeyPatch):
    class Broken:
        def joinpath(self, name: str) -> Broken:
            return self

        def read_text(self, encoding: str) -> str:
            return "{not json"

    monkeypatch.setattr("pytest_cudastack.cuda.datafile.resources.files", lambda package: Broken())
    with pytest.raises(DataError, match=r"data/cuda_compat.json: cannot read"):
        load_compat()


# --------------------------------------------------------------------------------------------- lookups


@pytest.mark.parametrize(
    ("cuda", "driver"),
    [
        ("12.4", "550.54.14"),
        ("12.4.0", "550.54.14"),
        ("12.4.1", "550.54.15"),
        ("12.2.2", "535.104.05"),
        ("12.8", "570.26"),
        ("12.9.1", "575.57.08"),
        ("13.0", "580.65.06"),
        ("13.0.2", "580.95.05"),
        ("13.2.2", "595.71.05"),
        ("13.3", "610.43.02"),
        ("11.0", "450.51.05"),  # GA, not the RC
        ("11.8", "520.61.05"),
        ("12.7", "565"),  # no 12.7 toolkit; the branch that reports it
        ("13.4", None),
        ("13.5", None),
        ("14.0", None),
    ],
)
def test_min_driver_for_cuda(cuda: str, driver: str | None):
    assert min_driver_for_cuda(cuda) == driver


def test_toolkit_minimum_drivers_rise():
    rows = load_compat().toolkits
    assert all(a.driver <= b.driver and a.toolkit < b.toolkit for a, b in itertools.pairwise(rows))


@pytest.mark.parametrize(("major", "floor"), [(13, "580"), (12, "525"), (11, "450.80.02"), (10, None), (14, None)])
def test_mvc_floor(major: int, floor: str | None):
    assert mvc_floor(major) == floor


BRANCHES = [(b.branch, str(b.cuda)) for b in compat.load_compat().branches]
compat.load_compat.cache_clear()


@pytest.mark.parametrize(("branch", "cuda"), BRANCHES, ids=[f"R{b}" for b, _ in BRANCHES])
def test_cuda_for_every_branch(branch: int, cuda: str):
    found = cuda_for_driver(f"{branch}.10.01")
    if branch == 615:  # unconfirmed: the confirmed lower bound (R610) is used
        assert str(found) == "13.3"
    else:
        assert str(found) == cuda


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [("550.54.15", "12.4"), ("565.57.01", "12.7"), ("551.1", "12.4"), ("440.33", None), ("garbage", None)],
)
def test_cuda_for_driver(driver: str, cuda: str | None):
    found = cuda_for_driver(driver)
    assert (str(found) if found is not None else None) == cuda


@pytest.mark.parametrize(
    ("soname", "majors"),
    [
        ("libcudart.so.11.0", {11}),
        ("libcudart.so.12", {12}),
        ("libcudart.so.13", {13}),
        ("libcublas.so.13", {13}),
        ("libcublasLt.so.12", {12}),
        ("libcufft.so.11", {12}),
        ("libcufft.so.12", {13}),
        ("libcurand.so.10", {11, 12, 13}),
        ("libcusolver.so.11", {11, 12}),
        ("libcusolver.so.12", {13}),
        ("libcusparse.so.12", {12, 13}),
        ("libnvrtc.so.11.2", {11}),
        ("libnvrtc-builtins.so.12.9", {12}),
        ("libnvrtc-builtins.alt.so.13.0", {13}),
        ("libnvJitLink.so.13", {13}),
        ("libcupti.so.11.8", {11}),
        ("libnppc.so.13", {13}),
        ("libnvToolsExt.so.1", {11, 12}),
        ("libnvtx3interop.so.1", {12, 13}),
        ("libcudnn.so.9", {11, 12, 13}),
        ("libcudnn_ops.so.9", {11, 12, 13}),
        ("libcudnn_ops_infer.so.8", {11, 12}),
        ("libnccl.so.2", {11, 12, 13}),
        ("libnvvm.so.4", {11, 12, 13}),
        ("libcuda.so.1", None),
        ("libc.so.6", None),
    ],
)
def test_soname_cuda_majors(soname: str, majors: set[int] | None):
    found = soname_cuda_majors(soname)
    assert (set(found) if found is not None else None) == majors


@pytest.mark.parametrize(
    ("soname", "wheel_major", "majors"),
    [
        ("libcudnn.so.9", 12, {12}),
        ("libcudnn.so.9", None, {11, 12, 13}),
        ("libcudart.so.12", 13, {12}),
        ("libfoo.so", 12, None),
    ],
)
def test_cuda_major_for_soname_in_wheel(soname: str, wheel_major: int | None, majors: set[int] | None):
    found = cuda_major_for_soname_in_wheel(soname, wheel_major)
    assert (set(found) if found is not None else None) == majors


@pytest.mark.parametrize(
    ("soname", "expected"),
    [
        ("libcuda.so.1", True),
        ("libnvidia-ml.so.1", True),
        ("libnvidia-ptxjitcompiler.so.1", True),
        ("libnvidia-nvvm.so.4", True),
        ("libcudadebugger.so.1", True),
        ("libnvcuvid.so.1", True),
        ("libnvidia-encode.so.1", True),
        ("libnvvm.so.4", False),  # the toolkit's NVVM
        ("libcudart.so.12", False),
        ("libc.so.6", False),
    ],
)
def test_is_driver_soname(soname: str, expected: bool):
    assert is_driver_soname(soname) is expected


@pytest.mark.parametrize(
    ("cc", "span"),
    [
        ("3.5", (7, 11)),
        ("sm_37", (7, 11)),
        ("5.0", (7, 12)),
        ("sm_70", (9, 12)),
        ("7.2", (9, 12)),
        ("7.5", (10, None)),
        ("8.0", (11, None)),
        ("sm_86", (11, None)),
        ("9.0", (11, None)),
        ("sm_90a", (11, None)),
        ("10.0", (12, None)),
        ("10.1", (12, 12)),
        ("12.0", (12, None)),
        ("11.0", (13, None)),
        ("sm_20", None),
        ("banana", None),
    ],
)
def test_arch_cuda_range(cc: str, span: tuple[int, int | None] | None):
    assert arch_cuda_range(cc) == span


def test_toolkit_sm_targets():
    sm130 = toolkit_sm_targets("13.0")
    sm126 = toolkit_sm_targets("12.6.3")
    assert sm130 is not None
    assert sm126 is not None
    assert "sm_70" not in sm130
    assert "sm_75" in sm130
    assert "sm_110" in sm130
    assert "sm_70" in sm126
    assert "sm_100" not in sm126
    assert "sm_107" in (toolkit_sm_targets("13.4") or ())
    assert toolkit_sm_targets("10.2") is None


# --------------------------------------------------------------------------------------------- wheels

TORCH_2141_REQUIRES = (
    "filelock",
    "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; "
    'platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
    "cuda-bindings<14,>=13.0.3; platform_system == 'Linux'",
    'optree>=0.13.0; extra == "optree"',
)


@pytest.mark.parametrize(
    ("name", "version", "requires", "paths", "cuda", "evidence"),
    [
        pytest.param("nvidia-cuda-runtime-cu12", "12.9.79", (), (), "12.9", "name suffix -cu12", id="runtime-cu12"),
        pytest.param("nvidia_cublas_cu12", "12.9.1.4", (), (), "12", "name suffix -cu12", id="cublas-cu12 normalised"),
        pytest.param("nvidia-cudnn-cu13", "9.24.0.43", (), (), "13", "name suffix -cu13", id="cudnn-cu13"),
        pytest.param("nvidia-cudnn-cu11", "9.10.2.21", (), (), "11", "name suffix -cu11", id="cudnn-cu11"),
        pytest.param("nvidia-cuda-runtime", "13.0.96", (), (), "13.0", "unsuffixed nvidia-cuda-runtime", id="rt13"),
        pytest.param("nvidia-cuda-runtime", "13.5.37", (), (), "13.5", "unsuffixed", id="rt13.5"),
        pytest.param("nvidia-cublas", "13.1.1.3", (), (), "13", "unsuffixed nvidia-cublas", id="cublas13"),
        pytest.param("nvidia-cufft", "12.0.0.61", (), (), "13", "unsuffixed nvidia-cufft", id="cufft 12.x is CUDA 13"),
        pytest.param("nvidia-curand", "10.4.0.35", (), (), "13", "unsuffixed", id="curand 10.4"),
        pytest.param("nvidia-cusolver", "12.0.4.66", (), (), "13", "unsuffixed", id="cusolver 12"),
        pytest.param("nvidia-cusparse", "12.6.3.3", (), (), "13", "unsuffixed", id="cusparse 12.6"),
        pytest.param("nvidia-nvjitlink", "13.4.92", (), (), "13.4", "unsuffixed", id="nvjitlink"),
        pytest.param("nvidia-cufile", "1.15.1.6", (), (), "13", "unsuffixed", id="cufile 1.15"),
        pytest.param("nvidia-cusparse", "12.1.0", (), (), None, "older than the CUDA 13 series", id="old unsuffixed"),
        pytest.param("torch", "2.14.1+cu130", (), (), "13.0", "local version +cu130", id="torch +cu130"),
        pytest.param("torch", "2.11.0+cu128", (), (), "12.8", "local version +cu128", id="torch +cu128"),
        pytest.param("torch", "2.7.0+cu118", (), (), "11.8", "local version +cu118", id="torch +cu118"),
        pytest.param("torch", "2.11.0+cpu", (), (), None, "not a CUDA build", id="torch +cpu"),
        pytest.param(
            "torch",
            "2.14.1",
            TORCH_2141_REQUIRES,
            (),
            "13.0",
            "pins cuda-toolkit==13.0.3",
            id="plain torch pins cuda-toolkit",
        ),
        pytest.param(
            "torch",
            "2.9.0",
            ("nvidia-cuda-runtime-cu12==12.8.90; platform_system == 'Linux'", "nvidia-cudnn-cu12==9.10.2.21"),
            (),
            "12.8",
            "pins nvidia-cuda-runtime-cu12==12.8.90",
            id="torch pins cu12",
        ),
        pytest.param(
            "pkg",
            "1",
            ("nvidia-nvjitlink>=13.0.88,<14",),
            (),
            "13.0",
            "pins nvidia-nvjitlink<14,>=13.0.88",
            id="lower bound",
        ),
        pytest.param(
            "pkg",
            "1",
            ("nvidia-cuda-runtime-cu12==12.*",),
            (),
            "12",
            "pins nvidia-cuda-runtime-cu12==12.*",
            id="wildcard pin",
        ),
        pytest.param(
            "jax", "0.5", ("nvidia-cudnn-cu12>=9",), (), "12", "pins nvidia-cudnn-cu12>=9", id="unpinned cu12 dep"
        ),
        pytest.param(
            "mixed",
            "1",
            ("nvidia-cudnn-cu12==9.1", "nvidia-nccl-cu13==2.30.7"),
            (),
            None,
            "several CUDA majors",
            id="conflicting pins",
        ),
        pytest.param(
            "pkg", "1", ('nvidia-cudnn-cu12; extra == "gpu"',), (), None, "no CUDA evidence", id="extras only"
        ),
        pytest.param("cuda-toolkit", "13.0.3.0", (), (), "13.0", "cuda-toolkit meta package", id="cuda-toolkit"),
        pytest.param("cuda-toolkit", "12.9.1", (), (), "12.9", "cuda-toolkit meta package", id="cuda-toolkit 12"),
        pytest.param(
            "something", "1.0", (), ("nvidia/cu13/lib/libfoo.so.1",), "13", "ships nvidia/cu13/lib", id="install dir"
        ),
        pytest.param("requests", "2.32.0", ("urllib3",), (), None, "no CUDA evidence", id="not CUDA"),
    ],
)
def test_wheel_cuda_requirement(
    name: str, version: str, requires: tuple[str, ...], paths: tuple[str, ...], cuda: str | None, evidence: str
):
    found, why = wheel_cuda_requirement(name, version, requires, paths)
    assert found == cuda
    assert evidence in why
    major, why2 = wheel_cuda_flavour(name, version, requires, paths)
    assert major == (int(cuda.split(".")[0]) if cuda else None)
    assert why2 == why


# --------------------------------------------------------------------------------------------- verdicts


def _prev_driver(text: str) -> str:
    """A driver version just below ``text`` ("580" -> "579.99.99", "450.80.02" -> "450.80.01")."""
    parts = [int(p) for p in text.split(".")]
    if len(parts) == 1:
        return f"{parts[0] - 1}.99.99"
    if parts[-1] > 0:
        parts[-1] -= 1
        return ".".join(f"{p:02d}" if i else str(p) for i, p in enumerate(parts))
    return f"{parts[0]}.{parts[1] - 1}.99"


CONFIRMED = [(b.branch, b.cuda) for b in compat.load_compat().confirmed_branches]
compat.load_compat.cache_clear()


@pytest.mark.parametrize(("branch", "cuda"), CONFIRMED, ids=[f"R{b}" for b, _ in CONFIRMED])
def test_verdict_every_branch(branch: int, cuda: Version):
    driver = declared_driver(f"{branch}.50.01")
    assert driver.cuda_version == f"{cuda.major}.{cuda.minor}"
    here = f"{cuda.major}.{cuda.minor}"
    assert driver_verdict(here, driver).status == "compatible"
    assert driver_verdict(f"{cuda.major}.0", driver).status == "compatible"
    if cuda.major > 11:  # backward compatibility: an older major runs on a newer driver
        assert driver_verdict(f"{cuda.major - 1}.0", driver).status == "compatible"
    newer_minor = driver_verdict(f"{cuda.major}.{cuda.minor + 1}", driver)
    floor = mvc_floor(cuda.major)
    assert floor is not None
    assert newer_minor.status == ("mvc" if Version(f"{branch}.50.01") >= Version(floor) else "incompatible"), (
        newer_minor.message
    )
    if newer_minor.status == "mvc":
        assert "PTX" in newer_minor.message
        assert newer_minor.via == "minor-version compatibility"
    next_major = driver_verdict(f"{cuda.major + 1}.0", driver)
    assert next_major.status == "incompatible", next_major.message


def test_verdict_beyond_the_data_is_unknown():
    newest = compat.load_compat().confirmed_branches[-1]
    driver = declared_driver(f"{newest.branch + 10}.1")
    verdict = driver_verdict(f"{newest.cuda.major + 1}.0", driver)
    assert verdict.status == "unknown"
    assert "newer than the compatibility data" in verdict.message
    assert driver_verdict(str(newest.cuda), driver).status == "compatible"


FLOORS = [(f.major, f.driver_text) for f in compat.load_compat().mvc_floors]
compat.load_compat.cache_clear()


@pytest.mark.parametrize(("major", "floor"), FLOORS, ids=[f"CUDA {m}" for m, _ in FLOORS])
def test_verdict_both_sides_of_every_floor(major: int, floor: str):
    required = f"{major}.1"  # a minor above the major's first release: needs MVC at the floor
    at = driver_verdict(required, declared_driver(floor if "." in floor else f"{floor}.00.01"))
    assert at.status in ("mvc", "compatible"), at.message
    below = driver_verdict(required, declared_driver(_prev_driver(floor)))
    assert below.status == "incompatible", below.message
    assert f"CUDA {major} needs driver ≥ {floor}" in below.message


def test_forward_compat_verdicts():
    h100 = Gpu(0, "NVIDIA H100 80GB HBM3", None, "9.0", None, None)
    rtx = Gpu(0, "NVIDIA GeForce RTX 4090", None, "8.9", None, None)
    # NVML reports the compat libcuda's CUDA (13.0); the kernel driver (R550) decides the native range
    dc = _driver("550.54.15", "13.0", forward_compat="580.65.06", gpus=(h100,))
    verdict = driver_verdict("13.0", dc)
    assert verdict.status == "mvc"
    assert verdict.via == "forward compatibility"
    assert driver_verdict("12.4", dc).status == "compatible"
    geforce = driver_verdict("13.0", _driver("550.54.15", "13.0", forward_compat="580.65.06", gpus=(rtx,)))
    assert geforce.status == "incompatible"
    assert "GeForce" in geforce.message
    assert "804" in geforce.message


def test_incident1_message():
    verdict = driver_verdict("13.0", declared_driver("550.54.15"), subject="torch 2.14.1+cu130")
    assert verdict.status == "incompatible"
    assert verdict.failing
    assert verdict.message == (
        "torch 2.14.1+cu130 needs CUDA 13.0; driver 550.54.15 (declared) supports CUDA ≤ 12.4 "
        "(12.x via minor-version compatibility); CUDA 13 needs driver ≥ 580"
    )


@pytest.mark.parametrize(
    ("required", "driver", "status", "text"),
    [
        pytest.param("12.9", _driver("550.54.15"), "mvc", "minor-version compatibility", id="550 runs 12.9 via MVC"),
        pytest.param("12.7", _driver("565.57.01"), "compatible", "CUDA ≤ 12.7", id="R565 reports 12.7"),
        pytest.param("12", _driver("550.54.15"), "compatible", "CUDA 12 is required", id="major only"),
        pytest.param("12.4.1", _driver("550.54.15"), "compatible", "", id="patch level"),
        pytest.param("13.4", _driver("615.71.09"), "mvc", "", id="unconfirmed R615 never fails 13.4"),
        pytest.param("13.0", _driver(None, "13.0"), "compatible", "", id="cuda only"),
        pytest.param("13.1", _driver(None, "13.0"), "mvc", "", id="cuda only, newer minor"),
        pytest.param(
            "13.0",
            DriverInfo("absent", None, None, reason="nvmlInit: driver not loaded"),
            "unknown",
            "driver not loaded",
            id="absent",
        ),
        pytest.param("13.0", _driver("400.1"), "unknown", "not in the compatibility data", id="ancient driver"),
        pytest.param("13.1", declared_driver("R580"), "mvc", "minor-version compatibility", id="R580 at the floor"),
        pytest.param("12.9", declared_driver("R575"), "compatible", "CUDA ≤ 12.9", id="R575"),
        pytest.param(
            "11.1",
            declared_driver("R450"),
            "unknown",
            "needs driver ≥ 450.80.02, and the minor version of branch R450 is not known",
            id="R450: MVC floor inside the branch",
        ),
        pytest.param("11.1", declared_driver("450.80.02"), "mvc", "", id="450.80.02 at the floor"),
        pytest.param("11.1", declared_driver("450.51.06"), "incompatible", "needs driver ≥ 450.80.02", id="450.51"),
        pytest.param(
            "14.0",
            _driver("595.45.04"),
            "incompatible",
            "no driver in the compatibility data supports",
            id="unknown major",
        ),
        pytest.param(
            "13.0",
            _driver("550.54.15", "12.4", forward_compat="580.65.06"),
            "mvc",
            "data-center GPUs",
            id="forward compatibility",
        ),
        pytest.param(
            "13.2",
            _driver("550.54.15", "12.4", forward_compat="580.65.06"),
            "incompatible",
            "",
            id="forward compat too old",
        ),
    ],
)
def test_driver_verdict_cases(required: str, driver: DriverInfo, status: str, text: str):
    verdict = driver_verdict(required, driver)
    assert verdict.status == status, verdict.message
    assert text in verdict.message


def test_compat_does_not_import_the_driver_probe():
    """compat is below verdicts and driver: loading the data pulls in neither (no import cycle)."""
    code = (
        "import sys, pytest_cudastack.cuda.compat as c; c.load_compat(); "
        "print(sorted(m for m in sys.modules if m.startswith('pytest_cudastack.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [
        "['pytest_cudastack.cuda',",
        "'pytest_cudastack.cuda.compat',",
        "'pytest_cudastack.cuda.datafile',",
        "'pytest_cudastack.cuda.versions',",
        "'pytest_cudastack.errors',",
        "'pytest_cudastack.schemacheck']",
    ]


@pytest.mark.parametrize("bad", ["twelve", "", "12.x", "v12"])
def test_driver_verdict_bad_requirement(bad: str):
    with pytest.raises(RuleError, match="invalid CUDA version"):
        driver_verdict(bad, _driver("550.54.15"))


@pytest.mark.parametrize(
    ("cc", "major", "status"),
    [
        ("sm_70", 13, "incompatible"),  # V100 with CUDA 13
        ("7.0", 12, "compatible"),
        ("7.2", 13, "incompatible"),
        ("6.1", 13, "incompatible"),
        ("7.5", 13, "compatible"),
        ("3.7", 12, "incompatible"),  # K80 with CUDA 12
        ("3.7", 11, "compatible"),
        ("9.0", 13, "compatible"),
        ("sm_90a", 12, "compatible"),
        ("10.0", 11, "incompatible"),  # Blackwell needs CUDA 12.8
        ("11.0", 12, "incompatible"),
        ("10.1", 13, "incompatible"),  # renamed 11.0 in CUDA 13
        ("2.0", 12, "unknown"),
    ],
)
def test_gpu_verdict(cc: str, major: int, status: str):
    verdict = gpu_verdict(cc, major)
    assert verdict.status == status, verdict.message


def test_gpu_verdict_message_and_bad_arch():
    verdict = gpu_verdict("sm_70", 13)
    assert "CUDA 13 no longer supports compute capability 7.0 (sm_70)" in verdict.message
    with pytest.raises(RuleError, match="invalid GPU architecture 'volta'"):
        gpu_verdict("volta", 13)


@pytest.mark.parametrize("bad", ["twelve", "12.x", ""])
def test_lookups_reject_malformed_versions(bad: str):
    with pytest.raises(RuleError, match="invalid CUDA version"):
        min_driver_for_cuda(bad)
    with pytest.raises(RuleError, match="invalid CUDA version"):
        toolkit_sm_targets(bad)


# --------------------------------------------------------------------------------------------- real wheels


def _torch_site() -> Path:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not Path(venv).is_dir():
        pytest.skip("CUDASTACK_TORCH_VENV unset or absent")
    sites = sorted(Path(venv).glob("lib/python3*/site-packages"))
    if not sites:
        pytest.skip(f"no site-packages under {venv}")
    return sites[0]


@pytest.mark.real
def test_real_torch_venv_flavours():
    """torch 2.14.1 (no local version) with the unsuffixed CUDA 13 wheels: every CUDA wheel is CUDA 13."""
    site = _torch_site()
    seen: dict[str, tuple[str | None, str]] = {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        name = dist.metadata["Name"]
        files = [str(f) for f in dist.files or ()]
        seen[canonicalize_name(name)] = wheel_cuda_requirement(name, dist.version, dist.requires or (), files)
    assert seen["torch"][0] == "13.0"
    assert "cuda-toolkit" in seen["torch"][1]
    for name, (cuda, evidence) in seen.items():
        if name.startswith("nvidia-") or name in ("cuda-toolkit", "torch"):
            assert cuda is not None, (name, evidence)
            assert cuda.split(".")[0] == "13", (name, evidence)
        elif name not in ("cuda-bindings", "cuda-pathfinder"):
            assert cuda is None, (name, evidence)


@pytest.mark.real
def test_real_torch_venv_sonames():
    """Every versioned CUDA toolkit soname the venv ships (read from the ELF files) maps to CUDA 13."""
    from pytest_cudastack.linker.elf import read_elf

    site = _torch_site()
    checked = 0
    for path in sorted((site / "nvidia").rglob("*.so.*")):
        soname = read_elf(str(path)).soname
        if not soname or soname.startswith("libnvperf"):
            continue
        majors = soname_cuda_majors(soname)
        assert majors is not None, soname
        assert 13 in majors, soname
        checked += 1
    assert checked > 20
