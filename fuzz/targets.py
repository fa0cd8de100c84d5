"""What each fuzz target feeds its parser, and what it may answer (issue #14, Deliver 7).

A target is a seed corpus (well-formed inputs the mutators start from) and a ``check(data, scratch)``
that runs the parser on one mutated input and returns None when the parser kept its contract, else a
one-line description of the violation. The contract is the one each parser documents: its
CudaStackError subclass is the only exception that may leave it (MemoryError and RecursionError
included); for the ELF reader, where the fast reader and pyelftools both answer, the answers are equal.
Anything else that escapes is caught by the runner and counted as uncaught.

The regression tests (tests/test_robust_fuzz.py) run every saved reproducer through the same checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from pytest_cudastack import stack
from pytest_cudastack.checks.baseline import baseline_findings, snapshot_drift
from pytest_cudastack.cli.loaded import parse_report
from pytest_cudastack.errors import DataError, ElfError, LdCacheError
from pytest_cudastack.linker import elf
from pytest_cudastack.linker.elfcache import CACHE_FILE, ElfCache
from pytest_cudastack.linker.fatbin import read_fatbin
from pytest_cudastack.linker.ldcache import parse_ld_cache, read_ld_cache
from pytest_cudastack.linker.symbols import SymbolFacts, read_symbols
from pytest_cudastack.linker.treecache import CACHE_FILE as TREE_FILE
from pytest_cudastack.linker.treecache import TreeCache
from pytest_cudastack.stack import load_snapshot
from pytest_cudastack.wheels.distinfo import metadata_headers, name_version, parse_record

__all__ = ["TARGETS", "Target", "mutate_json"]

Check = Callable[[bytes, Path], "str | None"]
Structured = Callable[[bytes, random.Random], "bytes | None"]


@dataclass(frozen=True)
class Target:
    name: str
    seeds: Callable[[Path], list[bytes]]
    check: Check
    structured: Structured | None = None  # a mutator that knows the input's structure (JSON documents)


_ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**64, 10**30, 1.5, float("inf"), "", "libc.so.6", "x" * 300,
    "\x1b[2J", [], {}, [1, "a", None], {"a": 1}, [[[[[]]]]], ["libc.so.6"], {"needed": "libc.so.6"},
]  # fmt: skip


def mutate_json(value: Any, rng: random.Random) -> Any:
    """*value* with one node replaced, deleted, duplicated or given a new key, or nested deeply."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        k = rng.choice(list(value))
        op = rng.random()
        if op < 0.1:
            return {kk: v for kk, v in value.items() if kk != k}
        if op < 0.2:
            return {
                **value,
                rng.choice(["extra", "info", "error", "key", "row", "deps", k + "x"]): rng.choice(_ODD_VALUES),
            }
        return {**value, k: mutate_json(value[k], rng)}
    if isinstance(value, list) and value and rng.random() < 0.7:
        i = rng.randrange(len(value))
        op = rng.random()
        if op < 0.1:
            return value[:i] + value[i + 1 :]
        if op < 0.2:
            return [*value, value[i]]
        return [*value[:i], mutate_json(value[i], rng), *value[i + 1 :]]
    if rng.random() < 0.03:
        deep: Any = value
        for _ in range(rng.choice([10, 100, 500])):
            deep = [deep]
        return deep
    return rng.choice(_ODD_VALUES)


def _dumps(doc: Any, rng: random.Random) -> bytes | None:
    """The mutant's text; now and then nested deeper than the json module can encode or decode."""
    try:
        text = json.dumps(doc)
    except (ValueError, RecursionError):
        return None
    if rng.random() < 0.02:
        n = rng.choice([2000, 100_000])
        text = "[" * n + text + "]" * n
    return text.encode()


def _structured_elfcache(data: bytes, rng: random.Random) -> bytes | None:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return _dumps(mutate_json(doc, rng), rng)


def _structured_treecache(data: bytes, rng: random.Random) -> bytes | None:
    """A mutant of the header (or of the rows) under a checksum that holds ("!": the check adds it)."""
    body = data.partition(b"\n")[2]
    header, _, blob = body.partition(b"\n")
    try:
        doc = json.loads(header)
    except (ValueError, RecursionError):
        return None
    if rng.random() < 0.3 and blob:
        i = rng.randrange(len(blob))
        blob = blob[:i] + rng.choice([b'"', b"}", b"]", b",", b'{"x":1}', b"\n", b"\\"]) + blob[i + 1 :]
    else:
        doc = mutate_json(doc, rng)
    text = _dumps(doc, rng)
    return None if text is None else b"!" + text + b"\n" + blob


