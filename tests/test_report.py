from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.cli.report import cmd_report, wheel_findings, wheel_report
from pytest_cudastack.cli.sites import site_dirs_from
from pytest_cudastack.findings import Severity
from pytest_cudastack.stack import Stack
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDASTACK_SITE", raising=False)


def clean_site(tmp_path: Path) -> Path:
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "pkg",
        "1",
        {
            "pkg/_ext.cpython-311-x86_64-linux-gnu.so": compile_so(
                None, pyinit="_ext", needed=["libdep.so.1"], rpath="$ORIGIN/../nvidia/dep/lib"
            )
        },
        requires=["nvidia-dep-cu13==1.0"],
    )
    write_dist(site, "nvidia-dep-cu13", "1.0", {"nvidia/dep/lib/libdep.so.1": compile_so("libdep.so.1")})
    return site


def broken_site(tmp_path: Path) -> Path:
    site = clean_site(tmp_path)
    write_dist(site, "nvidia-dep-cu12", "0.9", {"nvidia/dep/lib/libdep.so.1": compile_so("libdep.so.1", payload="12")})
    return site


def ns(site: Path | None, **kw) -> argparse.Namespace:
    return argparse.Namespace(site=[str(site)] if site else None, json=False, **kw)


def test_site_dirs_from(monkeypatch, tmp_path):
    assert site_dirs_from(argparse.Namespace(site=["/a", "/b"])) == ("/a", "/b")
    assert site_dirs_from(argparse.Namespace()) is None
    monkeypatch.setenv("CUDASTACK_SITE", f"/x{':'}/y")
    assert site_dirs_from(argparse.Namespace()) == ("/x", "/y")
    assert site_dirs_from(None) == ("/x", "/y")


def test_report_clean(tmp_path):
    out = io.StringIO()
    assert cmd_report(ns(clean_site(tmp_path)), out) == 0
    text = out.getvalue()
    assert "wheels: 2 distributions" in text
    assert "1 extension modules resolved" in text
    assert text.rstrip().endswith("wheels: no findings")


def test_report_and_check_broken(tmp_path, capsys):
    site = broken_site(tmp_path)
    out = io.StringIO()
    assert cmd_report(ns(site), out) == 1
    text = out.getvalue()
    assert text.startswith("repair plan for ")  # the plan first, then the findings
    assert "\nERROR [integrity] " in text
    assert "nvidia-dep-cu12 0.9 and nvidia-dep-cu13 1.0 install the same" in text
    capsys.readouterr()
    assert main(["check", "--site", str(site)]) == 1
    text = capsys.readouterr().out
    assert "FAIL cudastack::integrity" in text
    assert "nvidia-dep-cu12 0.9 and nvidia-dep-cu13 1.0 install the same" in text


