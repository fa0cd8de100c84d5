"""Layer-backed placeholders: a large file of an image's cached root is not copied out of its layer tar but
read where it lies (`pytest_cudastack._sysio`). Every byte reader must see exactly the bytes the file would
hold, at every offset a tar member can start at, never read into the next member, and never fill the
placeholder; a reader that needs a plain descriptor fills it; a changed layer is refused, never misread."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack._sysio import LAYER_XATTR, open_regular, open_span, read_text
from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.cyinit import init_names
from pytest_cudastack.linker.elf import exports, looks_like_elf, read_elf
from pytest_cudastack.linker.fatbin import read_fatbin
from pytest_cudastack.linker.lookups import read_lookups
from pytest_cudastack.linker.strings import read_only_ranges, read_strings
from pytest_cudastack.linker.symbols import read_symbols, relocation_order
from pytest_cudastack.linker.toolversion import read_tool_version
from pytest_cudastack.wheels.ownership import file_digest
from tests.helpers.elfbuild import build_lib, needs_cc
from tests.helpers.imagebuild import is_placeholder, placeholder

# a library larger than a placeholder's floor, with what each reader looks for: a dlopen'ed name, a CUDA
# tool's version line, versioned references, data to hash
SOURCE = r"""
#include <dlfcn.h>
#include <string.h>
const char pad[400000] = {1, 2, 3};
const char version[] = "Cuda compilation tools, release 12.9, V12.9.86";
int use(void) { return dlopen("libcudnn_ops.so.9", 2) != 0 && strlen(pad) > 0; }
"""

KERNEL = "__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n"
SHIFTS = [0, 1536, 4096 + 512]  # tar members start on 512-byte boundaries: on a page, and off one


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("backed")
    out = build_lib(d / "orig" / "libbig.so.1", soname="libbig.so.1", source=SOURCE, extra=["-ldl"])
    assert out.stat().st_size > 256 << 10
    return out


def _same(reader: Callable[[str], Any], orig: Path, copy: Path) -> None:
    want = reader(str(orig))
    got = reader(str(copy))
    assert repr(got).replace(str(copy), str(orig)) == repr(want)


READERS: dict[str, Callable[[str], Any]] = {
    "read_elf": read_elf,
    "exports": lambda p: exports(p, "use"),
    "looks_like_elf": looks_like_elf,
    "read_symbols": read_symbols,
    "relocation_order": lambda p: relocation_order(p, ["dlopen", "strlen"]),
    "read_strings": read_strings,
    "read_only_ranges": read_only_ranges,
    "read_lookups": read_lookups,
    "init_names": init_names,
    "read_tool_version": read_tool_version,
    "sha256": lambda p: file_digest(p, hashlib.sha256()),
}


@needs_cc
@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_byte_reader_reads_a_placeholder_as_the_file_without_filling_it(
    lib: Path, tmp_path: Path, reader: str, shift: int
) -> None:
    copy = placeholder(lib, tmp_path / "root" / lib.name, shift)
    assert is_placeholder(copy)
    _same(READERS[reader], lib, copy)
    assert is_placeholder(copy)  # read in place: not one byte written


@needs_cc
def test_the_readers_see_the_files_own_facts_not_the_blobs(lib: Path, tmp_path: Path) -> None:
    copy = placeholder(lib, tmp_path / "root" / lib.name, 1536)
    assert read_elf(copy).soname == "libbig.so.1"
    assert "libcudnn_ops.so.9" in read_strings(copy).names
    assert read_tool_version(str(copy)).version == "12.9.86"
    assert file_digest(str(copy), hashlib.sha256()) == hashlib.sha256(lib.read_bytes()).digest()
    span, st = open_span(str(copy))
    try:
        assert (span.size, st.st_size) == (lib.stat().st_size, lib.stat().st_size)
        assert span.pread(1 << 30, st.st_size - 4) == lib.read_bytes()[-4:]  # never into the next member
        assert span.pread(16, st.st_size) == b""
        with span.stream() as stream:
            stream.seek(-8, os.SEEK_END)
            assert stream.read() == lib.read_bytes()[-8:]
        view, where = span.map()
        with view:
            assert view[where : where + 64] == lib.read_bytes()[:64]
    finally:
        span.close()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("shift", SHIFTS)
def test_a_fatbin_in_data_sections_is_found_in_place_at_any_member_offset(tmp_path: Path, shift: int) -> None:
    """cuBLASLt's layout: kernels in ``.nv_fatbin`` and more containers in ``.cask_resource``, which is
    searched through a mapping: a placeholder's mapping starts on the page below its offset."""
    fatbin = tmp_path / "k.fatbin"
    (tmp_path / "k.cu").write_text(KERNEL)
    run = ["nvcc", "-fatbin", "-gencode", "arch=compute_75,code=sm_75", "-o", str(fatbin), str(tmp_path / "k.cu")]
    subprocess.run(run, check=True, capture_output=True)
    blob = ",".join(str(b) for b in fatbin.read_bytes())
    src = tmp_path / "reg.cu"
    src.write_text(
        KERNEL + f'__attribute__((section(".cask_resource"), aligned(8))) const unsigned char cask[] = {{{blob}}};\n'
    )
    lib = tmp_path / "orig" / "libreg.so"
    lib.parent.mkdir()
    args = ["-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_90,code=sm_90", "-o", str(lib), str(src)]
    subprocess.run(["nvcc", *args], check=True, capture_output=True)
    copy = placeholder(lib, tmp_path / "root" / "libreg.so", shift)
    assert read_fatbin(copy).sass == read_fatbin(lib).sass == ("sm_75", "sm_90")
    assert is_placeholder(copy)


