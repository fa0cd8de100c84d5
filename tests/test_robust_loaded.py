"""``cudastack loaded``'s child is isolated (issue #14, Deliver 5): ``-I``, stdin closed, a timeout that is
an error, a report on a private pipe that nothing the module prints can forge, size-capped, and output in
any encoding that never breaks the parent. Every test runs a real child process."""

from __future__ import annotations

import argparse
import json
import os
import sys

import pytest

from pytest_cudastack.cli import loaded
from pytest_cudastack.cli.loaded import cmd_loaded, loaded_libraries

MARKER_CODE = "import pathlib, sys\npathlib.Path({marker!r}).write_text('ran')\n"


@pytest.fixture
def hostile_cwd(tmp_path, monkeypatch):
    """A current directory whose json.py and importlib.py would leave a marker file when imported."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name in ("json", "importlib", "site_cudastack_mod"):
        (cwd / f"{name}.py").write_text(MARKER_CODE.format(marker=str(tmp_path / f"ran-{name}")))
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    return tmp_path


def test_cwd_json_and_importlib_neither_run_nor_shadow(hostile_cwd):
    libs, error = loaded_libraries("_ctypes")
    assert error is None
    assert any(lib.soname and lib.soname.startswith("libffi.so") for lib in libs)
    assert sorted(p.name for p in hostile_cwd.iterdir()) == ["cwd"]  # no marker: nothing from cwd ran


def test_cwd_module_is_not_importable(hostile_cwd):
    _libs, error = loaded_libraries("site_cudastack_mod")
    assert error is not None
    assert "ModuleNotFoundError" in error
    assert not (hostile_cwd / "ran-site_cudastack_mod").exists()


def test_site_packages_module_still_importable(hostile_cwd):
    # pytest_cudastack is installed (editable) in this interpreter's site-packages: -I still reads .pth files
    _libs, error = loaded_libraries("pytest_cudastack.linker.elf")
    assert error is None
    assert sorted(p.name for p in hostile_cwd.iterdir()) == ["cwd"]


def test_pythonpath_adds_modules_after_the_stdlib(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "myproj_cudastack.py").write_text("import json, _ctypes\nassert json.dumps is not None\n")
    (proj / "json.py").write_text(MARKER_CODE.format(marker=str(tmp_path / "ran-json")))
    monkeypatch.setenv("PYTHONPATH", str(proj))
    libs, error = loaded_libraries("myproj_cudastack")
    assert error is None
    assert libs
    assert not (tmp_path / "ran-json").exists()  # PYTHONPATH's json.py does not shadow the stdlib's


def test_stdin_is_closed(tmp_path, monkeypatch):
    (tmp_path / "reads_stdin_cudastack.py").write_text("import sys\nDATA = sys.stdin.read()\nassert DATA == ''\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    _libs, error = loaded_libraries("reads_stdin_cudastack", timeout=120)
    assert error is None


def test_timeout_is_an_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    (tmp_path / "sleeps_cudastack.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    libs, error = loaded_libraries("sleeps_cudastack", timeout=1)
    assert libs == ()
    assert error == "the import did not finish within 1 s (the child process was killed)"


def test_timeout_kills_what_the_module_started(tmp_path, monkeypatch):
    pidfile = tmp_path / "grandchild.pid"
    (tmp_path / "forks_cudastack.py").write_text(
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    _libs, error = loaded_libraries("forks_cudastack", timeout=3)
    assert error is not None
    assert "did not finish" in error
    pid = int(pidfile.read_text())
    # killed with the child's process group; reaped by init, so it is gone or a zombie
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z", "X")


def test_forged_marker_lines_are_ignored(tmp_path, monkeypatch):
    forged = 'cudastack-loaded:{"paths": ["/forged/libevil.so"], "error": null}'
    (tmp_path / "forger_cudastack.py").write_text(
        f"import os, sys, _ctypes\nprint({forged!r})\nprint({forged!r}, file=sys.stderr)\n"
    )
    (tmp_path / "forger_exits_cudastack.py").write_text(
        f"import os, sys\nprint({forged!r}, flush=True)\nos._exit(0)\n"  # before the child's own report
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    libs, error = loaded_libraries("forger_cudastack")
    assert error is None
    assert libs
    assert all(lib.path != "/forged/libevil.so" for lib in libs)
    libs, error = loaded_libraries("forger_exits_cudastack")
    assert libs == ()
    assert error == "the child process failed: exit status 0"


def test_module_printing_megabytes_is_discarded(tmp_path, monkeypatch):
    (tmp_path / "loud_cudastack.py").write_text(
        "import sys, _ctypes\nsys.stdout.write('x' * (32 << 20))\nsys.stderr.write('y' * (32 << 20))\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    libs, error = loaded_libraries("loud_cudastack")
    assert error is None
    assert libs


def test_non_utf8_output_and_paths_never_crash_the_parent(tmp_path, monkeypatch, capsys):
    lib = os.path.join(os.fsencode(str(tmp_path)), b"lib\xff\xfe.so")
    with open(lib, "wb") as f:
        f.write(b"\x7fELF" + b"\0" * 4092)
    (tmp_path / "mangled_cudastack.py").write_text(
        "import mmap, os, sys\n"
        f"fd = os.open({lib!r}, os.O_RDONLY)\n"
        "sys.cudastack_keep = mmap.mmap(fd, 4096, prot=mmap.PROT_READ)  # outlives the failed import\n"
        "os.write(1, b'\\xff\\xfe out\\n')\nos.write(2, b'\\xff\\xfe err\\n')\n"
        "raise ImportError('bad \\udcff\\x1b[31m bytes')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert cmd_loaded(argparse.Namespace(module="mangled_cudastack", json=False)) == 1
    out, err = capsys.readouterr()
    assert "lib\\xff\\xfe.so" in out  # the undecodable name, shown as the bytes it holds
    assert "import failed: ImportError: bad \\xff\\x1b[31m bytes" in err  # no raw escape reaches the terminal
    assert cmd_loaded(argparse.Namespace(module="mangled_cudastack", json=True)) == 1
    data = json.loads(capsys.readouterr().out)
    assert any(p["path"].endswith(".so") and "\udcff" in p["path"] for p in data["libraries"])


def test_child_dying_without_a_report(tmp_path, monkeypatch):
    (tmp_path / "dies_cudastack.py").write_text("import os, sys\nos.write(2, b'dying \\xff\\n')\nos._exit(7)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    libs, error = loaded_libraries("dies_cudastack")
    assert libs == ()
    assert error == "the child process failed: dying \ufffd"


def test_report_over_the_cap_is_refused(monkeypatch):
    monkeypatch.setattr(loaded, "_REPORT_LIMIT", 16)
    libs, error = loaded_libraries("_ctypes")
    assert libs == ()
    assert error == "the child process wrote a report larger than 16 bytes"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xff\xfe", id="not ascii"),
        pytest.param(b"[" * 100_000, id="deep nesting"),
        pytest.param(b'{"paths": "/lib/libc.so.6", "error": null}', id="paths a string"),
        pytest.param(b'{"paths": [1], "error": null}', id="path a number"),
        pytest.param(b'{"paths": ["relative.so"], "error": null}', id="relative path"),
        pytest.param(b'{"paths": [], "error": 3}', id="error a number"),
        pytest.param(b'{"paths": [], "error": null, "x": 1}', id="extra key"),
    ],
)
def test_malformed_reports_are_not_reports(raw):
    assert loaded.parse_report(raw) is None


def test_missing_interpreter_is_an_error():
    libs, error = loaded_libraries("json", python=os.path.join(sys.prefix, "no-such-python"))
    assert libs == ()
    assert error is not None
    assert error.startswith("cannot start ")
