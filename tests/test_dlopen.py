"""dlopen knowledge: the data file's validator (shipped file and broken copies), Resolver.dlopen, the strings
reader and its cache, and the ``dlopen`` check on gcc-built stand-ins (clean twin and broken state)."""

from __future__ import annotations

import copy
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from pytest_cudastack.checks import CHECKS
from pytest_cudastack.checks.dlopen import dlopen_findings
from pytest_cudastack.cuda import dlopen as dlopen_mod
from pytest_cudastack.cuda.dlopen import (
    DATA_FILE,
    Miss,
    load_dlopen_targets,
    load_preloads,
    validate_dlopen_targets,
    validate_features,
    validate_preloads,
)
from pytest_cudastack.errors import DataError, ElfError
from pytest_cudastack.findings import Severity
from pytest_cudastack.linker import strings as strings_mod
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.linker.elfcache import ElfCache
from pytest_cudastack.linker.ldcache import LdCache, LdCacheEntry
from pytest_cudastack.linker.resolver import Resolver, Route, SearchConfig
from pytest_cudastack.linker.strings import StringFacts, read_strings
from pytest_cudastack.model.modules import module_trees
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

needs_cc = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
EXT = "_C.cpython-311-x86_64-linux-gnu.so"


def _shipped() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(resources.files("pytest_cudastack.cuda").joinpath(DATA_FILE).read_text())
    return raw


# ------------------------------------------------------------------------------------------ the data file


def test_shipped_file_validates_and_has_the_issue_rows():
    rows = load_dlopen_targets()
    callers = {
        "libcudnn.so.9": "libcudnn_graph.so.9",
        "libcudnn_cnn_infer.so.8": "libnvrtc.so",
        "libcudnn.so.8": "libcudnn_cnn_infer.so.8",
        "libcudart.so.13": "libcuda.so.1",
        "onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so": "libonnxruntime_providers_cuda.so",
    }
    for caller, target in callers.items():
        hits = [r.targets(m) for r in rows if (m := r.match(caller)) is not None]
        assert any(target in t for t in hits), caller
    nvrtc = next(r for r in rows if r.match("libnvrtc.so.13"))
    m = nvrtc.match("libnvrtc.so.13")
    assert m is not None
    assert nvrtc.targets(m, ["libnvrtc-builtins.so.13.0", "libnvrtc-builtins.so.12.9", "libcuda.so.1"]) == (
        "libnvrtc-builtins.so.13.0",
    )
    assert {r.miss for r in rows} >= {Miss.FATAL, Miss.FALLBACK}


def test_every_row_cites_a_listed_source_with_its_words():
    raw = _shipped()
    for row in raw["targets"]:
        meta = raw["sources"][row["source"]]
        assert meta["url"].startswith("https://")
        assert meta["says"]


def _broken(edit: Any) -> dict[str, Any]:
    raw = copy.deepcopy(_shipped())
    edit(raw)
    return raw


def _row0(key: str, value: Any) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        raw["targets"][0][key] = value

    return edit


def _drop0(key: str) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        del raw["targets"][0][key]

    return edit