# ------------------------------------------------------------------------------------------------ ELF
def _elf_seeds(work: Path) -> list[bytes]:
    from tests.helpers.elfbuild import CC, build_lib, synth_elf

    out: list[bytes] = []
    for cls in (32, 64):
        for little in (True, False):
            for sections in (True, False):
                p = synth_elf(
                    work / f"s{cls}{little}{sections}.so",
                    elf_class=cls,
                    little=little,
                    rpath="$ORIGIN/../lib:/opt/x",
                    runpath=None if sections else "/r",
                    interpreter="/lib64/ld-linux-x86-64.so.2" if sections else None,
                    verneed=[("libc.so.6", ["GLIBC_2.2.5", "GLIBC_2.14"])],
                    sections=sections,
                    extra_sections=(".nv_fatbin",),
                    pyinit="seed",
                )
                out.append(p.read_bytes())
    if CC is not None:
        src = "int PyInit_seed(void) { return 0; }\n" + "".join(f"int f{i}(void) {{ return {i}; }}\n" for i in range(8))
        for style in ("gnu", "sysv"):
            lib = build_lib(work / f"gcc-{style}" / "seed.so", source=src, extra=[f"-Wl,--hash-style={style}"])
            out.append(lib.read_bytes())
    return out


def _elf_outcome(reader: Callable[[str], object], path: str) -> object:
    try:
        return reader(path)
    except ElfError as e:
        return e


def _check_elf(data: bytes, scratch: Path) -> str | None:
    path = scratch / "seed.so"  # the module name "seed" makes the readers look up PyInit_seed
    path.write_bytes(data)
    p = str(path)
    fast = _elf_outcome(elf._read_elf_fast, p)
    ref = _elf_outcome(elf._read_elf_pyelftools, p)
    _elf_outcome(elf.read_elf, p)
    with contextlib.suppress(ElfError):
        elf.exports(p, "f1")
    if isinstance(fast, elf.ElfInfo) and isinstance(ref, elf.ElfInfo) and fast != ref:
        return f"readers disagree: fast {fast} != pyelftools {ref}"
    if isinstance(fast, elf.ElfInfo) and isinstance(ref, ElfError):
        return f"fast reader answered where pyelftools raised {ref}"
    if isinstance(fast, ElfError) and isinstance(ref, elf.ElfInfo):
        return f"fast reader raised {fast} where pyelftools answered"
    return _memory(fast) or _memory(ref)


def _memory(outcome: object) -> str | None:
    """A parser's MemoryError is converted to its error: seen here, it means the input needed > 2 GB."""
    if isinstance(outcome, Exception) and "MemoryError" in str(outcome):
        return f"over the memory limit: {outcome}"
    return None


# ----------------------------------------------------------------------------------------- ld.so.cache
def _ldcache_seeds(work: Path) -> list[bytes]:
    def new(entries: list[tuple[str, str, int, int]], hwcaps: list[str]) -> bytes:
        strings = bytearray()
        offsets: dict[str, int] = {}
        header_len = 48 + 24 * len(entries)

        def s(x: str) -> int:
            if x not in offsets:
                offsets[x] = header_len + len(strings)
                strings.extend(x.encode() + b"\0")
            return offsets[x]

        body = b"".join(struct.pack("<iIIIQ", fl, s(so), s(p), 0, hw) for so, p, fl, hw in entries)
        hw_idx = [s(h) for h in hwcaps]
        data = bytearray(header_len + len(strings))
        data[48 : 48 + len(body)] = body
        data[header_len:] = strings
        ext = 0
        if hwcaps:
            while len(data) % 4:
                data.append(0)
            ext = len(data)
            arr = ext + 8 + 32
            data += struct.pack("<II", 0xEAA42174, 2) + struct.pack("<IIII", 1, 0, arr, 4 * len(hw_idx))
            gen = b"ldconfig (GNU libc) 2.39"
            data += struct.pack("<IIII", 0, 0, arr + 4 * len(hw_idx), len(gen))
            data += b"".join(struct.pack("<I", i) for i in hw_idx) + gen
        hdr = b"glibc-ld.so.cache1.1" + struct.pack("<II", len(entries), len(strings)) + bytes([2, 0, 0, 0])
        hdr += struct.pack("<IIII", ext, 0, 0, 0)
        data[:48] = hdr
        return bytes(data)

    entries = [
        ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", 0x303, 0),
        ("libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6", 0x303, 0),
        ("libz.so.1", "/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libz.so.1", 0x303, (1 << 62) | 0),
        ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0x303, 0),
    ]
    old = b"ld.so-1.7.0\0" + struct.pack("<I", 1) + struct.pack("<iII", 0x303, 0, 10) + b"libc.so.6\0/lib/libc.so\0"
    seeds = [new(entries, ["x86-64-v3", "x86-64-v2"]), new(entries[:2], []), old]
    pad = (len(old) + 7) & ~7
    seeds.append(old + bytes(pad - len(old)) + new(entries[:2], []))
    system = Path("/etc/ld.so.cache")
    if system.is_file() and system.stat().st_size < 256 << 10:
        seeds.append(system.read_bytes())
    return seeds


