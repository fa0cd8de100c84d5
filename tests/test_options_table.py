"""options.OPTIONS is the one declaration of the options: a row added there is a pytest option, an ini key,
an environment variable and a ``cudastack check`` flag, resolved with the same precedence as the others."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from pytest_cudastack import options, settings
from pytest_cudastack.cli import build_parser, main
from pytest_cudastack.cli.project import project_settings
from pytest_cudastack.options import Option

EXTRA = Option(
    "cudastack_extra",
    ("--cudastack-extra",),
    "an option that exists only in this test",
    str,
    env="CUDASTACK_EXTRA",
    metavar="WORD",
)


@pytest.fixture
def extra_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPTIONS with one more row, and Settings with its field (what code that reads it by name needs)."""
    monkeypatch.setattr(options, "OPTIONS", (*options.OPTIONS, EXTRA))
    extended = dataclasses.make_dataclass(
        "Settings",
        [("cudastack_extra", "str | None", dataclasses.field(default=None))],
        bases=(settings.Settings,),
        frozen=True,
    )
    monkeypatch.setattr(settings, "Settings", extended)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in (*settings.ENV.values(), "CUDASTACK_EXTRA", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(var, raising=False)


USES_IT = """
def test_value(cuda_stack):
    print("VALUE", cuda_stack.settings.describe("cudastack_extra"))
"""


@pytest.mark.usefixtures("extra_row")
def test_a_row_is_a_pytest_option_and_an_ini_key(pytester: pytest.Pytester):
    result = pytester.runpytest("-p", "pytest_cudastack.plugin", "--help")
    result.stdout.fnmatch_lines(["  --cudastack-extra=WORD", "*an option that exists only in this test*"])
    result.stdout.fnmatch_lines(["  cudastack_extra (string):", "*an option that exists only in this test*"])


@pytest.mark.usefixtures("extra_row")
@pytest.mark.parametrize(
    ("route", "shown"),
    [
        pytest.param("command line", "--cudastack-extra=word", id="command line"),
        pytest.param("environment", "--cudastack-extra=word (from CUDASTACK_EXTRA)", id="environment"),
        pytest.param("ini", "--cudastack-extra=word (from ini)", id="ini"),
    ],
)
def test_a_row_is_resolved_from_every_source(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, route: str, shown: str
):
    pytester.makepyfile(USES_IT)
    args = []
    if route == "command line":
        args.append("--cudastack-extra=word")
    elif route == "environment":
        monkeypatch.setenv("CUDASTACK_EXTRA", "word")
    else:
        pytester.makeini("[pytest]\ncudastack_extra = word\n")
    result = pytester.runpytest("-p", "pytest_cudastack.plugin", "-s", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*VALUE {shown}"])


@pytest.mark.usefixtures("extra_row")
def test_a_row_is_a_check_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert "--cudastack-extra WORD" in capsys.readouterr().out
    args = build_parser(check_options=True).parse_args(["check", "--cudastack-extra=word"])
    assert settings.Settings.from_namespace(args).describe("cudastack_extra") == "--cudastack-extra=word"
    # and `cudastack check` reads its ini key where pytest would
    (tmp_path / "pytest.ini").write_text("[pytest]\ncudastack_extra = from-ini\n")
    monkeypatch.chdir(tmp_path)
    found, _ = project_settings(build_parser(check_options=True).parse_args(["check"]), environ=dict(os.environ))
    assert found.describe("cudastack_extra") == "--cudastack-extra=from-ini (from ini)"
