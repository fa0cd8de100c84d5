"""``python -m pytest_cudastack.cli``: the ``cudastack`` command without its console script."""

from __future__ import annotations

import sys

from pytest_cudastack.cli import main

sys.exit(main())