def _check_ldcache(data: bytes, scratch: Path) -> str | None:
    try:
        cache = parse_ld_cache(data, "<fuzz>")
        for e in cache.entries[:64]:
            cache.lookup(e.soname)
    except LdCacheError as e:
        return _memory(e)
    if len(data) % 7 == 0:  # through the file reader too, now and then
        path = scratch / "ld.so.cache"
        path.write_bytes(data)
        try:
            read_ld_cache(str(path))
        except LdCacheError as e:
            return _memory(e)
    return None


# ------------------------------------------------------------------------------------ RECORD/METADATA
_RECORD = (
    "pkg/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n"
    "pkg/libx.so.1,sha256=AAAA,123\n"
    '"pkg/with,comma.so",sha256=BBBB,5\n'
    "../../bin/tool,,\n"
    "pkg-1.0.dist-info/RECORD,,\n"
)
_METADATA = (
    "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\nRequires-Dist: nvidia-cublas-cu12 (>=12.1); "
    'platform_system == "Linux"\nSummary: a\n  folded line\n\nlong description\n'
)


def _distinfo_seeds(work: Path) -> list[bytes]:
    return [
        b"R" + _RECORD.encode(),
        b"M" + _METADATA.encode(),
        b"M" + _METADATA.replace("\n", "\r\n").encode(),
        b"R" + _RECORD.replace(",0\n", ",0\r\n").encode(),
    ]


def _check_distinfo(data: bytes, scratch: Path) -> str | None:
    text = data[1:].decode("utf-8", "surrogateescape")
    parse_record(text, lambda p, h, s: (p, h, s))
    headers = metadata_headers(text)
    name_version(headers, "pkg-1.0.dist-info")
    return None


# --------------------------------------------------------------------------------------------- fatbin
def _container(entries: list[tuple[int, int, int]]) -> bytes:
    body = b""
    for kind, arch, flags in entries:
        payload = b"\x11" * 16
        hdr = bytearray(0x40)
        struct.pack_into("<HHIQ", hdr, 0, kind, 0x101, 0x40, len(payload))
        struct.pack_into("<I", hdr, 0x1C, arch)
        struct.pack_into("<Q", hdr, 0x28, flags)
        body += bytes(hdr) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _fatbin_seeds(work: Path) -> list[bytes]:
    from tests.helpers.elfbuild import CC, build_lib

    c1 = _container([(2, 80, 0), (2, 90, 0x100000), (1, 90, 0x2000)])
    c2 = _container([(2, 120, 0x200000), (1, 75, 0x8000)])
    seeds = [c1, c1 + bytes(8) + c2]
    if CC is not None:

        def arr(name: str, data: bytes, section: str | None) -> str:
            attr = f'__attribute__((section("{section}"), used)) ' if section else "__attribute__((used)) "
            return f"{attr}const unsigned char {name}[{len(data)}] = {{{','.join(str(b) for b in data)}}};\n"

        src = arr("fb", c1 + bytes(8) + c2, ".nv_fatbin") + arr("ro", bytes(24) + c2 + bytes(7), None)
        seeds.append(build_lib(work / "fatbin" / "libfb.so", source=src).read_bytes())
    return seeds


def _check_fatbin(data: bytes, scratch: Path) -> str | None:
    path = scratch / "libfb.so"
    path.write_bytes(data)
    try:
        fb = read_fatbin(path)
        _ = (fb.sass, fb.ptx)
    except ElfError as e:
        return _memory(e)
    return None


# ------------------------------------------------------------------------------------------ the caches
def _libs(work: Path) -> list[Path]:
    from tests.helpers.elfbuild import synth_elf

    return [
        synth_elf(work / "libs" / "liba.so.1", needed=("libc.so.6",), soname="liba.so.1"),
        synth_elf(work / "libs" / "libb.so.1", needed=("liba.so.1",), soname="libb.so.1", rpath="$ORIGIN"),
    ]


