"""Real tier: the real Debian bookworm root of ``.ci/build-images`` (``clean``: python3 and Debian's
libcudart11.0 from non-free), a real ``pip install --prefix`` of a wheel whose data lands on that ``.deb``'s
library, judged against dpkg itself (``chroot ROOT dpkg --verify``) and a real ``pip uninstall``; and the image
Python's version against the interpreter's own (``chroot ROOT python3``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from tests.helpers.sitebuild import record_hash

pytestmark = pytest.mark.real

IMAGES = Path(os.environ.get("CUDASTACK_IMAGES", "/opt/cudastack-images"))
CLEAN = IMAGES / "clean.bundle" / "rootfs"
needs_root = pytest.mark.skipif(
    not (IMAGES / "done").is_file() or not CLEAN.is_dir() or os.geteuid() != 0 or shutil.which("chroot") is None,
    reason=f"needs the real images at {IMAGES} (.ci/build-images) and root for chroot (the oracle)",
)
PACKAGE = "libcudart11.0"
LIB = "usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89"


def _verify(root: Path) -> str:
    """What dpkg itself says of the package's files in ``root`` ("" when they are as it installed them)."""
    run = subprocess.run(
        ["chroot", str(root), "dpkg", "--verify", PACKAGE], capture_output=True, text=True, timeout=120
    )
    return run.stdout


def _wheel(dest: Path, data: bytes) -> Path:
    """A wheel whose data scheme holds ``lib/x86_64-linux-gnu/<the .deb's library name>``: ``pip install
    --prefix=/usr`` puts it over the .deb's file."""
    di = "cudartfork-1.0.dist-info"
    files: dict[str, bytes] = {
        "cudartfork/__init__.py": b"",
        f"cudartfork-1.0.data/data/lib/x86_64-linux-gnu/{os.path.basename(LIB)}": data,
        f"{di}/METADATA": b"Metadata-Version: 2.1\nName: cudartfork\nVersion: 1.0\n\n",
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [f"{p},{record_hash(t)},{len(t)}" for p, t in files.items()]
    files[f"{di}/RECORD"] = ("\n".join([*rows, f"{di}/RECORD,,"]) + "\n").encode()
    path = dest / "cudartfork-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return path


def _root(tmp_path: Path) -> Path:
    """A copy of the clean root (hard links), the .deb's library a file of its own (pip must not write through
    a link into the shared image)."""
    root = tmp_path / "rootfs"
    subprocess.run(["cp", "-al", str(CLEAN), str(root)], check=True, timeout=300)
    lib = root / LIB
    data = lib.read_bytes()
    lib.unlink()
    lib.write_bytes(data)
    return root


def _overlaps(root: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    main(["image", str(root), "--json", "--cudastack"])
    payload = json.loads(capsys.readouterr().out)
    return [f for f in payload["items"].get("integrity", []) if " / " in str(f["subject"])]


@needs_root
def test_a_wheel_over_a_deb_s_library_as_dpkg_and_pip_see_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    root = _root(tmp_path)
    # the clean twin, by dpkg's own word: nothing altered, and no overlap
    assert _verify(root) == ""
    assert _overlaps(root, capsys) == []
    wheel = _wheel(tmp_path, b"\x7fELF the wheel's libcudart build\n" * 64)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--prefix", str(root / "usr")]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True, timeout=300)
    # dpkg: the file's md5 is not its record ("??5??????")
    assert re.search(rf"^..5\S*\s+/{re.escape(LIB)}$", _verify(root), re.M), _verify(root)
    (f,) = _overlaps(root, capsys)
    assert f["subject"] == f"cudartfork / {PACKAGE}"
    assert f["severity"] == "warning"
    assert f["facts"]["objects"] == [f"/{LIB}"]
    assert str(f["message"]).endswith("the bytes on disk are cudartfork 1.0's")
    assert f["remedies"][0]["steps"][1] == f"RUN apt-get update && apt-get install -y --reinstall {PACKAGE}"
    # what the finding says pip uninstall does: it deletes the .deb's file, and dpkg then reports it missing
    # (a venv's pip refuses a distribution outside its environment: the system's pip, no venv, does it)
    system = shutil.which("python3", path="/usr/bin")
    if system is None or subprocess.run([system, "-m", "pip", "--version"], capture_output=True).returncode:
        return
    site = next((root / "usr/lib").glob("python3*/site-packages"))
    uninstall = [system, "-m", "pip", "uninstall", "-y", "--break-system-packages", "cudartfork"]
    env = {**os.environ, "PYTHONPATH": str(site), "PIP_NO_INPUT": "1"}
    done = subprocess.run(uninstall, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not (root / LIB).exists()
    assert "missing" in _verify(root)


@needs_root
def test_the_image_python_version_is_the_interpreter_s_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pytest_cudastack.image.pythons import image_pythons
    from pytest_cudastack.image.rootfs import open_image

    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    image = open_image(str(IMAGES / "clean.oci"))
    (python,) = [p for p in image_pythons(image) if p.path == "/usr/bin/python3"]
    oracle = subprocess.run(
        [
            "chroot",
            str(CLEAN),
            "/usr/bin/python3",
            "-I",
            "-S",
            "-c",
            "import sys; print('%d.%d' % sys.version_info[:2])",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert python.version is not None
    assert python.version.version == oracle
