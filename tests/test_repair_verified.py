"""Verified repairs (issue 12, part 5): every fix an integrity or closure finding prints is checked against the
repair model first (model/repair.py ``verified_fixes``, ``predict``): a fix whose predicted state still has an
error is replaced by the one that leaves none, or by "no safe automatic repair is known"."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.checks.closure import extension_closures
from pytest_cudastack.checks.integrity import integrity_findings
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.repair import NO_SAFE_REPAIR, plan_repairs, predict
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from pytest_cudastack.wheels.requirements import requirement_facts
from tests.helpers.sitebuild import HAVE_CC, write_dist
from tests.test_repair import cudnn, venv

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

CU12 = ("nvidia-cudnn-cu12", "9.19.0.56")


def items(site: Path):
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner)
    return integrity_findings(inv, requirement_facts(inv)), extension_closures(inv, resolver), inv


def metadata_only(tmp_path: Path) -> Path:
    """The seed's state: cu12 installed over torch's pinned cu13 with --no-deps, then cu13 uninstalled (pip
    deletes every path cu13's RECORD lists: cu12's bytes); cu12's dist-info is left, its files are not."""
    site = venv(tmp_path)
    write_dist(site, *CU12, cudnn("cu12"), write_files=False)
    dist_info = site / "nvidia_cudnn_cu13-9.24.0.43.dist-info"
    for path in dist_info.iterdir():
        path.unlink()
    dist_info.rmdir()
    (site / "nvidia/cudnn/lib/libcudnn.so.9").unlink()
    return site


def test_closure_fix_is_not_the_naive_reinstall_of_the_stray(tmp_path):
    """The one missing soname is claimed by cu12 only: reinstalling cu12 (what the closure item printed) would
    give torch cu12's cuDNN where it pins cu13's; the model says so, and the fix is the verified plan."""
    site = metadata_only(tmp_path)
    integrity, closure, inv = items(site)
    (missing,) = [f for f in closure if f.failing]
    assert missing.subject == "libcudnn.so.9"
    expected = (
        "pip uninstall -y nvidia-cudnn-cu12 && pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43"
    )
    assert missing.fix == expected
    (stray,) = [f for f in integrity if f.failing]
    assert stray.fix == expected
    naive = predict([("install", "nvidia-cudnn-cu12", "9.19.0.56")], inv, findings=[missing])
    assert naive == [
        "torch 2.14.1 requires nvidia-cudnn-cu13==9.24.0.43, which would not be installed (it would load "
        "nvidia-cudnn-cu12 9.19.0.56's files from the same paths)"
    ]
    good = predict(
        [("uninstall", "nvidia-cudnn-cu12", None), ("install", "nvidia-cudnn-cu13", "9.24.0.43")],
        inv,
        findings=[missing, stray],
    )
    assert good == []


def test_integrity_item_prints_the_plans_one_command(tmp_path):
    """Two distributions lost their files: one finding each, both with the plan's single command."""
    site = venv(tmp_path)
    (site / "nvidia/cudnn/lib/libcudnn.so.9").unlink()
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    integrity, closure, inv = items(site)
    failing = [f for f in integrity if f.failing]
    assert len(failing) == 2
    (plan,) = plan_repairs([*integrity, *closure], inv)
    assert (
        plan.command == "pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43 nvidia-nccl-cu13==2.30.7"
    )
    assert {f.fix for f in failing} == {plan.command}
    assert {f.fix for f in closure if f.failing} == {plan.command}


def test_two_required_variants_have_no_safe_repair(tmp_path):
    """old-tool pins cu12, torch pins cu13: any pip command leaves one of them with the other's cuDNN."""
    site = venv(tmp_path)
    write_dist(site, *CU12, cudnn("cu12"))
    write_dist(site, "old-tool", "1.0", {"old_tool/__init__.py": ""}, requires=["nvidia-cudnn-cu12==9.19.0.56"])
    integrity, _closure, inv = items(site)
    failing = [f for f in integrity if f.failing]
    assert failing
    for f in failing:
        assert f.remedies[0].why.startswith(f"{NO_SAFE_REPAIR}: "), f.render()
        assert "pip install" not in f.fix.partition("By hand:")[2] or "they cannot share" in f.cause, f.fix
    (overlap,) = [f for f in failing if " / " in f.subject]
    assert "move the other's dependents to a separate environment" in overlap.fix
    pin = next(f for f in failing if f.subject == "torch -> nvidia-cudnn-cu13==9.24.0.43")
    assert "the model predicts that" in pin.remedies[0].why
    assert plan_repairs(failing, inv)[0].automatic == ()


def test_uninstalling_what_a_module_loads_is_an_error_of_the_model(tmp_path):
    site = venv(tmp_path)
    inv: Inventory = installed_wheels([str(site)], reader=read_elf)
    left = predict([("uninstall", "nvidia-nccl-cu13", None)], inv)
    assert "torch 2.14.1 requires nvidia-nccl-cu13==2.30.7, which would not be installed" in left
    assert any(t.startswith("libnccl.so.2 would be gone from ") for t in left)
    assert predict([("install", "nvidia-nccl-cu13", "2.30.7")], inv) == []
    unmet = predict([("install", "nvidia-nccl-cu13", "2.28.9")], inv)
    assert unmet == ["torch 2.14.1 requires nvidia-nccl-cu13==2.30.7, 2.28.9 would be installed"]