BROKEN = [
    pytest.param(lambda r: r.update(schema=2), "unsupported schema", id="schema"),
    pytest.param(lambda r: r.update(extra=1), "unknown top-level", id="top-level key"),
    pytest.param(lambda r: r.update(sources={}), "'sources' must be a non-empty", id="no sources"),
    pytest.param(lambda r: r["sources"]["sdnext-539"].pop("says"), "needs 'url', 'retrieved'", id="source words"),
    pytest.param(lambda r: r.update(targets=[]), "'targets' must be a non-empty list", id="no rows"),
    pytest.param(_row0("source", "nowhere"), "is not listed in 'sources'", id="unlisted source"),
    pytest.param(_row0("bogus", 1), "targets[0].bogus: not allowed here", id="row key"),
    pytest.param(_row0("caller", "lib(["), "not a valid regex", id="bad regex"),
    pytest.param(_row0("names", ["libx.so.{minor}"]), "not a named group of 'caller'", id="template group"),
    pytest.param(_row0("names", ["../libx.so"]), "not a library file name", id="name with slash"),
    pytest.param(_row0("search", "ldconfig"), "'search' must be 'dlopen' or 'paths'", id="search"),
    pytest.param(_row0("search", "paths"), "needs 'paths'", id="paths missing"),
    pytest.param(_row0("paths", ["$ORIGIN"]), "only for search 'paths'", id="paths on dlopen"),
    pytest.param(_row0("miss", "maybe"), "'miss' must be one of", id="miss"),
    pytest.param(_row0("miss", "fallback"), "'fallback' (what happens instead)", id="fallback unsaid"),
    pytest.param(_row0("fallback", "CPU"), "'fallback' (what happens instead)", id="fallback on fatal"),
    pytest.param(_row0("names", []), "needs 'names' or 'strings'", id="no targets"),
    pytest.param(lambda r: r["targets"].append(dict(r["targets"][0])), "targets[7]: duplicate row", id="duplicate"),
    pytest.param(_drop0("source"), "is not listed in 'sources'", id="no source"),
    # the types are the schema's (check_data), before any row rule runs
    pytest.param(lambda r: r["targets"].__setitem__(0, 1), "targets[0]: expected object", id="row not an object"),
    pytest.param(lambda r: r.update(targets={}), "targets: expected array", id="rows not a list"),
    pytest.param(_row0("caller", 1), "targets[0].caller: expected string", id="caller not a string"),
    pytest.param(_row0("caller", ""), "'caller' must be a non-empty regex", id="empty caller"),
    pytest.param(_row0("names", "libx.so"), "targets[0].names: expected array", id="names not a list"),
    pytest.param(_row0("names", [""]), "'names' must be a list of non-empty strings", id="empty name"),
    pytest.param(_row0("paths", "lib"), "targets[0].paths: expected array", id="paths not a list"),
    pytest.param(_row0("fallback", 1), "targets[0].fallback: expected string", id="fallback not a string"),
    pytest.param(_row0("note", 1), "targets[0].note: expected string", id="note not a string"),
]


def _feature0(key: str, value: Any) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        raw["features"][0][key] = value

    return edit


BROKEN_FEATURES = [
    pytest.param(_feature0("caller", "lib(["), "features[0]: 'caller' is not a valid regex", id="bad regex"),
    pytest.param(_feature0("when", " "), "features[0]: 'when' must say", id="empty when"),
    pytest.param(_feature0("source", "nowhere"), "is not listed in 'sources'", id="unlisted source"),
    pytest.param(_feature0("bogus", 1), "features[0].bogus: not allowed here", id="row key"),
    pytest.param(lambda r: r["features"].append(dict(r["features"][0])), "duplicate row", id="duplicate"),
]


def test_shipped_features_say_when_cupti_loads():
    rows = validate_features(_shipped())
    cupti = [f for f in rows if f.matches("libcupti.so.12")]
    assert len(cupti) == 1
    assert "profiler session" in cupti[0].when
    assert not any(f.matches("libcudnn.so.9") for f in rows)


@pytest.mark.parametrize(("edit", "expected"), BROKEN_FEATURES)
def test_feature_validator_rejects_broken_copies(edit: Any, expected: str):
    with pytest.raises(DataError) as info:
        validate_features(_broken(edit), "broken.json")
    assert str(info.value).startswith("broken.json")
    assert expected in str(info.value)


@pytest.mark.parametrize(("edit", "expected"), BROKEN)
def test_validator_rejects_broken_copies(edit: Any, expected: str):
    with pytest.raises(DataError) as info:
        validate_dlopen_targets(_broken(edit), "broken.json")
    assert str(info.value).startswith("broken.json")
    assert expected in str(info.value)


def _clear() -> None:
    load_dlopen_targets.cache_clear()
    load_preloads.cache_clear()
    dlopen_mod._shipped.cache_clear()


def test_load_names_the_file_on_bad_json(monkeypatch: pytest.MonkeyPatch):
    _clear()
    monkeypatch.setattr(json, "loads", lambda *_a, **_k: (_ for _ in ()).throw(ValueError("boom")))
    try:
        with pytest.raises(DataError, match=r"data/dlopen_targets.json: cannot read"):
            load_dlopen_targets()
    finally:
        monkeypatch.undo()
        _clear()


