"""Every installed distribution's Requires-Dist, evaluated as pip's resolver (``pip check``) evaluates it.

For each distribution of an :class:`~pytest_cudastack.wheels.inventory.Inventory` its Requires-Dist (read by
:mod:`pytest_cudastack.wheels.distinfo` through the inventory) is parsed with ``packaging``; markers are
evaluated for the *inspected* interpreter (``python_version`` / ``python_full_version`` from the site
directory's ``lib/pythonX.Y`` and its venv's ``pyvenv.cfg``, the rest from this interpreter); each active
requirement is looked up by canonical name, first in search order (what ``import`` finds), and its
specifier tested with ``prereleases=True`` (pip's ``check_package_set``). The result is a frozen
:class:`RequirementFact` per active requirement: met, missing, or another version installed.

Extras. pip records no extras in a dist-info, so which extras of a distribution count as installed is
decided here, in two ways (documented choice):

* **requested**: another installed distribution's active requirement asks for it
  (torch's ``cuda-toolkit[cublas,cudart,...]==13.0.3``), followed transitively to a fixed point;
* **inferred**: an extra none requests whose every requirement (under the markers) names an installed
  distribution (``jax[cuda12]`` after ``pip install jax[cuda12]``: ``jaxlib`` and ``jax-cuda12-plugin`` are
  both there). A requirement active only through an inferred extra is ``inferred=True``: its absence cannot
  be seen (an extra with a missing requirement is not inferred) and its unmet pin may belong to an extra the
  user never asked for, so the checks report it less severely.

Nothing here decides what a problem *means*; :mod:`pytest_cudastack.checks.requirements` does.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.markers import Marker, default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from pytest_cudastack._sysio import read_text
from pytest_cudastack.image.pythons import installation_version
from pytest_cudastack.wheels.inventory import Distribution, Inventory, install_prefix

__all__ = [
    "RequirementFact",
    "Requirements",
    "Status",
    "evaluate_marker",
    "evaluate_requirement",
    "marker_environment",
    "requirement_facts",
    "site_python",
]

logger = logging.getLogger(__name__)

_PYDIR = re.compile(r"^python(\d+)\.(\d+)t?$")
_PYVENV_VERSION = re.compile(r"^\s*version(?:_info)?\s*=\s*(\d+\.\d+\.\d+)\S*\s*$", re.MULTILINE)


class Status(str, enum.Enum):
    """What pip would say of one requirement."""

    MET = "met"
    MISSING = "missing"  # no distribution of that name is installed
    VERSION = "version"  # installed, but its version is not in the specifier (or is not a PEP 440 version)


@dataclass(frozen=True)
class RequirementFact:
    """One active requirement of ``requirer`` (None: asked by a caller such as ``requires_wheel``).

    ``extra`` is the extra that activated it ("" for an unconditional one); ``inferred`` is True when that
    extra counts as installed only because all its requirements are (see the module docstring);
    ``installed`` is the distribution of that name first in search order, None when absent.
    """

    requirer: Distribution | None
    requirement: Requirement
    extra: str
    inferred: bool
    installed: Distribution | None
    status: Status

    @property
    def name(self) -> str:
        """The required distribution's canonical name."""
        return canonicalize_name(self.requirement.name)

    @property
    def text(self) -> str:
        """``nvidia-nccl-cu13==2.30.7`` (extras included, marker left out)."""
        r = self.requirement
        extras = f"[{','.join(sorted(r.extras))}]" if r.extras else ""
        return f"{r.name}{extras}{r.specifier}"

    @property
    def pin(self) -> str | None:
        """The version an exact ``==`` pin (no wildcard) names, else None."""
        for spec in self.requirement.specifier:
            if spec.operator in ("==", "===") and not spec.version.endswith(".*"):
                return spec.version
        return None

    @property
    def requester(self) -> str:
        """``torch 2.14.1`` or ``torch 2.14.1 [extra cuda12]``; ``the caller`` without a requirer."""
        if self.requirer is None:
            return "the caller"
        return self.requirer.label + (f" [extra {self.extra}]" if self.extra else "")

    @property
    def met(self) -> bool:
        return self.status is Status.MET


