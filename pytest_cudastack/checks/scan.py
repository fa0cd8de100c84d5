"""The scan check: every DT_NEEDED in the load closure of each ``--cudastack-scan`` binary must resolve.

A per-target check: one item ``scan[NAME]`` per ELF file the scan paths name (``scan_targets``), and one
per walked directory holding files it did not check, which warns about each (``scan_walk``): nothing is
skipped without a word.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_cudastack._sysio import open_span
from pytest_cudastack.cuda.compat import is_driver_soname
from pytest_cudastack.dirwalk import MAX_DEPTH, walk_tree
from pytest_cudastack.errors import ElfError
from pytest_cudastack.escape import printable
from pytest_cudastack.findings import Facts, Finding, Severity, manual
from pytest_cudastack.wheels.dpkg import library_packages, recorded_md5, reinstall_command
from pytest_cudastack.wheels.ownership import file_digest

if TYPE_CHECKING:
    from pytest_cudastack.checks.facts import StackView, Target
    from pytest_cudastack.cuda.driver import DriverInfo
    from pytest_cudastack.linker.resolver import Tree
    from pytest_cudastack.wheels.inventory import Inventory

__all__ = ["binary_findings", "run", "scan_targets", "scan_walk", "skipped_files", "skipped_findings"]

# a directory the walk does not enter is said like a file it does not check: its binaries are not scanned
_TOO_DEEP = (
    f"a directory {MAX_DEPTH + 1} levels below the scanned one: not walked, past the scan's depth cap of "
    f"{MAX_DEPTH} levels (name it in --cudastack-scan to scan its binaries)"
)


def scan_targets(paths: Sequence[str], base: str) -> tuple[Target, ...]:
    """``(display name, absolute path)`` for every ELF file named by ``paths`` (directories walked).

    Relative paths are taken from ``base`` (the rootdir); display names are relative to it where possible.
    A path that does not exist stays in the list, so its item can fail and say so.
    """
    return scan_walk(paths, base)[0]


def scan_walk(paths: Sequence[str], base: str) -> tuple[tuple[Target, ...], tuple[Target, ...]]:
    """:func:`scan_targets`, and the walked directories holding files the walk did not check
    (:func:`skipped_files`), as ``(display name, absolute path)`` too: each directory's item warns about
    them (``run``), while the binaries alone are what snapshots, inferences and other checks read."""
    found: dict[str, str] = {}
    dirs: dict[str, str] = {}

    def display(path: str) -> str:  # an item's name: pytest prints it as it is, so escaped here
        rel = os.path.relpath(path, base)
        return printable(path if rel.startswith("..") else rel)

    for given in paths:
        path = os.path.normpath(os.path.join(base, os.path.expanduser(given)))
        if os.path.isdir(path):
            for full, why in _walk(path):
                if why is None:
                    found.setdefault(full, display(full))
                else:
                    dirs.setdefault(path, display(path))
        else:
            found.setdefault(path, display(path))
    return tuple((n, p) for p, n in found.items()), tuple((n, p) for p, n in dirs.items())


def skipped_files(directory: str) -> tuple[tuple[str, str], ...]:
    """``(path, why)`` for each file under *directory* that a scan does not check and should say so: FIFOs,
    sockets and devices (opening or reading one can block or never end), files it cannot read, dangling
    links and non-ELF files named like shared libraries (``lib*.so*``), and the directories too deep to walk.
    Other non-ELF files (scripts, data, a GNU ld script such as ``libc.so``) are not binaries, and stay quiet."""
    return tuple((full, why) for full, why in _walk(directory) if why is not None)


def _walk(directory: str) -> Iterator[tuple[str, str | None]]:
    """Every file under *directory* worth an answer, sorted: ``(path, None)`` for an ELF file to scan,
    ``(path, why)`` for one it does not check, and for each directory deeper than ``MAX_DEPTH`` levels, which
    is not walked (:func:`~pytest_cudastack.dirwalk.walk_tree`: no recursion, links to directories not
    followed, each directory read once), after the files of its parent."""
    for level in walk_tree(directory):
        for name in level.files:
            full = os.path.join(level.path, name)
            kind = _classify(full, fnmatch.fnmatchcase(name, "lib*.so*"))
            if kind != "quiet":
                yield full, None if kind == "elf" else kind
        for deep in level.deep:
            yield deep, _TOO_DEEP


def _classify(path: str, library_name: bool) -> str:
    """ "elf", "quiet" (not a binary: nothing to say) or why the file was not checked."""
    try:
        st = os.stat(path)
    except OSError as e:
        if isinstance(e, FileNotFoundError):  # the walk listed it: a symbolic link to nothing
            if not library_name:
                return "quiet"
            return f"a symbolic link to {os.readlink(path)!r}, which does not exist"
        return f"cannot be examined: {e.strerror or e}"
    except ValueError as e:  # pragma: no cover - a directory lists no name with a NUL byte
        return f"cannot be examined: {e}"
    mode = st.st_mode
    if stat.S_ISFIFO(mode):
        return "a FIFO: not opened (reading one waits until something writes to it)"
    if stat.S_ISSOCK(mode):
        return "a socket: not a file that can be read"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device: not read (a device can be endless, or change state when read)"
    if not stat.S_ISREG(mode):  # pragma: no cover - the walk lists directories apart
        return "not a regular file"
    try:
        span, _st = open_span(path)
    except ElfError as e:
        return f"cannot be read: {str(e).removeprefix(path + ': ')}"
    try:
        head = span.pread(512, 0)
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    finally:
        span.close()
    if head[:4] == b"\x7fELF":
        return "elf"
    if not library_name or _linker_script(head):
        return "quiet"
    if not head:
        return "an empty file named like a shared library"
    return f"not an ELF file (it starts with {head[:8]!r}) though named like a shared library"


def _linker_script(head: bytes) -> bool:
    """A GNU ld script (``libc.so``: ``/* GNU ld script ... */ GROUP ( ... )``): read by the link editor,
    never by the dynamic linker, so not a binary to check."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        return False
    return any(word in text for word in ("GROUP", "INPUT", "OUTPUT_FORMAT", "SEARCH_DIR", "ld script"))


