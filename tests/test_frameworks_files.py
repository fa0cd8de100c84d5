"""Framework rules decided from the framework's own files (checks/frameworks.py, ``build`` of a rule): the cuDNN
soname major its gcc-built libraries name (DT_NEEDED or read-only strings) and the floor its METADATA declares
(JAX's CUDA plugin: ``nvidia-cudnn-cu12>=9.8,<10.0; extra == "with-cuda"``) give the version it was built
against, judged as XLA's stream executor judges the cuDNN it loads (same major, a minor not lower); JAX's own
cuDNN floors by release; severity by whether the project imports the framework (a failed check drops the GPU
and runs on). Each broken state has a clean twin; the host's ld.so.cache and default directories are kept out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.checks.frameworks import framework_findings
from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Severity
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from tests.helpers.sitebuild import HAVE_CC, compile_so, isolate_search, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


@pytest.fixture(autouse=True)
def system_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The host's ld.so.cache and default directories replaced by one empty directory (``system``)."""
    system = isolate_search(monkeypatch, tmp_path)
    monkeypatch.delenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", raising=False)
    return system


def plugin(site: Path, cuda: int, version: str, floor: str | None, names: str | None, *, pjrt: bool = True) -> None:
    """A jax CUDA plugin whose PJRT library names ``names`` in its read-only data (the soname it dlopens) and
    whose METADATA declares ``floor`` for the cuDNN wheel of its CUDA major (its with-cuda extra); ``pjrt``:
    with the ``jax_plugins.xla_cudaNN`` package, whose preloads dlopen_targets.json lists (else an own .so)."""
    payload = {"payload": names} if names else {}
    so = compile_so("xla_cuda_plugin.so", **payload)
    files: dict[str, bytes | str] = {f"jax_cuda{cuda}_plugin/__init__.py": ""}
    if pjrt:
        files[f"jax_plugins/xla_cuda{cuda}/__init__.py"] = ""
        files[f"jax_plugins/xla_cuda{cuda}/xla_cuda_plugin.so"] = so
    else:
        files[f"jax_cuda{cuda}_plugin/xla_cuda_plugin.so"] = so
    requires = [f'nvidia-cudnn-cu{cuda}{floor}; extra == "with-cuda"'] if floor else []
    write_dist(site, f"jax-cuda{cuda}-plugin", version, files, requires=requires)


def cudnn(site: Path, cuda: int, version: str) -> None:
    major = version.split(".")[0]
    soname = f"libcudnn.so.{major}"
    write_dist(site, f"nvidia-cudnn-cu{cuda}", version, {f"nvidia/cudnn/lib/{soname}": compile_so(soname)})


def jax(site: Path, cuda: int, version: str) -> None:
    """jax itself, requiring the plugin through its cudaNN extra (jax loads its plugins)."""
    req = f'jax-cuda{cuda}-plugin[with-cuda]=={version}; extra == "cuda{cuda}"'
    write_dist(site, "jax", version, {"jax/__init__.py": ""}, requires=[req])


def findings(site: Path, root: Path | None = None, imports: tuple[str, ...] = ()):
    settings = Settings.from_values(cudastack=True, cudastack_imports=list(imports), cudastack_imports_scan="false")
    driver = DriverInfo("declared", "580.65.06", "13.0", archs=("sm_90",), arch_source="declared")
    stack = Stack(settings, driver_info=driver, rootdir=str(root or site), site_paths=(str(site),), cache=None)
    return [f for f in framework_findings(stack) if "cuDNN" in f.subject or "cuDNN" in f.cause]


# ---------------------------------------------------------------------------- the build from the plugin's files


