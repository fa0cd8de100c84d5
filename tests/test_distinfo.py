"""The dist-info reader: RECORD as the csv module reads it, METADATA as the email parser reads it, the plain
RECORD path predicate and the directory-name fallback (pytest_cudastack.wheels.distinfo)."""

from __future__ import annotations

import csv
import email.parser
import email.policy
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.wheels.distinfo import (
    is_plain_record_path,
    metadata_headers,
    name_version,
    name_version_from_dirname,
    parse_record,
)
from pytest_cudastack.wheels.inventory import RecordEntry, installed_wheels
from pytest_cudastack.wheels.sitepaths import owner_index, record_abspath
from tests.helpers.sitebuild import site_packages, write_dist


def _email(text: str) -> list[tuple[str, str]]:
    msg = email.parser.Parser(policy=email.policy.compat32).parsestr(text, headersonly=True)
    return [(k.lower(), str(v)) for k, v in msg.items()]


def _records(text: str) -> tuple[list[RecordEntry], list[str]]:
    return parse_record(text, RecordEntry)


# ----------------------------------------------------------------------------------------------------
# RECORD


@pytest.mark.parametrize(
    "text",
    [
        "a/b.py,sha256=x,12\nc.py,,\n\n  \nd.py,sha256=y,3,extra\n,sha256=z,1\ne.py,md5,1\nf.py,sha256=w,-1\n",
        'a/b.py,sha256=x,12\n"q,uoted.py",sha256=y,3\n',  # quoted: the csv module reads it
        "a.py,sha256=x,12\x00\n",
        "a.py , sha256=x ,12\r\nb.py,sha256=y,\u00b9\n",
    ],
)
def test_record_rows_as_the_csv_module_reads_them(text):
    entries, problems = _records(text)
    # a quoted blank last row makes parse_record hand the text to the csv module, and adds nothing
    assert (entries, problems) == _records(text.rstrip("\n") + '\n"",,\n')
    assert all(type(e) is RecordEntry and e == RecordEntry(e.path, e.hash, e.size) for e in entries)
    assert hash(entries[0]) == hash(RecordEntry(entries[0].path, entries[0].hash, entries[0].size))
    # every row kept is a csv row's first field
    assert {e.path for e in entries} <= {row[0] for row in csv.reader(text.splitlines()) if row}


@pytest.mark.parametrize(
    ("text", "rows", "problems"),
    [
        pytest.param(
            'torch/a.py,sha256=A,3\n"q,uoted.py",sha256=y,3\n"a""b.py",,\n',
            [("torch/a.py", "sha256=A", 3), ("q,uoted.py", "sha256=y", 3), ('a"b.py', None, None)],
            [],
            id="quoting",
        ),
        pytest.param('a.py,,\n"x"y,,\n', [("a.py", None, None), ("xy", None, None)], [], id="quote mid-field"),
        pytest.param(
            '"unterminated,quote\n',
            [("unterminated,quote", None, None)],
            ["RECORD line 1: expected 3 fields (path,hash,size), got 1"],
            id="unterminated quote",
        ),
        pytest.param("x.py,  sha256=a ,  12 \n", [("x.py", "sha256=a", 12)], [], id="blanks around fields"),
        pytest.param("a.py,,\r\n\r\n,,\r\n b.py,,\r\n", [("a.py", None, None), (" b.py", None, None)], [], id="crlf"),
        pytest.param(
            "only\n,sha256=z,1\nx.py,md5,1\ny.py,sha256=w,-1\nz.py,sha256=v,1,2\n",
            [("only", None, None), ("x.py", None, 1), ("y.py", "sha256=w", None), ("z.py", "sha256=v", 1)],
            [
                "RECORD line 1: expected 3 fields (path,hash,size), got 1",
                "RECORD line 2: empty path",
                "RECORD line 3: hash 'md5' is not '<algorithm>=<digest>' (x.py)",
                "RECORD line 4: size '-1' is not a byte count (y.py)",
                "RECORD line 5: expected 3 fields (path,hash,size), got 4",
            ],
            id="problems",
        ),
        pytest.param(
            "a" * 131073 + ",,\n",
            [],
            ["RECORD is not valid CSV: field larger than field limit (131072)"],
            id="field over the csv limit",
        ),
    ],
)
def test_record_rows_pinned(text, rows, problems):
    entries, found = _records(text)
    assert [(e.path, e.hash, e.size) for e in entries] == rows
    assert found == problems


