"""Shared caches under concurrency (issue #14, Deliver 8): two runs and xdist workers sharing one cache
directory, a cache file truncated mid-write (or a writer's temporary file left behind) and a read-only
cache directory give the same answers as a run without a cache, every time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.cli import main
from pytest_cudastack.linker.elfcache import CACHE_FILE
from pytest_cudastack.settings import ENV
from tests.helpers.elfbuild import synth_elf

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def scene(tmp_path):
    """bin/ with a binary that resolves (its library in lib/) and one that needs a missing library."""
    lib = tmp_path / "lib"
    lib.mkdir()
    synth_elf(lib / "libdep.so.1", soname="libdep.so.1", needed=[])
    (tmp_path / "bin").mkdir()
    synth_elf(tmp_path / "bin" / "ok", soname=None, needed=["libdep.so.1"], rpath=str(lib))
    synth_elf(tmp_path / "bin" / "broken", soname=None, needed=["libdep.so.1", "libgone.so.3"], rpath=str(lib))
    for i in range(20):  # enough files that the cache is worth writing and a writer takes a moment
        synth_elf(tmp_path / "bin" / f"extra{i}", soname=None, needed=["libdep.so.1"], rpath=str(lib))
    (tmp_path / "none").mkdir()  # an empty site directory: no wheels
    return tmp_path


def _args(scene: Path) -> list[str]:
    return [
        "check",
        "--site",
        str(scene / "none"),
        "--cuda-driver=580.65.06",
        f"--cudastack-scan={scene / 'bin'}",
        "--json",
    ]


def _env(cache: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV.values()}
    env.pop("CUDASTACK_NO_CACHE", None)
    if cache is None:
        env["CUDASTACK_NO_CACHE"] = "1"
    else:
        env["CUDASTACK_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = str(REPO)
    return env


def _answer(stdout: str) -> dict[str, object]:
    doc = json.loads(stdout)
    return {"ok": doc["ok"], "items": doc["items"]}


def _run(scene: Path, cache: Path | None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest_cudastack.cli", *_args(scene)],
        env=_env(cache),
        cwd=scene,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, object], str]:
    out, err = proc.communicate()
    return proc.returncode, _answer(out), err


@pytest.fixture
def reference(scene):
    code, answer, _err = _finish(_run(scene, None))
    assert code == 1
    assert answer["ok"] is False
    assert any("libgone.so.3" in f["message"] for f in answer["items"]["scan[bin/broken]"])
    return answer


def test_two_runs_sharing_one_cache_dir(scene, reference):
    cache = scene / "cache"
    for _round in range(3):  # cold (both write), then warm (both read while the other replaces it)
        procs = [_run(scene, cache), _run(scene, cache)]
        for proc in procs:
            code, answer, err = _finish(proc)
            assert (code, answer) == (1, reference), err
            assert "Traceback" not in err
    assert (cache / CACHE_FILE).exists()
    assert not [p for p in os.listdir(cache) if p.endswith(".tmp")]  # every writer cleaned up


def test_xdist_workers_and_a_second_run_share_one_cache_dir(scene):
    cache = scene / "cache"
    (scene / "test_x.py").write_text("def test_x(): pass\n")
    env = _env(cache)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    args = [
        "-p",
        "pytest_cudastack.plugin",
        "--cudastack-scan=bin",
        "--cuda-driver=580.65.06",
        "-q",
        "-p",
        "no:cacheprovider",
    ]

    def pytest_run(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", *args, *extra], env=env, cwd=scene, stdout=subprocess.PIPE, text=True
        )

    alone = pytest_run()
    out_alone, _ = alone.communicate()
    summary = out_alone.strip().splitlines()[-1]
    assert "1 failed" in summary
    for _round in range(2):
        procs = [pytest_run("-p", "xdist.plugin", "-n", "2"), pytest_run()]
        for proc in procs:
            out, _ = proc.communicate()
            last = out.strip().splitlines()[-1]
            assert last.split(" in ")[0] == summary.split(" in ")[0], out
            assert "FAILED cudastack::scan[bin/broken]" in out


def _check_in_process(
    scene: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, object], str]:
    monkeypatch.chdir(scene)  # as the subprocesses run: display names relative to the scene
    code = main(_args(scene))
    captured = capsys.readouterr()
    return code, _answer(captured.out), captured.err


def test_cache_truncated_mid_write(scene, reference, monkeypatch, capsys):
    cache = scene / "cache"
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(cache))
    assert _check_in_process(scene, monkeypatch, capsys)[:2] == (1, reference)
    full = (cache / CACHE_FILE).read_bytes()
    assert len(full) > 1000
    cuts = sorted({0, 1, 2, 17, len(full) // 3, len(full) // 2, len(full) - 2, len(full) - 1})
    for cut in cuts:
        (cache / CACHE_FILE).write_bytes(full[:cut])
        os.chmod(cache / CACHE_FILE, 0o600)
        (cache / f".cudastack-{os.getpid()}-0123456789ab.tmp").write_bytes(full[: cut // 2])  # a writer killed
        code, answer, _err = _check_in_process(scene, monkeypatch, capsys)
        assert (code, answer) == (1, reference), f"truncated at {cut} of {len(full)} bytes"
        assert json.loads((cache / CACHE_FILE).read_text())  # rewritten whole by this run


def test_read_only_cache_dir(scene, reference, monkeypatch, capsys, tmp_path):
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    if os.geteuid() == 0:
        # root writes through mode bits: a directory that cannot be created stands in for one that is read-only
        cache = Path("/sys/fs/cudastack-cache")
        assert not cache.exists()
    else:
        cache = tmp_path / "ro-cache"
        monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(cache))
        assert _check_in_process(scene, monkeypatch, capsys)[:2] == (1, reference)  # a valid cache in it
        cache.chmod(0o555)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(cache))
    try:
        for _ in range(2):
            code, answer, err = _check_in_process(scene, monkeypatch, capsys)
            assert (code, answer) == (1, reference)
            assert "Traceback" not in err
    finally:
        if cache.exists() and os.geteuid() != 0:
            cache.chmod(0o700)
