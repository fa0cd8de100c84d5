"""`cudastack image`: a deployment image judged as a stack (its search path, binaries, dpkg database, the NVIDIA
container runtime's start on the declared host), in the four formats, each broken image with a clean twin."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import pytest_cudastack
from pytest_cudastack.cli import main
from pytest_cudastack.cuda.container import HostFacts, compare_version, evaluate, requirements
from pytest_cudastack.image.rootfs import open_image
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc
from tests.helpers.imagebuild import (
    FORMATS,
    Entry,
    blob_files,
    build_image,
    is_placeholder,
    needs_user_xattrs,
    read_root_file,
)

pytestmark = needs_cc

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
LDSO = Path("/lib64/ld-linux-x86-64.so.2")
needs_glibc = pytest.mark.skipif(not LIBC.exists() or not LDSO.exists(), reason="needs the x86-64 glibc")


@dataclass(frozen=True)
class Parts:
    cublas12: Path
    train13: Path  # links libcublas.so.13: incident 1
    train12: Path  # links libcublas.so.12
    stub: Path  # a stub libcuda: soname libcuda.so.1


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Parts:
    d = tmp_path_factory.mktemp("elf")
    cublas12 = build_lib(d / "12" / "libcublas.so.12", soname="libcublas.so.12")
    cublas13 = build_lib(d / "13" / "libcublas.so.13", soname="libcublas.so.13")
    stub = build_lib(d / "stubs" / "libcuda.so", soname="libcuda.so.1")
    return Parts(
        cublas12, build_exe(d / "train13", needed=[cublas13]), build_exe(d / "train12", needed=[cublas12]), stub
    )


def _base(parts: Parts) -> list[Entry]:
    """A Debian-like root: glibc, ld.so.conf with CUDA's directory, libcublas.so.12 (CUDA 12.9's)."""
    return [
        Entry("etc/ld.so.conf", data=b"include /etc/ld.so.conf.d/*.conf\n"),
        Entry("etc/ld.so.conf.d/cuda.conf", data=b"/usr/local/cuda/lib64\n"),
        Entry("usr/lib/x86_64-linux-gnu/libc.so.6", data=LIBC.resolve()),
        Entry("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", data=LDSO.resolve()),
        Entry("lib", "symlink", target="usr/lib"),
        Entry("lib64/ld-linux-x86-64.so.2", "symlink", target="/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        Entry("usr/local/cuda/lib64/libcublas.so.12", data=parts.cublas12),
    ]


ENV = ["PATH=/opt/app/bin:/usr/bin:/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]


def _check(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    layers: list[list[Entry]],
    *args: str,
    fmt: str = "oci-archive",
    env: list[str] = ENV,
    history: tuple[str, ...] = (),
    name: str = "img",
) -> tuple[int, dict[str, Any]]:
    out = tmp_path / (name if fmt == "oci-layout" else f"{name}.tar")
    build_image(out, layers, fmt, env=env, history=history or tuple(f"RUN step {i}" for i in range(len(layers))))
    rc = main(["image", str(out), "--json", *args])
    payload = json.loads(capsys.readouterr().out)
    return rc, payload


def _errors(payload: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((item, f["subject"]) for item, fs in payload["items"].items() for f in fs if f["severity"] == "error")


def _findings(payload: dict[str, Any], item: str) -> list[dict[str, Any]]:
    return payload["items"].get(item, [])


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@needs_glibc
def test_incident_1_cuda13_binary_in_a_cuda12_image_fails_in_all_four_formats(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layers = [_base(parts), [Entry("opt/app/bin/train", data=parts.train13)]]
    history = ("COPY cuda-12.9 /usr/local/cuda", "COPY build/train /opt/app/bin/train")
    schema = json.loads((Path(pytest_cudastack.__file__).parent / "schemas" / "check.schema.json").read_text())
    verdicts = {}
    for fmt in FORMATS:
        rc, payload = _check(tmp_path, capsys, layers, "--cuda-driver=550.54.15", fmt=fmt, history=history, name=fmt)
        assert rc == 1
        jsonschema.validate(payload, schema)
        assert payload["image"]["reference"] == "example.com/app:1"
        scan = _findings(payload, "scan[/opt/app/bin/train]")
        assert [f["message"] for f in scan] == ["needs libcublas.so.13, which the dynamic linker does not find"]
        assert scan[0]["provenance"] == [
            {
                "path": "/opt/app/bin/train",
                "layer": payload["image"]["layers"][1]["digest"],
                "created_by": "COPY build/train /opt/app/bin/train",
            }
        ]
        verdicts[fmt] = _errors(payload)
    assert verdicts["oci-layout"] == [
        ("driver", "/opt/app/bin/train"),
        ("scan[/opt/app/bin/train]", "/opt/app/bin/train"),
    ]
    assert all(v == verdicts["oci-layout"] for v in verdicts.values()), verdicts
    # the same files as a root file system directory (no config: the binary is named by --cudastack-scan)
    from pytest_cudastack.image.rootfs import open_image

    shutil.copytree(open_image(str(tmp_path / "oci-layout")).root, tmp_path / "rootfs", symlinks=True)
    rc = main(
        [
            "image",
            str(tmp_path / "rootfs"),
            "--json",
            "--cuda-driver=550.54.15",
            "--cudastack",
            "--cudastack-scan=/opt/app/bin",
        ]
    )
    payload = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert payload["image"]["kind"] == "rootfs"
    assert _errors(payload) == verdicts["oci-layout"]


@needs_glibc
def test_clean_twin_cuda12_binary_passes(parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layers = [_base(parts), [Entry("opt/app/bin/train", data=parts.train12)]]
    rc, payload = _check(tmp_path, capsys, layers, "--cuda-driver=550.54.15", "--cuda-arch=sm_90")
    assert _errors(payload) == []
    assert rc == 0
    assert "scan[/opt/app/bin/train]" in payload["items"]


@needs_glibc
def test_text_output_names_the_layer_step(parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = build_image(
        tmp_path / "img",
        [_base(parts), [Entry("opt/app/bin/train", data=parts.train13)]],
        env=ENV,
        history=("COPY cuda", "COPY build/train /opt/app/bin/train"),
    )
    assert main(["image", str(out), "--cuda-driver=550.54.15"]) == 1
    text = capsys.readouterr().out
    assert text.startswith("image example.com/app:1 (oci-layout, linux/amd64, 2 layers)\n")
    assert "from: /opt/app/bin/train: from layer sha256:" in text
    assert "(COPY build/train /opt/app/bin/train)" in text


@needs_glibc
@pytest.mark.parametrize("deleted", [True, False], ids=["whiteout", "clean-twin"])
def test_whiteout_deleting_a_needed_library(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], deleted: bool
) -> None:
    top = [Entry("opt/app/bin/train", data=parts.train12)]
    if deleted:
        top.append(Entry("usr/local/cuda/lib64/libcublas.so.12", "whiteout"))
    rc, payload = _check(tmp_path, capsys, [_base(parts), top], "--cuda-driver=550.54.15", "--cuda-arch=sm_90")
    scan = _findings(payload, "scan[/opt/app/bin/train]")
    if deleted:
        assert rc == 1
        assert [f["message"] for f in scan] == ["needs libcublas.so.12, which the dynamic linker does not find"]
    else:
        assert rc == 0
        assert scan == []


@needs_glibc
@pytest.mark.parametrize(
    ("host", "severity"),
    [("550.54.15", "error"), ("535.104.05", None), (None, "warning")],
    ids=["other-version", "clean-twin-same-version", "no-host-driver"],
)
def test_baked_driver_library(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str | None, severity: str | None
) -> None:
    baked = [
        Entry("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.104.05", data=b"\x7fELF-not-really"),
        Entry("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "symlink", target="libnvidia-ml.so.535.104.05"),
    ]
    args = [f"--cuda-driver={host}"] if host else []
    _rc, payload = _check(
        tmp_path,
        capsys,
        [_base(parts), baked],
        *args,
        "--cuda-arch=sm_90",
        history=("FROM debian", "RUN apt-get install nvidia-utils"),
    )
    found = [f for f in _findings(payload, "container") if "baked" in f["message"]]
    if severity is None:
        assert found == []
        return
    assert [f["severity"] for f in found] == [severity]
    assert found[0]["subject"] == "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.104.05"
    assert found[0]["provenance"][0]["created_by"] == "RUN apt-get install nvidia-utils"


@needs_glibc
@pytest.mark.parametrize("in_conf", [True, False], ids=["stubs-in-ld.so.conf", "clean-twin"])
def test_stub_libcuda_reachable_at_run_time(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], in_conf: bool
) -> None:
    layer = [Entry("usr/local/cuda/lib64/stubs/libcuda.so", data=parts.stub)]
    if in_conf:
        layer.append(Entry("etc/ld.so.conf.d/zz-stubs.conf", data=b"/usr/local/cuda/lib64/stubs\n"))
    rc, payload = _check(tmp_path, capsys, [_base(parts), layer], "--cuda-driver=550.54.15", "--cuda-arch=sm_90")
    stubs = [f for f in _findings(payload, "container") if "stub" in f["message"]]
    if in_conf:
        assert rc == 1
        assert [f["subject"] for f in stubs] == ["/usr/local/cuda/lib64/stubs/libcuda.so"]
        assert stubs[0]["severity"] == "error"
    else:
        assert rc == 0
        assert stubs == []


@needs_glibc
@pytest.mark.parametrize(
    ("host", "on_path", "expect"),
    [
        ("580.65.06", True, "error"),  # compat older than the host's driver, on LD_LIBRARY_PATH: 803
        ("580.65.06", False, None),  # clean twin: the runtime leaves it out
        ("550.54.15", False, "warning"),  # forward compatibility: data-centre GPUs only
    ],
    ids=["compat-older-on-path", "compat-older-unused", "forward-compat"],
)
def test_cuda_compat_directory(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str, on_path: bool, expect: str | None
) -> None:
    libcuda = build_lib(tmp_path / "compat" / "libcuda.so.575.57.08", soname="libcuda.so.1")
    compat = [
        Entry("usr/local/cuda/compat/libcuda.so.575.57.08", data=libcuda),
        Entry("usr/local/cuda/compat/libcuda.so.1", "symlink", target="libcuda.so.575.57.08"),
    ]
    env = [*ENV, "LD_LIBRARY_PATH=/usr/local/cuda/compat"] if on_path else ENV
    _rc, payload = _check(
        tmp_path, capsys, [_base(parts), compat], f"--cuda-driver={host}", "--cuda-arch=sm_90", env=env
    )
    found = [f for f in _findings(payload, "container") if "compat" in f["message"]]
    assert [f["severity"] for f in found] == ([expect] if expect else [])


@needs_glibc
@pytest.mark.parametrize(
    ("env", "errors"),
    [
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.9 brand=tesla,driver>=535,driver<536"], 1),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.4"], 0),
        (["CUDA_VERSION=12.9.1"], 1),  # a legacy image: cuda>=12.9
        (["CUDA_VERSION=12.9.1", "NVIDIA_DISABLE_REQUIRE=true"], 0),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.9", "NVIDIA_REQUIRE_JETPACK=csv-mounts=all"], 1),
    ],
    ids=["unsatisfied", "satisfied", "legacy", "disabled", "jetpack-ignored"],
)
def test_nvidia_require_cuda_against_the_host_driver(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], env: list[str], errors: int
) -> None:
    _rc, payload = _check(tmp_path, capsys, [_base(parts)], "--cuda-driver=550.54.15", env=["PATH=/usr/bin", *env])
    found = [f for f in _findings(payload, "container") if f["severity"] == "error"]
    assert len(found) == errors
    if errors:
        assert "unsatisfied condition: cuda>=12.9" in found[0]["message"]
        assert found[0]["remedies"][0]["kind"] == "driver"


def test_a_hostile_image_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = build_image(tmp_path / "evil", [[Entry("../../etc/evil", data=b"x")]])
    assert main(["image", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cudastack image: error: layer sha256:" in err
    assert "escapes the image root" in err
    assert "Traceback" not in err
    assert not (tmp_path.parent / "etc" / "evil").exists()


def test_a_missing_image_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["image", str(tmp_path / "nothing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("expression", "host", "verdict"),
    [
        ("cuda>=12.9", HostFacts("12.4", "550.54.15"), False),
        ("cuda>=12.4", HostFacts("12.4", "550.54.15"), True),
        ("cuda>=12.4.0", HostFacts("12.4", "550.54.15"), True),  # trailing zeros ignored
        ("cuda>=12.9 brand=tesla,driver>=550,driver<551", HostFacts("12.4", "550.54.15"), None),  # brand unknown
        ("cuda>=12.9 brand=tesla,driver>=550,driver<551", HostFacts("12.4", "550.54.15", "9.0", "Tesla"), True),
        ("cuda>=12.9 brand=tesla,driver>=535,driver<536", HostFacts("12.4", "550.54.15", "9.0", "Tesla"), False),
        ("arch>=8.0", HostFacts("12.4", "550.54.15", "7.5"), False),
        ("driver>=550.60", HostFacts("12.4", "550", driver_is_branch=True), None),  # the minor decides
        ("driver>=535", HostFacts("12.4", "550", driver_is_branch=True), True),
    ],
)
def test_requirement_language(expression: str, host: HostFacts, verdict: bool | None) -> None:
    assert evaluate(expression, host) is verdict


def test_version_comparison_as_libnvidia_container() -> None:
    assert compare_version("12.4", "=", "12.4.0")
    assert compare_version("12.10", ">", "12.9")
    assert compare_version("x", "=", "1") is None


def test_requirements_read_from_the_environment() -> None:
    assert requirements({"NVIDIA_REQUIRE_CUDA": "cuda>=12.9", "NVIDIA_REQUIRE_ARCH": "arch>=8.0"}) == (
        ("NVIDIA_REQUIRE_ARCH", "arch>=8.0"),
        ("NVIDIA_REQUIRE_CUDA", "cuda>=12.9"),
    )
    assert requirements({"CUDA_VERSION": "11.8.0"}) == (("CUDA_VERSION", "cuda>=11.8"),)
    assert requirements({"CUDA_VERSION": "11.8.0", "NVIDIA_DISABLE_REQUIRE": "1"}) == ()


def _tree_entries(root: Path, under: str) -> list[Entry]:
    """Every file below ``root`` as an entry at ``under``/its relative path."""
    return [
        Entry(f"{under}/{p.relative_to(root).as_posix()}", data=p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    ]


@needs_glibc
@pytest.mark.parametrize("cuda", ["13", "12"], ids=["module-needs-cuda13", "clean-twin"])
def test_the_images_python_wheels_are_judged_inside_the_image(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], cuda: str
) -> None:
    from tests.helpers.sitebuild import compile_so, site_packages, write_dist

    site = site_packages(tmp_path / "prefix")
    module = compile_so(None, needed=[f"libcublas.so.{cuda}"], pyinit="_core")
    write_dist(
        site, "fastops", "1.0", {"fastops/__init__.py": "from fastops import _core\n", "fastops/_core.so": module}
    )
    python = [
        Entry("usr/local/bin/python3.11", data=parts.train12),
        Entry("usr/local/bin/python3", "symlink", target="python3.11"),
        *_tree_entries(site, "usr/local/lib/python3.11/site-packages"),
    ]
    env = ["PATH=/usr/local/bin:/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]
    (tmp_path / "use.py").write_text("import fastops\n")  # the project imports it: a failure is an error
    rc, payload = _check(
        tmp_path,
        capsys,
        [_base(parts), python],
        "--cuda-driver=550.54.15",
        "--cuda-arch=sm_90",
        env=env,
        history=("COPY cuda", "RUN pip install fastops"),
    )
    closure = _findings(payload, "closure")
    if cuda == "12":
        assert [f for f in closure if f["severity"] == "error"] == []
        return
    assert rc == 1
    missing = [f for f in closure if "libcublas.so.13" in json.dumps(f)]
    assert missing
    assert missing[0]["severity"] == "error"
    assert missing[0]["facts"]["objects"] == ["/usr/local/lib/python3.11/site-packages/fastops/_core.so"]
    assert any(p["created_by"] == "RUN pip install fastops" for f in missing for p in f["provenance"])


@needs_glibc
def test_pytest_judges_the_image_with_items_and_markers(
    parts: Parts, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pytest_cudastack.settings import ENV as OPTION_ENV

    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in OPTION_ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    layers = [_base(parts), [Entry("opt/app/bin/train", data=parts.train13)]]
    build_image(pytester.path / "app.tar", layers, "docker-legacy", env=ENV)
    pytester.makeini("[pytest]\ncudastack_image = app.tar\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.requires_soname("libcublas.so.12")
        def test_has_cuda12(): pass

        @pytest.mark.requires_soname("libcublas.so.13")
        def test_has_cuda13(): pass
        """
    )
    result = pytester.runpytest(
        "-p", "pytest_cudastack.plugin", "--cudastack", "--cuda-driver=550.54.15", "--cuda-arch=sm_90", "-rA"
    )
    result.assert_outcomes(passed=6, failed=3, skipped=3)
    result.stdout.fnmatch_lines(
        [
            "cudastack: image example.com/app:1 | driver 550.54.15 (declared) | *",
            "PASSED*test_has_cuda12",
            "FAILED cudastack::driver*",
            "FAILED cudastack::scan[[]/opt/app/bin/train[]]*",
            "FAILED*test_has_cuda13*",
        ]
    )


