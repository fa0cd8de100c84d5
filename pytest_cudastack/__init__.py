"""pytest-cudastack: CUDA environment invariants as pytest tests."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a cost on every cudastack run)

if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_MARKERS = ("requires_soname", "requires_wheel", "requires_driver", "requires_cuda", "requires_gpu")


def __getattr__(name: str) -> Any:
    # `from pytest_cudastack import requires_soname` is sugar for pytest.mark.requires_soname;
    # resolved lazily so importing the package never imports pytest.
    if name in _MARKERS:
        # lazy: importing the package never imports pytest
        import pytest

        return getattr(pytest.mark, name)
    raise AttributeError(f"module 'pytest_cudastack' has no attribute {name!r}")
