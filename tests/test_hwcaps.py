"""hwcaps: the CPU-dependent search subdirectories of glibc 2.36's ld.so, from (vendor, flags) tables and
against this host's ld.so --help; the first-block /proc/cpuinfo reader."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack import _sysio
from pytest_cudastack._sysio import read_cpuinfo_block
from pytest_cudastack.linker import treecache
from pytest_cudastack.linker.hwcaps import (
    HWCAP_X86_64,
    HWCAP_X86_AVX512_1,
    glibc_hwcaps,
    host_search,
    legacy_components,
    legacy_hwcap_subdirs,
    parse_cpuinfo,
    search_subdirs,
)

LDSO = "/lib64/ld-linux-x86-64.so.2"
needs_ldso = pytest.mark.skipif(
    not os.path.exists(LDSO) or os.uname().machine != "x86_64", reason="needs the x86-64 ld.so"
)

BASE = "fpu cx8 cmov mmx fxsr sse sse2 lm nx"
V2 = "cx16 lahf_lm popcnt pni ssse3 sse4_1 sse4_2"
V3 = "avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"
V4 = "avx512f avx512bw avx512cd avx512dq avx512vl"
INTEL, AMD = "GenuineIntel", "AuthenticAMD"


def flags(*groups: str) -> frozenset[str]:
    return frozenset(" ".join(groups).split())


# the legacy subdirectories ld.so searches, best first, "" (the directory itself) excluded
X86_64_TWICE = (  # AT_PLATFORM x86_64 and the hwcap bit x86_64 (LD_DEBUG=libs on an AMD EPYC)
    "tls/x86_64/x86_64",
    "tls/x86_64",
    "tls/x86_64",
    "tls",
    "x86_64/x86_64",
    "x86_64",
    "x86_64",
)
HASWELL = ("tls/haswell/x86_64", "tls/haswell", "tls/x86_64", "tls", "haswell/x86_64", "haswell", "x86_64")
HASWELL_AVX512_1 = (
    "tls/haswell/avx512_1/x86_64",
    "tls/haswell/avx512_1",
    "tls/haswell/x86_64",
    "tls/haswell",
    "tls/avx512_1/x86_64",
    "tls/avx512_1",
    "tls/x86_64",
    "tls",
    "haswell/avx512_1/x86_64",
    "haswell/avx512_1",
    "haswell/x86_64",
    "haswell",
    "avx512_1/x86_64",
    "avx512_1",
    "x86_64",
)
XEON_PHI = ("tls/xeon_phi/x86_64", "tls/xeon_phi", "tls/x86_64", "tls", "xeon_phi/x86_64", "xeon_phi", "x86_64")
V432 = ("x86-64-v4", "x86-64-v3", "x86-64-v2")


@pytest.mark.parametrize(
    ("machine", "vendor", "cpu_flags", "expect"),
    [
        pytest.param("x86_64", INTEL, flags(BASE, V2, V3), ("haswell", V432[1:], HASWELL), id="intel-haswell"),
        pytest.param(
            "x86_64", INTEL, flags(BASE, V2, V3, V4), ("haswell", V432, HASWELL_AVX512_1), id="intel-avx512_1"
        ),
        pytest.param(  # Knights Landing: AVX512ER and PF, no BW/DQ/VL (so no x86-64-v4 and no avx512_1)
            "x86_64",
            INTEL,
            flags(BASE, V2, V3, "avx512f avx512cd avx512er avx512pf"),
            ("xeon_phi", V432[1:], XEON_PHI),
            id="intel-xeon_phi",
        ),
        pytest.param(  # AVX512ER without PF: neither xeon_phi nor avx512_1; haswell still applies
            "x86_64",
            INTEL,
            flags(BASE, V2, V3, V4, "avx512er"),
            ("haswell", V432, HASWELL),
            id="intel-avx512er-without-pf",
        ),
        pytest.param(  # Westmere: no AVX2, so AT_PLATFORM stays and x86_64 is a component twice
            "x86_64", INTEL, flags(BASE, V2), ("x86_64", V432[2:], X86_64_TWICE), id="intel-pre-haswell"
        ),
        pytest.param(
            "x86_64", AMD, flags(BASE, V2, V3, "sse4a clzero"), ("x86_64", V432[1:], X86_64_TWICE), id="amd-epyc-v3"
        ),
        pytest.param(  # Zen 4: x86-64-v4, but the platform and avx512_1 are Intel's only
            "x86_64", AMD, flags(BASE, V2, V3, V4), ("x86_64", V432, X86_64_TWICE), id="amd-epyc-v4"
        ),
        pytest.param(  # Core 2: no POPCNT, no SSE4.2
            "x86_64", INTEL, flags(BASE, "cx16 lahf_lm pni ssse3"), ("x86_64", (), X86_64_TWICE), id="old-cpu"
        ),
        pytest.param(  # every level needs the baseline too (get_isa_level)
            "x86_64", AMD, flags(V2, V3), ("x86_64", (), X86_64_TWICE), id="no-baseline"
        ),
        pytest.param("x86_64", "", frozenset(), ("x86_64", (), X86_64_TWICE), id="cpuinfo-unreadable"),
        pytest.param("aarch64", "", frozenset({"fp", "asimd", "atomics"}), ("aarch64", (), ()), id="non-x86"),
    ],
)
def test_search_subdirs(
    machine: str, vendor: str, cpu_flags: frozenset[str], expect: tuple[str, tuple[str, ...], tuple[str, ...]]
) -> None:
    assert search_subdirs(machine, vendor, cpu_flags) == expect


@pytest.mark.parametrize(
    ("platform", "hwcap", "mask", "components", "subdirs"),
    [
        pytest.param("x86_64", HWCAP_X86_64, None, ("tls", "x86_64", "x86_64"), X86_64_TWICE, id="amd"),
        pytest.param(
            "haswell",
            HWCAP_X86_64 | HWCAP_X86_AVX512_1,
            None,
            ("tls", "haswell", "avx512_1", "x86_64"),
            HASWELL_AVX512_1,
            id="intel-avx512_1",
        ),
        pytest.param(  # GLRO(dl_platform) NULL (no AT_PLATFORM): tls and the bits only
            None, HWCAP_X86_64, None, ("tls", "x86_64"), ("tls/x86_64", "tls", "x86_64"), id="no-platform"
        ),
        pytest.param(None, 0, None, ("tls",), ("tls",), id="no-platform-no-bits"),
        pytest.param(  # glibc.cpu.hwcap_mask (LD_HWCAP_MASK) without avx512_1
            "haswell", HWCAP_X86_64 | HWCAP_X86_AVX512_1, HWCAP_X86_64, ("tls", "haswell", "x86_64"), HASWELL, id="mask"
        ),
        pytest.param(  # bits outside the names (sse2 is bit 0, i386's) are named too when the mask lets them
            "i686",
            1,
            1,
            ("tls", "i686", "sse2"),
            ("tls/i686/sse2", "tls/i686", "tls/sse2", "tls", "i686/sse2", "i686", "sse2"),
            id="i386-sse2",
        ),
    ],
)
def test_legacy_components_and_subdirs(
    platform: str | None, hwcap: int, mask: int | None, components: tuple[str, ...], subdirs: tuple[str, ...]
) -> None:
    got = legacy_components(platform, hwcap) if mask is None else legacy_components(platform, hwcap, mask)
    assert got == components
    assert legacy_hwcap_subdirs(got) == subdirs


def test_glibc_hwcaps_levels() -> None:
    assert glibc_hwcaps(flags(BASE, V2)) == ("x86-64-v2",)
    assert glibc_hwcaps(flags(BASE, V2, V3)) == ("x86-64-v3", "x86-64-v2")
    assert glibc_hwcaps(flags(BASE, V2, V3, V4)) == V432
    assert glibc_hwcaps(flags(BASE, "sse2")) == ()
    assert glibc_hwcaps(flags(BASE, V2.replace("popcnt", ""), V3)) == ()  # a level needs the ones below
    assert glibc_hwcaps(flags(BASE, V2, V3.replace("bmi2", ""))) == ("x86-64-v2",)  # 2.36 branch: BMI1/2 too
    assert glibc_hwcaps(flags(BASE.replace("cmov", ""), V2, V3)) == ()  # the baseline


def test_parse_cpuinfo_first_block() -> None:
    text = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2\nvmx flags\t: ept\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx512f\n\n"
    )
    assert parse_cpuinfo(text) == ("AuthenticAMD", frozenset({"fpu", "sse2", "avx2"}))
    assert parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd\n") == ("", frozenset())
    assert parse_cpuinfo("") == ("", frozenset())


def test_read_cpuinfo_block_reads_the_first_block_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: " + "x" * 4080 + "\n"
    path = tmp_path / "cpuinfo"
    path.write_text(first + "\nprocessor\t: 1\n" + "y" * (1 << 20) + "\n")
    read = 0
    real_read = os.read

    def counting(fd: int, n: int) -> bytes:
        nonlocal read
        b = real_read(fd, n)
        read += len(b)
        return b

    monkeypatch.setattr(_sysio.os, "read", counting)
    assert read_cpuinfo_block(str(path)) == first  # the blank line straddles the first two reads
    assert read <= 3 * 4096
    monkeypatch.undo()
    path.write_text("processor\t: 0\nflags\t: fpu\n")  # no blank line at all
    assert read_cpuinfo_block(str(path)) == "processor\t: 0\nflags\t: fpu\n"
    assert read_cpuinfo_block(str(tmp_path / "missing")) is None
    assert read_cpuinfo_block(str(tmp_path)) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_cpuinfo_block(str(fifo)) is None  # never blocks on a FIFO


# What the CPUs of the table above decide (platform, glibc-hwcaps levels, legacy subdirectories): the
# candidates a test that swaps in "another CPU" picks from, so that it is another CPU on any host.
OTHER_CPUS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("haswell", V432, HASWELL_AVX512_1),
    ("haswell", V432[1:], HASWELL),
    ("xeon_phi", V432[1:], XEON_PHI),
    ("x86_64", V432[2:], X86_64_TWICE),
    ("x86_64", (), X86_64_TWICE),
)


def other_cpu(
    host: tuple[str, tuple[str, ...], tuple[str, ...]],
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """A CPU's search (``host_search()``'s shape) that differs from ``host``'s."""
    return next(cpu for cpu in OTHER_CPUS if cpu != host)


