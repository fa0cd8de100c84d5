"""cuda/frameworks.py (the rules file: validator on the shipped file and broken copies, reported versions,
verdicts at every boundary) and checks/frameworks.py (the rules applied to synthetic site directories)."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack.checks.frameworks import framework_findings
from pytest_cudastack.cuda.frameworks import (
    DATA_FILE,
    KINDS,
    framework_says,
    judge,
    load_rules,
    reported_version,
    validate_rules,
)
from pytest_cudastack.errors import DataError
from pytest_cudastack.findings import Severity, UseBuild
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import site_packages, write_dist


def raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        resources.files("pytest_cudastack.cuda").joinpath(DATA_FILE).read_text(encoding="utf-8")
    )
    return data


def test_shipped_file_validates_and_every_row_cites_a_listed_source():
    data = load_rules()
    assert {r.kind for r in data.rules} == set(KINDS)
    for row in (*data.libraries, *data.rules):
        assert row.source in data.sources
    assert {r.framework for r in data.rules} >= {
        "torch",
        "jax-cuda12-plugin",
        "tensorflow",
        "onnxruntime-gpu",
        "cupy-cuda12x",
        "cupy-cuda13x",
    }


def _broken(edit: Any) -> dict[str, Any]:
    data = copy.deepcopy(raw())
    edit(data)
    return data


def _set(path: tuple[Any, ...], value: Any) -> Any:
    def edit(data: dict[str, Any]) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return edit


_DELETE = object()


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        pytest.param(_set(("schema",), 2), "unsupported schema 2", id="schema"),
        pytest.param(_set(("extra",), 1), "unknown top-level key(s) extra", id="top key"),
        pytest.param(
            _set(("sources", "wheel-headers", "retrieved"), "yesterday"), "needs 'url' and 'retrieved'", id="date"
        ),
        pytest.param(
            _set(("libraries", 0, "source"), "nowhere"), "libraries[0]: source 'nowhere' is not listed", id="lib source"
        ),
        pytest.param(_set(("libraries", 0, "colour"), "red"), "libraries[0].colour: not allowed here", id="lib key"),
        pytest.param(
            _set(("rules", 0, "says"), "compiled against {}"),
            "allowed fields: {build}, {build_dotted}, {runtime}, {runtime_dotted}",
            id="says {}",
        ),
        pytest.param(_set(("rules", 0, "build"), ["wheel"]), "rules[0].build[0]: expected one of", id="build place"),
        pytest.param(_set(("rules", 0, "build"), ["pin", "pin"]), "once each", id="build twice"),
        pytest.param(_set(("rules", 9, "build"), ["pin"]), "belongs to kinds build_match", id="build kind"),
        pytest.param(_set(("rules", 0, "build"), ["build_file"]), "does not name", id="build_file unnamed"),
        pytest.param(_set(("rules", 0, "silent"), "yes"), "rules[0].silent: expected boolean", id="silent"),
        pytest.param(_set(("rules", 0, "says"), "found {major"), "is not a template", id="says brace"),
        pytest.param(_set(("libraries", 0, "wheel"), "nvidia-cudnn-cu12"), "without -cuNN", id="suffixed wheel"),
        pytest.param(_set(("libraries", 0, "wheel"), "Nvidia_Cudnn"), "canonical name", id="wheel spelling"),
        pytest.param(
            _set(("libraries", 0, "sonames"), ["libcudnn.so.9"]), "stems such as 'libcudnn'", id="soname stem"
        ),
        pytest.param(_set(("libraries", 0, "sonames"), []), "non-empty list", id="no sonames"),
        pytest.param(_set(("libraries", 0, "reports"), 7), "'reports' must be 1..4", id="reports"),
        pytest.param(
            _set(("libraries", 0, "macros"), ["CUDNN_MAJOR"]), "one macro per reported component", id="macros"
        ),
        pytest.param(_set(("libraries", 1, "library"), "cudnn"), "libraries[1]: duplicate row", id="library twice"),
        pytest.param(_set(("libraries", 1, "sonames"), ["libcudnn"]), "already claimed by 'cudnn'", id="stem twice"),
        pytest.param(_set(("rules", 0, "kind"), "vibes"), "kind 'vibes' is not one of", id="kind"),
        pytest.param(
            _set(("rules", 0, "library"), "cudnnx"), "library 'cudnnx' is not in 'libraries'", id="rule library"
        ),
        pytest.param(
            _set(("rules", 0, "source"), "nowhere"), "rules[0]: source 'nowhere' is not listed", id="rule source"
        ),
        pytest.param(_set(("rules", 0, "versions"), ">=two"), "'versions' is not a version specifier", id="versions"),
        pytest.param(_set(("rules", 0, "framework"), "Torch"), "canonical distribution name", id="framework"),
        pytest.param(_set(("rules", 0, "says"), _DELETE), "needs 'says'", id="says"),
        pytest.param(_set(("rules", 0, "min"), "9.1"), "'min' belongs to kind 'floor' only", id="min on build_match"),
        pytest.param(_set(("rules", 2, "min"), "twelve"), "'min' must be a dotted version", id="bad min"),
        pytest.param(_set(("rules", 5, "reason"), ""), "needs its 'reason'", id="undecidable without reason"),
        pytest.param(_set(("rules", 0, "skip_env"), "skip me"), "environment variable name", id="skip_env"),
        pytest.param(_set(("rules", 1, "library"), "cudnn"), "rules[1]: duplicate row", id="rule twice"),
        pytest.param(
            _set(("rules", 0, "library"), "nvrtc"),
            "needs a library whose reported version is known",
            id="unknown reports",
        ),
        pytest.param(_set(("rules",), {}), "rules: expected array", id="rules not a list"),
        pytest.param(_set(("rules", 8, "build_file"), "../../etc/passwd"), "path inside the site", id="build_file"),
        pytest.param(_set(("rules", 8, "build_keys"), []), "'build_keys' must be a non-empty list", id="build_keys"),
        pytest.param(_set(("rules", 0, "build_keys"), ["x"]), "'build_keys' without 'build_file'", id="keys alone"),
        pytest.param(_set(("rules", 9, "soname"), "libcublas.so"), "a versioned soname", id="unversioned soname"),
        pytest.param(_set(("rules", 9, "soname"), "libcudnn.so.9"), "is not one of 'cublas''s", id="soname library"),
        pytest.param(_set(("rules", 9, "major"), "12"), "rules[9].major: expected integer", id="major"),
        pytest.param(_set(("rules", 9, "major"), True), "rules[9].major: expected integer", id="major bool"),
        pytest.param(_set(("rules", 0, "soname"), "libcudnn.so.9"), "belongs to kind 'loads_by_name'", id="soname"),
        pytest.param(_set(("rules", 9, "provider"), "x.so"), "belongs to kind 'provider' only", id="provider key"),
        pytest.param(_set(("rules", 13, "provider"), "/usr/lib/x.so"), "path inside the site", id="provider path"),
        pytest.param(_set(("rules", 13, "provider"), _DELETE), "path inside the site", id="no provider"),
        pytest.param(_set(("rules", 13, "library"), "cublas"), "library '*' is for kind 'provider'", id="provider lib"),
        pytest.param(_set(("rules", 0, "library"), "*"), "library '*' is for kind 'provider'", id="star library"),
        pytest.param(_set(("rules", 5, "bad"), "nine"), "'bad' must be a dotted version", id="bad version"),
        pytest.param(_set(("rules", 0, "bad"), "9.10.0"), "'bad' belongs to an undecidable rule", id="bad kind"),
        pytest.param(_set(("rules", 5, "says"), _DELETE), "'bad' belongs to an undecidable rule", id="bad says"),
    ],
)
def test_validator_rejects_broken_copies(edit: Any, expected: str):
    with pytest.raises(DataError) as info:
        validate_rules(_broken(edit), "broken.json")
    assert str(info.value).startswith("broken.json")
    assert expected in str(info.value)


def test_load_rules_names_the_file_on_bad_json(monkeypatch: pytest.MonkeyPatch):
    load_rules.cache_clear()

    class Bad:
        def joinpath(self, _name: str) -> Bad:
            return self

        def read_text(self, encoding: str) -> str:
            return "{"

    monkeypatch.setattr(resources, "files", lambda _pkg: Bad())
    try:
        with pytest.raises(DataError, match=r"data/framework_rules.json: cannot read"):
            load_rules()
    finally:
        monkeypatch.undo()
        load_rules.cache_clear()


@pytest.mark.parametrize(
    ("library", "wheel_version", "reported"),
    [
        ("cudnn", "9.19.0.56", (9, 19, 0)),
        ("cudnn", "9.24.0.43", (9, 24, 0)),
        ("nccl", "2.30.7", (2, 30, 7)),
        ("cublas", "13.1.1.3", (13, 1, 1)),
        ("cusparse", "12.6.3.3", (12, 6, 3)),
        ("cudart", "13.0.96", (13, 0)),
        ("cudart", "12", (12, 0)),
        ("nvrtc", "13.0.88", None),  # not known: never guessed
        ("cudnn", "nine", None),
    ],
)
def test_reported_versions(library: str, wheel_version: str, reported: tuple[int, ...] | None):
    row = load_rules().library(library)
    assert row is not None
    assert reported_version(row, wheel_version) == reported


def test_library_lookups():
    data = load_rules()
    assert data.library_for_soname("libcusparseLt.so.0").library == "cusparselt"
    assert data.library_for_soname("libcusparse.so.12").library == "cusparse"
    assert data.library_for_soname("libcudnn_engines_precompiled.so.9").library == "cudnn"
    assert data.library_for_soname("libcudnnx.so.9") is None
    assert data.library_for_wheel("nvidia-cudnn-cu12").library == "cudnn"
    assert data.library_for_wheel("nvidia_cublas").library == "cublas"
    assert data.library_for_wheel("nvidia-cudnn-frontend") is None


def _rule(framework: str, library: str):
    return next(r for r in load_rules().rules if r.framework == framework and r.library == library)


@pytest.mark.parametrize(
    ("build", "runtime", "ok"),
    [
        ((9, 24, 0), (9, 24, 0), True),
        ((9, 24, 0), (9, 24, 3), True),
        ((9, 24, 0), (9, 25, 0), True),  # minors are backwards compatible from cuDNN 7 (torch's own rule)
        ((9, 24, 0), (9, 23, 9), False),
        ((9, 24, 0), (9, 19, 0), False),
        ((9, 24, 0), (8, 9, 7), False),
        ((9, 24, 0), (10, 0, 0), False),
        (None, (9, 19, 0), None),
        ((9, 24, 0), None, None),
    ],
)
def test_torch_cudnn_build_match(build, runtime, ok):
    verdict = judge(_rule("torch", "cudnn"), build, runtime)
    assert verdict.ok is ok
    if ok is None:
        assert verdict.text.startswith("cannot be decided statically because")


@pytest.mark.parametrize(
    ("runtime", "ok"),
    [((2, 30, 7), True), ((2, 30, 8), True), ((2, 31, 0), True), ((2, 30, 6), False), ((2, 28, 9), False)],
)
def test_torch_nccl_pin_floor(runtime, ok):
    assert judge(_rule("torch", "nccl"), (2, 30, 7), runtime).ok is ok


@pytest.mark.parametrize(
    ("runtime", "ok"), [((12, 1, 0), True), ((12, 0, 9), False), ((13, 0, 0), True), ((11, 8, 0), False)]
)
def test_jax_cublas_floor(runtime, ok):
    assert judge(_rule("jax-cuda12-plugin", "cublas"), None, runtime).ok is ok


def test_undecidable_rules_say_why():
    rule = next(r for r in load_rules().rules if r.framework == "jax-cuda12-plugin" and r.kind == "undecidable")
    verdict = judge(rule, (9, 1, 0), (9, 8, 0))
    assert verdict.ok is None
    assert verdict.text.startswith("cannot be decided statically because JAX refuses cuDNN 9.10.0 unless")


def test_the_framework_message_is_quoted():
    says = framework_says(load_rules(), "torch", "2.14.1", "cudnn", (9, 24, 0), (9, 19, 0))
    assert says == (
        "cuDNN version incompatibility: PyTorch was compiled against (9, 24, 0) but found runtime version (9, 19, 0)"
    )
    assert framework_says(load_rules(), "torch", "2.14.1", "cudnn", (9, 24, 0), (9, 24, 0)) == ""


# ---------------------------------------------------------------------------------------------- the check


JAX_WITH_CUDA = 'nvidia-cudnn-cu12<10.0,>=9.8; extra == "with-cuda"'


def stack_of(site: Path, imports: tuple[str, ...] = ()) -> Stack:
    """The stack of ``site``; ``imports``: the project's imports (cudastack_imports; the rootdir is not read)."""
    settings = Settings.from_values(cudastack=True, cudastack_imports=list(imports), cudastack_imports_scan="false")
    return Stack(settings, rootdir=str(site), site_paths=(str(site),))


