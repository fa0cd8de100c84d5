"""Arch coverage: does every installed kernel run on the GPUs we deploy on?

The item checks, whenever target archs are known (probed GPUs or ``--cuda-arch``), the GPU code of every
RECORD-listed library of every installed distribution (grouped per distribution) and of the user's scans
(per file), the stack's CUDA major against each GPU (CUDA 13 dropped sm_50-sm_72), and, for kernels that
can only run by JIT from PTX, the PTX ISA version against the driver. Fatbins are read headers only, through
the run's ELF cache (``StackView.fatbin``).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pytest_cudastack.cuda.compat import arch_cuda_range, min_driver_for_cuda
from pytest_cudastack.cuda.gpucode import gpu_code_json, ptx_isa_cuda, variants_for
from pytest_cudastack.cuda.verdicts import driver_verdict, gpu_verdict
from pytest_cudastack.cuda.versions import parse_arch
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import DriverUpgrade, Finding, Pip, Rebuild, Remedy, Severity, UseBuild, manual
from pytest_cudastack.linker.fatbin import Fatbin, FatbinEntry, read_fatbin, runs_on
from pytest_cudastack.wheels.ownership import pip_python

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = [
    "arch_coverage",
    "arch_findings",
    "dist_gpu_code",
    "nothing_to_check",
    "run",
    "stack_cuda_major",
    "summarize",
    "wheel_arch_findings",
]

logger = logging.getLogger(__name__)

FatbinReader = Callable[[str], Fatbin]
_NO_IMAGE = "kernels fail with 'no kernel image is available for execution on the device'"
_SHOWN = 3


def _describe(fat: Fatbin) -> str:
    parts = []
    if fat.sass:
        parts.append("SASS " + ", ".join(fat.sass))
    if fat.ptx:
        parts.append("PTX " + ", ".join(fat.ptx))
    return " and ".join(parts)


_SUFFIX_ORDER = {"": 0, "f": 1, "a": 2}


def _order(entry: FatbinEntry) -> tuple[int, int]:
    return entry.arch, _SUFFIX_ORDER.get(entry.suffix, 3)


def summarize(entries: Iterable[FatbinEntry]) -> str:
    """``"SASS sm_75\u2013sm_121a, no PTX"``: the span of the SASS and the PTX list, ordered by arch."""
    listed = list(entries)
    sass = sorted({e for e in listed if e.kind == "sass"}, key=_order)
    ptx = sorted({e.name: e for e in listed if e.kind == "ptx"}.values(), key=_order)
    names = list(dict.fromkeys(e.name for e in sass))
    if not names:
        text = "no SASS"
    elif len(names) == 1:
        text = f"SASS {names[0]}"
    else:
        text = f"SASS {names[0]}\u2013{names[-1]}"
    return text + (", PTX " + ", ".join(e.name for e in ptx) if ptx else ", no PTX")


@dataclass(frozen=True)
class _Jit:
    """What JIT from PTX means for one target arch and the driver."""

    fails: bool
    text: str
    cuda: str = ""  # the first CUDA whose driver JITs the PTX ("13.5"), when known


def _jit(ptx: Sequence[FatbinEntry], driver: DriverInfo | None) -> _Jit:
    """Whether the driver can JIT the best of ``ptx`` (the one of the highest arch, as the driver picks).

    PTX ISA release history: a PTX text of ISA X.Y loads only on a driver of the CUDA that introduced X.Y or
    later; minor-version compatibility does not extend to it (CUDA compatibility guide), a
    forward-compatibility libcuda does. Unknown ISA or driver facts: nothing to say.
    """
    best = max(ptx, key=_order)
    isa = best.ptx_isa
    cuda = ptx_isa_cuda(isa) if isa else None
    if driver is None or cuda is None:
        return _Jit(False, "")
    verdict = driver_verdict(cuda, driver, subject=f"PTX {best.name} (PTX ISA {isa})")
    if verdict.status in ("compatible", "unknown") or verdict.via == "forward compatibility":
        return _Jit(False, "")
    return _Jit(True, f"{verdict.message}: JIT fails with CUDA_ERROR_UNSUPPORTED_PTX_VERSION", str(cuda))


def _driver_for(jit: _Jit) -> tuple[Remedy, ...]:
    """A driver that JITs the PTX: the first one of the CUDA that introduced its ISA (none when unknown)."""
    minimum = min_driver_for_cuda(jit.cuda) if jit.fails and jit.cuda else None
    why = f"the first driver of CUDA {jit.cuda}, whose JIT compiler reads that PTX ISA"
    return (DriverUpgrade(minimum, jit.cuda, why=why),) if minimum is not None else ()


def _gencode(path: str, name: str, cc: int, why: str) -> Rebuild:
    """Rebuild ``path`` with SASS for ``name`` (nvcc's ``-gencode`` spelling: ``sm_90a`` keeps its suffix)."""
    arch = str(parse_arch(name)).removeprefix("sm_")
    return Rebuild(path, ("-gencode", f"arch=compute_{arch},code=sm_{arch}"), why=why)


def _split(fat: Fatbin, cc: int) -> tuple[bool, list[FatbinEntry]]:
    """(some SASS runs on ``cc``, the PTX entries that can be JIT-compiled for it)."""
    if any(e.kind == "sass" and runs_on(e, cc) for e in fat.entries):
        return True, []
    return False, [e for e in fat.entries if e.kind == "ptx" and runs_on(e, cc)]


def arch_findings(
    paths: Iterable[str],
    archs: Sequence[str],
    source: str = "declared",
    *,
    reader: FatbinReader = read_fatbin,
    driver: DriverInfo | None = None,
) -> tuple[Finding, ...]:
    """For each of the user's files with GPU code, one finding per target arch that none of its entries runs on.

    SASS that runs directly is fine; PTX alone is a warning (JIT-compiled at first launch, slow), an error when
    ``driver`` cannot JIT that PTX ISA; nothing at all is an error ("no kernel image is available"). These are
    the user's own binaries, so the fix is a rebuild. Files without GPU code give no finding. A malformed arch
    raises OptionError.
    """
    targets = [(arch, parse_arch(arch).number) for arch in archs]
    findings: list[Finding] = []
    for path in paths:
        try:
            fat = reader(path)
        except ElfError as e:
            findings.append(Finding("arch", Severity.WARNING, path, f"cannot read GPU code: {e}"))
            continue
        findings.extend(
            Finding("arch", Severity.WARNING, path, f"malformed fatbin: {problem}") for problem in fat.problems
        )
        if not fat.entries:
            continue
        for name, cc in targets:
            sass, ptx = _split(fat, cc)
            if sass:
                continue
            carries = _describe(fat)
            if ptx:
                jit = _jit(ptx, driver)
                findings.append(
                    Finding(
                        "arch",
                        Severity.ERROR if jit.fails else Severity.WARNING,
                        path,
                        f"no SASS for {name} ({source}); only PTX {ptx[0].name} can be JIT-compiled for it"
                        + (f"; {jit.text}" if jit.fails else ""),
                        cause=f"the file carries {carries}",
                        remedies=(
                            _gencode(path, name, cc, "SASS for it: no JIT at first launch"),
                            *_driver_for(jit),
                        ),
                    )
                )
                continue
            findings.append(
                Finding(
                    "arch",
                    Severity.ERROR,
                    path,
                    f"no GPU code runs on {name} ({source}): {_NO_IMAGE}",
                    cause=f"the file carries {carries}; none of it runs on compute capability {cc // 10}.{cc % 10}",
                    remedies=(
                        _gencode(path, name, cc, f"SASS for compute capability {cc // 10}.{cc % 10} (or add PTX)"),
                    ),
                )
            )
    return tuple(findings)


def stack_cuda_major(inventory: Inventory) -> tuple[int, str] | None:
    """(the stack's CUDA major, why): torch's flavour when torch is a CUDA build, else the major most CUDA
    wheels share (None on a tie or without CUDA wheels)."""
    torch = inventory.get("torch")
    if torch is not None and torch.cuda_major is not None:
        return torch.cuda_major, f"{torch.label}: {torch.cuda_evidence}"
    majors = Counter(d.cuda_major for d in inventory.distributions if d.cuda_major is not None)
    ranked = majors.most_common()
    if not ranked or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    major, count = ranked[0]
    return major, f"{count} of {sum(majors.values())} CUDA wheels are CUDA {major}"


def _cc_text(cc: int) -> str:
    return f"{cc // 10}.{cc % 10}"


def _wheel_remedies(dist: Distribution, name: str, cc: int) -> tuple[Remedy, ...]:
    """The way out for an installed wheel: the build or variant of that package whose code covers ``cc``
    (with the pip command that gets it, in the wheel's environment, where the data names its index), else
    what to do by hand."""
    variants = variants_for(dist.name, cc)
    if variants:
        v = variants[0]
        why = f"its kernels cover {name} (a {dist.name} release that still publishes {v.variant})"
        get = Pip("install", (dist.name,), pip_python(dist), ("--force-reinstall",), v.index, why=why)
        return (UseBuild(dist.name, f"the {v.variant} variant (CUDA {v.cuda})", get, why=why),)
    span = arch_cuda_range(_cc_text(cc))
    if dist.cuda_major is not None and span is not None and span[1] is not None and dist.cuda_major > span[1]:
        why = f"CUDA {dist.cuda_major} dropped compute capability {_cc_text(cc)}"
        return (
            UseBuild(dist.name, f"the CUDA {span[1]} build", why=why),
            *manual(f"or run on a GPU that CUDA {dist.cuda_major} supports"),
        )
    # no data names a build that covers it: say so rather than send the user looking for one (nor rebuild a
    # wheel nobody here built)
    return manual(f"run on a GPU it supports: no build of {dist.name} that carries code for {name} is known here")


def _wheel_fix(dist: Distribution, name: str, cc: int) -> str:
    """The wheel's remedies as one line (what a warning's prose names)."""
    return "; ".join(r.render() for r in _wheel_remedies(dist, name, cc))


def _jit_fix(dist: Distribution, name: str, cc: int) -> str:
    """A PTX-only wheel's fix: nothing is required; a known build with SASS only skips the JIT's first-launch cost."""
    base = (
        "nothing is required: the driver compiles the PTX once per GPU and caches it (CUDA_CACHE_PATH, "
        "CUDA_CACHE_MAXSIZE)"
    )
    if variants_for(dist.name, cc):
        return f"{base}; to skip that first-launch cost: {_wheel_fix(dist, name, cc)}"
    return f"{base}; no build of {dist.name} with SASS for {name} is known here"


def _verb(n: int, plural: str) -> str:
    """``carry`` -> ``carries`` for one, as ``_of_its`` counts."""
    if n != 1:
        return plural
    return {"have": "has", "carry": "carries"}.get(plural, plural + "s")


def _of_its(n: int, total: int) -> str:
    """``2 of its 5 libraries with GPU code``; all of them: ``its library with GPU code`` (not "1 of its 1")."""
    if n == total:
        return f"its {'library' if n == 1 else f'{n} libraries'} with GPU code"
    return f"{n} of its {total} libraries with GPU code"


def _files(paths: Sequence[str]) -> str:
    names = [os.path.basename(p) for p in paths]
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _dist_fatbins(dist: Distribution, reader: FatbinReader, skip: frozenset[str]) -> tuple[list[Fatbin], list[str]]:
    fats: list[Fatbin] = []
    problems: list[str] = []
    for lib in dist.libraries:
        if not lib.exists or lib.path in skip:
            continue
        try:
            fat = reader(lib.path)
        except ElfError as e:
            logger.debug("no GPU code read from %s: %s", lib.path, e)  # the integrity item reports bad files
            continue
        problems.extend(f"{os.path.basename(lib.path)}: {p}" for p in fat.problems)
        if fat.entries:
            fats.append(fat)
    return fats, problems


def dist_gpu_code(dist: Distribution, reader: FatbinReader = read_fatbin) -> dict[str, list[str]]:
    """The SASS and PTX a distribution's present libraries carry (``gpucode.gpu_code_json``): what the
    snapshot, ``cudastack report`` and the arch item's summary list for it. Unreadable files are left out
    (the integrity item reports them)."""
    return gpu_code_json(_dist_fatbins(dist, reader, frozenset())[0])


def wheel_arch_findings(
    inventory: Inventory,
    archs: Sequence[str],
    source: str = "declared",
    *,
    reader: FatbinReader = read_fatbin,
    driver: DriverInfo | None = None,
    skip: Iterable[str] = (),
) -> tuple[Finding, ...]:
    """Every installed distribution's GPU code against the target archs, one finding per distribution and
    arch: "torch 2.14.1: SASS sm_75-sm_121a, no PTX; sm_60 (declared) cannot run it". A distribution fails an
    arch when one of its libraries carries nothing that runs there; a library that only JITs from PTX is a
    warning (an error when the driver cannot JIT that PTX ISA). ``skip``: paths reported as scans."""
    targets = [(arch, parse_arch(arch).number) for arch in archs]
    skipped = frozenset(skip)
    findings: list[Finding] = []
    for dist in inventory.distributions:
        fats, problems = _dist_fatbins(dist, reader, skipped)
        findings.extend(
            Finding("arch", Severity.WARNING, dist.label, f"malformed fatbin: {problem}") for problem in problems
        )
        if not fats:
            continue
        summary = summarize(e for fat in fats for e in fat.entries)
        for name, cc in targets:
            none: list[str] = []
            jit: list[tuple[str, _Jit]] = []
            for fat in fats:
                sass, ptx = _split(fat, cc)
                if sass:
                    continue
                if ptx:
                    jit.append((fat.path, _jit(ptx, driver)))
                else:
                    none.append(fat.path)
            failing_jit = [(p, j) for p, j in jit if j.fails]
            verdict = gpu_verdict(name, dist.cuda_major) if dist.cuda_major is not None else None
            dropped = f"; {verdict.message}" if verdict is not None and verdict.failing else ""

            if none:
                findings.append(
                    Finding(
                        "arch",
                        Severity.ERROR,
                        dist.label,
                        f"{summary}; {name} ({source}) cannot run it: {_NO_IMAGE}",
                        cause=f"{_of_its(len(none), len(fats))} ({_files(none)}) {_verb(len(none), 'carry')} nothing "
                        "for compute capability "
                        f"{_cc_text(cc)}{dropped}",
                        remedies=_wheel_remedies(dist, name, cc),
                    )
                )
            elif failing_jit:
                findings.append(
                    Finding(
                        "arch",
                        Severity.ERROR,
                        dist.label,
                        f"{summary}; {name} ({source}) can only JIT its PTX, and the driver cannot: "
                        f"{failing_jit[0][1].text}",
                        cause=f"{_of_its(len(failing_jit), len(fats))} ({_files([p for p, _ in failing_jit])}) "
                        f"{_verb(len(failing_jit), 'have')} no SASS for compute capability {_cc_text(cc)}",
                        remedies=(*_driver_for(failing_jit[0][1]), *_wheel_remedies(dist, name, cc)),
                    )
                )
            elif jit:
                findings.append(
                    Finding(
                        "arch",
                        Severity.WARNING,
                        dist.label,
                        f"{summary}; no SASS for {name} ({source}): its kernels are JIT-compiled from PTX at "
                        "first launch",
                        cause=f"{_of_its(len(jit), len(fats))} ({_files([p for p, _ in jit])}) "
                        f"{_verb(len(jit), 'carry')} only PTX "
                        f"for compute capability {_cc_text(cc)}",
                        remedies=manual(_jit_fix(dist, name, cc)),
                    )
                )
    return tuple(findings)


def cuda_major_findings(inventory: Inventory, archs: Sequence[str], source: str = "declared") -> tuple[Finding, ...]:
    """The stack's CUDA major (``stack_cuda_major``) against each target GPU (``verdicts.gpu_verdict``)."""
    major = stack_cuda_major(inventory)
    if major is None:
        return ()
    cuda, why = major
    findings = []
    for name in archs:
        verdict = gpu_verdict(name, cuda)
        if not verdict.failing:
            continue
        cc = parse_arch(name).number
        torch = inventory.get("torch")
        fix = (
            _wheel_remedies(torch, name, cc)
            if torch is not None and torch.cuda_major == cuda
            else manual(
                f"install the stack's packages built for a CUDA that supports compute capability {_cc_text(cc)}"
            )
        )
        findings.append(
            Finding(
                "arch",
                Severity.ERROR,
                name,
                f"the stack is CUDA {cuda}, which cannot run on {name} ({source}): {verdict.message}",
                cause=f"CUDA {cuda} from {why}",
                remedies=fix,
            )
        )
    return tuple(findings)


def arch_coverage(
    paths: Sequence[str], driver: DriverInfo, *, reader: FatbinReader = read_fatbin
) -> tuple[Finding, ...]:
    """GPU code of ``paths`` against the probed or declared archs (``arch_findings``)."""
    if not paths:
        return ()
    if not driver.archs:
        why = driver.reason or "no GPU found"
        return (
            Finding(
                "arch",
                Severity.INFO,
                "archs",
                f"no target GPU architecture known ({why}); pass --cuda-arch=sm_XX to check coverage",
            ),
        )
    return arch_findings(paths, driver.archs, driver.arch_source or driver.source, reader=reader, driver=driver)


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``arch`` item: the stack's CUDA major against the target GPUs, every installed distribution's GPU
    code, and the scanned files that exist (named as in the scan)."""
    names = {path: name for name, path in stack.scan_targets if os.path.isfile(path)}
    found = arch_coverage(tuple(names), stack.driver, reader=stack.fatbin)
    scans = tuple(replace(f, subject=names.get(f.subject, f.subject)) for f in found)
    driver = stack.driver
    if not driver.archs:
        return scans
    source = driver.arch_source or driver.source
    wheels = wheel_arch_findings(stack.inventory, driver.archs, source, reader=stack.fatbin, driver=driver, skip=names)
    return cuda_major_findings(stack.inventory, driver.archs, source) + wheels + scans


def nothing_to_check(stack: StackView, target: Target | None = None) -> str | None:
    """Why the ``arch`` item is skipped: no target arch (none probed, no --cuda-arch), or no GPU code in any
    installed library or scanned file (fatbin headers, read through the stack's cache, as ``run`` reads them)."""
    if not stack.driver.archs:
        if stack.driver.source == "declared":  # --cuda-driver alone: the target's GPUs are what is missing
            return (
                "no GPU arch known (--cuda-driver declares the driver, not its GPUs; none probed here): "
                "pass --cuda-arch=sm_XX"
            )
        return "no GPU arch known: pass --cuda-arch=sm_XX"
    scans = [path for _, path in stack.scan_targets if os.path.isfile(path)]
    if any(_dist_fatbins(dist, stack.fatbin, frozenset())[0] for dist in stack.inventory.distributions):
        return None
    for path in scans:
        try:
            if stack.fatbin(path).entries:
                return None
        except ElfError:
            return None  # run() reports the unreadable file
    return "no GPU code in any installed library or scanned file"