@needs_glibc
def test_tree_why_snapshot_and_check_take_image(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = build_image(tmp_path / "img", [_base(parts), [Entry("opt/app/bin/train", data=parts.train13)]], env=ENV)
    assert main(["tree", "--image", str(out), "/opt/app/bin/train", "--json"]) == 1
    trees = json.loads(capsys.readouterr().out)["trees"]
    libs = {x["soname"]: x["path"] for x in trees[0]["libraries"]}
    assert libs["libcublas.so.13"] is None
    assert libs["libc.so.6"] == "/lib/x86_64-linux-gnu/libc.so.6"
    assert main(["why", "--image", str(out), "libcublas.so.12", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["found"]
    assert main(["why", "--image", str(out), "libcublas.so.13"]) == 1
    capsys.readouterr()
    assert main(["snapshot", "--image", str(out), "--cuda-driver=550.54.15"]) == 0
    snapshot = json.loads(capsys.readouterr().out)
    assert [b["path"] for b in snapshot["binaries"]] == ["/opt/app/bin/train"]
    assert main(["check", "--image", str(out), "--cuda-driver=550.54.15"]) == 1
    assert "FAIL cudastack::scan[/opt/app/bin/train]" in capsys.readouterr().out
    assert main(["tree", "--image", str(tmp_path / "nothing"), "/bin/sh"]) == 2
    assert "cudastack tree: error: " in capsys.readouterr().err


def test_pytest_with_an_unreadable_image_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    (pytester.path / "broken.tar").write_bytes(b"not an image")
    pytester.makepyfile("def test_x(): pass\n")
    result = pytester.runpytest("-p", "pytest_cudastack.plugin", "--cudastack", "--cudastack-image=broken.tar")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cudastack-image: *broken.tar: not a tar archive or image directory*"])


@needs_glibc
@pytest.mark.parametrize("rpm", [True, False], ids=["rpm-database", "none"])
def test_an_rpm_database_is_said_to_be_unread(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], rpm: bool
) -> None:
    layers = [_base(parts), [Entry("var/lib/rpm/rpmdb.sqlite", data=b"SQLite format 3\x00")] if rpm else []]
    _rc, payload = _check(tmp_path, capsys, layers, "--cuda-driver=550.54.15")
    infos = [f["subject"] for f in _findings(payload, "container") if "rpm" in f["message"]]
    assert infos == (["/var/lib/rpm"] if rpm else [])


@needs_glibc
@pytest.mark.parametrize(
    ("caps", "errors"),
    [("utility", 1), ("compute,utility", 0), ("all", 0), (None, 0), ("", 0)],
    ids=["utility-only", "compute", "all", "unset-default", "empty-default"],
)
def test_driver_capabilities_without_compute(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], caps: str | None, errors: int
) -> None:
    env = [*ENV, f"NVIDIA_DRIVER_CAPABILITIES={caps}"] if caps is not None else ENV
    layers = [_base(parts), [Entry("opt/app/bin/train", data=parts.train12)]]
    _rc, payload = _check(tmp_path, capsys, layers, "--cuda-driver=550.54.15", env=env)
    found = [f for f in _findings(payload, "container") if f["subject"] == "NVIDIA_DRIVER_CAPABILITIES"]
    assert [f["severity"] for f in found] == ["error"] * errors
    if errors:
        assert found[0]["remedies"][0] == {
            "kind": "env",
            "variable": "NVIDIA_DRIVER_CAPABILITIES",
            "value": "compute,utility",
            "why": "mount libcuda",
        }


@needs_glibc
def test_unchanged_files_keep_their_elf_facts_across_a_top_layer_change(parts: Parts, tmp_path: Path) -> None:
    from pytest_cudastack.settings import Settings
    from pytest_cudastack.stack import Stack

    app = [Entry("opt/app/bin/train", data=parts.train12)]
    v1 = build_image(tmp_path / "v1", [_base(parts), app], env=ENV)
    v2 = build_image(tmp_path / "v2", [_base(parts), [*app, Entry("opt/app/VERSION", data=b"2")]], env=ENV)
    first = Stack(Settings(cudastack_image=str(v1)))
    assert first.tree("/opt/app/bin/train").missing == ()
    first.flush_cache()
    second = Stack(Settings(cudastack_image=str(v2)))
    tree = second.tree("/opt/app/bin/train")
    assert second.image is not None
    assert first.image is not None
    assert second.image.root != first.image.root
    assert tree.missing == ()
    # the lower layer's libraries are hard links to the same inodes: read from the cache; the top layer's
    # binary is a new file
    assert second.cache.misses == 1
    assert second.cache.hits >= 2


@pytest.mark.parametrize("listed", [True, False], ids=["dpkg-lists-it-as-/bin", "clean-twin-unlisted"])
def test_merged_usr_image_skips_the_binaries_dpkg_lists_under_bin(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], listed: bool
) -> None:
    """Debian bookworm is merged-/usr: /bin is a link to usr/bin, and dpkg's lists keep the .deb's path
    (/bin/tool) for the file at /usr/bin/tool. A listed binary is the distribution's and not scanned; one no
    .deb lists is scanned (found by the real tier: every coreutils program was scanned)."""
    tool = Entry("usr/bin/tool", data=parts.train12, mode=0o755)
    merged = [Entry("bin", "symlink", target="usr/bin"), tool]
    dpkg = [Entry("var/lib/dpkg/info/tooling.list", data=b"/.\n/bin\n/bin/tool\n" if listed else b"/.\n")]
    env = ["PATH=/usr/bin:/bin"]
    _rc, payload = _check(tmp_path, capsys, [_base(parts), merged + dpkg], env=env)
    assert ("scan[/usr/bin/tool]" in payload["items"]) is not listed


