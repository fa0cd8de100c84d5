"""Which of PyTorch's wheel indexes serves a torch build for a given CUDA bound (``data/torch_indexes.json``).

PyTorch publishes each release's CUDA builds on ``https://download.pytorch.org/whl/<tag>`` (``cu129``,
``cu130``, ...); the PyPI build of a release is one of them. The data file lists the tags with their CUDA
version and a source; which releases each index carries is not in it, so an index chosen here for a release
is always named as a guess (:attr:`TorchIndex.guess`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pytest_cudastack.cuda.datafile import DataShape, check_data, shipped_json
from pytest_cudastack.cuda.versions import parse_cuda
from pytest_cudastack.errors import DataError

__all__ = ["DATA_FILE", "TorchIndex", "index_for", "load_indexes"]

DATA_FILE = "data/torch_indexes.json"


@dataclass(frozen=True)
class TorchIndex:
    """One index: ``tag`` (``cu129``), the CUDA ``major.minor`` its builds are for, its URL and source id."""

    tag: str
    cuda: tuple[int, int]
    url: str
    source: str

    def guess(self, release: str) -> str:
        """Why the index is a guess for ``release``: the data records the index, not its releases."""
        cuda = f"{self.cuda[0]}.{self.cuda[1]}"
        return f"{self.url} is PyTorch's index for CUDA {cuda}; that it carries torch {release} is a guess"


_SHAPE = DataShape("torch_indexes.schema.json", {"indexes": ("tag",)})


def validate_indexes(raw: Any, where: str = DATA_FILE) -> tuple[TorchIndex, ...]:
    """The indexes of a parsed data file, oldest CUDA first; DataError naming the row when one is malformed
    (the shape and the header rule: ``cuda/datafile.check_data``; here only what a schema cannot say)."""
    data = check_data(raw, where, _SHAPE)
    url = data["url"]  # its schema's pattern asks for {tag}
    out: list[TorchIndex] = []
    for row in data["indexes"]:
        parsed = parse_cuda(row["cuda"], error=DataError)
        tag = row["tag"]
        out.append(TorchIndex(tag, (parsed.major, parsed.minor or 0), url.format(tag=tag), str(row["source"])))
    return tuple(sorted(out, key=lambda x: x.cuda))


@functools.lru_cache(maxsize=1)
def load_indexes() -> tuple[TorchIndex, ...]:
    """The shipped index table (cached)."""
    return validate_indexes(shipped_json(DATA_FILE, "pytest_cudastack.model"))


def index_for(kind: str, bound: str, major: int) -> TorchIndex | None:
    """The index of torch builds that satisfy ``--cuda-max=bound`` (``kind="max"``: the newest at or below it)
    or ``--cuda-min`` (the oldest at or above it), on another CUDA major than ``major`` (the build's now)."""
    parsed = parse_cuda(bound)
    limit = (parsed.major, parsed.minor if parsed.minor is not None else (99 if kind == "max" else 0))
    fits = [i for i in load_indexes() if i.cuda[0] != major and (i.cuda <= limit if kind == "max" else i.cuda >= limit)]
    if not fits:
        return None
    return fits[-1] if kind == "max" else fits[0]
