"""A file owned by both a ``.deb`` (dpkg's ``info/*.list``) and a wheel's RECORD: whose bytes are on disk
(dpkg's md5sums against RECORD's sha256), what breaks when either owner is removed or upgraded, and the
repair in order (uninstall the wheel, reinstall the package, the wheel where dpkg owns nothing)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pytest_cudastack.checks.integrity import integrity_findings
from pytest_cudastack.findings import Finding, Manual, Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.wheels.dpkg import listing_packages
from pytest_cudastack.wheels.inventory import Inventory, installed_wheels
from pytest_cudastack.wheels.requirements import requirement_facts
from tests.helpers.sitebuild import write_dist

DIST = "usr/lib/python3/dist-packages"
EXT = "yaml/_yaml.cpython-311-x86_64-linux-gnu.so"
DEB_SO = b"\x7fELF python3-yaml's build, stripped"
DEB_PY = "# python3-yaml 6.0\n"
WHEEL_SO = b"\x7fELF the PyYAML 6.0.1 wheel's build, a longer file"
WHEEL_PY = "# PyYAML 6.0.1\n"


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _deb(root: Path, package: str, files: dict[str, bytes], *, listed: dict[str, str] | None = None) -> None:
    """dpkg installed ``package``: ``files`` (paths relative to ``root``) written, its .list and md5sums
    (``listed``: the path each is listed as, when not its own)."""
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True, exist_ok=True)
    names = {rel: (listed or {}).get(rel, rel) for rel in files}
    dirs = sorted({os.path.dirname(n) for n in names.values()})
    (info / f"{package}.list").write_text(
        "/.\n" + "".join(f"/{d}\n" for d in dirs) + "".join(f"/{n}\n" for n in names.values())
    )
    (info / f"{package}.md5sums").write_text("".join(f"{_md5(data)}  {names[rel]}\n" for rel, data in files.items()))
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        path.write_bytes(data)


def _python3_yaml(root: Path) -> None:
    """Debian's python3-yaml: its module and extension in dist-packages, its dist-info (no INSTALLER)."""
    meta = b"Metadata-Version: 2.1\nName: PyYAML\nVersion: 6.0\n\n"
    record = f"yaml/__init__.py,,\n{EXT},,\nPyYAML-6.0.dist-info/METADATA,,\nPyYAML-6.0.dist-info/RECORD,,\n".encode()
    _deb(
        root,
        "python3-yaml",
        {
            f"{DIST}/yaml/__init__.py": DEB_PY.encode(),
            f"{DIST}/{EXT}": DEB_SO,
            f"{DIST}/PyYAML-6.0.dist-info/METADATA": meta,
            f"{DIST}/PyYAML-6.0.dist-info/RECORD": record,
        },
    )


def _inv(root: Path, *sites: str, image: bool = False) -> Inventory:
    return installed_wheels(
        [str(root / s) for s in sites], reader=read_elf, dpkg_root=str(root), root=str(root) if image else None
    )


def _findings(inv: Inventory) -> list[Finding]:
    return list(integrity_findings(inv, requirement_facts(inv)))


def _overlap(inv: Inventory) -> list[Finding]:
    return [f for f in _findings(inv) if " / " in f.subject and f.check == "integrity"]


def _pyyaml_wheel(root: Path, site: str, *, write_files: bool = True) -> None:
    """``pip install PyYAML==6.0.1`` into ``site`` (``--break-system-packages --ignore-installed`` when it is
    Debian's dist-packages: Debian's dist-info stays)."""
    write_dist(root / site, "PyYAML", "6.0.1", {"yaml/__init__.py": WHEEL_PY, EXT: WHEEL_SO}, write_files=write_files)


