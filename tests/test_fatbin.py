from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.fatbin import CONTAINER_MAGIC, FatbinEntry, read_fatbin, runs_on

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

KERNEL = "__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n"


def _nvcc(tmp: Path, name: str, *args: str) -> Path:
    src = tmp / "k.cu"
    src.write_text(KERNEL)
    out = tmp / name
    subprocess.run(["nvcc", *args, "-o", str(out), str(src)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    tmp = tmp_path_factory.mktemp("fatbin")
    return {
        "shared": _nvcc(
            tmp,
            "libk.so",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90,code=compute_90",
            "-gencode",
            "arch=compute_90a,code=sm_90a",
        ),
        "family": _nvcc(
            tmp,
            "libf.so",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-gencode",
            "arch=compute_100f,code=sm_100f",
            "-Xfatbin",
            "-compress-all",
        ),
        "fatbin": _nvcc(tmp, "k.fatbin", "-fatbin", "-gencode", "arch=compute_75,code=sm_75"),
    }


@needs_nvcc
def test_entries_of_a_shared_library(built: dict[str, Path]) -> None:
    fat = read_fatbin(built["shared"])
    assert fat.sass == ("sm_80", "sm_90a")
    assert fat.ptx == ("compute_90",)
    assert fat.problems == ()


@needs_nvcc
def test_family_suffix_and_compression(built: dict[str, Path]) -> None:
    fat = read_fatbin(built["family"])
    assert fat.sass == ("sm_100f",)
    assert {e.compression for e in fat.entries} == {"zstd"}


@needs_nvcc
def test_standalone_fatbin_file(built: dict[str, Path]) -> None:
    assert read_fatbin(built["fatbin"]).sass == ("sm_75",)


def test_host_only_elf_has_no_entries() -> None:
    assert read_fatbin("/bin/sh").entries == ()


@needs_nvcc
def test_truncated_container_is_a_problem_not_a_crash(built: dict[str, Path], tmp_path: Path) -> None:
    data = bytearray(built["fatbin"].read_bytes())
    struct.pack_into("<Q", data, 8, 1 << 40)  # files_size far past the end
    broken = tmp_path / "broken.fatbin"
    broken.write_bytes(bytes(data))
    fat = read_fatbin(broken)
    assert fat.entries == ()
    assert "past its section" in fat.problems[0]


@needs_nvcc
def test_entry_running_past_its_container(built: dict[str, Path], tmp_path: Path) -> None:
    data = bytearray(built["fatbin"].read_bytes())
    struct.pack_into("<Q", data, 16 + 8, 1 << 40)  # first entry's padded payload size
    broken = tmp_path / "entry.fatbin"
    broken.write_bytes(bytes(data))
    assert "runs past its container" in read_fatbin(broken).problems[0]


def test_garbage_magic_is_reported(tmp_path: Path) -> None:
    blob = struct.pack("<IHHQ", CONTAINER_MAGIC, 1, 16, 0)
    blob += struct.pack("<I", 0xDEADBEEF) + b"\x00" * 20
    path = tmp_path / "two.fatbin"
    path.write_bytes(blob)
    assert "bad container magic 0xdeadbeef" in read_fatbin(path).problems[0]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: p.write_bytes(os.urandom(256)), id="random bytes"),
        pytest.param(lambda p: os.mkfifo(p), id="fifo"),
        pytest.param(lambda p: p.mkdir(), id="directory"),
        pytest.param(lambda p: p.symlink_to(p.parent / "nowhere"), id="dangling link"),
    ],
)
def test_bad_files_raise_elf_error_naming_the_file(tmp_path: Path, make) -> None:
    path = tmp_path / "libbad.so"
    make(path)
    with pytest.raises(ElfError, match=r"libbad\.so"):
        read_fatbin(path)


@pytest.mark.parametrize(
    ("entry", "cc", "expected"),
    [
        pytest.param(FatbinEntry("sass", 80, "", None), 86, True, id="sm_80 sass on 8.6"),
        pytest.param(FatbinEntry("sass", 86, "", None), 80, False, id="sm_86 sass not on 8.0"),
        pytest.param(FatbinEntry("sass", 80, "", None), 90, False, id="sass never crosses majors"),
        pytest.param(FatbinEntry("sass", 90, "a", None), 90, True, id="sm_90a on 9.0"),
        pytest.param(FatbinEntry("sass", 100, "a", None), 103, False, id="sm_100a only on 10.0"),
        pytest.param(FatbinEntry("sass", 100, "f", None), 103, True, id="sm_100f on 10.3"),
        pytest.param(FatbinEntry("sass", 100, "f", None), 120, False, id="sm_100f not on 12.0"),
        pytest.param(FatbinEntry("ptx", 75, "", None), 120, True, id="compute_75 jit anywhere newer"),
        pytest.param(FatbinEntry("ptx", 90, "", None), 86, False, id="compute_90 not on 8.6"),
        pytest.param(FatbinEntry("ptx", 90, "a", None), 100, False, id="compute_90a only on 9.0"),
    ],
)
def test_runs_on(entry: FatbinEntry, cc: int, expected: bool) -> None:
    assert runs_on(entry, cc) is expected


