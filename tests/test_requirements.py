"""wheels/requirements.py (Requires-Dist as pip's resolver evaluates it) and checks/requirements.py (what an
unmet one means), on synthetic site directories; the closure hook and requires_wheel on the same facts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from pytest_cudastack.checks.closure import extension_closures
from pytest_cudastack.checks.requirements import cuda_relevant, requirement_findings, requirement_for_soname
from pytest_cudastack.findings import Pip, Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.markers import check_marker, evaluate
from pytest_cudastack.model.repair import plan_repairs, predict
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from pytest_cudastack.wheels.ownership import active_requirements
from pytest_cudastack.wheels.requirements import (
    Status,
    evaluate_requirement,
    marker_environment,
    requirement_facts,
)
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

TORCH_PINS = ["nvidia-nccl-cu13==2.30.7", "nvidia-cudnn-cu13==9.24.0.43", "filelock"]


def inv_of(site: Path) -> Inventory:
    return installed_wheels([str(site)], reader=read_elf)


def torch_site(tmp_path: Path, nccl: str | None = "2.30.7", *, requires: list[str] | None = None) -> Path:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "torch", "2.14.1", requires=requires if requires is not None else TORCH_PINS)
    write_dist(site, "filelock", "3.0")
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43")
    if nccl is not None:
        write_dist(site, "nvidia-nccl-cu13", nccl)
    return site


def errors(inv: Inventory):
    return [f for f in requirement_findings(inv) if f.severity is Severity.ERROR]


# ---------------------------------------------------------------------------------------------- facts


def test_clean_pins_give_no_finding(tmp_path):
    inv = inv_of(torch_site(tmp_path))
    facts = requirement_facts(inv)
    assert {f.text for f in facts.facts} == {"nvidia-nccl-cu13==2.30.7", "nvidia-cudnn-cu13==9.24.0.43", "filelock"}
    assert all(f.met for f in facts.facts)
    assert requirement_findings(inv) == ()


def test_unmet_pin_is_an_error_saying_what_it_means(tmp_path):
    inv = inv_of(torch_site(tmp_path, "2.28.9"))
    (f,) = errors(inv)
    assert f.message == "torch 2.14.1 requires nvidia-nccl-cu13==2.30.7; 2.28.9 is installed"
    assert "torch was built against NCCL 2.30.7 and loads NCCL 2.28.9 instead" in f.cause
    assert "torch's own check says" in f.cause
    assert "NCCL (2, 30, 7) or later" in f.cause
    (pip,) = f.remedies
    assert isinstance(pip, Pip)
    assert (pip.verb, pip.flags, pip.specs) == ("install", ("--no-deps",), ("nvidia-nccl-cu13==2.30.7",))
    assert f.distributions == ("nvidia-nccl-cu13", "torch")


def test_newer_than_the_pin_is_unmet_but_a_warning(tmp_path):
    # an exact pin is exact: pip check reports 2.30.8 as well; but torch's NCCL floor holds for a newer NCCL
    # and libnccl.so.2 is the same soname, so nothing fails for the version: a warning, not an error
    inv = inv_of(torch_site(tmp_path, "2.30.8"))
    assert errors(inv) == []
    (f,) = requirement_findings(inv)
    assert f.severity is Severity.WARNING
    assert "2.30.8 is installed" in f.message
    assert "own check" not in f.cause
    assert "NCCL 2.30.8 is newer than nvidia-nccl-cu13==2.30.7 accepts, in the same major release" in f.cause
    assert f.pip[0].specs == ("nvidia-nccl-cu13==2.30.7",)  # what pip check wants, still given


def test_torch_201_without_its_nvidia_wheels(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "torch",
        "2.0.1",
        requires=[
            'nvidia-cublas-cu11==11.10.3.66; platform_system == "Linux" and platform_machine == "x86_64"',
            'nvidia-cudnn-cu11==8.5.0.96; platform_system == "Linux" and platform_machine == "x86_64"',
            'nvidia-cublas-cu11==99; platform_system == "Windows"',  # not for this machine
        ],
    )
    inv = inv_of(site)
    (f,) = errors(inv)
    assert f.message == (
        "torch 2.0.1 requires 2 distributions that are not installed: nvidia-cublas-cu11==11.10.3.66, "
        "nvidia-cudnn-cu11==8.5.0.96"
    )
    assert "cuBLAS libraries (libcublas.so.*" in f.cause
    assert f.pip[0].specs == ("nvidia-cublas-cu11==11.10.3.66", "nvidia-cudnn-cu11==8.5.0.96")
    got = requirement_for_soname(inv, "libcublas.so.11", [inv.get("torch")])
    assert got is not None
    assert got.text == "nvidia-cublas-cu11==11.10.3.66"
    assert requirement_for_soname(inv, "libcudnn_ops_infer.so.8").text == "nvidia-cudnn-cu11==8.5.0.96"
    assert requirement_for_soname(inv, "libnccl.so.2") is None


def test_one_missing_requirement_is_one_sentence(tmp_path):
    inv = inv_of(torch_site(tmp_path, None))
    (f,) = errors(inv)
    assert f.message == "torch 2.14.1 requires nvidia-nccl-cu13==2.30.7, which is not installed"
    assert f.fix.endswith("install nvidia-nccl-cu13==2.30.7")


def test_conflicting_pins_give_no_fix(tmp_path):
    site = torch_site(tmp_path, "2.28.9")
    write_dist(site, "other", "1.0", requires=["nvidia-nccl-cu13==2.27.0"])
    inv = inv_of(site)
    found = requirement_findings(inv)
    # torch's older NCCL is an error; other's newer one (in NCCL 2) a warning
    assert sorted(f.severity.value for f in found) == ["error", "warning"]
    for f in found:
        assert f.fix == ""
        assert "no safe automatic repair is known" in f.cause


def test_non_cuda_problems_are_one_info(tmp_path):
    site = torch_site(tmp_path, requires=[*TORCH_PINS, "jinja2>=3", "sympy"])
    write_dist(site, "jinja2", "2.11")
    write_dist(site, "broken", "1.0", requires=["not a requirement !!"])
    found = requirement_findings(inv_of(site))
    assert [f.severity for f in found] == [Severity.INFO]
    assert "3 requirement(s) unmet outside the CUDA stack" in found[0].message
    details = "\n".join(found[0].details)
    assert "torch 2.14.1 requires jinja2>=3; 2.11 is installed" in details
    assert "torch 2.14.1 requires sympy; not installed" in details
    assert "unparsable Requires-Dist 'not a requirement !!'" in details


def test_prerelease_and_bad_versions(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "a", "1.0", requires=["b>=1.0", "c>=1"])
    write_dist(site, "b", "2.0rc1")
    write_dist(site, "c", "not-a-version")
    by = {f.name: f.status for f in requirement_facts(inv_of(site)).facts}
    assert by == {"b": Status.MET, "c": Status.VERSION}  # pip check: prereleases count, non-PEP 440 never does


# ---------------------------------------------------------------------------------------------- extras


def test_extras_requested_by_another_distribution_count(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "app", "1.0", requires=["jax[cuda12]>=0.4"])
    write_dist(site, "jax", "0.4.30", requires=['jaxlib==0.4.30; extra == "cuda12"', 'pytest; extra == "dev"'])
    write_dist(site, "jaxlib", "0.4.29")
    facts = requirement_facts(inv_of(site))
    assert facts.extras == {"jax": {"cuda12": "requested by app 1.0"}}
    (unmet,) = facts.unmet
    assert (unmet.requester, unmet.text, unmet.status, unmet.inferred) == (
        "jax 0.4.30 [extra cuda12]",
        "jaxlib==0.4.30",
        Status.VERSION,
        False,
    )


def test_extras_inferred_when_all_their_requirements_are_installed(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "jax",
        "0.4.30",
        requires=[
            'jaxlib==0.4.30; extra == "cuda12"',
            'jax-cuda12-plugin[with-cuda]==0.4.30; extra == "cuda12"',
            'pytest; extra == "dev"',
        ],
    )
    write_dist(site, "jaxlib", "0.4.30")
    write_dist(site, "jax-cuda12-plugin", "0.4.30", requires=['nvidia-cudnn-cu12<10.0,>=9.1; extra == "with-cuda"'])
    write_dist(site, "nvidia-cudnn-cu12", "8.9.7.29")
    inv = inv_of(site)
    facts = requirement_facts(inv)
    assert facts.extras["jax"] == {"cuda12": "inferred: all its requirements are installed"}
    assert "dev" not in facts.extras["jax"]  # pytest is not installed: the extra is not counted
    assert facts.extras["jax-cuda12-plugin"] == {"with-cuda": "inferred: all its requirements are installed"}
    (unmet,) = facts.unmet
    assert unmet.inferred
    assert unmet.text == "nvidia-cudnn-cu12<10.0,>=9.1"
    (f,) = requirement_findings(inv)
    # the user may never have asked for jax[cuda12], and its unmet pin says pip never resolved it: one INFO
    assert f.severity is Severity.INFO
    assert any(
        "nvidia-cudnn-cu12<10.0,>=9.1; 8.9.7.29 is installed (an extra counted as installed only because" in d
        for d in f.details
    ), f.details


def test_an_alternative_pin_extra_beside_newer_wheels_is_no_warning(tmp_path):
    """faiss-gpu-cu12's ``[fix-cuda]`` pins the CUDA 12.1 wheels its base requirement accepts newer versions
    of; ``pip install faiss-gpu-cu12`` leaves 12.9 ones. The extra is inferred (its requirements are all
    installed by name), but nobody asked for it and pip check is silent: an INFO, never a warning."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "faissish-gpu-cu12",
        "1.14.1",
        requires=["nvidia-cuda-runtime-cu12>=12.1.105", 'nvidia-cuda-runtime-cu12==12.1.105; extra == "fix-cuda"'],
    )
    write_dist(site, "nvidia-cuda-runtime-cu12", "12.9.79")
    found = requirement_findings(inv_of(site))
    assert [f.severity for f in found] == [Severity.INFO]
    # asked for by another distribution, the same pin is the user's: reported (a newer wheel of its major)
    write_dist(site, "app", "1.0", requires=["faissish-gpu-cu12[fix-cuda]"])
    assert [f.severity for f in requirement_findings(inv_of(site))] == [Severity.WARNING]


