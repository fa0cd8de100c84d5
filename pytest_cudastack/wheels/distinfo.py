"""The one reader of a ``.dist-info`` directory's files: RECORD rows, METADATA headers, the directory's name.

RECORD is read as the csv module reads it (the wheel spec, PEP 376 / PEP 427, says RECORD is a csv file, and
pip writes and reads it with the csv module), METADATA's header block as the email parser reads it (the core
metadata spec: "the email.parser module"), and a RECORD path is *plain* when it resolves to
``<site dir>/<path>`` unchanged. Each has one shortcut for the usual input (a comma split for a RECORD
without quotes, string operations for a plain header block) that returns what the module would, and hands
everything else to the module.

``cudastack tree`` imports this module on its warm path (through :mod:`pytest_cudastack.wheels.sitepaths`),
so it defines no dataclass and imports neither csv nor email at import time: they are imported where the
shortcut does not apply.
"""

from __future__ import annotations

import re
import sys

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~5 ms) on tree's warm path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import TypeVar

    T = TypeVar("T")

__all__ = [
    "is_plain_record_path",
    "metadata_headers",
    "name_version",
    "name_version_from_dirname",
    "parse_record",
]


def is_plain_record_path(path: str) -> bool:
    """Does this RECORD path resolve to ``<site dir>/<path>`` unchanged (``os.path.normpath`` of the join is
    the plain concatenation)? False for an empty path, NUL, an absolute path, ``./`` at the start, ``..``
    anywhere (``..foo`` included: cheap to send the rare false alarm through normpath), ``//``, ``/./`` and a
    trailing ``/`` or ``/.``. (``"."`` itself counts as plain: it always has.)"""
    if not path or path[0] == "/" or path[-1] == "/" or "\x00" in path or ".." in path or "//" in path:
        return False
    if path[0] != "." and "/." not in path:
        return True  # the usual path, decided with ``in`` alone: no component can be "."
    return not (path.startswith("./") or "/./" in path or path.endswith("/."))


def name_version_from_dirname(dirname: str) -> tuple[str, str]:
    """``(name, version)`` from a ``{name}-{version}.dist-info`` directory name (PEP 376 / the binary
    distribution format escapes ``-`` in the name to ``_``); version "" when there is no ``-``."""
    stem = dirname.removesuffix(".dist-info")
    name, sep, version = stem.partition("-")
    return name, version if sep else ""


# ----------------------------------------------------------------------------------------------------
# RECORD

_CSV_DEFAULT_FIELD_LIMIT = 131072  # csv.field_size_limit() until someone changes it (Modules/_csv.c)
# A byte count of more digits than this is no file's size (and ``int()`` refuses 4,300 digits and more)
_MAX_SIZE_DIGITS = 20


def _csv_field_limit() -> int:
    """``csv.field_size_limit()``, without importing csv when nothing has: the limit is the csv module's
    state, so it is the default until csv is imported."""
    csv = sys.modules.get("csv")
    return _CSV_DEFAULT_FIELD_LIMIT if csv is None else int(csv.field_size_limit())


def parse_record(text: str, entry: Callable[[str, str | None, int | None], T]) -> tuple[list[T], list[str]]:
    """``entry(path, hash, size)`` for each row of a RECORD text, and the problems found; never raises.

    The rows are those of ``csv.reader(text.splitlines())`` (the default dialect, what pip reads RECORD
    with). A row is ``path,hash,size`` (PEP 376, the binary distribution format's RECORD): the hash is
    ``<algorithm>=<urlsafe-b64>`` or empty (None), the size a decimal byte count or empty (None). Blank rows
    are skipped; a row without a path is dropped with a problem; a wrong field count, a bad hash or size is a
    problem and that field is taken as empty. Text the csv module cannot read gives no rows and one problem.
    """
    entries: list[T] = []
    problems: list[str] = []
    rows = _record_rows(text)
    if isinstance(rows, str):
        return entries, [rows]
    for lineno, row in enumerate(rows, 1):
        if len(row) == 3:  # the well-formed row, decided without the checks below (same result)
            path, digest, size_s = row
            if (
                path.strip()
                and (not digest or ("=" in digest and digest == digest.strip() and not _variable_length(digest)))
                and (not size_s or (len(size_s) <= _MAX_SIZE_DIGITS and size_s.isascii() and size_s.isdigit()))
            ):
                entries.append(entry(path, digest or None, int(size_s) if size_s else None))
                continue
        checked = _checked_row(lineno, row, problems)
        if checked is not None:
            entries.append(entry(*checked))
    return entries, problems


def _record_rows(text: str) -> Iterable[list[str]] | str:
    """The rows ``csv.reader`` reads from a RECORD text, or the problem when it cannot read them."""
    lines = text.splitlines()
    if '"' not in text and "\x00" not in text and max(map(len, lines), default=0) <= _csv_field_limit():
        # the shortcut: no quote, no NUL (which csv refuses before Python 3.11), no field over the csv
        # limit: csv.reader's rows are the comma splits (made one at a time: 22k lists alive at once cost
        # the garbage collector more than the splitting)
        return (line.split(",") for line in lines)
    import csv  # lazy: rare (quoted fields, NUL, huge lines), kept off tree's warm path

    try:
        return list(csv.reader(lines))
    except csv.Error as e:
        return f"RECORD is not valid CSV: {e}"


