"""Node facts: the kernel module's version read from fake /proc and /sys roots, against the user-space driver
libraries the linker would load; a mismatch is an ERROR of the driver item, with its clean twins."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudastack.checks.driver import mismatch_findings
from pytest_cudastack.cuda.driver import DriverInfo, driver_files, kernel_module_version
from pytest_cudastack.findings import Severity

PROC_LINE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@U16)\n"


def fake_root(tmp_path: Path, proc: str | None = None, sys_version: str | None = None) -> str:
    """A root with /proc/driver/nvidia/version and/or /sys/module/nvidia/version for module ``proc``/``sys``."""
    if proc is not None:
        p = tmp_path / "proc" / "driver" / "nvidia" / "version"
        p.parent.mkdir(parents=True)
        p.write_text(PROC_LINE.format(v=proc))
    if sys_version is not None:
        p = tmp_path / "sys" / "module" / "nvidia" / "version"
        p.parent.mkdir(parents=True)
        p.write_text(sys_version + "\n")
    return str(tmp_path)


def finder(libcuda: str | None, nvml: str | None, directory: str = "/usr/lib/x86_64-linux-gnu"):
    table = {
        "libcuda.so.1": (f"{directory}/libcuda.so.1", f"{directory}/libcuda.so.{libcuda}") if libcuda else (None, None),
        "libnvidia-ml.so.1": (f"{directory}/libnvidia-ml.so.1", f"{directory}/libnvidia-ml.so.{nvml}")
        if nvml
        else (None, None),
    }
    return lambda soname: table.get(soname, (None, None))


def probed(files_root: str, libcuda: str | None, nvml: str | None) -> DriverInfo:
    files = driver_files(finder(libcuda, nvml), files_root)
    return DriverInfo(
        "probed",
        files.kernel_module,
        "13.0",
        kernel_module=files.kernel_module,
        libcuda_version=files.libcuda_version,
        nvml_version=files.nvml_version,
        forward_compat=files.forward_compat,
    )


def test_module_version_from_proc(tmp_path: Path):
    root = fake_root(tmp_path, proc="580.95.05", sys_version="580.95.05")
    assert kernel_module_version(root) == ("580.95.05", str(tmp_path / "proc/driver/nvidia/version"))


def test_module_version_from_sys_when_proc_is_hidden(tmp_path: Path):
    root = fake_root(tmp_path, sys_version="570.124.06")
    assert kernel_module_version(root) == ("570.124.06", str(tmp_path / "sys/module/nvidia/version"))


@pytest.mark.parametrize("content", ["", "not a version\n", "5\n"])
def test_module_version_unreadable_is_none(tmp_path: Path, content: str):
    p = tmp_path / "sys" / "module" / "nvidia" / "version"
    p.parent.mkdir(parents=True)
    p.write_text(content)
    assert kernel_module_version(str(tmp_path)) == (None, None)


def test_no_module_loaded(tmp_path: Path):
    assert kernel_module_version(str(tmp_path)) == (None, None)


def test_upgrade_without_reboot_is_an_error(tmp_path: Path):
    """The classic: the user-space driver upgraded to 580, the 570 module still loaded."""
    info = probed(fake_root(tmp_path, sys_version="570.124.06"), "580.95.05", "580.95.05")
    assert info.forward_compat is None  # not mistaken for cuda-compat: NVML moved too
    assert info.mismatched_libraries() == (("libcuda.so.1", "580.95.05"), ("libnvidia-ml.so.1", "580.95.05"))
    (finding,) = mismatch_findings(info)
    assert finding.severity is Severity.ERROR
    assert finding.check == "driver"
    assert "kernel module is 570.124.06" in finding.message
    text = finding.fix
    assert "reboot" in text
    assert "reinstall the user-space driver 570.124.06" in text


def test_older_libcuda_alone_is_an_error(tmp_path: Path):
    info = probed(fake_root(tmp_path, proc="580.95.05"), "575.51.03", "580.95.05")
    assert info.mismatched_libraries() == (("libcuda.so.1", "575.51.03"),)
    assert mismatch_findings(info)[0].severity is Severity.ERROR


def test_nvml_alone_mismatched_is_an_error(tmp_path: Path):
    info = probed(fake_root(tmp_path, proc="550.54.15"), "550.54.15", "550.163.01")
    assert info.mismatched_libraries() == (("libnvidia-ml.so.1", "550.163.01"),)


@pytest.mark.parametrize(
    ("libcuda", "nvml"),
    [
        pytest.param("580.95.05", "580.95.05", id="matching"),
        pytest.param("590.48.01", "580.95.05", id="forward-compat libcuda, NVML of the module"),
        pytest.param(None, None, id="no user-space driver found"),
        pytest.param("580.95.05", None, id="NVML absent"),
    ],
)
def test_clean_twins(tmp_path: Path, libcuda: str | None, nvml: str | None):
    info = probed(fake_root(tmp_path, proc="580.95.05"), libcuda, nvml)
    assert info.mismatched_libraries() == ()
    assert mismatch_findings(info) == ()


def test_declared_driver_is_never_a_mismatch():
    info = DriverInfo("declared", "550.54.15", "12.4", kernel_module="580.95.05", libcuda_version="550.54.15")
    assert mismatch_findings(info) == ()


def test_round_trip_keeps_the_library_versions():
    info = DriverInfo("probed", "570.124.06", "12.8", kernel_module="570.124.06", libcuda_version="580.95.05")
    assert DriverInfo.from_json(info.to_json()) == info