def test_an_extra_is_inferred_only_when_what_it_asks_for_is_complete(tmp_path):
    # cuda-bindings[all] -> cuda-toolkit[nvvm] whose nvidia-nvvm is absent: pip never installed [all]
    site = site_packages(tmp_path / "venv")
    write_dist(site, "cuda-bindings", "13.0", requires=['cuda-toolkit[nvvm]==13.*; extra == "all"'])
    write_dist(site, "cuda-toolkit", "13.0.3", requires=['nvidia-nvvm==13.0.88.*; extra == "nvvm"'])
    facts = requirement_facts(inv_of(site))
    assert facts.extras.get("cuda-bindings", {}) == {}
    assert facts.unmet == ()
    write_dist(site, "nvidia-nvvm", "13.0.88")
    facts = requirement_facts(inv_of(site))
    assert facts.extras["cuda-bindings"] == {"all": "inferred: all its requirements are installed"}
    assert facts.unmet == ()


def test_a_certain_request_wins_over_an_inferred_one(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "b", "1.0", requires=['c==1; extra == "x"'])
    write_dist(site, "c", "2")
    write_dist(site, "a", "1.0", requires=["b[x]"])
    facts = requirement_facts(inv_of(site))
    assert facts.extras["b"] == {"x": "requested by a 1.0"}
    assert [f.inferred for f in facts.unmet] == [False]