@pytest.mark.parametrize(
    ("cuda", "version", "floor", "installed"),
    [(12, "0.6.0", ">=9.8,<10.0", "9.5.1.17"), (13, "0.7.2", ">=9.12,<10.0", "9.8.0.87")],
    ids=["cu12", "cu13"],
)
def test_plugin_built_against_a_newer_cudnn_minor(tmp_path, cuda, version, floor, installed):
    site = site_packages(tmp_path / "v")
    plugin(site, cuda, version, floor, "libcudnn.so.9")
    cudnn(site, cuda, installed)
    jax(site, cuda, version)
    (err,) = findings(site, imports=("jax",))
    assert err.severity is Severity.ERROR
    built = floor[2:].split(",")[0] + ".0"
    loaded = ".".join(installed.split(".")[:3])
    assert err.message == (
        f'jax-cuda{cuda}-plugin {version} would fail its cuDNN check: "Loaded runtime CuDNN library: {loaded} but '
        f"source was compiled with: {built}. CuDNN library needs to have matching major version and equal or "
        'higher minor version."'
    )
    assert f"its METADATA declares nvidia-cudnn-cu{cuda}<10.0,{floor.split(',')[0]}" in err.cause
    assert "its xla_cuda_plugin.so names libcudnn.so.9" in err.cause
    assert "drops the GPU and runs on the CPU" in err.cause
    assert err.fix.endswith(f"install --no-deps 'nvidia-cudnn-cu{cuda}<10.0,{floor.split(',')[0]}'")
    assert err.details[-1].startswith("reached by `import jax` (")


@pytest.mark.parametrize("installed", ["9.8.0.87", "9.19.0.56"])
def test_plugin_with_its_cudnn_minor_or_later_is_clean(tmp_path, installed):
    site = site_packages(tmp_path / "v")
    plugin(site, 12, "0.6.0", ">=9.8,<10.0", "libcudnn.so.9")
    cudnn(site, 12, installed)
    jax(site, 12, "0.6.0")
    assert findings(site, imports=("jax",)) == []


def test_not_imported_by_the_project_is_a_warning_naming_the_import(tmp_path):
    site = site_packages(tmp_path / "v")
    plugin(site, 12, "0.6.0", ">=9.8,<10.0", "libcudnn.so.9")
    cudnn(site, 12, "9.5.1.17")
    jax(site, 12, "0.6.0")
    (w,) = findings(site)
    assert w.severity is Severity.WARNING
    assert w.message.startswith("after `import jax`: jax-cuda12-plugin 0.6.0 would fail its cuDNN check")
    assert (
        w.details[-1]
        == "not reached: import jax in the project (or list it in cudastack_imports) to make this an error"
    )


def test_the_soname_its_files_name_absent_is_left_to_the_dlopen_item(tmp_path):
    # the issue's case: jax 0.4.30's plugin names libcudnn.so.9 while the venv keeps cuDNN 8.9.7; the load fails
    # (the dlopen item's ERROR, naming the family's other major), so no version check of this rule runs, and no
    # "not judged here" either: the files decide it
    site = site_packages(tmp_path / "v")
    plugin(site, 12, "0.4.30", ">=9.0,<10.0", "libcudnn.so.9")
    cudnn(site, 12, "8.9.7.29")
    assert findings(site, imports=("jax_cuda12_plugin",)) == []


def test_the_metadata_floor_alone_states_the_build_major(tmp_path):
    # the same venv, the plugin's library naming no cuDNN soname: its METADATA says 9.0, cuDNN 8.9.7 is loaded
    site = site_packages(tmp_path / "v")
    plugin(site, 12, "0.4.30", ">=9.0,<10.0", None, pjrt=False)
    cudnn(site, 12, "8.9.7.29")
    (err,) = findings(site, imports=("jax_cuda12_plugin",))
    assert err.severity is Severity.ERROR
    assert err.message == (
        "jax-cuda12-plugin 0.4.30 loads cuDNN 9, which is not installed: the cuDNN here is (8, 9, 7), another major"
    )
    assert err.fix.endswith("install --no-deps 'nvidia-cudnn-cu12<10.0,>=9.0'")


def test_nothing_states_the_build_is_not_judged_with_the_places_read(tmp_path):
    site = site_packages(tmp_path / "v")
    plugin(site, 12, "0.6.1", None, None)
    cudnn(site, 12, "9.5.1.17")
    (info,) = findings(site)
    assert info.severity is Severity.INFO
    assert info.details == (
        "cuDNN: cannot be decided statically because no file states the version it was built against (the "
        "places read: the floor its METADATA declares for the library's wheel, any extra, the soname its "
        "libraries name)",
    )


