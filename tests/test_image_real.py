"""`cudastack image` on real images built without a container runtime (``.ci/build-images``: a Debian bookworm
minbase root from mmdebstrap with python3 and Debian's CUDA runtime from non-free, OCI images made with umoci,
archives with skopeo), each verdict against the real loader inside the image's root (``chroot ROOT ldd``).

Built once by ``.ci/run`` under $CUDASTACK_IMAGES (default /opt/cudastack-images); skipped when absent, and
the oracle needs root (chroot).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack.cli import main

pytestmark = pytest.mark.real

IMAGES = Path(os.environ.get("CUDASTACK_IMAGES", "/opt/cudastack-images"))
FORMATS = ("oci-layout", "oci-archive", "docker-archive", "rootfs")
needs_images = pytest.mark.skipif(
    not (IMAGES / "done").is_file(), reason=f"no real images at {IMAGES} (.ci/build-images builds them)"
)
needs_chroot = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("chroot") is None, reason="the loader oracle runs chroot: needs root"
)


def _path(variant: str, fmt: str) -> Path:
    return {
        "oci-layout": IMAGES / f"{variant}.oci",
        "oci-archive": IMAGES / f"{variant}.oci.tar",
        "docker-archive": IMAGES / f"{variant}.docker.tar",
        "rootfs": IMAGES / f"{variant}.bundle" / "rootfs",
    }[fmt]


def _not_found(variant: str, program: str) -> set[str]:
    """The sonames the real loader inside the image's root does not find for ``program``."""
    root = IMAGES / f"{variant}.bundle" / "rootfs"
    out = subprocess.run(["chroot", str(root), "ldd", program], capture_output=True, text=True, check=False).stdout
    return {m.group(1) for m in re.finditer(r"^\s*(\S+) => not found", out, re.M)}


def _resolved(variant: str, program: str, soname: str) -> str | None:
    root = IMAGES / f"{variant}.bundle" / "rootfs"
    out = subprocess.run(["chroot", str(root), "ldd", program], capture_output=True, text=True, check=False).stdout
    m = re.search(rf"^\s*{re.escape(soname)} => (/\S+)", out, re.M)
    return m.group(1) if m else None


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> dict[str, Any]:
    if path.name == "rootfs":  # a root directory has no config (Entrypoint, PATH): name the program
        args = (*args, "--cudastack", "--cudastack-scan=/opt/app/bin/app")
    main(["image", str(path), "--json", *args])
    payload: dict[str, Any] = json.loads(capsys.readouterr().out)
    return payload


def _errors(payload: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted(
        (item, f["subject"], f["message"])
        for item, fs in payload["items"].items()
        for f in fs
        if f["severity"] == "error"
    )


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # one cache for the module: the formats of one image share its layers, as they do for a user
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "image-real-cache"))


