"""Facts about GPU code builds, from ``data/gpu_code.json`` (validated on load): which CUDA first loads each PTX
ISA version, and which archs the CUDA variants of a package's official builds carry.

Every row cites a source id listed in the file's ``sources``, as in ``cuda_compat.json``. A PTX kernel can be
JIT-compiled only by a driver whose CUDA knows its ``.version`` (PTX ISA, "Release History";
CUDA_ERROR_UNSUPPORTED_PTX_VERSION otherwise). The variants name the way out for an installed wheel whose
kernels do not run on a GPU: another build of the same package, not a rebuild.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from pytest_cudastack.cuda.datafile import DataShape, check_data, cited, shipped_json
from pytest_cudastack.cuda.versions import Arch, CudaVersion, parse_arch, parse_cuda
from pytest_cudastack.errors import DataError, ElfError, OptionError
from pytest_cudastack.linker.fatbin import Fatbin, FatbinEntry, runs_on

__all__ = [
    "GPU_CODE_FILE",
    "GpuCodeData",
    "Variant",
    "arch_first_cuda",
    "arch_key",
    "gpu_code_json",
    "gpu_code_text",
    "load_gpu_code",
    "path_gpu_code",
    "ptx_isa_cuda",
    "validate_gpu_code",
    "variants_for",
    "with_gpu_code",
]

GPU_CODE_FILE = "data/gpu_code.json"
SHAPE = DataShape(
    "gpu_code.schema.json", {"ptx_isa": ("isa",), "arch_cuda": ("arch",), "variants": ("package", "variant")}
)
_ISA = re.compile(r"(\d+)\.(\d+)")


@dataclass(frozen=True)
class Variant:
    """One CUDA variant of a package's official builds (``torch`` ``cu126``) and the code it carries."""

    package: str  # canonical name
    variant: str
    cuda: CudaVersion
    sass: tuple[Arch, ...]
    ptx: tuple[Arch, ...]
    index: str
    source: str

    def covers(self, cc: int) -> bool:
        """Whether this build's SASS or PTX runs on compute capability ``cc`` (``fatbin.runs_on``'s rules)."""
        entries = [FatbinEntry("sass", a.number, a.suffix, None) for a in self.sass]
        entries += [FatbinEntry("ptx", a.number, a.suffix, None) for a in self.ptx]
        return any(runs_on(e, cc) for e in entries)


@dataclass(frozen=True)
class GpuCodeData:
    ptx_isa: tuple[tuple[tuple[int, int], CudaVersion], ...]  # ((major, minor) of the ISA, first CUDA)
    variants: tuple[Variant, ...]
    arch_cuda: tuple[tuple[Arch, CudaVersion], ...] = ()  # (target arch, first CUDA whose tools accept it)


def _row(raw: Any, table: str, index: int, keys: set[str], sources: Mapping[str, Any], source: str) -> dict[str, Any]:
    where = f"{source}: {table}[{index}]"
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected an object, got {type(raw).__name__}")
    cited(raw, sources, where)
    extra = set(raw) - keys - {"source", "note"}
    missing = keys - set(raw)
    if extra or missing:
        raise DataError(f"{where}: unknown key(s) {sorted(extra)}, missing key(s) {sorted(missing)}")
    return raw


def _text(row: dict[str, Any], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value:
        raise DataError(f"{where}: {key!r} must be a non-empty string ({value!r})")
    return value


def _archs(row: dict[str, Any], key: str, prefix: str, where: str) -> tuple[Arch, ...]:
    value = row[key]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.startswith(prefix) for v in value):
        raise DataError(f"{where}: {key!r} must list {prefix}XX names ({value!r})")
    try:
        return tuple(parse_arch(v.replace("compute_", "sm_")) for v in value)
    except OptionError as e:
        raise DataError(f"{where}: {key!r}: {e}") from e


def validate_gpu_code(raw: Any, source: str = GPU_CODE_FILE) -> GpuCodeData:
    """The data file's facts; DataError naming the file and row for anything malformed."""
    raw = check_data(raw, source, SHAPE)
    sources = raw["sources"]
    isas: list[tuple[tuple[int, int], CudaVersion]] = []
    for i, item in enumerate(_table(raw, "ptx_isa", source)):
        row = _row(item, "ptx_isa", i, {"isa", "cuda"}, sources, source)
        where = f"{source}: ptx_isa[{i}]"
        m = _ISA.fullmatch(_text(row, "isa", where))
        if m is None:
            raise DataError(f"{where}: 'isa' must be MAJOR.MINOR ({row['isa']!r})")
        try:
            cuda = parse_cuda(_text(row, "cuda", where))
        except OptionError as e:
            raise DataError(f"{where}: 'cuda': {e}") from e
        key = (int(m[1]), int(m[2]))
        if isas and (key <= isas[-1][0] or cuda.mm <= isas[-1][1].mm):
            raise DataError(f"{where}: rows must rise in both the ISA and the CUDA version")
        isas.append((key, cuda))
    arch_cuda: dict[Arch, CudaVersion] = {}
    for i, item in enumerate(_table(raw, "arch_cuda", source)):
        row = _row(item, "arch_cuda", i, {"arch", "cuda"}, sources, source)
        where = f"{source}: arch_cuda[{i}]"
        arch = _archs({"arch": [row["arch"]]}, "arch", "sm_", where)[0]
        if arch in arch_cuda:
            raise DataError(f"{where}: {arch} is listed twice")
        try:
            arch_cuda[arch] = parse_cuda(_text(row, "cuda", where))
        except OptionError as e:
            raise DataError(f"{where}: 'cuda': {e}") from e
    variants: list[Variant] = []
    for i, item in enumerate(_table(raw, "variants", source)):
        keys = {"package", "variant", "cuda", "sass", "ptx", "index"}
        row = _row(item, "variants", i, keys, sources, source)
        where = f"{source}: variants[{i}]"
        try:
            cuda = parse_cuda(_text(row, "cuda", where))
        except OptionError as e:
            raise DataError(f"{where}: 'cuda': {e}") from e
        variants.append(
            Variant(
                package=canonicalize_name(_text(row, "package", where)),
                variant=_text(row, "variant", where),
                cuda=cuda,
                sass=_archs(row, "sass", "sm_", where),
                ptx=_archs(row, "ptx", "compute_", where),
                index=_text(row, "index", where),
                source=str(row["source"]),
            )
        )
    return GpuCodeData(ptx_isa=tuple(isas), variants=tuple(variants), arch_cuda=tuple(arch_cuda.items()))