def test_shipped_preloads_are_torchs():
    rows = load_preloads()
    assert [(r.module, r.kind, r.flags) for r in rows[:2]] == [
        ("torch", "path", "RTLD_GLOBAL"),
        ("torch", "sys_path", "RTLD_LOCAL"),
    ]
    assert ("cuda_nvrtc", "libnvrtc-builtins.so.*[0-9]") in rows[1].libraries


def test_shipped_preloads_of_cupy_and_jax():
    """cupy's pathfinder loads (RTLD_GLOBAL, before each cupy_backends.cuda.libs submodule, dependencies first,
    pathfinder's directory order) and jax's CUDA plugin ``initialize`` (RTLD_LOCAL, before its extension)."""
    rows = {(r.module, r.before_import[0]): r for r in load_preloads() if r.before_import}
    cublas = rows["cupy_backends.cuda.libs", "cupy_backends.cuda.libs.cublas"]
    assert (cublas.flags, cublas.order, cublas.unless_loaded) == ("RTLD_GLOBAL", "dirs", True)
    assert cublas.dirs == ("nvidia/cu13/lib", "nvidia/{folder}/lib")
    assert [g for _, g in cublas.libraries] == ["libcublasLt.so.1[23]", "libcublas.so.1[23]"]
    cusolver = rows["cupy_backends.cuda.libs", "cupy_backends.cuda.libs.cusolver"]
    assert [g.split(".so")[0] for _, g in cusolver.libraries] == [
        "libnvJitLink",
        "libcusparse",
        "libcublasLt",
        "libcublas",
        "libcusolver",
    ]
    jax = rows["jax_plugins.xla_cuda13", "jax_cuda13_plugin.cuda_plugin_extension"]
    assert (jax.at, jax.flags, jax.order) == ("initialize", "RTLD_LOCAL", "entries")
    assert ("cu13", "libcudart.so.13") in jax.libraries
    assert ("cudnn", "libcudnn.so.9") in jax.libraries


def _pre0(key: str, value: Any) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        raw["preloads"][0][key] = value

    return edit


BROKEN_PRELOADS = [
    pytest.param(lambda r: r.update(preloads={}), "preloads: expected array", id="not a list"),
    pytest.param(_pre0("source", "nowhere"), "is not listed in 'sources'", id="unlisted source"),
    pytest.param(_pre0("bogus", 1), "preloads[0].bogus: not allowed here", id="key"),
    pytest.param(
        _pre0("flags", "RTLD_LAZY"), "preloads[0].flags: expected one of 'RTLD_GLOBAL', 'RTLD_LOCAL'", id="flags"
    ),
    pytest.param(_pre0("path", "../../evil.so"), "inside it", id="path escapes"),
    pytest.param(_pre0("kind", "env"), "'kind' must be 'path' or 'sys_path'", id="kind"),
    pytest.param(_pre0("at", ""), "'at' must be a non-empty string", id="no trigger"),
    pytest.param(lambda r: r["preloads"][1].update(libraries=[["x"]]), "[folder, glob] pairs", id="pairs"),
    pytest.param(lambda r: r["preloads"][1].pop("cuda_major"), "'cuda_major' is not given", id="major"),
    pytest.param(
        lambda r: r["preloads"][1].update(dirs=["nvidia/{0}/lib"]), "allowed fields: {cuda_major}, {folder}", id="dirs"
    ),
    pytest.param(lambda r: r["preloads"][1].update(dirs=["nvidia/{folder/lib"]), "is not a template", id="brace"),
    pytest.param(_pre0("before_import", "cupy"), "preloads[0].before_import: expected array", id="before not a list"),
    pytest.param(_pre0("before_import", ["a..b"]), "dotted module names", id="before bad name"),
    pytest.param(_pre0("order", "random"), "preloads[0].order: expected one of 'entries', 'dirs'", id="order"),
    pytest.param(_pre0("unless_loaded", "yes"), "preloads[0].unless_loaded: expected boolean", id="unless_loaded"),
]


