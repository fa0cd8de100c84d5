"""An image's Python version read from its files as CPython's build fixes it (the interpreter's name along its
links, the libpython it links, a venv's pyvenv.cfg, the one stdlib of its prefix), never guessed; and the
site directories and requirement markers that follow from it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_cudastack.image.pythons import PythonVersion, image_pythons, image_site_dirs, installation_version
from pytest_cudastack.image.rootfs import ImageRoot
from pytest_cudastack.wheels.inventory import installed_wheels
from pytest_cudastack.wheels.requirements import requirement_facts, site_python
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc
from tests.helpers.sitebuild import write_dist


def _file(path: Path, data: bytes = b"#!not an ELF\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _debian(root: Path, *, python3: str | None = "python3.11", stdlibs: tuple[str, ...] = ("3.11", "3.12")) -> None:
    """Debian's layout: /usr/bin/python3 -> python3.11 (``python3``: None, a copied file), a stdlib per
    ``stdlibs`` (a second one left by another python3.X package), the shared /usr/lib/python3/dist-packages."""
    for v in stdlibs:
        _file(root / f"usr/lib/python{v}/os.py", b"")
        _file(root / f"usr/bin/python{v}")
    if python3 is None:
        _file(root / "usr/bin/python3")
    else:
        _link(root / "usr/bin/python3", python3)
    (root / "usr/lib/python3/dist-packages").mkdir(parents=True)


def test_debian_python3_is_the_version_its_link_names(tmp_path: Path) -> None:
    _debian(tmp_path)
    assert installation_version(str(tmp_path / "usr")) == PythonVersion("3.11", False, "the interpreter is python3.11")
    # the version-less dist-packages every python3.X reads: its markers are /usr/bin/python3's
    assert site_python(str(tmp_path / "usr/lib/python3/dist-packages")) == "3.11.0"


def test_twin_a_copied_python3_with_two_stdlibs_is_unknown(tmp_path: Path) -> None:
    """Nothing in the files says which of the two stdlibs python3 is: unknown, not the first or the newest."""
    _debian(tmp_path, python3=None)
    assert installation_version(str(tmp_path / "usr")) is None
    assert site_python(str(tmp_path / "usr/lib/python3/dist-packages")) is None


def test_a_prefix_with_one_stdlib_is_that_version(tmp_path: Path) -> None:
    _debian(tmp_path, python3=None, stdlibs=("3.9",))
    found = installation_version(str(tmp_path / "usr"))
    assert found is not None
    assert (found.version, found.evidence) == ("3.9", "its only stdlib is lib/python3.9/os.py")


@pytest.mark.parametrize(
    ("cfg", "link", "expected"),
    [
        ("home = /usr/bin\nversion = 3.12.3\n", "../../usr/bin/python3.12", "3.12.3"),
        ("home = /usr/bin\nversion_info = 3.13.1\n", None, "3.13.1"),  # uv, --copies: a copied python3
        ("home = /usr/bin\nversion = 3.11.2\n", "../../usr/bin/python3.12", "3.12"),  # base upgraded under it
    ],
    ids=["venv-link-and-cfg", "uv-copied-interpreter", "cfg-older-than-its-interpreter"],
)
def test_a_venv_s_version(tmp_path: Path, cfg: str, link: str | None, expected: str) -> None:
    _file(tmp_path / "usr/bin/python3.12")
    _file(tmp_path / "venv/pyvenv.cfg", cfg.encode())
    if link is None:
        _file(tmp_path / "venv/bin/python3")
    else:
        _link(tmp_path / "venv/bin/python3", link)
    found = installation_version(str(tmp_path / "venv"))
    assert found is not None
    assert found.version == expected


def test_free_threaded_interpreter(tmp_path: Path) -> None:
    _file(tmp_path / "opt/py/bin/python3.13t")
    _link(tmp_path / "opt/py/bin/python3", "python3.13t")
    assert installation_version(str(tmp_path / "opt/py")) == PythonVersion(
        "3.13", True, "the interpreter is python3.13t"
    )


@needs_cc
def test_a_shared_build_is_the_libpython_it_links(tmp_path: Path) -> None:
    """A copied ``python3`` (python-build-standalone, a relocated build) whose ELF links libpython3.10: that is
    its version, whatever other stdlib the prefix holds."""
    lib = build_lib(tmp_path / "build/libpython3.10.so.1.0", soname="libpython3.10.so.1.0")
    exe = build_exe(tmp_path / "build/python3", needed=[lib])
    (tmp_path / "opt/py/bin").mkdir(parents=True)
    shutil.copy(exe, tmp_path / "opt/py/bin/python3")
    _file(tmp_path / "opt/py/lib/python3.10/os.py", b"")
    _file(tmp_path / "opt/py/lib/python3.12/os.py", b"")
    found = installation_version(str(tmp_path / "opt/py"))
    assert found is not None
    assert (found.version, found.evidence) == ("3.10", "python3 links libpython3.10.so.1.0")


def _image(root: Path) -> ImageRoot:
    return ImageRoot(str(root), "test", "rootfs", {"PATH": "/usr/local/bin:/usr/bin:/bin"})


def test_image_site_dirs_are_the_interpreter_s_version_s(tmp_path: Path) -> None:
    """/usr/bin/python3 -> python3.11 in an image that also holds /usr/lib/python3.12 (another package's
    leftover, no python3.12 on PATH): python3.11's site directories only."""
    _debian(tmp_path, stdlibs=("3.11",))
    _file(tmp_path / "usr/lib/python3.12/os.py", b"")
    for v in ("3.11", "3.12"):
        (tmp_path / f"usr/lib/python{v}/dist-packages").mkdir(parents=True)
    dirs = [d[len(str(tmp_path)) :] for d in image_site_dirs(_image(tmp_path))]
    assert dirs == ["/usr/lib/python3/dist-packages", "/usr/lib/python3.11/dist-packages"]
    (python,) = image_pythons(_image(tmp_path))
    assert (python.path, python.version and python.version.version) == ("/usr/bin/python3", "3.11")


