"""Readers that stay linear on hostile input (issue #23, Deliver 2). No wall-clock limits: each test checks
the property that makes the reader linear (a lexer alternative that never fails, so nothing is rescanned;
reads counted and bounded by the section; one parse per module source)."""

from __future__ import annotations

import ast

import pytest

from pytest_cudastack.model import pysource

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
