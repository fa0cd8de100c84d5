"""The shape every check reports in: a finding that explains itself."""

from __future__ import annotations

import enum
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from pytest_cudastack.escape import printable

__all__ = [
    "SEVERITY_ORDER",
    "DriverUpgrade",
    "Env",
    "Facts",
    "Finding",
    "Manual",
    "Pip",
    "Provenance",
    "Rebuild",
    "Remedy",
    "SearchPath",
    "Severity",
    "UseBuild",
    "manual",
    "most_severe_first",
    "remedy_from_json",
]

_COMPACT_ITEMS = 3  # places looked in and details the compact form lists before saying how many more
# The full form's caps: an RPATH at the ELF reader's cap (4,096 directories) times 1,000 missing sonames
# printed 100 MB; --json keeps every entry.
_FULL_ITEMS = 50  # places looked in and details
_FULL_CHAIN = 20  # hops of a load chain (the first and last halves are shown)
_MAX_TEXT = 2000  # characters of one field (a soname can be a 100 KB string)


class Severity(str, enum.Enum):
    """How much a finding matters; declared most severe first, the order findings are shown in."""

    ERROR = "error"  # fails the invariant item / `cudastack check` exits 1
    WARNING = "warning"  # shown, never fails
    INFO = "info"  # a fact worth reporting (optional plugin with an absent dep, no driver here)

    @property
    def rank(self) -> int:
        """0 for ERROR, 1 for WARNING, 2 for INFO: the sort key that puts the most severe first."""
        return SEVERITY_ORDER.index(self)


SEVERITY_ORDER: tuple[Severity, ...] = tuple(Severity)


@dataclass(frozen=True)
class Pip:
    """``python -m pip VERB [FLAGS] SPEC...`` in one environment: ``python`` is that environment's interpreter
    (``<prefix>/bin/python``), "" where no interpreter of its own is known (plain ``pip``). The only kind of
    remedy the repair plan runs automatically, and only once its model has verified it."""

    verb: str  # "install" | "uninstall"
    specs: tuple[str, ...]
    python: str = ""
    flags: tuple[str, ...] = ()
    index_url: str | None = None
    why: str = ""
    kind: ClassVar[str] = "pip"

    @property
    def argv(self) -> tuple[str, ...]:
        head = (self.python, "-m", "pip") if self.python else ("pip",)
        index = ("--index-url", self.index_url) if self.index_url else ()
        return (*head, self.verb, *self.flags, *index, *self.specs)

    def render(self) -> str:
        return shlex.join(self.argv)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "verb": self.verb,
            "specs": list(self.specs),
            "python": self.python,
            "flags": list(self.flags),
            "index_url": self.index_url,
            "argv": list(self.argv),
            "why": self.why,
        }


@dataclass(frozen=True)
class Env:
    """Set (``value``) or unset (None) an environment variable where the software runs."""

    variable: str
    value: str | None = None
    why: str = ""
    kind: ClassVar[str] = "env"

    def render(self) -> str:
        return f"unset {self.variable}" if self.value is None else f"export {self.variable}={shlex.quote(self.value)}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "variable": self.variable, "value": self.value, "why": self.why}


@dataclass(frozen=True)
class SearchPath:
    """Remove ``directory`` from, or prepend it to, a search path (``LD_LIBRARY_PATH``, an RPATH, ld.so.conf)."""

    directory: str
    path: str = "LD_LIBRARY_PATH"
    op: str = "remove"  # "remove" | "prepend"
    why: str = ""
    kind: ClassVar[str] = "search-path"

    def render(self) -> str:
        if self.op == "prepend" and self.path == "LD_LIBRARY_PATH":
            return f"export LD_LIBRARY_PATH={shlex.quote(self.directory)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
        return f"{self.op} {self.directory} {'from' if self.op == 'remove' else 'to'} {self.path}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "directory": self.directory, "path": self.path, "op": self.op, "why": self.why}


