"""The CPU-dependent subdirectories glibc's ld.so searches in every library directory, as glibc 2.36 builds them.

ld.so asks CPUID; we read the kernel's account of it, the first processor block of ``/proc/cpuinfo``
(:func:`parse_cpuinfo`: ``vendor_id`` and ``flags``). A flag listed there stands for glibc's
``CPU_FEATURE_USABLE_P``: the kernel drops the flags of features whose register state it does not enable
(AVX and AVX-512 without their XSAVE state), as glibc's ``update_active`` does. From these facts:

* the **glibc-hwcaps levels** (:func:`glibc_hwcaps`): ``sysdeps/x86_64/dl-hwcaps-subdirs.c``
  ``_dl_hwcaps_subdirs_active`` over ``sysdeps/x86/get-isa-level.h`` ``get_isa_level`` (the 2.36 release
  branch, which Debian 12 ships: x86-64-v3 needs BMI1 and BMI2 too); a level counts only with every level
  below it, and ``glibc-hwcaps/x86-64-v4`` ... ``v2`` are searched best first;
* **AT_PLATFORM and the hwcap word** (:func:`x86_64_platform_hwcap`): ``sysdeps/x86/cpu-features.c``
  ``init_cpu_features`` sets ``GLRO(dl_hwcap) = HWCAP_X86_64`` on every x86-64 CPU and, on Intel only,
  adds ``HWCAP_X86_AVX512_1`` (AVX512CD without AVX512ER, and AVX512BW, DQ, VL) and replaces
  ``GLRO(dl_platform)`` (the kernel's AT_PLATFORM, ``x86_64``) by ``xeon_phi`` (AVX512CD, ER and PF) or
  ``haswell`` (AVX2, FMA, BMI1, BMI2, LZCNT, MOVBE, POPCNT). Elsewhere (AMD, Hygon, Zhaoxin, an older
  Intel) the platform stays ``x86_64``, so ``x86_64`` is a component twice: as the platform and as the
  hwcap bit;
* the **legacy hwcap subdirectories** (:func:`legacy_components`, :func:`legacy_hwcap_subdirs`):
  ``elf/dl-hwcaps.c`` ``_dl_important_hwcaps`` builds its components as the names of the bits of
  ``GLRO(dl_hwcap) & hwcap_mask`` (``sysdeps/x86/dl-hwcap.h``: ``HWCAP_IMPORTANT`` =
  ``HWCAP_X86_64 | HWCAP_X86_AVX512_1`` on x86-64, the ``glibc.cpu.hwcap_mask`` tunable's default;
  names from ``sysdeps/x86/dl-procinfo.c`` ``_dl_x86_hwcap_flags``), lowest bit first, then
  ``GLRO(dl_platform)`` when not NULL, then ``tls`` (always), and searches the power set of them,
  ``tls`` outermost: on an AMD EPYC ``tls/x86_64/x86_64``, ``tls/x86_64``, ``tls/x86_64`` (again: the
  platform, then the bit), ``tls``, ``x86_64/x86_64``, ``x86_64``, ``x86_64``; on an AVX-512 Intel
  ``tls/haswell/avx512_1/x86_64`` ... ``x86_64``. ``elf/dl-load.c`` ``_dl_init_paths`` takes this list
  (``capstr``) for every search directory (``fillin_rpath``), glibc-hwcaps first, the directory itself
  (the empty subdirectory) last; ``open_path`` tries each entry, duplicates included.

glibc 2.37 removed the legacy subdirectories; this module models 2.36. Other architectures are not
modelled (:func:`search_subdirs` gives them their machine name as the platform and no subdirectories),
nor are ``LD_HWCAP_MASK``/``GLIBC_TUNABLES`` and ``--glibc-hwcaps-prepend``/``--glibc-hwcaps-mask``.

This module is on ``cudastack tree``'s warm path (the closure cache's environment key): it imports only
``functools``, ``os`` and ``_sysio``, so its results are tuples, not dataclasses.
"""

from __future__ import annotations

import functools
import os

from pytest_cudastack._sysio import read_cpuinfo_block

__all__ = [
    "HWCAP_IMPORTANT",
    "HWCAP_X86_64",
    "HWCAP_X86_AVX512_1",
    "X86_64_LEVELS",
    "glibc_hwcaps",
    "host_search",
    "legacy_components",
    "legacy_hwcap_subdirs",
    "parse_cpuinfo",
    "search_subdirs",
    "x86_64_platform_hwcap",
]

# sysdeps/x86/dl-hwcap.h: the x86 hwcap bits, their names (dl-procinfo.c _dl_x86_hwcap_flags, by bit
# number) and the bits x86-64's ld.so searches legacy subdirectories for
HWCAP_X86_SSE2 = 1 << 0
HWCAP_X86_64 = 1 << 1
HWCAP_X86_AVX512_1 = 1 << 2
HWCAP_IMPORTANT = HWCAP_X86_64 | HWCAP_X86_AVX512_1
_HWCAP_NAMES = ("sse2", "x86_64", "avx512_1")

