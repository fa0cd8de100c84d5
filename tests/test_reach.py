"""Severity from reachability (model/reach.py, checks/closure.py, checks/symbols.py): a load failure of an
extension module is an ERROR only when an import that will happen loads the module (its distribution's
top-level import, or an import of the project under test: the rootdir's files, ``cudastack_imports``);
otherwise a WARNING naming the import that would fail, with the finding's remedies.

The stand-in is cupy-like: ``pkgx/__init__.py`` imports ``pkgx._core`` (an extension that resolves) but not
``pkgx.fft``, whose ``__init__.py`` imports the extension ``pkgx.fft._fft``, which needs ``libfftx.so.1``
(not installed: the closure variant) or a symbol the installed ``libfftx.so.1`` lacks (the symbols
variant). Each ERROR case has its clean (WARNING) twin."""

from __future__ import annotations

import importlib.machinery
import subprocess
import textwrap
from pathlib import Path

import pytest

from pytest_cudastack.cuda.driver import DriverInfo
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.model.reach import MAX_PROJECT_FILES, project_imports, top_level_names
from pytest_cudastack.settings import ENV, Settings
from pytest_cudastack.stack import Stack
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.elfbuild import CC
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

pytest_plugins = ["pytester"]
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
FFT = f"pkgx/fft/_fft{SUFFIX}"


def _cc(out: Path, source: str, *args: str) -> bytes:
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".c")
    src.write_text(source)
    assert CC is not None
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True, capture_output=True)
    return out.read_bytes()


def _site(tmp_path: Path, *, init: str = "from pkgx import _core\n", symbols: bool = False) -> Path:
    """pkgx in a venv under ``tmp_path`` (the rootdir's scan skips it). ``symbols``: libfftx.so.1 is installed
    but lacks ``fftx_plan``, which ``_fft`` calls (the symbols variant); else libfftx.so.1 is missing."""
    site = site_packages(tmp_path / "venv")
    files: dict[str, bytes | str] = {
        "pkgx/__init__.py": init,
        f"pkgx/_core{SUFFIX}": compile_so(None, pyinit="_core"),
        "pkgx/fft/__init__.py": "from pkgx.fft import _fft\n",
    }
    if symbols:
        build = tmp_path / "build"
        new = _cc(build / "new" / "libfftx.so.1", "int fftx_plan(void) { return 1; }\n", "-Wl,-soname,libfftx.so.1")
        del new
        files["pkgx/lib/libfftx.so.1"] = _cc(
            build / "old" / "libfftx.so.1", "int fftx_other(void) { return 1; }\n", "-Wl,-soname,libfftx.so.1"
        )
        files[FFT] = _cc(
            build / "fft.so",
            "int fftx_plan(void);\nvoid *PyInit__fft(void) { return (void *)(long)fftx_plan(); }\n",
            str(build / "new" / "libfftx.so.1"),
            "-Wl,-rpath,$ORIGIN/../lib",
        )
    else:
        files[FFT] = compile_so(None, pyinit="_fft", needed=["libfftx.so.1"])
    write_dist(site, "pkgx", "1.0", files)
    return site


def _findings(root: Path, site: Path, check: str = "closure", **settings: object) -> list[Finding]:
    driver = DriverInfo("declared", "580.65.06", "13.0", archs=("sm_90",), arch_source="declared")
    stack = Stack(
        Settings.from_values(cudastack=True, **settings),
        driver_info=driver,
        rootdir=str(root),
        site_paths=(str(site),),
        cache=None,
    )
    return [f for f in stack.findings(check) if f.severity is not Severity.INFO and "libfftx" in f.render()]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDASTACK_IMPORTS", raising=False)
    monkeypatch.delenv("CUDASTACK_IMPORTS_SCAN", raising=False)


