"""elf.read_elf: declared facts of real gcc-built files, and an ElfError for every kind of bad input."""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_cudastack.errors import ElfError
from pytest_cudastack.linker.elf import (
    CUDA_SECTIONS,
    ElfInfo,
    VersionNeed,
    _read_elf_fast,
    _read_elf_pyelftools,
    exports,
    looks_like_elf,
    machine_name,
    read_elf,
)
from tests.helpers.elfbuild import Scenarios, build_exe, build_lib, get_scenarios, needs_cc, patch, synth_elf

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


def test_pyelftools_pin_covers_the_private_accessors() -> None:
    """elf.py reads bare headers through pyelftools' private accessors (its public get_section/get_segment
    build Section objects, parsing whole hash tables): pyproject.toml closes the range above, and the
    installed release is in it and has them."""
    tomllib = pytest.importorskip("tomllib")
    from importlib.metadata import version

    from elftools.elf.elffile import ELFFile
    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    (pin,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "pyelftools"]
    assert any(s.operator == "<" for s in pin.specifier), pin
    assert pin.specifier.contains(version("pyelftools")), (pin, version("pyelftools"))
    for name in ("_get_section_header", "_get_segment_header", "_get_section_name"):
        assert callable(getattr(ELFFile, name, None)), name


def test_exports_errors(tmp_path: Path) -> None:
    (tmp_path / "x.so").write_text("nope")
    with pytest.raises(ElfError, match="not an ELF"):
        exports(tmp_path / "x.so", "f")


# ---------------------------------------------------------------- fast reader vs pyelftools
def _agree(path: Path | str) -> ElfInfo | None:
    """The fast reader declines (None) or gives exactly what pyelftools gives; an identification error is
    the same error from both."""
    try:
        fast = _read_elf_fast(path)
    except ElfError as e:
        with pytest.raises(ElfError, match=re.escape(str(e))):
            _read_elf_pyelftools(path)
        return None
    if fast is None:
        return None
    assert fast == _read_elf_pyelftools(path), path
    return fast


def test_fast_reader_agrees_on_gcc_fixtures(scen: Scenarios, cuda_lib: Path, tmp_path: Path) -> None:
    patched = {scen.base / "wc" / "libwc.so"}  # EI_CLASS rewritten: the 64-bit tables no longer parse
    files = [p for p in scen.base.rglob("*") if p.is_file() and looks_like_elf(p) and p not in patched]
    assert len(files) > 20
    for style in ("gnu", "sysv", "both"):
        files.append(
            build_lib(
                tmp_path / f"h{style}.so", source="int PyInit_h(void){return 0;}", extra=[f"-Wl,--hash-style={style}"]
            )
        )
    files += [cuda_lib, build_exe(tmp_path / "prog")]
    answered = [p for p in files if _agree(p) is not None]
    assert len(answered) == len(files)  # well-formed files never need pyelftools