def _elfcache_seeds(work: Path) -> list[bytes]:
    (work / "libs").mkdir(parents=True, exist_ok=True)
    libs = _libs(work)
    (work / "libs" / "libbad.so").write_bytes(b"not an ELF file")
    d = work / "elfcache-seed"
    d.mkdir(mode=0o700, exist_ok=True)
    c = ElfCache(str(d), enabled=True)
    for p in [*libs, work / "libs" / "libbad.so"]:
        with contextlib.suppress(ElfError):
            c.read(str(p))
    c.put_extra("owners", {"x": ["pkg", "1.0"]})
    c.flush()
    return [(d / CACHE_FILE).read_bytes()]


def _cache_dir(scratch: Path, name: str) -> Path:
    d = scratch / name
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def _check_elfcache(data: bytes, scratch: Path) -> str | None:
    d = _cache_dir(scratch, "elfcache")
    (d / CACHE_FILE).write_bytes(data)
    os.chmod(d / CACHE_FILE, 0o600)
    c = ElfCache(str(d), enabled=True)
    libs = sorted((scratch.parent / "work" / "libs").glob("lib*"))
    for p in libs:
        try:
            got = c.read(str(p))
        except ElfError:
            continue
        if not (isinstance(got, elf.ElfInfo) and all(type(n) is str for n in got.needed)):
            return f"cache answered a malformed ElfInfo {got!r}"
    c.get_extra("owners")
    c.flush()
    return None


def _treecache_seeds(work: Path) -> list[bytes]:
    libs = _libs(work)
    d = work / "treecache-seed"
    d.mkdir(mode=0o700, exist_ok=True)
    t = TreeCache(str(d), "env")
    for p in libs:
        row = json.dumps(
            {
                "path": str(p),
                "libraries": [
                    {"soname": "libc.so.6", "path": "/lib/libc.so.6", "needed_by": [str(p)], "provider": None}
                ],
            }
        )
        t.store(str(p), row, False, [], {"s" + str(p), "c"}, "ctx", time.time_ns() + 10**12)
    t.flush()
    return [(d / TREE_FILE).read_bytes()]


def _check_treecache(data: bytes, scratch: Path) -> str | None:
    d = _cache_dir(scratch, "treecache")
    if data[:1] == b"!":  # the runner's JSON-aware mutants: give them a valid checksum
        body = data[1:]
        data = b"%08x\n" % zlib.crc32(body) + body
    (d / TREE_FILE).write_bytes(data)
    os.chmod(d / TREE_FILE, 0o600)
    t = TreeCache(str(d), "env")
    libs = [str(p) for p in sorted((scratch.parent / "work" / "libs").glob("lib*.so.1"))]
    for root, e in t.lookup(libs).items():
        d_ = json.loads(e["row"])  # printed as is: it must be one JSON value of the row's shape
        if not (isinstance(d_, dict) and d_.get("path") == root):
            return f"tree cache returned a row of another shape: {e['row'][:200]!r}"
        t.paths_of(e)
        t.ctx_of(e)
        if not all(isinstance(k, str) for k in t.deps_of(e)):  # tree --json's warm path under another --site
            return f"a hit's dependencies are not keys: {e['deps']!r:.200}"
    t.store(libs[0], json.dumps({"path": libs[0], "libraries": []}), False, [], {"c"}, None, time.time_ns() + 10**12)
    # a dependency whose value changed prunes the rows that read it, whatever shape another run gave them
    t.store(libs[-1], json.dumps({"path": libs[-1], "libraries": []}), False, [], {"s" + libs[-1]}, None, 0)
    t.flush()
    return None


# ------------------------------------------------------------------------------------------ strings, dlopen data
def _strings_seeds(work: Path) -> list[bytes]:
    from tests.helpers.elfbuild import synth_elf

    out = [
        synth_elf(work / f"str{cls}.so", elf_class=cls, little=True, extra_sections=(".rodata",)).read_bytes()
        for cls in (32, 64)
    ]
    head = out[-1]
    out.append(head + b"\0libnvrtc-builtins.so.13.0\0libcudnn_graph.so\0")  # names past the sections
    return out


