"""Compiler tools a framework will run (cuda/toolchain.py, checks/toolchain.py, linker/toolversion.py).

Every fake tool is a shell script holding the version line a real tool embeds, with the executable bit, that
would create a marker file if anything ran it: each test ends by checking no marker exists.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_cudastack.checks.toolchain import (
    arch_tool_findings,
    framework_lookups,
    nothing_to_check,
    toolchain_findings,
)
from pytest_cudastack.cuda.gpucode import arch_first_cuda
from pytest_cudastack.cuda.toolchain import load_toolchain, max_ptx_isa, validate_toolchain
from pytest_cudastack.errors import DataError
from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.toolversion import ToolVersion, read_tool_version
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import site_packages, write_dist

DATA = Path(__file__).resolve().parent.parent / "pytest_cudastack" / "cuda" / "data" / "toolchain.json"
JAX_TOOLS = ("ptxas", "nvlink", "fatbinary")


def fake_tool(path: Path, version: str, marker: Path) -> Path:
    """A script stating ``version`` as CUDA tools do; running it would create ``marker``."""
    major, minor = version.split(".")[:2]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ntouch {marker}\necho 'Cuda compilation tools, release {major}.{minor}, V{version}'\n")
    path.chmod(0o755)
    return path


# the files each framework is recognised by (toolchain.json's detect rows): the code that runs the tool names it
JAXLIB_FILES = {"jaxlib/__init__.py": "", "jaxlib/xla_extension.so": b"\0FindCudaExecutable\0ptxas\0"}
TORCH_FILES = {"torch/__init__.py": "", "torch/utils/cpp_extension.py": "def _join_cuda_home(): return 'bin/nvcc'\n"}
TRITON_FILES = {"triton/__init__.py": "", "triton/backends/nvidia/compiler.py": "def get_ptxas(arch): ...\n"}


@pytest.fixture
def marker(tmp_path: Path):
    m = tmp_path / "RAN"
    yield m
    assert not m.exists(), "a fake tool was executed"


def _tools(version: str, marker: Path) -> dict[str, str]:
    line = f"Cuda compilation tools, release {version[:4]}, V{version}"
    return {t: f"#!/bin/sh\ntouch {marker}\necho '{line}'\n" for t in JAX_TOOLS}


def _site(tmp_path: Path, marker: Path, *, jax: bool = True, nvcc: str | None = "12.6.85") -> Path:
    site = site_packages(tmp_path / "venv")
    if jax:
        write_dist(site, "jaxlib", "0.4.35", JAXLIB_FILES)
        write_dist(site, "jax", "0.4.35", {"jax/__init__.py": ""})
    if nvcc is not None:
        files = {f"nvidia/cuda_nvcc/bin/{t}": text for t, text in _tools(nvcc, marker).items()}
        files["nvidia/cuda_nvcc/__init__.py"] = ""
        write_dist(site, "nvidia-cuda-nvcc-cu12", nvcc, files)
        for t in JAX_TOOLS:
            (site / "nvidia" / "cuda_nvcc" / "bin" / t).chmod(0o755)
    return site


def _old_bin(tmp_path: Path, marker: Path, version: str = "12.2.140") -> Path:
    for t in JAX_TOOLS:
        fake_tool(tmp_path / "old" / "bin" / t, version, marker)
    return tmp_path / "old"


def _findings(site: Path, env: dict[str, str], root: Path, cache: ElfCache | None = None):
    c = cache or ElfCache(enabled=False)
    inv = installed_wheels([str(site)], reader=c.read)
    return toolchain_findings(inv, env, c.tool_version, root=str(root))


def _errors(found):
    return [f for f in found if f.severity is not Severity.INFO]


# the version line ---------------------------------------------------------------------------------------
def test_version_read_from_a_script_never_run(tmp_path: Path, marker: Path) -> None:
    tool = fake_tool(tmp_path / "ptxas", "12.2.140", marker)
    assert read_tool_version(str(tool)) == ToolVersion(str(tool), "12.2", "12.2.140")


def test_version_line_split_across_read_chunks(tmp_path: Path) -> None:
    line = b"Cuda compilation tools, release 12.4, V12.4.131"
    data = b"\0" * ((1 << 20) - 20) + line + b"\0" * 100
    (tmp_path / "ptxas").write_bytes(data)
    assert read_tool_version(str(tmp_path / "ptxas")).version == "12.4.131"


def test_a_file_without_a_version_line_states_none(tmp_path: Path) -> None:
    (tmp_path / "ptxas").write_bytes(b"\x7fELF" + b"\0" * 5000)
    assert read_tool_version(str(tmp_path / "ptxas")) == ToolVersion(str(tmp_path / "ptxas"), None, None)


def test_a_wrapper_script_states_the_version_of_what_it_execs(tmp_path: Path, marker: Path) -> None:
    real = fake_tool(tmp_path / "cuda-13.0" / "bin" / "nvcc", "13.0.88", marker)
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    assert read_tool_version(str(wrapper)) == ToolVersion(str(wrapper), "13.0", "13.0.88")
    loop = tmp_path / "loop"
    loop.write_text(f'#!/bin/sh\nexec {loop} "$@"\n')  # one hop only: no recursion
    assert read_tool_version(str(loop)).version is None


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing"])
def test_unreadable_tool_is_an_elf_error_naming_it(tmp_path: Path, kind: str) -> None:
    from pytest_cudastack.errors import ElfError

    path = tmp_path / "ptxas"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    with pytest.raises(ElfError, match="ptxas"):
        read_tool_version(str(path))


def test_version_cached_in_the_elf_cache(tmp_path: Path, marker: Path) -> None:
    tool = fake_tool(tmp_path / "ptxas", "12.2.140", marker)
    cache = ElfCache(str(tmp_path / "cache"), enabled=True)
    assert cache.tool_version(str(tool)).version == "12.2.140"
    cache.flush()
    warm = ElfCache(str(tmp_path / "cache"), enabled=True)
    assert warm.tool_version(str(tool)).version == "12.2.140"
    assert (warm.hits, warm.misses) == (1, 0)
    fake_tool(tool, "12.6.85", marker)  # changed file: the entry's key no longer matches
    assert ElfCache(str(tmp_path / "cache"), enabled=True).tool_version(str(tool)).version == "12.6.85"


@pytest.mark.skipif(not os.path.isfile("/usr/local/cuda/bin/ptxas"), reason="needs a CUDA toolkit")
def test_real_toolkit_versions() -> None:
    import subprocess

    for tool in ("ptxas", "nvlink", "fatbinary", "nvcc"):
        path = f"/usr/local/cuda/bin/{tool}"
        got = read_tool_version(path)
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout  # oracle
        assert got.version is not None
        assert f"V{got.version}" in out
        assert f"release {got.release}," in out


# the PTX ISA a tool accepts ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("release", "isa"), [("12.2", "8.2"), ("12.6", "8.5"), ("12.8", "8.7"), ("13.0", "9.0"), ("0.9", None)]
)
def test_max_ptx_isa(release: str, isa: str | None) -> None:
    assert max_ptx_isa(release) == isa


# the lookups ------------------------------------------------------------------------------------------------
def test_jax_takes_the_wheel_before_an_old_ptxas_first_on_path(tmp_path: Path, marker: Path) -> None:
    site = _site(tmp_path, marker)
    old = _old_bin(tmp_path, marker)
    env = {"PATH": f"{old / 'bin'}:/usr/bin"}
    found = _findings(site, env, tmp_path / "root")
    assert _errors(found) == []  # XLA's preferred dir (jax's cuda_path: the wheel) comes before PATH
    info = [f for f in found if f.subject == "jaxlib 0.4.35"]
    assert info
    assert "ptxas 12.6.85" in info[0].message
    assert "nvidia/cuda_nvcc" in info[0].message


def test_jax_with_cuda_root_at_an_old_toolkit_fails_naming_it(tmp_path: Path, marker: Path) -> None:
    site = _site(tmp_path, marker)
    old = _old_bin(tmp_path, marker)
    env = {"PATH": "/usr/bin", "CUDA_ROOT": str(old)}
    (err,) = _errors(_findings(site, env, tmp_path / "root"))
    assert err.severity is Severity.ERROR
    assert err.subject == "jaxlib 0.4.35"
    assert err.check == "toolchain"
    assert "ptxas 12.2.140" in err.message
    assert str(old / "bin" / "ptxas") in err.message
    assert "Unsupported .version 8.5; current version is '8.2'" in err.message
    assert "nvidia-cuda-nvcc-cu12 12.6.85" in err.message
    assert "$CUDA_ROOT" in err.cause
    assert err.fix == "unset CUDA_ROOT"
    assert any("taken" in w for w in err.where)
    # nvlink and fatbinary from the same directory are in the same finding, not three
    assert [d.split(" (")[0] for d in err.details] == ["also nvlink 12.2.140", "also fatbinary 12.2.140"]


def test_clean_twin_cuda_root_at_a_matching_toolkit_is_silent(tmp_path: Path, marker: Path) -> None:
    site = _site(tmp_path, marker)
    new = _old_bin(tmp_path, marker, "12.6.85")
    assert _errors(_findings(site, {"PATH": "/usr/bin", "CUDA_ROOT": str(new)}, tmp_path / "root")) == []


def test_jax_without_the_wheel_has_nothing_to_compare(tmp_path: Path, marker: Path) -> None:
    site = _site(tmp_path, marker, nvcc=None)
    old = _old_bin(tmp_path, marker)
    assert _errors(_findings(site, {"PATH": str(old / "bin")}, tmp_path / "root")) == []


def test_xla_flags_data_dir_when_jax_has_no_path_of_its_own(tmp_path: Path, marker: Path) -> None:
    # the wheel is the stack's compiler, but installed elsewhere than jax imports it from: only XLA_FLAGS
    site = _site(tmp_path, marker, nvcc=None)
    other = _site(tmp_path / "other", marker, jax=False)
    old = _old_bin(tmp_path, marker)
    env = {"PATH": "/usr/bin", "XLA_FLAGS": f"--xla_gpu_cuda_data_dir={old}"}
    c = ElfCache(enabled=False)
    inv = installed_wheels([str(site), str(other)], reader=c.read)
    lookups = {lk.tool: lk for d, lk in framework_lookups(inv, env, c.tool_version, root=str(tmp_path / "r"))}
    # jax's cuda_path is the first site dir holding nvidia/cuda_nvcc: the other venv's (XLA_FLAGS then ignored)
    assert lookups["ptxas"].found is not None
    assert lookups["ptxas"].found.version == "12.6.85"


def test_old_ptxas_on_path_wins_when_jax_finds_no_wheel_dir(tmp_path: Path, marker: Path) -> None:
    # the nvcc wheel's files are gone (its RECORD still says 12.6): XLA goes on to PATH
    site = _site(tmp_path, marker)
    shutil.rmtree(site / "nvidia")
    old = _old_bin(tmp_path, marker)
    (err,) = _errors(_findings(site, {"PATH": f"{old / 'bin'}:/usr/bin"}, tmp_path / "root"))
    assert "via PATH" in err.message
    assert "PTX ISA 8.5" in err.message
    # removing them would leave XLA no ptxas at all (the wheel's files are gone): not a verified fix
    assert err.remedies[0].why.startswith("no safe automatic repair is known: ")


def test_xla_skips_a_too_old_or_excluded_ptxas(tmp_path: Path, marker: Path) -> None:
    site = _site(tmp_path, marker, nvcc=None)
    fake_tool(tmp_path / "a" / "ptxas", "11.4.48", marker)
    fake_tool(tmp_path / "b" / "ptxas", "12.3.103", marker)
    fake_tool(tmp_path / "c" / "ptxas", "12.4.131", marker)
    env = {"PATH": ":".join(str(tmp_path / d) for d in "abc")}
    c = ElfCache(enabled=False)
    inv = installed_wheels([str(site)], reader=c.read)
    lk = next(lk for d, lk in framework_lookups(inv, env, c.tool_version, root=str(tmp_path)) if lk.tool == "ptxas")
    assert [x.skipped for x in lk.candidates][:3] == ["older than 11.8.0", "version 12.3.103 is excluded", None]
    assert lk.found is not None
    assert lk.found.version == "12.4.131"


def test_torch_nvcc_of_another_major_first_on_path(tmp_path: Path, marker: Path) -> None:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "torch", "2.14.1+cu130", TORCH_FILES)
    old = fake_tool(tmp_path / "old" / "bin" / "nvcc", "12.2.140", marker)
    fake_tool(tmp_path / "root" / "usr" / "local" / "cuda" / "bin" / "nvcc", "13.0.88", marker)
    (warn,) = _errors(_findings(site, {"PATH": str(old.parent)}, tmp_path / "root"))
    assert warn.severity is Severity.WARNING
    assert warn.subject == "torch 2.14.1+cu130"
    assert "nvcc 12.2.140" in warn.message
    assert "CUDA 13" in warn.message
    assert warn.fix.startswith("remove or update")  # then torch takes /usr/local/cuda's 13.0: verified
    # clean twin: the CUDA 13 nvcc first
    env = {"PATH": f"{tmp_path / 'root/usr/local/cuda/bin'}:{old.parent}"}
    assert _errors(_findings(site, env, tmp_path / "root")) == []


def test_a_fix_that_leaves_no_tool_at_all_is_not_proposed(tmp_path: Path, marker: Path) -> None:
    """The old nvcc is the only one: removing it (or the PATH entry) leaves torch no nvcc at all, which the
    model counts as failing, so no fix is printed as verified."""
    site = site_packages(tmp_path / "venv")
    write_dist(site, "torch", "2.14.1+cu130", TORCH_FILES)
    old = fake_tool(tmp_path / "old" / "bin" / "nvcc", "12.2.140", marker)
    (warn,) = _errors(_findings(site, {"PATH": str(old.parent)}, tmp_path / "root"))
    assert "nvcc 12.2.140" in warn.message
    assert warn.remedies[0].why.startswith("no safe automatic repair is known: ")


def test_triton_lookup_env_then_bundled(tmp_path: Path, marker: Path) -> None:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "triton", "3.8.0", TRITON_FILES)
    fake_tool(site / "triton" / "backends" / "nvidia" / "bin" / "ptxas", "12.9.86", marker)
    mine = fake_tool(tmp_path / "mine" / "ptxas", "12.8.93", marker)
    c = ElfCache(enabled=False)
    inv = installed_wheels([str(site)], reader=c.read)
    for env, want in (({}, "12.9.86"), ({"TRITON_PTXAS_PATH": str(mine)}, "12.8.93")):
        lks = {lk.tool: lk for d, lk in framework_lookups(inv, env, c.tool_version)}
        assert lks["ptxas"].found is not None
        assert lks["ptxas"].found.version == want
    # a pointer to a missing file falls back to the bundled copy, as triton does
    lks = {lk.tool: lk for d, lk in framework_lookups(inv, {"TRITON_PTXAS_PATH": "/nope"}, c.tool_version)}
    assert lks["ptxas"].found is not None
    assert lks["ptxas"].found.version == "12.9.86"
    assert lks["ptxas-blackwell"].found is None  # this triton bundles none: nothing reported
    assert _errors(toolchain_findings(inv, {}, c.tool_version)) == []


def test_nothing_to_check_without_a_framework(tmp_path: Path) -> None:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "numpy", "2.0.0", {"numpy/__init__.py": ""})
    inv = installed_wheels([str(site)])
    reason = nothing_to_check(SimpleNamespace(inventory=inv))  # type: ignore[arg-type]
    assert reason is not None
    assert "jax" in reason
    assert "torch" in reason
    write_dist(site, "triton", "3.8.0", TRITON_FILES)
    assert nothing_to_check(SimpleNamespace(inventory=installed_wheels([str(site)]))) is None  # type: ignore[arg-type]


def test_toolchain_item_through_the_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, marker: Path
) -> None:
    site = _site(tmp_path, marker)
    old = _old_bin(tmp_path, marker)
    pytester.makepyfile("def test_ok(): pass")
    monkeypatch.setenv("CUDASTACK_NO_CACHE", "1")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("CUDA_ROOT", str(old))
    pytester.syspathinsert(site)
    args = ("-p", "pytest_cudastack.plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", "--cudastack")
    result = pytester.runpytest(*args, "-k", "toolchain")
    result.stdout.fnmatch_lines(
        [
            "*cudastack repair plan*",
            "*[[]by hand[]] unset CUDA_ROOT*",
            "*cudastack::toolchain*",
            "*Unsupported .version 8.5*",
            "*fix: see the cudastack repair plan above*",
        ]
    )
    result.assert_outcomes(failed=1, passed=1)
    monkeypatch.setenv("CUDA_ROOT", str(site / "nvidia" / "cuda_nvcc"))  # clean twin
    pytester.runpytest(*args, "-k", "toolchain").assert_outcomes(passed=2)


# the data file ----------------------------------------------------------------------------------------------
def test_shipped_data_loads() -> None:
    names = [f.name for f in load_toolchain()]
    assert names == ["jax", "triton", "torch", "cupy", "numba-cuda"]


def _broken(change):
    raw = json.loads(DATA.read_text())
    out = copy.deepcopy(raw)
    change(out)
    return out


def _row0(key: str, value: object) -> Any:
    """An edit setting *key* of the first framework row to *value*."""

    def edit(d: dict[str, Any]) -> None:
        d["frameworks"][0][key] = value

    return edit


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(
            lambda d: d.update(schema="x"),
            r"toolchain\.json: unsupported schema 'x' \(expected 'pytest-cudastack-toolchain'\)",
            id="schema",
        ),
        pytest.param(lambda d: d["frameworks"][0].update(source="nope"), "not listed", id="source"),
        pytest.param(lambda d: d["frameworks"][0].pop("rule"), r"frameworks\[0\]\.rule: missing", id="missing key"),
        pytest.param(
            lambda d: d["frameworks"][0].update(rule="guess"),
            r"frameworks\[0\]\.rule: expected one of 'ptx-isa'",
            id="rule",
        ),
        pytest.param(lambda d: d["frameworks"][0]["lookup"].append({"cwd": True}), "unknown lookup step", id="step"),
        pytest.param(
            lambda d: d["frameworks"][0]["lookup"][0]["first_dir_of"].append({"path": True}),
            "first_dir_of takes only",
            id="first_dir_of path",
        ),
        pytest.param(lambda d: d["frameworks"][0]["minimum"].update(ptxas="new"), "not a version", id="minimum"),
        pytest.param(lambda d: d["frameworks"][0]["minimum"].update(nvcc="12.0"), "map tools", id="minimum tool"),
        pytest.param(lambda d: d["frameworks"][0].update(tools=[]), "non-empty list", id="tools"),
        pytest.param(lambda d: d.update(frameworks=[1]), r"frameworks\[0\]: expected object", id="row type"),
        pytest.param(lambda d: d.update(frameworks=[]), "'frameworks' must be a non-empty list", id="no rows"),
        # the types are the schema's (check_data), before any row rule runs
        pytest.param(_row0("framework", 1), r"frameworks\[0\]\.framework: expected string", id="framework type"),
        pytest.param(_row0("framework", ""), "'framework' must be a non-empty string", id="empty framework"),
        pytest.param(_row0("emits", 1), r"frameworks\[0\]\.emits: expected string", id="emits type"),
        pytest.param(_row0("fix_env", ""), "'fix_env' must be a non-empty string", id="empty fix_env"),
        pytest.param(_row0("tools", [1]), r"frameworks\[0\]\.tools\[0\]: expected string", id="tool type"),
        pytest.param(_row0("tools", [""]), "'tools' must be a non-empty list of names", id="empty tool"),
        pytest.param(_row0("detect", "x"), r"frameworks\[0\]\.detect: expected array", id="detect type"),
        pytest.param(_row0("detect", []), "'detect' must name at least one file", id="no detect"),
        pytest.param(
            _row0("detect", [{"path": "../x.py", "contains": "ptxas", "source": "triton-knobs"}]),
            r"detect\[0\]: 'path' must be a pattern inside",
            id="detect path",
        ),
        pytest.param(
            _row0("detect", [{"path": "x.py", "contains": "", "source": "triton-knobs"}]),
            "'contains' must be a non-empty string",
            id="detect contains",
        ),
        pytest.param(
            _row0("detect", [{"path": "x.py", "contains": "ptxas", "source": "nope"}]),
            r"detect\[0\]: source 'nope' is not listed",
            id="detect source",
        ),
        pytest.param(_row0("lookup", []), "'lookup' must be a non-empty list of steps", id="no lookup"),
        pytest.param(_row0("lookup", [1]), r"frameworks\[0\]\.lookup\[0\]: expected object", id="step type"),
        pytest.param(_row0("minimum", []), r"frameworks\[0\]\.minimum: expected object", id="minimum type"),
        pytest.param(_row0("minimum", {"ptxas": 12}), r"minimum\.ptxas: expected string", id="minimum value"),
        pytest.param(_row0("excluded", {"ptxas": "12.0"}), r"excluded\.ptxas: expected array", id="excluded value"),
        pytest.param(_row0("bogus", 1), r"frameworks\[0\]\.bogus: not allowed here", id="row key"),
    ],
)
def test_broken_data_file_names_the_row(change, match: str) -> None:
    with pytest.raises(DataError, match=match):
        validate_toolchain(_broken(change), "toolchain.json")


# a ptxas too old for a target GPU arch ------------------------------------------------------------------
def _triton_site(tmp_path: Path, marker: Path, bundled: str = "12.9.86", blackwell: str | None = None) -> Path:
    site = site_packages(tmp_path / "venv")
    write_dist(site, "triton", "3.8.0", TRITON_FILES)
    fake_tool(site / "triton" / "backends" / "nvidia" / "bin" / "ptxas", bundled, marker)
    if blackwell is not None:
        fake_tool(site / "triton" / "backends" / "nvidia" / "bin" / "ptxas-blackwell", blackwell, marker)
    return site


def _arch_findings(site: Path, env: dict[str, str], archs: tuple[str, ...], root: Path | None = None):
    c = ElfCache(enabled=False)
    inv = installed_wheels([str(site)], reader=c.read)
    return arch_tool_findings(inv, env, c.tool_version, archs, root=str(root or ""))


def test_arch_first_cuda_from_the_ptx_release_history() -> None:
    assert [str(arch_first_cuda(a)) for a in ("sm_90", "sm_90a", "sm_100", "sm_120", "sm_103", "sm_110")] == [
        "11.8",
        "12.0",
        "12.7",
        "12.8",
        "12.9",
        "13.0",
    ]
    assert arch_first_cuda("sm_35") is None  # not in the data: nothing said


def test_triton_ptxas_too_old_for_the_target_arch_is_an_error_with_a_verified_fix(tmp_path: Path, marker: Path) -> None:
    # ptxas 12.2 first (TRITON_PTXAS_PATH) on an sm_90 + sm_100 machine: sm_100 needs CUDA 12.7's tools
    site = _triton_site(tmp_path, marker, blackwell="12.9.86")
    old = fake_tool(tmp_path / "old" / "ptxas", "12.2.140", marker)
    env = {"TRITON_PTXAS_PATH": str(old), "TRITON_PTXAS_BLACKWELL_PATH": str(old)}
    (f,) = _arch_findings(site, env, ("sm_90", "sm_100"))
    assert f.severity is Severity.ERROR
    assert f.subject == "triton 3.8.0"
    assert "ptxas-blackwell 12.2.140" in f.message
    assert "sm_100 needs the tools of CUDA 12.7" in f.message
    assert "sm_90" not in f.message.split("compile for ")[1].split(";")[0]  # 12.2 knows sm_90
    assert "Value 'sm_100' is not defined for option 'gpu-name'" in f.message
    assert f.fix == "unset TRITON_PTXAS_BLACKWELL_PATH"  # the bundled ptxas-blackwell 12.9 then takes it
    assert str(old) in f.cause
    # the clean twin: the bundled tools, and no target arch newer than they know
    assert _arch_findings(site, {}, ("sm_90", "sm_100")) == ()
    assert _arch_findings(site, env, ("sm_90",)) == ()
    assert _arch_findings(site, env, ()) == ()


def test_triton_without_a_newer_ptxas_gets_no_unverified_fix(tmp_path: Path, marker: Path) -> None:
    site = _triton_site(tmp_path, marker, bundled="12.4.131", blackwell="12.4.131")
    (f,) = _arch_findings(site, {}, ("sm_120",))
    assert "ptxas-blackwell 12.4.131" in f.message
    assert "CUDA 12.8" in f.message
    assert f.fix == ""  # removing the bundled one leaves triton none to run: nothing verified to print


def test_jax_ptxas_too_old_for_the_arch_is_a_warning(tmp_path: Path, marker: Path) -> None:
    # the nvcc 12.6 wheel's ptxas is taken first: it predates sm_100 (12.7) and sm_120 (12.8)
    site = _site(tmp_path, marker, nvcc="12.6.85")
    found = _arch_findings(site, {}, ("sm_100", "sm_120"), tmp_path)
    (f,) = [x for x in found if x.subject.startswith("jaxlib")]
    assert f.severity is Severity.WARNING
    assert "ptxas 12.6.85" in f.message
    assert "compile for sm_100, sm_120; sm_100 needs the tools of CUDA 12.7" in f.message
    assert len(f.details) == 1
    assert f.details[0].startswith("also sm_120: needs CUDA 12.8 (ptxas 12.6.85")
    assert f.fix == ""  # no other ptxas in the model: removing the wheel's would leave XLA none
    clean = _site(tmp_path / "twin", marker, nvcc="12.8.93")  # clean twin: the 12.8 wheel knows both
    assert [x for x in _arch_findings(clean, {}, ("sm_100", "sm_120"), tmp_path)] == []


GPU_CODE = Path(__file__).resolve().parent.parent / "pytest_cudastack" / "cuda" / "data" / "gpu_code.json"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(lambda d: d.pop("arch_cuda"), r"gpu_code\.json: arch_cuda: missing", id="missing table"),
        pytest.param(lambda d: d["arch_cuda"][0].update(source="nope"), "not listed", id="source"),
        pytest.param(lambda d: d["arch_cuda"][0].update(arch="sm_9"), r"arch_cuda\[0\].*invalid GPU arch", id="arch"),
        pytest.param(lambda d: d["arch_cuda"][0].update(arch="compute_90"), "sm_XX names", id="not sm"),
        pytest.param(lambda d: d["arch_cuda"][0].update(cuda="twelve"), r"arch_cuda\[0\]: 'cuda'", id="cuda"),
        pytest.param(
            lambda d: d["arch_cuda"].append(dict(d["arch_cuda"][0])), r"arch_cuda\[34\]: duplicate row", id="duplicate"
        ),
        pytest.param(lambda d: d["arch_cuda"][0].pop("cuda"), r"arch_cuda\[0\]\.cuda: missing", id="missing key"),
    ],
)
def test_broken_arch_cuda_rows_name_the_row(change, match: str) -> None:
    from pytest_cudastack.cuda.gpucode import validate_gpu_code

    raw = json.loads(GPU_CODE.read_text())
    change(raw)
    with pytest.raises(DataError, match=match):
        validate_gpu_code(raw, "gpu_code.json")


def test_arch_tool_finding_through_cudastack_check(tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch):
    # the toolchain item sees the declared target archs: an old ptxas-blackwell fails sm_100, not sm_90
    import contextlib
    import io

    from pytest_cudastack.cli import main

    site = _triton_site(tmp_path, marker, blackwell="12.9.86")
    old = fake_tool(tmp_path / "old" / "ptxas", "12.2.140", marker)
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(old))
    monkeypatch.chdir(tmp_path)
    for arch, want in (("sm_100", 1), ("sm_90", 0)):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            main(
                [
                    "check",
                    "--json",
                    "--cudastack",
                    "--cuda-driver=580.65.06",
                    f"--cuda-arch={arch}",
                    "--site",
                    str(site),
                ]
            )
        errors = [f for f in json.loads(buf.getvalue())["items"]["toolchain"] if f["severity"] == "error"]
        assert len(errors) == want
        if want:
            assert "sm_100" in errors[0]["message"]
            assert errors[0]["fix"] == "unset TRITON_PTXAS_BLACKWELL_PATH"