def test_pip_over_the_deb_s_files_is_a_warning_naming_what_breaks(tmp_path: Path) -> None:
    """pip wrote the wheel over python3-yaml's files: they are the wheel's bytes (RECORD's sha256 matches,
    dpkg's md5 does not). Nothing fails now; dpkg --verify does, an apt upgrade or reinstall writes over the
    wheel's files, a pip uninstall deletes the package's. No error: python3-yaml's md5sums "altered" error and
    the wheel's RECORD are this one overlap."""
    _python3_yaml(tmp_path)
    _pyyaml_wheel(tmp_path, DIST)
    inv = _inv(tmp_path, DIST)
    found = _findings(inv)
    assert [f for f in found if f.severity is Severity.ERROR] == []
    (f,) = _overlap(inv)
    assert f.severity is Severity.WARNING
    assert f.subject == "PyYAML / python3-yaml"
    assert f.message.startswith("PyYAML 6.0.1 and dpkg's python3-yaml install the same 2 file(s) under yaml/")
    assert f.message.endswith("; the bytes on disk are PyYAML 6.0.1's")
    assert "dpkg --verify python3-yaml fails now" in f.cause
    assert "pip uninstall PyYAML deletes them" in f.cause
    assert f.facts.found == "wheel"
    assert set(f.facts.objects) == {str(tmp_path / DIST / "yaml/__init__.py"), str(tmp_path / DIST / EXT)}
    (fix,) = f.remedies
    assert isinstance(fix, Manual)
    assert fix.steps[:2] == ("pip uninstall -y PyYAML", "apt-get install --reinstall python3-yaml")
    assert fix.steps[2].startswith("only if you need PyYAML: python3 -m venv --system-site-packages .venv && ")


def test_apt_over_the_wheel_s_files_is_a_warning_not_an_altered_library(tmp_path: Path) -> None:
    """apt-get install --reinstall python3-yaml after the wheel: the bytes are dpkg's again, the wheel's
    RECORD no longer matches them. The wheel's extension is not "altered by nobody": dpkg's md5sums claim
    its bytes (before, an ERROR)."""
    _pyyaml_wheel(tmp_path, DIST)
    _python3_yaml(tmp_path)  # written after: its bytes are on disk
    inv = _inv(tmp_path, DIST)
    assert [f for f in _findings(inv) if f.severity is Severity.ERROR] == []
    (f,) = _overlap(inv)
    assert f.severity is Severity.WARNING
    assert f.facts.found == "deb"
    assert f.message.endswith("; the bytes on disk are dpkg's python3-yaml's")
    assert "what imports PyYAML runs python3-yaml's build" in f.cause


def test_identical_bytes_are_an_info_for_a_shared_library(tmp_path: Path) -> None:
    _deb(tmp_path, "libfoo1", {f"{DIST}/foo/libfoo.so.1": WHEEL_SO})
    write_dist(tmp_path / DIST, "foo", "1.0", {"foo/libfoo.so.1": WHEEL_SO})
    (f,) = _overlap(_inv(tmp_path, DIST))
    assert f.severity is Severity.INFO
    assert "with identical bytes" in f.message


@pytest.mark.parametrize(
    "site",
    ["usr/local/lib/python3.11/dist-packages", "opt/venv/lib/python3.11/site-packages"],
    ids=["clean-twin-pip-s-debian-default", "clean-twin-venv"],
)
def test_clean_twin_the_wheel_where_dpkg_owns_nothing(tmp_path: Path, site: str) -> None:
    """The same wheel where Debian's pip puts it (/usr/local) or in a venv: no path is both's, no finding."""
    _python3_yaml(tmp_path)
    if site.startswith("opt/venv"):
        (tmp_path / "opt/venv").mkdir(parents=True)
        (tmp_path / "opt/venv/pyvenv.cfg").write_text("home = /usr/bin\n")
    _pyyaml_wheel(tmp_path, site)
    inv = _inv(tmp_path, site, DIST)
    assert _overlap(inv) == []
    assert [f for f in _findings(inv) if f.severity is Severity.ERROR] == []