@dataclass(frozen=True)
class Requirements:
    """Every active requirement of every installed distribution, and the extras counted as installed."""

    facts: tuple[RequirementFact, ...]
    extras: Mapping[str, Mapping[str, str]]  # canonical name -> extra -> "requested by X" / "inferred"
    unparsable: tuple[tuple[Distribution, str, str], ...]  # (distribution, Requires-Dist text, error)

    @property
    def unmet(self) -> tuple[RequirementFact, ...]:
        return tuple(f for f in self.facts if not f.met)

    def of(self, dist: Distribution) -> tuple[RequirementFact, ...]:
        """The active requirements ``dist`` states."""
        return tuple(f for f in self.facts if f.requirer is dist)

    def on(self, name: str) -> tuple[RequirementFact, ...]:
        """The active requirements that name ``name`` (any spelling)."""
        key = canonicalize_name(name)
        return tuple(f for f in self.facts if f.name == key)


# ----------------------------------------------------------------------------------------------------------
# marker environment


def site_python(location: str) -> str | None:
    """The inspected interpreter's ``X.Y.Z`` from its site directory: ``pyvenv.cfg``'s ``version`` when the
    prefix is a venv of that minor, else ``X.Y.0`` from ``lib/pythonX.Y/``; for Debian's version-less
    ``P/lib/python3/dist-packages`` (every ``P/bin/python3.X`` reads it), the version of ``P/bin/python3``
    read from its files (:func:`~pytest_cudastack.image.pythons.installation_version`); None when the files
    say nothing."""
    parts = os.path.normpath(location).split(os.sep)
    minor = next((m for p in reversed(parts[-3:]) if (m := _PYDIR.match(p))), None)
    if minor is None and len(parts) >= 4 and parts[-3:] == ["lib", "python3", "dist-packages"]:
        shared = installation_version(os.sep.join(parts[:-3]) or os.sep)
        if shared is None:
            return None
        return shared.version if shared.version.count(".") == 2 else f"{shared.version}.0"
    if minor is None:
        return None
    text = read_text(os.path.join(install_prefix(location), "pyvenv.cfg"))
    found = _PYVENV_VERSION.search(text) if text is not None else None
    if found is not None and found[1].split(".")[:2] == [minor[1], minor[2]]:
        return found[1]
    return f"{minor[1]}.{minor[2]}.0"


def marker_environment(location: str | None = None) -> dict[str, str]:
    """PEP 508's marker environment for the interpreter owning site directory ``location``: packaging's
    ``default_environment()`` (this interpreter's), with ``python_version`` / ``python_full_version`` (and, for
    CPython, ``implementation_version``) of the inspected one when its site directory's layout names another
    (``--site`` of another venv). Only what differs is overridden, as packaging's own callers do."""
    env: dict[str, str] = {key: str(value) for key, value in default_environment().items()}
    full = site_python(location) if location is not None else None
    if full is not None and full.split(".")[:2] != env["python_version"].split("."):
        env["python_full_version"] = full
        env["python_version"] = ".".join(full.split(".")[:2])
        if env["implementation_name"] == "cpython":
            env["implementation_version"] = full
    return env


def evaluate_marker(marker: Marker, env: Mapping[str, str]) -> bool | str:
    """``marker.evaluate(env)``, or why it cannot be evaluated: the one place packaging's marker evaluation
    is called on what a file states (Requires-Dist, read by the requirements item and the repair model) or
    a test marks. packaging raises ``ValueError`` subclasses for an undefined name or an incomparable pair
    (``UndefinedComparison``: ``python_version ~= "3"``), and a bare ``ValueError`` for a version literal
    over the interpreter's integer digit limit (``python_version > "1000...0"``, 5,000 digits)."""
    try:
        return bool(marker.evaluate(dict(env)))
    except (ValueError, RecursionError) as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


_EXTRA_LITERAL = re.compile(r"""extra\s*[=!]=\s*['"]([^'"]+)['"]|['"]([^'"]+)['"]\s*[=!]=\s*extra""")


