from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_cudastack.checks.integrity import check_integrity
from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.wheels.inventory import installed_wheels
from pytest_cudastack.wheels.ownership import active_requirements, pip_command
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

needs_cc = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")

CUDNN_LIBS = ("libcudnn.so.9", "libcudnn_ops.so.9")


def inv_of(*sites: Path):
    return installed_wheels([str(s) for s in sites], reader=read_elf)


def errors(findings):
    return [f for f in findings if f.severity is Severity.ERROR]


def cudnn_files(flavour: str) -> dict[str, bytes | str]:
    files: dict[str, bytes | str] = {
        f"nvidia/cudnn/lib/{so}": compile_so(so, payload=f"cudnn {flavour} build" * (3 if flavour == "cu12" else 1))
        for so in CUDNN_LIBS
    }
    files["nvidia/cudnn/include/cudnn.h"] = f"/* {flavour} */\n"
    return files


def torch_venv(tmp_path: Path) -> Path:
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "torch",
        "2.14.1",
        {"torch/__init__.py": ""},
        requires=[
            'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"',
            "cuda-toolkit[cublas]==13.0.3",
            'optree>=0.13.0; extra == "optree"',
        ],
    )
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43", cudnn_files("cu13"), requires=["nvidia-cublas"])
    return site


@needs_cc
def test_clean_site_has_no_findings(tmp_path):
    site = torch_venv(tmp_path)
    assert check_integrity(inv_of(site)) == ()


@needs_cc
def test_overlap_and_broken_pin(tmp_path):
    site = torch_venv(tmp_path)
    write_dist(site, "nvidia-cudnn-cu12", "9.19.0.56", cudnn_files("cu12"))  # installed over cu13
    found = check_integrity(inv_of(site))
    errs = errors(found)
    assert len(errs) == 2, [f.render() for f in found]
    overlap = next(f for f in errs if "install the same" in f.message)
    assert "nvidia-cudnn-cu12 9.19.0.56 and nvidia-cudnn-cu13 9.24.0.43" in overlap.message
    assert "3 file(s) under nvidia/cudnn/" in overlap.message
    assert set(overlap.distributions) == {"nvidia-cudnn-cu12", "nvidia-cudnn-cu13"}
    assert "the bytes on disk are nvidia-cudnn-cu12 9.19.0.56's" in overlap.message
    assert "torch 2.14.1 requires nvidia-cudnn-cu13==9.24.0.43" in overlap.cause
    assert "nothing installed requires nvidia-cudnn-cu12" in overlap.cause
    assert overlap.fix == (
        "pip uninstall -y nvidia-cudnn-cu12 && pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43"
    )
    assert overlap.details[0].startswith("nvidia/cudnn/lib/libcudnn.so.9: ")  # libraries first
    assert "bytes on disk = nvidia-cudnn-cu12 9.19.0.56's" in overlap.details[0]
    pin = next(f for f in errs if f is not overlap)
    assert pin.subject == "torch -> nvidia-cudnn-cu13==9.24.0.43"
    assert pin.distributions == ("torch",)
    assert "nvidia/cudnn/lib/libcudnn.so.9 (and 1 more) on disk are nvidia-cudnn-cu12 9.19.0.56's" in pin.message
    assert (
        "cuDNN version incompatibility at first use: torch was built against 9.24.0.43, the files on disk "
        "are 9.19.0.56" in pin.cause
    )
    assert "pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43" in pin.fix


@needs_cc
def test_same_size_overlap_is_decided_by_hash(tmp_path):
    site = site_packages(tmp_path / "venv")
    a = compile_so("libx.so.1", payload="AAAA")
    b = compile_so("libx.so.1", payload="BBBB")
    assert len(a) == len(b)
    assert a != b
    write_dist(site, "x-cu13", "1", {"x/lib/libx.so.1": a})
    write_dist(site, "x-cu12", "1", {"x/lib/libx.so.1": b})
    (f,) = check_integrity(inv_of(site))
    assert "the bytes on disk are x-cu12 1's" in f.message


@pytest.mark.parametrize("stray", [True, False], ids=["top-level module", "package file"])
def test_a_stray_top_level_module_both_wheels_ship_is_a_warning(tmp_path, stray):
    """flashinfer-python and torch_c_dlpack_ext both ship a top-level ``build_backend.py`` (a build script):
    only ``import build_backend`` reads it; the same clash inside a package is an error."""
    site = site_packages(tmp_path / "venv")
    path = "build_backend.py" if stray else "shared/build_backend.py"
    write_dist(site, "aaa-kernels", "1", {path: "A = 1\n", "aaa/__init__.py": ""})
    write_dist(site, "bbb-ext", "1", {path: "B = 2  # other bytes\n", "bbb/__init__.py": ""})
    (f,) = [x for x in check_integrity(inv_of(site)) if "install the same" in x.message]
    if stray:
        assert f.severity is Severity.WARNING
        assert "only `import build_backend` reads them" in f.cause
    else:
        assert f.severity is Severity.ERROR