def skipped_findings(directory: str, name: str) -> tuple[Finding, ...]:
    """One WARNING per file of :func:`skipped_files`, named as *name* (the directory's display name) + the
    file's path under it."""
    return tuple(
        Finding(
            "scan",
            Severity.WARNING,
            os.path.join(name, os.path.relpath(path, directory)),
            f"not checked: {why}",
            cause="a scan checks the regular ELF files of the directories it walks",
            remedies=manual("remove it from the scanned directory, or name the binaries to scan"),
        )
        for path, why in skipped_files(directory)
    )


def _other_majors(soname: str, debs: Mapping[str, tuple[tuple[str, str], ...]]) -> list[tuple[str, str]]:
    """The names of ``soname``'s family (the name before ``.so``) that dpkg's packages list with another
    version, joined per package, and the package: what the image has instead (``libcudart.so.11.0`` for
    ``libcudart.so.12``)."""
    stem, dot, _ = soname.partition(".so.")
    if not dot:
        return []
    by_package: dict[str, list[str]] = {}
    for name, owners in sorted(debs.items()):
        if name.startswith(stem + ".so.") and name != soname:
            by_package.setdefault(owners[0][1], []).append(name)
    return sorted((", ".join(names), package) for package, names in by_package.items())


def binary_findings(
    tree: Tree,
    subject: str,
    inventory: Inventory | None = None,
    driver: DriverInfo | None = None,
    dpkg_root: str | None = None,
) -> tuple[Finding, ...]:
    """Every DT_NEEDED in ``tree``'s closure must resolve: one ERROR per missing soname, all at once.
    ``dpkg_root`` (an image's root) has its dpkg database read: the package that installed a missing soname
    (its file gone: reinstall it) or ships another version of its family is named, and a library the tree
    loads whose bytes are not those its package's md5sums record is a WARNING.

    A missing driver soname (``libcuda.so.1``) is INFO unless a driver was probed on this machine: the
    driver comes with the deployment host, not with the image.
    """
    out: list[Finding] = []
    debs = library_packages(dpkg_root) if dpkg_root is not None else None
    out.extend(
        Finding("scan", Severity.ERROR, subject, problem, remedies=manual("scan only ELF binaries"))
        for problem in tree.problems
    )
    searched: dict[str, str | None] = {}  # the missing libraries of one tree share their search lists
    for lib in tree.missing:
        chain = tree.chain(lib.soname)
        if is_driver_soname(lib.soname) and (driver is None or driver.source != "probed"):
            out.append(
                Finding(
                    "scan",
                    Severity.INFO,
                    subject,
                    f"{lib.soname} (NVIDIA driver library) is not on this machine; the deployment host's "
                    "driver provides it",
                    chain=chain,
                )
            )
            continue
        notes: tuple[str, ...] = ()
        gone = ""
        shipped = [
            (dist, path, os.path.isfile(path)) for dist, path in (inventory.shipping(lib.soname) if inventory else ())
        ]
        claims = tuple(f"{d.label} ships it at {p} ({'present' if ok else 'missing'})" for d, p, ok in shipped)
        present = [p for _, p, ok in shipped if ok]
        if present:
            fix = f"add {os.path.dirname(present[0])} to the binary's RUNPATH (-Wl,-rpath) or to LD_LIBRARY_PATH"
        elif shipped:
            name = shipped[0][0].name
            fix = f"reinstall {name} (pip install --force-reinstall --no-deps {name})"
        elif debs and lib.soname in debs:
            path, package = debs[lib.soname][0]
            gone = f"dpkg's {package} installed {path}, which is gone"
            fix = f"{reinstall_command(package)}, or drop the step that deletes {path}"
        else:
            kin = _other_majors(lib.soname, debs or {})
            notes = tuple(f"dpkg's {package} ships {names} (another version)" for names, package in kin)
            fix = f"install the package that provides {lib.soname}, or rebuild against the CUDA this image has"
        out.append(
            Finding(
                "scan",
                Severity.ERROR,
                subject,
                f"needs {lib.soname}, which the dynamic linker does not find",
                cause=lib.problem or ("; ".join(claims) if claims else gone or "no directory searched holds it"),
                remedies=manual(fix),
                where=lib.searched_in(searched),
                chain=chain,
                details=claims + notes,
            )
        )
    if debs and dpkg_root is not None:
        out.extend(_altered(tree, subject, debs, dpkg_root))
    return tuple(out)