def test_record_follows_the_csv_field_size_limit():
    """The limit is the csv module's process state: the shortcut must not accept what csv would refuse."""
    text = "a" * 200 + ",,\n" + "b.py,,\n"
    old = csv.field_size_limit(100)
    try:
        assert _records(text) == ([], ["RECORD is not valid CSV: field larger than field limit (100)"])
        csv.field_size_limit(1 << 20)
        assert [e.path for e in _records("a" * 200_000 + ",,\n")[0]] == ["a" * 200_000]
    finally:
        csv.field_size_limit(old)


def test_parse_record_builds_what_it_is_given():
    paths, problems = parse_record('a.py,sha256=x,1\n,,\n"b,c",,\nd\n', lambda path, _h, _s: path)
    assert paths == ["a.py", "b,c", "d"]
    assert problems == ["RECORD line 4: expected 3 fields (path,hash,size), got 1"]


# ----------------------------------------------------------------------------------------------------
# plain RECORD paths

_PLAIN = [
    ("torch/lib/libc10.so", True),
    ("a", True),
    ("x/.hidden", True),
    (".hidden", True),
    ("a/.b/c.", True),
    (".x/./y", False),
    ("./.", False),
    ("a.b/c..d", False),  # ".." anywhere: the predicate may send a plain path the slow way, never the reverse
    ("..foo", False),
    ("", False),
    ("/abs/p", False),
    ("./x/z.so", False),
    ("../../../bin/torchrun", False),
    ("x/../y", False),
    ("x//w.so", False),
    ("x/./v.so", False),
    ("d/", False),
    ("d/.", False),
    (".", True),  # today's answer, the one miss: it resolves to "<site>/.", which normpath shortens
    ("a\x00b", False),
]


@pytest.mark.parametrize(("path", "plain"), _PLAIN)
def test_plain_record_path(path, plain):
    assert is_plain_record_path(path) is plain
    if plain and path != ".":  # what "plain" promises: the join needs no normalisation
        assert os.path.normpath(os.path.join("/s/site", path)) == "/s/site/" + path
        assert record_abspath("/s/site", path) == "/s/site/" + path


def test_plain_record_path_over_every_short_path():
    """Every path of up to 6 characters from ``a . / NUL``: the predicate as it was first written (the
    conditions of record_abspath's shortcut, spelled out)."""

    def spelled_out(path: str) -> bool:
        return not (
            not path
            or "\x00" in path
            or path.startswith(("/", "./"))
            or ".." in path
            or "//" in path
            or "/./" in path
            or path.endswith(("/.", "/"))
        )

    for n in range(7):
        for chars in itertools.product("a./\x00", repeat=n):
            path = "".join(chars)
            assert is_plain_record_path(path) is spelled_out(path), path


@pytest.mark.parametrize("location", ["/s/site", "/s/site/", "/", ".", "/s/./site"])
@pytest.mark.parametrize("path", [p for p, _ in _PLAIN if p not in ("", ".", "a\x00b")])
def test_record_abspath_is_the_normalised_join(location, path):
    """record_abspath's shortcut for plain paths gives what the normalised join does."""
    full = os.path.normpath(os.path.join(os.path.normpath(location), path))
    got = record_abspath(location, path)
    assert got is None or got == full


# ----------------------------------------------------------------------------------------------------
# METADATA


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("", True),
        ("\n", True),
        ("Name: x\nVersion: 1\n", True),
        ("Name: x\nVersion: 1", True),
        ("Metadata-Version: 2.1\nName:x\nname: y\nVersion:\t 1 \nRequires-Dist: a; extra == 'b'\n\nBody: z\n", True),
        ("Name: x\nLicense: a\n  b\n\t\nVersion: 1\n\n", True),
        ("Name: x\r\nLicense: a\r\n b\r\nVersion: 1\r\n\r\nbody\n", True),  # pip's METADATA: CRLF lines
        ("\n\nName: x", True),
        ("Name: a\u2028b\nVersion: 1\x0b\n", True),
        ("Summary: caf\u00e9 \u2014 \U0001f680\nSummary: =?utf-8?q?caf=C3=A9?=\n", True),
        # left to the email parser
        (" x\nName: y", False),
        ("From foo\nName: x", False),
        ("Name: x\r\nVersion: 1\n\nbody", False),
        ("Name: x\rVersion: 1", False),
        (":x\nName: y", False),
        ("Name x\nVersion: 1", False),
        ("Name: x\nVersion: 1\nnot a header\nSummary: s", False),
    ],
)
def test_metadata_headers_as_the_email_parser_reads_them(text, plain, monkeypatch):
    expected = _email(text)
    if plain:  # the shortcut answers: the email parser is not asked

        def refuse(*_a, **_k):
            raise AssertionError("email parser used")

        monkeypatch.setattr(email.parser, "Parser", refuse)
    assert metadata_headers(text) == expected


