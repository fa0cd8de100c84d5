"""One Finding, two renderings: the full form (items, ``cudastack check``, ``report -v``) and the compact one."""

from __future__ import annotations

from pytest_cudastack.findings import SEVERITY_ORDER, Finding, Severity, manual, most_severe_first

LONG = Finding(
    "closure",
    Severity.ERROR,
    "pkg/_ext.so",
    "libdep.so.1 not found",
    cause="no RUNPATH entry holds it",
    remedies=manual("install nvidia-dep-cu13"),
    where=("/a", "/b", "/c", "/d", "/e"),
    chain=("pkg/_ext.so", "libmid.so.1"),
    details=("d0", "d1", "d2", "d3", "d4", "d5"),
)


def test_full_form_lists_everything() -> None:
    assert LONG.render() == (
        "pkg/_ext.so: libdep.so.1 not found\n"
        "  needed by: pkg/_ext.so -> libmid.so.1\n"
        "  cause: no RUNPATH entry holds it\n"
        "  looked in: /a, /b, /c, /d, /e\n"
        "  d0\n  d1\n  d2\n  d3\n  d4\n  d5\n"
        "  fix: install nvidia-dep-cu13"
    )


def test_compact_form_counts_what_it_leaves_out() -> None:
    assert LONG.render(compact=True) == (
        "pkg/_ext.so: libdep.so.1 not found\n"
        "  needed by: pkg/_ext.so -> libmid.so.1\n"
        "  cause: no RUNPATH entry holds it\n"
        "  looked in 5 places: /a, /b, /c, ... (-v or --json for all)\n"
        "  d0\n  d1\n  d2\n"
        "  ... 3 more (-v or --json)\n"
        "  fix: install nvidia-dep-cu13"
    )


def test_compact_form_of_a_short_finding_is_the_full_form() -> None:
    short = Finding("integrity", Severity.WARNING, "x", "y", where=("/a", "/b", "/c"), details=("d0", "d1", "d2"))
    assert short.render(compact=True) == short.render() == "x: y\n  looked in: /a, /b, /c\n  d0\n  d1\n  d2"
    bare = Finding("driver", Severity.INFO, "driver", "no NVIDIA driver")
    assert bare.render(compact=True) == bare.render() == "driver: no NVIDIA driver"


def test_severity_order_is_most_severe_first() -> None:
    assert SEVERITY_ORDER == (Severity.ERROR, Severity.WARNING, Severity.INFO)
    assert [s.rank for s in SEVERITY_ORDER] == [0, 1, 2]
    severities = (Severity.INFO, Severity.ERROR, Severity.WARNING, Severity.ERROR, Severity.INFO)
    found = [Finding("c", sev, str(i), "m") for i, sev in enumerate(severities)]
    assert [(f.severity.value, f.subject) for f in most_severe_first(found)] == [
        ("error", "1"),
        ("error", "3"),
        ("warning", "2"),
        ("info", "0"),
        ("info", "4"),
    ]


def test_a_message_that_opens_with_its_subject_names_it_once() -> None:
    f = Finding("dlopen", Severity.INFO, "libcuda.so.1", "libcuda.so.1: loaded at run time by libcudart.so.13")
    assert f.render().splitlines()[0] == "libcuda.so.1: loaded at run time by libcudart.so.13"
    g = Finding("dlopen", Severity.INFO, "libcuda.so.1", "loaded at run time by libcudart.so.13")
    assert g.render().splitlines()[0] == "libcuda.so.1: loaded at run time by libcudart.so.13"
    h = Finding("bounds", Severity.ERROR, "torch 2.14.1", "torch 2.14.1 is a CUDA 13 build")
    assert h.render().splitlines()[0] == "torch 2.14.1 is a CUDA 13 build"
