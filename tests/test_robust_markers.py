"""Requires-Dist markers and specifiers packaging cannot evaluate (issue #23): ``evaluate_marker`` is the one
place that calls packaging's marker evaluation on what a file states; the requirements item, the repair model
and ``requires_wheel`` all go through it, and a marker it cannot evaluate is reported, never raised."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.markers import Marker, default_environment

from pytest_cudastack.checks.integrity import integrity_findings
from pytest_cudastack.checks.requirements import requirement_findings
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.model.repair import plan_repairs, predict
from pytest_cudastack.wheels.inventory import installed_wheels
from pytest_cudastack.wheels.requirements import evaluate_marker, requirement_facts
from tests.helpers.sitebuild import site_packages, write_dist

BIG = "1" + "0" * 5000  # over the interpreter's 4,300-digit limit for int(str)


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        pytest.param(f'python_version > "{BIG}"', "Exceeds the limit", id="huge-version"),
        pytest.param(f'python_full_version >= "3.{BIG}"', "Exceeds the limit", id="huge-minor"),
        pytest.param('python_version ~= "3"', "UndefinedComparison", id="incomparable"),
        pytest.param('python_version == "3.11" and platform_release > "x"', None, id="string-fallback"),
    ],
)
def test_evaluate_marker_is_total(marker: str, expected: str | None) -> None:
    got = evaluate_marker(Marker(marker), {**default_environment(), "extra": ""})
    if expected is None:
        assert isinstance(got, bool)
    else:
        assert isinstance(got, str)
        assert expected in got
        assert len(got) < 300


def _hostile_site(tmp_path: Path) -> Path:
    site = site_packages(tmp_path / "venv")
    # torch's nccl pin is unmet (an error with a repair step); its other requirements are hostile
    write_dist(
        site,
        "torch",
        "2.14.1",
        requires=[
            "nvidia-nccl-cu13==2.30.7",
            f'nvidia-cudnn-cu13>=9; python_version > "{BIG}"',
            f'sympy; extra == "opt" and python_full_version < "{BIG}"',
            f"filelock=={BIG}",
        ],
    )
    write_dist(site, "nvidia-nccl-cu13", "2.28.9")
    write_dist(site, "sympy", "1.0")
    return site


def test_unevaluable_marker_is_reported_by_requirements_and_repair(tmp_path: Path) -> None:
    site = _hostile_site(tmp_path)
    inv = installed_wheels([str(site)], reader=read_elf)
    reqs = requirement_facts(inv)
    assert {f.name for f in reqs.facts} == {"nvidia-nccl-cu13"}  # what cannot be evaluated does not apply
    why = {text.split(";")[0].strip(): err for _d, text, err in reqs.unparsable}
    assert why["nvidia-cudnn-cu13>=9"].startswith("marker cannot be evaluated: ValueError: Exceeds the limit")
    assert why["sympy"].startswith("marker cannot be evaluated")
    assert "Exceeds the limit" in why[f"filelock=={BIG}"]
    found = requirement_findings(inv, reqs=None)
    details = "\n".join(d for f in found for d in f.details)
    assert "unparsable Requires-Dist 'nvidia-cudnn-cu13>=9" in details
    failing = [*integrity_findings(inv, reqs), *found]
    assert any(f.failing for f in failing)
    plans = plan_repairs(failing, inv)  # the repair model evaluates the same requirements
    assert plans
    assert predict([("install", "nvidia-nccl-cu13", "2.30.7")], inv) == []