def test_clean_twin_keeps_its_findings_untouched(tmp_path):
    site = venv(tmp_path)
    integrity, closure, _inv = items(site)
    assert not [f for f in (*integrity, *closure) if f.failing]


def test_the_plan_claims_the_requirement_findings_its_steps_meet(tmp_path):
    """The requirements item's findings on the metadata-only state (torch's cu13 cuDNN pin absent) are among
    what the plan repairs; an unmet pin on a library the plan leaves alone stays unresolved."""
    from pytest_cudastack.checks.requirements import requirement_findings

    site = metadata_only(tmp_path)
    integrity, closure, inv = items(site)
    reqs = [f for f in requirement_findings(inv) if f.failing]
    assert [f.subject for f in reqs] == ["torch 2.14.1"]
    assert "nvidia-cudnn-cu13" in reqs[0].distributions
    (plan,) = plan_repairs([*integrity, *closure, *reqs], inv)
    assert "requirements: torch 2.14.1" in plan.fixes
    assert plan.unresolved == ()
    # the same finding with a pin the steps do not touch is not claimed
    from dataclasses import replace

    other = replace(reqs[0], subject="torch 2.14.1 nccl", distributions=("torch", "nvidia-nccl-cu13"), remedies=())
    (plan,) = plan_repairs([*integrity, *closure, other], inv)
    assert plan.unresolved == ("requirements: torch 2.14.1 nccl",)
    assert plan.steps[-1].kind == "manual"  # covered all the same: by hand, with the model's reason
    assert plan.steps[-1].resolves == ("requirements: torch 2.14.1 nccl",)


def test_absent_pinned_wheels_are_installed_and_the_model_resolves_what_they_add(tmp_path):
    """torch 2.0.1 without its pinned cu11 wheels (a --no-deps install): the plan installs them, automatically,
    because the model knows what each install adds to the search (the library table: nvidia-cublas-cu11 ships
    libcublas.so.11, nvidia-nvtx-cu11 libnvToolsExt.so.1) and finds no error left: the closure and the
    requirements findings are both resolved. A soname no absent pinned wheel ships stays a manual step."""
    from pytest_cudastack.checks.requirements import requirement_findings
    from tests.helpers.sitebuild import compile_so, site_packages

    site = site_packages(tmp_path / "venv")
    ext = compile_so(None, pyinit="_C", needed=["libcublas.so.11", "libnvToolsExt.so.1", "libfoo.so.3"])
    pins = ["nvidia-cublas-cu11==11.10.3.66", "nvidia-nvtx-cu11==11.7.91"]
    write_dist(site, "torch", "2.0.1", {"torch/_C.cpython-311-x86_64-linux-gnu.so": ext}, requires=pins)
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner)
    closure = [f for f in extension_closures(inv, resolver) if f.failing]
    reqs = [f for f in requirement_findings(inv) if f.failing]
    assert sorted(f.subject for f in closure) == ["libcublas.so.11", "libfoo.so.3", "libnvToolsExt.so.1"]
    (plan,) = plan_repairs([*closure, *reqs], inv)
    automatic = [s.command for s in plan.automatic]
    assert automatic == ["pip install nvidia-cublas-cu11==11.10.3.66 nvidia-nvtx-cu11==11.7.91"]
    assert set(plan.fixes) == {"requirements: torch 2.0.1", "closure: libcublas.so.11", "closure: libnvToolsExt.so.1"}
    assert plan.unresolved == ("closure: libfoo.so.3",)
    assert [s.kind for s in plan.steps][-1] == "manual"
    # the clean twin: nothing to plan
    write_dist(
        site, "nvidia-cublas-cu11", "11.10.3.66", {"nvidia/cublas/lib/libcublas.so.11": compile_so("libcublas.so.11")}
    )
    assert predict([("install", "nvidia-nvtx-cu11", "11.7.91")], installed_wheels([str(site)], reader=read_elf)) == []


def test_an_install_the_model_cannot_pin_is_a_manual_step(tmp_path):
    """A missing requirement stated as a range (``nvidia-nvtx-cu11>=11.7``): which release pip takes is the
    index's choice, so the model cannot verify the install; the plan carries it as a manual step, never as an
    automatic one. Its twin with an exact pin is automatic."""
    from pytest_cudastack.checks.requirements import requirement_findings
    from tests.helpers.sitebuild import site_packages

    for spec, kind in (("nvidia-nvtx-cu11>=11.7", "manual"), ("nvidia-nvtx-cu11==11.7.91", "automatic")):
        site = site_packages(tmp_path / kind)
        write_dist(site, "torch", "2.0.1", {"torch/__init__.py": ""}, requires=[spec])
        inv = installed_wheels([str(site)], reader=read_elf)
        (f,) = [f for f in requirement_findings(inv) if f.failing]
        (plan,) = plan_repairs([f], inv)
        (step,) = plan.steps
        assert step.kind == kind, plan.render()
        assert step.resolves == (f.id,)