def _check_strings(data: bytes, scratch: Path) -> str | None:
    from pytest_cudastack.linker.strings import MAX_NAMES, StringFacts, read_strings

    path = scratch / "libstr.so"
    path.write_bytes(data)
    try:
        facts = read_strings(str(path))
    except ElfError as e:
        return _memory(e)
    if len(facts.names) > MAX_NAMES:
        return f"read_strings returned {len(facts.names)} names, over MAX_NAMES"
    try:
        if StringFacts.from_json(json.loads(json.dumps(facts.to_json()))) != facts:
            return "string facts do not survive the cache round trip"
    except ElfError as e:
        return f"the cache rejects what read_strings returned: {e}"
    return None


def _dlopen_seeds(work: Path) -> list[bytes]:
    from importlib import resources

    return [resources.files("pytest_cudastack.cuda").joinpath("data/dlopen_targets.json").read_bytes()]


def _structured_dlopen(data: bytes, rng: random.Random) -> bytes | None:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError, MemoryError):
        return None
    return _dumps(mutate_json(doc, rng), rng)


def _check_dlopen(data: bytes, scratch: Path) -> str | None:
    from pytest_cudastack.cuda.dlopen import validate_dlopen_targets, validate_preloads
    from pytest_cudastack.errors import DataError

    try:
        raw = json.loads(data)
    except (ValueError, RecursionError, MemoryError):
        return None  # not JSON: load_dlopen_targets turns that into a DataError naming the file
    with contextlib.suppress(DataError):
        validate_preloads(raw, "fuzz.json")
    try:
        rows = validate_dlopen_targets(raw, "fuzz.json")
    except DataError:
        return None
    for row in rows:  # a validated row answers without raising
        m = row.match("libcudnn.so.9", "libnvrtc.so.13")
        if m is not None:
            row.targets(m, ["libnvrtc-builtins.so.13.0"])


# ------------------------------------------------- the other shipped data files of this round, tool versions
def _data_seeds(name: str) -> Callable[[Path], list[bytes]]:
    def seeds(work: Path) -> list[bytes]:
        from importlib import resources

        return [resources.files("pytest_cudastack.cuda").joinpath(f"data/{name}").read_bytes()]

    return seeds


def _check_data(validate: Callable[[Any, str], object]) -> Check:
    """A shipped data file's validator raises only DataError (naming the file) on any JSON document."""

    def check(data: bytes, scratch: Path) -> str | None:
        from pytest_cudastack.errors import DataError

        try:
            raw = json.loads(data)
        except (ValueError, RecursionError, MemoryError):
            return None  # not JSON: shipped_json turns that into a DataError naming the file
        with contextlib.suppress(DataError):
            validate(raw, "fuzz.json")
        return None

    return check


def _validate_frameworks(raw: Any, source: str) -> object:
    from pytest_cudastack.cuda.frameworks import validate_rules

    return validate_rules(raw, source)


def _validate_toolchain(raw: Any, source: str) -> object:
    from pytest_cudastack.cuda.toolchain import validate_toolchain

    return validate_toolchain(raw, source)


def _validate_gpu_code(raw: Any, source: str) -> object:
    from pytest_cudastack.cuda.gpucode import validate_gpu_code

    return validate_gpu_code(raw, source)


def _toolversion_seeds(work: Path) -> list[bytes]:
    line = b"Cuda compilation tools, release 12.6, V12.6.85\nBuild cuda_12.6.r12.6/compiler.34841621_0\n"
    return [
        b"\x7fELF" + b"\0" * 60 + line + b"\0" * 200,
        b'#!/bin/sh\nexec /usr/local/cuda/bin/ptxas "$@"\n',
        line,
    ]


def _check_toolversion(data: bytes, scratch: Path) -> str | None:
    from pytest_cudastack.linker.toolversion import ToolVersion, read_tool_version

    path = scratch / "ptxas"
    path.write_bytes(data)
    try:
        found = read_tool_version(str(path))
    except ElfError as e:
        return _memory(e)
    try:
        if ToolVersion.from_json(json.loads(json.dumps(found.to_json()))) != found:
            return "tool version facts do not survive the cache round trip"
    except ElfError as e:
        return f"the cache rejects what read_tool_version returned: {e}"
    return None


