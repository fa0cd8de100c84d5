"""The healthy matrix (issue 33, deliverable 3): the most downloaded CUDA packages on PyPI, each installed as its
documentation says (tests/matrix.toml, built by .ci/build-matrix under $CUDASTACK_MATRIX, default
/opt/cudastack-matrix), are the real tier's oracle for false alarms.

For each environment, in this order: it is proven healthy by its own means (tests/helpers/matrix.py: its health
code in a child of its interpreter, ``ldd`` of every library the process mapped, ``pip check`` / ``uv pip check``);
then the whole check run (what ``pytest --cudastack`` runs) must give no ERROR and no untrue WARNING (a warning is
judged by tests/helpers/realenv.py's rule: the import it names must really fail on the library it names), on
the host as it is and with the declared driver and arch of a GPU the build supports; and ``cudastack check`` must
exit 0 there, both ways. A test skips when its environment is absent.

With $CUDASTACK_MATRIX_REPORT set to a directory, each environment's proof and findings are written there as
JSON (``<name>.json``), for the issue's closing note.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from tests.helpers.matrix import MatrixEnv, Proof, load, matrix_root, not_installable, prove
from tests.helpers.realenv import Env, child, untrue_warning

pytestmark = [pytest.mark.real]

_ENVS: list[MatrixEnv] = load() if sys.version_info >= (3, 11) else []
_PROOFS: dict[str, Proof] = {}  # one proof per environment and process


def _params() -> list[Any]:
    return [pytest.param(e, id=e.name, marks=pytest.mark.xdist_group(f"matrix-{e.name}")) for e in _ENVS]


@pytest.fixture
def root() -> Path:
    return matrix_root()


@pytest.fixture
def proven(request: pytest.FixtureRequest, root: Path) -> MatrixEnv:
    """The environment, proven healthy first (once per process); skipped when absent."""
    env: MatrixEnv = request.param
    if not env.python(root).exists():
        pytest.skip(f"{env.path(root)} absent (built by .ci/build-matrix)")
    proof = _PROOFS.get(env.name) or _PROOFS.setdefault(env.name, prove(env, root))
    assert proof.ok, f"the environment is not healthy, so it cannot judge the checker:\n{proof.text()}"
    return env


@pytest.fixture(autouse=True)
def _clean_environment(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "elfcache"))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)


_NO_SASS = re.compile(r"no SASS for (sm_\d+[af]?)")
_LIB = re.compile(r"\(([\w.+-]+\.so[\w.]*)\)")
_CUBIN = re.compile(r"\.(sm_\d+[af]?)\.cubin$", re.MULTILINE)
_TORCH_NVCC = (
    "import sys, types\n"
    "try:\n"
    "    import setuptools\n"
    "except ModuleNotFoundError:  # a venv uv made has none; torch's nvcc check uses none of it\n"
    "    for name in ('setuptools', 'setuptools.command', 'setuptools.command.build_ext'):\n"
    "        sys.modules[name] = types.ModuleType(name)\n"
    "    sys.modules['setuptools.command.build_ext'].build_ext = object\n"
    "import torch.utils.cpp_extension as c\n"
    "from torch.torch_version import TorchVersion\n"
    "c._check_cuda_version('c++', TorchVersion('0.0'))\n"
)
_SYMBOLS = re.compile(r"^`import ([\w.]+)` will fail: \d+ symbol\(s\) needed by ")
_SHARED = re.compile(r"^(\S+) \S+ and (\S+) \S+ install the same \d+ file\(s\)")


def _cuobjdump(root: Path) -> Path | None:
    found = sorted(root.glob(".tools/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump"))
    return found[0] if found else None


def _untrue_arch(env: MatrixEnv, root: Path, f: Finding) -> str | None:
    """An arch warning ("no SASS for sm_XX") is true when cuobjdump (NVIDIA's own reader) lists no cubin for that
    arch in the library the warning names."""
    arch, lib = _NO_SASS.search(f.message), _LIB.search(f.cause)
    if arch is None or lib is None:
        return "an arch warning that names no arch without SASS and no library: no oracle for it"
    tool = _cuobjdump(root)
    if tool is None:
        return "cuobjdump absent (.ci/build-matrix installs it under the matrix's .tools): cannot confirm it"
    files = sorted(env.site_dir(root).rglob(lib.group(1)))
    if not files:
        return f"{lib.group(1)} is not in the environment"
    for file in files:
        done = subprocess.run([str(tool), "--list-elf", str(file)], capture_output=True, text=True, check=False)
        sass = set(_CUBIN.findall(done.stdout))
        if arch.group(1) in sass:
            return f"{file} has SASS for {arch.group(1)} (cuobjdump: {sorted(sass)})"
    return None


def _untrue_symbols(judge: Env, f: Finding) -> str | None:
    """A symbols warning ("`import X` will fail: N symbol(s) ... not defined") is true when that import fails on
    an undefined symbol."""
    m = _SYMBOLS.match(f.message)
    if m is None:
        return "a symbols warning this oracle cannot read"
    done = child(judge, f"import {m[1]}")
    if done.returncode != 0 and "undefined symbol" in done.stderr:
        return None
    return f"`import {m[1]}` does not fail on an undefined symbol: rc {done.returncode}, {done.stderr[-300:]!r}"


def _record_paths(site: Path, dist: str) -> set[str]:
    infos = site.glob("*.dist-info")
    info = next((i for i in infos if _norm(i.name[: -len(".dist-info")].rsplit("-", 1)[0]) == _norm(dist)), None)
    if info is None or not (info / "RECORD").exists():
        return set()
    return {line.split(",")[0] for line in (info / "RECORD").read_text(errors="replace").splitlines() if line}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _untrue_integrity(env: MatrixEnv, root: Path, f: Finding) -> str | None:
    """An integrity warning ("A and B install the same file(s)") is true when both RECORDs list a common path."""
    m = _SHARED.match(f.message)
    if m is None:
        return "an integrity warning this oracle cannot read"
    common = _record_paths(env.site_dir(root), m[1]) & _record_paths(env.site_dir(root), m[2])
    return None if common else f"the RECORDs of {m[1]} and {m[2]} list no path in common"


def _untrue_toolchain(judge: Env, f: Finding) -> str | None:
    """torch's nvcc mismatch: true when torch's own check (torch.utils.cpp_extension) refuses that nvcc."""
    if not f.subject.startswith("torch "):
        return "a toolchain warning about another package than torch: no oracle for it"
    done = child(judge, _TORCH_NVCC)
    if done.returncode != 0 and "mismatches the version that was used to compile" in done.stderr:
        return None
    return f"torch's own check accepts the nvcc it finds: rc {done.returncode}, {done.stderr[-300:]!r}"


# NVIDIA's "CUDA Toolkit and Corresponding Driver Versions" (CUDA release notes, Table 3): the CUDA each
# declared driver branch ships with; within that major, newer minors run through minor-version compatibility
_DRIVER_CUDA = {"580": (13, 0), "535": (12, 2)}
_DRIVER_CLAIM = re.compile(
    r"CUDA (\d+)\.(\d+) is required; driver (\d+)\.\S+ \(declared\) supports CUDA ≤ (\d+)\.(\d+) \(\d+\.x via minor"
)
_NEEDS = re.compile(r"^(\S+) (\S+): needs CUDA (\d+)\.(\d+)")


def _installed(site: Path, dist: str, version: str) -> Path | None:
    """The dist-info directory of ``dist`` at ``version`` in ``site``, or None."""
    name = re.sub(r"[-_.]+", "_", dist).lower()
    for info in site.glob("*.dist-info"):
        stem = info.name[: -len(".dist-info")]
        if re.sub(r"[-_.]+", "_", stem.rsplit("-", 1)[0]).lower() == name and stem.rsplit("-", 1)[-1] == version:
            return info
    return None


def _untrue_driver(env: MatrixEnv, root: Path, f: Finding, declared: bool) -> str | None:
    """A driver warning ("CUDA X.Y is required; driver D supports CUDA <= A.B", minor-version compatibility) is
    true when D is the declared driver, A.B is what NVIDIA's table says D's branch ships with, X.Y is newer in
    the same major, and every component named is installed at a version of CUDA X.Y (an nvidia-*/cuda-toolkit
    wheel's own version, or another distribution's pin on one)."""
    claim = _DRIVER_CLAIM.search(f.message)
    if not declared or claim is None:
        return "a driver warning this oracle cannot read (or with no driver declared)"
    need, branch, says = (int(claim[1]), int(claim[2])), claim[3], (int(claim[4]), int(claim[5]))
    if not env.cuda_driver.startswith(branch + ".") or _DRIVER_CUDA.get(branch) != says:
        return f"driver {branch} ships with CUDA {_DRIVER_CUDA.get(branch)}, not {says}"
    if not (need[0] == says[0] and need > says):
        return f"CUDA {need} needs no minor-version compatibility on a CUDA {says} driver"
    site = env.site_dir(root)
    for line in f.details or (f"{f.subject}: needs CUDA {need[0]}.{need[1]}",):
        m = _NEEDS.match(line)
        if m is None:
            continue
        dist, version, cuda = m[1], m[2], f"{m[3]}.{m[4]}."
        info = _installed(site, dist, version)
        if info is None:
            return f"{dist} {version} is not installed"
        if dist.startswith(("nvidia-", "cuda-toolkit")):
            if not version.startswith(cuda):
                return f"{dist} {version} is not a CUDA {cuda[:-1]} release"
            continue
        pins = [
            r for r in (info / "METADATA").read_text(errors="replace").splitlines() if r.startswith("Requires-Dist")
        ]
        if not any(("cuda-toolkit" in r or "nvidia-" in r) and f"=={cuda}" in r for r in pins):
            return f"{dist} {version} pins no CUDA {cuda[:-1]} wheel"
    return None


def _judge(
    env: MatrixEnv, root: Path, found: list[Finding], declared: bool
) -> tuple[list[Finding], list[tuple[Finding, str]]]:
    """The errors, and the warnings that are untrue (with why). A warning about a failing import or a run-time
    load is judged as tests/helpers/realenv.py judges it; an arch warning by cuobjdump; torch's nvcc mismatch
    by torch's own check; a driver's minor-version compatibility by NVIDIA's table and the installed versions;
    a broken requirement by the installer's own check (which the proof ran: it found none); undefined symbols by
    the import; two distributions' shared files by their RECORDs. Any other kind has no oracle here, and so
    counts as untrue until it has one."""
    child_env = env.child_env(root)
    extra = tuple((k, child_env[k]) for k in ("LD_LIBRARY_PATH", "PYTHONDONTWRITEBYTECODE") if k in child_env)
    judge = Env(str(env.python(root)), str(env.site_dir(root)), env.health, extra)
    errors = [f for f in found if f.severity is Severity.ERROR]
    untrue: list[tuple[Finding, str]] = []
    for f in found:
        if f.severity is not Severity.WARNING:
            continue
        if f.check == "arch":
            why = _untrue_arch(env, root, f)
        elif f.check == "toolchain":
            why = _untrue_toolchain(judge, f)
        elif f.check == "symbols":
            why = _untrue_symbols(judge, f)
        elif f.check == "integrity" and " install the same " in f.message:
            why = _untrue_integrity(env, root, f)
        elif f.check == "dlopen" and "(the name is in its data, not a load it must make)" in f.message:
            why = "no oracle for a load by a name found in read-only data (a possible load, not a known one)"
        elif f.check == "driver":
            why = _untrue_driver(env, root, f, declared)
        elif f.check == "requirements" and " requires " in f.message and f.message.endswith(" is installed"):
            why = f"{'uv pip' if env.installer == 'uv' else 'pip'} check finds no broken requirement (the proof ran it)"
        else:
            try:
                why = untrue_warning(judge, f)
            except ValueError as exc:  # a library outside the environment's site-packages
                why = f"it names a library outside the environment: {exc}"
        if why is not None:
            untrue.append((f, why))
    return errors, untrue


def _record(env: MatrixEnv, key: str, value: Any) -> None:
    out = os.environ.get("CUDASTACK_MATRIX_REPORT")
    if not out:
        return
    path = Path(out) / f"{env.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1))


def _finding_row(f: Finding) -> dict[str, str]:
    return {
        "severity": f.severity.value,
        "check": f.check,
        "subject": f.subject,
        "message": f.message,
        "render": f.render()[:300],
    }


def _known_open(env: MatrixEnv, request: pytest.FixtureRequest) -> None:
    """An environment whose ``open`` names a false alarm the checker still gives (and its mechanism): its
    checker tests are expected to fail until that is fixed (not strict: its host run may already be clean)."""
    if env.open:
        request.applymarker(pytest.mark.xfail(reason=f"open false alarm: {env.open}", strict=False))


@pytest.mark.parametrize("proven", _params(), indirect=True)
def test_healthy_by_its_own_means(proven: MatrixEnv, root: Path) -> None:
    _record(proven, "proof", _PROOFS[proven.name].text())


@pytest.mark.parametrize("declared", [False, True], ids=["host", "declared-gpu"])
@pytest.mark.parametrize("proven", _params(), indirect=True)
def test_no_error_no_untrue_warning(
    proven: MatrixEnv, root: Path, declared: bool, tmp_path: Path, monkeypatch, request
) -> None:
    env = proven
    _known_open(env, request)
    if env.ld_library_path:
        monkeypatch.setenv("LD_LIBRARY_PATH", env.child_env(root)["LD_LIBRARY_PATH"])
    values: dict[str, Any] = {"cudastack": True}
    if declared:
        values.update(cuda_driver=env.cuda_driver, cuda_arch=env.cuda_arch)
    # rootdir: an empty directory, so that this repository's own files are not read as the project's imports
    results = Stack(Settings.from_values(**values), rootdir=str(tmp_path), site_paths=(str(env.site_dir(root)),))
    found = [f for fs in results.run_checks().values() for f in fs]
    errors, untrue = _judge(env, root, found, declared)
    _record(
        env,
        f"findings-{'declared' if declared else 'host'}",
        [_finding_row(f) for f in found if f.severity is not Severity.INFO],
    )
    _record(env, f"untrue-{'declared' if declared else 'host'}", [f"{f.id}: {why}" for f, why in untrue])
    shown = "\n\n".join(f.render() for f in found if f.severity in (Severity.ERROR, Severity.WARNING))
    reasons = "\n".join(f"untrue: {f.id}: {why}" for f, why in untrue)
    assert (len(errors), len(untrue)) == (0, 0), (
        f"{env.name}: errors, untrue warnings: {len(errors)}, {len(untrue)}\n{reasons}\n\n{shown}"
    )


@pytest.mark.parametrize("declared", [False, True], ids=["host", "declared-gpu"])
@pytest.mark.parametrize("proven", _params(), indirect=True)
def test_cudastack_check_exits_0(proven: MatrixEnv, root: Path, declared: bool, tmp_path: Path, request) -> None:
    env = proven
    _known_open(env, request)
    argv = [sys.executable, "-m", "pytest_cudastack.cli", "check", "--color", "no", "--site", str(env.site_dir(root))]
    argv += ["--rootdir", str(tmp_path)]
    if declared:
        argv += ["--cuda-driver", env.cuda_driver, "--cuda-arch", env.cuda_arch]
    child = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    if env.ld_library_path:
        child["LD_LIBRARY_PATH"] = env.child_env(root)["LD_LIBRARY_PATH"]
    repo = Path(__file__).resolve().parents[1]
    child["PYTHONPATH"] = str(repo)  # the checker under test, as the test process imports it
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=child, timeout=900, check=False)
    _record(env, f"cli-{'declared' if declared else 'host'}", {"rc": done.returncode, "tail": done.stdout[-3000:]})
    assert done.returncode == 0, (
        f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    )


def test_matrix_lists_are_sound() -> None:
    """Every environment names its packages, a CUDA major its declared driver supports, and an arch; a package
    left out says why, and is in no environment's list."""
    if not _ENVS:
        pytest.skip("tests/matrix.toml needs Python 3.11 (tomllib)")
    for env in _ENVS:
        assert env.packages, env.name
        assert env.build, env.name
        assert env.health.strip(), env.name
        assert env.cuda in (11, 12, 13), env.name
        assert env.cuda_arch.startswith("sm_"), env.name
        assert int(env.cuda_driver.split(".")[0]) >= (580 if env.cuda == 13 else 525), env.name
    inside = {p for env in _ENVS for p in env.packages}
    for packages, reason in not_installable():
        assert packages, reason
        assert reason.strip(), packages
        assert not inside & set(packages), (packages, inside & set(packages))