def test_fast_reader_agrees_on_system_libraries() -> None:
    base = Path("/usr/lib/x86_64-linux-gnu")
    files = sorted(p for p in base.glob("*.so*") if p.is_file() and not p.is_symlink() and looks_like_elf(p))
    if len(files) < 10:
        pytest.skip("no system library sample")
    sample = files[:: max(1, len(files) // 60)] + [Path(p) for p in ("/usr/bin/ls", "/bin/sh") if os.path.exists(p)]
    assert all(_agree(p) is not None for p in sample)


@pytest.mark.parametrize("elf_class", [32, 64])
@pytest.mark.parametrize("little", [True, False], ids=["le", "be"])
@pytest.mark.parametrize("sections", [True, False], ids=["sections", "no-sections"])
def test_fast_reader_every_class_and_byte_order(tmp_path: Path, elf_class: int, little: bool, sections: bool) -> None:
    p = synth_elf(
        tmp_path / "synth.cpython-311.so",
        elf_class=elf_class,
        little=little,
        machine=3 if elf_class == 32 else 62,
        needed=("libc.so.6", "libm.so.6"),
        rpath="$ORIGIN/../lib::x",
        runpath="/opt/r",
        nodeflib=True,
        interpreter="/lib/ld-linux.so.2",
        verneed=[("libc.so.6", ("GLIBC_2.0", "GLIBC_2.1")), ("libm.so.6", ("GLIBC_2.2",))],
        sections=sections,
        extra_sections=(".nv_fatbin", "__nv_relfatbin"),
        pyinit="synth",
    )
    info = _agree(p)
    assert info is not None
    assert (info.elf_class, info.little_endian, info.machine) == (elf_class, little, 3 if elf_class == 32 else 62)
    assert info.needed == ("libc.so.6", "libm.so.6")
    assert info.soname == "libsynth.so.1"
    assert info.rpath == ("$ORIGIN/../lib", "", "x")
    assert info.runpath == ("/opt/r",)
    assert info.nodeflib
    assert info.interpreter == "/lib/ld-linux.so.2"
    if sections:  # without section headers there is no verneed section, no hash section, no names
        assert info.version_needs == (
            VersionNeed("libc.so.6", ("GLIBC_2.0", "GLIBC_2.1")),
            VersionNeed("libm.so.6", ("GLIBC_2.2",)),
        )
        assert info.cuda_sections == (".nv_fatbin", "__nv_relfatbin")
        assert info.pyinit == "PyInit_synth"
        assert exports(p, "PyInit_synth")
        assert not exports(p, "PyInit_other")
    else:
        assert (info.version_needs, info.cuda_sections, info.pyinit) == ((), (), None)


def test_fast_reader_fuzzed_agrees_or_declines(scen: Scenarios, tmp_path: Path) -> None:
    """Corrupt headers, tables and strings: where the fast reader answers, pyelftools answers the same."""
    from elftools.elf.elffile import ELFFile

    src = scen.rpath_inherit
    raw = src.read_bytes()
    with open(src, "rb") as f:
        elf = ELFFile(f)
        regions = [
            (0, 64),
            (elf["e_phoff"], elf["e_phoff"] + elf["e_phnum"] * elf["e_phentsize"]),
            (elf["e_shoff"], elf["e_shoff"] + elf["e_shnum"] * elf["e_shentsize"]),
        ]
        for sec in elf.iter_sections():
            if sec.name in (".dynamic", ".dynstr", ".gnu.version_r", ".shstrtab", ".gnu.hash", ".interp"):
                regions.append((sec["sh_offset"], sec["sh_offset"] + min(sec["sh_size"], 4096)))
    rng = random.Random(4242)
    p = tmp_path / "libfuzz.so"
    answered = declined = 0
    for _ in range(400):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 6)):
            lo, hi = rng.choice(regions)
            data[rng.randrange(lo, hi)] = rng.choice([0, 1, 0xFF, rng.randrange(256)])
        if rng.random() < 0.05:
            data = data[: rng.randrange(len(data))]
        p.write_bytes(bytes(data))
        if _agree(p) is None:
            declined += 1
        else:
            answered += 1
    assert answered > 100
    assert declined > 20


def test_fast_reader_declines_to_pyelftools_for_the_error(scen: Scenarios, tmp_path: Path) -> None:
    bad = patch(scen.rpath_inherit, tmp_path / "shoff.so", 0x28, (10**9).to_bytes(8, "little"))
    assert _read_elf_fast(bad) is None
    with pytest.raises(ElfError, match="section header table past end of file"):
        read_elf(bad)


def test_fast_path_never_imports_pyelftools(scen: Scenarios, tmp_path: Path) -> None:
    code = (
        "import sys\nfrom pytest_cudastack.linker.elf import exports\n"
        "from pytest_cudastack.linker.elfcache import ElfCache\n"
        f"c = ElfCache({str(tmp_path / 'c')!r}, enabled=True)\n"
        f"info = c.read({str(scen.leaf)!r}); c.flush()\n"
        f"assert exports({str(scen.leaf)!r}, 'PyInit_libleaf')\n"
        "assert 'elftools' not in sys.modules, 'pyelftools imported'\n"
        "print(info.soname)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "libleaf.so.1"


@pytest.mark.real
def test_fast_reader_agrees_on_the_torch_venv() -> None:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("CUDASTACK_TORCH_VENV unset or absent")
    files = [
        os.path.join(d, f)
        for d, _dirs, names in os.walk(venv)
        for f in names
        if not os.path.islink(os.path.join(d, f)) and looks_like_elf(os.path.join(d, f))
    ]
    assert len(files) >= 100
    for f in files:
        assert _agree(f) is not None, f  # real wheels never need the fallback
