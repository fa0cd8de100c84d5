"""Real tier: cupy-cuda13x beside the CUDA 13 torch ($CUDASTACK_HEALTHY/cupy13-torch, built by .ci/run). Its
optional modules need sonames the CUDA 13 wheels install outside their search (``nvidia/cu13/lib``,
``nvidia/nccl/lib``): each such finding's fix is the LD_LIBRARY_PATH entry the resolver checked, and with it
the import that fails without it succeeds in a child of that environment's interpreter."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_cudastack.cli import main

pytestmark = [pytest.mark.real, pytest.mark.xdist_group("torch-venv")]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "elfcache"))


def _imports(python: Path, module: str, llp: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    if llp is not None:
        env["LD_LIBRARY_PATH"] = llp
    return subprocess.run(
        [str(python), "-c", f"import {module}"], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_search_path_fix_of_cupys_optional_modules_makes_them_import(tmp_path, monkeypatch, capsys):
    venv = Path(os.environ.get("CUDASTACK_HEALTHY", "/opt/cudastack-healthy")) / "cupy13-torch"
    if not (venv / "bin/python").is_file():
        pytest.skip(f"{venv} absent (.ci/run builds it)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    main(["check", "--json", "--site", str(venv)])
    doc = json.loads(capsys.readouterr().out)
    site = next(str(p) for p in sorted(venv.glob("lib/python3*/site-packages")))
    fixed = [
        f
        for f in doc["items"]["closure"]
        if f["remedies"] and f["remedies"][0]["kind"] == "search-path" and f["severity"] != "info"
    ]
    assert fixed  # cufft, cusolver, nvrtc (nvidia/cu13/lib) and nccl (nvidia/nccl/lib) at cupy-cuda13x 14.2.0
    assert all(f["remedies"][0]["why"].startswith("checked: ") for f in fixed)
    assert not any("decide which of the distributions" in f["fix"] for f in fixed)
    for f in fixed:
        module_path = os.path.relpath(f["facts"]["objects"][0], site)
        module = module_path.split(".", 1)[0].replace("/", ".")
        assert _imports(venv / "bin/python", module, None).returncode != 0, module
        done = _imports(venv / "bin/python", module, f["remedies"][0]["directory"])
        assert done.returncode == 0, (module, done.stderr[-2000:])
