"""The distributions `python -m build` makes: the sdist holds what its tests and README's example need, the
wheel built from it holds the whole package with its data, and both carry the metadata an index shows
(`twine check --strict`)."""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

pytest.importorskip("build")
pytest.importorskip("twine")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pytest_cudastack"
_SKIP = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", ".benchmarks"
)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist built from a copy of the checkout, the wheel from the sdist (as pip and
    `python -m build` do), offline (--no-isolation: the test extras carry setuptools)."""
    tmp = tmp_path_factory.mktemp("dist")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP)
    out = tmp / "out"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        (name,) = (n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode())


def test_twine_check_is_clean(dists: tuple[Path, Path]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dists)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_wheel_holds_the_package_and_its_data(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    shipped = {
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix in (".py", ".json", ".typed") and "__pycache__" not in p.parts
    }
    assert shipped - names == set()
    assert "pytest_cudastack/py.typed" in names
    assert {"pytest_cudastack/schemas/tree.schema.json", "pytest_cudastack/cuda/data/cuda_compat.json"} <= names
    dist_info = {n for n in names if ".dist-info/" in n}
    assert {n.split("/", 1)[1] for n in dist_info} >= {"licenses/LICENSE", "METADATA", "entry_points.txt", "RECORD"}
    assert names - shipped - dist_info == set()  # nothing else: no tests, fuzz or benchmarks packages
    with zipfile.ZipFile(wheel) as z:
        (entry_points,) = (n for n in names if n.endswith("entry_points.txt"))
        text = z.read(entry_points).decode()
    assert "[pytest11]\ncudastack = pytest_cudastack.plugin" in text
    assert "[console_scripts]\ncudastack = pytest_cudastack.cli:main" in text


def test_wheel_metadata_says_what_the_project_is(dists: tuple[Path, Path]) -> None:
    meta = _metadata(dists[1])
    assert meta["Name"] == "pytest-cudastack"
    assert meta["License-Expression"] == "MIT"
    assert meta["Description-Content-Type"] == "text/markdown"
    classifiers = meta.get_all("Classifier")
    for wanted in (
        "Framework :: Pytest",
        "Environment :: GPU :: NVIDIA CUDA",
        "Operating System :: POSIX :: Linux",
        "Typing :: Typed",
    ):
        assert wanted in classifiers
    assert any(c.startswith("Topic :: ") for c in classifiers)
    versions = [c.rsplit(" :: ", 1)[1] for c in classifiers if c.startswith("Programming Language :: Python :: 3.")]
    assert versions
    assert all(v in SpecifierSet(meta["Requires-Python"]) for v in versions)  # no classifier it cannot install on
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in versions  # the one running this suite


def test_license_file_is_the_declared_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Permission is hereby granted, free of charge" in text


def test_sdist_holds_the_tests_and_the_example(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for wanted in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "example_project/build.sh",
        "example_project/pyproject.toml",
        "example_project/src/train_ppo.c",
        "example_project/tests/test_trainer.py",
        "tests/conftest.py",
        "tests/helpers/elfbuild.py",
    ):
        assert wanted in names
    assert not any(n.startswith(("example_project/bin/", ".venv/", ".git/")) for n in names)