@pytest.mark.parametrize(("edit", "expected"), BROKEN_PRELOADS)
def test_preload_validator_rejects_broken_copies(edit: Any, expected: str):
    with pytest.raises(DataError) as info:
        validate_preloads(_broken(edit), "broken.json")
    assert str(info.value).startswith("broken.json")
    assert expected in str(info.value)


def test_registered_always_on():
    check = CHECKS["dlopen"]
    assert check.enabled(type("O", (), {"cudastack": True})())  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ strings


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@needs_cc
def test_strings_found_in_rodata(tmp_path: Path):
    so = _write(tmp_path / "libx.so", compile_so("libx.so.1", payload="libfancy.so.3"))
    facts = read_strings(str(so))
    assert "libfancy.so.3" in facts.names
    assert not facts.truncated
    assert "libx.so.1" not in facts.names  # .dynstr is not read-only data


@needs_cc
def test_strings_split_by_a_chunk_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    so = _write(tmp_path / "libx.so", compile_so("libx.so.1", payload="libsplitacrosschunks.so.42"))
    whole = read_strings(str(so)).names
    for chunk in (3, 7, 16):
        monkeypatch.setattr(strings_mod, "_CHUNK", chunk)
        assert read_strings(str(so)).names == whole


@needs_cc
def test_strings_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    so = _write(tmp_path / "libx.so", compile_so("libx.so.1", payload="libfancy.so.3"))
    monkeypatch.setattr(strings_mod, "MAX_SCAN", 4)
    assert read_strings(str(so)).truncated


def test_strings_of_non_elf(tmp_path: Path):
    bad = _write(tmp_path / "libnot.so", b"hello\0libfancy.so.3\0")
    with pytest.raises(ElfError, match="not an ELF file"):
        read_strings(str(bad))
    with pytest.raises(ElfError, match="cannot open"):
        read_strings(str(tmp_path / "absent.so"))


@pytest.mark.parametrize(
    "raw",
    [None, {}, {"path": "x", "names": ["../evil"], "truncated": False}, {"path": 1, "names": [], "truncated": False}],
)
def test_string_facts_from_json_rejects(raw: Any):
    with pytest.raises(ElfError):
        StringFacts.from_json(raw)


@needs_cc
def test_strings_cached_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    so = _write(tmp_path / "libx.so", compile_so("libx.so.1", payload="libfancy.so.3"))
    calls: list[str] = []
    real = strings_mod.read_strings

    def counting(path: str) -> StringFacts:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(strings_mod, "read_strings", counting)
    cache = ElfCache(str(tmp_path / "cache"), enabled=True)
    first = cache.read_strings(str(so))
    cache.flush()
    again = ElfCache(str(tmp_path / "cache"), enabled=True).read_strings(str(so))
    assert first == again
    assert calls == [str(so)]


# ------------------------------------------------------------------------------------------ Resolver.dlopen


def _resolver(**kw: Any) -> Resolver:
    return Resolver(SearchConfig(default_dirs=(), **kw), reader=read_elf)


@needs_cc
def test_dlopen_runpath_and_rpath_chain(tmp_path: Path):
    caller = _write(tmp_path / "a/lib/libcaller.so.1", compile_so("libcaller.so.1", runpath="$ORIGIN/../plug"))
    target = _write(tmp_path / "a/plug/libplug.so.1", compile_so("libplug.so.1"))
    lib = _resolver().dlopen("libplug.so.1", str(caller))
    assert lib.realpath == str(target.resolve())
    assert lib.route is Route.RUNPATH
    # no path of its own: found only through the RPATH of the object that loaded it
    bare = _write(tmp_path / "b/libbare.so.1", compile_so("libbare.so.1"))
    loader = _write(tmp_path / "b/libloader.so.1", compile_so("libloader.so.1", rpath=str(tmp_path / "a/plug")))
    assert _resolver().dlopen("libplug.so.1", str(bare)).path is None
    chained = _resolver().dlopen("libplug.so.1", str(bare), loaders=[str(loader)])
    assert chained.realpath == str(target.resolve())
    assert chained.route is Route.RPATH


