"""System and distro Pythons: ``pip install --target`` layouts, dpkg-owned distributions, PEP 668."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_cudastack.checks.integrity import check_integrity, integrity_findings
from pytest_cudastack.findings import Manual, Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.model.repair import plan_repairs
from pytest_cudastack.wheels.dpkg import dist_info_package, md5sums
from pytest_cudastack.wheels.inventory import installed_wheels, record_abspath
from pytest_cudastack.wheels.requirements import requirement_facts
from pytest_cudastack.wheels.sitepaths import externally_managed
from tests.helpers.sitebuild import record_hash, site_packages, write_dist


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


# ----------------------------------------------------------------------------------------------------
# dpkg-owned distributions: judged by the package's md5sums, not by RECORD

_SO = b"\x7fELF stripped after RECORD was written"  # not an ELF the reader parses: a problem, not a finding


def _debian_site(root: Path, *, installer: str | None = None, so: bytes = _SO, sums: str | None = None) -> Path:
    """``root/usr/lib/python3/dist-packages`` with python3-yaml's PyYAML as Debian ships it: a RECORD whose
    row for the extension module has the unstripped file's hash and size, no INSTALLER, dpkg's .list naming
    the dist-info and its md5sums (``sums``: their text, default the file's real md5)."""
    import hashlib

    site = root / "usr/lib/python3/dist-packages"
    di = site / "PyYAML-6.0.dist-info"
    di.mkdir(parents=True)
    (site / "yaml").mkdir()
    lib = site / "yaml/_yaml.cpython-311-x86_64-linux-gnu.so"
    lib.write_bytes(so)
    (site / "yaml/__init__.py").write_text("")
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: PyYAML\nVersion: 6.0\n\n")
    (di / "RECORD").write_text(
        "yaml/__init__.py,,\n"
        f"yaml/_yaml.cpython-311-x86_64-linux-gnu.so,{record_hash(b'unstripped' * 100)},1000\n"
        "PyYAML-6.0.dist-info/RECORD,,\n"
    )
    if installer is not None:
        (di / "INSTALLER").write_text(installer + "\n")
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    rel = "usr/lib/python3/dist-packages"
    (info / "python3-yaml.list").write_text(
        f"/.\n/usr\n/{rel}\n/{rel}/PyYAML-6.0.dist-info\n/{rel}/PyYAML-6.0.dist-info/METADATA\n"
        f"/{rel}/yaml/__init__.py\n/{rel}/yaml/_yaml.cpython-311-x86_64-linux-gnu.so\n"
    )
    if sums is None:
        sums = (
            f"{hashlib.md5(b'').hexdigest()}  {rel}/yaml/__init__.py\n"
            f"{hashlib.md5(so).hexdigest()}  {rel}/yaml/_yaml.cpython-311-x86_64-linux-gnu.so\n"
        )
    (info / "python3-yaml.md5sums").write_text(sums)
    return site


def _errors(inv):
    return [f for f in integrity_findings(inv, requirement_facts(inv)) if f.severity is Severity.ERROR]


def test_dpkg_owned_distribution_is_judged_by_md5sums(tmp_path: Path):
    # the clean twin of the two md5sums errors below, and of RECORD's "other bytes" error
    site = _debian_site(tmp_path)
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path))
    (d,) = inv.distributions
    assert (d.installer, d.os_package) == (None, "python3-yaml")
    assert _errors(inv) == []


def test_without_dpkg_the_stripped_library_is_a_record_error(tmp_path: Path):
    # what a RECORD verdict says of the same tree when dpkg lists nothing (no database under the root)
    site = _debian_site(tmp_path)
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path / "elsewhere"))
    assert inv.distributions[0].os_package is None
    (f,) = _errors(inv)
    assert "other bytes than its RECORD lists" in f.message


def test_pip_installer_keeps_record_verdicts_even_where_dpkg_lists_it(tmp_path: Path):
    site = _debian_site(tmp_path, installer="pip")
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path))
    assert (inv.distributions[0].installer, inv.distributions[0].os_package) == ("pip", None)
    # RECORD is its record, and the bytes on disk are not its: they are the ones python3-yaml's md5sums
    # record (dpkg lists the same files), a warning naming what breaks, not a library nobody's bytes replaced
    assert _errors(inv) == []
    (f,) = [f for f in check_integrity(inv) if f.subject == "PyYAML / python3-yaml"]
    assert "PyYAML's RECORD does not match them now" in f.cause
    assert f.message.endswith("the bytes on disk are dpkg's python3-yaml's")