@needs_glibc
@pytest.mark.parametrize(
    ("listed", "fix", "detail"),
    [
        (b"/usr/local/cuda/lib64/libcublas.so.13\n", "apt-get install --reinstall libcublas13-x", None),
        (b"/usr/local/cuda/lib64/libcublas.so.12\n", "install the package that provides libcublas.so.13", "ships"),
        (b"/usr/lib/libother.so.1\n", "install the package that provides libcublas.so.13", None),
    ],
    ids=["deb-installed-it-file-gone", "deb-ships-another-major", "no-deb-of-the-family"],
)
def test_missing_soname_names_the_deb_from_the_image_s_dpkg_lists(
    parts: Parts,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listed: bytes,
    fix: str,
    detail: str | None,
) -> None:
    """dpkg's lists say which .deb put a soname in the image: one whose file is gone (a later layer deleted
    it) is reinstalled; for a soname no .deb lists, the package shipping another version of its family is
    named as what the image has instead."""
    dpkg = [Entry("var/lib/dpkg/info/libcublas13-x.list", data=b"/.\n" + listed)]
    layers = [_base(parts), [Entry("opt/app/bin/train", data=parts.train13), *dpkg]]
    _rc, payload = _check(tmp_path, capsys, layers)
    (finding,) = _findings(payload, "scan[/opt/app/bin/train]")
    assert finding["fix"].startswith(fix)
    notes = [d for d in finding["details"] if "ships" in d]
    assert notes == (["dpkg's libcublas13-x ships libcublas.so.12 (another version)"] if detail else [])


