"""Output files (issue #14, Deliver 3): ``--cudastack-snapshot`` and ``cudastack snapshot -o`` are written
atomically without following a symbolic link; ``$GITHUB_STEP_SUMMARY`` is appended to (``O_APPEND``,
``O_NONBLOCK``, ``O_NOFOLLOW``, regular files only); a bad output path is a usage error naming the option or
variable, found before the run (pytest: exit 4; CLI: exit 2), never a traceback and never a hang."""

from __future__ import annotations

import errno
import os

import pytest

from pytest_cudastack._sysio import append_text, output_problem, write_atomic
from pytest_cudastack.cli import main
from pytest_cudastack.settings import ENV

pytest_plugins = ["pytester"]


@pytest.fixture
def pt(pytester, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cudastack-cache"))
    pytester.makepyfile("def test_x(): pass")
    return pytester


def run(pt, *args):
    # the declared driver keeps NVML out; its item (which --cuda-driver turns on) is not what these tests count
    return pt.runpytest(
        "-p", "pytest_cudastack.plugin", "--cuda-driver=550.54.15", "--deselect=cudastack::driver", *args
    )


def _usage_error(result, line):
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_snapshot_to_a_directory_fifo_or_under_a_file(pt):
    (pt.path / "adir").mkdir()
    os.mkfifo(pt.path / "fifo.json")
    (pt.path / "afile").write_text("")
    _usage_error(
        run(pt, "--cudastack-snapshot=adir"), "ERROR: --cudastack-snapshot: *adir: is a directory, not a regular file"
    )
    _usage_error(
        run(pt, "--cudastack-snapshot=fifo.json"),
        "ERROR: --cudastack-snapshot: *fifo.json: is a FIFO, not a regular file",
    )
    _usage_error(
        run(pt, "--cudastack-snapshot=afile/s.json"),
        "ERROR: --cudastack-snapshot: *afile/s.json: *afile is not a directory",
    )
    assert (pt.path / "afile").read_text() == ""


def test_baseline_from_the_ini_file_names_its_source(pt):
    (pt.path / "adir").mkdir()
    pt.makeini("[pytest]\ncudastack_baseline = adir\n")
    _usage_error(
        run(pt), "ERROR: --cudastack-baseline (from ini): *adir: cannot read cudastack snapshot: is a directory"
    )


def test_snapshot_in_a_missing_directory_is_created(pt):
    run(pt, "--cudastack-snapshot=new/dir/s.json").assert_outcomes(passed=1)
    assert (pt.path / "new" / "dir" / "s.json").read_text().startswith("{")


def test_snapshot_replaces_a_symlink_never_writes_through_it(pt, tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    (pt.path / "s.json").symlink_to(target)
    run(pt, "--cudastack-snapshot=s.json").assert_outcomes(passed=1)
    assert target.read_text() == "precious\n"
    assert not (pt.path / "s.json").is_symlink()
    assert (pt.path / "s.json").read_text().startswith("{")


@pytest.mark.parametrize(
    ("make", "line"),
    [
        pytest.param(
            lambda p: p / "missing" / "summary.md", "*summary.md: its directory *missing does not exist", id="no dir"
        ),
        pytest.param(lambda p: (p / "d").mkdir() or p / "d", "*d: is a directory, not a regular file", id="directory"),
        pytest.param(lambda p: os.mkfifo(p / "f") or p / "f", "*f: is a FIFO, not a regular file", id="fifo"),
        pytest.param(
            lambda p: (p / "t").write_text("") or (p / "l").symlink_to(p / "t") or p / "l",
            "*l: is a symbolic link, not a regular file",
            id="symlink",
        ),
    ],
)
def test_step_summary_bad_paths(pt, monkeypatch, make, line):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(make(pt.path)))
    _usage_error(run(pt), f"ERROR: $GITHUB_STEP_SUMMARY: {line}")


def test_step_summary_appends_and_is_created(pt, monkeypatch):
    summary = pt.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert run(pt, "--cudastack").ret == 0
    assert run(pt, "--cudastack").ret == 0
    assert summary.read_text().count("### cudastack") == 2


def test_cli_snapshot_bad_outputs_are_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "adir").mkdir()
    (tmp_path / "none").mkdir()  # an empty site directory: no wheels
    site = ["--site", str(tmp_path / "none"), "--cuda-driver=550.54.15"]
    for out, why in [("fifo.json", "is a FIFO, not a regular file"), ("adir", "is a directory, not a regular file")]:
        assert main(["snapshot", *site, "-o", str(tmp_path / out)]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / out}: cannot write the snapshot: {why}" in err
        assert main(["check", *site, f"--cudastack-snapshot={tmp_path / out}"]) == 2
        assert f"{tmp_path / out}: cannot write the snapshot: {why}" in capsys.readouterr().err
    assert os.path.exists(tmp_path / "fifo.json")  # left alone, not replaced


# -- the primitives -----------------------------------------------------------------------------------


def test_write_atomic_leaves_non_regular_files_alone(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    error = write_atomic(str(tmp_path), str(tmp_path / "fifo"), "x")
    assert isinstance(error, OSError)
    assert error.strerror == "is a FIFO, not a regular file"
    assert error.errno == errno.EEXIST
    assert sorted(os.listdir(tmp_path)) == ["fifo"]  # no temporary file left behind


def test_append_text_never_blocks_or_follows(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    error = append_text(str(tmp_path / "fifo"), "x")  # no reader: ENXIO at once, not a wait
    assert isinstance(error, OSError)
    assert error.errno == errno.ENXIO
    (tmp_path / "t").write_text("a\n")
    (tmp_path / "l").symlink_to(tmp_path / "t")
    error = append_text(str(tmp_path / "l"), "b\n")
    assert isinstance(error, OSError)
    assert error.errno == errno.ELOOP
    assert append_text(str(tmp_path / "t"), "b \udcff\n") is None
    assert (tmp_path / "t").read_bytes() == b"a\nb \\udcff\n"
    assert append_text(str(tmp_path / "none" / "x"), "") is not None


def test_output_problem(tmp_path):
    assert output_problem(str(tmp_path / "new" / "s.json")) is None
    assert output_problem(str(tmp_path / "new" / "s.json"), append=True) is not None
    assert output_problem(str(tmp_path / "s\0.json")) is not None