def _checked_row(lineno: int, row: list[str], problems: list[str]) -> tuple[str, str | None, int | None] | None:
    """(path, hash, size) of a row that is not plainly well formed, each problem noted; None for a blank
    row or one without a path."""
    if not row or all(not c.strip() for c in row):
        return None
    if len(row) != 3:
        problems.append(f"RECORD line {lineno}: expected 3 fields (path,hash,size), got {len(row)}")
        if not row[0]:
            return None
        row = [*row, "", ""][:3]
    path, digest, size_s = row
    if not path:
        problems.append(f"RECORD line {lineno}: empty path")
        return None
    size = _record_size(lineno, path, size_s, problems)
    return path, _record_hash(lineno, path, digest, problems), size


def _record_size(lineno: int, path: str, size_s: str, problems: list[str]) -> int | None:
    """A RECORD row's size field as a byte count; None when empty or (a problem noted) not a byte count."""
    digits = size_s.strip()
    if len(digits) > _MAX_SIZE_DIGITS:
        problems.append(f"RECORD line {lineno}: size of {len(digits)} characters is not a byte count ({path})")
        return None
    if not digits:
        return None
    try:
        size = int(size_s)
        if size < 0:
            raise ValueError(size_s)
    except ValueError:
        problems.append(f"RECORD line {lineno}: size {size_s!r} is not a byte count ({path})")
        return None
    return size


def _record_hash(lineno: int, path: str, digest: str, problems: list[str]) -> str | None:
    """A RECORD row's hash field; None when empty or (a problem noted) not a fixed-length
    ``<algorithm>=<digest>``."""
    h = digest.strip() or None
    if h is not None and "=" not in h:
        problems.append(f"RECORD line {lineno}: hash {h!r} is not '<algorithm>=<digest>' ({path})")
        return None
    if h is not None and _variable_length(h):
        algorithm = h.partition("=")[0]
        problems.append(f"RECORD line {lineno}: hash algorithm {algorithm!r} has no fixed digest length ({path})")
        return None
    return h


def _variable_length(digest: str) -> bool:
    """A SHAKE hash (``shake_128=...``): hashlib's only algorithms whose digest needs a length, so no RECORD
    row can be checked against one (the wheel spec asks for sha256 or stronger, a fixed-length hash)."""
    return digest[:5].lower() == "shake"


# ----------------------------------------------------------------------------------------------------
# METADATA

_HEADER_RE = re.compile(r"[\041-\071\073-\176]+:")  # a header name (printable, no space or colon) and its colon


def _email_headers(text: str) -> list[tuple[str, str]]:
    import email.parser  # lazy: rare (header blocks the shortcut leaves alone), kept off tree's warm path
    import email.policy

    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # lone surrogates (bytes decoded with surrogateescape) make compat32 hand back Header objects
        # whose str() raises UnicodeEncodeError: each becomes U+FFFD, as read_text reads undecodable bytes
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    msg = email.parser.Parser(policy=email.policy.compat32).parsestr(text, headersonly=True)
    return [(k.lower(), str(v)) for k, v in msg.items()]


def _simple_headers(text: str) -> list[tuple[str, str]] | None:
    """:func:`metadata_headers`' shortcut, for the usual header block: ``Name: value`` lines (folded ones
    continued by lines starting with a space or tab) up to the first empty line, every line ending in LF or
    every one in CRLF (pip's own METADATA), no ``From`` line. None for anything else."""
    first_nl = text.find("\n")
    sep = "\r\n" if first_nl > 0 and text[first_nl - 1] == "\r" else "\n"
    end = text.find(sep + sep)
    head = text if end < 0 else text[:end]
    if sep == "\n":
        if "\r" in head:
            return None
    elif head.count("\r") != head.count("\n") or head.count("\r") != head.count(sep):
        return None
    out: list[tuple[str, str]] = []
    match = _HEADER_RE.match
    for line in head.split(sep):
        if not line:
            break  # only the last line can be empty here: the text ends with a newline
        if line[0] in " \t":
            if not out:
                return None
            k, v = out[-1]
            out[-1] = (k, f"{v}{sep}{line}")  # compat32 keeps the line break and the indentation
            continue
        if match(line) is None or line.startswith("From "):
            return None
        k, _, v = line.partition(":")
        out.append((k.lower(), v.lstrip(" \t")))
    return out


def metadata_headers(text: str) -> list[tuple[str, str]]:
    """``(lower-case name, value)`` of every header of a METADATA text, in order, as
    ``email.parser.Parser(policy=compat32).parsestr(text, headersonly=True)`` gives them (the core metadata
    spec's reader; folded values keep their line breaks)."""
    headers = _simple_headers(text)
    return headers if headers is not None else _email_headers(text)


def name_version(headers: Sequence[tuple[str, str]], dirname: str) -> tuple[str, str]:
    """A distribution's name and version: its first ``Name`` and ``Version`` headers (stripped), each
    from the dist-info directory's name (:func:`name_version_from_dirname`) when absent or blank."""
    first: dict[str, str] = {}
    for k, v in headers:
        if k in ("name", "version"):
            first.setdefault(k, v)
    fallback_name, fallback_version = name_version_from_dirname(dirname)
    return first.get("name", "").strip() or fallback_name, first.get("version", "").strip() or fallback_version