@needs_glibc
@pytest.mark.parametrize("replaced", [True, False], ids=["later-layer-replaced-it", "clean-twin"])
def test_library_whose_bytes_are_not_the_deb_s(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], replaced: bool
) -> None:
    """A library the program loads that dpkg installed, overwritten by a later layer: its md5 is not the one
    dpkg's md5sums record (a WARNING naming the package to reinstall); untouched, nothing."""
    import hashlib

    original = parts.cublas12.read_bytes()
    md5 = hashlib.md5(original, usedforsecurity=False).hexdigest()
    dpkg = [
        Entry("var/lib/dpkg/info/libcublas12-x.list", data=b"/.\n/usr/local/cuda/lib64/libcublas.so.12\n"),
        Entry(
            "var/lib/dpkg/info/libcublas12-x.md5sums", data=f"{md5}  usr/local/cuda/lib64/libcublas.so.12\n".encode()
        ),
    ]
    top = [Entry("opt/app/bin/train", data=parts.train12)]
    if replaced:
        top.append(Entry("usr/local/cuda/lib64/libcublas.so.12", data=original + b"\0patched"))
    _rc, payload = _check(tmp_path, capsys, [_base(parts), dpkg, top])
    found = _findings(payload, "scan[/opt/app/bin/train]")
    if not replaced:
        assert found == []
        return
    (finding,) = found
    assert finding["severity"] == "warning"
    assert finding["facts"]["required"] == md5
    assert finding["fix"].startswith("apt-get install --reinstall libcublas12-x")


