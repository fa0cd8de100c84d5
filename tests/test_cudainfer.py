from __future__ import annotations

import pytest

from pytest_cudastack.checks.bounds import bound_findings
from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.resolver import Library, Route, Tree
from pytest_cudastack.model.needs import CudaNeed, Inference, infer_binary

ROOT = "/app/bin/train"


def lib(soname: str, path: str | None, needed_by: str = ROOT, provider: str | None = None) -> Library:
    route = Route.NOT_FOUND if path is None else Route.RUNPATH
    return Library(soname, path, path, route, "", (), (needed_by,), provider)


def tree(*libs: Library) -> Tree:
    return Tree(ROOT, None, tuple(libs), (), {})


class FakeDist:
    def __init__(self, name: str, version: str) -> None:
        self.name, self.version, self.requires, self.libraries = name, version, (), ()
        self.label, self.key = f"{name} {version}", name


class FakeInventory:
    def __init__(self, owners: dict[str, FakeDist]) -> None:
        self._owners = owners

    def owners(self, path: str) -> tuple[FakeDist, ...]:
        return (self._owners[path],) if path in self._owners else ()


def test_unambiguous_sonames_decide_the_major():
    inf = infer_binary(
        tree(lib("libcublas.so.13", "/l/libcublas.so.13"), lib("libc.so.6", "/lib/libc.so.6")), "bin/train"
    )
    assert [(n.major, n.minor) for n in inf.needs] == [(13, None)]
    assert inf.needs[0].evidence == "links libcublas.so.13 (CUDA 13.x)"
    assert inf.undecided == ()


def test_nvrtc_builtins_gives_the_minor():
    inf = infer_binary(tree(lib("libnvrtc-builtins.so.12.9", "/l/x")), "b")
    assert (inf.needs[0].major, inf.needs[0].minor) == (12, 9)


def test_ambiguous_soname_decided_by_its_own_needed():
    curand = "/l/libcurand.so.10"
    inf = infer_binary(tree(lib("libcurand.so.10", curand), lib("libcudart.so.13", "/l/libcudart.so.13", curand)), "b")
    curand_need = next(n for n in inf.needs if "libcurand" in n.evidence)
    assert curand_need.major == 13
    assert f"{curand} needs libcudart.so.13" in curand_need.evidence


def test_ambiguous_soname_decided_by_owning_wheel():
    curand = "/site/nvidia/curand/lib/libcurand.so.10"
    inv = FakeInventory({curand: FakeDist("nvidia-curand-cu12", "10.3.10.19")})
    inf = infer_binary(tree(lib("libcurand.so.10", curand)), "b", inv)  # type: ignore[arg-type]
    assert [(n.major, n.minor) for n in inf.needs] == [(12, None)]
    assert "belongs to nvidia-curand-cu12 10.3.10.19" in inf.needs[0].evidence


def test_ambiguous_soname_undecided_is_never_guessed():
    inf = infer_binary(tree(lib("libcurand.so.10", None), lib("libcusparse.so.12", "/l/libcusparse.so.12")), "b")
    assert inf.needs == ()
    assert len(inf.undecided) == 2
    assert "libcurand.so.10 (shared by CUDA 11, 12, 13)" in inf.undecided[0]
    findings = bound_findings("max", "12.9", [inf])
    assert {f.severity for f in findings} == {Severity.INFO}


def need(major: int, minor: int | None, subject: str = "bin/x") -> Inference:
    return Inference(subject, (CudaNeed(major, minor, subject, f"links libfoo (CUDA {major})"),))


@pytest.mark.parametrize(
    ("kind", "bound", "major", "minor", "expected"),
    [
        pytest.param("max", "12.9", 13, None, Severity.ERROR, id="13.x violates max 12.9"),
        pytest.param("max", "12.9", 12, 9, None, id="12.9 within max 12.9"),
        pytest.param("max", "12.4", 12, 9, Severity.ERROR, id="12.9 violates max 12.4"),
        pytest.param("max", "12.4", 12, None, Severity.WARNING, id="12.x vs max 12.4 undecidable"),
        pytest.param("max", "12.9", 12, None, None, id="12.x within max 12.9: the series ended at 12.9"),
        pytest.param("max", "13.0", 13, None, Severity.WARNING, id="13.x vs max 13.0 undecidable: 13.1 exists"),
        pytest.param("max", "12", 12, None, None, id="12.x within max 12"),
        pytest.param("max", "13.0", 12, None, None, id="12.x within max 13.0"),
        pytest.param("min", "13.0", 12, None, Severity.ERROR, id="12.x violates min 13.0"),
        pytest.param("min", "12.0", 12, None, None, id="12.x meets min 12.0"),
        pytest.param("min", "12.4", 12, None, Severity.WARNING, id="12.x vs min 12.4 undecidable"),
        pytest.param("min", "12.4", 12, 2, Severity.ERROR, id="12.2 violates min 12.4"),
    ],
)
def test_bound_semantics(kind, bound, major, minor, expected):
    findings = bound_findings(kind, bound, [need(major, minor)])
    assert [f.severity for f in findings] == ([expected] if expected else [])
    for f in findings:
        assert f.check == f"cuda-{kind}"


def test_violation_message_names_component_requirement_and_evidence():
    (f,) = bound_findings("max", "12.9", [need(13, None, "bin/train_tft")], "--cuda-max=12.9")
    assert f.message == "links libfoo (CUDA 13) but --cuda-max=12.9"
    assert f.subject == "bin/train_tft"
    assert f.failing
