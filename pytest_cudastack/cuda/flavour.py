"""Which CUDA a Python distribution is built for: the rules over its name, version, requirements and paths.

The rules' data (name regexes, the ``cuda-toolkit`` meta package, the unsuffixed CUDA 13 names, install
directories) is ``data/cuda_compat.json``'s ``wheels`` table, loaded by :mod:`pytest_cudastack.cuda.compat`;
names are compared canonicalised (PEP 503), versions and pins read as PEP 440 / PEP 508.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from pytest_cudastack.cuda.compat import load_compat, soname_cuda_majors
from pytest_cudastack.cuda.versions import parse_cuda

__all__ = ["cuda_major_for_soname_in_wheel", "wheel_cuda_flavour", "wheel_cuda_requirement"]

logger = logging.getLogger(__name__)


def _fmt_mm(version: Version) -> str:
    """``"13.0"`` for a distribution version 13.0.3 (a CUDA-tracking wheel's version is its CUDA's)."""
    release = (*version.release, 0)
    return f"{release[0]}.{release[1]}"


def _req_pins(requires: Sequence[str]) -> list[tuple[str, Requirement]]:
    out = []
    for text in requires:
        try:
            req = Requirement(text)
        except ValueError:  # InvalidRequirement, or a version over the digit limit
            logger.debug("ignoring unparsable requirement %r", text)
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue  # optional extra, not what this build needs
        out.append((text, req))
    return out


def _pinned_version(req: Requirement) -> Version | None:
    """The exact pin (``==13.0.3``), else the lower bound (``>=13.0.88,<14``, ``~=12.8``), else None."""
    lower: Version | None = None
    for spec in req.specifier:
        text = spec.version.rstrip(".*")
        try:
            version = Version(text)
        except ValueError:  # InvalidVersion, or a number over the digit limit
            continue
        if spec.operator in ("==", "===") and "*" not in spec.version:
            return version
        if spec.operator in (">=", "~=", ">", "==") and (lower is None or version > lower):
            lower = version
    return lower


def _requirement_from_name(name: str, version: str | None) -> tuple[str | None, str]:
    """CUDA requirement implied by one distribution (name + version) without looking at its deps."""
    data = load_compat()
    cname = canonicalize_name(name)
    parsed: Version | None = None
    if version:
        try:
            parsed = Version(version)
        except ValueError:  # InvalidVersion, or a number over the digit limit
            parsed = None
    for rx, template, unconfirmed in data.name_rules:
        m = rx.match(cname)
        if not m or unconfirmed:
            continue
        major = int(m["major"])
        evidence = template.format(major=major)
        base = m.groupdict().get("base")
        if (
            parsed is not None
            and base is not None
            and base in data.tracks_cuda_suffixed
            and parsed.major == major
            and len(parsed.release) > 1
        ):
            return _fmt_mm(parsed), f"{evidence} ({name} {version})"
        return str(major), evidence
    if parsed is not None and parsed.local:
        lm = data.local_version.match(parsed.local)
        if lm:
            return f"{int(lm['major'])}.{lm['minor']}", f"local version +{parsed.local}"
        return None, f"local version +{parsed.local} (not a CUDA build)"
    if cname in data.meta_packages:
        if parsed is None:
            return None, f"{name}: unparsable version {version!r}"
        return _fmt_mm(parsed), f"{name} meta package {version}"
    for row in data.unsuffixed:
        if row.name != cname:
            continue
        if parsed is None:
            return None, f"unsuffixed {name} with unparsable version {version!r}"
        if parsed >= row.min_version:
            if row.tracks_cuda and parsed.major == row.major and len(parsed.release) > 1:
                return _fmt_mm(parsed), f"unsuffixed {name} {version} (CUDA {row.major} naming)"
            return str(row.major), f"unsuffixed {name} {version} (CUDA {row.major} naming)"
        return None, f"unsuffixed {name} {version}: older than the CUDA {row.major} series; major unknown"
    return None, ""


def wheel_cuda_requirement(
    name: str, version: str, requires: Sequence[str] = (), paths: Sequence[str] = ()
) -> tuple[str | None, str]:
    """The CUDA version a distribution needs: ("13.0", evidence), ("13", evidence) when only the major is
    known, or (None, reason) when it is not a CUDA wheel.

    Evidence, in this order: the name (``-cu12``), the local version (``+cu130``), the ``cuda-toolkit``
    meta package's own version, the unsuffixed CUDA 13 names, the CUDA pins in Requires-Dist
    (``cuda-toolkit[...]==13.0.3``, ``nvidia-*-cu13``), then shipped paths (``nvidia/cu13/lib``).
    """
    cuda, evidence = _requirement_from_name(name, version)
    if cuda is not None or evidence.startswith("local version"):
        return cuda, evidence
    # Requires-Dist pins
    found: list[tuple[str, str, str]] = []  # (cuda, evidence, pinned name)
    for text, req in _req_pins(requires):
        pinned = _pinned_version(req)
        dep_cuda, _ = _requirement_from_name(req.name, str(pinned) if pinned is not None else None)
        if dep_cuda is None:
            continue
        spec = str(req.specifier)
        found.append((dep_cuda, f"pins {req.name}{spec}" if spec else f"requires {req.name}", text))
    if found:
        majors = {parse_cuda(c).major for c, _, _ in found}
        if len(majors) > 1:
            listed = "; ".join(ev for _, ev, _ in found)
            return None, f"requires packages of several CUDA majors ({listed})"
        # prefer the most precise (major.minor) and, among those, a meta package pin
        precise = [f for f in found if "." in f[0]]
        metas = [f for f in precise if canonicalize_name(Requirement(f[2]).name) in load_compat().meta_packages]
        best = (metas or precise or found)[0]
        return best[0], best[1]
    for path in paths:
        for rx, template in load_compat().install_dirs:
            m = rx.search(path.replace("\\", "/"))
            if m:
                return str(int(m["major"])), template.format(major=int(m["major"]))
    return None, evidence or "no CUDA evidence (name, version, requirements, paths)"


def wheel_cuda_flavour(
    name: str, version: str, requires: Sequence[str] = (), paths: Sequence[str] = ()
) -> tuple[int | None, str]:
    """(CUDA major, evidence) of a distribution; (None, reason) when it is not a CUDA wheel."""
    cuda, evidence = wheel_cuda_requirement(name, version, requires, paths)
    if cuda is None:
        return None, evidence
    return parse_cuda(cuda).major, evidence


def cuda_major_for_soname_in_wheel(soname: str, wheel_major: int | None) -> frozenset[int] | None:
    """Narrow an ambiguous soname by the CUDA major of the wheel shipping it.

    ``libcudnn.so.9`` in nvidia-cudnn-cu12 is CUDA 12.  A wheel major outside the soname's set is a
    contradiction; the soname's own answer wins then.
    """
    majors = soname_cuda_majors(soname)
    if majors is None or wheel_major is None:
        return majors
    if wheel_major in majors:
        return frozenset({wheel_major})
    return majors