# ---------------------------------------------------------------------------------------------- markers


def test_marker_environment_is_the_inspected_interpreters(tmp_path):
    site = site_packages(tmp_path / "venv", python="python3.9")
    assert marker_environment(str(site))["python_version"] == "3.9"
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.9.18\n")
    assert marker_environment(str(site))["python_full_version"] == "3.9.18"
    write_dist(site, "a", "1.0", requires=['old-only; python_version < "3.10"'])
    (fact,) = requirement_facts(inv_of(site)).facts
    assert fact.status is Status.MISSING


def test_marker_environment_is_packagings_default_with_the_site_python(tmp_path):
    # one evaluator: packaging's default_environment(), only the inspected interpreter's version overridden
    site = site_packages(tmp_path / "venv", python="python3.12")
    env = marker_environment(str(site))
    want = dict(default_environment())
    assert set(env) == set(want)
    assert env["python_version"] == "3.12"
    assert {k: v for k, v in env.items() if "version" not in k} == {k: v for k, v in want.items() if "version" not in k}


def test_a_site_of_another_python_is_judged_by_that_python_everywhere(tmp_path):
    # Inspected from 3.11, a Python 3.12 site whose a pins b only under python_version >= "3.12": the requirements
    # item, integrity's and the repair model's requirers and requires_wheel all see the pin (round 2's integrity
    # and repair model evaluated markers for the running interpreter and saw no requirement at all).
    site = site_packages(tmp_path / "venv", python="python3.12")
    write_dist(site, "a", "1.0", requires=['b==1.0; python_version >= "3.12"', 'c; python_version < "3.12"'])
    write_dist(site, "b", "2.0")
    inv = inv_of(site)
    reqs = requirement_facts(inv)
    (fact,) = reqs.facts
    assert (fact.name, fact.status) == ("b", Status.VERSION)
    required = active_requirements(inv, reqs)
    assert [r.text for r in required["b"]] == ["b==1.0"]
    assert "c" not in required
    assert predict([("uninstall", "b", None)], inv, reqs=reqs) == [
        "a 1.0 requires b==1.0, which would not be installed"
    ]
    reason = evaluate(check_marker("requires_wheel", ("b",), {}), _Facts(inv))  # type: ignore[arg-type]
    assert reason is None  # b itself is intact
    got = evaluate(check_marker("requires_wheel", ("b==1.0",), {}), _Facts(inv))  # type: ignore[arg-type]
    assert got is not None
    assert "does not satisfy ==1.0" in got.reason


