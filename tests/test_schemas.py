"""The machine-readable output is a contract (issue #9, point 8): every document names its schema and
version, the schema ships in the package (``pytest_cudastack/schemas``), and real output validates against it.

Each document is produced the way a user gets it (``cudastack ... --json``, ``cudastack snapshot``,
``pytest --cudastack-snapshot``) from gcc-built fixtures, and on the real tier from the torch venv; each
schema is checked to be strict enough that a mutated document fails.
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import pytest_cudastack
from pytest_cudastack.cli import main
from pytest_cudastack.cli.check import CHECK_SCHEMA, CHECK_VERSION
from pytest_cudastack.cli.diff import DIFF_SCHEMA, DIFF_VERSION
from pytest_cudastack.cli.fleet import FLEET_SCHEMA, FLEET_VERSION
from pytest_cudastack.cli.loaded import LOADED_SCHEMA, LOADED_VERSION, cmd_loaded
from pytest_cudastack.cli.tree import TREE_SCHEMA, TREE_VERSION
from pytest_cudastack.cuda.driver import DriverInfo, Gpu
from pytest_cudastack.linker import treecache
from pytest_cudastack.linker.resolver import Resolver
from pytest_cudastack.settings import ENV, Settings
from pytest_cudastack.stack import SNAPSHOT_FORMAT, SNAPSHOT_SCHEMA, Stack, load_snapshot, write_snapshot
from tests.helpers.elfbuild import Scenarios, build_exe, get_scenarios, needs_cc
from tests.helpers.sitebuild import compile_so, site_packages, write_dist

PACKAGE = Path(pytest_cudastack.__file__).parent
SCHEMAS = PACKAGE / "schemas"
DOCUMENTS = {
    TREE_SCHEMA: TREE_VERSION,
    LOADED_SCHEMA: LOADED_VERSION,
    CHECK_SCHEMA: CHECK_VERSION,
    SNAPSHOT_SCHEMA: SNAPSHOT_FORMAT,
    DIFF_SCHEMA: DIFF_VERSION,
    FLEET_SCHEMA: FLEET_VERSION,
}


def schema_of(name: str) -> dict[str, Any]:
    """The shipped schema a document's ``"schema"`` names: ``pytest-cudastack/X`` -> ``schemas/X.schema.json``."""
    prefix, _, stem = name.partition("/")
    assert prefix == "pytest-cudastack", name
    schema: dict[str, Any] = json.loads((SCHEMAS / f"{stem}.schema.json").read_text())
    return schema


def validate(doc: Any, schema: str) -> Any:
    """``doc``, after checking that it names ``schema`` at the version its file declares and validates."""
    assert isinstance(doc, dict)
    assert doc["schema"] == schema
    assert doc["version"] == DOCUMENTS[schema]
    jsonschema.Draft202012Validator(schema_of(schema)).validate(doc)
    return doc


def rejects(doc: dict[str, Any], *mutations: Callable[[Any], None]) -> None:
    """Each mutation of a copy of the (valid) ``doc`` makes it invalid against its schema."""
    validator = jsonschema.Draft202012Validator(schema_of(doc["schema"]))
    for mutate in mutations:
        bad = copy.deepcopy(doc)
        mutate(bad)
        assert not validator.is_valid(bad), f"{doc['schema']}: accepted {mutate.__doc__ or mutate}"


def assign(path: str, value: Any) -> Callable[[Any], None]:
    """A mutation: set the item at ``a.0.b`` (keys and list indexes) to ``value``."""
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]

    def mutate(doc: Any) -> None:
        for key in parents:
            doc = doc[key]
        doc[last] = value

    mutate.__doc__ = f"{path} = {value!r}"
    return mutate


def delete(path: str) -> Callable[[Any], None]:
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]

    def mutate(doc: Any) -> None:
        for key in parents:
            doc = doc[key]
        del doc[last]

    mutate.__doc__ = f"del {path}"
    return mutate