@pytest.mark.parametrize("installer", [None, "debian", ""])
def test_non_python_installer_is_os_owned(tmp_path: Path, installer):
    site = _debian_site(tmp_path, installer=installer)
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path))
    assert inv.distributions[0].os_package == "python3-yaml"
    assert _errors(inv) == []


def test_md5_mismatch_names_the_package_and_its_reinstall(tmp_path: Path):
    site = _debian_site(tmp_path)
    (site / "yaml/_yaml.cpython-311-x86_64-linux-gnu.so").write_bytes(b"patched")
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path))
    (f,) = _errors(inv)
    assert "dpkg's md5sums for python3-yaml" in f.message
    assert f.remedies == (Manual(("apt-get install --reinstall python3-yaml",), why=f.remedies[0].why),)
    assert not f.pip
    assert str(tmp_path / "var/lib/dpkg/info/python3-yaml.md5sums") in f.where
    (plan,) = plan_repairs([f], inv)
    assert not plan.automatic
    assert [s.command for s in plan.steps] == ["apt-get install --reinstall python3-yaml"]


def test_file_dpkg_lists_but_gone(tmp_path: Path):
    site = _debian_site(tmp_path)
    (site / "yaml/_yaml.cpython-311-x86_64-linux-gnu.so").unlink()
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path))
    (f,) = _errors(inv)
    assert "python3-yaml installed is gone" in f.message
    assert [r.render() for r in f.remedies] == ["apt-get install --reinstall python3-yaml"]


def test_fifo_where_dpkg_lists_a_library_is_unreadable_not_a_hang(tmp_path: Path):
    # a FIFO named like the package's library: its md5 is never read (it would block), the file is "altered"
    site = _debian_site(tmp_path)
    lib = site / "yaml/_yaml.cpython-311-x86_64-linux-gnu.so"
    lib.unlink()
    os.mkfifo(lib)
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path))
    (f,) = _errors(inv)
    assert "md5 unreadable" in " ".join(f.details) + f.message


@pytest.mark.parametrize(
    "sums",
    [
        pytest.param("", id="empty"),
        pytest.param("not a line\n\x00\x00\n" + "z" * 40 + "  x.so\n", id="garbage"),
        pytest.param("0" * 32 + "  ../../etc/passwd.so\n" + "0" * 32 + "  a\\nb.so\n", id="escapes"),
        pytest.param("0" * 32 + "  " + "a/" * 5000 + "x.so\n", id="long path"),
    ],
)
def test_hostile_md5sums_do_not_crash(tmp_path: Path, sums):
    site = _debian_site(tmp_path, sums=sums)
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path))
    assert _errors(inv) == []


def test_hostile_dpkg_database_does_not_crash(tmp_path: Path):
    info = tmp_path / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (info / "bad name!.list").write_text("/x.dist-info\n")
    (info / "weird.list").write_bytes(b"\xff\xfe/x.dist-info\n\x00.dist-info\n")
    (info / "dir.list").mkdir()
    assert dist_info_package(str(tmp_path / "x.dist-info"), str(tmp_path)) is None
    assert md5sums("../../etc/passwd", str(tmp_path)) is None
    assert md5sums("missing", str(tmp_path)) is None


# ----------------------------------------------------------------------------------------------------
# PEP 668: no plan step is a pip command pip would refuse


def _gone_lib_site(prefix: Path, *, marker: bool, venv: bool = False) -> Path:
    """A prefix whose pip-installed ``tool``'s one library is gone (an error the plan repairs with a pip
    reinstall); ``marker``: PEP 668's file in its stdlib directory; ``venv``: a ``pyvenv.cfg`` in it."""
    site = site_packages(prefix)
    write_dist(site, "tool", "1.0", {"tool/libtool.so": b"x", "tool/__init__.py": ""}, write_files=False)
    (site / "tool").mkdir()
    (site / "tool/__init__.py").write_text("")
    if marker:
        (prefix / "lib/python3.11/EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=use apt\n")
    if venv:
        (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return site


def _plan_of(site: Path, *, pip_fix: bool = True):
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=None)
    errors = _errors(inv)
    assert errors, "the fixture's error"
    assert all(bool(f.pip) is pip_fix for f in errors)  # each finding's own fix agrees with its plan
    (plan,) = plan_repairs(errors, inv)
    return plan