def test_json(tmp_path, monkeypatch, capsys):
    site = broken_site(tmp_path)
    monkeypatch.setenv("CUDASTACK_SITE", str(site))
    out = io.StringIO()
    assert cmd_report(argparse.Namespace(json=True), out) == 1
    data = json.loads(out.getvalue())
    assert data["ok"] is False
    assert data["site_dirs"] == [str(site)]
    assert {d["name"] for d in data["distributions"]} == {"pkg", "nvidia-dep-cu12", "nvidia-dep-cu13"}
    assert data["findings"][0]["severity"] == "error"
    capsys.readouterr()
    assert main(["check", "--json", "--cuda-driver=580.65.06"]) == 1  # the site from $CUDASTACK_SITE
    assert json.loads(capsys.readouterr().out)["ok"] is False
    assert main(["check", "--json", "--cuda-driver=580.65.06", "--site", str(clean_site(tmp_path / "c"))]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert not any(f["severity"] == "error" for found in items.values() for f in found)


def test_wheel_findings_errors_first(tmp_path):
    site = broken_site(tmp_path)
    write_dist(site, "broken-meta", "1", {"x.py": ""}, extra_rows=["a,b"])
    found = wheel_findings(Stack(site_paths=(str(site),)))
    sev = [f.severity for f in found]
    assert sev == sorted(sev, key=[Severity.ERROR, Severity.WARNING, Severity.INFO].index)
    assert {f.check for f in found} == {"integrity"}


def test_wheel_report_object(tmp_path):
    rep = wheel_report([str(clean_site(tmp_path))])
    assert rep.failing == ()
    assert rep.modules == 1
    assert rep.to_json()["ok"] is True


# -- GPU code: report, tree and the snapshot list the same SASS/PTX per library and distribution ------------
GK = {"sass": ["sm_80", "sm_90a"], "ptx": ["compute_80"]}


@pytest.fixture(scope="module")
def gpulib(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """``libgk.so`` built by nvcc: SASS sm_80 and sm_90a, PTX compute_80."""
    import shutil
    import subprocess

    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    tmp = tmp_path_factory.mktemp("gk")
    (tmp / "k.cu").write_text("__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    gencode = ["arch=compute_80,code=sm_80", "arch=compute_80,code=compute_80", "arch=compute_90a,code=sm_90a"]
    args = [a for g in gencode for a in ("-gencode", g)]
    out = tmp / "libgk.so"
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-Xlinker", "-soname=libgk.so", "-o", str(out)]
    subprocess.run([*cmd, str(tmp / "k.cu"), *args], check=True, capture_output=True)
    return out.read_bytes()


def _schema(name: str) -> dict:
    from importlib import resources

    return json.loads(resources.files("pytest_cudastack").joinpath(f"schemas/{name}.schema.json").read_text())


def _gpu_setup(tmp_path: Path, gpulib: bytes) -> tuple[Path, Path]:
    from tests.helpers.elfbuild import build_exe

    site = site_packages(tmp_path / "venv")
    write_dist(site, "nvidia-gk-cu12", "12.9.1", {"nvidia/gk/lib/libgk.so": gpulib})
    lib = site / "nvidia" / "gk" / "lib" / "libgk.so"
    exe = build_exe(tmp_path / "bin" / "app", needed=[lib], runpath=str(lib.parent))
    return site, exe


def test_tree_report_and_snapshot_list_the_same_gpu_code(gpulib: bytes, tmp_path: Path, capsys) -> None:
    import jsonschema

    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.linker.elfcache import ElfCache
    from pytest_cudastack.settings import Settings
    from pytest_cudastack.stack import Stack

    site, exe = _gpu_setup(tmp_path, gpulib)
    # tree --json: per library, null for none found, empty lists for a library without device code
    assert main(["tree", "--json", str(exe)]) == 0  # opt-in: a plain tree reads no GPU code
    assert all("gpu_code" not in x for x in json.loads(capsys.readouterr().out)["trees"][0]["libraries"])
    for _ in ("cold", "warm"):  # the warm run answers from the closure cache: the same GPU code
        assert main(["tree", "--json", "--gpu-code", str(exe)]) == 0
        doc = json.loads(capsys.readouterr().out)
        jsonschema.validate(doc, _schema("tree"))
        libs = {x["soname"]: x for x in doc["trees"][0]["libraries"]}
        assert libs["libgk.so"]["gpu_code"] == GK
        assert libs["libc.so.6"]["gpu_code"] == {"sass": [], "ptx": []}
    assert main(["tree", "--json", "--no-gpu-code", str(exe)]) == 0  # the plain rows are another bucket
    assert all("gpu_code" not in x for x in json.loads(capsys.readouterr().out)["trees"][0]["libraries"])
    # tree, text: after the library that carries device code
    for flags in ([], ["--no-gpu-code"]):  # the default is the closures alone
        assert main(["tree", *flags, str(exe)]) == 0
        assert "{SASS" not in capsys.readouterr().out
    assert main(["tree", "--gpu-code", str(exe)]) == 0
    text = capsys.readouterr().out
    (line,) = [x for x in text.splitlines() if "libgk.so =>" in x]
    assert line.endswith("(nvidia-gk-cu12 12.9.1) {SASS sm_80, sm_90a; PTX compute_80}")
    assert "{" not in next(x for x in text.splitlines() if "libc.so.6 =>" in x)
    # report: per distribution, JSON and text
    out = io.StringIO()
    cmd_report(argparse.Namespace(json=True, site=[str(site)]), out)
    (dist,) = [d for d in json.loads(out.getvalue())["distributions"] if d["name"] == "nvidia-gk-cu12"]
    assert dist["gpu_code"] == GK
    out = io.StringIO()
    cmd_report(argparse.Namespace(json=False, site=[str(site)]), out)
    assert "  nvidia-gk-cu12 12.9.1: SASS sm_80, sm_90a; PTX compute_80" in out.getvalue().splitlines()
    # snapshot: the CUDA wheel and the scanned binary's libraries
    stack = Stack(
        Settings(cudastack_scan=(str(exe),)),
        driver_info=DriverInfo("absent", None, None),
        site_paths=(str(site),),
        rootdir=str(tmp_path),
        cache=ElfCache(enabled=False),
    )
    snap = stack.to_json()
    jsonschema.validate(snap, _schema("snapshot"))
    assert snap["wheels"][0]["gpu_code"] == GK
    (binary,) = snap["binaries"]
    assert {x["soname"]: x["gpu_code"] for x in binary["libraries"]}["libgk.so"] == GK


def test_report_without_device_code_prints_no_gpu_section(tmp_path: Path) -> None:
    rep = wheel_report([str(clean_site(tmp_path))])
    from pytest_cudastack.cli.report import render_report

    assert "GPU code" not in render_report(rep)
    assert all(d["gpu_code"] == {"sass": [], "ptx": []} for d in rep.to_json()["distributions"])