def test_a_wheel_unpacked_over_a_cuda_deb_s_library_on_a_merged_usr_system(tmp_path: Path) -> None:
    """A wheel's data row (``../../../lib/x86_64-linux-gnu/libcudart.so.12``, pip --prefix=/usr) over the
    CUDA .deb's library; dpkg lists it by the .deb's path /lib/... (merged-/usr: /lib is a link to usr/lib)."""
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "lib").symlink_to("usr/lib")
    deb_lib = b"\x7fELF libcudart12 12.4"
    _deb(
        tmp_path,
        "libcudart12",
        {"usr/lib/x86_64-linux-gnu/libcudart.so.12": deb_lib},
        listed={"usr/lib/x86_64-linux-gnu/libcudart.so.12": "lib/x86_64-linux-gnu/libcudart.so.12"},
    )
    wheel_lib = b"\x7fELF nvidia-cuda-runtime-cu12 12.9.79, bigger"
    write_dist(
        tmp_path / DIST,
        "nvidia-cuda-runtime-cu12",
        "12.9.79",
        {"nvidia/cuda_runtime/__init__.py": "", "../../../lib/x86_64-linux-gnu/libcudart.so.12": wheel_lib},
    )
    lib = tmp_path / "usr/lib/x86_64-linux-gnu/libcudart.so.12"
    assert listing_packages([str(lib)], str(tmp_path)) == {str(lib): "libcudart12"}
    (f,) = _overlap(_inv(tmp_path, DIST))
    assert f.subject == "nvidia-cuda-runtime-cu12 / libcudart12"
    assert f.severity is Severity.WARNING
    assert f.facts.objects == (str(lib),)
    assert f.message.endswith("; the bytes on disk are nvidia-cuda-runtime-cu12 12.9.79's")


def test_in_an_image_the_repair_is_run_steps_of_its_build(tmp_path: Path) -> None:
    """The same overlap in another system's root (an image's): the steps are RUN lines, apt non-interactive
    after an update (an image keeps no apt lists), pip by the image's path of its interpreter."""
    _python3_yaml(tmp_path)
    _pyyaml_wheel(tmp_path, DIST)
    (tmp_path / "usr/lib/python3.11").mkdir(parents=True)
    (tmp_path / "usr/lib/python3.11/EXTERNALLY-MANAGED").write_text("[externally-managed]\n")
    (f,) = _overlap(_inv(tmp_path, DIST, image=True))
    (fix,) = f.remedies
    assert isinstance(fix, Manual)
    assert fix.steps[:2] == (
        "RUN pip uninstall -y --break-system-packages PyYAML",
        "RUN apt-get update && apt-get install -y --reinstall python3-yaml",
    )
    assert fix.steps[2].startswith("only if you need PyYAML: RUN python3 -m venv")


def test_a_wheel_dpkg_database_does_not_list_is_not_read_as_a_deb_s(tmp_path: Path) -> None:
    """No dpkg database at the root: the same wheel has no overlap (the clean twin of every finding above)."""
    _pyyaml_wheel(tmp_path, DIST)
    inv = _inv(tmp_path, DIST)
    assert _overlap(inv) == []
    assert [f for f in _findings(inv) if f.severity is Severity.ERROR] == []


def test_a_listed_file_dpkg_keeps_no_md5_of_is_the_wheel_s_without_a_verify_claim(tmp_path: Path) -> None:
    """dpkg lists the file but its md5sums do not (a package shipped without them): the RECORD still says the
    bytes are the wheel's; that dpkg --verify fails is not claimed (it has nothing to compare)."""
    _python3_yaml(tmp_path)
    (tmp_path / "var/lib/dpkg/info/python3-yaml.md5sums").unlink()
    _pyyaml_wheel(tmp_path, DIST)
    (f,) = _overlap(_inv(tmp_path, DIST))
    assert f.severity is Severity.WARNING
    assert f.facts.found == "wheel"
    assert "dpkg --verify" not in f.cause
    assert "pip uninstall PyYAML deletes them" in f.cause