@needs_cc
def test_identical_overlaps(tmp_path):
    site = site_packages(tmp_path / "venv")
    lib = compile_so("libshared.so.1")
    write_dist(site, "a", "1", {"nvidia/__init__.py": "", "a/lib/libshared.so.1": lib})
    write_dist(site, "b", "1", {"nvidia/__init__.py": "", "a/lib/libshared.so.1": lib})
    write_dist(site, "c", "1", {"nvidia/__init__.py": ""})
    found = check_integrity(inv_of(site))
    # the namespace __init__.py shared by a, b, c is not worth a word; the identical library is an INFO
    (f,) = found
    assert f.severity is Severity.INFO
    assert "identical bytes" in f.message


@needs_cc
def test_uninstall_of_the_other_variant_deletes_files(tmp_path):
    site = torch_venv(tmp_path)
    write_dist(site, "nvidia-cudnn-cu12", "9.19.0.56", cudnn_files("cu12"))
    # pip uninstall nvidia-cudnn-cu12: deletes every file its RECORD lists, the dist-info too
    for rel in cudnn_files("cu12"):
        (site / rel).unlink()
    shutil.rmtree(site / "nvidia_cudnn_cu12-9.19.0.56.dist-info")
    (f,) = check_integrity(inv_of(site))
    assert f.severity is Severity.ERROR
    assert (
        f.message == "nvidia-cudnn-cu13 9.24.0.43 ships nothing it claims: all 3 file(s) its RECORD lists "
        "are gone, only its dist-info is left"
    )
    assert "most likely by uninstalling another distribution that installs the same paths" in f.cause
    assert "(nvidia-cudnn-cu12 does)" in f.cause
    assert f.fix.endswith("pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43")


@needs_cc
def test_missing_library_names_the_distribution(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "nvidia-nccl-cu13",
        "2.30.7",
        {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2"), "nvidia/nccl/include/nccl.h": "x"},
    )
    (site / "nvidia/nccl/lib/libnccl.so.2").unlink()
    (f,) = check_integrity(inv_of(site))
    assert f.message == "nvidia-nccl-cu13 2.30.7 lists nvidia/nccl/lib/libnccl.so.2 but the file is gone"
    assert "(nvidia-nccl-cu12 does)" in f.cause
    assert "pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7" in f.fix


@needs_cc
def test_ships_nothing_names_an_installed_co_owner(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "old", "1", {"pkg/libp.so.1": compile_so("libp.so.1")})
    write_dist(site, "new", "2", {"pkg/libp.so.1": compile_so("libp.so.1", payload="new")})
    (site / "pkg/libp.so.1").unlink()
    found = check_integrity(inv_of(site))
    nothing = [f for f in found if "ships nothing" in f.message]
    assert {f.subject for f in nothing} == {"old 1", "new 2"}
    assert any("listing the same paths: new 2" in f.cause for f in nothing)


@needs_cc
def test_altered_library(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "p", "1", {"p/libp.so.1": compile_so("libp.so.1")})
    (site / "p/libp.so.1").unlink()
    (site / "p/libp.so.1").write_bytes(compile_so("libp.so.1", payload="patched by hand"))
    (f,) = check_integrity(inv_of(site))
    assert "other bytes than its RECORD lists" in f.message
    assert "matching no RECORD" in f.details[0]


@needs_cc
def test_same_size_alteration_needs_verify_hashes(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "p", "1", {"p/libp.so.1": compile_so("libp.so.1", payload="AAAA")})
    (site / "p/libp.so.1").unlink()
    (site / "p/libp.so.1").write_bytes(compile_so("libp.so.1", payload="BBBB"))
    inv = inv_of(site)
    assert check_integrity(inv) == ()  # sizes agree: not hashed by default
    (f,) = check_integrity(inv, verify_hashes=True)
    assert "other bytes" in f.message


def test_placeholder(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "nvidia-cudnn",
        "0.0.1.dev5",
        {},
        summary="A fake package to warn the user they are not installing the correct package.",
    )
    write_dist(site, "real", "0.0.1.dev5", {"real/__init__.py": "x = 1\n"})
    (f,) = check_integrity(inv_of(site))
    assert f.severity is Severity.WARNING
    assert f.subject == "nvidia-cudnn 0.0.1.dev5"
    assert "placeholder" in f.message


def test_active_requirements_follow_extras_and_markers(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "torch", "1", requires=["meta[cublas]==1", 'skipped; python_version < "2"'])
    write_dist(
        site,
        "meta",
        "1",
        requires=['nvidia-cublas==13.1; extra == "cublas"', 'nvidia-cufft==12; extra == "cufft"', "bad req ((("],
    )
    req = active_requirements(inv_of(site))
    assert [r.dist.name for r in req["meta"]] == ["torch"]
    assert [r.text for r in req["nvidia-cublas"]] == ["nvidia-cublas==13.1"]
    assert "nvidia-cufft" not in req
    assert "skipped" not in req


@needs_cc
@pytest.mark.parametrize(
    ("requires", "expect"),
    [
        pytest.param((), "nothing installed requires any of them", id="neither required"),
        pytest.param(("a", "b"), "more than one is required", id="both required"),
    ],
)
def test_keep_one_when_the_pin_cannot_decide(tmp_path, requires, expect):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "user", "1", requires=list(requires))
    write_dist(site, "a", "1", {"x/libx.so.1": compile_so("libx.so.1")})
    write_dist(site, "b", "1", {"x/libx.so.1": compile_so("libx.so.1", payload="b")})
    found = check_integrity(inv_of(site))
    overlap = next(f for f in found if "install the same" in f.message)
    assert expect in overlap.cause
    # with both required, "user requires a" is also broken: a's library on disk is b's
    assert len(found) == (2 if requires else 1)


