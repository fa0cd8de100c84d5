"""The README's set-up section: its commands pasted into one terminal, one after the other, as a new user does."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"

# Stand-ins for the tools the commands run: each records the directory it ran in, so the test sees where
# every step of the pasted commands happened without creating a venv or installing anything.
_TOOL = '#!/bin/sh\necho "$(basename "$0") $* @ $PWD" >> "$SETUP_LOG"\n'
_PYTHON = _TOOL + 'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && : > "$3/bin/activate"; fi\n'


def setup_commands() -> list[str]:
    """The shell blocks of the README's "Set up" section."""
    section = README.read_text().split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def test_setup_is_two_commands() -> None:
    commands = setup_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)


def test_setup_commands_pasted_one_after_the_other(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", _PYTHON), ("pip", _TOOL), ("pytest", _TOOL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    checkout = tmp_path / "checkout"
    (checkout / "example_project").mkdir(parents=True)
    (checkout / "example_project" / "build.sh").write_text(_TOOL)
    (checkout / "example_project" / "build.sh").chmod(0o755)
    log = tmp_path / "log"
    script = "set -e\n" + "\n".join(setup_commands()) + "\n"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SETUP_LOG": str(log), "HOME": str(tmp_path)}
    subprocess.run(["bash", "-c", script], cwd=checkout, env=env, check=True)
    ran = [line.rsplit(" @ ", 1) for line in log.read_text().splitlines()]
    example = str(checkout / "example_project")
    assert [where for what, where in ran if what.startswith(("build.sh", "pytest --cuda-driver"))] == [example] * 2
    # the second command installs the test extras and runs the suite from the checkout, not the example
    assert [where for what, where in ran if what.startswith("pip install -e .[test]")] == [str(checkout)]
    assert [where for what, where in ran if what.startswith("pytest -n 2")] == [str(checkout)]
