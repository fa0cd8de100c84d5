from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack import __version__
from pytest_cudastack.cli import build_parser, main
from pytest_cudastack.cli.colour import painter_for
from pytest_cudastack.cli.diff import cmd_diff
from pytest_cudastack.cli.snapshot import cmd_snapshot
from pytest_cudastack.settings import ENV
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
    assert list(payload["items"]) == [
        "integrity",
        "closure",
        "dlopen",
        "symbols",
        "driver",
        "arch",
        "requirements",
        "toolchain",
    ]
    # as the plugin's SKIPPED items: each with its reason, no findings of its own
    assert set(payload["skipped"]) == {"driver", "arch", "requirements", "toolchain"}  # an empty site
    assert payload["skipped"]["requirements"] == "no installed distribution states a requirement (Requires-Dist)"
    assert all(payload["items"][name] == [] for name in payload["skipped"])


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
    assert json.loads(done.stdout)["trees"][0]["path"] == "/bin/sh"
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
    monkeypatch.setenv("CUDASTACK_CUDA_DRIVER", "550.54.15")  # read as the plugin reads it
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert cmd_snapshot(argparse.Namespace(output=str(a))) == 0
    b.write_text(a.read_text())
    capsys.readouterr()
    assert cmd_diff(argparse.Namespace(a=str(a), b=str(b))) == 0
    assert capsys.readouterr().out == "no drift\n"
    data = json.loads(b.read_text())
    data["driver"]["version"] = "999.1"
    b.write_text(json.dumps(data))
    capsys.readouterr()
    assert cmd_diff(argparse.Namespace(a=str(a), b=str(b))) == 1
    assert "driver version:" in capsys.readouterr().out
    (tmp_path / "c.json").write_text("nope")
    assert cmd_diff(argparse.Namespace(a=str(a), b=str(tmp_path / "c.json"))) == 2


# --- the command is the plugin: same directory, same configuration, same verdict, same snapshot -----------


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project whose pyproject.toml sets cudastack_scan = ["bin"]; bin/train_tft links libcublas.so.13."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(pytester.path / "cache"))
    root = pytester.path
    cublas = build_lib(root / "lib" / "libcublas.so.13", soname="libcublas.so.13")
    build_exe(root / "bin" / "train_tft", needed=[cublas], runpath="$ORIGIN/../lib")
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\ncudastack_scan = ["bin"]\n')
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    return pytester


