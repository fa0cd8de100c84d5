"""Colour for the ``cudastack`` command's text output: errors red, warnings yellow.

``--color=auto`` (the default) colours only a terminal, and not when ``NO_COLOR`` is set (no-color.org) or
``TERM=dumb``; ``yes`` always, ``no`` never. ANSI SGR sequences (ECMA-48): 31 red, 33 yellow, 1 bold.
"""

from __future__ import annotations

import os
from typing import TextIO

__all__ = ["Painter", "painter_for"]

_CODES = {"red": "31", "yellow": "33", "green": "32", "bold": "1"}


class Painter:
    """Wraps text in SGR codes when ``enabled``; plain text otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, colour: str) -> str:
        if not self.enabled or not text:
            return text
        return f"\x1b[{_CODES[colour]}m{text}\x1b[0m"

    def severity(self, text: str, severity: str) -> str:
        """``text`` in the colour of a finding's severity ("error" red, "warning" yellow, others plain)."""
        colour = {"error": "red", "warning": "yellow"}.get(severity.lower())
        return self(text, colour) if colour else text


def painter_for(choice: str | None, stream: TextIO) -> Painter:
    """The painter for ``--color=choice`` writing to ``stream``."""
    if choice == "yes":
        return Painter(True)
    if choice == "no":
        return Painter(False)
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return Painter(tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb")
