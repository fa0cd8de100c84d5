"""Every reproducer the fuzz harness found (fuzz/README.md), in the default tier: each input, run through
its target's check (the parser's contract: only its CudaStackError subclass escapes; the ELF readers agree
where both answer), must pass. Reproducers live in tests/data/fuzz/<parser>/."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fuzz.targets import TARGETS

DATA = Path(__file__).parent / "data" / "fuzz"
REPRODUCERS = sorted(DATA.glob("*/*.bin"))


@pytest.mark.parametrize("path", REPRODUCERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reproducer_keeps_the_contract(path: Path, tmp_path: Path) -> None:
    target = TARGETS[path.parent.name]
    if target.structured is not None:
        target.seeds(tmp_path / "work")  # the cache targets read the libraries their seeds describe
    scratch = tmp_path / "s"
    scratch.mkdir()
    t = time.monotonic()
    assert target.check(path.read_bytes(), scratch) is None
    assert time.monotonic() - t < 2  # the harness's per-input limit (found: inputs that took 3-13 s)


def test_there_are_reproducers() -> None:
    assert REPRODUCERS