@pytest.mark.parametrize(
    ("text", "headers"),
    [
        pytest.param(
            "Name: x\nDescription: a\n  b\n\tc\nVersion: 1\n",
            [("name", "x"), ("description", "a\n  b\n\tc"), ("version", "1")],
            id="continuation lines keep their break and indent",
        ),
        pytest.param(
            "Name: x\r\nLicense: a\r\n b\r\n", [("name", "x"), ("license", "a\r\n b")], id="crlf continuation"
        ),
        pytest.param("Name: x\n\nVersion: 2\n", [("name", "x")], id="body not read"),
        pytest.param(
            "Summary: =?utf-8?q?caf=C3=A9?=\nName: caf\u00e9\n",
            [("summary", "=?utf-8?q?caf=C3=A9?="), ("name", "caf\u00e9")],
            id="encoded words kept as written (compat32)",
        ),
        pytest.param("From x\nName: y\n", [("name", "y")], id="unix from line skipped"),
    ],
)
def test_metadata_headers_pinned(text, headers):
    assert metadata_headers(text) == headers


@pytest.mark.parametrize(
    ("dirname", "expected"),
    [
        ("foo-1.0.dist-info", ("foo", "1.0")),
        ("nvidia_cudnn_cu13-9.24.0.43.dist-info", ("nvidia_cudnn_cu13", "9.24.0.43")),
        ("foo.dist-info", ("foo", "")),
        ("foo-.dist-info", ("foo", "")),
        ("foo-bar-1.dist-info", ("foo", "bar-1")),
    ],
)
def test_name_version_from_dirname(dirname, expected):
    assert name_version_from_dirname(dirname) == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("name", "Torch"), ("version", "2.1")], ("Torch", "2.1")),
        ([("name", " a "), ("name", "b"), ("version", "\t1 ")], ("a", "1")),  # the first, stripped
        ([("name", "  "), ("version", "")], ("pkg", "9")),  # blank: the directory name's
        ([("summary", "s")], ("pkg", "9")),
        ([("name", "x")], ("x", "9")),
        ([], ("pkg", "9")),
    ],
)
def test_name_version_falls_back_to_the_dirname(headers, expected):
    assert name_version(headers, "pkg-9.dist-info") == expected


def test_metadata_bytes_are_read_as_utf8(tmp_path: Path):
    """METADATA is UTF-8 (core metadata spec); bytes that are not are replaced, never an error."""
    site = site_packages(tmp_path / "venv")
    d = write_dist(site, "enc", "1", {"enc.py": ""})
    (d.dist_info / "METADATA").write_bytes(
        "Metadata-Version: 2.1\nName: enc\nVersion: 1\nSummary: caf\u00e9 \u2014 ok\n".encode() + b"Author: Jos\xe9\n"
    )
    dist = installed_wheels([str(site)], reader=read_elf).get("enc")
    assert dist is not None
    assert dist.summary == "caf\u00e9 \u2014 ok"
    assert dist.problems == ()


@pytest.mark.parametrize(
    "metadata",
    [
        "Name: a\u2028b\nVersion: 1\n",
        "Name: x\n y\nVersion: 2\n",
        "From me\nName: fromline\nVersion: 3\n",
        "Name: crlf\r\nVersion: 4\r\n\r\n",
        "Name: x\nVersion: 1\nnot a header\nVersion: 5\n",
        "Version: 6\n",
        "Name:\nVersion:\n",
    ],
)
def test_owner_index_names_owners_as_the_inventory(tmp_path: Path, metadata):
    """cudastack tree's RECORD-only owner index reads METADATA with the inventory's parser."""
    site = site_packages(tmp_path / "venv")
    write_dist(site, "pkg", "9", {"pkg/m.py": ""}, metadata=metadata)
    path = str(site / "pkg/m.py")
    (dist,) = installed_wheels([str(site)], reader=read_elf).distributions
    assert owner_index([str(site)]).owner(path) == dist.label


def test_light_for_tree_warm_path():
    """sitepaths and distinfo import no dataclasses, logging, typing, csv or email (tree's warm path)."""
    code = (
        "import sys\nimport pytest_cudastack.wheels.sitepaths\n"
        "print([m for m in ('dataclasses', 'logging', 'typing', 'csv', 'email') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