# get_isa_level's features, as /proc/cpuinfo names them (CMPXCHG16B: cx16, LAHF64_SAHF64: lahf_lm,
# SSE3: pni, LZCNT: abm); the baseline is no subdirectory, but each level needs it
_X86_64_BASELINE = frozenset({"cmov", "cx8", "fpu", "fxsr", "mmx", "sse", "sse2"})
X86_64_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("x86-64-v2", frozenset({"cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2"})),
    ("x86-64-v3", frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"})),
    ("x86-64-v4", frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
)
_HASWELL = frozenset({"avx2", "fma", "bmi1", "bmi2", "abm", "movbe", "popcnt"})
_AVX512_1 = frozenset({"avx512bw", "avx512dq", "avx512vl"})


def parse_cpuinfo(block: str) -> tuple[str, frozenset[str]]:
    """(vendor_id, flags) of the first processor block of /proc/cpuinfo text; ("", frozenset()) for what
    is missing (other architectures name neither)."""
    vendor = ""
    flags: frozenset[str] = frozenset()
    for line in block.split("\n"):
        if not line.strip():
            break  # the end of the first processor's block
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id":
            vendor = value.strip()
        elif key == "flags":
            flags = frozenset(value.split())
    return vendor, flags


def glibc_hwcaps(flags: frozenset[str]) -> tuple[str, ...]:
    """The glibc-hwcaps subdirectories a CPU with *flags* has ld.so search, best first
    (``_dl_hwcaps_subdirs_active``: a level only with every level below it)."""
    if not flags >= _X86_64_BASELINE:
        return ()
    levels: list[str] = []
    for name, need in X86_64_LEVELS:
        if not flags >= need:
            break
        levels.append(name)
    return tuple(reversed(levels))


def x86_64_platform_hwcap(
    vendor: str, flags: frozenset[str], at_platform: str | None = "x86_64"
) -> tuple[str | None, int]:
    """``(GLRO(dl_platform), GLRO(dl_hwcap))`` after ``init_cpu_features`` on x86-64; *at_platform* is the
    kernel's AT_PLATFORM (``x86_64`` for every 64-bit process)."""
    hwcap = HWCAP_X86_64
    platform = at_platform
    if vendor == "GenuineIntel":  # cpu_features->basic.kind == arch_kind_intel
        chosen: str | None = None
        if "avx512cd" in flags:
            if "avx512er" in flags:
                if "avx512pf" in flags:
                    chosen = "xeon_phi"
            elif flags >= _AVX512_1:
                hwcap |= HWCAP_X86_AVX512_1
        if chosen is None and flags >= _HASWELL:
            chosen = "haswell"
        if chosen is not None:
            platform = chosen
    return platform, hwcap


def legacy_components(platform: str | None, hwcap: int, hwcap_mask: int = HWCAP_IMPORTANT) -> tuple[str, ...]:
    """The components of the legacy subdirectories, outermost first: ``tls``, the platform (when not
    None), the names of the bits of ``hwcap & hwcap_mask`` from the highest bit down. That is
    ``_dl_important_hwcaps``' ``temp`` array (bits from the lowest, the platform, ``tls``) reversed, the
    order the components appear in a path."""
    masked = hwcap & hwcap_mask
    bits = [_HWCAP_NAMES[n] for n in range(len(_HWCAP_NAMES)) if masked & (1 << n)]
    return ("tls", *((platform,) if platform is not None else ()), *reversed(bits))


def legacy_hwcap_subdirs(components: tuple[str, ...]) -> tuple[str, ...]:
    """The legacy hwcap subdirectories in ``_dl_important_hwcaps``' order, the final "" (the directory
    itself) excluded. *components* outermost first, as :func:`legacy_components` gives them.

    Entry k (k = 0 .. 2**n - 2) holds the components whose bit is set in ``2**n - 1 - k``, the first
    component being the highest bit: glibc's power set construction, where entry k's length sums the
    ``temp[i]`` with bit i set in the same mask and ``temp[n - 1]`` is ``tls``. Equal names give equal
    entries, and glibc keeps both (so does this list)."""
    n = len(components)
    out: list[str] = []
    for k in range((1 << n) - 1):
        mask = (1 << n) - 1 - k
        out.append("/".join(c for i, c in enumerate(components) if mask & (1 << (n - 1 - i))))
    return tuple(out)


def search_subdirs(machine: str, vendor: str, flags: frozenset[str]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """``(platform, glibc-hwcaps levels, legacy subdirectories)`` that ld.so on *machine* (``uname -m``)
    uses for a CPU with *vendor* and *flags*: the value of ``$PLATFORM``, the ``glibc-hwcaps/<level>``
    subdirectories best first, and the legacy subdirectories best first ("" excluded). Every search
    directory is tried with ``glibc-hwcaps/<level>/`` for each level, then each legacy subdirectory, then
    the directory itself."""
    if machine != "x86_64":
        return machine, (), ()
    platform, hwcap = x86_64_platform_hwcap(vendor, flags)
    legacy = legacy_hwcap_subdirs(legacy_components(platform, hwcap))
    return platform or "", glibc_hwcaps(flags), legacy


@functools.lru_cache(maxsize=1)
def host_search() -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """:func:`search_subdirs` for this machine (``os.uname().machine`` and the first processor block of
    /proc/cpuinfo), computed once per process: a process does not change CPU model, and an ld.so.cache
    lookup without explicit levels asks for every library."""
    vendor, flags = parse_cpuinfo(read_cpuinfo_block() or "")
    return search_subdirs(os.uname().machine, vendor, flags)
