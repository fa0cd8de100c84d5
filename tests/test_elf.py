"""elf.read_elf: declared facts of real gcc-built files, and an ElfError for every kind of bad input."""

from __future__ import annotations

import os
import random
import shutil
import socket
import stat
import threading
from pathlib import Path

import pytest
from elfbuild import Scenarios, build_exe, build_lib, get_scenarios, needs_cc, patch

from pytest_cudastack.elf import (
    CUDA_SECTIONS,
    ElfInfo,
    VersionNeed,
    exports,
    looks_like_elf,
    machine_name,
    read_elf,
)
from pytest_cudastack.errors import ElfError

pytestmark = needs_cc


@pytest.fixture(scope="session")
def scen(tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    return get_scenarios(tmp_path_factory)


@pytest.fixture(scope="session")
def cuda_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cudalib")
    src = (
        '__attribute__((section(".nv_fatbin"), used)) static const char fb[16] = {1};\n'
        '__attribute__((section(".nvFatBinSegment"), used)) static const char seg[24] = {2};\n'
        "int PyInit_mymod(void) { return 0; }\n"
    )
    return build_lib(d / "mymod.cpython-311-x86_64-linux-gnu.so", source=src)


def test_facts_of_a_library(scen: Scenarios) -> None:
    info = read_elf(scen.rpath_inherit)
    assert info.path == str(scen.rpath_inherit)
    assert (info.elf_class, info.little_endian, info.machine, info.osabi) == (64, True, 62, 0)
    assert info.elf_type == "ET_DYN"
    assert info.interpreter is None
    assert info.needed[0] == "libmid.so.1"
    assert info.rpath == (str(scen.base / "a"), str(scen.base / "b"))
    assert info.runpath == ()
    assert not info.nodeflib
    assert info.cuda_sections == ()


def test_soname_runpath_and_nodeflib(scen: Scenarios) -> None:
    assert read_elf(scen.leaf).soname == "libleaf.so.1"
    info = read_elf(scen.runpath_not_inherited)
    assert info.runpath == (str(scen.base / "a"), str(scen.base / "b"))
    assert info.rpath == ()
    assert read_elf(scen.nodeflib).nodeflib
    both = read_elf(scen.prec_both)
    assert both.rpath == (str(scen.d_rpath),)
    assert both.runpath == (str(scen.d_runpath),)


def test_dst_not_expanded_and_empty_elements_kept(tmp_path: Path) -> None:
    lib = build_lib(tmp_path / "libe.so", rpath="$ORIGIN/../lib::${ORIGIN}")
    assert read_elf(lib).rpath == ("$ORIGIN/../lib", "", "${ORIGIN}")


def test_executable_interpreter_and_version_needs(scen: Scenarios) -> None:
    info = read_elf(scen.exe)
    assert info.interpreter == "/lib64/ld-linux-x86-64.so.2"
    assert info.elf_type in ("ET_DYN", "ET_EXEC")
    lib = read_elf(Path("/lib/x86_64-linux-gnu/libz.so.1"))
    assert lib.version_needs
    assert lib.version_needs[0].file == "libc.so.6"
    assert all(v.startswith("GLIBC_") for v in lib.version_needs[0].versions)


def test_cuda_sections_and_pyinit(cuda_lib: Path) -> None:
    info = read_elf(cuda_lib)
    assert info.cuda_sections == (".nv_fatbin", ".nvFatBinSegment")
    assert set(info.cuda_sections) <= set(CUDA_SECTIONS)
    assert info.pyinit == "PyInit_mymod"


def test_pyinit_needs_the_matching_module_name(cuda_lib: Path, tmp_path: Path) -> None:
    other = tmp_path / "othermod.so"
    shutil.copyfile(cuda_lib, other)
    assert read_elf(other).pyinit is None
    # an undefined reference is not an export
    user = build_lib(tmp_path / "user.so", source="extern int PyInit_user(void); int f(void){return PyInit_user();}")
    assert read_elf(user).pyinit is None


def test_pyinit_uses_the_hash_table_not_a_symbol_walk(cuda_lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elftools.elf.sections import SymbolTableSection

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("iter_symbols must not be called")

    monkeypatch.setattr(SymbolTableSection, "iter_symbols", boom)
    assert read_elf(cuda_lib).pyinit == "PyInit_mymod"


def test_json_roundtrip(scen: Scenarios, cuda_lib: Path) -> None:
    for p in (scen.exe, cuda_lib, scen.prec_both):
        info = read_elf(p)
        assert ElfInfo.from_json(info.to_json()) == info
    with pytest.raises(ElfError):
        ElfInfo.from_json({"path": "x"})
    v = VersionNeed("libc.so.6", ("GLIBC_2.2.5",))
    assert v.versions == ("GLIBC_2.2.5",)


def test_machine_name() -> None:
    assert machine_name(62) == "x86-64"
    assert machine_name(183) == "AArch64"
    assert "9999" in machine_name(9999)


def test_patched_machine_and_class(scen: Scenarios) -> None:
    assert read_elf(scen.base / "wm" / "libwm.so").machine == 183


def test_reads_only_headers_of_a_huge_file(scen: Scenarios, tmp_path: Path) -> None:
    big = tmp_path / "libhuge.so"
    shutil.copyfile(scen.rpath_inherit, big)
    with open(big, "r+b") as f:
        f.truncate(2 * 1024**3)  # sparse 2 GB tail: a whole-file read would show in rchar
    before = _rchar()
    info = read_elf(big)
    assert info.needed[0] == "libmid.so.1"
    assert _rchar() - before < 512 * 1024


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    pytest.skip("no /proc/self/io")


# ---------------------------------------------------------------- bad input
def _bad_files(src: Path, d: Path) -> dict[str, Path]:
    raw = src.read_bytes()
    files: dict[str, Path] = {}
    (d / "empty.so").write_bytes(b"")
    files["empty"] = d / "empty.so"
    (d / "text.so").write_text("INPUT(-lc)\n")
    files["text"] = d / "text.so"
    (d / "random.so").write_bytes(random.Random(1).randbytes(4096))
    files["random"] = d / "random.so"
    (d / "magic-only.so").write_bytes(b"\x7fELF")
    files["magic-only"] = d / "magic-only.so"
    (d / "trunc.so").write_bytes(raw[:40])
    files["truncated header"] = d / "trunc.so"
    (d / "trunc2.so").write_bytes(raw[:4096])
    files["truncated body"] = d / "trunc2.so"
    files["bad class"] = patch(src, d / "badclass.so", 4, b"\x07")
    files["bad data"] = patch(src, d / "baddata.so", 5, b"\x09")
    files["shoff past eof"] = patch(src, d / "shoff.so", 0x28, (10**9).to_bytes(8, "little"))
    files["phoff past eof"] = patch(src, d / "phoff.so", 0x20, (10**9).to_bytes(8, "little"))
    files["absurd shnum"] = patch(src, d / "shnum.so", 0x3C, (0xFFFF).to_bytes(2, "little"))
    files["absurd phnum"] = patch(src, d / "phnum.so", 0x38, (0xFFFF).to_bytes(2, "little"))
    (d / "libdir.so").mkdir()
    files["directory"] = d / "libdir.so"
    (d / "dangling.so").symlink_to(d / "nowhere.so")
    files["dangling"] = d / "dangling.so"
    (d / "loop1.so").symlink_to(d / "loop2.so")
    (d / "loop2.so").symlink_to(d / "loop1.so")
    files["loop"] = d / "loop1.so"
    os.mkfifo(d / "fifo.so")
    files["fifo"] = d / "fifo.so"
    files["device"] = Path("/dev/zero")
    files["missing"] = d / "missing.so"
    return files


_HAS_MAGIC = {
    "magic-only",
    "truncated header",
    "truncated body",
    "bad class",
    "bad data",
    "shoff past eof",
    "phoff past eof",
    "absurd shnum",
    "absurd phnum",
}


def test_every_kind_of_bad_input_is_an_elferror(scen: Scenarios, tmp_path: Path) -> None:
    files = _bad_files(scen.rpath_inherit, tmp_path)
    sock = socket.socket(socket.AF_UNIX)
    sock_path = tmp_path / "sock.so"
    sock.bind(str(sock_path))
    files["socket"] = sock_path
    try:
        for kind, p in files.items():
            with pytest.raises(ElfError) as ei:
                _no_hang(lambda p=p: read_elf(p))
            assert str(p) in str(ei.value), kind
            assert looks_like_elf(p) == (kind in _HAS_MAGIC), kind
    finally:
        sock.close()


def _no_hang(fn: object) -> None:
    result: list[BaseException] = []

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "read_elf blocked"
    if result:
        raise result[0]


def test_unreadable_file(scen: Scenarios, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "libno.so"
    shutil.copyfile(scen.leaf, p)
    p.chmod(0)
    real_open = os.open

    def deny(path: str, *a: int) -> int:  # root ignores mode bits; act as an unprivileged user would
        if str(path) == str(p):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(ElfError, match="cannot open: Permission denied"):
        read_elf(p)
    assert not looks_like_elf(p)


def test_fuzzed_headers_never_raise_anything_else(scen: Scenarios, tmp_path: Path) -> None:
    raw = bytearray(scen.rpath_inherit.read_bytes())
    rng = random.Random(20260)
    p = tmp_path / "libfuzz.so"
    ok = bad = 0
    for _ in range(300):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            region = rng.choice([(0, 64), (64, 64 + 56 * 8), (len(raw) - 64 * 30, len(raw))])
            data[rng.randrange(*region)] = rng.randrange(256)
        p.write_bytes(bytes(data))
        try:
            read_elf(p)
            ok += 1
        except ElfError:
            bad += 1
    assert ok + bad == 300
    assert bad > 0


def test_impossible_path_is_an_elferror() -> None:
    with pytest.raises(ElfError, match="cannot open"):
        read_elf("lib\0nul.so")
    assert not looks_like_elf("lib\0nul.so")


def test_looks_like_elf(scen: Scenarios, tmp_path: Path) -> None:
    assert looks_like_elf(scen.leaf)
    assert looks_like_elf(str(scen.origin_link))  # follows the symlink
    assert not looks_like_elf(tmp_path)


def test_executable_built_here_is_readable(tmp_path: Path) -> None:
    exe = build_exe(tmp_path / "prog")
    assert stat.S_IMODE(exe.stat().st_mode) & 0o100
    assert read_elf(exe).interpreter


@pytest.mark.parametrize("style", ["gnu", "sysv", "both"])
def test_pyinit_with_each_hash_style(tmp_path: Path, style: str) -> None:
    src = "int PyInit_hashmod(void) { return 0; }\n" + "".join(
        f"int f{i}(void) {{ return {i}; }}\n" for i in range(300)
    )
    lib = build_lib(tmp_path / "hashmod.so", source=src, extra=[f"-Wl,--hash-style={style}"])
    assert read_elf(lib).pyinit == "PyInit_hashmod"
    other = tmp_path / "f7.so"  # f7 exists, but as a plain function, not PyInit_f7
    shutil.copyfile(lib, other)
    assert read_elf(other).pyinit is None


def test_hash_lookup_agrees_with_pyelftools() -> None:
    """Differential: our positional hash lookup vs pyelftools' hash-section get_symbol."""
    from elftools.elf.elffile import ELFFile

    base = Path("/usr/lib/x86_64-linux-gnu")
    files = sorted(p for p in base.glob("*.so.*") if p.is_file() and not p.is_symlink() and looks_like_elf(p))
    checked = 0
    for f in files[:: max(1, len(files) // 25)]:
        with open(f, "rb") as fh:
            elf = ELFFile(fh)
            sec = elf.get_section_by_name(".gnu.hash") or elf.get_section_by_name(".hash")
            dynsym = elf.get_section_by_name(".dynsym")
            if sec is None or dynsym is None:
                continue
            syms = [s for s in dynsym.iter_symbols() if s.name][::11][:12]
            names = [s.name for s in syms] + ["surely_not_a_symbol_xyz", "PyInit_nothing"]
            expect = {}
            for n in names:
                got = sec.get_symbol(n)
                expect[n] = got is not None and got["st_shndx"] != "SHN_UNDEF"
        for n in names:
            assert exports(f, n) == expect[n], (f, n)
            checked += 1
    assert checked > 50


def test_exports_errors(tmp_path: Path) -> None:
    (tmp_path / "x.so").write_text("nope")
    with pytest.raises(ElfError, match="not an ELF"):
        exports(tmp_path / "x.so", "f")