@needs_cc
def test_dlopen_already_loaded_by_soname(tmp_path: Path):
    caller = _write(tmp_path / "libcaller.so.1", compile_so("libcaller.so.1"))
    elsewhere = _write(tmp_path / "other/libplug.so.1", compile_so("libplug.so.1"))
    lib = _resolver().dlopen("libplug.so.1", str(caller), loaded=[str(elsewhere)])
    assert lib.route is Route.ALREADY_LOADED
    assert lib.path == str(elsewhere)


@needs_cc
def test_dlopen_unversioned_name_vs_cache_keyed_by_soname(tmp_path: Path):
    real = _write(tmp_path / "cuda/lib/libnvrtc.so.12", compile_so("libnvrtc.so.12"))
    cache = LdCache("/etc/ld.so.cache", (LdCacheEntry("libnvrtc.so.12", str(real), 0x303, 0),), "new")
    caller = _write(tmp_path / "libcudnn_cnn_infer.so.8", compile_so("libcudnn_cnn_infer.so.8"))
    r = _resolver(ld_cache=cache)
    assert r.dlopen("libnvrtc.so.12", str(caller)).route is Route.LD_CACHE
    miss = r.dlopen("libnvrtc.so", str(caller))
    assert miss.path is None  # ldconfig keys the cache by SONAME: the development name is no key


# ------------------------------------------------------------------------------------------ the check


def _check(site: Path, **kw: Any) -> list[Any]:
    inv = installed_wheels([str(site)], reader=read_elf)
    resolver = Resolver(SearchConfig(default_dirs=(), **kw), reader=read_elf, owner=inv.owner)
    return list(dlopen_findings(inv, resolver, read_elf, read_strings, module_trees(inv, resolver)))


CUDNN_SUBS = ["graph", "ops", "cnn", "adv", "engines_precompiled", "engines_runtime_compiled", "heuristic"]


def _cudnn_site(tmp_path: Path, subs: list[str]) -> Path:
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "torchish",
        "1.0",
        {
            f"torchish/{EXT}": compile_so(
                None, pyinit="_C", needed=["libcudnn.so.9"], rpath="$ORIGIN/../nvidia/cudnn/lib"
            )
        },
    )
    files = {"nvidia/cudnn/lib/libcudnn.so.9": compile_so("libcudnn.so.9", rpath="$ORIGIN")}
    # RPATH $ORIGIN as the wheel's own: an object dlopen maps has no loader whose RPATH would find its peers
    for s in subs:
        files[f"nvidia/cudnn/lib/libcudnn_{s}.so.9"] = compile_so(f"libcudnn_{s}.so.9", rpath="$ORIGIN")
    write_dist(site, "nvidia-cudnn-cu13", "9.24.0.43", files)
    return site


@needs_cc
def test_cudnn_sub_libraries_clean_twin(tmp_path: Path):
    found = _check(_cudnn_site(tmp_path, CUDNN_SUBS))
    assert not [f for f in found if f.severity is not Severity.INFO], [f.render() for f in found]


@needs_cc
def test_cudnn_sub_library_missing_is_an_error_naming_the_caller(tmp_path: Path):
    found = _check(_cudnn_site(tmp_path, [s for s in CUDNN_SUBS if s != "ops"]))
    errors = [f for f in found if f.failing]
    assert [f.subject for f in errors] == ["libcudnn_ops.so.9"]
    assert "by nvidia/cudnn/lib/libcudnn.so.9" in errors[0].message
    assert "cudnn9-overview" in errors[0].details[0]
    # nothing installed provides it: advice by hand, not a command offered as checked
    assert errors[0].fix.startswith("no safe automatic repair is known: nothing installed here provides it")


