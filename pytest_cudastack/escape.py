"""What a terminal may be shown of a string that came from a file: the one escape function of every command
and of the plugin's pytest output.

A DT_NEEDED entry, a RUNPATH, a METADATA name, a snapshot's field or a file name may hold any bytes: ``ESC [2J``
clears the screen, an OSC sequence sets the window title or a hyperlink, ``\\r`` rewrites the line, U+202E
reverses what follows. :func:`printable` writes each character that is not printable (``str.isprintable``:
the C0 and C1 controls, DEL, format characters such as the bidirectional overrides, line and paragraph
separators, unassigned code points) as its Python escape (``\\x1b``, ``\\u202e``), and each byte a file name
could not decode (a surrogate escape, PEP 383) as ``\\xNN``, so what is shown names the bytes and
changes nothing on the terminal. The result is printable, so escaping twice changes nothing more.
"""

from __future__ import annotations

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on tree's warm path
if TYPE_CHECKING:
    from typing import Any

__all__ = ["printable", "printable_data"]


def printable(text: str, *, newlines: bool = False) -> str:
    """*text* with every unprintable character escaped; with ``newlines`` a ``\\n`` is kept (for text made of
    lines, where it is ours), else it is escaped too."""
    if text.isprintable():  # the common case: one C-level scan, no copy
        return text
    out: list[str] = []
    for c in text:
        if c.isprintable() or (newlines and c == "\n"):
            out.append(c)
        elif "\udc80" <= c <= "\udcff":  # an undecodable byte of a file name (os.fsdecode's surrogateescape)
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        else:
            out.append(repr(c)[1:-1])
    return "".join(out)


def printable_data(value: Any) -> Any:
    """*value* (JSON-like: dicts, lists, tuples, strings, numbers) with :func:`printable` applied to every
    string in it, keys included: for a human view rendered from a document whose strings came from files."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(k) if isinstance(k, str) else k: printable_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(printable_data(v) for v in value)
    return value