class _Markers:
    """Marker verdicts memoised per (marker, extra, environment); a marker that cannot be evaluated
    (:func:`evaluate_marker`: undefined name, incomparable values, a version too long) is False, as not
    applying, and why is kept in ``failed`` (reported with the unparsable requirements).

    An extra the marker never names evaluates as the empty extra does (``extra`` is only compared for
    equality with literals), so a marker is evaluated at most once per extra it names, plus once."""

    def __init__(self) -> None:
        self._memo: dict[tuple[int, str, int], bool] = {}
        self._named: dict[int, frozenset[str]] = {}
        self._envs: dict[str, dict[str, str]] = {}
        self.failed: dict[int, str] = {}  # id(marker) -> why it cannot be evaluated

    def env(self, location: str) -> dict[str, str]:
        if location not in self._envs:
            self._envs[location] = marker_environment(location)
        return self._envs[location]

    def named(self, marker: Marker) -> frozenset[str]:
        """The extras ``marker`` compares ``extra`` with, canonicalised."""
        key = id(marker)
        if key not in self._named:
            found = _EXTRA_LITERAL.findall(str(marker))
            self._named[key] = frozenset(canonicalize_name(a or b) for a, b in found)
        return self._named[key]

    def holds(self, marker: Marker | None, extra: str, env: Mapping[str, str]) -> bool:
        if marker is None:
            return extra == ""
        if extra and extra not in self.named(marker):
            extra = ""
        key = (id(marker), extra, id(env))
        if key not in self._memo:
            verdict = evaluate_marker(marker, {**env, "extra": extra})
            if isinstance(verdict, str):
                self.failed.setdefault(id(marker), verdict)
            self._memo[key] = verdict is True
        return self._memo[key]


def _satisfied(req: Requirement, dist: Distribution | None) -> Status:
    if dist is None:
        return Status.MISSING
    try:
        version = Version(dist.version)
    except ValueError:  # InvalidVersion, or a release number over the digit limit
        return Status.VERSION  # pip check: a non-PEP 440 version satisfies no specifier but the empty one
    if not req.specifier or req.specifier.contains(version, prereleases=True):
        return Status.MET
    return Status.VERSION


# ----------------------------------------------------------------------------------------------------------
# evaluation


@functools.lru_cache(maxsize=8192)
def _requirement(text: str) -> Requirement | str:
    """``Requirement(text)``, or why it is not one (parsed once per text: a torch venv states ~300). A
    specifier whose version packaging parses by pattern but cannot compare (a release number over the
    integer digit limit, where ``contains`` raises) is not one either."""
    try:
        req = Requirement(text)
        for spec in req.specifier:
            if spec.operator != "===":
                Version(spec.version.removesuffix(".*"))
    except (ValueError, RecursionError) as e:  # InvalidRequirement and InvalidVersion are ValueErrors
        return f"{type(e).__name__}: {str(e)[:200]}" if not isinstance(e, InvalidRequirement) else str(e)
    return req


def _parse(dist: Distribution, bad: list[tuple[Distribution, str, str]]) -> list[Requirement]:
    out: list[Requirement] = []
    for text in dist.requires:
        got = _requirement(text)
        if isinstance(got, str):
            bad.append((dist, text, got))
        else:
            out.append(got)
    return out


def _extras_of(reqs: Iterable[Requirement], markers: _Markers) -> set[str]:
    """The extras a distribution's requirements name in their markers."""
    return {e for req in reqs if req.marker is not None for e in markers.named(req.marker)}