@needs_cc
def test_nvrtc_builtins_found_only_through_the_loader_rpath(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    lib = "$ORIGIN/../nvidia/cu13/lib"
    write_dist(
        site,
        "torchish",
        "1.0",
        {f"torchish/{EXT}": compile_so(None, pyinit="_C", needed=["libnvrtc.so.13"], rpath=lib)},
    )
    files = {
        "nvidia/cu13/lib/libnvrtc.so.13": compile_so("libnvrtc.so.13", payload="libnvrtc-builtins.so.13.0"),
        "nvidia/cu13/lib/libnvrtc-builtins.so.13.0": compile_so("libnvrtc-builtins.so.13.0"),
    }
    write_dist(site, "nvidia-cuda-nvrtc", "13.0.88", files)
    assert not [f for f in _check(site) if f.failing]
    (site / "nvidia/cu13/lib/libnvrtc-builtins.so.13.0").unlink()
    errors = [f for f in _check(site) if f.failing]
    assert [f.subject for f in errors] == ["libnvrtc-builtins.so.13.0"]


@needs_cc
def test_cudnn8_unversioned_nvrtc_wrong_version_and_miss(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "torchish",
        "1.0",
        {f"torchish/{EXT}": compile_so(None, pyinit="_C", needed=["libcudnn_cnn_infer.so.8"], rpath="$ORIGIN/lib")},
    )
    write_dist(
        site,
        "cudnnish",
        "8.9",
        {
            "torchish/lib/libcudnn_cnn_infer.so.8": compile_so(
                "libcudnn_cnn_infer.so.8", needed=["libcublas.so.11"], rpath="$ORIGIN"
            ),
            "torchish/lib/libcublas.so.11": compile_so("libcublas.so.11"),
        },
    )
    errors = [f for f in _check(site) if f.failing]
    assert [f.subject for f in errors] == ["libnvrtc.so"]
    assert "not found" in errors[0].message
    # a toolkit's development symlink of another CUDA: found, but of CUDA 12 for a CUDA 11 caller
    _write(site / "torchish/lib/libnvrtc.so", compile_so("libnvrtc.so.12"))
    errors = [f for f in _check(site) if f.failing]
    assert len(errors) == 1
    assert "built for CUDA 12" in errors[0].message
    assert "CUDA 11" in errors[0].message
    assert errors[0].remedies[0].why.startswith("no safe automatic repair is known: the right build is not installed")


@needs_cc
def test_onnxruntime_provider_miss_is_a_warning_naming_the_fallback(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    capi = "onnxruntime/capi"
    files = {
        f"{capi}/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so": compile_so(
            None, pyinit="onnxruntime_pybind11_state"
        ),
        f"{capi}/libonnxruntime_providers_shared.so": compile_so(None),
        f"{capi}/libonnxruntime_providers_cuda.so": compile_so(None, payload="cuda provider"),
    }
    write_dist(site, "onnxruntime-gpu", "1.22.0", files)
    assert not [f for f in _check(site) if f.severity is Severity.WARNING]
    (site / capi / "libonnxruntime_providers_cuda.so").unlink()
    warnings = [f for f in _check(site) if f.severity is Severity.WARNING]
    assert [f.subject for f in warnings] == ["libonnxruntime_providers_cuda.so"]
    assert "silent fallback" in warnings[0].message
    assert "CPU" in warnings[0].message


@needs_cc
def test_string_discovered_names_are_info(tmp_path: Path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "pkg",
        "1.0",
        {
            f"pkg/{EXT}": compile_so(None, pyinit="_C", needed=["libhelper.so.1"], rpath="$ORIGIN"),
            "pkg/libhelper.so.1": compile_so("libhelper.so.1", payload="libfancyplugin.so.3"),
        },
    )
    found = _check(site)
    assert not [f for f in found if f.severity is not Severity.INFO]
    info = [f for f in found if "may load at run time" in f.message]
    assert len(info) == 1
    assert "pkg/libhelper.so.1 may load libfancyplugin.so.3 (not found)" in info[0].details
    assert info[0].where  # where the search looked
    assert all(os.path.isdir(d) for d in info[0].where)
    assert info[0].message.startswith("1 library name(s) in the read-only data of its libraries")
    _write(site / "pkg/libfancyplugin.so.3", compile_so("libfancyplugin.so.3"))
    _write(site / "pkg/libhelper.so.1", compile_so("libhelper.so.1", payload="libfancyplugin.so.3", rpath="$ORIGIN"))
    assert not [f for f in _check(site) if "may load at run time" in f.message]


@needs_cc
def test_tree_with_loaded_objects_matches_them_without_resolving_them(tmp_path: Path):
    """``Resolver.tree(loaded=)``: an object already in the process satisfies a DT_NEEDED by its soname, and its
    own (here: unresolvable) needs are not the new object's."""
    mapped = _write(tmp_path / "elsewhere/libdep.so.1", compile_so("libdep.so.1", needed=["libgone.so.7"]))
    module = _write(tmp_path / "pkg/_m.so", compile_so(None, needed=["libdep.so.1"]))
    r = _resolver()
    alone = r.tree(str(module))
    assert "libdep.so.1" in {x.soname for x in alone.missing}
    ctx = r.tree(str(module), loaded=[str(mapped)])
    assert [(x.soname, x.route) for x in ctx.libraries if x.soname.startswith("lib")][:1] == [
        ("libdep.so.1", Route.ALREADY_LOADED)
    ]
    assert not [x for x in ctx.missing if x.soname in ("libdep.so.1", "libgone.so.7")]
    with_preload = r.tree(str(module), preloaded=[str(mapped)])
    assert "libgone.so.7" in {x.soname for x in with_preload.missing}  # LD_PRELOAD-like: resolved too


@needs_cc
def test_string_discovered_unversioned_name_beside_a_versioned_file(tmp_path: Path):
    """cuDNN writes ``libcudnn_ext.so`` and appends its major: with ``libcudnn_ext.so.9`` beside the caller the
    note says so instead of a bare "not found"."""
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "pkg",
        "1.0",
        {
            f"pkg/{EXT}": compile_so(None, pyinit="_C", needed=["libhelper.so.1"], rpath="$ORIGIN"),
            "pkg/libhelper.so.1": compile_so("libhelper.so.1", payload="libcudnn_ext.so"),
            "pkg/libcudnn_ext.so.9": compile_so("libcudnn_ext.so.9"),
        },
    )
    (info,) = [f for f in _check(site) if "may load at run time" in f.message]
    assert "pkg/libhelper.so.1 may load libcudnn_ext.so (not found as written; libcudnn_ext.so.9 is beside it)" in (
        info.details
    )


def test_a_template_on_an_optional_group_that_did_not_match_names_nothing():
    """``libbar.so.{major}`` from a caller pattern whose ``major`` group is optional: a caller without the
    version opens nothing by that template (a KeyError before)."""
    raw = _broken(lambda r: None)
    raw["targets"][0]["caller"] = r"^libfoo\.so(?:\.(?P<major>\d+))?$"
    raw["targets"][0]["names"] = ["libbar.so.{major}", "libbaz.so"]
    raw["targets"][0].pop("strings", None)
    row = validate_dlopen_targets(raw, "t.json")[0]
    m = row.match("libfoo.so", "libfoo.so")
    assert m is not None
    assert row.targets(m) == ("libbaz.so",)


def test_strings_never_read_a_header_table_a_hostile_entry_size_inflates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """e_shentsize 0xFFFF x e_shnum 0xFEFF in a sparse 4.3 GB file: the table is not read (it would be
    4.3 GB); the file is scanned as one without section headers."""
    import struct

    from tests.helpers.elfbuild import synth_elf

    path = tmp_path / "libhostile.so"
    data = bytearray(synth_elf(tmp_path / "seed.so", elf_class=64, little=True).read_bytes())
    struct.pack_into("<Q", data, 0x28, 64)  # e_shoff
    struct.pack_into("<HHH", data, 0x3A, 0xFFFF, 0xFEFF, 0)  # e_shentsize, e_shnum, e_shstrndx
    path.write_bytes(bytes(data))
    os.truncate(path, 64 + 0xFFFF * 0xFEFF + 1)  # sparse: costs no disk
    asked: list[int] = []
    real = os.pread

    def spy(fd: int, n: int, off: int) -> bytes:
        asked.append(n)
        return real(fd, min(n, 1 << 20), off)

    monkeypatch.setattr(strings_mod.os, "pread", spy)
    strings_mod.read_strings(str(path))
    assert max(asked) <= 1 << 24
