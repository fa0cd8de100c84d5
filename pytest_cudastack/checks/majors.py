"""Mixed CUDA majors: a module or provider built for another CUDA major than the stack's.

The stack's major is torch's flavour (``Distribution.cuda_major`` of the ``torch`` distribution,
:mod:`pytest_cudastack.cuda.flavour`), else the major most CUDA wheels are built for (none on a tie). A
shipped library of a distribution that is not an NVIDIA library wheel (an extension module, or a provider
such as ONNX Runtime's ``libonnxruntime_providers_cuda.so``) is built for the CUDA majors its DT_NEEDED
CUDA sonames all allow (``dlopen.caller_majors``); one whose majors exclude the stack's fails at import, or,
for a provider loaded at run time, falls back silently. Each is an ERROR of the closure item (design.md:
"Mixed CUDA majors are errors of the closure item"), naming both sides and the two ways out: the other
build of that package, or a torch built for the other major.

Always on with ``--cudastack``: no ``--cuda-min``/``--cuda-max`` is needed.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable

from packaging.utils import canonicalize_name

from pytest_cudastack.cuda.compat import soname_cuda_majors
from pytest_cudastack.errors import ElfError
from pytest_cudastack.findings import Finding, Severity, manual
from pytest_cudastack.linker.elf import ElfInfo
from pytest_cudastack.model.repair import NO_SAFE_REPAIR
from pytest_cudastack.wheels.inventory import Distribution, Inventory

__all__ = ["linked_majors", "majors_findings", "stack_major"]

_SUFFIX = re.compile(r"(cu(?:da)?)(\d+)")  # -cu12, cupy-cuda12x, jax-cuda12-plugin
_LOCAL = re.compile(r"\+cu(\d+)")


def stack_major(inv: Inventory) -> tuple[int | None, str]:
    """(the stack's CUDA major, the evidence): torch's flavour, else the majority of CUDA wheels."""
    for d in inv.distributions:
        if canonicalize_name(d.name) == "torch" and d.cuda_major is not None:
            return d.cuda_major, f"{d.label} is built for CUDA {d.cuda_major}"
    counts = Counter(d.cuda_major for d in inv.distributions if d.cuda_major is not None)
    ranked = counts.most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None, "no torch and no majority of CUDA wheels"
    major, n = ranked[0]
    return major, f"{n} of {sum(counts.values())} CUDA wheels are built for CUDA {major}"


def linked_majors(info: ElfInfo) -> tuple[frozenset[int], tuple[str, ...]]:
    """The CUDA majors a file's DT_NEEDED CUDA sonames all allow (all they name when they disagree), and
    those sonames."""
    named = [(n, m) for n in info.needed if (m := soname_cuda_majors(n))]
    if not named:
        return frozenset(), ()
    common = frozenset.intersection(*(m for _, m in named))
    return common or frozenset().union(*(m for _, m in named)), tuple(n for n, _ in named)


def _other_build(d: Distribution, want: int) -> str:
    """What to install instead, by hand: the model holds no file of a build that is not installed, so this is
    never a verified command."""
    m = _SUFFIX.search(d.name)
    if m:
        other = d.name[: m.start()] + f"{m.group(1)}{want}" + d.name[m.end() :]
        return f"install {other} (the CUDA {want} build of {d.name}) in its place"
    if _LOCAL.search(d.version):
        return f"install {d.name} {_LOCAL.sub('', d.version)} from its CUDA {want} index (+cu{want}X) in its place"
    return f"install the build of {d.name} for CUDA {want} in its place"


def majors_findings(inv: Inventory, read: Callable[[str], ElfInfo], rel: Callable[[str], str]) -> tuple[Finding, ...]:
    """The mixed-major ERRORs of ``inv`` (module docstring); ``rel`` names files relative to their site."""
    want, evidence = stack_major(inv)
    if want is None:
        return ()
    findings: list[Finding] = []
    torch = inv.get("torch")
    for d in inv.distributions:
        if canonicalize_name(d.name).startswith("nvidia-"):
            continue  # the CUDA libraries themselves: the integrity and closure items judge them
        for lib in d.libraries:
            if not lib.exists or lib.problem:
                continue
            try:
                info = read(lib.path)
            except ElfError:
                continue
            got, names = linked_majors(info)
            if not got or want in got:
                continue
            other = "/".join(map(str, sorted(got)))
            kind = "extension module" if lib.pyinit else "library"
            findings.append(
                Finding(
                    check="closure",
                    severity=Severity.ERROR,
                    subject=rel(lib.path),
                    message=f"{rel(lib.path)} ({kind} of {d.label}) is built for CUDA {other}; the stack is CUDA "
                    f"{want}",
                    cause=f"it links {', '.join(names)} (CUDA {other}); {evidence}: one process cannot use both "
                    "majors, so the import fails or, for a provider loaded at run time, silently falls back",
                    remedies=manual(
                        f"{NO_SAFE_REPAIR}: the other build is not installed here to check. By hand: "
                        f"{_other_build(d, want)}"
                        + (f", or a torch built for CUDA {other}" if torch is not None and len(got) == 1 else "")
                    ),
                    where=(os.path.dirname(lib.path),),
                    chain=(rel(lib.path),),
                    details=tuple(f"links {n}" for n in names),
                )
            )
    return tuple(findings)