def test_cuda_relevance(tmp_path):
    site = torch_site(tmp_path, requires=[*TORCH_PINS, "triton"])
    write_dist(site, "triton", "3.8.0")
    facts = {f.name: f for f in requirement_facts(inv_of(site)).facts}
    assert cuda_relevant(facts["nvidia-nccl-cu13"])
    assert not cuda_relevant(facts["filelock"])
    assert not cuda_relevant(facts["triton"])  # torch here has no CUDA evidence and triton ships nothing


# ---------------------------------------------------------------------------------------------- requires_wheel


class _Facts:
    def __init__(self, inv: Inventory) -> None:
        self.inventory = inv
        self.integrity = ()
        self.requirements = requirement_facts(inv)

    driver = None

    def find(self, soname):
        raise AssertionError("not used")


def test_requires_wheel_reads_the_same_facts(tmp_path):
    site = torch_site(tmp_path, "2.28.9")
    write_dist(site, "jax", "0.4.30", requires=['jaxlib==0.4.30; extra == "cuda12"'])
    facts = _Facts(inv_of(site))

    def unmet(text: str) -> str | None:
        got = evaluate(check_marker("requires_wheel", (text,), {}), facts)  # type: ignore[arg-type]
        return None if got is None else got.reason

    assert unmet("nvidia-nccl-cu13>=2") is None
    assert "installed nvidia-nccl-cu13 2.28.9 does not satisfy ==2.30.7" in (unmet("nvidia-nccl-cu13==2.30.7") or "")
    reason = unmet("torch") or ""
    assert (
        "torch 2.14.1 is installed but not intact: it requires nvidia-nccl-cu13==2.30.7, 2.28.9 is installed" in reason
    )
    assert unmet("jax") is None
    assert "jax 0.4.30 [extra cuda12] requires jaxlib==0.4.30, which is not installed" in (unmet("jax[cuda12]") or "")
    (own, added) = evaluate_requirement(Requirement("jax[cuda12]"), facts.inventory)
    assert own.met
    assert added.status is Status.MISSING


