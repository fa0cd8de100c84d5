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
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.wheels.inventory import installed_wheels
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
    assert text.startswith("ERROR [integrity] ")  # findings first
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
    inv = installed_wheels([str(site)], reader=read_elf)
    found = wheel_findings(inv, Resolver(SearchConfig.from_environment({}), reader=read_elf, owner=inv.owner))
    sev = [f.severity for f in found]
    assert sev == sorted(sev, key=[Severity.ERROR, Severity.WARNING, Severity.INFO].index)
    assert {f.check for f in found} >= {"integrity", "inventory"}


def test_wheel_report_object(tmp_path):
    rep = wheel_report([str(clean_site(tmp_path))])
    assert rep.failing == ()
    assert rep.modules == 1
    assert rep.to_json()["ok"] is True
