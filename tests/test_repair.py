"""The repair plan (model/repair.py) and the grouping of findings that share one cause (bounds, closure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.checks.bounds import bound_findings, group_by_requirer
from pytest_cudastack.checks.closure import extension_closures
from pytest_cudastack.checks.integrity import check_integrity
from pytest_cudastack.cli import main
from pytest_cudastack.errors import DataError
from pytest_cudastack.findings import Finding
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.model.needs import infer_wheel
from pytest_cudastack.model.repair import plan_repairs, render_plans
from pytest_cudastack.model.torchindex import index_for, validate_indexes
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

EXT = "_C.cpython-311-x86_64-linux-gnu.so"
RPATH = "$ORIGIN/lib:$ORIGIN/../nvidia/nccl/lib:$ORIGIN/../nvidia/cudnn/lib"
CU13 = {"nvidia-cudnn-cu13": "9.24.0.43", "nvidia-nccl-cu13": "2.30.7"}
TORCH_REQUIRES = [f'{name}=={version}; platform_system == "Linux"' for name, version in CU13.items()]


def cudnn(flavour: str) -> dict[str, bytes | str]:
    return {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", payload=f"cudnn {flavour}" * 3)}


def venv(tmp_path: Path) -> Path:
    """A torch-like venv: torch's extension module, which ``import torch`` loads, needs cuDNN and NCCL from
    the cu13 wheels it pins."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "torch",
        "2.14.1",
        {
            "torch/__init__.py": "from torch import _C\n",  # as torch's: `import torch` loads torch._C
            f"torch/{EXT}": compile_so(None, pyinit="_C", needed=["libtorch_x.so"], rpath=RPATH),
            "torch/lib/libtorch_x.so": compile_so(
                "libtorch_x.so",
                needed=["libnccl.so.2", "libcudnn.so.9"],
                rpath="$ORIGIN/../../nvidia/nccl/lib:$ORIGIN/../../nvidia/cudnn/lib",
            ),
        },
        requires=TORCH_REQUIRES,
    )
    write_dist(site, "nvidia-cudnn-cu13", CU13["nvidia-cudnn-cu13"], cudnn("cu13"))
    write_dist(
        site, "nvidia-nccl-cu13", CU13["nvidia-nccl-cu13"], {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2")}
    )
    return site


def findings_of(site: Path) -> tuple[tuple[Finding, ...], Inventory]:
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner)
    return (*check_integrity(inv), *extension_closures(inv, resolver)), inv


def commands(site: Path) -> list[str]:
    found, inv = findings_of(site)
    plans = plan_repairs(found, inv)
    return [step.command for plan in plans for step in plan.steps]


def test_clean_twin_has_no_plan(tmp_path, capsys):
    site = venv(tmp_path)
    found, inv = findings_of(site)
    assert not [f for f in found if f.failing]
    assert plan_repairs(found, inv) == ()
    assert render_plans(()) == ""
    main(["report", "--site", str(site)])
    assert "repair plan" not in capsys.readouterr().out