def _embed(tmp_path: Path, blob: bytes, arrays: dict[str, str], name: str = "libembed.so") -> Path:
    """A gcc-built library with ``blob`` in each of ``arrays`` (C name -> section; "" for the compiler's own
    choice, .rodata), after a chance match of the magic (which is data) except in .nv_fatbin."""
    noise = struct.pack("<I", CONTAINER_MAGIC) + b"\x07" * 12  # a chance match: not a container
    lines = []
    for var, section in arrays.items():
        array = ",".join(str(b) for b in (b"" if section == ".nv_fatbin" else noise + b"\x00" * 4) + blob)
        where = f'__attribute__((section("{section}"))) ' if section else ""
        lines.append(f"{where}__attribute__((aligned(8))) const unsigned char {var}[] = {{{array}}};")
    src = tmp_path / f"{name}.c"
    src.write_text("\n".join(lines) + "\n")
    lib = tmp_path / name
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


@needs_nvcc
def test_containers_embedded_in_data_sections_beside_a_fatbin_section(built: dict[str, Path], tmp_path: Path) -> None:
    # cuFFT: an .nv_fatbin section, no cudart registration records, most kernels in a data section
    sm75 = built["fatbin"].read_bytes()
    sm80 = _nvcc(tmp_path, "k80.fatbin", "-fatbin", "-gencode", "arch=compute_80,code=sm_80").read_bytes()
    lib = _embed(tmp_path, sm75, {"kernels": ""})
    assert read_fatbin(lib).entries == ()  # no fatbin section: not read as device code (CUPTI's case)
    lib = _embed(tmp_path, sm80, {"fatbin": ".nv_fatbin"}, "libone.so")
    assert read_fatbin(lib).sass == ("sm_80",)
    src = (tmp_path / "libone.so.c").read_text() + (tmp_path / "libembed.so.c").read_text()
    (tmp_path / "both.c").write_text(src)
    both = tmp_path / "libboth.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(both), str(tmp_path / "both.c")], check=True)
    fat = read_fatbin(both)
    assert fat.sass == ("sm_75", "sm_80")
    assert fat.problems == ()


@needs_nvcc
def test_a_cudart_registered_library_is_read_in_its_own_named_sections_only(
    built: dict[str, Path], tmp_path: Path
) -> None:
    # cuBLASLt: cudart-registered kernels (.nv_fatbin + .nvFatBinSegment), more in .cask_resource; its
    # .rodata tables are not searched
    sm75 = built["fatbin"].read_bytes()
    src = tmp_path / "reg.cu"
    blob = ",".join(str(b) for b in sm75)
    src.write_text(
        KERNEL
        + f'__attribute__((section(".cask_resource"), aligned(8))) const unsigned char cask[] = {{{blob}}};\n'
        + f"__attribute__((aligned(8))) const unsigned char table[] = {{{blob}}};\n"
    )
    lib = tmp_path / "libreg.so"
    args = ["-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_90,code=sm_90", "-o", str(lib), str(src)]
    subprocess.run(["nvcc", *args], check=True, capture_output=True)
    assert read_fatbin(lib).sass == ("sm_75", "sm_90")
    src.write_text(KERNEL + f"__attribute__((aligned(8))) const unsigned char table[] = {{{blob}}};\n")
    subprocess.run(["nvcc", *args], check=True, capture_output=True)
    assert read_fatbin(lib).sass == ("sm_90",)  # .rodata of a registered library: not searched


def test_odd_section_headers_go_to_pyelftools_and_raise_naming_the_file(tmp_path: Path) -> None:
    # an ELF64 header whose section table lies past the end: not for the struct reader, corrupt for pyelftools
    head = bytearray(64)
    head[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<HHIQQQIHHHHHH", head, 16, 3, 62, 1, 0, 0, 1 << 30, 0, 64, 0, 0, 64, 3, 1)
    path = tmp_path / "libodd.so"
    path.write_bytes(bytes(head) + b"\x00" * 64)
    with pytest.raises(ElfError, match=r"libodd\.so"):
        read_fatbin(path)