# ---------------------------------------------------------------------------------------------- closure hook


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_closure_names_the_requirement_that_would_ship_the_missing_soname(tmp_path):
    site = site_packages(tmp_path / "venv")
    ext = compile_so(None, pyinit="_C", needed=["libcublas.so.11"], rpath="$ORIGIN/../nvidia/cublas/lib")
    write_dist(
        site,
        "torch",
        "2.0.1",
        {"torch/_C.cpython-311-x86_64-linux-gnu.so": ext},
        requires=["nvidia-cublas-cu11==11.10.3.66"],
    )
    inv = inv_of(site)
    resolver = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner)
    (f,) = [f for f in extension_closures(inv, resolver) if f.failing]
    assert f.subject == "libcublas.so.11"
    assert f.cause.startswith("torch 2.0.1 requires nvidia-cublas-cu11==11.10.3.66, which is not installed; ")
    # kept by the repair model: installing the pinned wheel changes no installed file
    assert f.fix.endswith("install nvidia-cublas-cu11==11.10.3.66")
    assert f.remedies[0].why.startswith("checked: it changes no installed file;")
    # the twin without the requirement keeps the generic cause
    site2 = site_packages(tmp_path / "venv2")
    write_dist(site2, "torch", "2.0.1", {"torch/_C.cpython-311-x86_64-linux-gnu.so": ext})
    inv2 = inv_of(site2)
    resolver2 = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv2.owner)
    (g,) = [f for f in extension_closures(inv2, resolver2) if f.failing]
    assert g.cause.startswith("no installed distribution ships it")


def test_a_stray_library_wheel_missing_its_own_requirement_is_a_warning(tmp_path):
    # pip install --no-deps nvidia-cudnn-cu12 (the seed venv): nothing requires it, it has no extension module
    site = torch_site(tmp_path)
    write_dist(site, "nvidia-cudnn-cu12", "9.19.0.56", requires=["nvidia-cublas-cu12"])
    (f,) = requirement_findings(inv_of(site))
    assert f.severity is Severity.WARNING
    assert f.message == "nvidia-cudnn-cu12 9.19.0.56 requires nvidia-cublas-cu12, which is not installed"
    assert "nothing installed requires nvidia-cudnn-cu12" in f.cause
    # the same wheel required by another distribution is used: its missing requirement is an error
    write_dist(site, "app", "1.0", requires=["nvidia-cudnn-cu12"])
    (g,) = requirement_findings(inv_of(site))
    assert g.severity is Severity.ERROR


def test_one_requirement_stated_under_two_extras_is_reported_once(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "torch", "2.14.1", requires=["cuda-toolkit[cublas,cusolver]==13.0.3"])
    write_dist(
        site,
        "cuda-toolkit",
        "13.0.3",
        requires=['nvidia-cublas==13.1.1.3.*; extra == "cublas"', 'nvidia-cublas==13.1.1.3.*; extra == "cusolver"'],
    )
    write_dist(site, "nvidia-cublas", "13.0.2.14")
    (f,) = requirement_findings(inv_of(site))
    assert f.message == "cuda-toolkit 13.0.3 [extra cublas] requires nvidia-cublas==13.1.1.3.*; 13.0.2.14 is installed"
    assert f.fix.endswith("install --no-deps 'nvidia-cublas==13.1.1.3.*'")  # pip picks the release


# ------------------------------------------------------------------ unmet pins by direction; pins without ==X


def toolkit_site(tmp_path: Path, cusparse: str | None) -> Path:
    """torch 2.14.1's CUDA 13 wheels as pip resolves them: torch asks for cuda-toolkit's extras, and cuda-toolkit
    (a meta package: no library of its own) pins each library wheel by a wildcard or a range."""
    site = site_packages(tmp_path / "venv")
    write_dist(site, "torch", "2.14.1", requires=["cuda-toolkit[cusparse,nvjitlink,nvrtc]==13.0.3"])
    write_dist(
        site,
        "cuda-toolkit",
        "13.0.3.0",
        requires=[
            'nvidia-cusparse==12.6.3.3.*; extra == "cusparse"',
            'nvidia-nvjitlink<14,>=13.0.88; extra == "nvjitlink"',
            'nvidia-cuda-nvrtc==13.0.88.*; extra == "nvrtc"',
        ],
    )
    write_dist(site, "nvidia-nvjitlink", "13.5.37")
    write_dist(site, "nvidia-cuda-nvrtc", "13.0.88")
    if cusparse is not None:
        write_dist(site, "nvidia-cusparse", cusparse)
    return site