def _pytest(pt: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pt.runpytest("-p", "pytest_cudastack.plugin", "-p", "no:cacheprovider", *args)


@needs_cc
def test_check_reads_the_config_pytest_reads(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _pytest(project, "--cuda-max=12.9").ret == 1
    assert main(["check", "--cuda-max=12.9"]) == 1
    out = capsys.readouterr().out
    assert "FAIL cudastack::cuda-max" in out
    assert "bin/train_tft: links libcublas.so.13 (CUDA 13.x)" in out
    assert "ok   cudastack::scan[bin/train_tft]" in out
    # from a subdirectory: the same file, paths from its directory, names from pytest's rootdir
    (project.path / "tests").mkdir()
    monkeypatch.chdir(project.path / "tests")
    assert main(["check", "--cuda-max=12.9"]) == 1
    assert "ok   cudastack::scan[bin/train_tft]" in capsys.readouterr().out
    monkeypatch.chdir(project.path)
    # precedence: the command line and the environment over the file
    assert main(["check", "--cuda-max=13.0"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("CUDASTACK_CUDA_MAX", "13.0")
    assert main(["check", "--json"]) == 0
    assert "cuda-max" in json.loads(capsys.readouterr().out)["items"]
    assert main(["check", "--cuda-max=12.9"]) == 1


@needs_cc
def test_check_config_options(project: pytest.Pytester, capsys: pytest.CaptureFixture[str]) -> None:
    other = project.path / "other.ini"
    other.write_text("[pytest]\ncuda_max = 12.9\n")
    assert main(["check", "-c", str(other), "--json"]) == 0  # the file's own keys, not pyproject's scan
    assert list(json.loads(capsys.readouterr().out)["items"]) == ["cuda-max"]
    other.write_text("[pytest]\ncuda_max = 12.9\ncudastack_scan =\n    bin\n    lib\n")
    assert main(["check", "-c", str(other), "--json"]) == 1
    assert set(json.loads(capsys.readouterr().out)["items"]) == {
        "cuda-max",
        "scan[bin/train_tft]",
        "scan[lib/libcublas.so.13]",
    }
    assert main(["check", "-o", "cuda_max=12.9", "--json"]) == 1
    assert set(json.loads(capsys.readouterr().out)["items"]) == {"cuda-max", "scan[bin/train_tft]"}
    assert main(["check", "-c", str(project.path / "nope.ini")]) == 2
    assert "Config file" in capsys.readouterr().err
    assert main(["check", "--rootdir", str(project.path / "nope")]) == 2
    assert "--rootdir" in capsys.readouterr().err
    (project.path / "pyproject.toml").write_text('[tool.pytest.ini_options]\ncudastack = "maybe"\n')
    assert main(["check"]) == 2
    assert "--cudastack (from ini)" in capsys.readouterr().err


@needs_cc
def test_check_takes_addopts_as_pytest_does(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    project.makepyprojecttoml(
        '[tool.pytest.ini_options]\naddopts = "-ra --cuda-max=12.9 -p no:cacheprovider"\ncudastack_scan = ["bin"]\n'
    )
    assert _pytest(project).ret == 1
    capsys.readouterr()
    assert main(["check", "--json"]) == 1
    assert set(json.loads(capsys.readouterr().out)["items"]) == {"cuda-max", "scan[bin/train_tft]"}
    assert main(["check", "--cuda-max=13.0"]) == 0  # the command line after addopts: the last one wins
    capsys.readouterr()
    # PYTEST_ADDOPTS after the file's addopts; a scan path given on any command line hides the ini key
    monkeypatch.setenv("PYTEST_ADDOPTS", "--cudastack-scan=lib --cuda-max=13.0")
    assert main(["check", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["items"]) == {"cuda-max", "scan[lib/libcublas.so.13]"}
    assert _pytest(project).ret == 0
    monkeypatch.setenv("PYTEST_ADDOPTS", "--cuda-max=twelve")
    assert main(["check"]) == 2
    assert "--cuda-max" in capsys.readouterr().err


@needs_cc
def test_snapshot_from_pytest_and_from_the_command_are_the_same(
    project: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    _pytest(project, "--cudastack-snapshot=pytest.json")
    assert main(["snapshot", "-o", "cli.json"]) == 0
    a = json.loads((project.path / "pytest.json").read_text())
    b = json.loads((project.path / "cli.json").read_text())
    assert [x["path"] for x in b["binaries"]] == ["bin/train_tft"]
    assert b["binaries"] == a["binaries"]
    assert b["wheels"] == a["wheels"]
    capsys.readouterr()
    assert main(["diff", "pytest.json", "cli.json"]) == 0
    assert "binary" not in capsys.readouterr().out
    # --cudastack-snapshot on the command is -o, the plugin's spelling
    assert main(["snapshot", "--cudastack-snapshot=again.json"]) == 0
    assert json.loads((project.path / "again.json").read_text())["binaries"] == a["binaries"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"cudastack (pytest-cudastack) {__version__}"


def test_help_documents_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "exit status:\n  0  clean" in out
    assert "\n  1  findings" in out
    assert "\n  2  usage or environment error" in out


@needs_cc
@pytest.mark.parametrize(
    "argv",
    [
        ["tree", "--no-cache", "site/cli/lib/libcudastackcli.so.1"],
        ["tree", "--json", "--no-cache", "site/cli/lib/libcudastackcli.so.1"],
        ["why", "--no-cache", "--site", "site", "libcudastackcli.so.1"],
        ["report", "--no-cache", "--site", "site"],
        ["snapshot", "--no-cache", "--site", "site", "-o", "snap.json"],
        ["check", "--no-cache", "--site", "site"],
    ],
    ids=lambda argv: argv[0],
)
def test_no_cache_after_the_subcommand(
    seed: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CUDASTACK_NO_CACHE", raising=False)
    write_dist(seed / "site", "cli-wheel", "1.0", {"cli/lib/libcudastackcli.so.1": compile_so("libcudastackcli.so.1")})
    main(argv)
    os.environ.pop("CUDASTACK_NO_CACHE", None)  # cli sets it for the process (monkeypatch would restore it)
    capsys.readouterr()
    assert not (seed / "cache").exists()


def test_no_cache_before_the_subcommand_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDASTACK_NO_CACHE", raising=False)
    args = build_parser(check_options=False).parse_args(["--no-cache", "--color=yes", "tree", "x"])
    assert (args.no_cache, args.color) == (True, "yes")
    args = build_parser(check_options=False).parse_args(["tree", "--color=no", "x"])
    assert (args.no_cache, args.color) == (False, "no")


@needs_cc
@pytest.mark.parametrize(("color", "coloured"), [("yes", True), ("no", False), ("auto", False)])
def test_colour_only_when_asked_or_on_a_terminal(
    seed: Path, color: str, coloured: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["check", f"--color={color}", "--site", "site", "--cuda-max=12.9", "--cudastack-scan=bin"])
    out = capsys.readouterr().out
    assert ("\x1b[31mFAIL\x1b[0m" in out) is coloured
    assert ("\x1b[" in out) is coloured
    main([f"--color={color}", "why", "libcudastacknowhere.so.7"])
    assert ("\x1b[31mNOT FOUND\x1b[0m" in capsys.readouterr().out) is coloured


def test_colour_auto_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert painter_for("auto", Tty()).severity("error", "error") == "\x1b[31merror\x1b[0m"
    assert painter_for("auto", io.StringIO()).severity("error", "error") == "error"
    monkeypatch.setenv("NO_COLOR", "1")
    assert painter_for("auto", Tty()).severity("warning", "warning") == "warning"
    assert painter_for("yes", io.StringIO()).severity("warning", "warning") == "\x1b[33mwarning\x1b[0m"


def test_readme_documents_the_exit_status() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## The `cudastack` command")[1].split("\n## ")[0]
    assert "| exit status | meaning |" in section
    for code in ("0", "1", "2"):
        assert f"\n| {code} | " in section