@pytest.mark.parametrize("host", [*OTHER_CPUS, ("aarch64", (), ())], ids=lambda c: f"{c[0]}-{len(c[1])}")
def test_other_cpu_differs_from_any_host(host: tuple[str, tuple[str, ...], tuple[str, ...]]) -> None:
    assert other_cpu(host) != host


def test_other_cpu_differs_from_this_host() -> None:
    assert other_cpu(host_search()) != host_search()


def test_treecache_key_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The closure cache's environment key holds what the CPU decides, and changes with it."""
    platform, levels, legacy = host = host_search()
    key, _ = treecache.environment_key({})
    assert [platform, list(levels), list(legacy)] in json.loads(key)
    cpu = other_cpu(host)
    monkeypatch.setattr(treecache, "host_search", lambda: cpu)
    other, _ = treecache.environment_key({})
    assert other != key
    assert [cpu[0], list(cpu[1]), list(cpu[2])] in json.loads(other)


# ---------------------------------------------------------------- this host's ld.so as the oracle
def _ld_so_help() -> str:
    return subprocess.run([LDSO, "--help"], capture_output=True, text=True, check=False).stdout


@needs_ldso
def test_glibc_hwcaps_match_ld_so_help() -> None:
    """ld.so --help lists the glibc-hwcaps subdirectories this CPU supports."""
    block = _ld_so_help().split("Subdirectories of glibc-hwcaps directories, in priority order:", 1)
    if len(block) < 2:
        pytest.skip("this ld.so prints no glibc-hwcaps list")
    supported = tuple(re.findall(r"^\s+(x86-64-v\d) \(supported, searched\)", block[1], re.M))
    assert host_search()[1] == supported


@needs_ldso
def test_legacy_components_match_ld_so_help() -> None:
    """ld.so --help (dl-usage.c print_legacy_hwcap_directories) names AT_PLATFORM, tls and the searched
    hwcap bits, highest first: our components, with tls first."""
    block = _ld_so_help().split("Legacy HWCAP subdirectories under library search path directories:", 1)
    if len(block) < 2:
        pytest.skip("this ld.so has no legacy hwcap subdirectories (glibc >= 2.37)")
    platform: list[str] = []
    bits: list[str] = []
    for line in block[1].strip("\n").split("\n"):
        if not line.strip():
            break
        name, _, state = line.strip().partition(" ")
        if "AT_PLATFORM" in state:
            platform.append(name)
        elif name != "tls" and "searched" in state:
            bits.append(name)
    ours_platform, _levels, legacy = host_search()
    assert platform == [ours_platform]
    assert legacy == legacy_hwcap_subdirs(("tls", *platform, *bits))