def _project(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


# ------------------------------------------------------------------------------------------- closure


@needs_cc
def test_unreached_module_is_a_warning_naming_the_import(tmp_path: Path):
    found = _findings(tmp_path, _site(tmp_path))
    assert [f.severity for f in found] == [Severity.WARNING]
    f = found[0]
    assert f.message.startswith("`import pkgx.fft` will fail: libfftx.so.1 is not found"), f.message
    assert "`import pkgx` (pkgx 1.0's top-level import) does not" in f.cause
    assert f.remedies, "the finding keeps its remedies"
    assert f.facts.sonames == ("libfftx.so.1",)


@needs_cc
def test_project_import_makes_it_an_error_naming_file_and_line(tmp_path: Path):
    _project(tmp_path, {"src/train.py": "import os\n\n\nimport pkgx.fft\n"})
    found = _findings(tmp_path, _site(tmp_path))
    assert [f.severity for f in found] == [Severity.ERROR]
    assert found[0].message.startswith("libfftx.so.1 is not found")
    assert "reached by `import pkgx.fft` (src/train.py:4)" in found[0].details


@needs_cc
def test_import_inside_a_test_function_counts(tmp_path: Path):
    _project(
        tmp_path,
        {
            "tests/test_fft.py": """\
                def test_fft():
                    from pkgx.fft import _fft
                    assert _fft
                """
        },
    )
    found = _findings(tmp_path, _site(tmp_path))
    assert [f.severity for f in found] == [Severity.ERROR]
    assert "reached by `import pkgx.fft` (tests/test_fft.py:2)" in found[0].details


@needs_cc
def test_relative_import_of_the_project_is_resolved(tmp_path: Path):
    """``from . import x`` in the project's package names the project's module, not pkgx: still a WARNING;
    ``from .vendor import y`` is the project's own too."""
    _project(tmp_path, {"app/__init__.py": "from . import fft\n", "app/fft.py": "import numpy\n"})
    imports = project_imports(str(tmp_path))
    names = {pi.name for pi in imports.imports}
    assert {"app", "app.fft", "numpy"} <= names
    assert "fft" not in names
    assert [f.severity for f in _findings(tmp_path, _site(tmp_path))] == [Severity.WARNING]


@needs_cc
def test_scan_off_with_the_project_import_present_is_a_warning(tmp_path: Path):
    _project(tmp_path, {"src/train.py": "import pkgx.fft\n"})
    found = _findings(tmp_path, _site(tmp_path), cudastack_imports_scan="false")
    assert [f.severity for f in found] == [Severity.WARNING]
    assert "cudastack_imports_scan is false" in found[0].cause


@needs_cc
def test_ini_import_with_scan_off_is_an_error(tmp_path: Path):
    found = _findings(tmp_path, _site(tmp_path), cudastack_imports=["pkgx.fft"], cudastack_imports_scan="false")
    assert [f.severity for f in found] == [Severity.ERROR]
    assert "reached by `import pkgx.fft` (--cudastack-imports)" in found[0].details


@needs_cc
def test_ini_import_of_another_module_stays_a_warning(tmp_path: Path):
    found = _findings(tmp_path, _site(tmp_path), cudastack_imports=["pkgx"], cudastack_imports_scan="false")
    assert [f.severity for f in found] == [Severity.WARNING]


@needs_cc
def test_package_that_imports_it_at_top_level_is_an_error(tmp_path: Path):
    site = _site(tmp_path, init="from pkgx import _core\nimport pkgx.fft\n")
    found = _findings(tmp_path, site, cudastack_imports_scan="false")
    assert [f.severity for f in found] == [Severity.ERROR]
    assert "reached by `import pkgx` (the top-level import of pkgx 1.0)" in found[0].details


@needs_cc
def test_project_import_of_another_package_that_imports_it_is_an_error(tmp_path: Path):
    """The model follows a project import through other installed packages: ``import wrap`` runs wrap's
    ``import pkgx.fft``; the clean twin is the project without that import."""
    site = _site(tmp_path)
    write_dist(site, "wrap", "0.1", {"wrap/__init__.py": "import pkgx.fft\n"})
    assert [f.severity for f in _findings(tmp_path, site)] == [Severity.WARNING]
    _project(tmp_path, {"tests/test_w.py": "import json\nimport wrap\n"})
    found = _findings(tmp_path, site)
    assert [f.severity for f in found] == [Severity.ERROR]
    assert "reached by `import wrap` (tests/test_w.py:2)" in found[0].details


@needs_cc
def test_project_importing_the_package_alone_stays_a_warning(tmp_path: Path):
    _project(tmp_path, {"src/train.py": "import pkgx\nfrom pkgx import _core\n"})
    assert [f.severity for f in _findings(tmp_path, _site(tmp_path))] == [Severity.WARNING]


@needs_cc
def test_project_files_in_a_venv_or_hidden_dir_are_not_read(tmp_path: Path):
    _project(
        tmp_path,
        {
            ".hidden/x.py": "import pkgx.fft\n",
            "node_modules/x.py": "import pkgx.fft\n",
            "myenv/pyvenv.cfg": "home = /usr/bin\n",
            "myenv/x.py": "import pkgx.fft\n",
        },
    )
    assert [f.severity for f in _findings(tmp_path, _site(tmp_path))] == [Severity.WARNING]


# ------------------------------------------------------------------------------------------- symbols


@needs_cc
def test_symbols_unreached_is_a_warning(tmp_path: Path):
    found = _findings(tmp_path, _site(tmp_path, symbols=True), "symbols")
    assert [f.severity for f in found] == [Severity.WARNING], [f.render() for f in found]
    assert found[0].message.startswith("`import pkgx.fft` will fail: 1 symbol(s) needed by pkgx/fft/_fft")


@needs_cc
def test_symbols_reached_by_the_project_is_an_error(tmp_path: Path):
    _project(tmp_path, {"src/train.py": "\nimport pkgx.fft\n"})
    found = _findings(tmp_path, _site(tmp_path, symbols=True), "symbols")
    assert [f.severity for f in found] == [Severity.ERROR]
    assert "reached by `import pkgx.fft` (src/train.py:2)" in found[0].details


# ------------------------------------------------------------------------------------------- the scan


def test_project_imports_first_line_cap_and_options(tmp_path: Path):
    _project(
        tmp_path,
        {
            "a.py": "import json\n\ndef f():\n    import cupy.fft\n",
            "b.py": "import cupy.fft\nfrom cupyx.scipy import linalg\n",
        },
    )
    found = project_imports(str(tmp_path), ("jax",), "ini")
    where = {pi.name: pi.where for pi in found.imports}
    assert where["cupy.fft"] == "a.py:4"
    assert where["cupyx.scipy.linalg"] == "b.py:2"
    assert where["jax"] == "ini"
    assert (found.files, found.scanned, found.truncated) == (2, True, False)
    capped = project_imports(str(tmp_path), limit=1)
    assert (capped.files, capped.truncated) == (1, True)
    assert "cupyx.scipy" not in {pi.name for pi in capped.imports}  # a.py first: sorted, deterministic
    off = project_imports(str(tmp_path), ("jax",), scan=False)
    assert [pi.name for pi in off.imports] == ["jax"]
    assert not off.scanned
    assert MAX_PROJECT_FILES == 5000


@needs_cc
def test_top_level_names_from_record(tmp_path: Path):
    site = _site(tmp_path)
    write_dist(site, "multi", "1.0", {"multi_a/__init__.py": "", "multi_b.py": "", "__editable__x.py": ""})
    inv = installed_wheels([str(site)])
    assert top_level_names(inv.get("pkgx")) == ("pkgx",)  # type: ignore[arg-type]
    assert top_level_names(inv.get("multi")) == ("multi_a", "multi_b")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"cudastack_imports": "cupy.fft, jax  torch.nn"}, ("cupy.fft", "jax", "torch.nn"), id="split"),
        pytest.param({"cudastack_imports": ["a", "a,b"]}, ("a", "b"), id="list, deduplicated"),
    ],
)
def test_imports_option_parses(values: dict[str, object], expected: tuple[str, ...]):
    assert Settings.from_values(**values).cudastack_imports == expected