def test_jax_floor_broken_and_clean(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", raising=False)
    site = site_packages(tmp_path / "broken")
    write_dist(site, "jax-cuda12-plugin", "0.4.30")
    write_dist(site, "nvidia-cublas-cu12", "12.0.2.224")
    found = framework_findings(stack_of(site))
    (err,) = [f for f in found if f.failing]
    assert err.subject == "jax-cuda12-plugin cuBLAS"
    assert "Outdated cuBLAS installation found" in err.message
    assert "needs at least (12, 1, 0)" in err.cause
    assert "(12, 0, 2)" in err.cause
    assert not [f for f in found if f.severity is Severity.INFO]  # no cuDNN installed: no cuDNN rule to judge

    clean = site_packages(tmp_path / "clean")
    write_dist(clean, "jax-cuda12-plugin", "0.4.30")
    write_dist(clean, "nvidia-cublas-cu12", "12.1.3.1")
    assert not [f for f in framework_findings(stack_of(clean)) if f.failing]


def test_a_skipped_framework_check_is_an_info(tmp_path, monkeypatch):
    site = site_packages(tmp_path / "v")
    write_dist(site, "jax-cuda12-plugin", "0.4.30")
    write_dist(site, "nvidia-cublas-cu12", "12.0.2.224")
    monkeypatch.setenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    found = framework_findings(stack_of(site))
    assert not [f for f in found if f.failing]
    assert "skips its check (JAX_SKIP_CUDA_CONSTRAINTS_CHECK is set)" in found[0].cause


def test_torch_without_a_pin_cannot_be_judged(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK", raising=False)
    site = site_packages(tmp_path / "v")
    write_dist(site, "torch", "2.5.0")
    write_dist(site, "nvidia-cudnn-cu12", "9.1.0.70")
    (f,) = framework_findings(stack_of(site))
    assert f.severity is Severity.INFO
    assert "cuDNN: cannot be decided statically because its metadata pins no wheel of it" in f.cause


def test_torch_pin_met_is_quiet(tmp_path):
    site = site_packages(tmp_path / "v")
    write_dist(site, "torch", "2.14.1", requires=["nvidia-cudnn-cu13==9.24.0.43", "nvidia-nccl-cu13==2.30.7"])
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43")
    write_dist(site, "nvidia-nccl-cu13", "2.30.7")
    assert framework_findings(stack_of(site)) == ()
    inv = installed_wheels([str(site)], reader=read_elf)
    assert inv.get("torch") is not None


@pytest.mark.parametrize(
    "text",
    [
        "build_info = {'cuda_version': '12.2', 'cudnn_version': '8', 'is_cuda_build': True}\n",
        "build_info = collections.OrderedDict([('cuda_version', '12.2'), ('cudnn_version', '8')])\n",
    ],
    ids=["dict", "OrderedDict"],
)
def test_tensorflow_build_info_is_quoted_never_imported(tmp_path, text):
    # TensorFlow built for cuDNN 8 (its build_info.py) where only cuDNN 9 is installed: its stream executor
    # dlopens libcudnn.so.8, a name it builds at run time (no file holds it whole), so this rule sees it
    site = site_packages(tmp_path / "v")
    write_dist(site, "tensorflow", "2.15.0", {"tensorflow/python/platform/build_info.py": "raise SystemExit\n" + text})
    write_dist(site, "nvidia-cudnn-cu12", "9.1.0.70")
    (f,) = framework_findings(stack_of(site, imports=("tensorflow",)))
    assert f.severity is Severity.ERROR
    assert f.details[-1] == "reached by `import tensorflow` (--cudastack-imports)"
    assert (
        f.message
        == "tensorflow 2.15.0 loads cuDNN 8, which is not installed: the cuDNN here is (9, 1, 0), another major"
    )
    assert "its build_info.py says cudnn_version 8" in f.cause


def test_tensorflow_major_of_its_build_only_leaves_the_minor_not_judged(tmp_path):
    site = site_packages(tmp_path / "v")
    info = "build_info = {'cuda_version': '12.2', 'cudnn_version': '8'}\n"
    write_dist(site, "tensorflow", "2.15.0", {"tensorflow/python/platform/build_info.py": info})
    write_dist(site, "nvidia-cudnn-cu12", "8.9.7.29")
    (f,) = framework_findings(stack_of(site))
    assert f.severity is Severity.INFO
    assert f.details == (
        "cuDNN: cannot be decided statically because the minor of the build is stated by no file (its major "
        "matches) (its build_info.py says cudnn_version 8)",
    )


@pytest.mark.parametrize(("cudnn", "bad"), [("8.6.0.163", True), ("8.9.7.29", False), ("8.9.4.25", False)])
def test_tensorflow_and_cuda_pin_is_the_build(tmp_path, cudnn, bad):
    # tensorflow[and-cuda] pins the cuDNN it was built against; an older minor fails XLA's check at DNN init
    site = site_packages(tmp_path / "v")
    pin = 'nvidia-cudnn-cu12==8.9.4.25; extra == "and-cuda"'
    write_dist(site, "tensorflow", "2.15.0", requires=[pin])
    write_dist(site, "nvidia-cudnn-cu12", cudnn)
    found = framework_findings(stack_of(site, imports=("tensorflow.keras",)))
    errors = [f for f in found if f.severity is Severity.ERROR]
    if not bad:
        assert errors == []
        return
    (err,) = errors
    assert "Loaded runtime CuDNN library: 8.6.0 but source was compiled with: 8.9.4." in err.message
    assert "its METADATA declares nvidia-cudnn-cu12==8.9.4.25" in err.cause
    # the remedy as data: the build it was built against, with the pip command that gets it (no prose command)
    (use,) = err.remedies
    assert isinstance(use, UseBuild)
    assert use.package == "nvidia-cudnn-cu12"
    assert use.install is not None
    assert (use.install.specs, use.install.flags) == (("nvidia-cudnn-cu12==8.9.4.25",), ("--no-deps",))


@pytest.mark.parametrize(("cudnn", "warned"), [("9.10.0.56", True), ("9.10.1.4", False), ("9.9.0.52", False)])
def test_jax_refuses_cudnn_9_10_0_unless_built_against_it(tmp_path, monkeypatch, cudnn, warned):
    # jax_plugins/cuda/__init__.py: cudnn_version == 91000 and cudnn_build_version() != 91000 -> RuntimeError;
    # the build version is compiled in, so a WARNING (never an ERROR); other versions keep the INFO saying why
    # any other loaded version passes that check whatever the build was: nothing to say (the plugin's declared
    # floor, 9.8, is its build's for XLA's own check, met here)
    monkeypatch.delenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", raising=False)
    site = site_packages(tmp_path / "v")
    write_dist(site, "jax-cuda12-plugin", "0.6.2", requires=[JAX_WITH_CUDA])
    write_dist(site, "nvidia-cudnn-cu12", cudnn)
    found = framework_findings(stack_of(site))
    warnings = [f for f in found if f.severity is Severity.WARNING]
    if not warned:
        assert found == ()
        return
    (w,) = warnings
    assert w.message.startswith(
        'jax-cuda12-plugin 0.6.2 refuses cuDNN (9, 10, 0) unless it was built against it: "cuDNN 9.10.0 had a '
        "binary backward-compatibility issue"
    )
    assert w.cause.startswith(f"it would load {site}/nvidia_cudnn_cu12-{cudnn}.dist-info")
    assert "whether it was built against (9, 10, 0) cannot be decided statically because" in w.cause
    assert not [f for f in found if f.failing]


def test_tensorflow_not_imported_by_the_project_is_a_warning(tmp_path):
    # the same broken TensorFlow, which the project does not import: it would drop the GPU only if imported
    site = site_packages(tmp_path / "v")
    info = "build_info = {'cuda_version': '12.2', 'cudnn_version': '8'}\n"
    write_dist(site, "tensorflow", "2.15.0", {"tensorflow/python/platform/build_info.py": info})
    write_dist(site, "nvidia-cudnn-cu12", "9.1.0.70")
    (f,) = framework_findings(stack_of(site, imports=("numpy",)))
    assert f.severity is Severity.WARNING
    assert f.message.startswith("after `import tensorflow`: tensorflow 2.15.0 loads cuDNN 8, which is not installed")
