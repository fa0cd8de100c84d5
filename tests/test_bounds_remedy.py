"""A wheel beyond --cuda-max / --cuda-min: its remedy is the pip spec of its build within the bound that its
requirers still accept (a step by hand: pip picks the release), the requirer to change when none accepts one,
and, where it brings its own library, that under CUDA minor-version compatibility it needs only a driver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_cudastack.checks.bounds import bound_findings
from pytest_cudastack.cli import main
from pytest_cudastack.cuda.compat import mvc_floor
from pytest_cudastack.findings import DriverUpgrade, Finding, Manual, UseBuild
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.model.needs import infer_wheel
from pytest_cudastack.model.repair import plan_repairs
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from tests.helpers.realenv import torch_venv
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


def jitlink() -> dict[str, bytes | str]:
    return {"nvidia/cu13/lib/libnvJitLink.so.13": compile_so("libnvJitLink.so.13")}


def errors(site: Path, kind: str, bound: str) -> tuple[list[Finding], Inventory]:
    inv = installed_wheels([str(site)], reader=read_elf)
    found = bound_findings(kind, bound, [infer_wheel(d) for d in inv.distributions], None, inv)
    return [f for f in found if f.failing], inv


@pytest.mark.parametrize(
    ("wheel", "version", "lib", "requires", "bound", "spec"),
    [
        # the stock CUDA 13 torch venv's case: cuda-toolkit 13.0.3 accepts nvidia-nvjitlink<14,>=13.0.88
        (
            "nvidia-nvjitlink",
            "13.5.37",
            "nvidia/cu13/lib/libnvJitLink.so.13",
            "nvidia-nvjitlink<14,>=13.0.88",
            "13.0",
            "nvidia-nvjitlink<13.1,>=13.0.88",
        ),
        # another name and major: a CUDA 12 runtime wheel against a 12.4 bound, a requirer with a floor only
        (
            "nvidia-cuda-runtime-cu12",
            "12.9.79",
            "nvidia/cuda_runtime/lib/libcudart.so.12",
            "nvidia-cuda-runtime-cu12>=12.1",
            "12.4",
            "nvidia-cuda-runtime-cu12<12.5,>=12.1",
        ),
    ],
)
def test_the_build_within_the_bound_is_a_pip_spec_its_requirers_accept(
    tmp_path, wheel, version, lib, requires, bound, spec
):
    site = site_packages(tmp_path / "venv")
    soname = lib.rsplit("/", 1)[1]
    write_dist(site, wheel, version, {lib: compile_so(soname)})
    write_dist(site, "app", "1.0", {"app/__init__.py": ""}, requires=[requires])
    (err,) = [f for f in errors(site, "max", bound)[0] if f.subject == f"{wheel} {version}"]
    build, driver = err.remedies
    assert isinstance(build, UseBuild)
    assert build.install is not None
    assert build.install.specs == (spec,)
    assert build.install.argv[-3:] == ("pip", "install", spec)
    assert "app 1.0 requires" in build.why
    # it brings its own library: minor-version compatibility lets its major's driver branch run it
    assert isinstance(driver, DriverUpgrade)
    assert driver.minimum == mvc_floor(int(bound.split(".")[0]))
    assert soname in driver.why
    assert "minor-version compatibility" in driver.rule


def test_the_plan_carries_the_exact_spec_as_a_step_by_hand(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site, "nvidia-nvjitlink", "13.5.37", {"nvidia/cu13/lib/libnvJitLink.so.13": compile_so("libnvJitLink.so.13")}
    )
    write_dist(site, "tk", "13.0.3", requires=["nvidia-nvjitlink<14,>=13.0.88"])
    found, inv = errors(site, "max", "13.0")
    (plan,) = plan_repairs(found, inv)
    assert plan.automatic == ()  # pip chooses the release within the range: the model cannot verify it
    assert [s.kind for s in plan.steps] == ["manual", "manual"]
    assert plan.steps[0].command.endswith("pip install 'nvidia-nvjitlink<13.1,>=13.0.88'")
    assert plan.steps[1].command.startswith("use an NVIDIA driver >= 580")
    assert all(s.resolves == (found[0].id,) for s in plan.steps)


def test_a_requirer_that_pins_the_build_beyond_the_bound_is_named(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site, "nvidia-nvjitlink", "13.5.37", {"nvidia/cu13/lib/libnvJitLink.so.13": compile_so("libnvJitLink.so.13")}
    )
    write_dist(site, "pinner", "2.0", requires=["nvidia-nvjitlink==13.5.37"])
    (err,) = [f for f in errors(site, "max", "13.0")[0] if f.subject == "nvidia-nvjitlink 13.5.37"]
    manual = err.remedies[0]
    assert isinstance(manual, Manual)
    assert manual.steps == ("use the builds of pinner for CUDA <= 13.0, then install nvidia-nvjitlink<13.1,>=13.0",)
    assert "pinner 2.0 requires nvidia-nvjitlink==13.5.37, which admits none of them" in manual.why


def test_cuda_min_gets_the_range_above_and_no_driver_remedy(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site, "nvidia-nvjitlink", "13.0.88", {"nvidia/cu13/lib/libnvJitLink.so.13": compile_so("libnvJitLink.so.13")}
    )
    (err,) = errors(site, "min", "13.2")[0]
    (build,) = err.remedies  # an older minor runs on a newer driver anyway: nothing about drivers to say
    assert isinstance(build, UseBuild)
    assert build.install is not None
    assert build.install.specs == ("nvidia-nvjitlink<14,>=13.2",)


def test_a_wheel_that_brings_no_library_gets_no_driver_remedy(tmp_path):
    """Only a wheel that ships its own library runs on the driver alone; metadata alone says nothing."""
    site = site_packages(tmp_path / "venv")
    write_dist(site, "nvidia-nvjitlink", "13.5.37")
    (err,) = errors(site, "max", "13.0")[0]
    assert [type(r) for r in err.remedies] == [UseBuild]


def test_another_major_keeps_the_build_advice_without_a_spec(tmp_path):
    """A CUDA 13 wheel against --cuda-max=12.9: the CUDA 12 build is another distribution; no range of this
    one is within the bound, and minor-version compatibility does not cross majors."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site, "nvidia-nvjitlink", "13.5.37", {"nvidia/cu13/lib/libnvJitLink.so.13": compile_so("libnvJitLink.so.13")}
    )
    (err,) = errors(site, "max", "12.9")[0]
    (build,) = err.remedies
    assert isinstance(build, UseBuild)
    assert build.install is None


