"""Nothing silently skipped (issue #14, Deliver 6): a scanned directory's FIFOs, sockets, devices, unreadable
files, dangling links and non-ELF files named like shared libraries are warnings of the directory's own
``scan[DIR]`` item, saying what each is and why it was not checked; ordinary non-library files stay quiet.
And output is capped per finding and per item."""

from __future__ import annotations

import os
import socket

import pytest

from pytest_cudastack.checks.scan import run, scan_targets, scan_walk, skipped_files
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Finding, Severity, manual
from pytest_cudastack.items import MAX_SHOWN, FindingsRepr, render_findings
from pytest_cudastack.settings import ENV, Settings
from pytest_cudastack.stack import Stack
from tests.helpers.elfbuild import synth_elf

pytest_plugins = ["pytester"]


@pytest.fixture
def scandir(tmp_path):
    d = tmp_path / "bin"
    (d / "sub").mkdir(parents=True)
    synth_elf(d / "app", needed=["libc.so.6"])
    synth_elf(d / "sub" / "libok.so.1", needed=["libc.so.6"])
    # quiet: not binaries
    (d / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (d / "README").write_text("docs\n")
    (d / "libc.so").write_text("/* GNU ld script\n   Use the shared library. */\nGROUP ( /lib/libc.so.6 )\n")
    (d / "gone.txt").symlink_to(tmp_path / "nowhere")
    # reported
    os.mkfifo(d / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock"))
    (d / "libnull.so.1").symlink_to("/dev/null")
    (d / "libfake.so.1").write_text("not an ELF\n")
    (d / "sub" / "libempty.so").write_bytes(b"")
    (d / "libgone.so.2").symlink_to(tmp_path / "nowhere")
    (d / "libloop.so").symlink_to(d / "libloop.so")
    yield d
    sock.close()


EXPECTED = {
    "bin/libfake.so.1": "not checked: not an ELF file (it starts with b'not an E') though named like a shared library",
    "bin/libgone.so.2": "not checked: a symbolic link to '{tmp}/nowhere', which does not exist",
    "bin/libloop.so": "not checked: cannot be examined: Too many levels of symbolic links",
    "bin/libnull.so.1": "not checked: a device: not read (a device can be endless, or change state when read)",
    "bin/pipe": "not checked: a FIFO: not opened (reading one waits until something writes to it)",
    "bin/sock": "not checked: a socket: not a file that can be read",
    "bin/sub/libempty.so": "not checked: an empty file named like a shared library",
}


def test_walk_targets_and_skips(scandir, tmp_path):
    targets, dirs = scan_walk(["bin"], str(tmp_path))
    assert targets == (("bin/app", str(scandir / "app")), ("bin/sub/libok.so.1", str(scandir / "sub" / "libok.so.1")))
    assert targets == scan_targets(["bin"], str(tmp_path))
    assert dirs == (("bin", str(scandir)),)
    found = run(_Stack(), ("bin", str(scandir)))
    assert {f.subject: f.message for f in found} == {k: v.format(tmp=tmp_path) for k, v in EXPECTED.items()}
    assert all(f.severity is Severity.WARNING and f.cause and f.fix for f in found)


def test_clean_directory_has_no_directory_item(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    synth_elf(d / "app")
    (d / "run.sh").write_text("#!/bin/sh\n")
    (d / "libc.so").write_text("/* GNU ld script */\nGROUP ( libc.so.6 )\n")
    assert scan_walk(["bin"], str(tmp_path))[1] == ()
    assert skipped_files(str(d)) == ()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_unreadable_file_is_reported(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    (d / "secret").write_bytes(b"\x7fELF")
    (d / "secret").chmod(0)
    assert skipped_files(str(d)) == ((str(d / "secret"), "cannot be read: cannot open: Permission denied"),)


def test_file_that_cannot_be_opened_is_reported(tmp_path, monkeypatch):
    """As root a mode-000 file is readable: the open failing is simulated (EACCES, as for another user)."""
    from pytest_cudastack.checks import scan

    d = tmp_path / "bin"
    d.mkdir()
    (d / "secret").write_bytes(b"\x7fELF")
    real = scan.open_span

    def refuse(path: str):  # type: ignore[no-untyped-def]
        if path.endswith("secret"):
            raise ElfError(f"{path}: cannot open: Permission denied")
        return real(path)

    monkeypatch.setattr(scan, "open_span", refuse)
    assert skipped_files(str(d)) == ((str(d / "secret"), "cannot be read: cannot open: Permission denied"),)


def test_snapshot_and_other_checks_see_only_binaries(scandir, tmp_path):
    stack = Stack(
        Settings(cudastack_scan=("bin",), cudastack=True, cuda_driver="580.65.06"),
        rootdir=str(tmp_path),
        site_paths=(str(tmp_path / "none"),),
    )
    results = stack.run_checks()
    assert sorted(k for k in results if k.startswith("scan[")) == [
        "scan[bin/app]",
        "scan[bin/sub/libok.so.1]",
        "scan[bin]",
    ]
    assert {f.subject for f in results["scan[bin]"]} == set(EXPECTED)
    assert [b["path"] for b in stack.to_json()["binaries"]] == ["bin/app", "bin/sub/libok.so.1"]
    others = [f for k, v in results.items() if not k.startswith("scan[") for f in v]
    assert not any(str(scandir) == f.subject or f.subject == "bin" for f in others)


def test_pytest_shows_the_warnings_and_passes(scandir, tmp_path, pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    result = pytester.runpytest(
        "-p", "pytest_cudastack.plugin", f"--cudastack-scan={scandir}", "--cuda-driver=580.65.06", "-rA"
    )
    assert result.ret == 0
    out = result.stdout.str()
    assert "warning: " in out
    assert "pipe: not checked: a FIFO" in out
    assert "libfake.so.1: not checked: not an ELF file" in out
    assert "run.sh" not in out
    assert "README" not in out


# -- output caps --------------------------------------------------------------------------------------


def _big(i: int) -> Finding:
    return Finding(
        "scan",
        Severity.ERROR,
        "bin/app",
        f"needs libmissing{i}.so.1, which the dynamic linker does not find" + "x" * 100_000,
        cause="no directory searched holds it",
        where=tuple(f"/opt/rpath/dir{j:05d}" for j in range(4096)),
        chain=tuple(f"/lib/l{j}.so" for j in range(1000)),
        details=tuple(f"detail {j}" for j in range(10_000)),
        remedies=manual("rebuild"),
    )


def test_one_finding_is_capped():
    f = _big(0)
    text = f.render()
    assert len(text) < 12_000
    assert "looked in 4096 places: /opt/rpath/dir00000, " in text
    assert "... (--json for all)" in text
    assert "... 9950 more (--json)" in text
    assert "... 980 more ..." in text
    assert "... (98062 more characters)" in text  # the message's 100,062 characters, cut at 2,000
    assert len(f.to_json()["where"]) == 4096  # --json keeps everything


def test_an_item_of_a_thousand_findings_is_capped():
    findings = tuple(_big(i) for i in range(1000))
    text = render_findings(findings)
    assert len(text) < 1_500_000  # was 388 MB for 1,000 DT_NEEDED x 10,000 RPATH entries
    assert text.endswith(f"... {1000 - MAX_SHOWN} more findings (cudastack check --json lists them all)")
    lines = list(FindingsRepr(findings, compact=False).lines())
    assert lines[-1] == (f"... {1000 - MAX_SHOWN} more findings (cudastack check --json lists them all)", True)
    assert sum(headline for _, headline in lines) == MAX_SHOWN + 1


class _Stack:
    """run() of a directory target reads nothing from the stack."""


# -- long search lists ---------------------------------------------------------------------------------


def test_long_search_list_dedupes_in_order():
    from pytest_cudastack.linker.resolver import Resolver, SearchConfig

    elements = [f"/d{i % 50_000}/" for i in range(100_000)] + ["", "", "/d7"]
    cfg = SearchConfig.from_environment({"LD_LIBRARY_PATH": ":".join(elements)})
    dirs = Resolver(cfg)._dirlist(cfg.ld_library_path, None)
    assert dirs == [f"/d{i}" for i in range(50_000)] + [""]


def test_searched_with_a_shared_memo_equals_searched(tmp_path):
    from pytest_cudastack.linker.resolver import Library, Route

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    tried = (f"{tmp_path}/a/libx.so", f"{tmp_path}/gone/libx.so", f"{tmp_path}/b/../a/libx.so", f"{tmp_path}/b/libx.so")
    lib = Library("libx.so", None, None, next(iter(Route)), "", tried, ())
    memo: dict[str, str | None] = {}
    assert lib.searched_in(memo) == lib.searched == (f"{tmp_path}/a", f"{tmp_path}/b")
    assert lib.searched_in(memo) == lib.searched  # a second library of the tree reads the memo
    assert memo[f"{tmp_path}/gone"] is None
