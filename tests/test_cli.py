from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
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
    assert list(payload["items"]) == ["integrity", "closure", "driver", "arch"]


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