@pytest.mark.parametrize(
    ("cusparse", "severity", "side"),
    [
        # pip install -U nvidia-cusparse in torch's venv: it imports and runs (tests/test_requirements_real.py)
        pytest.param("12.9.4.2", Severity.WARNING, "newer", id="newer-in-its-major"),
        # pip install nvidia-cublas==13.0.2.14 under cuda-toolkit's ==13.1.1.3.*: torch imports too; a symbol
        # an older release lacks is the symbols item's error (tests/test_requirements_real.py)
        pytest.param("12.5.10.65", Severity.WARNING, "older", id="older-in-its-major"),
        pytest.param("13.0.0.1", Severity.ERROR, "", id="another-major"),  # another soname (libcusparse.so.13)
    ],
)
def test_an_unmet_pin_is_an_error_unless_in_its_major(tmp_path, cusparse, severity, side):
    (f,) = requirement_findings(inv_of(toolkit_site(tmp_path, cusparse)))
    assert f.message == (
        f"cuda-toolkit 13.0.3.0 [extra cusparse] requires nvidia-cusparse==12.6.3.3.*; {cusparse} is installed"
    )
    assert f.severity is severity
    assert (f"is {side} than nvidia-cusparse==12.6.3.3.* accepts" in f.cause) is bool(side)


def test_older_in_its_major_but_refused_by_the_frameworks_own_check_stays_an_error(tmp_path):
    # torch's cuDNN check: runtime minor >= compile minor ("cuDNN version incompatibility")
    site = torch_site(tmp_path)
    shutil.rmtree(site / "nvidia_cudnn_cu13-9.24.0.43.dist-info")
    write_dist(site, "nvidia-cudnn-cu13", "9.19.0.56")
    (f,) = errors(inv_of(site))
    assert "cuDNN version incompatibility: PyTorch was compiled against (9, 24, 0)" in f.cause


def test_the_clean_twin_of_the_toolkit_pins_gives_no_finding(tmp_path):
    assert requirement_findings(inv_of(toolkit_site(tmp_path, "12.6.3.3"))) == ()


def test_newer_but_refused_by_the_frameworks_own_check_stays_an_error(tmp_path):
    # torch's cuDNN check refuses another major: 10.x for a 9.x build is no "newer in its major"
    site = torch_site(tmp_path)
    shutil.rmtree(site / "nvidia_cudnn_cu13-9.24.0.43.dist-info")
    write_dist(site, "nvidia-cudnn-cu13", "10.0.0.1")
    (f,) = errors(inv_of(site))
    assert "10.0.0.1 is installed" in f.message