@pytest.mark.real
@pytest.mark.xdist_group("torch-venv")  # with the tests whose cp -al copies change the venv's inodes' ctime
def test_real_cuda_max_13_0_on_the_stock_torch_venv_names_the_nvjitlink_spec(monkeypatch, capsys, tmp_path):
    """pip pulled nvidia-nvjitlink 13.5 into the stock CUDA 13 torch venv (cuda-toolkit 13.0.3 accepts
    ``<14,>=13.0.88``): the plan names the release range within 13.0 that cuda-toolkit accepts, and that the
    wheel brings its own libnvJitLink.so.13, which the CUDA 13 driver branch runs."""
    venv = torch_venv()
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "elfcache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert main(["check", "--json", "--site", str(venv), "--cuda-max=13.0"]) == 1
    doc = json.loads(capsys.readouterr().out)
    errors = [f for found in doc["items"].values() for f in found if f["severity"] == "error"]
    jit = [f for f in errors if f["subject"].startswith("nvidia-nvjitlink ")]
    if not jit:
        pytest.skip("this venv's nvidia-nvjitlink is within 13.0")
    (step_build, step_driver) = [s for p in doc["repair"] for s in p["steps"] if jit[0]["id"] in s["resolves"]]
    assert step_build["kind"] == "manual"
    assert step_build["action"]["install"]["specs"] == ["nvidia-nvjitlink<13.1,>=13.0.88"]
    assert step_build["action"]["install"]["argv"][0] == str(venv / "bin/python")
    assert step_driver["action"]["kind"] == "driver"
    assert step_driver["action"]["minimum"] == "580"