def test_the_files_major_alone_decides_the_major(tmp_path):
    # no METADATA floor; the plugin names libcudnn.so.9, which an installed wheel ships: the major is met, the
    # minor is stated by no file
    site = site_packages(tmp_path / "v")
    plugin(site, 12, "0.6.1", None, "libcudnn.so.9")
    cudnn(site, 12, "9.5.1.17")
    (info,) = findings(site)
    assert info.severity is Severity.INFO
    assert "the minor of the build is stated by no file (its major matches)" in info.details[0]
    assert "its xla_cuda_plugin.so names libcudnn.so.9" in info.details[0]


# ----------------------------------------------------------------------------------- JAX's own cuDNN floors


@pytest.mark.parametrize(
    ("version", "installed", "floor"),
    [("0.5.0", "8.9.7.29", "9100"), ("0.4.26", "8.6.0.163", "8900")],
)
def test_jax_own_cudnn_floor_by_release(tmp_path, version, installed, floor):
    site = site_packages(tmp_path / "v")
    plugin(site, 12, version, None, None)
    cudnn(site, 12, installed)
    errs = [f for f in findings(site, imports=("jax_cuda12_plugin",)) if f.severity is Severity.ERROR]
    (err,) = errs
    assert f"The local installation version must be no lower than {floor}." in err.message


@pytest.mark.parametrize(
    ("version", "installed"), [("0.4.30", "8.9.7.29"), ("0.5.0", "9.0.0.312"), ("0.6.1", "8.9.7.29")]
)
def test_jax_own_cudnn_floor_met_or_gone(tmp_path, version, installed):
    # 0.4.30 admits 8.9 (8900), 0.5.0 every 9.x (9100 in cuDNN 8's encoding), 0.6.1 has no floor of its own
    site = site_packages(tmp_path / "v")
    plugin(site, 12, version, None, None)
    cudnn(site, 12, installed)
    assert [f for f in findings(site, imports=("jax_cuda12_plugin",)) if f.failing] == []


# ------------------------------------------------------------------- cupy 13.5+: the wheels it preloads from


def cupy13(site: Path, name: str, version: str = "13.6.0", nccl: str = "2.25.1") -> None:
    cuda = name[9:11]
    config = (
        f'{{"cuda": "{cuda}.x", "packaging": "pip", "nccl": {{"version": "{nccl}", "min_pypi_version": "{nccl}", '
        f'"filenames": ["libnccl.so.{nccl}"]}}}}'
    )
    write_dist(site, name, version, {"cupy/.data/_wheel.json": config, "cupy/__init__.py": ""})


@pytest.mark.parametrize(
    ("name", "nccl", "installed"),
    [("cupy-cuda12x", "2.25.1", "2.21.5"), ("cupy-cuda13x", "2.27.7", "2.27.3"), ("cupy-cuda11x", "2.16.2", "3.0.0")],
)
def test_cupy_passes_over_an_nccl_wheel_older_than_its_build(tmp_path, name, nccl, installed):
    site = site_packages(tmp_path / "v")
    cupy13(site, name, nccl=nccl)
    cu = name[9:11]
    write_dist(site, f"nvidia-nccl-cu{cu}", installed)
    found = [f for f in framework_findings(Stack(site_paths=(str(site),))) if "NCCL" in f.subject]
    (w,) = found
    assert w.severity is Severity.WARNING
    assert w.message == (
        f'{name} 13.6.0 passes over nvidia-nccl-cu{cu} {installed} when it preloads NCCL: "nvidia-nccl wheel '
        f'package (nvidia-nccl-cu{cu}) incompatible: expected {nccl}, found {installed}"'
    )
    assert f"install nvidia-nccl-cu{cu}>={nccl},<{int(nccl.split('.')[0]) + 1} (what {name} itself" in w.fix


