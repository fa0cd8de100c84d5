"""The seed-1 incident end to end with the real NVIDIA libraries (tier ``real``).

Binaries are linked by gcc against the real ``libcublas.so.13`` (CUDA 13 wheels of the torch venv,
$CUDASTACK_TORCH_VENV) and the real ``libcudart.so.12`` (unzipped from the nvidia-cuda-runtime-cu12 wheel in
$CUDASTACK_WHEELS, default /opt/cudastack-wheels). The same scenario with gcc-built stubs runs in the plain
tier (tests/test_plugin.py::test_seed_*).

The output tests run pytest with the torch venv's own interpreter (which has no pytest): ``PYTHONPATH`` is a
directory of links to this interpreter's pytest, its dependencies and the plugin (``_shim``). The broken
venv is a hard-linked copy (``cp -al``) with the cuDNN, NCCL and cuSPARSELt libraries unlinked.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pytest_cudastack
from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import build_exe, needs_cc

pytestmark = [pytest.mark.real, needs_cc]


def _cu13_lib_dir() -> Path:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("needs the real torch CUDA venv ($CUDASTACK_TORCH_VENV)")
    found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "cu13", "lib"))
    if not found or not os.path.exists(os.path.join(found[0], "libcublas.so.13")):
        pytest.skip(f"no nvidia/cu13/lib/libcublas.so.13 in {venv}")
    return Path(found[0])


@pytest.fixture(scope="module")
def cudart12(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels")
    found = sorted(glob.glob(os.path.join(wheels, "nvidia_cuda_runtime_cu12-*.whl")))
    if not found:
        pytest.skip(f"no nvidia-cuda-runtime-cu12 wheel in {wheels}")
    out = tmp_path_factory.mktemp("cu12")
    with zipfile.ZipFile(found[-1]) as whl:
        member = next(n for n in whl.namelist() if n.endswith("/lib/libcudart.so.12"))
        (out / "libcudart.so.12").write_bytes(whl.read(member))
    return out / "libcudart.so.12"


@pytest.fixture
def seed_real(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cudart12: Path) -> pytest.Pytester:
    cu13 = _cu13_lib_dir()
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    bin_dir = pytester.path / "bin"
    build_exe(
        bin_dir / "train_tft_parquet", needed=[cu13 / "libcublas.so.13", cu13 / "libcudart.so.13"], runpath=str(cu13)
    )
    build_exe(bin_dir / "train_ppo", needed=[cudart12], runpath=str(cudart12.parent))
    pytester.makepyfile("def test_x(): pass")
    return pytester


def run(pt: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pt.runpytest("-p", "pytest_cudastack.plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def test_real_cuda_max_12_9_fails_on_the_cuda13_binary_only(seed_real):
    result = run(seed_real, "--cuda-max=12.9", "--cudastack-scan=bin", "-v")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "cudastack::cuda-max FAILED*",
            "cudastack::scan[[]bin/train_ppo] PASSED*",
            "cudastack::scan[[]bin/train_tft_parquet] PASSED*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(
        ["*[[]error] bin/train_tft_parquet: links libcublas.so.13 (CUDA 13.x) but --cuda-max=12.9"]
    )
    assert "train_ppo:" not in result.stdout.str()


def test_real_cuda_max_13_0_passes(seed_real):
    run(seed_real, "--cuda-max=13.0", "--cudastack-scan=bin").assert_outcomes(passed=4)


def test_real_driver_550_cannot_run_the_cuda13_binary(seed_real):
    result = run(
        seed_real, "--cudastack", "--cudastack-scan=bin", "--cuda-driver=550.54.15", "-k", "driver and not test_x"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*bin/train_tft_parquet: CUDA 13 is required; driver 550.54.15 (declared)*CUDA 13 needs driver*"]
    )


# -- the plugin's output on the real venv (issue 9) -----------------------------------------------------

SHIM_MODULES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "elftools", "pynvml", "py")
SHIM_DISTS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments", "pyelftools", "nvidia-ml-py")
BROKEN = {
    "libcudnn.so.9": "nvidia-cudnn-cu13",
    "libnccl.so.2": "nvidia-nccl-cu13",
    "libcusparseLt.so.0": "nvidia-cusparselt-cu13",
}


def _torch_venv() -> Path:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isfile(os.path.join(venv, "bin", "python")):
        pytest.skip("needs the real torch CUDA venv ($CUDASTACK_TORCH_VENV)")
    if not glob.glob(os.path.join(venv, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")):
        pytest.skip(f"the torch venv is not a Python {sys.version_info[0]}.{sys.version_info[1]} venv")
    return Path(venv)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Links to this interpreter's pytest, its dependencies and the plugin; each distribution's dist-info
    with METADATA, entry points and the RECORD rows inside site-packages (``../../../bin/pytest`` would
    leave the shim: a warning the real venv does not have). The plugin has no dist-info: ``-p`` loads it."""
    out = tmp_path_factory.mktemp("shim")
    for module in SHIM_MODULES:
        spec = importlib.util.find_spec(module)
        assert spec is not None, module
        assert spec.origin is not None, module
        origin = Path(spec.origin)
        target = origin.parent if origin.name == "__init__.py" else origin
        (out / target.name).symlink_to(target)
    (out / "pytest_cudastack").symlink_to(Path(pytest_cudastack.__file__).parent)
    for name in SHIM_DISTS:
        dist = importlib.metadata.distribution(name)
        info = out / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
        info.mkdir()
        for file in ("METADATA", "entry_points.txt"):
            text = dist.read_text(file)
            if text is not None:
                (info / file).write_text(text)
        rows = (dist.read_text("RECORD") or "").splitlines()
        (info / "RECORD").write_text("".join(f"{row}\n" for row in rows if not row.startswith("../")))
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("project")
    (out / "test_a.py").write_text("def test_x():\n    pass\n")
    return out