COMMON_MUTATIONS = (assign("version", max(DOCUMENTS.values()) + 1), assign("schema", "pytest-cudastack/other"))


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def scen(tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    return get_scenarios(tmp_path_factory)


def cuda_site(tmp_path: Path) -> Path:
    """A venv site: a CUDA 13 wheel (nvidia-dep-cu13) whose library an extension module of ``pkg`` needs,
    clobbered by a CUDA 12 wheel shipping the same path (an integrity error)."""
    site = site_packages(tmp_path / "venv")
    ext = compile_so(None, pyinit="_ext", needed=["libdep.so.1"], rpath="$ORIGIN/../nvidia/dep/lib")
    write_dist(site, "pkg", "1", {"pkg/_ext.cpython-311-x86_64-linux-gnu.so": ext}, requires=["nvidia-dep-cu13==1.0"])
    write_dist(site, "nvidia-dep-cu13", "1.0", {"nvidia/dep/lib/libdep.so.1": compile_so("libdep.so.1")})
    write_dist(site, "nvidia-other-cu13", "2.0", {"nvidia/other/lib/libother.so.2": compile_so("libother.so.2")})
    write_dist(site, "nvidia-dep-cu12", "0.9", {"nvidia/dep/lib/libdep.so.1": compile_so("libdep.so.1", payload="12")})
    return site


def scanned_binary(root: Path, site: Path) -> Path:
    """``root/bin/app``: needs the wheel's libdep.so.1 (RUNPATH into the site) and libgone.so.1 (deleted)."""
    gone = root / "gone" / "libgone.so.1"
    gone.parent.mkdir(parents=True)
    gone.write_bytes(compile_so("libgone.so.1"))
    app = build_exe(
        root / "bin" / "app", needed=[site / "nvidia/dep/lib/libdep.so.1", gone], runpath=str(site / "nvidia/dep/lib")
    )
    gone.unlink()
    return app


# -- the schemas themselves ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.schema.json")), ids=lambda p: p.name)
def test_every_shipped_schema_is_a_valid_draft_2020_12_schema(path: Path) -> None:
    schema = json.loads(path.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    name = "pytest-cudastack/" + path.name.removesuffix(".schema.json")
    version = schema["properties"]["version"]["const"]
    assert schema["properties"]["schema"] == {"const": name}
    assert schema["$id"] == f"urn:pytest-cudastack:{path.name.removesuffix('.schema.json')}:{version}"
    assert {"schema", "version"} <= set(schema["required"])
    assert schema["additionalProperties"] is False  # an undeclared top-level key is a contract change


def test_every_document_has_its_schema_and_nothing_else_ships() -> None:
    shipped = {f"pytest-cudastack/{p.name.removesuffix('.schema.json')}" for p in SCHEMAS.glob("*.schema.json")}
    assert shipped == set(DOCUMENTS)
    for name, version in DOCUMENTS.items():
        assert schema_of(name)["properties"]["version"]["const"] == version


def test_package_data_ships_the_schemas() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["package-data"]["pytest_cudastack"]
    declared = {Path(p) for pattern in globs for p in glob.glob(str(PACKAGE / pattern))}
    assert set(SCHEMAS.glob("*.schema.json")) <= declared
    assert any(req.startswith("jsonschema") for req in project["project"]["optional-dependencies"]["test"])


def test_the_snapshot_and_tree_describe_a_closure_alike() -> None:
    """A snapshot's binaries are ``tree --json``'s trees (Tree.to_json): one definition, written twice."""
    assert schema_of(SNAPSHOT_SCHEMA)["$defs"]["tree"] == schema_of(TREE_SCHEMA)["$defs"]["tree"]


# -- tree --json --------------------------------------------------------------------------------------


@needs_cc
def test_tree_json_cold_and_warm_validates(
    scen: Scenarios, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [str(scen.rpath_inherit), str(scen.missing_deep), str(scen.wrong_class), str(scen.base / "absent.so")]
    monkeypatch.setattr(treecache, "RACY_NS", 50_000_000)  # 50 ms, not 2 s: the fixture files may be younger
    time.sleep(0.06)
    assert main(["tree", "--json", *paths]) == 1
    cold = capsys.readouterr().out
    with monkeypatch.context() as m:  # the warm run writes the cached rows verbatim inside the wrapper

        def resolve(self: Resolver, path: str) -> None:
            raise AssertionError(f"resolved {path}: the closure cache was not used")

        m.setattr(Resolver, "tree_deps", resolve)
        assert main(["tree", "--json", *paths]) == 1
        assert capsys.readouterr().out == cold
    doc = validate(json.loads(cold), TREE_SCHEMA)
    assert [t["path"] for t in doc["trees"]] == paths
    assert any(lib["path"] is None for t in doc["trees"] for lib in t["libraries"])
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal: indented, the same document
    main(["tree", "--json", *paths])
    assert json.loads(capsys.readouterr().out) == doc
    rejects(
        doc,
        *COMMON_MUTATIONS,
        assign("trees.0.libraries.0.path", 5),
        assign("trees.0.libraries.0.needed_by", "libmid.so.1"),
        delete("trees.0.libraries.0.provider"),
        assign("trees.0.extra", True),
        assign("trees", {}),
        delete("trees"),
    )


@needs_cc
def test_tree_json_with_owners_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = cuda_site(tmp_path)
    ext = site / "pkg/_ext.cpython-311-x86_64-linux-gnu.so"
    assert main(["tree", "--json", "--site", str(site), str(ext)]) == 0
    doc = validate(json.loads(capsys.readouterr().out), TREE_SCHEMA)
    (dep,) = (lib for lib in doc["trees"][0]["libraries"] if lib["soname"] == "libdep.so.1")
    assert dep["provider"] is not None
    rejects(doc, assign("trees.0.libraries.0.provider", ["nvidia-dep-cu13"]))


# -- check --json -------------------------------------------------------------------------------------


@needs_cc
def test_check_json_with_findings_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    site = cuda_site(tmp_path)
    scanned_binary(tmp_path, site)
    monkeypatch.chdir(tmp_path)
    argv = ["check", "--site", str(site), "--cudastack", "--cuda-max=12.9", "--cuda-driver=580.65.06"]
    assert main([*argv, "--cudastack-scan=bin", "--json"]) == 1
    doc = validate(json.loads(capsys.readouterr().out), CHECK_SCHEMA)
    assert doc["ok"] is False
    findings = [f for found in doc["items"].values() for f in found]
    assert {"integrity", "cuda-max", "scan[bin/app]"} <= set(doc["items"])
    assert {f["severity"] for f in findings} >= {"error"}
    assert any(f["chain"] for f in findings)
    assert any(f["where"] for f in findings)
    item = next(name for name, found in doc["items"].items() if found)
    rejects(
        doc,
        *COMMON_MUTATIONS,
        assign("ok", "no"),
        assign(f"items.{item}.0.severity", "fatal"),
        assign(f"items.{item}.0.where", "/lib"),
        assign(f"items.{item}.0.unknown", 1),
        delete(f"items.{item}.0.message"),
        assign(f"items.{item}", {}),
    )
    # a clean run validates too (empty finding lists)
    assert main(["check", "--site", str(tmp_path / "none"), "--cuda-driver=580.65.06", "--json"]) == 0
    assert validate(json.loads(capsys.readouterr().out), CHECK_SCHEMA)["ok"] is True


# -- the snapshot -------------------------------------------------------------------------------------


def _rejects_snapshot(doc: dict[str, Any]) -> None:
    rejects(
        doc,
        *COMMON_MUTATIONS,
        delete("format"),
        assign("driver.source", "guessed"),
        assign("driver.archs", ["9.0"]),
        assign("driver.gpus", [{"index": "0"}]),
        assign("wheels.0.cuda_major", "13"),
        assign("wheels.0.missing", None),
        delete("wheels.0.libraries"),
        assign("binaries", [{"path": "bin/app", "libraries": [{"soname": "x"}]}]),
        assign("generator", "someone else"),
    )


@needs_cc
def test_snapshot_command_and_stack_to_json_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    site = cuda_site(tmp_path)
    scanned_binary(tmp_path, site)
    monkeypatch.chdir(tmp_path)
    assert main(["snapshot", "--site", str(site), "-o", "cli.json"]) == 0
    cli = validate(load_snapshot("cli.json"), SNAPSHOT_SCHEMA)
    assert {"nvidia-dep-cu13", "nvidia-other-cu13", "nvidia-dep-cu12"} <= {w["name"] for w in cli["wheels"]}
    assert main(["snapshot", "--site", str(site)]) == 0  # to standard output: the same document
    assert json.loads(capsys.readouterr().out)["wheels"] == cli["wheels"]
    gpu = Gpu(0, "NVIDIA H200", "GPU-1", "9.0", 150 << 30, "disabled")
    driver = DriverInfo("probed", "580.65.06", "13.0", (gpu,), ("sm_90",), "probed", notes=("NVML",))
    stack = Stack(Settings(cudastack_scan=("bin",)), driver_info=driver, rootdir=str(tmp_path), site_paths=(str(site),))
    write_snapshot(stack, "stack.json")
    stack.flush_cache()
    doc = validate(load_snapshot("stack.json"), SNAPSHOT_SCHEMA)
    assert doc == json.loads(json.dumps(stack.to_json()))
    (app,) = doc["binaries"]
    assert app["path"] == "bin/app"
    assert any(lib["path"] is None for lib in app["libraries"])
    assert doc["driver"]["gpus"][0]["memory_total"] == 150 << 30
    _rejects_snapshot(doc)
    rejects(doc, assign("driver.gpus.0.memory_total", "150 GiB"), assign("driver.gpus.0.index", -1))


def test_pytest_snapshot_option_validates(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(
        "-p", "pytest_cudastack.plugin", "--cuda-driver=550.54.15", "--cuda-arch=sm_90", "--cudastack-snapshot=s.json"
    )
    result.assert_outcomes(passed=1)
    doc = validate(json.loads((pytester.path / "s.json").read_text()), SNAPSHOT_SCHEMA)
    assert (doc["driver"]["source"], doc["driver"]["archs"]) == ("declared", ["sm_90"])


# -- diff --json --------------------------------------------------------------------------------------


@needs_cc
def test_diff_json_validates_and_says_what_the_text_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real snapshots of one site, before and after a wheel's library went missing, another wheel was
    removed and one added, with another declared driver and a GPU."""
    site = cuda_site(tmp_path)
    scanned_binary(tmp_path, site)
    monkeypatch.chdir(tmp_path)

    def snap(path: str, driver: DriverInfo) -> None:
        stack = Stack(Settings(cudastack_scan=("bin",)), driver_info=driver, rootdir=".", site_paths=(str(site),))
        write_snapshot(stack, path)
        stack.flush_cache()

    snap("a.json", DriverInfo("declared", "550.54.15", "12.4", archs=("sm_80",), arch_source="declared"))
    os.unlink(site / "nvidia/dep/lib/libdep.so.1")
    for dist_info in site.glob("nvidia_dep_cu12-*.dist-info"):
        for f in dist_info.iterdir():
            f.unlink()
        dist_info.rmdir()
    write_dist(site, "nvidia-new-cu13", "3.0", {"nvidia/new/lib/libnew.so.3": compile_so("libnew.so.3")})
    gpu = Gpu(0, "NVIDIA H200", None, "9.0", None, None)
    snap("b.json", DriverInfo("probed", "580.65.06", "13.0", (gpu,), ("sm_90",), "probed"))

    assert main(["diff", "a.json", "b.json"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert main(["diff", "a.json", "b.json", "--json"]) == 1
    doc = validate(json.loads(capsys.readouterr().out), DIFF_SCHEMA)
    assert (doc["a"], doc["b"]) == ("a.json", "b.json")
    assert [d["text"] for d in doc["drift"]] == lines
    kinds = {(d["kind"], d["change"]) for d in doc["drift"]}
    assert {("driver", "changed"), ("wheel", "added"), ("wheel", "removed"), ("binary", "changed")} <= kinds
    rejects(
        doc,
        *COMMON_MUTATIONS,
        assign("drift.0.change", "moved"),
        assign("drift.0.kind", "kernel"),
        assign("drift.0.before", 550),
        assign("drift.0.subject", "driver version"),  # a driver record names one field
        delete("drift.0.text"),
        assign("drift", "driver version: 550.54.15 -> 580.65.06"),
    )
    assert main(["diff", "a.json", "a.json", "--json"]) == 0
    assert validate(json.loads(capsys.readouterr().out), DIFF_SCHEMA)["drift"] == []


# -- loaded --json ------------------------------------------------------------------------------------


def _loaded(capsys: pytest.CaptureFixture[str], module: str, rc: int) -> dict[str, Any]:
    assert cmd_loaded(argparse.Namespace(module=module, json=True)) == rc
    doc: dict[str, Any] = validate(json.loads(capsys.readouterr().out), LOADED_SCHEMA)
    return doc


def test_loaded_json_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "maps_ctypes_cudastack.py").write_text("import _ctypes\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    doc = _loaded(capsys, "maps_ctypes_cudastack", 0)
    assert doc["libraries"]
    assert "error" not in doc
    assert any(lib["soname"] is None for lib in doc["libraries"])  # the extension module has no soname
    failed = _loaded(capsys, "no_such_module_cudastack", 1)
    assert failed["error"].startswith("ModuleNotFoundError")
    rejects(
        doc,
        *COMMON_MUTATIONS,
        assign("libraries.0.soname", 3),
        assign("libraries.0.path", None),
        assign("error", None),  # present only when the import failed, and then a string
        assign("module", ["maps_ctypes_cudastack"]),
    )


# -- the real tier ------------------------------------------------------------------------------------


def _torch_venv() -> tuple[Path, str]:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("CUDASTACK_TORCH_VENV unset or absent")
    sites = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    if not sites:
        pytest.skip(f"no site-packages in {venv}")
    return Path(venv), sites[0]


@pytest.mark.real
@pytest.mark.xdist_group("torch-venv")  # test_real_wheels changes the venv inodes' ctime (cp -al, pip)
def test_tree_json_over_torchs_libraries_validates(capsys: pytest.CaptureFixture[str]) -> None:
    _venv, site = _torch_venv()
    libs = sorted(glob.glob(os.path.join(site, "torch", "lib", "*.so*")))
    assert libs
    main(["tree", "--json", "--site", site, *libs])
    doc = validate(json.loads(capsys.readouterr().out), TREE_SCHEMA)
    assert len(doc["trees"]) == len(libs)
    providers = {lib["provider"] for t in doc["trees"] for lib in t["libraries"]}
    assert any(p and p.startswith("nvidia-") for p in providers)


@pytest.mark.real
@pytest.mark.xdist_group("torch-venv")
def test_snapshot_of_the_torch_venv_validates(tmp_path: Path) -> None:
    _venv, site = _torch_venv()
    out = tmp_path / "torch.json"
    assert main(["snapshot", "--site", site, "-o", str(out)]) == 0
    doc = validate(load_snapshot(str(out)), SNAPSHOT_SCHEMA)
    assert any(w["name"].startswith("nvidia-") and w["libraries"] for w in doc["wheels"])
    _rejects_snapshot(doc)
