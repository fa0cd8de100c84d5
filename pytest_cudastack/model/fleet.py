"""Many nodes' snapshots: what each records as broken, their grouping by stack fingerprint, and whether an
environment would run on a node.

The snapshots are read as a stream (:func:`group_nodes` takes an iterable of documents): per node only its
name, fingerprint, driver facts and problems are kept, and one whole document per group (the first), which
is what a group's difference from the majority is computed from. 10,000 nodes in a handful of groups are a
few MB.

:func:`would_run` is the deployment question asked of a node's snapshot: the CUDA each component of an
environment needs (its snapshot's ``needs``) against the node's driver (``cuda.verdicts.driver_verdict``,
minor-version and forward compatibility included), and each wheel's and scanned library's GPU code against
the node's GPUs (``linker.fatbin.runs_on``: the CUDA binary and PTX compatibility rules).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.cuda.verdicts import driver_verdict
from pytest_cudastack.dirwalk import MAX_DEPTH, walk_tree
from pytest_cudastack.linker.fatbin import FatbinEntry, runs_on
from pytest_cudastack.model.fingerprint import stack_fingerprint

__all__ = [
    "Group",
    "Node",
    "Problem",
    "Verdict",
    "group_nodes",
    "node_of",
    "snapshot_files",
    "snapshot_problems",
    "would_run",
]


@dataclass(frozen=True)
class Problem:
    """What a snapshot records as broken: ``check`` is the item that reports it as an error ("integrity",
    "closure", "driver"), ``subject`` what is broken, ``text`` one line."""

    check: str
    subject: str
    text: str


def snapshot_problems(doc: Mapping[str, Any]) -> tuple[Problem, ...]:
    """The errors a snapshot itself shows: RECORD-listed libraries missing or with other bytes than their
    RECORD's, scanned binaries' libraries not found, user-space driver libraries of another version than the
    kernel module."""
    out: list[Problem] = []
    for w in doc.get("wheels", ()):
        label = f"{w.get('name')} {w.get('version')}"
        out.extend(Problem("integrity", label, f"{label}: {p} is missing") for p in w.get("missing", ()))
        for f in w.get("files", ()):
            if f.get("sha256") and f.get("record") and f["sha256"] != f["record"]:
                out.append(Problem("integrity", label, f"{label}: {f.get('path')} has other bytes than its RECORD's"))
    for b in doc.get("binaries", ()):
        for lib in b.get("libraries", ()):
            if lib.get("path") is None:
                out.append(Problem("closure", str(b.get("path")), f"{b.get('path')}: {lib.get('soname')} is not found"))
    host = doc.get("host") or {}
    for m in host.get("mismatch", ()):
        line = f"{m.get('soname')} {m.get('version')} is not the kernel module's {host.get('kernel_module')}"
        out.append(Problem("driver", "the NVIDIA driver", line))
    return tuple(out)


@dataclass(frozen=True)
class Node:
    """One node's snapshot, as the fleet keeps it: ``source`` the file, ``name`` the host name (else the file
    name), ``fingerprint`` the one it records (computed from the document for a version-1 snapshot)."""

    source: str
    name: str
    fingerprint: str
    driver: str | None
    cuda: str | None
    kernel_module: str | None
    problems: tuple[Problem, ...]


def node_of(source: str, doc: Mapping[str, Any]) -> Node:
    host = doc.get("host") or {}
    driver = doc.get("driver") or {}
    name = host.get("name") or os.path.splitext(os.path.basename(source))[0]
    return Node(
        source,
        str(name),
        str(doc.get("fingerprint") or stack_fingerprint(doc)),
        driver.get("version"),
        driver.get("cuda_version"),
        host.get("kernel_module", driver.get("kernel_module")),
        snapshot_problems(doc),
    )


@dataclass(frozen=True)
class Group:
    """Nodes with one fingerprint; ``sample`` is the first one's whole snapshot."""

    fingerprint: str
    nodes: tuple[Node, ...]
    sample: Mapping[str, Any]


def group_nodes(docs: Iterable[tuple[str, Mapping[str, Any]]]) -> tuple[Group, ...]:
    """``(source, snapshot)`` pairs grouped by fingerprint, the majority first (then by size, then by
    fingerprint: the same order for the same nodes)."""
    nodes: dict[str, list[Node]] = {}
    samples: dict[str, Mapping[str, Any]] = {}
    for source, doc in docs:
        node = node_of(source, doc)
        if node.fingerprint not in samples:
            samples[node.fingerprint] = doc
        nodes.setdefault(node.fingerprint, []).append(node)
    order = sorted(nodes, key=lambda fp: (-len(nodes[fp]), fp))
    return tuple(Group(fp, tuple(sorted(nodes[fp], key=lambda n: (n.name, n.source))), samples[fp]) for fp in order)