def _table(raw: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = raw.get(key)
    if not isinstance(value, list) or not value:
        raise DataError(f"{source}: top-level {key!r} must be a non-empty list")
    return value


@functools.lru_cache(maxsize=1)
def load_gpu_code() -> GpuCodeData:
    """Load and validate the shipped data file (cached)."""
    raw = shipped_json(GPU_CODE_FILE)
    return validate_gpu_code(raw, GPU_CODE_FILE)


def ptx_isa_cuda(isa: str) -> CudaVersion | None:
    """The first CUDA whose driver JIT-compiles PTX ISA ``isa`` ("9.0" -> 13.0); None when not in the data."""
    m = _ISA.fullmatch(isa)
    if m is None:
        return None
    key = (int(m[1]), int(m[2]))
    for row_isa, cuda in load_gpu_code().ptx_isa:
        if row_isa == key:
            return cuda
    return None


def arch_first_cuda(arch: str | Arch) -> CudaVersion | None:
    """The first CUDA whose compiler tools (ptxas, nvcc) accept target ``arch`` ("sm_100" -> 12.7); None when
    the arch is not in the data (then nothing is said about it)."""
    want = parse_arch(arch, error=DataError) if isinstance(arch, str) else arch
    for row_arch, cuda in load_gpu_code().arch_cuda:
        if row_arch == want:
            return cuda
    return None


def variants_for(package: str, cc: int) -> tuple[Variant, ...]:
    """The known variants of ``package`` whose code runs on compute capability ``cc``, newest CUDA first."""
    name = canonicalize_name(package)
    found = [v for v in load_gpu_code().variants if v.package == name and v.covers(cc)]
    return tuple(sorted(found, key=lambda v: v.cuda, reverse=True))


def arch_key(name: str) -> tuple[int, str]:
    """``sm_90`` < ``sm_90a`` < ``sm_100``: by arch number, then suffix (the order GPU code is listed in)."""
    digits = name.rsplit("_", 1)[-1]
    number = digits.rstrip("af")
    return (int(number) if number.isdigit() else 0, digits[len(number) :])


def gpu_code_json(fats: Iterable[Fatbin]) -> dict[str, list[str]]:
    """``{"sass": [...], "ptx": [...]}``: the SASS and PTX ``fats`` carry together, ordered by arch; the one
    shape ``cudastack tree --json``, ``cudastack report --json`` and the snapshot list GPU code in."""
    sass: set[str] = set()
    ptx: set[str] = set()
    for fat in fats:
        sass.update(fat.sass)
        ptx.update(fat.ptx)
    return {"sass": sorted(sass, key=arch_key), "ptx": sorted(ptx, key=arch_key)}


def gpu_code_text(code: Mapping[str, list[str]]) -> str:
    """``"SASS sm_80, sm_90a; PTX compute_80"`` (``"SASS sm_80; no PTX"``); "" when there is no GPU code."""
    sass, ptx = code.get("sass", []), code.get("ptx", [])
    if not sass and not ptx:
        return ""
    parts = ["SASS " + ", ".join(sass) if sass else "no SASS", "PTX " + ", ".join(ptx) if ptx else "no PTX"]
    return "; ".join(parts)


def path_gpu_code(path: str | None, read: Callable[[str], Fatbin]) -> dict[str, list[str]] | None:
    """:func:`gpu_code_json` of one file (``read``: the run's ``ElfCache.fatbin``); None for no path (a
    library not found); empty lists for a file whose fatbins cannot be read (its problem is reported where
    the file is)."""
    if path is None:
        return None
    try:
        return gpu_code_json([read(path)])
    except ElfError:
        return {"sass": [], "ptx": []}


def with_gpu_code(tree: dict[str, Any], read: Callable[[str], Fatbin]) -> dict[str, Any]:
    """A ``Tree.to_json`` document with ``"gpu_code"`` on each library (``path_gpu_code``), its last key:
    ``cudastack tree --json`` and the snapshot's binaries, one definition."""
    for lib in tree.get("libraries", ()):
        lib["gpu_code"] = path_gpu_code(lib.get("path"), read)
    return tree
