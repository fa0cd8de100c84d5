"""``cudastack loaded MODULE``: which shared objects does importing MODULE map?

The import runs in a child process (``sys.executable``, on purpose: importing may dlopen CUDA libraries,
which the inspecting process must never do). The child lists ``/proc/self/maps`` before and after the
import and writes the new file-backed mappings as JSON; the parent adds each file's soname (``read_elf``)
and owning distribution (``Inventory.owner``). ``--static`` imports nothing: the objects are predicted from
the files (:mod:`pytest_cudastack.model.process`), each with its route and reason.

The child is isolated from where it runs: ``python -I`` (no current directory or script directory on
``sys.path``, no ``PYTHON*`` variables, no user site), so a ``json.py`` or ``importlib.py`` in the current
directory neither runs nor shadows the standard library. MODULE is importable when the target interpreter
can import it: installed in its site-packages (a project under development: ``pip install -e .``, whose
``.pth`` file ``-I`` still reads), or in a directory of ``PYTHONPATH``, whose entries the child appends to
``sys.path`` *after* the interpreter's own (so they add modules but never shadow one). Standard input is
closed, standard output discarded; the report comes back on a pipe of its own (``pass_fds``), at most
``_REPORT_LIMIT`` bytes, so nothing the module prints can pass for it. A child that does not finish within
the timeout is killed with its process group, and that is the import's error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_cudastack.errors import ElfError
from pytest_cudastack.escape import printable
from pytest_cudastack.linker.elf import looks_like_elf, read_elf
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.wheels.inventory import installed_wheels

__all__ = [
    "LOADED_SCHEMA",
    "LOADED_VERSION",
    "LoadedLibrary",
    "cmd_loaded",
    "loaded_libraries",
    "parse_report",
    "static_document",
]

# --json's document: pytest_cudastack/schemas/loaded.schema.json
LOADED_SCHEMA = "pytest-cudastack/loaded"
LOADED_VERSION = 1

logger = logging.getLogger(__name__)

_REPORT_LIMIT = 16 << 20  # bytes of report; a real import maps a few thousand paths (~1 MiB at most)
_STDERR_TAIL = 4096  # bytes of the child's standard error kept, for the message when it dies
# The "before" picture is taken before the child imports anything a module might import (json's _json
# extension among them): until the "after" picture only builtins, os (imported by every interpreter's
# start-up) and the frozen importlib are used. argv: MODULE, the report's fd, then PYTHONPATH entries.
_CHILD = r"""
import os, sys

def mapped():
    paths = []
    with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                path = parts[5].rstrip("\n")
                if path.endswith(" (deleted)"):
                    continue
                if path not in paths:
                    paths.append(path)
    return paths

report = int(sys.argv[2])
before = set(mapped())
sys.path.extend(p for p in sys.argv[3:] if p not in sys.path)
error = None
try:
    import importlib
    importlib.import_module(sys.argv[1])
except BaseException as e:  # report, never hide: the parent turns this into exit status 1
    try:
        error = f"{type(e).__name__}: {e}"
    except BaseException:
        error = f"{type(e).__name__} (unprintable)"
after = [p for p in mapped() if p not in before]
import json
data = json.dumps({"paths": after, "error": error}).encode("ascii")
while data:
    data = data[os.write(report, data):]
os.close(report)
"""


@dataclass(frozen=True)
class LoadedLibrary:
    """A shared object mapped by the import: its path, soname (None if it has none) and owner."""

    path: str
    soname: str | None
    provider: str | None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "soname": self.soname, "provider": self.provider}


def _child_mapped(module: str, python: str, timeout: float) -> tuple[list[str], str | None]:
    """The paths the import of *module* mapped in a child *python*, and the import's error (or why the
    child gave no report: it died, timed out, or wrote something that is not one)."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [python, "-I", "-c", _CHILD, module, str(write_fd), *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(write_fd,),
            start_new_session=True,  # one process group: a timeout kills what the module started too
        )
    except OSError as e:
        os.close(read_fd)
        return [], f"cannot start {python}: {e.strerror or e}"
    finally:
        os.close(write_fd)
    assert proc.stderr is not None
    try:
        report, stderr, timed_out, overflow = _collect(proc, read_fd, proc.stderr.fileno(), timeout)
    finally:
        os.close(read_fd)
        proc.stderr.close()
    if timed_out:
        return [], f"the import did not finish within {timeout:g} s (the child process was killed)"
    if overflow:
        return [], f"the child process wrote a report larger than {_REPORT_LIMIT} bytes"
    data = parse_report(report)
    if data is None:
        text = stderr.decode("utf-8", errors="replace").strip().splitlines()
        tail = text[-1:] or [f"exit status {proc.returncode}"]
        return [], f"the child process failed: {printable(tail[0])}"
    return data