def _pth_image_layers(parts: Parts, tmp_path: Path, line: str, *, in_image: bool) -> list[list[Entry]]:
    """An image whose Python's site directory has a ``.pth`` naming ``line``; a distribution whose module
    needs libcublas.so.13 lies at /opt/extra in the image (``in_image``) or at ``tmp_path``/hostonly on the
    host only."""
    from tests.helpers.sitebuild import compile_so, write_dist

    extra = tmp_path / ("extra" if in_image else "hostonly")
    extra.mkdir()
    module = compile_so(None, needed=["libcublas.so.13"], pyinit="_core")
    write_dist(
        extra, "fastops", "1.0", {"fastops/__init__.py": "from fastops import _core\n", "fastops/_core.so": module}
    )
    site = "usr/local/lib/python3.11/site-packages"
    python = [
        Entry("usr/local/bin/python3.11", data=parts.train12),
        Entry("usr/local/bin/python3", "symlink", target="python3.11"),
        Entry(f"{site}/extra.pth", data=f"# added by the build\nimport sys\n{line}\n".encode()),
        *(_tree_entries(extra, "opt/extra") if in_image else []),
    ]
    return [_base(parts), python]


@needs_glibc
@pytest.mark.parametrize(
    ("line", "in_image", "found"),
    [
        ("/opt/extra", True, True),
        ("../../../../../opt/extra", True, True),
        ("{host}", False, False),
        ("../../../../../../../../../..{host}", False, False),
    ],
    ids=["absolute-image-path", "relative-line", "clean-twin-host-only-path", "clean-twin-dotdot-to-host"],
)
def test_pth_lines_name_image_paths(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, in_image: bool, found: bool
) -> None:
    """A ``.pth`` in the image's site directory adds the image's directory it names (absolute, or relative to
    the site directory), never the host's: a line naming a path that exists only on the host adds nothing,
    and ``..`` stops at the image's ``/``."""
    line = line.format(host=tmp_path / "hostonly")
    layers = _pth_image_layers(parts, tmp_path, line, in_image=in_image)
    (tmp_path / "use.py").write_text("import fastops\n")
    env = ["PATH=/usr/local/bin:/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]
    rc, payload = _check(tmp_path, capsys, layers, "--cuda-driver=550.54.15", "--cuda-arch=sm_90", env=env)
    text = json.dumps(payload)
    assert str(tmp_path / "hostonly") not in text
    missing = [f for f in _findings(payload, "closure") if "libcublas.so.13" in json.dumps(f)]
    from pytest_cudastack.image.pythons import image_site_dirs
    from pytest_cudastack.image.rootfs import open_image
    from pytest_cudastack.wheels.inventory import installed_wheels

    image = open_image(str(tmp_path / "img.tar"))
    inv = installed_wheels(image_site_dirs(image), dpkg_root=image.root, root=image.root)  # as the Stack reads it
    assert all(d.startswith(image.root + "/") for d in inv.site_dirs), inv.site_dirs
    if not found:
        assert missing == []
        assert "fastops" not in text
        assert inv.get("fastops") is None
        return
    assert inv.get("fastops") is not None
    assert rc == 1
    assert missing[0]["severity"] == "error"
    assert missing[0]["facts"]["objects"] == ["/opt/extra/fastops/_core.so"]


@needs_glibc
@pytest.mark.parametrize(
    "site",
    ["usr/lib/python3/dist-packages", "usr/local/lib/python3.11/dist-packages"],
    ids=["pip-over-python3-yaml", "clean-twin-pip-s-own-directory"],
)
def test_a_file_owned_by_a_deb_and_a_wheel_in_an_image(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], site: str
) -> None:
    """Debian's python3-yaml, then a layer that pip-installs PyYAML with ``--break-system-packages
    --ignore-installed`` into dpkg's dist-packages: the files both list are the wheel's bytes (a warning
    naming what breaks), named by image path and the pip step's layer, repaired by RUN steps of the build.
    pip's own directory (/usr/local) is the clean twin."""
    import hashlib

    from tests.helpers.sitebuild import write_dist

    deb_py = b"# python3-yaml 6.0\n"
    dist = "usr/lib/python3/dist-packages"
    debian = [
        Entry("usr/bin/python3.11", data=parts.train12),
        Entry("usr/bin/python3", "symlink", target="python3.11"),
        Entry("usr/lib/python3.11/os.py", data=b""),
        Entry(f"{dist}/yaml/__init__.py", data=deb_py),
        Entry(
            "var/lib/dpkg/info/python3-yaml.list",
            data=f"/.\n/{dist}\n/{dist}/yaml\n/{dist}/yaml/__init__.py\n".encode(),
        ),
        Entry(
            "var/lib/dpkg/info/python3-yaml.md5sums",
            data=f"{hashlib.md5(deb_py, usedforsecurity=False).hexdigest()}  {dist}/yaml/__init__.py\n".encode(),
        ),
    ]
    wheel = tmp_path / "wheel"
    write_dist(wheel, "PyYAML", "6.0.1", {"yaml/__init__.py": "# PyYAML 6.0.1\n"})
    pip = _tree_entries(wheel, site)
    env = ["PATH=/usr/local/bin:/usr/bin:/bin"]
    history = ("COPY base", "RUN apt-get install -y python3-yaml", "RUN pip install --break-system-packages PyYAML")
    _rc, payload = _check(tmp_path, capsys, [_base(parts), debian, pip], env=env, history=history)
    found = [f for f in _findings(payload, "integrity") if f["subject"] == "PyYAML / python3-yaml"]
    if site.startswith("usr/local"):
        assert found == []
        return
    (f,) = found
    assert f["severity"] == "warning"
    assert f["facts"]["objects"] == [f"/{dist}/yaml/__init__.py"]
    assert f["message"].endswith("the bytes on disk are PyYAML 6.0.1's")
    assert [p["created_by"] for p in f["provenance"]] == [history[2]]
    assert f["remedies"][0]["steps"][:2] == [
        "RUN pip uninstall -y PyYAML",
        "RUN apt-get update && apt-get install -y --reinstall python3-yaml",
    ]