@pytest.fixture(scope="module")
def broken_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hard-linked copy of the torch venv without its cuDNN, NCCL and cuSPARSELt libraries."""
    venv = _torch_venv()
    copy = tmp_path_factory.mktemp("broken") / "venv"
    subprocess.run(["cp", "-al", str(venv), str(copy)], check=True)
    (site,) = glob.glob(str(copy / "lib" / "python3*" / "site-packages"))
    gone = [*glob.glob(os.path.join(site, "nvidia", "cudnn", "lib", "*.so*"))]
    gone += [
        os.path.join(site, "nvidia/nccl/lib/libnccl.so.2"),
        os.path.join(site, "nvidia/cusparselt/lib/libcusparseLt.so.0"),
    ]
    for path in gone:
        os.unlink(path)
    return copy


def pytest_in(venv: Path, shim: Path, project: Path, *args: str) -> tuple[int, list[str]]:
    """pytest run by ``venv``'s interpreter in ``project``: exit status and output lines."""
    env = {k: v for k, v in os.environ.items() if k not in ENV.values() and not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(shim), PYTHONDONTWRITEBYTECODE="1", CUDASTACK_CACHE_DIR=str(project / ".cache"))
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", *args]
    done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, (done.stdout + done.stderr).splitlines()


@pytest.mark.xdist_group("torch-venv")
def test_real_clean_venv_is_quiet(shim, project):
    venv = _torch_venv()
    rc, without = pytest_in(venv, shim, project)
    assert rc == 0, "\n".join(without)
    rc, lines = pytest_in(venv, shim, project, "-p", "pytest_cudastack.plugin", "--cudastack")
    out = "\n".join(lines)
    assert rc == 0, out
    assert len(lines) <= len(without) + 2, out  # the header and the items' progress line, nothing else
    (header,) = [line for line in lines if line.startswith("cudastack:")]
    assert len(header) <= 120, header
    assert "CUDA wheels (cu13: " in header
    assert "optional librar" not in out
    assert "info:" not in out


@pytest.mark.xdist_group("torch-venv")
def test_real_broken_venv_prints_each_error_once(shim, project, broken_venv):
    rc, lines = pytest_in(broken_venv, shim, project, "-p", "pytest_cudastack.plugin", "--cudastack", "-rfE")
    out = "\n".join(lines)
    assert rc == 1, out
    # the closure item's failure: one finding for the one cause, naming every soname once
    assert out.count("3 sonames are not found: libcudnn.so.9, libcusparseLt.so.0, libnccl.so.2") == 1, out
    for soname, dist in BROKEN.items():
        assert out.count(f"  {soname}: needed by ") == 1, out
        assert out.count(f"[error] {dist} ") == 1, out  # the integrity item's failure
    assert not [line for line in lines if line.lstrip().startswith("error:")], out  # not again in a section
    summary = [line for line in lines if line.startswith("FAILED ")]
    assert [line.split(" - ")[0] for line in summary] == ["FAILED cudastack::integrity", "FAILED cudastack::closure"]
    assert [line.split(" - ")[1].split(":")[0] for line in summary] == ["3 errors", "1 error"], summary
    assert "optional librar" not in out
