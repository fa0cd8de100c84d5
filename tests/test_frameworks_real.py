"""The ``reports`` column of framework_rules.json against the version macros of the real wheels' own headers:
every wheel in $CUDASTACK_WHEELS and every nvidia wheel of the torch venv ($CUDASTACK_TORCH_VENV) that ships
the header a library row names must state, in its macros, exactly the version :func:`reported_version`
derives from the wheel's version (cudnn-cu12 9.19.0.56 -> CUDNN_MAJOR/MINOR/PATCHLEVEL 9/19/0; cuda-runtime-cu12
12.9.79 -> CUDART_VERSION 12090 -> (12, 9)). Header text only; nothing is loaded or executed."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import pytest

from pytest_cudastack.cuda.frameworks import LibraryRow, load_rules, reported_version
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.realenv import torch_site, torch_venv

pytestmark = pytest.mark.real

# the CUDA runtime states one number, major * 1000 + minor * 10 (cuda_runtime_api.h); its row has no macros
_CUDART = ("cuda_runtime_api.h", "CUDART_VERSION")


def _macros(text: str, row: LibraryRow) -> tuple[int, ...] | None:
    if row.library == "cudart":
        m = re.search(rf"^\s*#\s*define\s+{_CUDART[1]}\s+(\d+)\s*$", text, re.MULTILINE)
        return None if m is None else (int(m[1]) // 1000, int(m[1]) % 1000 // 10)
    parts = []
    for macro in row.macros:
        m = re.search(rf"^\s*#\s*define\s+{re.escape(macro)}\s+(\d+)\s*$", text, re.MULTILINE)
        if m is None:
            return None
        parts.append(int(m[1]))
    return tuple(parts)


def _header(row: LibraryRow) -> str | None:
    return _CUDART[0] if row.library == "cudart" else row.header


def _wheel_name(filename: str) -> tuple[str, str]:
    name, version = filename.split("-")[:2]
    return name.replace("_", "-"), version


def test_reported_versions_agree_with_the_wheels_headers():
    rules = load_rules()
    checked: list[str] = []
    store = Path(os.environ.get("CUDASTACK_WHEELS", "/opt/cudastack-wheels"))
    for wheel in sorted(store.glob("*.whl")) if store.is_dir() else []:
        name, version = _wheel_name(wheel.name)
        row = rules.library_for_wheel(name)
        header = _header(row) if row is not None and row.reports is not None else None
        if row is None or header is None:
            continue
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m.endswith(f"/include/{header}")]
            if not members:
                continue
            text = z.read(members[0]).decode("utf-8", "replace")
        assert _macros(text, row) == reported_version(row, version), (wheel.name, header)
        checked.append(f"{name} {version}")
    site = torch_site(torch_venv())
    for dist in installed_wheels([site], reader=read_elf).distributions:
        row = rules.library_for_wheel(dist.name)
        header = _header(row) if row is not None and row.reports is not None else None
        if row is None or header is None:
            continue
        rows = [r.path for r in dist.records if r.path.endswith(f"/include/{header}")]
        if not rows:
            continue
        text = Path(site, rows[0]).read_text(encoding="utf-8", errors="replace")
        assert _macros(text, row) == reported_version(row, dist.version), (dist.label, header)
        checked.append(dist.label)
    # the wheels the table was first checked against, and the cu12/cu11 ones in the store
    print("checked:", ", ".join(checked))
    assert len(checked) >= 6, checked
