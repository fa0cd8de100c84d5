"""The real-environment tier: its torch CUDA venv ($CUDASTACK_TORCH_VENV, built by .ci/run: skip when absent), and
the oracle the healthy tiers judge a warning by (a child of the environment's own interpreter)."""

from __future__ import annotations

import glob
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_cudastack.findings import Finding

__all__ = ["Env", "child", "torch_site", "torch_venv", "untrue_load", "untrue_warning"]


def torch_venv() -> Path:
    venv = os.environ.get("CUDASTACK_TORCH_VENV")
    if not venv or not os.path.isdir(venv):
        pytest.skip("CUDASTACK_TORCH_VENV unset or absent")
    return Path(venv)


def torch_site(venv: Path) -> str:
    """The venv's site-packages directory."""
    sites = sorted(glob.glob(str(venv / "lib/python3*/site-packages")))
    if not sites:
        pytest.skip(f"no site-packages in {venv}")
    return sites[0]


_LEAD = re.compile(r"^`import ([\w.]+)` will fail: (\S+) is not found")
_TOO = re.compile(r"^`import ([\w.]+)` will fail too$")


@dataclass(frozen=True)
class Env:
    python: str
    site: str
    health: str  # code that must run in a child of ``python``
    env: tuple[tuple[str, str], ...] = ()  # extra environment for the child


def child(env: Env, code: str) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    child_env.update(env.env)
    return subprocess.run(
        [env.python, "-c", code], capture_output=True, text=True, env=child_env, timeout=300, check=False
    )


def untrue_warning(env: Env, f: Finding) -> str | None:
    """Why warning ``f`` is untrue, or None when every import it names really fails on the library it names."""
    lead = _LEAD.match(f.message)
    if lead is None:
        return untrue_load(env, f)
    soname = lead.group(2)
    modules = [lead.group(1)] + [m.group(1) for d in f.details if (m := _TOO.match(d))]
    for module in modules:
        done = child(env, f"import {module}")
        if done.returncode == 0 or "cannot open shared object file" not in done.stderr:
            return f"`import {module}` does not fail on a library: rc {done.returncode}, {done.stderr[-300:]!r}"
        # the loader names only the first library it misses (cupy's cutensor module needs libcutensor.so.2
        # and libcutensorMg.so.2, both absent): another one named means this one must be absent as well
        if soname not in done.stderr and child(env, f"import ctypes; ctypes.CDLL({soname!r})").returncode == 0:
            return f"`import {module}` fails on another library, and {soname} loads: {done.stderr[-300:]!r}"
    return None


def untrue_load(env: Env, f: Finding) -> str | None:
    """A warning that names no import but a library loaded at run time (``where`` first): true when loading
    that library in a child after its package's import fails on a missing library."""
    lib = f.where[0] if f.where else ""
    if not lib.endswith(".so"):
        return "it names no failing import and no library loaded at run time"
    top = Path(lib).relative_to(env.site).parts[0]
    done = child(env, f"import {top}, ctypes; ctypes.CDLL({lib!r})")
    if done.returncode == 0 or "cannot open shared object file" not in done.stderr:
        return f"{lib} loads after `import {top}`: rc {done.returncode}, {done.stderr[-300:]!r}"
    return None
