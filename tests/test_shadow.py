"""checks/shadow.py on gcc-built fixtures: a torch-like extension module whose wheel pins
nvidia-cudnn-cu13==9.24.0.43 (RUNPATH to the wheel's copy) and another libcudnn.so.9 on LD_LIBRARY_PATH,
its version in its file name, in a cudnn_version.h next to it, or nowhere; broken and clean twins. ldd is
the oracle for which copy the loader takes."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_cudastack.checks.shadow import shadow_findings
from pytest_cudastack.findings import SearchPath, Severity
from pytest_cudastack.linker.resolver import SearchConfig
from pytest_cudastack.model.repair import plan_repairs
from pytest_cudastack.stack import Stack
from tests.helpers.elfbuild import needs_ldd
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

EXT = "torch/_C.cpython-311-x86_64-linux-gnu.so"
HEADER = "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR {minor}\n#define CUDNN_PATCHLEVEL 0\n"


def build(tmp_path: Path, other: str | None, *, header_minor: int | None = None) -> tuple[Path, Path]:
    """The site, and the directory put on LD_LIBRARY_PATH holding ``other`` (a real file name; ``libcudnn.so.9``
    links to it), with a cudnn_version.h of ``header_minor`` in ``../include`` when given."""
    site = site_packages(tmp_path / "venv")
    ext = compile_so(None, pyinit="_C", needed=["libcudnn.so.9"], runpath="$ORIGIN/../nvidia/cudnn/lib")
    write_dist(site, "torch", "2.14.1", {EXT: ext}, requires=["nvidia-cudnn-cu13==9.24.0.43"])
    write_dist(
        site,
        "nvidia-cudnn-cu13",
        "9.24.0.43",
        {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", payload="wheel 9.24")},
    )
    llp = tmp_path / "opt" / "cudnn" / "lib"
    llp.mkdir(parents=True)
    if other is not None:
        (llp / other).write_bytes(compile_so("libcudnn.so.9", payload=f"other {other}"))
        if other != "libcudnn.so.9":
            os.symlink(other, llp / "libcudnn.so.9")
    if header_minor is not None:
        include = llp.parent / "include"
        include.mkdir()
        (include / "cudnn_version.h").write_text(HEADER.format(minor=header_minor))
    return site, llp


def findings(site: Path, llp: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(llp))
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    monkeypatch.delenv("PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK", raising=False)
    stack = Stack(site_paths=(str(site),))
    return stack, shadow_findings(stack)


def test_an_older_cudnn_on_ld_library_path_shadows_the_pinned_wheel(tmp_path, monkeypatch):
    site, llp = build(tmp_path, "libcudnn.so.9.19.0")
    stack, found = findings(site, llp, monkeypatch)
    (f,) = found
    assert f.severity is Severity.ERROR
    assert f.subject == "libcudnn.so.9"
    assert f.message == (
        f"torch 2.14.1 would load libcudnn.so.9 from {llp}/libcudnn.so.9 (via LD_LIBRARY_PATH), not the copy of "
        "its own nvidia-cudnn-cu13 9.24.0.43: cuDNN (9, 19, 0) instead of (9, 24, 0)"
    )
    assert "torch 2.14.1 requires nvidia-cudnn-cu13==9.24.0.43" in f.cause
    assert (
        '"cuDNN version incompatibility: PyTorch was compiled against (9, 24, 0) but found runtime version (9, 19, 0)"'
        in f.cause
    )
    assert f.details == (
        f"winner: {llp}/libcudnn.so.9 (no installed distribution; (9, 19, 0), from the file name libcudnn.so.9.19.0)",
        f"expected: {site}/nvidia/cudnn/lib/libcudnn.so.9 (nvidia-cudnn-cu13 9.24.0.43; (9, 24, 0), from its wheel "
        "nvidia-cudnn-cu13 9.24.0.43)",
    )
    (step,) = f.remedies  # a manual step, field by field: remove that directory from LD_LIBRARY_PATH
    assert isinstance(step, SearchPath)
    assert (step.directory, step.path, step.op) == (str(llp), "LD_LIBRARY_PATH", "remove")
    assert step.why == (
        f"checked: torch then loads {site}/nvidia/cudnn/lib/libcudnn.so.9 and finds every other library it loads now"
    )
    (plan,) = plan_repairs([f], stack.inventory)
    assert [(s.kind, s.action) for s in plan.steps] == [("manual", step)]
    # the whole item says it once: the framework rule defers to this finding
    assert [g for g in stack.findings("requirements") if g.failing] == [f]


def test_the_same_version_on_ld_library_path_is_clean(tmp_path, monkeypatch):
    site, llp = build(tmp_path, "libcudnn.so.9.24.0")
    stack, found = findings(site, llp, monkeypatch)
    assert found == ()
    assert stack.findings("requirements") == ()


def test_a_newer_minor_passes_torchs_own_check_and_is_a_warning(tmp_path, monkeypatch):
    site, llp = build(tmp_path, "libcudnn.so.9.26.0")
    _, (f,) = findings(site, llp, monkeypatch)
    assert f.severity is Severity.WARNING
    assert "cuDNN (9, 26, 0) instead of (9, 24, 0)" in f.message


def test_the_version_header_next_to_an_unversioned_file(tmp_path, monkeypatch):
    site, llp = build(tmp_path, "libcudnn.so.9", header_minor=19)
    _, (f,) = findings(site, llp, monkeypatch)
    assert f.severity is Severity.ERROR
    assert "(9, 19, 0), from cudnn_version.h next to it" in f.details[0]


def test_an_unreadable_version_cannot_be_decided(tmp_path, monkeypatch):
    site, llp = build(tmp_path, "libcudnn.so.9")
    _, (f,) = findings(site, llp, monkeypatch)
    assert f.severity is Severity.INFO
    assert "cannot be decided statically because" in f.cause


def test_no_other_copy_no_finding(tmp_path, monkeypatch):
    site, llp = build(tmp_path, None)
    stack, found = findings(site, llp, monkeypatch)
    assert found == ()
    lib = next(x for x in stack.tree(str(site / EXT)).libraries if x.soname == "libcudnn.so.9")
    assert lib.path == f"{site}/torch/../nvidia/cudnn/lib/libcudnn.so.9"


def test_a_consumer_that_does_not_require_the_wheel_is_not_judged(tmp_path, monkeypatch):
    site, llp = build(tmp_path, "libcudnn.so.9.19.0")
    write_dist(site, "torch", "2.14.1", {EXT: (site / EXT).read_bytes()})  # METADATA without the pin
    _, found = findings(site, llp, monkeypatch)
    assert found == ()


@needs_ldd
def test_ldd_loads_the_copy_the_finding_names(tmp_path, monkeypatch):
    site, llp = build(tmp_path, "libcudnn.so.9.19.0")
    _, (f,) = findings(site, llp, monkeypatch)
    ldd = shutil.which("ldd")
    assert ldd is not None
    out = subprocess.run(
        [ldd, str(site / EXT)], env={"LD_LIBRARY_PATH": str(llp)}, capture_output=True, text=True, check=True
    ).stdout
    line = next(x for x in out.splitlines() if "libcudnn.so.9" in x)
    assert f"=> {llp}/libcudnn.so.9 " in line
    assert f"from {llp}/libcudnn.so.9 " in f.message


def test_another_wheels_copy_is_judged_by_that_wheels_version(tmp_path, monkeypatch):
    # LD_LIBRARY_PATH into a second environment's nvidia-cudnn-cu12 9.19.0.56 (the incident's cu12 cuDNN)
    site, _ = build(tmp_path, None)
    other = site_packages(tmp_path / "other")
    write_dist(
        other,
        "nvidia-cudnn-cu12",
        "9.19.0.56",
        {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", payload="cu12 9.19")},
    )
    monkeypatch.setenv("LD_LIBRARY_PATH", str(other / "nvidia/cudnn/lib"))
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    (f,) = shadow_findings(Stack(site_paths=(str(site), str(other))))
    assert f.severity is Severity.ERROR
    assert f.details[0] == (
        f"winner: {other}/nvidia/cudnn/lib/libcudnn.so.9 (nvidia-cudnn-cu12 9.19.0.56; (9, 19, 0), from its wheel "
        "nvidia-cudnn-cu12 9.19.0.56)"
    )


def test_a_system_copy_wins_when_the_consumer_cannot_reach_its_wheel(tmp_path, monkeypatch):
    # the consumer's RUNPATH misses its wheel's directory (a lib64/lib split): the default directory's copy
    # (a /usr/local/cuda-style install named libcudnn.so.9.19.0) is the one loaded
    site = site_packages(tmp_path / "venv")
    ext = compile_so(None, pyinit="_C", needed=["libcudnn.so.9"], runpath="$ORIGIN/../nowhere")
    write_dist(site, "torch", "2.14.1", {EXT: ext}, requires=["nvidia-cudnn-cu13==9.24.0.43"])
    write_dist(
        site,
        "nvidia-cudnn-cu13",
        "9.24.0.43",
        {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", payload="wheel 9.24")},
    )
    system = tmp_path / "usr" / "local" / "cuda" / "lib64"
    system.mkdir(parents=True)
    (system / "libcudnn.so.9.19.0").write_bytes(compile_so("libcudnn.so.9", payload="system 9.19"))
    os.symlink("libcudnn.so.9.19.0", system / "libcudnn.so.9")
    config = SearchConfig.from_environment({})
    monkeypatch.setattr(
        SearchConfig,
        "from_environment",
        classmethod(lambda cls, environ=None, root="/": replace(config, default_dirs=(str(system),), ld_cache=None)),
    )
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    (f,) = shadow_findings(Stack(site_paths=(str(site),)))
    assert f.severity is Severity.ERROR
    assert f"from {system}/libcudnn.so.9 (via default (default directories))" in f.message
    by_hand, search = f.remedies
    assert by_hand.why.startswith(
        f"no safe automatic repair is known: {system} is a default directory, and torch's RUNPATH does not reach "
        f"{site}/nvidia/cudnn/lib"
    )
    want = f"reinstall torch so that its RUNPATH reaches {site}/nvidia/cudnn/lib"
    assert by_hand.steps[0] == f"{want} (a virtual environment: one site directory)"
    assert (search.directory, search.op) == (f"{site}/nvidia/cudnn/lib", "prepend")
    assert search.render() == f"export LD_LIBRARY_PATH={site}/nvidia/cudnn/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
    assert search.why.startswith("for this environment only, before starting Python; checked: torch then loads ")


def _ldd(path: Path, llp: str) -> str:
    ldd = shutil.which("ldd")
    assert ldd is not None
    return subprocess.run([ldd, str(path)], env={"LD_LIBRARY_PATH": llp}, capture_output=True, text=True).stdout


@needs_ldd
def test_removing_the_entry_is_not_proposed_when_it_would_lose_another_library(tmp_path, monkeypatch):
    # the shadowing directory also holds libextra.so.1, which the module needs and finds nowhere else: removing
    # the entry would lose it, so the verified fix puts the wheel's directory first instead
    site, llp = build(tmp_path, "libcudnn.so.9.19.0")
    ext = compile_so(
        None, pyinit="_C", needed=["libcudnn.so.9", "libextra.so.1"], runpath="$ORIGIN/../nvidia/cudnn/lib"
    )
    write_dist(site, "torch", "2.14.1", {EXT: ext}, requires=["nvidia-cudnn-cu13==9.24.0.43"])
    (llp / "libextra.so.1").write_bytes(compile_so("libextra.so.1"))
    _, (f,) = findings(site, llp, monkeypatch)
    want = site / "nvidia/cudnn/lib"
    (step,) = f.remedies
    assert (step.directory, step.op) == (str(want), "prepend")
    assert step.why == f"checked: torch then loads {want}/libcudnn.so.9 and finds every other library it loads now"
    # the oracle: ld.so without the entry misses libextra; with the wheel's directory first it loads the wheel's
    # cuDNN and finds libextra
    assert "libextra.so.1 => not found" in _ldd(site / EXT, "")
    out = _ldd(site / EXT, f"{want}:{llp}")
    assert "not found" not in out
    assert f"=> {want}/libcudnn.so.9 " in out


@needs_ldd
def test_the_verified_removal_agrees_with_ldd(tmp_path, monkeypatch):
    site, llp = build(tmp_path, "libcudnn.so.9.19.0")
    _, (f,) = findings(site, llp, monkeypatch)
    assert f.fix == f"remove {llp} from LD_LIBRARY_PATH"
    assert f.remedies[0].why.startswith("checked:")
    out = _ldd(site / EXT, "")
    assert "not found" not in out
    assert f"=> {site}/torch/../nvidia/cudnn/lib/libcudnn.so.9 " in out


def test_a_fix_that_does_not_verify_is_not_proposed(tmp_path, monkeypatch):
    # the wheel's copy is not a loadable object (a truncated download): neither removing the entry nor putting
    # the wheel's directory first makes the module load it, so no automatic fix is printed
    site, llp = build(tmp_path, "libcudnn.so.9.19.0")
    (site / "nvidia/cudnn/lib/libcudnn.so.9").write_bytes(b"not an ELF file")
    _, (f,) = findings(site, llp, monkeypatch)
    (by_hand,) = f.remedies
    assert by_hand.why.startswith(
        f"no safe automatic repair is known: the resolver, re-run with {llp} removed from LD_LIBRARY_PATH or "
        f"{site}/nvidia/cudnn/lib put before it, does not load {site}/nvidia/cudnn/lib/libcudnn.so.9"
    )
    assert by_hand.kind == "manual"


def test_a_provider_with_a_version_pip_would_not_accept_is_judged_without_raising(tmp_path, monkeypatch):
    """The provider's METADATA version is not PEP 440: no pin can accept it, and nothing escapes the item."""
    site, llp = build(tmp_path, "libcudnn.so.9.19.0")
    meta = next(site.glob("nvidia_cudnn_cu13-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 9.24.0.43", "Version: 9.24.0.43 custom"))
    stack, _ = findings(site, llp, monkeypatch)  # raised InvalidVersion before
    assert all(f.check == "requirements" for f in stack.findings("requirements"))
