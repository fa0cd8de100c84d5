"""The repair model claims dlopen findings: after a plan's steps, each run-time load is searched again over the
predicted files (the caller's own search, ``facts.tried``), and a load no step repairs keeps a manual step."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.checks.dlopen import dlopen_findings
from pytest_cudastack.checks.integrity import check_integrity
from pytest_cudastack.findings import Finding, Manual
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.strings import read_strings
from pytest_cudastack.model.modules import module_trees
from pytest_cudastack.model.repair import plan_repairs
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

EXT = "_C.cpython-311-x86_64-linux-gnu.so"
SUBS = ["graph", "ops", "cnn", "adv", "engines_precompiled", "engines_runtime_compiled", "heuristic"]


def cudnn_site(tmp_path: Path, wheel: str = "nvidia-cudnn-cu13", version: str = "9.24.0.43") -> Path:
    """An extension module loading cuDNN 9 from ``wheel``, which ships the sub-libraries libcudnn.so.9 opens at
    run time (the dlopen table's cuDNN rows)."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "netlib",
        "1.0",
        {f"netlib/{EXT}": compile_so(None, pyinit="_C", needed=["libcudnn.so.9"], rpath="$ORIGIN/../nvidia/cudnn/lib")},
        requires=[f"{wheel}=={version}"],
    )
    files = {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", rpath="$ORIGIN")}
    files.update(
        {f"nvidia/cudnn/lib/libcudnn_{s}.so.9": compile_so(f"libcudnn_{s}.so.9", rpath="$ORIGIN") for s in SUBS}
    )
    write_dist(site, wheel, version, files)
    return site


def found(site: Path, *, integrity: bool = True) -> tuple[list[Finding], Inventory]:
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig(default_dirs=()), reader=read_elf, owner=inv.owner)
    loads = dlopen_findings(inv, resolver, read_elf, read_strings, module_trees(inv, resolver))
    return [*(check_integrity(inv) if integrity else ()), *loads], inv


@pytest.mark.parametrize(("wheel", "version"), [("nvidia-cudnn-cu13", "9.24.0.43"), ("nvidia-cudnn-cu12", "9.19.0.56")])
def test_a_reinstall_that_puts_the_sub_library_back_claims_the_dlopen_error(tmp_path, wheel, version):
    site = cudnn_site(tmp_path, wheel, version)
    (site / "nvidia/cudnn/lib/libcudnn_ops.so.9").unlink()
    findings, inv = found(site)
    (dl,) = [f for f in findings if f.failing and f.check == "dlopen"]
    assert dl.facts.tried
    assert dl.facts.tried[0].endswith("nvidia/cudnn/lib/libcudnn_ops.so.9")
    assert Finding.from_json(dl.to_json()) == dl  # as xdist carries it to the controller, tried included
    (plan,) = plan_repairs(findings, inv)
    (step,) = plan.steps
    assert step.kind == "automatic"
    assert step.command == f"pip install --force-reinstall --no-deps {wheel}=={version}"
    assert dl.id in step.resolves
    assert dl.id in plan.fixes
    assert plan.unresolved == ()


def test_the_dlopen_finding_alone_gets_the_reinstall_of_the_wheel_listing_its_target(tmp_path):
    """Without the integrity finding, the dlopen finding names what ships its soname (as closure does)."""
    site = cudnn_site(tmp_path)
    (site / "nvidia/cudnn/lib/libcudnn_graph.so.9").unlink()
    findings, inv = found(site, integrity=False)
    (dl,) = [f for f in findings if f.failing]
    (plan,) = plan_repairs(findings, inv)
    assert [(s.kind, s.resolves) for s in plan.steps] == [("automatic", (dl.id,))]