@dataclass(frozen=True)
class DriverUpgrade:
    """An NVIDIA driver at least ``minimum`` (which brings CUDA ``cuda``); ``rule``: the GPU class rule where
    forward compatibility applies (data centre GPUs only, ...)."""

    minimum: str
    cuda: str | None = None
    rule: str = ""
    why: str = ""
    kind: ClassVar[str] = "driver"

    def render(self) -> str:
        brings = f" (CUDA {self.cuda})" if self.cuda else ""
        return f"use an NVIDIA driver >= {self.minimum}{brings}" + (f"; {self.rule}" if self.rule else "")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "minimum": self.minimum, "cuda": self.cuda, "rule": self.rule, "why": self.why}


@dataclass(frozen=True)
class Rebuild:
    """Rebuild ``binary`` with ``flags`` (``-gencode arch=compute_90,code=sm_90``, a CUDA toolkit version)."""

    binary: str
    flags: tuple[str, ...] = ()
    why: str = ""
    kind: ClassVar[str] = "rebuild"

    def render(self) -> str:
        return f"rebuild {self.binary}" + (f" with {' '.join(self.flags)}" if self.flags else "")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "binary": self.binary, "flags": list(self.flags), "why": self.why}


@dataclass(frozen=True)
class UseBuild:
    """Use ``build`` of ``package`` instead (its CUDA 12 build ``cupy-cuda12x``, torch from a CUDA index):
    ``install``, when set, is the pip command that gets it."""

    package: str
    build: str
    install: Pip | None = None
    why: str = ""
    kind: ClassVar[str] = "use-build"

    def render(self) -> str:
        how = f": {self.install.render()}" if self.install is not None else ""
        return f"use {self.build} of {self.package}{how}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "package": self.package,
            "build": self.build,
            "install": self.install.to_json() if self.install is not None else None,
            "why": self.why,
        }


@dataclass(frozen=True)
class Manual:
    """What to do by hand, where no action above says it: exact steps, in order."""

    steps: tuple[str, ...]
    why: str = ""
    kind: ClassVar[str] = "manual"

    def render(self) -> str:
        return "; ".join(self.steps)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "steps": list(self.steps), "why": self.why}


Remedy: TypeAlias = "Pip | Env | SearchPath | DriverUpgrade | Rebuild | UseBuild | Manual"
"""One action that repairs what a finding reports."""


def manual(*steps: str, why: str = "") -> tuple[Remedy, ...]:
    """A finding's remedies when all there is to say is what to do by hand: one :class:`Manual` of the
    non-empty ``steps``, or none."""
    kept = tuple(s for s in steps if s)
    return (Manual(kept, why),) if kept else ()


def remedy_from_json(data: dict[str, Any]) -> Remedy:
    """The remedy ``to_json`` wrote (xdist carries findings from workers this way); ValueError when not one."""
    kind = data.get("kind")
    why = str(data.get("why", ""))
    if kind == "pip":
        return Pip(
            str(data["verb"]),
            tuple(data["specs"]),
            str(data.get("python", "")),
            tuple(data.get("flags", ())),
            data.get("index_url"),
            why,
        )
    if kind == "env":
        return Env(str(data["variable"]), data.get("value"), why)
    if kind == "search-path":
        return SearchPath(str(data["directory"]), str(data.get("path", "LD_LIBRARY_PATH")), str(data["op"]), why)
    if kind == "driver":
        return DriverUpgrade(str(data["minimum"]), data.get("cuda"), str(data.get("rule", "")), why)
    if kind == "rebuild":
        return Rebuild(str(data["binary"]), tuple(data.get("flags", ())), why)
    if kind == "use-build":
        install = data.get("install")
        pip = remedy_from_json(install) if isinstance(install, dict) else None
        return UseBuild(str(data["package"]), str(data["build"]), pip if isinstance(pip, Pip) else None, why)
    if kind == "manual":
        return Manual(tuple(data["steps"]), why)
    raise ValueError(f"not a cudastack remedy: kind {kind!r}")


