"""Never executes (issue #14, Deliver 8): files a scan or an inspection reads are never run. A scanned
directory holds a script and an executable whose shared library's constructor creates a marker file (the
oracle below shows running them does); neither pytest (alone and with ``-n 2``) nor the CLI creates one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc

pytest_plugins = ["pytester"]

CTOR = """
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void) {{
    int fd = open("{marker}", O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}}
int fn_ctor(void) {{ return 42; }}
"""


@pytest.fixture
def armed(tmp_path):
    """bin/ with app (needs libctor.so.1, whose constructor leaves markers/lib), run.sh and libsh.so.1
    (scripts leaving markers/sh and markers/libsh); and proof that running them leaves the markers."""
    markers = tmp_path / "markers"
    markers.mkdir()
    bin_dir = tmp_path / "bin"
    lib = build_lib(bin_dir / "libctor.so.1", soname="libctor.so.1", source=CTOR.format(marker=markers / "lib"))
    app = build_exe(bin_dir / "app", needed=[lib], runpath="$ORIGIN")
    for name, marker in (("run.sh", "sh"), ("libsh.so.1", "libsh")):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\ntouch {markers / marker}\n")
        script.chmod(0o755)
    (bin_dir / "tool.py").write_text(f"open({str(markers / 'py')!r}, 'w').close()\n")
    # the oracle: these files do leave their markers when run
    subprocess.run([str(app)], check=True)
    subprocess.run([str(bin_dir / "run.sh")], check=True)
    subprocess.run([str(bin_dir / "libsh.so.1")], check=True)
    subprocess.run([sys.executable, str(bin_dir / "tool.py")], check=True)
    assert sorted(p.name for p in markers.iterdir()) == ["lib", "libsh", "py", "sh"]
    for p in markers.iterdir():
        p.unlink()
    return tmp_path


def _no_markers(root: Path) -> None:
    assert sorted(p.name for p in (root / "markers").iterdir()) == []


@needs_cc
@pytest.mark.parametrize(
    "xdist", [pytest.param([], id="pytest"), pytest.param(["-p", "xdist.plugin", "-n", "2"], id="xdist")]
)
def test_pytest_never_runs_what_it_scans(armed, pytester, monkeypatch, xdist):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(armed / "cache"))
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(
        "-p",
        "pytest_cudastack.plugin",
        *xdist,
        "--cudastack",
        f"--cudastack-scan={armed / 'bin'}",
        "--cuda-driver=580.65.06",
        f"--cudastack-snapshot={armed / 's.json'}",
    )
    out = result.stdout.str()
    assert result.ret in (0, 1)  # the run completed (a finding may fail an item); nothing crashed
    assert "INTERNALERROR" not in out
    assert "libsh.so.1: not checked: not an ELF file" in out  # read and reported, not run
    snapshot = json.loads((armed / "s.json").read_text())
    assert sorted(b["path"].rsplit("/", 1)[-1] for b in snapshot["binaries"]) == ["app", "libctor.so.1"]
    _no_markers(armed)


@needs_cc
def test_cli_never_runs_what_it_inspects(armed, monkeypatch, capsys):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(armed / "cache"))
    monkeypatch.chdir(armed)
    bin_dir = armed / "bin"
    site = ["--site", str(bin_dir), "--cuda-driver=580.65.06"]
    main(["check", *site, f"--cudastack-scan={bin_dir}"])
    main(["check", *site, f"--cudastack-scan={bin_dir}", "--json"])
    main(["tree", str(bin_dir / "app"), str(bin_dir / "libctor.so.1"), str(bin_dir / "run.sh")])
    main(["tree", "--json", str(bin_dir / "app"), str(bin_dir / "libsh.so.1")])
    main(["snapshot", *site, f"--cudastack-scan={bin_dir}", "-o", str(armed / "s.json")])
    main(["why", "libctor.so.1"])
    main(["report", "--site", str(bin_dir)])
    capsys.readouterr()
    _no_markers(armed)
    assert os.path.exists(armed / "s.json")