def _collect(
    proc: subprocess.Popen[bytes], report_fd: int, stderr_fd: int, timeout: float
) -> tuple[bytes, bytes, bool, bool]:
    """Read the report pipe (capped) and the tail of standard error until the child exits and the pipes
    are drained, or *timeout* passes (the child's process group is then killed). Returns (report, stderr
    tail, timed out, report over the cap). A grandchild holding the pipes open does not keep us waiting
    once the child itself has exited."""
    # lazy: only `cudastack loaded` reads two pipes at once
    import selectors
    import signal
    import time

    deadline = time.monotonic() + timeout
    report = bytearray()
    stderr = bytearray()
    overflow = False
    open_fds = {report_fd, stderr_fd}
    with selectors.DefaultSelector() as sel:
        for fd in open_fds:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while open_fds:
            exited = proc.poll() is not None
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = sel.select(timeout=0 if exited else min(left, 0.2))
            if not ready and exited:
                break  # drained, and only a grandchild (if anything) still holds a pipe
            for key, _ in ready:
                fd = int(key.fd)
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                elif fd == report_fd:
                    report += chunk
                    if len(report) > _REPORT_LIMIT:
                        overflow = True
                        open_fds.clear()
                        break
                else:
                    stderr = (stderr + chunk)[-_STDERR_TAIL:]
    timed_out = False
    if proc.poll() is None and not overflow:
        try:  # both pipes closed: the child is exiting (or a module closed them and went on)
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
    proc.wait()
    return bytes(report), bytes(stderr), timed_out, overflow


def parse_report(raw: bytes) -> tuple[list[str], str | None] | None:
    """The child's report as (paths, error), None when it is not one (the child died mid-write, or
    something else wrote to the pipe)."""
    try:
        data = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or set(data) != {"paths", "error"}:
        return None
    paths, error = data["paths"], data["error"]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
        return None
    if error is not None and not isinstance(error, str):
        return None
    return paths, None if error is None else printable(error)


def loaded_libraries(
    module: str, python: str | None = None, timeout: float = 300.0, site_paths: Sequence[str] | None = None
) -> tuple[tuple[LoadedLibrary, ...], str | None]:
    """Shared objects mapped by importing ``module`` in a child ``python`` (default: this one), and the
    import error if any. Providers come from the distributions in ``site_paths`` (default: ``sys.path``)."""
    paths, error = _child_mapped(module, python or sys.executable, timeout)
    cache = ElfCache()
    inventory = installed_wheels(site_paths, reader=cache.read)
    cache.flush()
    out: list[LoadedLibrary] = []
    for path in paths:
        if not looks_like_elf(path):
            continue  # data files the import mapped (locale archives, .pyc caches)
        try:
            soname = read_elf(path).soname
        except ElfError as e:
            logger.debug("%s", e)
            soname = None
        out.append(LoadedLibrary(path, soname, inventory.owner(path)))
    return tuple(out), error