# ------------------------------------------------------------------------------------- symbol tables
def _symbols_seeds(work: Path) -> list[bytes]:
    from tests.helpers.elfbuild import CC, build_lib, synth_elf

    out = [
        synth_elf(work / f"sym{cls}{little}.so", elf_class=cls, little=little, pyinit="seed",
                  verneed=[("libc.so.6", ["GLIBC_2.2.5", "GLIBC_2.14"])]).read_bytes()
        for cls in (32, 64) for little in (True, False)
    ]  # fmt: skip
    if CC is not None:
        src = "".join(f"int f{i}(void) {{ return {i}; }}\n" for i in range(8))
        src += 'extern int puts(const char *); int g(void) { return puts("x"); }\n'
        script = work / "seed.map"
        script.write_text("VERS_1 { global: f0; f1; local: *; };\nVERS_2 { global: f2; g; } VERS_1;\n")
        for style in ("gnu", "sysv"):
            for versions in (True, False):
                extra = [f"-Wl,--hash-style={style}"] + ([f"-Wl,--version-script,{script}"] if versions else [])
                lib = build_lib(work / f"sym-{style}-{versions}" / "libseed.so.1", source=src, extra=extra)
                out.append(lib.read_bytes())
    return out


def _check_symbols(data: bytes, scratch: Path) -> str | None:
    path = scratch / "libseed.so.1"
    path.write_bytes(data)
    try:
        facts = read_symbols(str(path))
    except ElfError as e:
        return _memory(e)
    facts.definitions()
    facts.references()
    facts.defined_versions()
    try:
        again = SymbolFacts.from_json(json.loads(json.dumps(facts.to_json())))
    except ElfError as e:
        return f"the symbol cache cannot read back what it wrote: {e}"
    if again != facts:
        return "the symbol facts do not survive the cache's JSON round trip"
    return None


# ---------------------------------------------------------------------------------------- snapshots
def _snapshot_seeds(work: Path) -> list[bytes]:
    gpu = {"index": 0, "name": "GPU", "uuid": None, "compute_capability": "9.0", "memory_total": 1, "mig_mode": None}
    driver = {
        "source": "probed", "version": "580.65.06", "cuda_version": "13.0", "gpus": [gpu], "archs": ["sm_90"],
        "arch_source": "probed", "reason": None, "notes": ["n"], "libcuda": None, "kernel_module": None,
        "forward_compat": None,
    }  # fmt: skip
    wheel = {
        "name": "nvidia-cublas", "version": "13.0", "cuda_major": 13, "cuda_evidence": "name",
        "libraries": ["libcublas.so.13"], "missing": ["/x/libcublas.so.13"], "problems": [],
        "gpu_code": {"sass": ["sm_90"], "ptx": ["compute_90"]},
    }  # fmt: skip
    lib = {"soname": "libc.so.6", "path": None, "needed_by": ["bin/app"], "provider": None}
    snap = {
        "schema": "pytest-cudastack/snapshot", "version": 1, "format": 1, "generator": "pytest-cudastack 0.2",
        "driver": driver, "wheels": [wheel], "binaries": [{"path": "bin/app", "libraries": [lib]}],
    }  # fmt: skip
    legacy = {k: v for k, v in snap.items() if k not in ("schema", "version")}
    legacy["wheels"] = [{k: v for k, v in wheel.items() if k != "gpu_code"}]
    return [json.dumps(snap).encode(), json.dumps(legacy).encode()]


def _check_snapshot(data: bytes, scratch: Path) -> str | None:
    """load_snapshot raises only DataError; what it accepts the drift code reads without an error; and it
    accepts exactly what jsonschema accepts (the shipped schema; for a file without "schema", 0.1.0's)."""
    path = scratch / "snapshot.json"
    path.write_bytes(data)
    try:
        doc = load_snapshot(str(path))
    except DataError as e:
        doc = None
        if "MemoryError" in str(e):
            return f"over the memory limit: {e}"
    verdict = _jsonschema_verdict(data)
    if verdict is not None and verdict != (doc is not None):
        ours, theirs = ("accepted", "refused") if doc is not None else ("refused", "accepted")
        return f"load_snapshot {ours} what jsonschema {theirs}"
    if doc is not None:
        seed = json.loads(_snapshot_seeds(scratch)[0])
        snapshot_drift(doc, seed)
        snapshot_drift(seed, doc)
        baseline_findings("b.json", doc, doc)
    return None


