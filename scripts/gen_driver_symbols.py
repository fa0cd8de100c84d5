"""Generate pytest_cudastack/cuda/data/driver_symbols.json: the CUDA version each driver entry point appeared in.

Usage: python scripts/gen_driver_symbols.py [CUDA_INCLUDE_DIR] [OUT]
       (defaults: /usr/local/cuda/include, pytest_cudastack/cuda/data/driver_symbols.json)

Source: the toolkit's ``cudaTypedefs.h``, whose ``PFN_<name>_v<NNNNN>[_ptds|_ptsz]`` typedefs name every driver
API entry point with the CUDA version (``12040`` = 12.4) its ABI appeared in (``cuGetProcAddress`` takes that
version), and ``cuda.h``, whose ``#define <name> <name>_v<N>`` lines name the exported symbol of the newest
ABI. The exported ELF symbols are derived as libcuda.so.1 names them: the newest ABI of ``<name>`` is
``<name>_v<N>`` (the ``#define``), the ones before it ``_v<N-1>`` ... ``_v2``, the oldest plain ``<name>``;
without a ``#define`` every ABI is ``<name>``. A ``_ptds``/``_ptsz`` typedef is the per-thread-stream variant
of the newest plain ABI not newer than it, with that suffix. Each row keeps the typedef it came from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PFN = re.compile(r"\bPFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\b")
DEFINE = re.compile(r"^\s*#\s*define\s+(cu\w+)\s+(?:__CUDA_API_PT(?:DS|SZ)\()?(cu\w+?)(?:_v(\d+))?\)?\s*$", re.M)
CUDA_VERSION = re.compile(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)\s*$", re.M)


def version(n: int) -> str:
    return f"{n // 1000}.{n % 1000 // 10}"


def generate(typedefs: str, cuda_h: str) -> list[dict[str, str]]:
    """Rows ``{"symbol", "cuda", "source"}``, one per exported symbol, sorted by symbol."""
    plain: dict[str, set[int]] = {}
    suffixed: list[tuple[str, int, str]] = []
    for base, num, suffix in PFN.findall(typedefs):
        if suffix:
            suffixed.append((base, int(num), suffix))
        else:
            plain.setdefault(base, set()).add(int(num))
    newest: dict[str, int] = {}
    for name, target, n in DEFINE.findall(cuda_h):
        if target == name and n:
            newest[name] = max(newest.get(name, 0), int(n))
    names: dict[tuple[str, int], str] = {}
    for base, nums in plain.items():
        ordered = sorted(nums, reverse=True)
        top = newest.get(base)
        for i, num in enumerate(ordered):
            k = top - i if top is not None else 1
            names[(base, num)] = f"{base}_v{k}" if k >= 2 else base
    rows: dict[str, tuple[int, str]] = {}

    def add(symbol: str, num: int, source: str) -> None:
        if symbol not in rows or num < rows[symbol][0]:
            rows[symbol] = (num, source)

    for (base, num), symbol in names.items():
        add(symbol, num, f"PFN_{base}_v{num}")
    for base, num, suffix in suffixed:
        older = [n for n in plain.get(base, ()) if n <= num]
        stem = names[(base, max(older))] if older else base
        add(stem + suffix, num, f"PFN_{base}_v{num}{suffix}")
    return [{"symbol": s, "cuda": version(n), "source": src} for s, (n, src) in sorted(rows.items())]


def main() -> None:
    include = sys.argv[1] if len(sys.argv) > 1 else "/usr/local/cuda/include"
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "pytest_cudastack/cuda/data/driver_symbols.json")
    with open(os.path.join(include, "cudaTypedefs.h"), "rb") as f:
        raw = f.read()
    with open(os.path.join(include, "cuda.h"), encoding="utf-8", errors="replace") as f:
        cuda_h = f.read()
    found = CUDA_VERSION.search(cuda_h)
    payload = {
        "schema": 1,
        "description": "CUDA version in which each driver API entry point (libcuda.so.1 symbol) appeared",
        "source": {
            "file": "cudaTypedefs.h",
            "toolkit": version(int(found.group(1))) if found else "unknown",
            "sha256": hashlib.sha256(raw).hexdigest(),
            "generator": "scripts/gen_driver_symbols.py",
        },
        "rows": generate(raw.decode("utf-8", "replace"), cuda_h),
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=0, sort_keys=False)
        f.write("\n")
    print(f"{out}: {len(payload['rows'])} entry points from CUDA {payload['source']['toolkit']}")


if __name__ == "__main__":
    main()