def static_document(module: str, site_paths: Sequence[str] | None = None) -> tuple[dict[str, Any], bool]:
    """``loaded MODULE --static --json``'s document (the ``loaded`` schema with ``route`` and ``reason`` per
    library, ``run_time``, ``missing`` and ``unbound``), and whether the prediction is clean (module found,
    nothing missing, every reference binds). Predicted by
    :func:`~pytest_cudastack.model.process.predict_import` for this interpreter with the site directories of
    ``site_paths`` (default: ``sys.path``), then bound by
    :func:`~pytest_cudastack.checks.symbols.process_symbol_findings` (each load's lookup scopes, RTLD_LOCAL
    and RTLD_GLOBAL, versions); nothing is imported. When a reference does not bind, ``error`` is the
    loader's message for the first one in relocation order (what the real import's ``ImportError`` names)."""
    # lazy: the import model (ast, the resolver) and the binding check only for --static
    from pytest_cudastack.checks.symbols import loader_message, process_symbol_findings
    from pytest_cudastack.findings import Severity
    from pytest_cudastack.linker.resolver import Resolver, SearchConfig
    from pytest_cudastack.model.process import Interpreter, predict_import
    from pytest_cudastack.wheels.sitepaths import owner_index

    cache = ElfCache()
    owners = owner_index(site_paths)  # RECORDs only: no ELF read or flavour rule for the provider column
    resolver = Resolver(SearchConfig.from_environment(), reader=cache.read, owner=owners.owner)
    interp = Interpreter.for_sites(owners.site_dirs)
    process = predict_import(module, interp, resolver, cache.read, owners.owner, cache.read_strings, cache=cache)
    bound = process_symbol_findings(process, resolver, cache.read_symbols, verdicts=cache)
    cache.flush()
    unbound = [f for f in bound if f.severity is Severity.ERROR]

    def row(o: Any) -> dict[str, Any]:
        return {"path": o.path, "soname": o.soname, "provider": o.provider, "route": o.route, "reason": o.reason}

    data: dict[str, Any] = {
        "schema": LOADED_SCHEMA,
        "version": LOADED_VERSION,
        "module": module,
        "static": True,
        "libraries": [row(o) for o in process.objects],
        "run_time": [row(o) for o in process.run_time],
        "missing": list(process.missing),
        "unbound": [
            {"object": f.facts.objects[0], "message": f.message, "details": list(f.details)}
            for f in unbound
            if f.facts.objects
        ],
    }
    first = next((m for m in map(loader_message, unbound) if m), None)
    problems = [*([first] if first else []), *process.problems]
    if problems:
        data["error"] = "; ".join(problems[:4])
    return data, not problems and not process.missing


def _print_static(data: dict[str, Any]) -> None:
    # file names come from the inspected tree: shown escaped, as the observed import's are
    def show(text: Any) -> str:
        return printable(str(text))

    libs = data["libraries"]
    print(f"{show(data['module'])}: {len(libs)} shared objects the import would map (predicted, nothing imported)")
    for lib in libs:
        extra = f"  ({show(lib['provider'])})" if lib["provider"] else ""
        name = lib["soname"] or os.path.basename(lib["path"])
        print(f"  {show(name)} => {show(lib['path'])}{extra}  [{show(lib['reason'])}]")
    if data["run_time"]:
        print(f"later, when used ({len(data['run_time'])} loaded by dlopen):")
        for lib in data["run_time"]:
            print(f"  {show(lib['soname'])} => {show(lib['path'])}  [{show(lib['reason'])}]")
    for soname in data["missing"]:
        print(f"  {show(soname)} => not found", file=sys.stderr)
    for item in data["unbound"]:
        print(f"  {show(item['message'])}", file=sys.stderr)
        for line in item["details"][:3]:
            print(f"    {show(line)}", file=sys.stderr)
        if len(item["details"]) > 3:
            print(f"    ... and {len(item['details']) - 3} more (--json lists them)", file=sys.stderr)
    if data["unbound"]:
        print(f"the import would fail: {show(data['error'])}", file=sys.stderr)
    elif "error" in data:
        print(f"prediction incomplete: {show(data['error'])}", file=sys.stderr)


def _cmd_static(args: argparse.Namespace) -> int:
    doc, clean = static_document(args.module)
    if getattr(args, "json", False):
        print(json.dumps(doc, indent=2))
    else:
        _print_static(doc)
    return 0 if clean else 1


def cmd_loaded(args: argparse.Namespace) -> int:
    """``cudastack loaded MODULE [--static] [--json]``: exit 0, or 1 when the import failed (with
    ``--static``: when the module is not found, a soname would be missing or a reference would not bind)."""
    if getattr(args, "static", False):
        return _cmd_static(args)
    libs, error = loaded_libraries(args.module)
    if getattr(args, "json", False):
        data: dict[str, Any] = {
            "schema": LOADED_SCHEMA,
            "version": LOADED_VERSION,
            "module": args.module,
            "libraries": [lib.to_json() for lib in libs],
        }
        if error:
            data["error"] = error
        print(json.dumps(data, indent=2))
    else:
        print(f"{args.module}: {len(libs)} shared objects mapped by the import")
        for lib in libs:
            extra = f"  ({printable(lib.provider)})" if lib.provider else ""
            print(f"  {printable(lib.soname or os.path.basename(lib.path))} => {printable(lib.path)}{extra}")
        if error:
            print(f"import failed: {error}", file=sys.stderr)
    return 1 if error else 0