def _file_md5(path: str) -> str | None:
    digest = file_digest(path, hashlib.md5(usedforsecurity=False))
    return None if digest is None else digest.hex()


def _altered(tree: Tree, subject: str, debs: Mapping[str, tuple[tuple[str, str], ...]], root: str) -> list[Finding]:
    """The libraries ``tree`` loads that a .deb installed and whose bytes differ from its md5sums (a later
    layer, or a hand, replaced them): the program runs another build than the package's. A WARNING: it may
    well load and work; what breaks is dpkg's record (an upgrade overwrites it) and the tested build."""
    out: list[Finding] = []
    seen: set[str] = set()
    base = os.path.normpath(root)
    for lib in tree.libraries:
        if lib.path is None:
            continue
        # an image's tree names image paths: the file is under its root, links followed inside it
        host = lib.path if lib.path.startswith(base + os.sep) else os.path.join(base, lib.path.lstrip("/"))
        real = os.path.realpath(host)
        if real in seen or not real.startswith(base + os.sep):
            continue
        seen.add(real)
        for _listed, package in debs.get(os.path.basename(real), ()):
            recorded = recorded_md5(package, real, root)
            if recorded is None:
                continue
            got = _file_md5(real)
            if got != recorded:
                shown = "/" + os.path.relpath(real, base)
                out.append(
                    Finding(
                        "scan",
                        Severity.WARNING,
                        subject,
                        f"loads {shown} ({lib.soname}), whose bytes are not those dpkg's {package} installed",
                        cause=f"md5 {got or 'unreadable'}, dpkg's md5sums for {package}: {recorded}",
                        remedies=manual(f"{reinstall_command(package)}, or drop the step that replaces {shown}"),
                        facts=Facts(found=got or "", required=recorded, objects=(shown,)),
                        chain=tree.chain(lib.soname),
                    )
                )
            break
    return out


def run(stack: StackView, target: Target | None) -> tuple[Finding, ...]:
    """The ``scan[NAME]`` item of one target; a path that does not exist is its one ERROR."""
    if target is None:
        raise ValueError("cudastack check 'scan' runs per target: scan[NAME]")
    name, path = target
    if not os.path.lexists(path):
        return (
            Finding("scan", Severity.ERROR, name, "no such file", remedies=manual("fix the --cudastack-scan path")),
        )
    if os.path.isdir(path):  # a walked directory's own item: the files it did not check
        return skipped_findings(path, name)
    image = stack.image
    root = image.root if image is not None else None
    return binary_findings(stack.tree(path), name, stack.inventory, stack.driver, root)