def test_externally_managed_plan_has_no_pip_step(tmp_path: Path):
    plan = _plan_of(_gone_lib_site(tmp_path / "sys", marker=True), pip_fix=False)
    assert plan.automatic == ()
    assert not any(s.argv for s in plan.steps)
    commands = [c for s in plan.steps for c in getattr(s.action, "steps", ())]
    assert any(
        c.startswith("python3 -m venv --system-site-packages .venv && .venv/bin/python -m pip install")
        for c in commands
    )
    assert any("distribution's package" in c for c in commands)
    assert any("EXTERNALLY-MANAGED" in s.why for s in plan.steps)
    assert plan.unresolved
    assert not plan.fixes


@pytest.mark.parametrize(
    ("marker", "venv"), [pytest.param(False, False, id="no marker"), pytest.param(True, True, id="venv ignores it")]
)
def test_plan_keeps_pip_steps_where_pip_runs(tmp_path: Path, marker, venv):
    # the clean twin: no marker, or a venv (pip ignores the marker there)
    plan = _plan_of(_gone_lib_site(tmp_path / "env", marker=marker, venv=venv))
    assert [s.argv[-1] for s in plan.automatic if s.argv] == ["tool==1.0"]


def test_externally_managed_reads_the_owning_interpreters_stdlib(tmp_path: Path):
    usr = tmp_path / "usr"
    (usr / "lib/python3.11").mkdir(parents=True)
    (usr / "lib/python3/dist-packages").mkdir(parents=True)
    (usr / "local/lib/python3.11/dist-packages").mkdir(parents=True)
    target = tmp_path / "target"
    target.mkdir()
    for site in ("lib/python3/dist-packages", "local/lib/python3.11/dist-packages"):
        assert externally_managed(str(usr / site)) is None
    marker = usr / "lib/python3.11/EXTERNALLY-MANAGED"
    marker.write_text("[externally-managed]\n")
    # Debian's version-less dist-packages, and /usr/local's (which /usr/bin/python3.11 reads)
    for site in ("lib/python3/dist-packages", "local/lib/python3.11/dist-packages"):
        assert externally_managed(str(usr / site)) == str(marker)
    assert externally_managed(str(target)) is None  # --target: pip skips the check
    assert externally_managed(str(target), stdlib=str(usr / "lib/python3.11")) == str(marker)


def test_pip_copy_over_a_dpkg_package_is_the_packages_error_not_an_overlap(tmp_path: Path):
    # a pip-installed distribution wrote its bytes over python3-yaml's library: dpkg's .list and the wheel's
    # RECORD name the same file, the bytes are the wheel's (a warning naming what breaks: nothing fails now),
    # its repair uninstalls the wheel and then reinstalls the package; no RECORD-against-RECORD overlap is
    # judged with Debian's stale RECORD, and the package's md5sums error is this overlap
    site = _debian_site(tmp_path)
    write_dist(site, "yamlfork", "1.0", {"yaml/_yaml.cpython-311-x86_64-linux-gnu.so": b"fork bytes"})
    inv = installed_wheels([str(site)], reader=read_elf, dpkg_root=str(tmp_path))
    assert [d.os_package for d in inv.distributions] == ["python3-yaml", None]
    assert _errors(inv) == []
    (f,) = check_integrity(inv)
    assert f.subject == "yamlfork / python3-yaml"
    assert f.severity is Severity.WARNING
    assert "dpkg --verify python3-yaml fails now" in f.cause
    (fix,) = f.remedies
    assert isinstance(fix, Manual)
    assert fix.steps[:2] == ("pip uninstall -y yamlfork", "apt-get install --reinstall python3-yaml")


_HOST_YAML = "/var/lib/dpkg/info/python3-yaml.list"


@pytest.mark.real
@pytest.mark.skipif(not os.path.isfile(_HOST_YAML), reason="needs Debian's python3-yaml installed with apt")
def test_debian_system_python_with_apt_packages_is_clean():
    # the real oracle: Debian's dist-packages (python3-yaml's stripped extension module included), as dpkg
    # installed it, imports and gives no integrity error
    site = "/usr/lib/python3/dist-packages"
    subprocess.run(["/usr/bin/python3", "-c", "import yaml._yaml"], check=True, timeout=60)
    inv = installed_wheels([site], reader=read_elf)
    assert inv.get("PyYAML") is not None
    assert inv.get("PyYAML").os_package == "python3-yaml"
    assert _errors(inv) == []