def _jsonschema_verdict(data: bytes) -> bool | None:
    """jsonschema's verdict on the document, None where it cannot give one (not JSON, too deep for it)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("schema", "pytest-cudastack/snapshot") != "pytest-cudastack/snapshot":
        return None  # refused before the schema (both sides agree it is not a snapshot)
    if doc.get("version", doc.get("format")) != 1:
        return None
    schema = stack.snapshot_schema(legacy="schema" not in doc)
    try:
        return bool(jsonschema.Draft202012Validator(schema).is_valid(doc))
    except RecursionError:
        return None


# --------------------------------------------------------------------------- `cudastack loaded` reports
def _loaded_seeds(work: Path) -> list[bytes]:
    return [
        json.dumps({"paths": ["/usr/lib/libc.so.6", "/x/lib\udcff.so"], "error": None}).encode(),
        json.dumps({"paths": [], "error": "ImportError: \x1b[31m no"}).encode(),
    ]


def _check_loaded(data: bytes, scratch: Path) -> str | None:
    got = parse_report(data)
    if got is None:
        return None
    paths, error = got
    if not (isinstance(paths, list) and all(isinstance(p, str) and p.startswith("/") for p in paths)):
        return f"a report of malformed paths was accepted: {paths!r:.200}"
    if error is not None and not (isinstance(error, str) and error.isprintable()):
        return f"an unprintable error was passed on: {error!r:.200}"
    return None


# ------------------------------------------------------------------------------ round 3 (issue #23) targets
_CONFIG_NAMES = ("pyproject.toml", "tox.ini", "setup.cfg", "pytest.ini", "pytest.toml")
_CONFIGS = [
    (0, '[tool.pytest.ini_options]\ncuda_max = "12.9"\ncudastack_scan = ["bin", "lib"]\n'
        'addopts = "-q --cuda-min=11.8"\n'),
    (0, '[tool.pytest]\ncuda_max = "12.9"\ncudastack = true\ncudastack_imports = ["torch", "cupy"]\n'),
    (0, "[project]\nname = 'x'\nversion = 0x1f\n[tool.pytest.ini_options]\ncudastack_no_cache = 1\n"),
    (1, "[tox]\nenvlist = py311\n[pytest]\ncuda_driver = 550.54.15\naddopts = -o cuda_max=13.0\n"
        "cudastack_scan =\n  bin\n  lib\n"),
    (2, "[metadata]\nname = x\n[tool:pytest]\ncuda_arch = sm_90,sm_80\ncudastack_imports_scan = false\n"),
    (3, "[pytest]\naddopts = --cudastack --cudastack-unmet=skip\ncudastack_baseline = base.json\n"),
    (4, "[pytest]\ncuda_min = \"12.0\"\ncudastack_scan = [\"bin\"]\n"),
]  # fmt: skip


def _config_seeds(work: Path) -> list[bytes]:
    return [bytes([which]) + text.encode() for which, text in _CONFIGS]


def _check_config(data: bytes, scratch: Path) -> str | None:
    """``cudastack check``'s configuration (cli/project.py): pytest's file read as pytest reads it, its values
    resolved into Settings; only a CudaStackError (OptionError: exit 2 naming the file) may leave."""
    import argparse

    from pytest_cudastack.cli.project import project_settings
    from pytest_cudastack.errors import CudaStackError

    d = scratch / "config"
    d.mkdir(exist_ok=True)
    for old in d.iterdir():
        old.unlink()
    name = _CONFIG_NAMES[data[0] % len(_CONFIG_NAMES)] if data else "pytest.ini"
    (d / name).write_bytes(data[1:])
    here = os.getcwd()
    os.chdir(d)
    try:
        project_settings(argparse.Namespace(inifile=None, rootdir=None, override_ini=[]), environ={})
    except CudaStackError:
        pass
    finally:
        os.chdir(here)
    return None


_SOURCES = [
    "import os, sys\nfrom . import sub\nif sys.platform == 'linux':\n    import ctypes\n"
    "try:\n    import torch\nexcept ImportError:\n    torch = None\n",
    '"""Doc \'\'\' string."""\nfrom .x import (a,\n    b)\nclass C:\n    import json\n'
    '    def f(self):\n        import re\n        return "s\\"(["\n',
    "def f(x=')'):\n    pass\nfor i in range(3):\n    import a\nelse:\n    import b\n"
    "while 0: pass\nx = [1,\n 2]; import c\n",
    "# comment with \"\"\" and '''\nimport a.b.c as d\nfrom __future__ import annotations\ns = r'\\' + f\"{x['y']}\"\n",
]  # fmt: skip


def _pysource_seeds(work: Path) -> list[bytes]:
    return [text.encode() for text in _SOURCES]


def _check_pysource(data: bytes, scratch: Path) -> str | None:
    """The import scanner (model/pysource.py): lexing, the top-level scan and the parse never raise; the
    imports asked twice in a run are computed once."""
    from pytest_cudastack.model import pysource

    f = scratch / "mod.py"
    f.write_bytes(data)
    cache = ElfCache(str(scratch / "pycache"), enabled=False)
    first = pysource.module_imports(str(f), "pkg.mod", False, cache)
    again = pysource.module_imports(str(f), "pkg.mod", False, cache)
    if again is not first:
        return "a module's imports were computed twice in one run"
    pysource.read_module_source(str(f), strip=False)
    return None


