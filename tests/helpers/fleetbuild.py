"""Nodes for the fleet tests: real gcc-built venvs (clean, a cu12 cuDNN installed over cu13's, a library gone)
snapshotted by a Stack with a node's driver facts, written as the files ``cudastack snapshot`` writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_cudastack.cuda.driver import DriverInfo, Gpu
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.stack import Stack
from tests.helpers.sitebuild import compile_so, site_packages, write_dist

__all__ = ["B200", "CUDNN", "H100", "clobber", "cudnn_site", "node_driver", "snap", "write_node"]

CUDNN = "nvidia/cudnn/lib/libcudnn.so.9"
H100 = Gpu(0, "NVIDIA H100 80GB HBM3", "GPU-a", "9.0", 80 << 30, None)
B200 = Gpu(0, "NVIDIA B200", "GPU-b", "10.0", 180 << 30, None)


def node_driver(module: str = "580.95.05", libs: str | None = None, gpus: tuple[Gpu, ...] = (H100,)) -> DriverInfo:
    """A probed driver: kernel module ``module``, user-space libraries ``libs`` (default: the module's)."""
    libs = libs or module
    cuda = "13.0" if module >= "580" else "12.8"
    return DriverInfo(
        "probed",
        module,
        cuda,
        gpus,
        tuple(g.arch or "" for g in gpus),
        "probed",
        kernel_module=module,
        libcuda_version=libs,
        nvml_version=libs,
    )


def cudnn_site(root: Path, major: int = 13) -> Path:
    """A venv with cuDNN for CUDA ``major`` (the wheel name's flavour), its library a real shared object."""
    site = site_packages(root / "venv")
    write_dist(site, f"nvidia-cudnn-cu{major}", "9.13.0.50", {CUDNN: compile_so("libcudnn.so.9", payload=f"cu{major}")})
    return site


def clobber(site: Path) -> None:
    """pip install nvidia-cudnn-cu12 over it: its files at the same paths replace cu13's."""
    write_dist(site, "nvidia-cudnn-cu12", "9.10.2.21", {CUDNN: compile_so("libcudnn.so.9", payload="cu12")})


def snap(
    site: Path,
    driver: DriverInfo | None = None,
    host: bool = True,
    name: str | None = None,
    cache: ElfCache | None = None,
) -> dict[str, Any]:
    """The snapshot document of ``site`` as node ``name`` with ``driver`` (``cache``: default none kept)."""
    stack = Stack(driver_info=driver or node_driver(), site_paths=(str(site),), cache=cache or ElfCache(enabled=False))
    doc: dict[str, Any] = json.loads(json.dumps(stack.to_json(host)))
    if name is not None and host:
        doc["host"]["name"] = name
    return doc


def write_node(directory: Path, name: str, doc: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}.json"
    out.write_text(json.dumps(doc))
    return out