def snapshot_files(paths: Sequence[str], unread: list[tuple[str, str]] | None = None) -> Iterator[str]:
    """The files named, and the ``*.json`` files under each directory named (walked in name order, links to
    directories not followed, without recursion: :func:`~pytest_cudastack.dirwalk.walk_tree`). A directory
    deeper than ``MAX_DEPTH`` levels below the one named is not read: it is appended to ``unread`` as
    ``(path, why)``, which ``cudastack fleet`` reports as it reports a file that is not a snapshot."""
    for path in paths:
        if not os.path.isdir(path):
            yield path
            continue
        for level in walk_tree(path):
            for name in level.files:
                if name.endswith(".json"):
                    yield os.path.join(level.path, name)
            if unread is not None:
                unread.extend((deep, _too_deep(deep, path)) for deep in level.deep)


def _too_deep(directory: str, named: str) -> str:
    return (
        f"{directory}: not read: it is {MAX_DEPTH + 1} directory levels below {named}, past the walk's depth cap "
        f"({MAX_DEPTH} levels): name it on the command line to read the snapshots under it"
    )


@dataclass(frozen=True)
class Verdict:
    """Would an environment run on a node? ``reasons``: why not (``runs`` False), or its caveats."""

    runs: bool
    reasons: tuple[str, ...]


_ARCH = re.compile(r"(sm|compute)_([0-9]+)([af]?)$")


def _entry(name: str) -> FatbinEntry | None:
    m = _ARCH.match(name)
    if not m:
        return None
    return FatbinEntry("sass" if m[1] == "sm" else "ptx", int(m[2]), m[3], None)


def _node_ccs(doc: Mapping[str, Any]) -> list[int]:
    """The node's GPUs' compute capabilities (90 for 9.0): its host facts, else its driver's archs."""
    out: list[int] = []
    gpus = (doc.get("host") or {}).get("gpus") or (doc.get("driver") or {}).get("gpus") or ()
    for g in gpus:
        major, _, minor = str(g.get("compute_capability", "")).partition(".")
        if major.isdigit() and minor.isdigit():
            out.append(int(major) * 10 + int(minor))
    if not out:
        for arch in (doc.get("driver") or {}).get("archs", ()):
            entry = _entry(str(arch))
            if entry is not None:
                out.append(entry.arch)
    return sorted(set(out))


def _code_units(env: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each wheel's GPU code (its libraries' together) and each scanned binary's libraries'."""
    for w in env.get("wheels", ()):
        yield f"{w.get('name')} {w.get('version')}", w.get("gpu_code") or {}
    for b in env.get("binaries", ()):
        for lib in b.get("libraries", ()):
            if lib.get("gpu_code"):
                yield f"{b.get('path')}: {lib.get('soname')}", lib["gpu_code"]


def _arch_reasons(env: Mapping[str, Any], ccs: Sequence[int]) -> list[str]:
    out = []
    for subject, code in _code_units(env):
        entries = [e for e in (_entry(n) for n in (*code.get("sass", ()), *code.get("ptx", ()))) if e is not None]
        if not entries:
            continue  # no device code: nothing to run on the GPU
        for cc in ccs:
            if not any(runs_on(e, cc) for e in entries):
                have = ", ".join(e.name for e in entries)
                out.append(f"{subject} has no GPU code for sm_{cc} (it carries {have})")
    return out


def _needs(env: Mapping[str, Any]) -> dict[str, str]:
    """The CUDA each component needs -> who needs it (the highest of a major decides); a version-1 snapshot
    (no needs) by its CUDA wheels' majors."""
    rows = env.get("needs")
    if rows is None:
        rows = [{"subject": w.get("name"), "cuda": f"{w.get('cuda_major')}.x"} for w in env.get("wheels", ())]
    out: dict[str, str] = {}
    for r in rows:
        cuda = str(r.get("cuda", ""))
        out.setdefault(cuda.removesuffix(".x"), str(r.get("subject")))
    return out


def would_run(env: Mapping[str, Any], node: Mapping[str, Any]) -> Verdict:
    """Whether the environment recorded in ``env`` would run on the node recorded in ``node``: its driver
    against every CUDA the environment needs, then every GPU code unit against its GPUs, then the node's
    own driver mismatch. Caveats (minor-version compatibility) are reasons of a running verdict."""
    driver = DriverInfo.from_json(node.get("driver") or {})
    fails: list[str] = []
    caveats: list[str] = []
    for cuda, subject in sorted(_needs(env).items()):
        verdict = driver_verdict(cuda, driver, subject=subject)
        if verdict.status == "incompatible":
            fails.append(verdict.message)
        elif verdict.status != "compatible":
            caveats.append(verdict.message)
    ccs = _node_ccs(node)
    if ccs:
        fails.extend(_arch_reasons(env, ccs))
    else:
        caveats.append("the node's GPUs are unknown: GPU code not checked")
    fails.extend(p.text for p in snapshot_problems(node) if p.check == "driver")
    return Verdict(not fails, tuple(fails or caveats))