def test_a_missing_wheel_pinned_by_a_wildcard_or_a_range_is_a_cuda_requirement(tmp_path):
    # pip uninstall nvidia-cuda-nvrtc nvidia-nvjitlink in torch's venv: import torch fails on libnvrtc.so.13;
    # the requirements saying which wheels ship them name no -cuNN and no exact version, yet are CUDA 13's
    site = toolkit_site(tmp_path, "12.6.3.3")
    for name in ("nvidia_cuda_nvrtc-13.0.88", "nvidia_nvjitlink-13.5.37"):
        shutil.rmtree(site / f"{name}.dist-info")
    (f,) = requirement_findings(inv_of(site))
    assert f.severity is Severity.ERROR
    assert f.message == (
        "cuda-toolkit 13.0.3.0 requires 2 distributions that are not installed: nvidia-nvjitlink<14,>=13.0.88, "
        "nvidia-cuda-nvrtc==13.0.88.*"
    )
    assert "the NVRTC libraries (libnvrtc.so.*" in f.cause


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_closure_follows_the_needers_requirements_through_a_requested_extra(tmp_path):
    # torch needs libnvrtc.so.13; the wheel shipping it is torch's requirement only through cuda-toolkit[nvrtc]
    site = toolkit_site(tmp_path, "12.6.3.3")
    ext = compile_so(None, pyinit="_C", needed=["libnvrtc.so.13"], rpath="$ORIGIN/../nvidia/cu13/lib")
    write_dist(
        site,
        "torch",
        "2.14.1",
        {"torch/_C.cpython-311-x86_64-linux-gnu.so": ext},
        requires=["cuda-toolkit[cusparse,nvjitlink,nvrtc]==13.0.3"],
    )
    shutil.rmtree(site / "nvidia_cuda_nvrtc-13.0.88.dist-info")
    inv = inv_of(site)
    resolver = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner)
    found = (*extension_closures(inv, resolver), *requirement_findings(inv))
    (f, g) = [f for f in found if f.failing]
    assert (f.check, f.subject) == ("closure", "libnvrtc.so.13")
    assert f.cause.startswith(
        "cuda-toolkit 13.0.3.0 [extra nvrtc] requires nvidia-cuda-nvrtc==13.0.88.*, which is not installed; "
    )
    assert g.message == (
        "cuda-toolkit 13.0.3.0 [extra nvrtc] requires nvidia-cuda-nvrtc==13.0.88.*, which is not installed"
    )
    # one step for both, by hand: which release the wildcard gets is pip's pick, not the model's (it was
    # "would not be installed" and a generic step before); run on the real venv, the command repairs it
    (plan,) = plan_repairs(found, inv)
    (step,) = plan.steps
    assert step.kind == "manual"
    assert set(step.resolves) == {"closure: libnvrtc.so.13", "requirements: cuda-toolkit 13.0.3.0"}
    assert "pip install 'nvidia-cuda-nvrtc==13.0.88.*' (pip picks the release)" in step.command
    # the clean twin: the wheel installed with its library
    write_dist(site, "nvidia-cuda-nvrtc", "13.0.88", {"nvidia/cu13/lib/libnvrtc.so.13": compile_so("libnvrtc.so.13")})
    inv2 = inv_of(site)
    resolver2 = Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv2.owner)
    assert not [f for f in (*extension_closures(inv2, resolver2), *requirement_findings(inv2)) if f.failing]


def test_a_missing_meta_package_is_a_warning_and_its_fix_keeps_the_extras(tmp_path):
    # pip uninstall cuda-toolkit in torch's venv: torch imports (every library wheel is still there); pip check
    # objects. Its reinstall must ask for the extras torch asks for (pip installs their requirements)
    site = toolkit_site(tmp_path, "12.6.3.3")
    shutil.rmtree(site / "cuda_toolkit-13.0.3.0.dist-info")
    (f,) = requirement_findings(inv_of(site))
    assert f.severity is Severity.WARNING
    assert f.message == "torch 2.14.1 requires cuda-toolkit[cusparse,nvjitlink,nvrtc]==13.0.3, which is not installed"
    assert f.cause.startswith("cuda-toolkit: a meta package that ships no library")
    assert f.pip[0].specs == ("cuda-toolkit[cusparse,nvjitlink,nvrtc]==13.0.3",)


def test_a_missing_meta_package_beside_a_missing_library_wheel_is_an_error(tmp_path):
    site = toolkit_site(tmp_path, "12.6.3.3")
    shutil.rmtree(site / "cuda_toolkit-13.0.3.0.dist-info")
    write_dist(site, "torch", "2.14.1", requires=["cuda-toolkit[nvrtc]==13.0.3", "nvidia-nccl-cu13==2.30.7"])
    (f,) = requirement_findings(inv_of(site))
    assert f.severity is Severity.ERROR
    assert "NCCL libraries" in f.cause


def test_the_missing_requirement_for_a_soname_is_the_one_of_its_cuda_major(tmp_path):
    # both majors' runtimes required and missing: libcudart.so.13 is the wildcard pin's (13.0.96.* names CUDA 13)
    site = site_packages(tmp_path / "venv")
    write_dist(site, "app", "1.0", requires=["nvidia-cuda-runtime-cu12==12.9.79", "cuda-toolkit[cudart]==13.0.3"])
    write_dist(site, "cuda-toolkit", "13.0.3.0", requires=['nvidia-cuda-runtime==13.0.96.*; extra == "cudart"'])
    inv = inv_of(site)
    got13 = requirement_for_soname(inv, "libcudart.so.13", [inv.get("app")])
    got12 = requirement_for_soname(inv, "libcudart.so.12", [inv.get("app")])
    assert (got13.text if got13 else None) == "nvidia-cuda-runtime==13.0.96.*"
    assert (got12.text if got12 else None) == "nvidia-cuda-runtime-cu12==12.9.79"
