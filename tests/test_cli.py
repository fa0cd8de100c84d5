from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.cli.diff import cmd_diff
from pytest_cudastack.cli.snapshot import cmd_snapshot
from tests.helpers.elfbuild import build_exe, build_lib, needs_cc
from tests.helpers.sitebuild import compile_so, write_dist


@pytest.fixture
def seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """bin/train_tft links libcublas.so.13, bin/train_ppo links libcudart.so.12; an empty site dir."""
    lib = tmp_path / "lib"
    cublas = build_lib(lib / "libcublas.so.13", soname="libcublas.so.13")
    cudart = build_lib(lib / "libcudart.so.12", soname="libcudart.so.12")
    build_exe(tmp_path / "bin" / "train_tft", needed=[cublas], runpath="$ORIGIN/../lib")
    build_exe(tmp_path / "bin" / "train_ppo", needed=[cudart], runpath="$ORIGIN/../lib")
    (tmp_path / "site").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


@needs_cc
def test_check_cuda_max_fails_on_the_cuda13_binary(seed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", "--site", "site", "--cuda-max=12.9", "--cudastack-scan=bin"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL cudastack::cuda-max" in out
    assert "bin/train_tft: links libcublas.so.13 (CUDA 13.x) but --cuda-max=12.9" in out
    assert "train_ppo" not in out.split("cudastack::cuda-max")[1].split("cudastack::scan")[0]
    assert "ok   cudastack::scan[bin/train_ppo]" in out


@needs_cc
def test_check_json_and_a_passing_bound(seed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", "--site", "site", "--cuda-max=13.0", "--cudastack-scan=bin", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert payload["ok"] is True
    assert set(payload["items"]) == {"cuda-max", "scan[bin/train_tft]", "scan[bin/train_ppo]"}


def test_check_bad_option_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--cuda-max=twelve"])
    assert exc.value.code == 2
    assert "--cuda-max" in capsys.readouterr().err


def test_check_with_no_item_option_runs_the_builtin_items(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    rc = main(["check", "--site", str(tmp_path), "--cuda-driver=580.65.06", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert list(payload["items"]) == ["integrity", "closure", "symbols", "driver", "arch"]


def test_report_on_an_empty_site(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--site", str(tmp_path)]) == 0
    assert "wheels:" in capsys.readouterr().out


@needs_cc
@pytest.mark.parametrize("flag", ["--no-cache", "--cudastack-no-cache"])
def test_check_no_cache_writes_no_cache(seed: Path, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", flag, "--site", "site", "--cudastack-scan=bin"]) == 0
    assert not (seed / "cache").exists()
    assert main(["check", "--site", "site", "--cudastack-scan=bin"]) == 0
    assert (seed / "cache").exists()


@needs_cc
@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--site", "site"],
        ["check", "--site", "site", "--cuda-driver=580.65.06"],
        ["snapshot", "--site", "site", "-o", "snap.json"],
        ["why", "--site", "site", "libcudastackcli.so.1"],
        ["tree", "site/cli/lib/libcudastackcli.so.1"],
        ["tree", "--json", "site/cli/lib/libcudastackcli.so.1"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_each_subcommand_flushes_its_one_cache(seed: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    write_dist(seed / "site", "cli-wheel", "1.0", {"cli/lib/libcudastackcli.so.1": compile_so("libcudastackcli.so.1")})
    main(argv)
    capsys.readouterr()
    entries = json.loads((seed / "cache" / "elfcache-v1.json").read_text())["entries"]
    assert str(seed / "site" / "cli" / "lib" / "libcudastackcli.so.1") in {os.path.abspath(p) for p in entries}


def test_tree_does_not_pay_for_the_check_options(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pytest_cudastack.cli import main\n"
        f"main(['tree', '--site', {str(tmp_path)!r}, '/bin/sh', '--json'])\n"
        "sys.stderr.write(str('pytest_cudastack.settings' in sys.modules))\n"
    )
    env = {**os.environ, "CUDASTACK_NO_CACHE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout)[0]["path"] == "/bin/sh"
    assert done.stderr == "False"


SUBCOMMANDS = ("report", "tree", "why", "loaded", "check", "snapshot", "diff")


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_each_subcommand_module_imports_alone(sub: str) -> None:
    """cli/<sub>.py holds cmd_<sub> and imports in a fresh interpreter without any other subcommand's module."""
    others = [f"pytest_cudastack.cli.{o}" for o in SUBCOMMANDS if o != sub]
    code = (
        "import importlib, sys\n"
        f"m = importlib.import_module('pytest_cudastack.cli.{sub}')\n"
        f"assert callable(m.cmd_{sub})\n"
        f"print([o for o in {others!r} if o in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_each_subcommand_has_help(sub: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([sub, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: cudastack {sub} ")


def test_check_help_lists_the_pytest_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert "--cuda-max" in capsys.readouterr().out


def test_help_imports_no_subcommand() -> None:
    code = (
        "import sys\nfrom pytest_cudastack.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print([s for s in {SUBCOMMANDS!r} if 'pytest_cudastack.cli.' + s in sys.modules], file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "usage: cudastack" in done.stdout
    assert done.stderr.strip() == "[]"


def test_python_dash_m_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_cudastack.cli", "why", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: cudastack why ")


def test_cmd_snapshot_and_diff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDASTACK_CUDA_DRIVER", "550.54.15")  # ignored by the command: it probes
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert cmd_snapshot(argparse.Namespace(output=str(a))) == 0
    b.write_text(a.read_text())
    assert cmd_diff(argparse.Namespace(a=str(a), b=str(b))) == 0
    data = json.loads(b.read_text())
    data["driver"]["version"] = "999.1"
    b.write_text(json.dumps(data))
    capsys.readouterr()
    assert cmd_diff(argparse.Namespace(a=str(a), b=str(b))) == 1
    assert "driver version:" in capsys.readouterr().out
    (tmp_path / "c.json").write_text("nope")
    assert cmd_diff(argparse.Namespace(a=str(a), b=str(tmp_path / "c.json"))) == 2