@needs_cc
def test_a_reader_of_a_plain_descriptor_fills_the_placeholder_once(lib: Path, tmp_path: Path) -> None:
    copy = placeholder(lib, tmp_path / "root" / lib.name, 4096 + 512)
    fd, st = open_regular(str(copy))
    try:
        assert os.pread(fd, st.st_size, 0) == lib.read_bytes()
    finally:
        os.close(fd)
    assert not is_placeholder(copy)
    assert copy.read_bytes() == lib.read_bytes()
    assert read_elf(copy).soname == "libbig.so.1"  # now an ordinary file


@needs_cc
def test_a_text_reader_fills_a_placeholder(tmp_path: Path) -> None:
    text = tmp_path / "orig.py"
    text.write_text("import torch\n" * 30000)
    copy = placeholder(text, tmp_path / "root" / "big.py", 512)
    assert read_text(str(copy)) == text.read_text()


@needs_cc
def test_a_layer_changed_since_is_refused_naming_the_file_never_misread(lib: Path, tmp_path: Path) -> None:
    copy = placeholder(lib, tmp_path / "root" / lib.name, 512)
    blob = copy.parent / f"{copy.name}.blob"
    st = blob.stat()
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # saved again over the same inode
    with pytest.raises(ElfError, match=r"libbig\.so\.1: the image layer it lies in .* changed since"):
        read_elf(copy)
    assert file_digest(str(copy), hashlib.sha256()) is None
    assert read_text(str(copy)) is None
    blob.unlink()
    with pytest.raises(ElfError, match=r"cannot open"):
        read_elf(copy)


@needs_cc
def test_an_attribute_on_a_file_with_its_bytes_is_not_followed(lib: Path, tmp_path: Path) -> None:
    """Only a sparse file is a placeholder: an attribute copied onto a real file (``cp -a`` of a filled one,
    a hostile planting) never redirects its reads."""
    real = tmp_path / "real.so"
    shutil.copyfile(lib, real)
    other = placeholder(lib, tmp_path / "root" / "other.so", 512)
    os.setxattr(real, LAYER_XATTR, os.getxattr(other, LAYER_XATTR).replace(b"512 ", b"0 ", 1))
    _same(read_elf, lib, real)
    assert real.read_bytes() == lib.read_bytes()