@dataclass(frozen=True)
class Facts:
    """What a finding is about, as data (the checks fill what they know; text is made from it at the edge):
    what was ``required`` and what was ``found``, the ``sonames`` and ``objects`` (files) involved, the
    ``versions`` named (``(name, version)``), the ``bound`` (``--cuda-max`` / ``--cuda-min`` value), the
    ``consumer`` (the key of the distribution that needs it, None when no distribution does) and ``tried``:
    every path the dynamic linker's search tried for the soname, in its order (where a file the repair model
    puts back would be found: the first of them present is what the search loads)."""

    required: str = ""
    found: str = ""
    sonames: tuple[str, ...] = ()
    objects: tuple[str, ...] = ()
    versions: tuple[tuple[str, str], ...] = ()
    bound: str | None = None
    consumer: str | None = None
    tried: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "required": self.required,
            "found": self.found,
            "sonames": list(self.sonames),
            "objects": list(self.objects),
            "versions": [list(v) for v in self.versions],
            "bound": self.bound,
            "consumer": self.consumer,
            "tried": list(self.tried),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Facts:
        return cls(
            str(data.get("required", "")),
            str(data.get("found", "")),
            tuple(data.get("sonames", ())),
            tuple(data.get("objects", ())),
            tuple((str(a), str(b)) for a, b in data.get("versions", ())),
            data.get("bound"),
            data.get("consumer"),
            tuple(data.get("tried", ())),
        )


@dataclass(frozen=True)
class Provenance:
    """Where a file of a deployment image comes from: the layer (its digest) that wrote ``path`` and that
    layer's ``history`` step (``created_by``: the Dockerfile line), so a fix can name the step to change."""

    path: str
    layer: str
    created_by: str = ""

    def render(self) -> str:
        step = f" ({self.created_by})" if self.created_by else ""
        return f"{self.path}: from layer {self.layer}{step}"

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "layer": self.layer, "created_by": self.created_by}