@needs_glibc
@pytest.mark.parametrize("listed", [True, False], ids=["apk-lists-it", "clean-twin-unlisted"])
def test_alpine_image_skips_the_binaries_apk_installed(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], listed: bool
) -> None:
    """Alpine's apk database (/lib/apk/db/installed: P: a package, F: a directory, R: each of its files) owns
    the system's binaries as dpkg's lists do: a listed one is the distribution's and not scanned; one no
    package lists is the image's own and scanned."""
    files = "F:bin\nR:sh\nR:tool\na:0:0:755\nZ:Q1AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n" if listed else "F:bin\nR:sh\n"
    db = f"C:Q1x=\nP:busybox\nV:1.36.1-r2\nF:etc\nR:motd\n{files}\nC:Q1y=\nP:other\nV:1\nF:usr/bin\nR:x\n\n"
    alpine = [Entry("bin/tool", data=parts.train12, mode=0o755), Entry("lib/apk/db/installed", data=db.encode())]
    _rc, payload = _check(tmp_path, capsys, [_base(parts)[:4], alpine], env=["PATH=/bin"])
    assert ("scan[/bin/tool]" in payload["items"]) is not listed


def test_apk_installed_database_paths(tmp_path: Path) -> None:
    """The reader: a file is its F: directory joined with its R: name, its package the block's P:; a blank
    line ends a block (an R: after it, before any P:, names no package), malformed lines are skipped."""
    from pytest_cudastack.wheels.apk import file_packages

    db = tmp_path / "lib/apk/db/installed"
    db.parent.mkdir(parents=True)
    db.write_text(
        "P:musl\nV:1.2.4-r2\nF:lib\nR:ld-musl-x86_64.so.1\nR:libc.musl-x86_64.so.1\nF:usr/lib/\nR:libz.so.1\n"
        "junk line\nR:../escape\n\nR:orphan\nP:zlib\nF:usr/lib\nR:libz.so.1\n"
    )
    assert dict(file_packages(str(tmp_path))) == {
        "/lib/ld-musl-x86_64.so.1": "musl",
        "/lib/libc.musl-x86_64.so.1": "musl",
        "/usr/lib/libz.so.1": "musl",
    }
    assert dict(file_packages(str(tmp_path / "nothing"))) == {}