def test_a_target_no_wheel_ships_stays_unresolved_with_its_manual_step(tmp_path):
    site = cudnn_site(tmp_path)
    write_dist(  # the wheel as if built without libcudnn_adv: nothing installed lists it
        site,
        "nvidia-cudnn-cu13",
        "9.24.0.43",
        {
            "nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", rpath="$ORIGIN"),
            **{
                f"nvidia/cudnn/lib/libcudnn_{s}.so.9": compile_so(f"libcudnn_{s}.so.9", rpath="$ORIGIN")
                for s in SUBS
                if s != "adv"
            },
        },
    )
    (site / "nvidia/cudnn/lib/libcudnn_adv.so.9").unlink()
    findings, inv = found(site)
    (dl,) = [f for f in findings if f.failing]
    assert dl.check == "dlopen"
    (plan,) = plan_repairs(findings, inv)
    assert plan.automatic == ()
    assert plan.unresolved == (dl.id,)
    (step,) = plan.steps
    assert step.kind == "manual"
    assert isinstance(step.action, Manual)
    assert step.resolves == (dl.id,)
    assert "libcudnn_adv.so.9" in step.action.steps[0]


def test_a_reinstall_that_writes_the_target_outside_the_callers_search_does_not_claim_it(tmp_path):
    """The wheel's RECORD lists the sub-library in another directory: the reinstall repairs the integrity
    finding, and the search, done again over the predicted files, still misses it."""
    site = cudnn_site(tmp_path)
    libs = {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", rpath="$ORIGIN")}
    libs.update(
        {
            f"nvidia/cudnn/lib/libcudnn_{s}.so.9": compile_so(f"libcudnn_{s}.so.9", rpath="$ORIGIN")
            for s in SUBS
            if s != "cnn"
        }
    )
    libs["nvidia/cudnn/extra/libcudnn_cnn.so.9"] = compile_so("libcudnn_cnn.so.9")
    (site / "nvidia/cudnn/lib/libcudnn_cnn.so.9").unlink()
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43", libs)
    (site / "nvidia/cudnn/extra/libcudnn_cnn.so.9").unlink()
    findings, inv = found(site)
    (dl,) = [f for f in findings if f.failing and f.check == "dlopen"]
    gone = [f for f in findings if f.failing and f.check == "integrity"]
    assert gone
    (plan,) = plan_repairs(findings, inv)
    assert [s.kind for s in plan.steps] == ["automatic", "manual"]
    assert {g.id for g in gone} <= set(plan.steps[0].resolves)
    assert dl.id not in plan.steps[0].resolves
    assert dl.id in plan.unresolved
    assert plan.steps[1].resolves == (dl.id,)


def test_nvrtc_builtins_put_back_by_their_wheel_are_claimed(tmp_path):
    """Another caller and name (libnvrtc's builtins, through the module's RPATH chain)."""
    site = site_packages(tmp_path / "venv")
    lib = "$ORIGIN/../nvidia/cu12/lib"
    write_dist(
        site, "kern", "2.0", {f"kern/{EXT}": compile_so(None, pyinit="_C", needed=["libnvrtc.so.12"], rpath=lib)}
    )
    files = {
        "nvidia/cu12/lib/libnvrtc.so.12": compile_so("libnvrtc.so.12", payload="libnvrtc-builtins.so.12.9"),
        "nvidia/cu12/lib/libnvrtc-builtins.so.12.9": compile_so("libnvrtc-builtins.so.12.9"),
    }
    write_dist(site, "nvidia-cuda-nvrtc-cu12", "12.9.86", files)
    (site / "nvidia/cu12/lib/libnvrtc-builtins.so.12.9").unlink()
    findings, inv = found(site)
    (dl,) = [f for f in findings if f.failing and f.check == "dlopen"]
    (plan,) = plan_repairs(findings, inv)
    assert plan.unresolved == ()
    assert plan.steps[0].command == "pip install --force-reinstall --no-deps nvidia-cuda-nvrtc-cu12==12.9.86"
    assert dl.id in plan.steps[0].resolves