@pytest.mark.parametrize("python", ["python3.12", "python3.11"], ids=["marker-active-3.12", "clean-twin-3.11"])
def test_markers_of_debian_s_dist_packages_are_the_image_python_s(tmp_path: Path, python: str) -> None:
    """A distribution in the image's /usr/lib/python3/dist-packages requires ``needed; python_version >=
    "3.12"``: unmet when the image's python3 is 3.12, inactive when it is 3.11 (whatever this machine runs)."""
    _debian(tmp_path, python3=python, stdlibs=(python[len("python") :],))
    write_dist(tmp_path / "usr/lib/python3/dist-packages", "app", "1.0", requires=['needed; python_version >= "3.12"'])
    image = _image(tmp_path)
    inv = installed_wheels(image_site_dirs(image), dpkg_root=image.root, root=image.root)
    unmet = [f.name for f in requirement_facts(inv).unmet]
    assert unmet == (["needed"] if python == "python3.12" else [])


@pytest.mark.parametrize("known", [False, True], ids=["copied-python3-two-stdlibs", "clean-twin-link"])
def test_an_image_python_of_unknown_version_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, known: bool
) -> None:
    """``cudastack image`` on a root file system whose /usr/bin/python3 is a copy beside two stdlibs: an INFO
    that its version cannot be read (said, not guessed); a link to python3.11 says nothing."""
    import json

    from pytest_cudastack.cli import main

    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    _debian(tmp_path / "root", python3="python3.11" if known else None)
    main(["image", str(tmp_path / "root"), "--json"])
    payload = json.loads(capsys.readouterr().out)
    said = [f for f in payload["items"].get("container", []) if "cannot be read from its files" in f["message"]]
    if known:
        assert said == []
        return
    (info,) = said
    assert (info["severity"], info["subject"]) == ("info", "/usr/bin/python3")


def test_hostile_files_are_skipped_not_waited_on(tmp_path: Path) -> None:
    """A FIFO named pyvenv.cfg or x.pth, a directory named y.pth, a link loop as python3: read as absent
    (nothing blocks or raises); the prefix's one stdlib still says the version."""
    import os

    from pytest_cudastack.wheels.sitepaths import site_dirs

    prefix = tmp_path / "opt/py"
    (prefix / "bin").mkdir(parents=True)
    os.mkfifo(prefix / "pyvenv.cfg")
    (prefix / "bin/python3").symlink_to("python3")  # a loop
    _file(prefix / "lib/python3.11/os.py", b"")
    found = installation_version(str(prefix))
    assert found is not None
    assert found.version == "3.11"
    site = prefix / "lib/python3.11/site-packages"
    site.mkdir()
    os.mkfifo(site / "x.pth")
    (site / "y.pth").mkdir()
    assert site_dirs([str(site)], root=str(tmp_path)) == (str(site),)