def test_imports_option_rejects_a_bad_name_and_scan_reads_false():
    from pytest_cudastack.errors import OptionError

    with pytest.raises(OptionError, match="invalid module name"):
        Settings.from_values(cudastack_imports="cupy..fft")
    assert Settings().cudastack_imports_scan is True
    assert Settings.from_values(cudastack_imports_scan="false").cudastack_imports_scan is False
    from pytest_cudastack.settings import resolve

    assert resolve(ini={"cudastack_imports_scan": False}).cudastack_imports_scan is False  # a TOML false
    assert resolve(env={"CUDASTACK_IMPORTS": "a.b c", "CUDASTACK_IMPORTS_SCAN": "0"}).cudastack_imports == ("a.b", "c")
    assert resolve(env={"CUDASTACK_IMPORTS_SCAN": "0"}).cudastack_imports_scan is False


# ------------------------------------------------------------------------------------------- the plugin

DRIVER_HOOK = """
from pytest_cudastack.cuda.driver import DriverInfo

def pytest_cudastack_driver(config):
    return DriverInfo("probed", "580.65.06", "13.0")
"""


@pytest.fixture
def pt(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """pytester with pkgx installed in ``site/`` under its rootdir (a site directory: the scan skips it)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cudastack-cache"))
    site = _site(pytester.path / "x")
    pytester.syspathinsert(site)
    pytester.makeconftest(DRIVER_HOOK)
    pytester.makepyfile("def test_x(): pass")
    return pytester


def _run(pt: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pt.runpytest("-p", "pytest_cudastack.plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


@needs_cc
def test_plugin_unreached_passes_with_the_warning(pt: pytest.Pytester):
    result = _run(pt, "--cudastack", "-rA")
    assert "FAILED cudastack::closure" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*`import pkgx.fft` will fail: libfftx.so.1 is not found*"])


@needs_cc
def test_plugin_ini_import_with_scan_off_fails(pt: pytest.Pytester):
    pt.makeini("[pytest]\ncudastack_imports = pkgx.fft\ncudastack_imports_scan = false\n")
    result = _run(pt, "--cudastack")
    result.stdout.fnmatch_lines(["*FAILED cudastack::closure*"])
    result.stdout.fnmatch_lines(["*reached by `import pkgx.fft` (--cudastack-imports (from ini))*"])


@needs_cc
def test_plugin_project_file_import_fails_naming_its_line(pt: pytest.Pytester):
    (pt.path / "src").mkdir()
    (pt.path / "src" / "train.py").write_text("import pkgx.fft\n")
    result = _run(pt, "--cudastack")
    result.stdout.fnmatch_lines(["*FAILED cudastack::closure*"])
    result.stdout.fnmatch_lines(["*reached by `import pkgx.fft` (src/train.py:1)*"])


@needs_cc
def test_plugin_project_file_import_with_scan_off_passes(pt: pytest.Pytester):
    (pt.path / "src").mkdir()
    (pt.path / "src" / "train.py").write_text("import pkgx.fft\n")
    pt.makeini("[pytest]\ncudastack_imports_scan = false\n")
    result = _run(pt, "--cudastack")
    assert "FAILED cudastack::closure" not in result.stdout.str()


# ------------------------------------------------------------------------------------------- run-time loads


def _cudnn_site(tmp_path: Path, init: str | None) -> Path:
    """A torch-like package whose extension links libcudnn.so.9, which opens libcudnn_ops.so.9 at run time
    (the dlopen table's fatal row); libcudnn_ops.so.9 is not installed. ``init``: the package's
    ``__init__.py`` (None: none, a namespace package that loads nothing)."""
    site = site_packages(tmp_path / "venv")
    files: dict[str, bytes | str] = {
        f"torchish/_C{SUFFIX}": compile_so(
            None, pyinit="_C", needed=["libcudnn.so.9"], rpath="$ORIGIN/../nvidia/cudnn/lib"
        )
    }
    if init is not None:
        files["torchish/__init__.py"] = init
    write_dist(site, "torchish", "1.0", files)
    cudnn = {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", rpath="$ORIGIN")}
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43", cudnn)
    return site


def _dlopen(tmp_path: Path, site: Path) -> list[Finding]:
    driver = DriverInfo("declared", "580.65.06", "13.0", archs=("sm_90",), arch_source="declared")
    stack = Stack(Settings(cudastack=True), driver_info=driver, rootdir=str(tmp_path), site_paths=(str(site),))
    return [f for f in stack.findings("dlopen") if f.subject == "libcudnn_ops.so.9"]


@needs_cc
def test_run_time_load_of_a_reached_caller_is_an_error(tmp_path: Path):
    found = _dlopen(tmp_path, _cudnn_site(tmp_path, "from torchish import _C\n"))
    assert [f.severity for f in found] == [Severity.ERROR]
    assert "reached by `import torchish` (the top-level import of torchish 1.0)" in found[0].details


@needs_cc
def test_run_time_load_of_an_unreached_caller_is_a_warning(tmp_path: Path):
    found = _dlopen(tmp_path, _cudnn_site(tmp_path, ""))
    assert [f.severity for f in found] == [Severity.WARNING]
    assert found[0].message.startswith("after `import torchish._C`: libcudnn_ops.so.9 is not found")
