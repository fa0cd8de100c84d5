"""Hostile RECORD rows and site directories (issue #14): problems naming the row, never an exception."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_cudastack._sysio import Span
from pytest_cudastack.checks.integrity import check_integrity
from pytest_cudastack.wheels import ownership
from pytest_cudastack.wheels.distinfo import parse_record
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, record_hash, site_packages, write_dist

needs_cc = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


def _rows(text: str) -> tuple[list[tuple[str, str | None, int | None]], list[str]]:
    return parse_record(text, lambda p, h, s: (p, h, s))


@pytest.mark.parametrize("quoted", [False, True])  # the comma-split shortcut and the csv module
def test_5000_digit_size_is_a_problem(quoted: bool) -> None:
    digits = "9" * 5000
    second = '"b.so"' if quoted else "b.so"
    text = f"a.so,sha256=x,{digits}\n{second},,12\n"
    rows, problems = _rows(text)
    assert rows[0] == ("a.so", "sha256=x", None)
    assert problems == ["RECORD line 1: size of 5000 characters is not a byte count (a.so)"]


@pytest.mark.parametrize("algorithm", ["shake_128", "shake_256", "SHAKE_128"])
@pytest.mark.parametrize("quoted", [False, True])
def test_shake_hash_is_a_problem(algorithm: str, quoted: bool) -> None:
    text = f"a.so,{algorithm}=AAAA,3\n" + ('"b",,\n' if quoted else "")
    rows, problems = _rows(text)
    assert rows[0] == ("a.so", None, 3)
    assert problems == [f"RECORD line 1: hash algorithm {algorithm!r} has no fixed digest length (a.so)"]


@needs_cc
def test_shake_record_row_through_the_integrity_check(tmp_path: Path) -> None:
    site = site_packages(tmp_path / "venv")
    lib = compile_so("libp.so.1")
    write_dist(site, "p", "1", {"p/libp.so.1": lib}, extra_rows=["p/libq.so.1,shake_128=AAAA,4"])
    (site / "p" / "libq.so.1").write_bytes(b"abcd")
    spec = site / "p-1.dist-info" / "RECORD"
    spec.write_text(spec.read_text().replace(record_hash(lib), "shake_128=AAAA"))
    inv = installed_wheels([str(site)])
    assert any("shake_128" in p for d in inv.distributions for p in d.problems)
    check_integrity(inv, verify_hashes=True)  # no TypeError from digest()


@needs_cc
def test_symlink_out_of_the_site_dir_is_never_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A RECORD-listed library that is a symlink to a file outside the site directory: normpath kept it
    "inside", realpath does not, and nothing outside the site directory is read."""
    site = site_packages(tmp_path / "venv")
    lib = compile_so("libp.so.1", payload="AAAA")
    write_dist(site, "p", "1", {"p/libp.so.1": lib})
    outside = tmp_path / "elsewhere" / "libp.so.1"
    outside.parent.mkdir()
    outside.write_bytes(compile_so("libp.so.1", payload="BBBB"))
    os.unlink(site / "p" / "libp.so.1")
    os.symlink(outside, site / "p" / "libp.so.1")
    opened: list[str] = []
    real_open = ownership.open_span

    def spy(path: str) -> tuple[Span, os.stat_result]:
        opened.append(path)
        return real_open(path)

    monkeypatch.setattr(ownership, "open_span", spy)
    check_integrity(installed_wheels([str(site)]), verify_hashes=True)
    assert opened == []
    # a symlink that stays inside the site directory is still hashed
    os.unlink(site / "p" / "libp.so.1")
    inside = site / "p" / "real.so"
    inside.write_bytes(compile_so("libp.so.1", payload="BBBB"))
    os.symlink(inside, site / "p" / "libp.so.1")
    (f,) = check_integrity(installed_wheels([str(site)]), verify_hashes=True)
    assert "other bytes" in f.message
    assert opened


def test_metadata_with_lone_surrogates_never_raises() -> None:
    """Found by fuzz/ (distinfo): compat32 returns Header objects for such values, whose str() raised
    UnicodeEncodeError; each surrogate now reads as U+FFFD."""
    from pytest_cudastack.wheels.distinfo import metadata_headers

    assert metadata_headers("Name: p\udcff\u0435\nFrom nobody\nVersion: 1\n\n") == [
        ("name", "p\ufffd\u0435"),
        ("version", "1"),
    ]
    assert metadata_headers("Name: p\ud800x\nFrom nobody\n\n") == [("name", "p\ufffdx")]