@needs_cc
def test_stale_dist_info_of_one_name(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "dup", "1.0", {"dup/libd.so": compile_so("libd.so")})
    write_dist(site, "dup", "2.0", {"dup/libd.so": compile_so("libd.so", payload="v2")})
    found = check_integrity(inv_of(site))
    (f,) = errors(found)
    assert "left over" in f.cause
    assert "the bytes on disk are dup 2.0's" in f.message


def test_outside_site_paths_are_never_hashed(tmp_path):
    site = site_packages(tmp_path / "venv")
    (tmp_path / "venv/bin").mkdir()
    script = "../../../bin/tool"
    write_dist(site, "a", "1", {script: "#!a\n"})
    write_dist(site, "b", "1", {script: "#!b\n"})  # same size, other bytes: only a hash could tell
    (f,) = check_integrity(inv_of(site))
    assert "match no RECORD" in f.message or "not attributable" in " ".join(f.details)


def test_pip_command(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "a", "1", {"a.py": ""})
    inv = inv_of(site)
    assert pip_command(inv.distributions[0]) == "pip"  # no bin/python in this fake venv
    (tmp_path / "venv/bin").mkdir()
    (tmp_path / "venv/bin/python").write_text("")
    assert pip_command(inv.distributions[0]) == f"{tmp_path}/venv/bin/python -m pip"
    plain = tmp_path / "plain"
    plain.mkdir()
    write_dist(plain, "b", "1", {"b.py": ""})
    assert pip_command(inv_of(plain).distributions[0]) == "pip"


@needs_cc
@pytest.mark.parametrize(
    ("requirer", "requirement", "expect"),
    [
        pytest.param(
            "app", "nvidia-nccl-cu13==2.30.7", "app pins nvidia-nccl-cu13==2.30.7 but will load NCCL 2.28.9", id="pin"
        ),
        pytest.param("app", "nvidia-nccl-cu13>=2", "app will load nvidia-nccl-cu12 2.28.9's build of NCCL", id="range"),
    ],
)
def test_broken_pin_wording_is_only_as_strong_as_the_facts(tmp_path, requirer, requirement, expect):
    site = site_packages(tmp_path / "venv")
    write_dist(site, requirer, "1", requires=[requirement])
    write_dist(site, "nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2")})
    write_dist(
        site, "nvidia-nccl-cu12", "2.28.9", {"nvidia/nccl/lib/libnccl.so.2": compile_so("libnccl.so.2", payload="12")}
    )
    pin = next(f for f in check_integrity(inv_of(site)) if f.subject.startswith(f"{requirer} -> "))
    assert expect in pin.cause
    assert "version incompatibility" not in pin.cause  # only torch's cuDNN check is known to say that


@pytest.mark.parametrize(
    "locations",
    [("/s/site", "/s/site"), ("/s/site", "/s/site/", "/s/./site"), ("/s/site", "/s/site/sub"), ("/", "/s/site")],
)
def test_record_path_owners_across_spellings_and_nested_sites(locations):
    """Who lists each absolute path (integrity's overlap input) is Distribution.abspath of every row, whether
    the row is plain, ``./``, ``..`` or absolute, and whether one site directory lies inside another."""
    from pytest_cudastack.wheels.inventory import Distribution, Inventory, RecordEntry
    from pytest_cudastack.wheels.ownership import Listed

    rows = ("sub/a.py", "./sub/a.py", "a.py", "sub/../a.py", "/s/site/sub/a.py", "x/.hidden", "a.py", "../b")
    dists = tuple(
        Distribution(
            name=f"d{i}",
            version="1",
            location=loc,
            dist_info=f"{loc}/d{i}-1.dist-info",
            records=tuple(RecordEntry(r, f"sha256={i}{j}", j) for j, r in enumerate(rows[i % 3 :])),
            libraries=(),
            requires=(),
            cuda_major=None,
            cuda_evidence="",
            problems=(),
        )
        for i, loc in enumerate(locations)
    )
    expected: dict[str, list[tuple[Distribution, RecordEntry]]] = {}
    for d in dists:
        for e in d.records:
            p = d.abspath(e)
            if p is not None and not any(o is d for o, _ in expected.setdefault(p, [])):
                expected[p].append((d, e))
    listed = Listed(Inventory(dists, (), ()))
    assert listed.shared == sorted(p for p, owners in expected.items() if len(owners) > 1)
    assert listed.shared  # every case has one
    for p, owners in expected.items():
        assert [(o.dist, o.entry) for o in listed.get(p)] == owners