@needs_images
@needs_chroot
@pytest.mark.parametrize("variant", ["clean", "cuda12", "whiteout", "whiteout-twin"])
def test_verdict_is_the_loaders_in_all_four_formats(
    variant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The entrypoint /opt/app/bin/app NEEDs libcudart.so.11.0 (Debian's 11.8 runtime) or, in cuda12, the
    libcudart.so.12 the image lacks; whiteout deletes Debian's libcudart.so.11* in a layer above, its twin
    deletes a file nothing needs. An error for each soname ldd says is not found, none elsewhere, and the
    four formats of one image give the same findings."""
    missing = _not_found(variant, "/opt/app/bin/app")
    verdicts = []
    for fmt in FORMATS:
        payload = _check(tmp_path, capsys, _path(variant, fmt))
        errors = _errors(payload)
        assert [(item, subject) for item, subject, _ in errors] == [
            ("scan[/opt/app/bin/app]", "/opt/app/bin/app") for _ in missing
        ], fmt
        for soname, (_, _, message) in zip(sorted(missing), errors, strict=True):
            assert soname in message
        # the distribution's own programs (dpkg lists them under /bin in this merged-/usr image) are not scanned
        assert sorted(k for k in payload["items"] if k.startswith("scan[")) == ["scan[/opt/app/bin/app]"]
        verdicts.append(errors)
    assert all(v == verdicts[0] for v in verdicts)
    assert (variant in ("cuda12", "whiteout")) == bool(missing)  # the images are what they claim


@needs_images
@needs_chroot
def test_whiteout_finding_names_the_layer_that_deleted_nothing_but_the_program_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = _check(tmp_path, capsys, _path("whiteout", "oci-archive"))
    (finding,) = payload["items"]["scan[/opt/app/bin/app]"]
    assert finding["provenance"][0]["created_by"] == "COPY app /opt/app/bin/app"
    assert [layer["created_by"] for layer in payload["image"]["layers"]][-1].startswith("RUN rm ")


@needs_images
@needs_chroot
@pytest.mark.parametrize(
    ("variant", "host", "severity"),
    [
        ("baked", "550.54.15", "error"),
        ("baked", None, "warning"),
        ("baked", "same", None),
        ("clean", "550.54.15", None),
    ],
    ids=["baked-other-host-driver", "baked-no-host-driver", "baked-clean-twin-same-driver", "clean-twin-no-baked"],
)
def test_baked_driver_library_from_debian_s_libnvidia_ml1(
    variant: str, host: str | None, severity: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A layer adds Debian's libnvidia-ml.so.535.* (as a build under the NVIDIA runtime leaves it) and a program
    linking libnvidia-ml.so.1. The oracle: inside the image the loader binds the baked file, so the container
    runtime's injected one of the host's version is not the only candidate."""
    root = IMAGES / f"{variant}.bundle" / "rootfs"
    baked = sorted(p.name for p in (root / "usr/lib/x86_64-linux-gnu").glob("libnvidia-ml.so.*.*"))
    if variant == "baked":
        (name,) = baked
        bound = _resolved(variant, "/opt/app/bin/nvml-app", "libnvidia-ml.so.1")
        assert bound is not None
        assert os.path.realpath(root / bound.lstrip("/")).endswith(name)
    else:
        assert baked == []
    version = "535.261.03" if not baked else baked[0][len("libnvidia-ml.so.") :]
    args = [f"--cuda-driver={version if host == 'same' else host}"] if host else []
    for fmt in FORMATS:
        payload = _check(tmp_path, capsys, _path(variant, fmt), *args)
        found = [f for f in payload["items"].get("container", []) if "baked" in f["message"]]
        assert [f["severity"] for f in found] == ([severity] if severity else []), fmt
        if found and fmt != "rootfs":  # a root directory has no layers to name
            assert "baked libnvidia-ml" in found[0]["provenance"][0]["created_by"]
        assert [e[0] for e in _errors(payload)] == (["container"] if severity == "error" else [])


@needs_images
@needs_chroot
def test_deleted_debian_library_is_reinstalled_from_the_package_dpkg_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """whiteout deleted libcudart.so.11* in a layer, but dpkg's database still has libcudart11.0 installed:
    the fix reinstalls the package ``dpkg -S`` names inside the image; cuda12's libcudart.so.12 is in no
    installed package, and the one shipping libcudart.so.11.0 is named as what the image has instead."""

    def dpkg_s(variant: str, pattern: str) -> str:
        root = IMAGES / f"{variant}.bundle" / "rootfs"
        out = subprocess.run(["chroot", str(root), "dpkg", "-S", pattern], capture_output=True, text=True)
        return out.stdout.split(":", 1)[0] if out.returncode == 0 else ""

    package = dpkg_s("whiteout", "/usr/lib/x86_64-linux-gnu/libcudart.so.11.0")
    assert package == "libcudart11.0"
    (finding,) = _check(tmp_path, capsys, _path("whiteout", "docker-archive"))["items"]["scan[/opt/app/bin/app]"]
    assert finding["fix"].startswith(f"apt-get install --reinstall {package}")
    assert dpkg_s("cuda12", "libcudart.so.12") == ""
    (finding,) = _check(tmp_path, capsys, _path("cuda12", "oci-layout"))["items"]["scan[/opt/app/bin/app]"]
    assert finding["fix"].startswith("install the package that provides libcudart.so.12")
    assert any(d.startswith(f"dpkg's {dpkg_s('cuda12', 'libcudart.so.11.0')}") for d in finding["details"])


@needs_images
@needs_chroot
@pytest.mark.parametrize("variant", ["altered", "clean"], ids=["layer-replaced-debian-s-libcudart", "clean-twin"])
def test_replaced_debian_library_against_dpkg_verify(
    variant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """altered's top layer overwrites Debian's libcudart.so.11.8.89 with another library of its soname: the
    program still loads (ldd finds it) and ``dpkg --verify`` inside the image reports the file's md5. One
    warning naming that file and package for each file dpkg reports, in every format; none in the twin."""
    root = IMAGES / f"{variant}.bundle" / "rootfs"
    if not root.is_dir():
        pytest.skip(f"{variant}: built by a newer .ci/build-images")
    verify = subprocess.run(["chroot", str(root), "dpkg", "--verify", "libcudart11.0"], capture_output=True, text=True)
    reported = sorted(line.split()[-1] for line in verify.stdout.splitlines() if line[2:3] == "5")
    assert _not_found(variant, "/opt/app/bin/app") == set()
    for fmt in FORMATS:
        payload = _check(tmp_path, capsys, _path(variant, fmt))
        found = [f for f in payload["items"]["scan[/opt/app/bin/app]"] if "dpkg's" in f["message"]]
        assert sorted(f["facts"]["objects"][0] for f in found) == reported, fmt
        assert all(f["severity"] == "warning" for f in found)
        assert all("apt-get install --reinstall libcudart11.0" in f["fix"] for f in found)
    assert bool(reported) is (variant == "altered")