@needs_glibc
def test_an_image_names_its_own_paths_and_tritons_lookup_runs_inside_it(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """triton (a 3.x stand-in: its driver.py and knobs.py, its bundled ptxas) in an image without
    /sbin/ldconfig: its first compile fails (the runtime's injected libcuda.so.1 is in the cache, the program
    that lists it is not); every text and step of every finding names image paths, never the cache's root."""
    from tests.helpers.sitebuild import site_packages, write_dist
    from tests.helpers.tritonbuild import DRIVER_3X, KNOBS_3X

    site = site_packages(tmp_path / "prefix")
    ptxas = "#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.86'\n"
    files: dict[str, str | bytes] = {
        "triton/__init__.py": "",
        "triton/knobs.py": KNOBS_3X,
        "triton/backends/nvidia/driver.py": DRIVER_3X,
        "triton/backends/nvidia/compiler.py": "def get_ptxas(arch): ...\n",
        "triton/backends/nvidia/bin/ptxas": ptxas,
    }
    write_dist(site, "triton", "3.8.0", files)
    tools = "usr/local/lib/python3.11/site-packages/triton/backends/nvidia/bin/ptxas"
    python = [
        Entry("usr/local/bin/python3.11", data=parts.train12),
        Entry("usr/local/bin/python3", "symlink", target="python3.11"),
        *(e for e in _tree_entries(site, "usr/local/lib/python3.11/site-packages") if e.name != tools),
        Entry(tools, data=ptxas.encode(), mode=0o755),
    ]
    env = ["PATH=/usr/local/bin:/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]
    args = ("--cuda-driver=550.54.15", "--cuda-arch=sm_90")
    _rc, payload = _check(tmp_path, capsys, [_base(parts), python], *args, env=env, history=("COPY", "RUN pip"))
    toolchain = _findings(payload, "toolchain")
    lookup = [f for f in toolchain if f["message"].startswith("triton cannot find libcuda.so.1")]
    assert len(lookup) == 1
    assert "No such file or directory: '/sbin/ldconfig'" in lookup[0]["message"]
    assert any(
        "triton runs ptxas 12.9.86 (/usr/local/lib/python3.11/site-packages/triton" in f["message"] for f in toolchain
    )
    cache = str(tmp_path / "cache")
    for item in payload["items"].values():
        for f in item:
            shown = [f["message"], f["cause"], *f["details"], f["fix"], json.dumps(f["remedies"])]
            assert not [text for text in shown if cache in (text or "")], f["message"]
    # its clean twin: the image has ldconfig (Debian's libc-bin; merged /usr, /sbin a link inside the root)
    system = [Entry("usr/sbin/ldconfig", data=b"#!/bin/sh\n"), Entry("sbin", "symlink", target="usr/sbin")]
    _rc, payload = _check(
        tmp_path,
        capsys,
        [_base(parts), python, system],
        *args,
        env=env,
        history=("COPY", "RUN pip", "RUN apt"),
        name="twin",
    )
    assert not [f for f in _findings(payload, "toolchain") if f["message"].startswith("triton cannot find")]


@needs_glibc
def test_an_images_tools_are_found_by_its_own_environment_inside_it(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TRITON_PTXAS_PATH`` in the image's Env names an image path: triton runs that ptxas, and this
    machine's own ``TRITON_PTXAS_PATH`` (another ptxas) plays no part."""
    from tests.helpers.sitebuild import site_packages, write_dist

    def tool(version: str) -> bytes:
        major, minor = version.split(".")[:2]
        return f"#!/bin/sh\necho 'Cuda compilation tools, release {major}.{minor}, V{version}'\n".encode()

    host_tool = tmp_path / "host" / "ptxas"
    host_tool.parent.mkdir()
    host_tool.write_bytes(tool("12.8.93"))
    host_tool.chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(host_tool))
    site = site_packages(tmp_path / "prefix")
    write_dist(site, "triton", "3.8.0", {"triton/__init__.py": "", "triton/backends/nvidia/compiler.py": "ptxas\n"})
    python = [
        Entry("usr/local/bin/python3.11", data=parts.train12),
        Entry("usr/local/bin/python3", "symlink", target="python3.11"),
        *_tree_entries(site, "usr/local/lib/python3.11/site-packages"),
        Entry("opt/old/bin/ptxas", data=tool("12.2.140"), mode=0o755),
    ]
    env = ["PATH=/usr/local/bin:/usr/bin", "TRITON_PTXAS_PATH=/opt/old/bin/ptxas"]
    _rc, payload = _check(tmp_path, capsys, [_base(parts), python], "--cuda-driver=550.54.15", env=env)
    shown = [f["message"] for f in _findings(payload, "toolchain") if f["message"].startswith("triton runs")]
    assert shown == ["triton runs ptxas 12.2.140 (/opt/old/bin/ptxas, via $TRITON_PTXAS_PATH)"]


@needs_glibc
@pytest.mark.parametrize("skipped", [True, False], ids=["image-skips-the-check", "host-variable-plays-no-part"])
def test_a_frameworks_skip_variable_is_read_from_the_images_environment(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, skipped: bool
) -> None:
    """JAX's cuBLAS floor (jax-cuda12-plugin 0.4.30 over cuBLAS 12.0.2) is skipped where the image's Env sets
    JAX_SKIP_CUDA_CONSTRAINTS_CHECK; this machine's setting of it is not the image's."""
    from tests.helpers.sitebuild import site_packages, write_dist

    monkeypatch.setenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "0" if skipped else "1")
    site = site_packages(tmp_path / "prefix")
    write_dist(site, "jax-cuda12-plugin", "0.4.30", requires=["nvidia-cublas-cu12"])
    write_dist(site, "nvidia-cublas-cu12", "12.0.2.224")
    python = [
        Entry("usr/local/bin/python3.11", data=parts.train12),
        Entry("usr/local/bin/python3", "symlink", target="python3.11"),
        *_tree_entries(site, "usr/local/lib/python3.11/site-packages"),
    ]
    env = ["PATH=/usr/local/bin:/usr/bin", *(["JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1"] if skipped else [])]
    _rc, payload = _check(tmp_path, capsys, [_base(parts), python], "--cuda-driver=550.54.15", env=env)
    rules = [f for f in _findings(payload, "requirements") if f["subject"] == "jax-cuda12-plugin cuBLAS"]
    failing = [f for f in rules if f["severity"] in ("error", "warning")]
    if skipped:
        assert not failing
        said = [f["cause"] for f in _findings(payload, "requirements")]
        assert any("skips its check (JAX_SKIP_CUDA_CONSTRAINTS_CHECK is set)" in cause for cause in said)
    else:
        assert failing
        assert "Outdated cuBLAS installation found" in failing[0]["message"]


@needs_glibc
def test_a_plain_layers_large_files_are_judged_in_place_and_a_layer_changed_since_is_read_again(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An uncompressed layer's large files (glibc here; torch's libraries in a real image) are not copied out:
    every item reads them where they lie in the layer, with the verdicts of the gzip twin, whose files are
    copies. A layer file that changes after (an archive saved again over it) is never read as the old one."""
    needs_user_xattrs(tmp_path)
    big = tmp_path / "train"  # the program too: found on PATH by its first bytes, read where it lies
    big.write_bytes(parts.train13.read_bytes() + b"\1" * (300 << 10))
    big.chmod(0o755)
    layers = [_base(parts), [Entry("opt/app/bin/train", data=big, mode=0o755)]]
    verdicts = {}
    for name, gz in (("gz", True), ("plain", False)):
        build_image(tmp_path / name, layers, env=ENV, gzip_layers=gz)
        rc = main(["image", str(tmp_path / name), "--json", "--cuda-driver=550.54.15"])
        verdicts[name] = (rc, _errors(json.loads(capsys.readouterr().out)))
    assert verdicts["plain"] == verdicts["gz"]
    assert verdicts["gz"] == (1, [("driver", "/opt/app/bin/train"), ("scan[/opt/app/bin/train]", "/opt/app/bin/train")])
    libc = Path(open_image(str(tmp_path / "plain")).root) / "usr/lib/x86_64-linux-gnu/libc.so.6"
    assert is_placeholder(libc)  # read by every item, filled by none
    assert not is_placeholder(Path(open_image(str(tmp_path / "gz")).root) / "usr/lib/x86_64-linux-gnu/libc.so.6")
    assert read_root_file(str(libc)) == LIBC.resolve().read_bytes()

    blob = max(blob_files(tmp_path / "plain"), key=lambda p: p.stat().st_size)
    st = blob.stat()
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    root = open_image(str(tmp_path / "plain")).root  # the root is built again from the layer as it is now
    assert read_root_file(os.path.join(root, "usr/lib/x86_64-linux-gnu/libc.so.6")) == LIBC.resolve().read_bytes()
    rc = main(["image", str(tmp_path / "plain"), "--json", "--cuda-driver=550.54.15"])
    assert (rc, _errors(json.loads(capsys.readouterr().out))) == verdicts["gz"]


@needs_glibc
def test_a_findings_facts_name_image_paths_never_the_caches(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A library the image installs out of its caller's reach (its dlopen'ed plugin in another wheel's
    directory): the finding's facts, the copies and their versions included, name image paths."""
    from tests.helpers.sitebuild import compile_so, site_packages, write_dist

    site = site_packages(tmp_path / "prefix")
    ext = "_C.cpython-311-x86_64-linux-gnu.so"
    helper = compile_so("libhelper.so.1", runpath="$ORIGIN", payload="libfoo_plugin.so.2")
    module = compile_so(None, pyinit="_C", needed=["libhelper.so.1"], rpath="$ORIGIN")
    write_dist(site, "pkg", "1.0", {f"pkg/{ext}": module, "pkg/libhelper.so.1": helper})
    write_dist(site, "fooplug", "2.3", {"fooplug/lib/libfoo_plugin.so.2": compile_so("libfoo_plugin.so.2")})
    python = [
        Entry("usr/local/bin/python3.11", data=parts.train12),
        Entry("usr/local/bin/python3", "symlink", target="python3.11"),
        *_tree_entries(site, "usr/local/lib/python3.11/site-packages"),
    ]
    env = ["PATH=/usr/local/bin:/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]
    _rc, payload = _check(tmp_path, capsys, [_base(parts), python], "--cuda-driver=550.54.15", env=env)
    (found,) = [f for f in _findings(payload, "dlopen") if f["subject"] == "libfoo_plugin.so.2"]
    plugin = "/usr/local/lib/python3.11/site-packages/fooplug/lib/libfoo_plugin.so.2"
    assert found["facts"]["versions"] == [[plugin, "2.3"]]
    cache = str(tmp_path / "cache")
    assert not [f for item in payload["items"].values() for f in item if cache in json.dumps(f)]


# a library that looks driver entry points up at run time (dlsym), and one that asks cuGetProcAddress
_DLSYM_JIT = r"""
#include <dlfcn.h>
int start(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    return h && dlsym(h, "cuInit") && dlsym(h, "cuGreenCtxCreate") ? 0 : -1;
}
"""
_PROC_JIT = r"""
typedef int (*getproc_t)(const char *, void **, int, unsigned long long, void *);
int ask(getproc_t get, void **out) { return get("cuGreenCtxCreate", out, 12040, 0, 0); }
const char *via = "cuGetProcAddress_v2";
"""


@needs_glibc
def test_an_images_run_time_driver_lookups_are_judged_and_its_symbol_verdicts_outlive_a_top_layer_change(
    parts: Parts, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The symbols item judges the entry points an image's library looks up at run time against the declared
    driver, as it does on this machine (its lookups are read from the file under the image's root); the next
    image, whose top layer changed, recalls those verdicts (nothing they were computed from changed), and an
    image whose top layer replaces the library is judged again."""
    from tests.helpers.sitebuild import compile_so, site_packages, write_dist

    d = tmp_path / "elf"
    jit = build_lib(d / "dlsym" / "libjit.so.1", soname="libjit.so.1", source=_DLSYM_JIT)
    other = build_lib(d / "proc" / "libjit.so.1", soname="libjit.so.1", source=_PROC_JIT)
    app = build_exe(d / "app", needed=[jit])
    site = site_packages(tmp_path / "prefix")  # an extension module that loads it: judged in the import's scopes
    module = compile_so(None, needed=["libjit.so.1"], pyinit="_core")
    write_dist(site, "jitops", "1.0", {"jitops/__init__.py": "from jitops import _core\n", "jitops/_core.so": module})
    lower = [
        *_base(parts),
        Entry("usr/local/cuda/lib64/libjit.so.1", data=jit),
        Entry("opt/app/bin/app", data=app),
        Entry("usr/local/bin/python3.11", data=parts.train12),
        *_tree_entries(site, "usr/local/lib/python3.11/site-packages"),
    ]
    env = ["PATH=/opt/app/bin:/usr/local/bin:/usr/bin"]

    def lookups(top: list[Entry], name: str) -> list[dict[str, Any]]:
        _, payload = _check(
            tmp_path, capsys, [lower, top], "--cuda-driver=535.104.05", fmt="oci-layout", env=env, name=name
        )
        return [f for f in _findings(payload, "symbols") if f["subject"].endswith("libjit.so.1")]

    first = lookups([Entry("opt/app/VERSION", data=b"1")], "v1")
    assert {(f["severity"], "(dlsym)" in f["message"]) for f in first} == {("warning", True)}
    assert {f["subject"] for f in first} == {"/usr/local/cuda/lib64/libjit.so.1"}

    def recomputed(*args: object, **kwargs: object) -> object:
        raise AssertionError("the symbol verdicts were computed again")

    with monkeypatch.context() as m:
        m.setattr("pytest_cudastack.checks.symbols._check", recomputed)
        assert lookups([Entry("opt/app/VERSION", data=b"2")], "v2") == first
    replaced = lookups([Entry("usr/local/cuda/lib64/libjit.so.1", data=other)], "v3")
    assert {(f["severity"], "(cuGetProcAddress)" in f["message"]) for f in replaced} == {("info", True)}