def test_files_gone_one_command_for_all(tmp_path, capsys):
    site = venv(tmp_path)
    (site / "nvidia/cudnn/lib/libcudnn.so.9").unlink()
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    found, inv = findings_of(site)
    failing = [f for f in found if f.failing]
    assert len(failing) == 3  # two integrity (one per distribution), one closure (both sonames)
    (plan,) = plan_repairs(found, inv)
    assert [s.command for s in plan.steps] == [
        "pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43 nvidia-nccl-cu13==2.30.7"
    ]
    assert len(plan.fixes) == 3
    assert plan.unresolved == ()
    assert plan.environment == str(tmp_path / "venv")
    (closure,) = [f for f in failing if f.check == "closure"]
    assert closure.fix == plan.command
    lines = closure.render().splitlines()
    assert len(lines) <= 15
    assert f"  fix: {plan.command}" in lines
    assert {"libcudnn.so.9", "libnccl.so.2"} <= set(lines[0].replace(";", ",").replace(":", ",").split(", "))
    assert main(["report", "--site", str(site)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"repair plan for {tmp_path / 'venv'}:\n  cause: ")  # the plan first
    assert f"\n  1. [run] {plan.command}\n" in out
    assert out.count(plan.command) == 1  # printed once: each finding points at its step
    assert out.count(f"fix: step 1 of the repair plan for {tmp_path / 'venv'}") == 3


def test_cu12_over_cu13_removes_the_stray_then_reinstalls_the_pinned(tmp_path):
    site = venv(tmp_path)
    write_dist(site, "nvidia-cudnn-cu12", "9.19.0.56", cudnn("cu12"))  # pip install --no-deps over cu13's files
    assert commands(site) == [
        "pip uninstall -y nvidia-cudnn-cu12",
        "pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43",
    ]


def test_metadata_only_stray_is_removed_not_reinstalled(tmp_path):
    """The incident's "metadata-only" nvidia-cudnn-cu12 while torch pins cu13 (uninstalled since): reinstalling
    cu12 would put its bytes where torch's pinned cuDNN belongs; the plan removes it and installs the pin."""
    site = venv(tmp_path)
    write_dist(site, "nvidia-cudnn-cu12", "9.19.0.56", cudnn("cu12"), write_files=False)
    for path in (site / "nvidia_cudnn_cu13-9.24.0.43.dist-info").iterdir():
        path.unlink()
    (site / "nvidia_cudnn_cu13-9.24.0.43.dist-info").rmdir()
    (site / "nvidia/cudnn/lib/libcudnn.so.9").unlink()
    found, inv = findings_of(site)
    stray = next(f for f in found if f.subject == "nvidia-cudnn-cu12 9.19.0.56")
    assert "ships nothing it claims" in stray.message
    assert stray.fix == (
        "pip uninstall -y nvidia-cudnn-cu12 && pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43"
    )
    (plan,) = plan_repairs(found, inv)
    assert [s.command for s in plan.steps] == [
        "pip uninstall -y nvidia-cudnn-cu12",
        "pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43",
    ]
    assert not any("nvidia-cudnn-cu12==" in s.command for s in plan.steps)
    assert set(plan.fixes) == {"integrity: nvidia-cudnn-cu12 9.19.0.56", "closure: libcudnn.so.9"}


def test_no_step_when_the_model_still_has_the_overlap(tmp_path):
    """Two installed distributions require the two variants: any reinstall leaves one's bytes on the other's
    paths, so the model finds the overlap again and the plan prints no command for it."""
    site = venv(tmp_path)
    write_dist(site, "nvidia-cudnn-cu12", "9.19.0.56", cudnn("cu12"))
    write_dist(site, "old-tool", "1.0", {"old_tool/__init__.py": ""}, requires=["nvidia-cudnn-cu12==9.19.0.56"])
    found, inv = findings_of(site)
    (plan,) = plan_repairs(found, inv)
    assert plan.automatic == ()
    assert "integrity: nvidia-cudnn-cu12 / nvidia-cudnn-cu13" in plan.unresolved
    assert all(s.kind == "manual" for s in plan.steps)  # every error still has its step, by hand
    assert "[run]" not in render_plans((plan,))


def test_a_soname_no_wheel_ships_is_unresolved(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "m", "1", {"m/_m.so": compile_so(None, pyinit="_m", needed=["libnowhere.so.7"])})
    found, inv = findings_of(site)
    (plan,) = plan_repairs(found, inv)
    assert plan.automatic == ()
    assert plan.unresolved == ("closure: libnowhere.so.7",)
    (step,) = plan.steps
    assert step.resolves == ("closure: libnowhere.so.7",)
    assert step.why.startswith("no safe automatic repair is known: ")


# -- one finding for torch's CUDA 13 build -----------------------------------------------------------------------


def cuda13_torch(tmp_path: Path) -> Path:
    site = site_packages(tmp_path / "venv")
    write_dist(
        site, "torch", "2.14.1", {"torch/__init__.py": ""}, requires=["cuda-toolkit[cublas]==13.0.3", *TORCH_REQUIRES]
    )
    write_dist(site, "cuda-toolkit", "13.0.3.0", requires=['nvidia-cublas==13.1.1.3.*; extra == "cublas"'])
    write_dist(site, "nvidia-cublas", "13.1.1.3", {"nvidia/cu13/lib/libcublas.so.13": compile_so("libcublas.so.13")})
    write_dist(site, "nvidia-cudnn-cu13", CU13["nvidia-cudnn-cu13"], cudnn("cu13"), requires=["nvidia-cublas"])
    write_dist(
        site, "nvidia-nccl-cu13", CU13["nvidia-nccl-cu13"], {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2")}
    )
    write_dist(site, "nvidia-cufile", "1.15.1.6")  # required by nothing: its own finding
    return site


def test_cuda_max_torch_cuda13_build_is_one_finding(tmp_path):
    inv = installed_wheels([str(cuda13_torch(tmp_path))], reader=read_elf)
    raw = bound_findings("max", "12.9", [infer_wheel(d) for d in inv.distributions], "--cuda-max=12.9")
    assert len([f for f in raw if f.failing]) == 6
    grouped = group_by_requirer(raw, inv, "max", "12.9")
    assert [f.subject for f in grouped if f.failing] == ["nvidia-cufile 1.15.1.6", "torch 2.14.1"]
    torch = next(f for f in grouped if f.subject == "torch 2.14.1")
    assert torch.message == (
        "torch 2.14.1 is a CUDA 13 build; it pulls 4 CUDA 13 wheel(s): cuda-toolkit, nvidia-cublas, "
        "nvidia-cudnn-cu13, nvidia-nccl-cu13, but --cuda-max=12.9"
    )
    assert "nvidia-cublas 13.1.1.3 (torch -> cuda-toolkit -> nvidia-cublas): " in "\n".join(torch.details) or (
        "nvidia-cublas 13.1.1.3 (torch -> nvidia-cudnn-cu13 -> nvidia-cublas): " in "\n".join(torch.details)
    )
    assert set(torch.distributions) == {
        "torch",
        "cuda-toolkit",
        "nvidia-cublas",
        "nvidia-cudnn-cu13",
        "nvidia-nccl-cu13",
    }
    assert torch.fix == (
        "pip uninstall -y torch cuda-toolkit nvidia-cublas nvidia-cudnn-cu13 nvidia-nccl-cu13; use a build for "
        "CUDA <= 12.9 of torch: pip install --index-url https://download.pytorch.org/whl/cu129 torch==2.14.1"
    )
    assert torch.facts.bound == "12.9"
    assert "that it carries torch 2.14.1 is a guess" in torch.pip[-1].why
    (plan,) = plan_repairs(grouped, inv)
    assert [s.command for s in plan.steps] == [
        "pip uninstall -y cuda-toolkit nvidia-cublas nvidia-cudnn-cu13 nvidia-nccl-cu13 torch",
        "pip install --index-url https://download.pytorch.org/whl/cu129 torch==2.14.1",
        "use a build for CUDA <= 12.9 of nvidia-cufile",
    ]
    assert plan.fixes == ("cuda-max: torch 2.14.1",)
    assert plan.unresolved == ("cuda-max: nvidia-cufile 1.15.1.6",)
    assert [s.kind for s in plan.steps] == ["automatic", "automatic", "manual"]
    assert any("is a guess" in n for n in plan.notes)


def test_cuda_max_from_ini_plans_the_same(tmp_path):
    inv = installed_wheels([str(cuda13_torch(tmp_path))], reader=read_elf)
    raw = bound_findings("max", "12.9", [infer_wheel(d) for d in inv.distributions], "--cuda-max=12.9 (from ini)")
    (plan,) = plan_repairs(group_by_requirer(raw, inv, "max", "12.9"), inv)
    assert plan.automatic[-1].command == "pip install --index-url https://download.pytorch.org/whl/cu129 torch==2.14.1"


def test_no_torch_rebuild_while_a_variant_would_stay(tmp_path):
    """A CUDA variant wheel outside torch's group would share its paths with the one the new build pulls."""
    site = cuda13_torch(tmp_path)
    write_dist(site, "nvidia-nvshmem-cu13", "3.4.5")  # required by nothing: outside torch's group
    inv = installed_wheels([str(site)], reader=read_elf)
    raw = bound_findings("max", "12.9", [infer_wheel(d) for d in inv.distributions], "--cuda-max=12.9")
    grouped = group_by_requirer(raw, inv, "max", "12.9")
    (plan,) = plan_repairs(grouped, inv)
    assert plan.automatic == ()
    assert "cuda-max: torch 2.14.1" in plan.unresolved


def test_cuda_max_single_violation_is_not_grouped(tmp_path):
    inv = installed_wheels([str(cuda13_torch(tmp_path))], reader=read_elf)
    raw = bound_findings("max", "12.9", [infer_wheel(inv.get("nvidia-cufile"))], "--cuda-max=12.9")
    assert group_by_requirer(raw, inv, "max", "12.9") == raw


def test_torch_index_table():
    assert index_for("max", "12.9", 13).tag == "cu129"
    assert index_for("max", "12.4", 13).tag == "cu124"
    assert index_for("min", "13.0", 12).tag == "cu130"
    assert index_for("max", "11.0", 13) is None
    with pytest.raises(DataError, match=r"'sources' must be a non-empty object"):
        validate_indexes({"schema": 1, "url": "u/{tag}", "sources": {}, "indexes": [{"tag": "cu1", "cuda": "1.0"}]})
    source = {"s": {"url": "https://download.pytorch.org/whl/", "retrieved": "2026-01-01"}}
    with pytest.raises(DataError, match=r"url: .u/. does not match"):  # the schema asks for {tag}
        validate_indexes(
            {"schema": 1, "url": "u/", "sources": source, "indexes": [{"tag": "cu1", "cuda": "1.0", "source": "s"}]}
        )


def test_plan_json_shape(tmp_path):
    site = venv(tmp_path)
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    found, inv = findings_of(site)
    (plan,) = plan_repairs(found, inv)
    doc = plan.to_json()
    assert doc["steps"][0]["argv"][:2] == ["pip", "install"]
    assert doc["command"] == plan.command
    assert doc["unresolved"] == []


def test_a_driver_too_old_for_the_cuda13_torch_is_one_error_with_a_pip_plan(tmp_path):
    """--cuda-driver=550.54.15 (CUDA <= 12.4) on a CUDA 13 torch: one error for one cause, whose remedies are
    data (a driver >= the one CUDA 13.0 needs; torch's build for CUDA 12.4), and a plan whose automatic steps
    the model verified: torch and its CUDA 13 wheels out, torch from PyTorch's cu124 index."""
    from pytest_cudastack.checks.driver import driver_findings
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.findings import DriverUpgrade, UseBuild

    inv = installed_wheels([str(cuda13_torch(tmp_path))], reader=read_elf)
    driver = DriverInfo("declared", "550.54.15", "12.4")
    found = driver_findings([infer_wheel(d) for d in inv.distributions], driver)
    (error,) = [f for f in found if f.failing]
    assert error.distributions[0] == "torch"
    assert error.facts.bound == "12.4"
    upgrade = next(r for r in error.remedies if isinstance(r, DriverUpgrade))
    assert (upgrade.minimum.split(".")[0], upgrade.cuda) == ("580", "13.0")
    build = next(r for r in error.remedies if isinstance(r, UseBuild))
    assert build.install is not None
    assert build.install.index_url == "https://download.pytorch.org/whl/cu124"
    plans = plan_repairs(found, inv)
    (plan,) = [p for p in plans if p.automatic]
    assert plan.automatic[-1].command == "pip install --index-url https://download.pytorch.org/whl/cu124 torch==2.14.1"
    assert error.id in plan.fixes
    # the clean twin: a driver that runs CUDA 13 gives no error and no plan
    ok = driver_findings([infer_wheel(d) for d in inv.distributions], DriverInfo("declared", "580.65.06", "13.0"))
    assert not [f for f in ok if f.failing]
    assert plan_repairs(ok, inv) == ()


def test_the_plan_re_resolves_a_missing_soname_over_the_paths_its_search_tried(tmp_path):
    """The wheel lists the library outside the module's search, and the file is gone: the reinstall repairs
    the integrity finding, and the plan (built from the findings alone, as the pytest controller builds it)
    does not claim the closure finding, whose search (``facts.tried``) would still find nothing."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "m",
        "1",
        {"m/__init__.py": "", "m/_m.abi3.so": compile_so(None, pyinit="_m", needed=["libfoo.so.1"], rpath="$ORIGIN")},
    )
    write_dist(site, "foo-lib", "2.0", {"vendor/lib/libfoo.so.1": compile_so("libfoo.so.1")})
    (site / "vendor/lib/libfoo.so.1").unlink()
    found, inv = findings_of(site)
    (closure,) = [f for f in found if f.check == "closure" and f.failing]
    assert str(site / "m/libfoo.so.1") in closure.facts.tried
    (plan,) = plan_repairs(found, inv)
    assert [s.kind for s in plan.automatic] == ["automatic"]
    assert closure.id not in plan.fixes
    assert closure.id in plan.unresolved
    assert any(closure.id in s.resolves for s in plan.steps if s.kind == "manual")
