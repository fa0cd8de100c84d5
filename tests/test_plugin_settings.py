"""settings.py: values as options store them, precedence, Settings.from_values (what `cudastack check` builds).

The grammars themselves are tests/test_versions.py's; every bad value of every option, end to end, is
tests/test_options.py's."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pytest_cudastack.errors import OptionError
from pytest_cudastack.options import OPTIONS, add_arguments
from pytest_cudastack.settings import (
    ENV,
    Settings,
    cuda_version_type,
    resolve,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("12.9", "12.9", id="major.minor"),
        pytest.param(" 13 ", "13", id="major"),
    ],
)
def test_cuda_version_option(text, expected):
    assert Settings.from_values(cuda_max=text).cuda_max == expected


@pytest.mark.parametrize("text", ["twelve", "12.9.1", " ", "v12", "12."])
def test_cuda_version_option_rejects(text):
    with pytest.raises(ValueError, match="invalid CUDA version"):
        Settings.from_values(cuda_max=text)


def test_driver_version_option():
    assert Settings.from_values(cuda_driver="550.54.15").cuda_driver == "550.54.15"
    assert Settings.from_values(cuda_driver="580").cuda_driver == "580"
    assert Settings.from_values(cuda_driver="R580").cuda_driver == "580"
    with pytest.raises(ValueError, match="invalid NVIDIA driver version"):
        Settings.from_values(cuda_driver="latest")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("sm_80,sm_90", ("sm_80", "sm_90"), id="list"),
        pytest.param("8.0, 9.0", ("sm_80", "sm_90"), id="dotted"),
        pytest.param("90a", ("sm_90a",), id="bare with suffix"),
        pytest.param(("sm_90", "sm_90,sm_100"), ("sm_90", "sm_100"), id="repeated, deduplicated"),
    ],
)
def test_arch_list_option(value, expected):
    assert Settings.from_values(cuda_arch=value).cuda_arch == expected


@pytest.mark.parametrize("value", ["hopper", ",", "sm_", "sm_9"])
def test_arch_list_option_rejects(value):
    with pytest.raises(ValueError, match="invalid GPU architecture"):
        Settings.from_values(cuda_arch=value)


def test_argparse_type_raises_argument_type_error():
    with pytest.raises(argparse.ArgumentTypeError, match="invalid CUDA version 'x'"):
        cuda_version_type("x")


def test_precedence_cli_env_ini():
    s = resolve(
        cli={"cuda_max": "12.9"},
        env={"CUDASTACK_CUDA_MAX": "12.4", "CUDASTACK_CUDA_MIN": "12.0", "CUDASTACK_SCAN": "bin:tools"},
        ini={"cuda_max": "11.8", "cuda_min": "11.0", "cuda_driver": "550", "cudastack": True},
    )
    assert (s.cuda_max, s.source("cuda_max")) == ("12.9", "command line")
    assert (s.cuda_min, s.source("cuda_min")) == ("12.0", "CUDASTACK_CUDA_MIN")
    assert (s.cuda_driver, s.source("cuda_driver")) == ("550", "ini")
    assert s.cudastack_scan == ("bin", "tools")
    assert s.cudastack is True
    assert s.describe("cuda_min") == "--cuda-min=12.0 (from CUDASTACK_CUDA_MIN)"


def test_toml_numbers_are_read_as_written_and_other_types_refused():
    s = resolve(ini={"cuda_driver": 580, "cuda_max": 12.9, "cuda_arch": 90})
    assert (s.cuda_driver, s.cuda_max, s.cuda_arch) == ("580", "12.9", ("sm_90",))
    with pytest.raises(OptionError, match=r"--cuda-min \(from ini\): invalid value \[13\] \(expected a string\)"):
        resolve(ini={"cuda_min": [13]})


def test_ini_getter_errors_name_the_option():
    def getini(key: str) -> object:
        if key == "cudastack":
            raise ValueError("invalid truth value 'maybe'")
        return None

    with pytest.raises(OptionError, match=r"^--cudastack \(from ini\): invalid truth value 'maybe'$"):
        resolve(ini=getini)


def test_bad_ini_value_names_option_and_source():
    with pytest.raises(OptionError, match=r"--cuda-arch \(from ini\): invalid GPU architecture 'hopper'"):
        resolve(ini={"cuda_arch": "hopper"})


def test_from_values_for_the_cli():
    s = Settings.from_values(cudastack=True, cuda_max="12.9", cuda_arch="sm_90", cudastack_scan=["bin"], cuda_min=None)
    assert s == Settings(cudastack=True, cuda_max="12.9", cuda_arch=("sm_90",), cudastack_scan=("bin",))
    assert s.items == (
        "integrity",
        "closure",
        "dlopen",
        "symbols",
        "cuda-max",
        "driver",
        "arch",
        "requirements",
        "toolchain",
    )
    with pytest.raises(OptionError, match="--cuda-max"):
        Settings.from_values(cuda_max="twelve")


def test_items_and_active():
    assert Settings().items == ()
    assert not Settings().active
    assert Settings(cuda_driver="550").active
    assert Settings(cudastack_baseline="b.json").items == ("baseline",)
    assert Settings(cudastack_scan=("bin",)).active


def test_settings_has_one_field_per_row_with_its_default():
    fields = [f for f in dataclasses.fields(Settings) if f.name != "sources"]
    assert [f.name for f in fields] == [o.key for o in OPTIONS]
    assert [f.default for f in fields] == [o.default for o in OPTIONS]


def test_rows_follow_the_naming_rules():
    # flag = --KEY with dashes, ini key = KEY, environment variable CUDASTACK_<NOUN>
    for option in OPTIONS:
        assert option.name == "--" + option.key.replace("_", "-")
        assert option.help
    assert all(
        ENV[k] == "CUDASTACK" + (("_" + k.upper().removeprefix("CUDASTACK_")) if k != "cudastack" else "") for k in ENV
    )


def test_cli_parser_shares_the_options(monkeypatch):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.setenv("CUDASTACK_CUDA_DRIVER", "550.54.15")
    args = parser.parse_args(["--cuda-max=12.9", "--cudastack-scan=bin", "--cudastack-scan=tools", "--cudastack"])
    s = Settings.from_namespace(args)
    assert (s.cuda_max, s.cudastack_scan, s.cudastack, s.cuda_driver) == ("12.9", ("bin", "tools"), True, "550.54.15")
    with pytest.raises(SystemExit):
        parser.parse_args(["--cuda-max=twelve"])
