"""versions.py: the one grammar of CUDA versions, driver versions, archs and the specifiers over them."""

from __future__ import annotations

import doctest

import pytest
from packaging.specifiers import SpecifierSet

from pytest_cudastack.cuda import versions
from pytest_cudastack.cuda.versions import (
    Arch,
    CudaVersion,
    parse_arch,
    parse_arch_list,
    parse_arch_spec,
    parse_cuda,
    parse_cuda_spec,
    parse_driver,
    parse_driver_spec,
)
from pytest_cudastack.errors import DataError, OptionError, RuleError


def test_doctests() -> None:
    result = doctest.testmod(versions, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 10
    assert result.failed == 0


@pytest.mark.parametrize(
    ("text", "release", "minor"),
    [
        pytest.param("12.9", (12, 9), 9, id="major.minor"),
        pytest.param(" 13 ", (13,), None, id="major"),
        pytest.param("12.4.1", (12, 4, 1), 4, id="patch"),
        pytest.param("12.09", (12, 9), 9, id="leading zero of a minor"),
        pytest.param("9.2", (9, 2), 2, id="one-digit major"),
    ],
)
def test_parse_cuda(text: str, release: tuple[int, ...], minor: int | None) -> None:
    version = parse_cuda(text)
    assert version.release == release
    assert version.minor == minor
    assert parse_cuda(version) is version


@pytest.mark.parametrize("text", ["twelve", "", "v12", "12.", "12.x", "0.9", "123", "12.4.1.2", "12.4rc1", "-12"])
def test_parse_cuda_rejects(text: str) -> None:
    with pytest.raises(OptionError, match=rf"^invalid CUDA version {text!r} \(expected "):
        parse_cuda(text)


def test_parse_cuda_patch_and_error_class() -> None:
    with pytest.raises(OptionError, match=r"expected MAJOR\[\.MINOR\]"):
        parse_cuda("12.9.1", patch=False)
    with pytest.raises(RuleError, match="invalid CUDA version"):
        parse_cuda("x", error=RuleError)
    with pytest.raises(DataError):
        parse_cuda("x", error=DataError)


def test_cuda_ordering_is_numeric_and_ignores_trailing_zeros() -> None:
    ordered = [parse_cuda(t) for t in ("9.2", "12", "12.4", "12.4.1", "12.10", "13.0")]
    assert sorted(reversed(ordered)) == ordered
    assert parse_cuda("13") == parse_cuda("13.0") == parse_cuda("13.0.0")
    assert len({parse_cuda("13"), parse_cuda("13.0")}) == 1
    assert parse_cuda("12.4").mm == parse_cuda("12.4.1").mm == (12, 4)
    assert parse_cuda("13").mm == (13, 0)
    assert parse_cuda("13") != parse_driver("580")  # never equal across kinds
    with pytest.raises(TypeError):
        assert parse_cuda("13") < parse_driver("580")  # type: ignore[operator]


@pytest.mark.parametrize(
    ("text", "release", "written", "branch_only"),
    [
        pytest.param("550.54.15", (550, 54, 15), "550.54.15", False, id="full"),
        pytest.param("570.26", (570, 26), "570.26", False, id="two parts"),
        pytest.param("450.80.02", (450, 80, 2), "450.80.02", False, id="kept as written"),
        pytest.param("580", (580,), "580", True, id="branch"),
        pytest.param("R580", (580,), "580", True, id="R branch"),
        pytest.param(" r615 ", (615,), "615", True, id="lower-case r"),
        pytest.param("1010.1", (1010, 1), "1010.1", False, id="four-digit branch"),
    ],
)
def test_parse_driver(text: str, release: tuple[int, ...], written: str, branch_only: bool) -> None:
    driver = parse_driver(text)
    assert (driver.release, str(driver), driver.branch_only, driver.branch) == (
        release,
        written,
        branch_only,
        release[0],
    )


@pytest.mark.parametrize(
    "text",
    ["latest", "", "55", "12.9.1", "550.x", "550.54.15.1", "v550", "-550", "R580.65", "R", "R58", "550.54.15a"],
)
def test_parse_driver_rejects(text: str) -> None:
    with pytest.raises(OptionError, match=rf"^invalid NVIDIA driver version {text!r} \(expected e\.g\. "):
        parse_driver(text)


def test_driver_ordering() -> None:
    assert parse_driver("450.80.02") == parse_driver("450.80.2")
    assert parse_driver("580") < parse_driver("580.65.06") < parse_driver("580.95.05") < parse_driver("590.44.01")
    assert parse_driver("535.104.05") > parse_driver("535.54.03")


@pytest.mark.parametrize(
    ("text", "arch"),
    [
        pytest.param("sm_90", Arch(9, 0), id="sm"),
        pytest.param("sm_90a", Arch(9, 0, "a"), id="arch-specific"),
        pytest.param("sm_100f", Arch(10, 0, "f"), id="family-specific"),
        pytest.param("compute_80", Arch(8, 0), id="compute"),
        pytest.param("9.0", Arch(9, 0), id="compute capability"),
        pytest.param("12.1", Arch(12, 1), id="two-digit major"),
        pytest.param("86", Arch(8, 6), id="bare"),
        pytest.param(" SM_120 ", Arch(12, 0), id="upper case"),
    ],
)
def test_parse_arch(text: str, arch: Arch) -> None:
    assert parse_arch(text) == arch


@pytest.mark.parametrize(
    "text", ["sm_9", "sm_8", "9", "sm_", "hopper", "sm86x", "9.10", "sm_1000", "sm_086", "sm_90b", "compute_", ""]
)
def test_parse_arch_rejects(text: str) -> None:
    with pytest.raises(OptionError, match=rf"^invalid GPU architecture {text!r} \(expected e\.g\. "):
        parse_arch(text)


def test_arch_values() -> None:
    arch = parse_arch("sm_100f")
    assert (str(arch), arch.cc, arch.number) == ("sm_100f", "10.0", 100)
    assert [str(a) for a in parse_arch_list("sm_80, 8.0,compute_90a,")] == ["sm_80", "sm_90a"]
    with pytest.raises(OptionError, match="invalid GPU architecture 'volta'"):
        parse_arch_list("sm_86,volta")
    with pytest.raises(OptionError, match="invalid GPU architecture list"):
        parse_arch_list(())


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        pytest.param(parse_driver_spec, "550", ">=550", id="driver bare"),
        pytest.param(parse_driver_spec, "R580", ">=580", id="driver R branch"),
        pytest.param(parse_driver_spec, ">=535.104, <580", "<580,>=535.104", id="driver range"),
        pytest.param(parse_driver_spec, "==535.*", "==535.*", id="driver wildcard"),
        pytest.param(parse_cuda_spec, "12.4", ">=12.4", id="cuda bare"),
        pytest.param(parse_cuda_spec, "~=12.4", "~=12.4", id="cuda compatible release"),
        pytest.param(parse_cuda_spec, "==12.*", "==12.*", id="cuda wildcard"),
    ],
)
def test_version_specs(parse: object, text: str, expected: str) -> None:
    assert callable(parse)
    assert parse(text) == SpecifierSet(expected)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        pytest.param(parse_driver_spec, "", "empty driver version specifier", id="driver empty"),
        pytest.param(parse_driver_spec, "~~550", "invalid driver version specifier '~~550' (expected", id="syntax"),
        pytest.param(parse_driver_spec, ">=12.4", "invalid NVIDIA driver version '12.4'", id="a CUDA version"),
        pytest.param(parse_driver_spec, "===550", "'===' compares text", id="arbitrary equality"),
        pytest.param(parse_driver_spec, "five", "invalid NVIDIA driver version 'five'", id="driver bare word"),
        pytest.param(parse_cuda_spec, "twelve", "invalid CUDA version specifier 'twelve'", id="cuda word"),
        pytest.param(parse_cuda_spec, ">=twelve", "invalid CUDA version specifier", id="cuda bad version"),
        pytest.param(parse_cuda_spec, ">=550", "invalid CUDA version '550'", id="a driver version"),
    ],
)
def test_version_specs_reject(parse: object, text: str, message: str) -> None:
    assert callable(parse)
    with pytest.raises(RuleError) as info:
        parse(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "shown", "inside", "outside"),
    [
        pytest.param(">=8.0", ">=8.0", ["sm_80", "sm_120"], ["sm_75"], id="at least"),
        pytest.param(">=sm_80,<sm_100", "<10.0,>=8.0", ["sm_90a"], ["sm_100", "sm_75"], id="arch names"),
        pytest.param("~=8.6", "~=8.6", ["sm_89"], ["sm_80", "sm_90"], id="compatible release"),
        pytest.param("==9.*", "==9.*", ["sm_90"], ["sm_100"], id="major wildcard"),
        pytest.param("sm_90a", "sm_90a", ["sm_90"], ["sm_80"], id="one arch, suffix ignored"),
        pytest.param("sm_80, 8.6", "sm_80,sm_86", ["sm_86"], ["sm_89"], id="list"),
    ],
)
def test_arch_spec(text: str, shown: str, inside: list[str], outside: list[str]) -> None:
    spec = parse_arch_spec(text)
    assert str(spec) == shown
    for name in inside + outside:
        arch = parse_arch(name)
        if spec.specifier is not None:
            hit = spec.specifier.contains(arch.cc)
        else:
            hit = any(a.cc == arch.cc for a in spec.archs)
        assert hit is (name in inside), name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "empty arch requirement", id="empty"),
        pytest.param("hopper", "invalid arch requirement 'hopper': invalid GPU architecture 'hopper'", id="word"),
        pytest.param(">=eight", "invalid arch specifier '>=eight': invalid GPU architecture 'eight'", id="bad arch"),
        pytest.param(">=8", "invalid GPU architecture '8'", id="bare major"),
        pytest.param(">=", "invalid arch specifier '>='", id="no version"),
        pytest.param(">=8.0,sm_90", "invalid arch specifier", id="mixed"),
    ],
)
def test_arch_spec_rejects(text: str, message: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_arch_spec(text)
    assert message in str(info.value)


def test_values_are_frozen() -> None:
    version = parse_cuda("12.4")
    with pytest.raises(AttributeError):
        version.release = (13,)  # type: ignore[misc]
    assert isinstance(version, CudaVersion)
    assert hash(parse_driver("580")) == hash(parse_driver("R580"))
