"""Readers that stay linear on hostile input (issue #23, Deliver 2). No wall-clock limits: each test checks
the property that makes the reader linear (a lexer alternative that never fails, so nothing is rescanned;
reads counted and bounded by the section; one parse per module source)."""

from __future__ import annotations

import ast

import pytest

from pytest_cudastack.model import pysource
from tests.helpers.elfbuild import sparse_gnu_hash_elf

HOSTILE_SOURCES = [
    pytest.param('"\\' * 2000, id="escaped-quotes-one-line"),
    pytest.param("'\\" * 2000, id="escaped-single-quotes"),
    pytest.param('"""\\' * 2000, id="triple-escapes"),
    pytest.param("'''\"\"\"'" * 2000, id="mixed-triples"),
    pytest.param('x = """' + "'\\\n" * 2000, id="unclosed-triple-then-lines"),
    pytest.param("import os\n" + "'" * 4001 + "\n" + '"' * 4001, id="odd-quote-runs"),
]


@pytest.mark.parametrize("text", HOSTILE_SOURCES)
def test_lexer_matches_at_every_string_start(text: str) -> None:
    # a string alternative that can fail is retried one character later and rescans the rest of the line
    # or text: quadratic. Every quote the scan can start at must give a token
    for i, c in enumerate(text):
        if c in "\"'":
            assert pysource._LEX.match(text, i) is not None, (i, text[i : i + 20])
    pysource._top_level_source(text)  # and the scan itself completes


@pytest.mark.parametrize(
    "source",
    [
        'import a\nx = "unclosed\nimport b\n',
        'import a\ns = """never closed\nimport b\n',
        "import a\ns = 'tail\\",
    ],
)
def test_unclosed_strings_read_as_python_does(tmp_path, source: str) -> None:
    # Python stops at an unclosed string: the module does not parse, so nothing of it is read
    with pytest.raises(SyntaxError):
        ast.parse(source)
    f = tmp_path / "m.py"
    f.write_text(source)
    assert pysource.read_module_source(str(f), strip=True) is None


def test_module_source_is_parsed_once_per_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every model process of a run (closure contexts, symbol scopes, reach, ...) asks for a module's imports;
    # the run's cache object answers after the first parse, used or not
    from pytest_cudastack.linker.elfcache import ElfCache

    parsed: list[str] = []
    real = ast.parse

    def counting(source, filename="<unknown>", *args, **kwargs):
        parsed.append(filename)
        return real(source, filename, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counting)
    good = tmp_path / "good.py"
    good.write_text("import os\nfrom . import sub\n")
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx = (1 +\n")  # the scan gives up, the stripped and the whole text fail
    for enabled in (False, True):
        cache = ElfCache(str(tmp_path / f"c{enabled}"), enabled=enabled)
        parsed.clear()
        for _ in range(4):
            assert pysource.module_imports(str(good), "pkg", True, cache)
            pysource.module_imports(str(bad), "bad", False, cache)
        assert parsed.count(str(good)) == 1
        assert parsed.count(str(bad)) <= 2  # one read: the stripped text, then the whole


@pytest.mark.parametrize("little", [True, False], ids=["le", "be"])
def test_gnu_hash_chain_is_read_in_blocks_capped_by_its_segment(tmp_path, monkeypatch, little: bool) -> None:
    import os

    from pytest_cudastack.errors import ElfError
    from pytest_cudastack.linker import symbols

    reads: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(symbols.os, "pread", counting)
    lib = tmp_path / "libsparse.so"
    sparse_gnu_hash_elf(lib, 8 << 20, little=little)  # 2M zero words: a chain that never ends
    with pytest.raises(ElfError, match="GNU hash chain does not terminate before the end of its PT_LOAD"):
        symbols.read_symbols(lib)
    assert len(reads) < 40  # blocks doubling to 4 MiB, not one read per word
    assert sum(reads) < (8 << 20) + (1 << 16)  # each byte of the segment read at most once
    reads.clear()
    sparse_gnu_hash_elf(lib, 1 << 20, end_at=70_000, little=little)  # ends at symbol 70,001, past several blocks
    with pytest.raises(ElfError, match=r"DT_SYMTAB \(1680048 bytes"):
        symbols.read_symbols(lib)  # 70,001 symbols are not in the file: the count was found, then refused
    assert len(reads) < 40


def test_snapshot_limit_is_documented_and_read_files_over_it_are_refused(tmp_path) -> None:
    from pathlib import Path

    from pytest_cudastack.errors import DataError
    from pytest_cudastack.stack import SNAPSHOT_LIMIT, load_snapshot

    assert SNAPSHOT_LIMIT == 8 << 20
    assert "over 8 MiB is refused" in " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(SNAPSHOT_LIMIT + 1)
    with pytest.raises(DataError, match="cannot read cudastack snapshot"):
        load_snapshot(str(big))


@pytest.mark.parametrize("shape", ["strings", "objects", "patterns"])
def test_schema_check_fast_pass_agrees_with_the_walk(shape: str) -> None:
    # the compiled pass accepts exactly what the walk accepts on valid documents, and every rejection is
    # confirmed by the walk, which names the field
    import copy

    from pytest_cudastack.schemacheck import first_error
    from pytest_cudastack.stack import snapshot_schema
    from tests.test_robust_snapshot import SNAP

    doc = copy.deepcopy(SNAP)
    if shape == "strings":
        doc["wheels"][0]["libraries"] = ["x"] * 10_000
    elif shape == "objects":
        doc["wheels"] = [copy.deepcopy(doc["wheels"][0]) for _ in range(500)]
    else:
        doc["wheels"][0]["gpu_code"]["sass"] = ["sm_90"] * 10_000
    schema = snapshot_schema(legacy=False)
    assert first_error(doc, schema) is None
    if shape == "strings":
        doc["wheels"][0]["libraries"][9_999] = 5
        assert first_error(doc, schema) == "$.wheels[0].libraries[9999]: expected string, found integer 5"
    elif shape == "objects":
        doc["wheels"][499]["cuda_major"] = 13.0  # integral float: an integer, as JSON Schema says
        assert first_error(doc, schema) is None
        doc["wheels"][499]["cuda_major"] = True
        assert first_error(doc, schema) == "$.wheels[499].cuda_major: expected integer, found boolean True"
    else:
        doc["wheels"][0]["gpu_code"]["sass"][5_000] = "sm_9x"
        assert first_error(doc, schema) == "$.wheels[0].gpu_code.sass[5000]: 'sm_9x' does not match '^sm_[0-9]+[af]?$'"
