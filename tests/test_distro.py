"""System and distro Pythons: ``pip install --target`` layouts, dpkg-owned distributions, PEP 668."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_cudastack.checks.integrity import check_integrity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.wheels.inventory import installed_wheels, record_abspath
from tests.helpers.sitebuild import record_hash


def _wheel(dest: Path, name: str = "tinytool", version: str = "1.0") -> Path:
    """A pure wheel with a module and a console script (pip writes ``bin/<script>`` and its RECORD row)."""
    di = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "def main():\n    return 0\n",
        f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n",
        f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{di}/entry_points.txt": f"[console_scripts]\n{name} = {name}:main\n",
    }
    rows = [f"{p},{record_hash(t.encode())},{len(t.encode())}" for p, t in files.items()]
    files[f"{di}/RECORD"] = "\n".join([*rows, f"{di}/RECORD,,"]) + "\n"
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return path


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ``pip install --target`` of a local wheel (no index)."""
    base = tmp_path_factory.mktemp("target")
    whl = _wheel(base)
    target = base / "t"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), str(whl)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return target


def test_target_layout_reads_as_pip_lays_it_out(target_dir: Path):
    record = (target_dir / "tinytool-1.0.dist-info" / "RECORD").read_text()
    assert "../../bin/tinytool," in record  # what pip writes: relative to its home scheme's lib/python
    assert (target_dir / "bin" / "tinytool").is_file()
    inv = installed_wheels([str(target_dir)], reader=read_elf)
    assert [d.label for d in inv.distributions] == ["tinytool 1.0"]
    assert inv.findings == ()  # no "outside the install prefix" warning
    assert inv.owner(str(target_dir / "bin" / "tinytool")) == "tinytool 1.0"
    assert check_integrity(inv) == ()


def test_target_layout_still_refuses_paths_that_leave_it(tmp_path: Path):
    # the twin: a --target directory whose RECORD climbs out of it still gets the warning
    target = tmp_path / "t"
    di = target / "x-1.dist-info"
    di.mkdir(parents=True)
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: x\nVersion: 1\n\n")
    (di / "RECORD").write_text("../../../etc/passwd,,\nx-1.dist-info/RECORD,,\n")
    inv = installed_wheels([str(target)], reader=read_elf)
    assert [f.message for f in inv.findings] == [
        "RECORD lists 1 path(s) outside the install prefix, ignored: ../../../etc/passwd"
    ]
    assert record_abspath(str(target), "../../bin/x") == str(target / "bin" / "x")
    assert record_abspath(str(target), "../../../etc/passwd") is None
    # a scheme's site-packages keeps the plain resolution
    site = tmp_path / "p" / "lib" / "python3.11" / "site-packages"
    assert record_abspath(str(site), "../../bin/x") == str(tmp_path / "p" / "lib" / "bin" / "x")