@dataclass(frozen=True)
class Finding:
    """One problem (or notable fact) about the stack.

    ``check`` is the invariant item it belongs to (a name of ``checks.CHECKS``: "integrity", "closure",
    "cuda-max", ...); ``subject`` the file, soname or distribution it is about. ``message`` says what was
    required and what was found, ``cause`` why; ``facts`` holds the same as data. ``remedies`` are the
    actions that repair it (:data:`Remedy`), each with why; text is made from them where it is shown
    (:attr:`fix`). ``where`` lists places looked at (directories tried, RECORD files), ``chain`` the load
    chain that needs a missing library (root first). ``distributions`` names (canonically) the installed
    distributions the finding makes not intact, for checks such as ``requires_wheel``.
    """

    check: str
    severity: Severity
    subject: str
    message: str
    cause: str = ""
    remedies: tuple[Remedy, ...] = ()
    where: tuple[str, ...] = ()
    chain: tuple[str, ...] = ()
    details: tuple[str, ...] = field(default=())
    distributions: tuple[str, ...] = ()
    facts: Facts = field(default_factory=Facts)
    provenance: tuple[Provenance, ...] = ()  # an image's files it names: their layers (stack.py fills it)

    @property
    def failing(self) -> bool:
        return self.severity is Severity.ERROR

    @property
    def id(self) -> str:
        """``check: subject``, what the repair plan's steps name in ``resolves``."""
        return f"{self.check}: {self.subject}"

    @property
    def fix(self) -> str:
        """The remedies as one line of text, in order (what one-line output shows after ``fix:``): pip
        commands joined as a shell line joins them, other steps by "; "."""
        out = ""
        for before, r in zip((None, *self.remedies), self.remedies, strict=False):  # r and the one before it
            sep = " && " if isinstance(before, Pip) and isinstance(r, Pip) else "; "
            out += (sep if out else "") + r.render()
        return out

    @property
    def pip(self) -> tuple[Pip, ...]:
        """The pip commands among the remedies, in order (a UseBuild's install included)."""
        out: list[Pip] = []
        for r in self.remedies:
            if isinstance(r, Pip):
                out.append(r)
            elif isinstance(r, UseBuild) and r.install is not None:
                out.append(r.install)
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "check": self.check,
            "severity": self.severity.value,
            "subject": self.subject,
            "message": self.message,
            "cause": self.cause,
            "fix": self.fix,
            "remedies": [r.to_json() for r in self.remedies],
            "facts": self.facts.to_json(),
            "where": list(self.where),
            "chain": list(self.chain),
            "details": list(self.details),
            "distributions": list(self.distributions),
            "provenance": [p.to_json() for p in self.provenance],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(
            check=str(data["check"]),
            severity=Severity(data["severity"]),
            subject=str(data["subject"]),
            message=str(data["message"]),
            cause=str(data.get("cause", "")),
            remedies=tuple(remedy_from_json(r) for r in data.get("remedies", ())),
            where=tuple(data.get("where", ())),
            chain=tuple(data.get("chain", ())),
            details=tuple(data.get("details", ())),
            distributions=tuple(data.get("distributions", ())),
            facts=Facts.from_json(data.get("facts", {})),
            provenance=tuple(
                Provenance(str(p["path"]), str(p["layer"]), str(p.get("created_by", "")))
                for p in data.get("provenance", ())
            ),
        )

    def render(self, *, compact: bool = False, plan_step: str | None = None) -> str:
        """Multi-line human text: message, then the chain, cause, places looked in, details and fix.

        The full form (failed items, ``cudastack check``, ``cudastack report -v``) lists up to 50 places and
        50 details, 20 hops of the chain and 2,000 characters of each field, and says how many more
        ``--json`` would show; the compact form (``cudastack report``) lists at most three places and three
        details and says how many more ``-v`` or ``--json`` would show. ``plan_step`` replaces the remedies
        with a pointer to the run's repair plan ("step 2 of the repair plan"), which prints each command once.
        """
        # a message that already opens with its subject ("libcuda.so.1: loaded at run time by ...", "torch 2.14.1
        # is a CUDA 13 build ...") says it once
        opens = bool(self.subject) and self.message.startswith((f"{self.subject}:", f"{self.subject} "))
        lines = [_clip(self.message) if opens else f"{_clip(self.subject)}: {_clip(self.message)}"]
        if self.chain:
            chain = [_clip(c) for c in self.chain]
            if len(chain) > _FULL_CHAIN:
                half = _FULL_CHAIN // 2
                chain = [*chain[:half], f"... {len(chain) - 2 * half} more ...", *chain[-half:]]
            lines.append("  needed by: " + " -> ".join(chain))
        if self.cause:
            lines.append(f"  cause: {_clip(self.cause)}")
        limit = _COMPACT_ITEMS if compact else _FULL_ITEMS
        if self.where and len(self.where) <= limit:
            lines.append("  looked in: " + ", ".join(_clip(w) for w in self.where))
        elif self.where:
            shown = ", ".join(_clip(w) for w in self.where[:limit])
            more = "-v or --json" if compact else "--json"
            lines.append(f"  looked in {len(self.where)} places: {shown}, ... ({more} for all)")
        details = self.details[:limit]
        lines.extend(f"  {_clip(d)}" for d in details)
        if len(self.details) > len(details):
            lines.append(f"  ... {len(self.details) - len(details)} more ({'-v or --json' if compact else '--json'})")
        lines.extend(f"  from: {_clip(p.render())}" for p in self.provenance[:limit])
        if plan_step is not None:  # the run's plan prints each command once; the finding points at it
            lines.append(f"  fix: {plan_step}")
            return "\n".join(lines)
        for remedy in self.remedies:
            lines.append(f"  fix: {_clip(remedy.render())}")
            if remedy.why:
                lines.append(f"    why: {_clip(remedy.why)}")
        return "\n".join(lines)


def _clip(text: str) -> str:
    """A field as human text shows it: cut to ``_MAX_TEXT`` characters, escaped (it may come from a file)."""
    text = text if len(text) <= _MAX_TEXT else f"{text[:_MAX_TEXT]}... ({len(text) - _MAX_TEXT} more characters)"
    return printable(text)


def most_severe_first(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """*findings* errors first, then warnings, then infos; stable within a severity."""
    return tuple(sorted(findings, key=lambda f: f.severity.rank))
