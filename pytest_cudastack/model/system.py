"""Where pip must not act: an externally managed environment (PEP 668) and an OS package's files.

pip refuses to install into or uninstall from an environment whose interpreter's stdlib holds
``EXTERNALLY-MANAGED`` (pip's ``check_externally_managed``, skipped under a venv; see
:func:`~pytest_cudastack.wheels.sitepaths.externally_managed`), and a distribution dpkg owns
(:attr:`~pytest_cudastack.wheels.inventory.Distribution.os_package`) is put back by its package manager, not
by pip. :func:`by_hand_instead` gives, for one pip command of a repair plan, the step by hand that replaces
it there (a venv, or the distro's package), or None where pip may run it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pytest_cudastack.findings import Manual, Pip
from pytest_cudastack.wheels.dpkg import reinstall_command
from pytest_cudastack.wheels.inventory import Distribution
from pytest_cudastack.wheels.sitepaths import externally_managed

__all__ = ["VENV", "by_hand_instead", "externally_managed_env"]

VENV = ".venv"  # the virtual environment a plan proposes where pip may not touch the system's


def externally_managed_env(dists: Sequence[Distribution]) -> str | None:
    """The PEP 668 marker of the environment these distributions live in (the first of their site
    directories that has one), else None."""
    for loc in dict.fromkeys(d.location for d in dists):
        marker = externally_managed(loc)
        if marker is not None:
            return marker
    return None


def _names(pip: Pip) -> list[str]:
    out: list[str] = []
    for spec in pip.specs:
        try:
            out.append(canonicalize_name(Requirement(spec).name))
        except ValueError:  # InvalidRequirement, or a version over the digit limit
            out.append(canonicalize_name(spec))
    return out


def by_hand_instead(pip: Pip, dists: Sequence[Distribution], marker: str | None) -> Manual | None:
    """The step by hand that replaces ``pip`` in the environment of ``dists`` (``marker``: its PEP 668 file,
    :func:`externally_managed_env`), None when pip may run it there.

    A command naming an OS package's distribution becomes that package's reinstall (``apt-get install
    --reinstall PKG``); in an externally managed environment an install becomes the same install in a
    venv that sees the system's packages, or the distro's package, and an uninstall the package
    manager's removal (pip refuses both there)."""
    by_key = {d.key: d for d in dists}
    owned = sorted({p for n in _names(pip) if (d := by_key.get(n)) is not None and (p := d.os_package)})
    if owned:
        return Manual(
            tuple(reinstall_command(p.partition(":")[0]) for p in owned),
            why=f"the files are dpkg's {', '.join(owned)}: its package manager puts them back, pip must not "
            f"({pip.render()} would write over a system package's files)",
        )
    if marker is None:
        return None
    names = ", ".join(pip.specs)
    why = (
        f"the environment is externally managed (PEP 668: {marker}); pip refuses {pip.verb} there "
        "without --break-system-packages"
    )
    if pip.verb == "install":
        inner = shlex.join((f"{VENV}/bin/python", "-m", "pip", "install", *pip.flags, *_index(pip), *pip.specs))
        return Manual(
            (
                f"python3 -m venv --system-site-packages {VENV} && {inner} (then run your code with {VENV}/bin/python)",
                f"or install your distribution's package of {names} with its package manager",
            ),
            why=why,
        )
    return Manual(
        (
            f"remove {names} with the package manager that installed it (e.g. apt-get remove), or move your code "
            f"to a venv (python3 -m venv {VENV}) where pip manages what it installs",
        ),
        why=why,
    )


def _index(pip: Pip) -> tuple[str, ...]:
    return ("--index-url", pip.index_url) if pip.index_url else ()
