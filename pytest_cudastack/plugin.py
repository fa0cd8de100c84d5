"""pytest hooks for pytest-cudastack (being built; see the pytest-layer issue)."""

from __future__ import annotations
