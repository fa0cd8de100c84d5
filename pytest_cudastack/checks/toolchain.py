"""Compiler tools a framework will run: does the first ``ptxas``/``nvlink``/``fatbinary``/``nvcc`` each
installed framework finds accept what the stack's compiler emits?

jax's XLA compiles its kernels to PTX of the CUDA it was built for (pinned by the ``nvidia-cuda-nvcc`` wheel
it installs) and hands them to the ``ptxas`` it finds first: an older one fails with "Unsupported .version 8.5;
current version is '8.2'". torch's C++ extension builder refuses an ``nvcc`` of another CUDA major. triton
picks its PTX version from the ``ptxas`` it finds, so there is nothing to compare (its lookup is listed at
``-v``). When target GPU archs are known (probed or ``--cuda-arch``), the tool each framework compiles for an
arch with (triton's ``ptxas-blackwell`` for sm_100 and later) must be of a CUDA release that knows the arch
(``gpu_code.json``'s ``arch_cuda``, from the PTX ISA release history): ptxas 12.2 rejects sm_100 with "Value
'sm_100' is not defined for option 'gpu-name'". Lookup orders come from ``cuda/data/toolchain.json``
(``cuda.toolchain``); tool versions are read from the files, never by running them, through the run's ELF cache.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pytest_cudastack._sysio import open_span
from pytest_cudastack.checks import driverlookups
from pytest_cudastack.cuda.gpucode import arch_first_cuda
from pytest_cudastack.cuda.toolchain import (
    Candidate,
    Context,
    Framework,
    Lookup,
    find_tool,
    load_toolchain,
    max_ptx_isa,
    release_key,
)
from pytest_cudastack.cuda.versions import Arch, parse_arch
from pytest_cudastack.errors import ElfError, OptionError
from pytest_cudastack.findings import Env, Finding, Manual, Remedy, SearchPath, Severity
from pytest_cudastack.model.repair import NO_SAFE_REPAIR

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.linker.toolversion import ToolVersion
    from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = [
    "Emitter",
    "arch_tool_findings",
    "detect",
    "framework_lookups",
    "nothing_to_check",
    "run",
    "toolchain_findings",
]

_NVCC_WHEEL = re.compile(r"nvidia-cuda-nvcc(-cu\d+)?")
_RELEASE = re.compile(r"(\d+)\.(\d+)")
_SCAN_LIMIT = 1 << 30  # bytes of one file searched for a tool's name at most


@dataclass(frozen=True)
class Emitter:
    """What the stack's compiler emits for a framework: its CUDA release, where that comes from, and the
    directory holding the matching tools (the wheel's ``bin`` parent), when known."""

    release: str
    label: str
    tools_dir: str | None


def _reader(read: Callable[[str], ToolVersion]) -> Callable[[str], ToolVersion | None]:
    def safe(path: str) -> ToolVersion | None:
        try:
            return read(path)
        except ElfError:
            return None

    return safe


def _contains(path: str, needle: bytes) -> bool:
    """Whether the file at ``path`` holds ``needle``: streamed in 1 MiB chunks, never more than
    ``_SCAN_LIMIT`` bytes (an XLA plugin is a few hundred MB); False when it cannot be read."""
    try:
        span, _ = open_span(path)
    except ElfError:
        return False
    keep = len(needle) - 1
    tail = b""
    done = 0
    try:
        while done < _SCAN_LIMIT:
            chunk = span.pread(1 << 20, done)
            if not chunk:
                return False
            done += len(chunk)
            window = tail + chunk
            if needle in window:
                return True
            tail = window[-keep:] if keep else b""
    except OSError:
        return False
    finally:
        span.close()
    return False


def detect(framework: Framework, inventory: Inventory) -> tuple[Distribution, str] | None:
    """The installed distribution (first in search order) that ships a file of ``framework``'s ``detect`` rows
    holding the tool name its code runs (``triton/backends/nvidia/compiler.py`` holding ``ptxas``), and that
    file; None when none does. Decided by the files, whatever the distribution is called (pytorch-triton, a
    CUDA jaxlib); a CPU-only build, which lacks them, is not one."""
    for dist in inventory.distributions:
        if inventory.get(dist.name) is not dist:
            continue  # shadowed by an earlier copy of the same name
        for row in framework.detect:
            for path in _matching(dist.plain_rows, row.path):
                full = os.path.join(dist.location, path)
                if _contains(full, row.contains.encode()):
                    return dist, full
    return None


def _matching(rows: Mapping[str, object], pattern: str) -> Iterable[str]:
    """The paths of ``rows`` (in their order) that ``fnmatchcase`` matches with ``pattern``. A stack's RECORDs
    list tens of thousands of paths and detection runs for every framework: a pattern without a wildcard is
    one lookup, and a path that lacks the pattern's literal head or tail is never matched against it."""
    cut = min((i for i in (pattern.find(c) for c in "*?[") if i >= 0), default=-1)
    if cut < 0:
        return (pattern,) if pattern in rows else ()
    head = pattern[:cut]
    tail = pattern[pattern.rfind("*") + 1 :]
    if any(c in tail for c in "?[]"):
        tail = ""
    return [p for p in rows if p.startswith(head) and p.endswith(tail) and fnmatch.fnmatchcase(p, pattern)]


def _installed(framework: Framework, inventory: Inventory) -> tuple[Framework, Distribution] | None:
    """``framework`` as detected in ``inventory``: its ``distributions`` the detected one's (its bundled tools
    are looked up there), with that distribution; None when no installed distribution is it."""
    got = detect(framework, inventory)
    if got is None:
        return None
    return replace(framework, distributions=(got[0].key,)), got[0]


def _nvcc_wheel(inventory: Inventory) -> Emitter | None:
    """The newest installed nvidia-cuda-nvcc wheel: its CUDA release and the directory of its ``bin``."""
    best: tuple[tuple[int, int], Emitter] | None = None
    for dist in inventory.distributions:
        m = _RELEASE.match(dist.version)
        if not _NVCC_WHEEL.fullmatch(dist.key) or m is None:
            continue
        tools_dir = None
        for entry in dist.records:
            if entry.path.endswith("/bin/ptxas"):
                path = dist.abspath(entry)
                tools_dir = os.path.dirname(os.path.dirname(path)) if path is not None else None
                break
        key = (int(m[1]), int(m[2]))
        if best is None or key > best[0]:
            best = (key, Emitter(f"{key[0]}.{key[1]}", dist.label, tools_dir))
    return best[1] if best is not None else None


def _emitter(framework: Framework, dist: Distribution, inventory: Inventory) -> Emitter | None:
    if framework.rule == "ptx-isa":
        return _nvcc_wheel(inventory)
    if framework.rule == "same-major" and dist.cuda_major is not None:
        return Emitter(str(dist.cuda_major), f"{dist.label} ({dist.cuda_evidence})", None)
    return None


def _context(inventory: Inventory, environ: Mapping[str, str], root: str, image: bool = False) -> Context:
    locations = {d.key: d.location for d in reversed(inventory.distributions)}  # the first in search order wins
    dirs = tuple(inventory.site_dirs)
    return Context(environ=dict(environ), site_dirs=dirs, locations=locations, root=root, image=image)


def framework_lookups(
    inventory: Inventory, environ: Mapping[str, str], read: Callable[[str], ToolVersion], root: str = ""
) -> tuple[tuple[Distribution, Lookup], ...]:
    """Every tool of every installed framework, as that framework would find it."""
    ctx = _context(inventory, environ, root)
    safe = _reader(read)
    out: list[tuple[Distribution, Lookup]] = []
    for row in load_toolchain():
        got = _installed(row, inventory)
        if got is not None:
            framework, dist = got
            out.extend((dist, find_tool(framework, tool, ctx, safe)) for tool in framework.tools)
    return tuple(out)


def _bad(framework: Framework, lookup: Lookup, emitter: Emitter) -> bool:
    found = lookup.found
    if found is None or found.release is None:
        return False
    if framework.rule == "ptx-isa":
        return release_key(found.release) < release_key(emitter.release)
    return release_key(found.release)[0] != int(emitter.release)


def _failing(
    framework: Framework,
    ctx: Context,
    read: Callable[[str], ToolVersion | None],
    em: Emitter,
    had: frozenset[str] = frozenset(),
) -> list[Lookup]:
    """The tools still wrong in ``ctx``; a tool of ``had`` (found before the fix) that is no longer found at
    all counts too: a fix must leave the framework a tool that works, not none."""
    return [
        lk
        for tool in framework.tools
        if _bad(framework, lk := find_tool(framework, tool, ctx, read), em) or (lk.found is None and tool in had)
    ]


def _fixes(
    framework: Framework, found: Candidate, ctx: Context, emitter: Emitter | None
) -> Iterable[tuple[Remedy, Context]]:
    """Candidate fixes for the taken candidate ``found``, most direct first, each with the context it leads to."""
    env = dict(ctx.environ)
    if found.via.startswith("$"):
        name = found.via[1:]
        yield (
            Env(name, why=f"{framework.name} takes {found.path} through it"),
            replace(ctx, environ={k: v for k, v in env.items() if k != name}),
        )
    if emitter is not None and emitter.tools_dir is not None:
        value = emitter.tools_dir
        yield (
            Env(framework.fix_env, value, why=f"{emitter.label}'s tools"),
            replace(ctx, environ={**env, framework.fix_env: value}),
        )
        if found.via == "PATH":
            bin_dir = os.path.join(value, "bin")
            path = bin_dir + os.pathsep + env.get("PATH", "")
            after = replace(ctx, environ={**env, "PATH": path})
            yield SearchPath(bin_dir, "PATH", "prepend", why=f"{emitter.label}'s bin first"), after
    tool_dir = os.path.dirname(found.path)
    yield (
        Manual((f"remove or update the old tools in {tool_dir}",)),
        replace(ctx, hidden=ctx.hidden | {os.path.join(tool_dir, t) for t in framework.tools}),
    )


def _no_tool_fix(framework: Framework, tool: str, emitter: Emitter) -> tuple[Remedy, ...]:
    """The manual step when every change the model tries leaves the framework an unsuitable tool or none."""
    why = f"{NO_SAFE_REPAIR}: each change the model tries leaves {framework.name} an unsuitable {tool} or none"
    return (Manual((f"install a {tool} that matches {emitter.label} where {framework.name} looks first",), why=why),)


def _tool_text(lookup: Lookup, found: Candidate) -> str:
    version = found.version or "(states no version)"
    return f"{lookup.tool} {version} ({found.path}, via {found.via})"


def _where(lookup: Lookup) -> tuple[str, ...]:
    return tuple(f"{c.path} ({c.skipped or 'taken'})" for c in lookup.candidates)


def toolchain_findings(
    inventory: Inventory,
    environ: Mapping[str, str],
    read: Callable[[str], ToolVersion],
    root: str = "",
    image: bool = False,
) -> tuple[Finding, ...]:
    """One finding per installed framework whose first-found tools are older than (jax) or of another CUDA
    major than (torch) what the stack emits, with the fix the model verifies; an INFO per framework
    listing the tools it would run (``image``: ``environ`` is an image's, its paths under ``root``)."""
    ctx = _context(inventory, environ, root, image)
    safe = _reader(read)
    findings: list[Finding] = []
    for row in load_toolchain():
        got = _installed(row, inventory)
        if got is None:
            continue
        framework, dist = got
        lookups = [find_tool(framework, tool, ctx, safe) for tool in framework.tools]
        shown = [_tool_text(lk, lk.found) for lk in lookups if lk.found is not None]
        if shown:
            findings.append(
                Finding("toolchain", Severity.INFO, dist.label, f"{framework.name} runs " + "; ".join(shown))
            )
        emitter = _emitter(framework, dist, inventory)
        if emitter is None:
            continue
        bad = [(lk, lk.found) for lk in lookups if lk.found is not None and _bad(framework, lk, emitter)]
        if not bad:
            continue
        first, found = bad[0]
        release = found.release or ""  # _bad is True only for a found tool that states its release
        had = frozenset(lk.tool for lk in lookups if lk.found is not None)
        candidates = _fixes(framework, found, ctx, emitter)
        chosen = next((r for r, after in candidates if not _failing(framework, after, safe, emitter, had)), None)
        fix: tuple[Remedy, ...] = (chosen,) if chosen is not None else _no_tool_fix(framework, first.tool, emitter)
        tools = _tool_text(first, found)
        details = tuple(f"also {_tool_text(lk, c)}" for lk, c in bad[1:])
        if framework.rule == "ptx-isa":
            accepts, emits = max_ptx_isa(release), max_ptx_isa(emitter.release)
            message = (
                f"{framework.name} would run {tools}; it accepts PTX ISA <= {accepts}, but {framework.name}'s "
                f"compiler stack emits PTX ISA {emits} (CUDA {emitter.release}, {emitter.label}): compiling "
                f"fails with \"Unsupported .version {emits}; current version is '{accepts}'\""
            )
            severity = Severity.ERROR
            cause = f"{found.path} comes first in {framework.name}'s lookup (via {found.via})"
        else:
            message = (
                f"{framework.name} would run {tools}, CUDA {release}, but {emitter.label} is CUDA "
                f'{emitter.release}: building a C++/CUDA extension fails with "The detected CUDA version '
                f'({release}) mismatches the version that was used to compile PyTorch"'
            )
            severity = Severity.WARNING  # only extension builds run nvcc
            cause = f"{found.path} is the nvcc {framework.name} finds first (via {found.via})"
        findings.append(
            Finding(
                "toolchain",
                severity,
                dist.label,
                message,
                cause=cause,
                remedies=fix,
                where=_where(first),
                details=details,
                distributions=(dist.key,),
            )
        )
    return tuple(findings)


def _arch_tool(framework: Framework, arch: Arch) -> str | None:
    """The tool ``framework`` compiles device code for ``arch`` with: triton's ptxas-blackwell for sm_100 and
    later (its backends/nvidia/compiler.py), else ptxas (jax, triton), else nvcc (torch's extensions)."""
    if arch.major >= 10 and "ptxas-blackwell" in framework.tools:
        return "ptxas-blackwell"
    return next((t for t in ("ptxas", "nvcc") if t in framework.tools), None)


def _too_old(found: Candidate | None, arch: Arch) -> str | None:
    """The first CUDA release whose tools accept ``arch``, when ``found`` states an older release."""
    need = arch_first_cuda(arch)
    if found is None or found.release is None or need is None:
        return None
    return str(need) if release_key(found.release) < need.mm else None


def _arch_failing(
    framework: Framework, ctx: Context, read: Callable[[str], ToolVersion | None], archs: Sequence[Arch]
) -> bool:
    """Whether the model of ``ctx`` still fails some arch: a tool too old for it, or none left to run."""
    for arch in archs:
        tool = _arch_tool(framework, arch)
        if tool is None:
            continue
        found = find_tool(framework, tool, ctx, read).found
        if found is None or _too_old(found, arch) is not None:
            return True
    return False


def arch_tool_findings(
    inventory: Inventory,
    environ: Mapping[str, str],
    read: Callable[[str], ToolVersion],
    archs: Sequence[str],
    root: str = "",
    image: bool = False,
) -> tuple[Finding, ...]:
    """One finding per installed framework whose first-found ptxas (nvcc for torch) is of a CUDA older than the
    first whose tools accept a target GPU arch (``gpu_code.json``'s ``arch_cuda``, from the PTX ISA release
    history): it rejects the target ("Value 'sm_100' is not defined for option 'gpu-name'"). triton compiles
    every kernel with it (ERROR); XLA and torch's extension builds only some (WARNING)."""
    targets: list[Arch] = []
    for name in archs:
        try:
            targets.append(parse_arch(name))
        except OptionError:
            continue
    if not targets:
        return ()
    ctx = _context(inventory, environ, root, image)
    safe = _reader(read)
    findings: list[Finding] = []
    for row in load_toolchain():
        got = _installed(row, inventory)
        if got is None:
            continue
        framework, dist = got
        bad: list[tuple[Arch, Lookup, Candidate, str]] = []
        for arch in targets:
            tool = _arch_tool(framework, arch)
            if tool is None:
                continue
            lookup = find_tool(framework, tool, ctx, safe)
            need = _too_old(lookup.found, arch)
            if need is not None and lookup.found is not None:
                bad.append((arch, lookup, lookup.found, need))
        if not bad:
            continue
        arch, lookup, found, need = bad[0]
        candidates = _fixes(framework, found, ctx, _emitter(framework, dist, inventory))
        chosen = next((r for r, after in candidates if not _arch_failing(framework, after, safe, targets)), None)
        fix: tuple[Remedy, ...] = (chosen,) if chosen is not None else ()
        names = ", ".join(str(a) for a, *_ in bad)
        message = (
            f"{framework.name} would run {_tool_text(lookup, found)}, CUDA {found.release}, to compile for "
            f"{names}; {arch} needs the tools of CUDA {need} or later: it fails with \"Value '{arch}' is not "
            f"defined for option 'gpu-name'\""
        )
        findings.append(
            Finding(
                "toolchain",
                Severity.ERROR if framework.rule == "self" else Severity.WARNING,
                dist.label,
                message,
                cause=f"{found.path} comes first in {framework.name}'s lookup (via {found.via})",
                remedies=fix,
                where=_where(lookup),
                details=tuple(f"also {a}: needs CUDA {n} ({_tool_text(lk, c)})" for a, lk, c, n in bad[1:]),
                distributions=(dist.key,),
            )
        )
    return tuple(findings)


def run(stack: StackView, target: Target | None = None) -> tuple[Finding, ...]:
    """The ``toolchain`` item, over this process's environment and the target GPU archs, when known."""
    image = stack.image
    # an image's tools are found by its own environment, inside its root; never this machine's
    environ, root = (image.env, image.root) if image is not None else (os.environ, "")
    read = stack.cache.tool_version
    inside = image is not None
    found = toolchain_findings(stack.inventory, environ, read, root, inside) + driverlookups.run(stack)
    archs = stack.driver.archs
    if not archs:
        return found
    return found + arch_tool_findings(stack.inventory, environ, read, archs, root, inside)


def nothing_to_check(stack: StackView, target: Target | None = None) -> str | None:
    """Why the ``toolchain`` item is skipped: no installed framework runs a CUDA compiler tool."""
    frameworks = load_toolchain()
    if any(_installed(f, stack.inventory) is not None for f in frameworks):
        return None
    names = ", ".join(f.name for f in frameworks)
    return f"no framework that runs a CUDA compiler tool is installed ({names}; recognised by their files)"