_REQUIRES = [
    'nvidia-cudnn-cu12>=9; python_version >= "3.9" and sys_platform == "linux"',
    'nvidia-nccl-cu12==2.21.5; extra == "cuda" or platform_machine == "x86_64"',
    "torch[opt]>=2.0,<3; implementation_name == 'cpython'",
    'sympy; python_full_version < "3.13.1" and extra == "opt"',
    "filelock (>=3.0)",
]


def _requirements_seeds(work: Path) -> list[bytes]:
    head = "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\nProvides-Extra: cuda\nProvides-Extra: opt\n"
    lines = [_REQUIRES[i:] + _REQUIRES[:i] for i in range(3)]
    return [(head + "".join(f"Requires-Dist: {r}\n" for r in reqs) + "\n").encode() for reqs in lines]


def _check_requirements(data: bytes, scratch: Path) -> str | None:
    """Requires-Dist as the requirements item and the repair model evaluate it (wheels/requirements.py, with
    packaging's parsers): nothing may leave; what packaging cannot read is reported, never raised."""
    import shutil

    from pytest_cudastack.checks.requirements import requirement_findings
    from pytest_cudastack.model.repair import plan_repairs
    from pytest_cudastack.wheels.inventory import installed_wheels
    from pytest_cudastack.wheels.requirements import requirement_facts

    site = scratch / "site"
    shutil.rmtree(site, ignore_errors=True)
    for name, version, meta in [("pkg", "1.0", data), ("nvidia-nccl-cu12", "2.20.5", None)]:
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        text = meta if meta is not None else f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode()
        (info / "METADATA").write_bytes(text)
        (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
        (info / "INSTALLER").write_text("pip\n")
    inv = installed_wheels([str(site)], reader=elf.read_elf, dpkg_root=None)
    reqs = requirement_facts(inv)
    found = requirement_findings(inv, reqs=reqs)
    plan_repairs(found, inv, reqs=reqs)
    return None


def _escape_seeds(work: Path) -> list[bytes]:
    return [b"libc.so.6", b"lib\x1b[2J\x1b]0;t\x07\r\xe2\x80\xae\xff.so", "\u00fcn\u00ef \u2713\u2028\ufeff".encode()]


def _check_escape(data: bytes, scratch: Path) -> str | None:
    """escape.printable: its answer is printable (newlines kept on request), and escaping it again changes
    nothing."""
    from pytest_cudastack.escape import printable

    text = data.decode("utf-8", "surrogateescape")
    for lines in (False, True):
        out = printable(text, newlines=lines)
        if not (out.replace("\n", "") if lines else out).isprintable():
            return f"unprintable output: {out[:100]!r}"
        if printable(out, newlines=lines) != out:
            return f"escaping twice changed {out[:100]!r}"
    return None


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("elf", _elf_seeds, _check_elf),
        Target("ldcache", _ldcache_seeds, _check_ldcache),
        Target("distinfo", _distinfo_seeds, _check_distinfo),
        Target("fatbin", _fatbin_seeds, _check_fatbin),
        Target("elfcache", _elfcache_seeds, _check_elfcache, _structured_elfcache),
        Target("treecache", _treecache_seeds, _check_treecache, _structured_treecache),
        Target("strings", _strings_seeds, _check_strings),
        Target("dlopen", _dlopen_seeds, _check_dlopen, _structured_dlopen),
        Target("symbols", _symbols_seeds, _check_symbols),
        Target("snapshot", _snapshot_seeds, _check_snapshot, _structured_elfcache),
        Target("loaded", _loaded_seeds, _check_loaded, _structured_elfcache),
        Target(
            "frameworks", _data_seeds("framework_rules.json"), _check_data(_validate_frameworks), _structured_dlopen
        ),
        Target("toolchain", _data_seeds("toolchain.json"), _check_data(_validate_toolchain), _structured_dlopen),
        Target("gpucode", _data_seeds("gpu_code.json"), _check_data(_validate_gpu_code), _structured_dlopen),
        Target("toolversion", _toolversion_seeds, _check_toolversion),
        Target("config", _config_seeds, _check_config),
        Target("pysource", _pysource_seeds, _check_pysource),
        Target("requirements", _requirements_seeds, _check_requirements),
        Target("escape", _escape_seeds, _check_escape),
    )
}