def requirement_facts(inv: Inventory) -> Requirements:
    """The active requirements of every distribution of ``inv``, with the extras counted as installed.

    Base requirements first (marker without ``extra``), then those of each requested extra, transitively;
    then the inferred extras (every requirement present by name) and what they request in turn. A
    distribution installed twice is evaluated in its first copy (the one imported)."""
    bad: list[tuple[Distribution, str, str]] = []
    markers = _Markers()
    firsts = [d for d in inv.distributions if inv.get(d.name) is d]
    parsed = {id(d): _parse(d, bad) for d in firsts}
    # canonical name -> extra -> (inferred, who asked)
    extras: dict[str, dict[str, tuple[bool, str]]] = {}

    actives: dict[tuple[int, str], list[Requirement]] = {}

    def active(d: Distribution, extra: str) -> list[Requirement]:
        key = (id(d), extra)
        if key not in actives:
            env = markers.env(d.location)
            actives[key] = [r for r in parsed[id(d)] if markers.holds(r.marker, extra, env)]
        return actives[key]

    def spread() -> None:
        """Extras asked by the active requirements, to a fixed point; a certain request replaces an
        inferred one (an extra is inferred only while every path to it goes through an inferred extra)."""
        changed = True
        while changed:
            changed = False
            for d in firsts:
                for extra, (inferred, _) in [("", (False, "")), *list(extras.get(d.key, {}).items())]:
                    for req in active(d, extra):
                        asked = extras.setdefault(canonicalize_name(req.name), {})
                        for e in map(canonicalize_name, req.extras):
                            old = asked.get(e)
                            if old is None or (old[0] and not inferred):
                                asked[e] = (inferred, d.label)
                                changed = True

    spread()

    def complete(d: Distribution, extra: str, visiting: set[tuple[str, str]]) -> bool:
        """Is every requirement ``d[extra]`` adds installed, and so, recursively, every extra they ask for
        that is not already counted (what ``pip install d[extra]`` would have left)?"""
        if (d.key, extra) in visiting:
            return True
        visiting.add((d.key, extra))
        env = markers.env(d.location)
        own = [r for r in active(d, extra) if not markers.holds(r.marker, "", env)]
        if not own:
            return False
        for req in own:
            dep = inv.get(req.name)
            if dep is None or id(dep) not in parsed:
                return False
            for e in map(canonicalize_name, req.extras):
                if e not in extras.get(dep.key, {}) and not complete(dep, e, visiting):
                    return False
        return True

    for d in firsts:
        asked = extras.setdefault(d.key, {})
        for extra in sorted(_extras_of(parsed[id(d)], markers) - set(asked)):
            if complete(d, extra, set()):
                asked[extra] = (True, "")
    spread()

    facts: list[RequirementFact] = []
    for d in firsts:
        env = markers.env(d.location)
        seen: set[str] = set()
        for extra, inferred in [("", False), *((e, v[0]) for e, v in sorted(extras.get(d.key, {}).items()))]:
            for req in parsed[id(d)]:
                if not markers.holds(req.marker, extra, env):
                    continue
                if extra and markers.holds(req.marker, "", env):
                    continue  # unconditional: stated once, under ""
                ident = f"{req}"
                if ident in seen:
                    continue
                seen.add(ident)
                installed = inv.get(req.name)
                facts.append(RequirementFact(d, req, extra, inferred, installed, _satisfied(req, installed)))
    for d in firsts:  # a marker that cannot be evaluated did not apply: said with the unparsable ones
        bad += [
            (d, str(req), f"marker cannot be evaluated: {markers.failed[id(req.marker)]}")
            for req in parsed[id(d)]
            if req.marker is not None and id(req.marker) in markers.failed
        ]
    shown = {k: {e: _why(inf, who) for e, (inf, who) in v.items()} for k, v in extras.items() if v}
    return Requirements(tuple(facts), shown, tuple(bad))


def _why(inferred: bool, who: str) -> str:
    if not who:
        return "inferred: all its requirements are installed"
    return f"requested by {who}" + (" through an inferred extra" if inferred else "")


def evaluate_requirement(req: Requirement | str, inv: Inventory) -> tuple[RequirementFact, ...]:
    """``req`` as a caller states it (``requires_wheel("jax[cuda12]>=0.4")``): its own fact, then the facts
    of every requirement its extras activate on the installed distribution (``jax[cuda12]`` is met only
    when jax's ``cuda12`` requirements are too). Markers of ``req`` itself are the caller's business."""
    r = Requirement(req) if isinstance(req, str) else req
    installed = inv.get(r.name)
    out = [RequirementFact(None, r, "", False, installed, _satisfied(r, installed))]
    if installed is None or not r.extras:
        return tuple(out)
    markers = _Markers()
    env = markers.env(installed.location)
    for extra in sorted(canonicalize_name(e) for e in r.extras):
        for sub in _parse(installed, []):
            if markers.holds(sub.marker, extra, env) and not markers.holds(sub.marker, "", env):
                dist = inv.get(sub.name)
                out.append(RequirementFact(installed, sub, extra, False, dist, _satisfied(sub, dist)))
    return tuple(out)
