"""The package's shape: floors (import-linter's layers contract in pyproject.toml), no private name taken from
another module, and imports at module top except the few lazy ones that say why."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "pytest_cudastack"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_floors_hold() -> None:
    # The contract lives in pyproject.toml ([tool.importlinter]); lint-imports sees imports inside functions and
    # under TYPE_CHECKING too. Run in a child so grimp's cache and logging stay out of this process.
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def _private_uses(path: Path) -> list[str]:
    """`from pytest_cudastack.x import _name` and `module._name` where `module` is one of ours."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own_modules: set[str] = set()  # local names bound to a pytest_cudastack module
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pytest_cudastack"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{path.name}:{node.lineno}: from {node.module} import {alias.name}")
                if alias.name[:1].islower():  # `from pytest_cudastack.linker import elf` binds a module
                    own_modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pytest_cudastack"):
                    own_modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in own_modules
        ):
            out.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return out


@pytest.mark.parametrize(
    "path",
    [*_modules(), *sorted((REPO / "tests" / "helpers").glob("*.py"))],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_no_private_name_from_another_module(path: Path) -> None:
    assert _private_uses(path) == []


def test_private_use_detector_sees_both_forms(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from pytest_cudastack.cuda.compat import _beyond_data, load_compat\n"
        "from pytest_cudastack.linker import elf\n"
        "elf._read_elf_fast('x')\nload_compat()\n",
        encoding="utf-8",
    )
    assert len(_private_uses(src)) == 2


def _function_imports(path: Path) -> list[str]:
    """Imports inside functions whose line (or the line above) does not say why with a `# lazy:` comment."""
    lines = path.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(lines))
    out: list[str] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import | ast.ImportFrom):
                # the reason stands on the import's line, or above the run of imports it belongs to
                first = node.lineno - 1
                while first > 0 and lines[first - 1].strip().startswith(("import ", "from ")):
                    first -= 1
                said = lines[max(first - 2, 0) : node.end_lineno or node.lineno]
                if not any("# lazy:" in line for line in said):
                    out.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_at_module_top_or_say_why(path: Path) -> None:
    assert _function_imports(path) == []


def test_no_import_module_of_our_own_package() -> None:
    """importlib.import_module("pytest_cudastack...") hides a dependency from mypy and from the floors."""
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("pytest_cudastack")
            ):
                pytest.fail(f"{path.relative_to(REPO)}:{node.lineno}: import_module({node.args[0].value!r})")


_CYCLES = """
import json, grimp
g = grimp.build_graph("pytest_cudastack", cache_dir=None)
index, low, stack, on, out = {}, {}, [], set(), []
def visit(v):
    index[v] = low[v] = len(index); stack.append(v); on.add(v)
    for w in g.find_modules_directly_imported_by(v):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            out.append(sorted(comp))
for m in sorted(g.modules):
    if m not in index:
        visit(m)
print(json.dumps(out))
"""


def test_no_import_circle_anywhere() -> None:
    # Tarjan's strongly connected components over grimp's graph, which counts imports inside functions and under
    # TYPE_CHECKING: a circle inside one floor (closure -> process -> dlopen -> closure) is as bad as one across.
    proc = subprocess.run([sys.executable, "-c", _CYCLES], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