@pytest.mark.parametrize(
    ("version", "installed"),
    [("13.6.0", "2.25.1"), ("13.6.0", "2.26.2"), ("13.4.1", "2.21.5"), ("14.0.1", "2.21.5")],
    ids=["equal", "newer", "before 13.5", "14: pathfinder first"],
)
def test_cupy_nccl_wheel_clean_twins(tmp_path, version, installed):
    site = site_packages(tmp_path / "v")
    cupy13(site, "cupy-cuda12x", version, nccl="2.25.1")
    write_dist(site, "nvidia-nccl-cu12", installed)
    assert [f for f in framework_findings(Stack(site_paths=(str(site),))) if "NCCL" in f.subject] == []


def test_onnxruntime_provider_finding_quotes_its_build_info(tmp_path):
    site = site_packages(tmp_path / "v")
    provider = compile_so("libonnxruntime_providers_cuda.so", needed=["libcublasLt.so.12"])
    files = {
        "onnxruntime/capi/libonnxruntime_providers_cuda.so": provider,
        "onnxruntime/capi/build_and_package_info.py": "package_name = 'onnxruntime-gpu'\ncuda_version = '12.8'\n",
    }
    write_dist(site, "onnxruntime-gpu", "1.24.4", files)
    lt13 = compile_so("libcublasLt.so.13")
    write_dist(site, "nvidia-cublas", "13.1.1.3", {"nvidia/cu13/lib/libcublasLt.so.13": lt13})
    (f,) = framework_findings(Stack(site_paths=(str(site),)))
    assert "when a session asks for it; its build_and_package_info.py says cuda_version 12.8;" in f.cause


def test_the_build_major_shipped_by_another_wheel_is_the_one_judged(tmp_path):
    # cuDNN 8 for CUDA 12 first in search order, cuDNN 9 for CUDA 13 beside it: the plugin asks for cuDNN 9
    site = site_packages(tmp_path / "v")
    plugin(site, 12, "0.6.0", ">=9.8,<10.0", None)
    write_dist(site, "nvidia-cudnn-cu12", "8.9.7.29")
    write_dist(site, "nvidia-cudnn-cu13", "9.8.0.87")
    assert findings(site, imports=("jax_cuda12_plugin",)) == []


def test_a_floor_met_by_another_major_is_no_comfort(tmp_path):
    # jax-cuda12-plugin declares cuBLAS for CUDA 12; only CUDA 13's cuBLAS is installed: its 13.1 meets JAX's
    # 12.1 floor, but the plugin loads libcublas.so.12, which nothing ships
    site = site_packages(tmp_path / "v")
    write_dist(site, "jax-cuda12-plugin", "0.6.0", requires=['nvidia-cublas-cu12>=12.1.3.1; extra == "with-cuda"'])
    write_dist(site, "nvidia-cublas", "13.1.1.3")
    found = [f for f in framework_findings(Stack(site_paths=(str(site),))) if f.subject.endswith("cuBLAS")]
    (err,) = found
    assert err.message == (
        "jax-cuda12-plugin 0.6.0 loads cuBLAS 12, which is not installed: the cuBLAS here is (13, 1, 1), another major"
    )
    clean = site_packages(tmp_path / "w")
    write_dist(clean, "jax-cuda12-plugin", "0.6.0", requires=['nvidia-cublas-cu12>=12.1.3.1; extra == "with-cuda"'])
    write_dist(clean, "nvidia-cublas", "13.1.1.3")
    write_dist(clean, "nvidia-cublas-cu12", "12.9.1.4")
    assert [f for f in framework_findings(Stack(site_paths=(str(clean),))) if f.subject.endswith("cuBLAS")] == []


def test_a_major_the_dlopen_tables_preload_names_is_the_dlopen_items(tmp_path):
    # jax_plugins.xla_cuda12 (jax-cuda12-pjrt) preloads nvidia/cudnn/lib/libcudnn.so.9 (dlopen_targets.json):
    # that run-time load, absent with cuDNN 8 installed, is the dlopen item's finding; this rule says nothing
    site = site_packages(tmp_path / "v")
    plugin(site, 12, "0.6.2", ">=9.8,<10.0", None)
    cudnn(site, 12, "8.9.7.29")
    assert findings(site, imports=("jax",)) == []
