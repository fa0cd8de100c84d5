"""``cudastack loaded MODULE --static`` binds what it predicts (checks/symbols.py ``process_symbol_findings``
over model/process.py's loads) and names first the symbol the loader would report: the first unbound
reference in relocation order (linker/symbols.py ``relocation_order``), not the first by name. gcc-built
stand-ins; the oracle is the real import of them by this interpreter in a child process."""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_cudastack.checks.symbols import extension_symbol_findings, loader_message
from pytest_cudastack.cli.loaded import loaded_libraries, static_document
from pytest_cudastack.linker.resolver import Resolver, SearchConfig
from pytest_cudastack.linker.symbols import read_symbols, relocation_order
from pytest_cudastack.wheels.inventory import installed_wheels
from tests.helpers.elfbuild import CC, needs_cc
from tests.helpers.sitebuild import site_packages, write_dist

pytestmark = needs_cc
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]

# a_call and b_call are called (PLT: DT_JMPREL, in first-call order), z_data is read (GLOB_DAT: DT_RELA):
# by name a_call is first, in relocation order z_data is (DT_RELA before DT_JMPREL)
USER = """
extern int b_call(void);
extern int a_call(void);
extern int z_data;
int user(void) { return b_call() + a_call() + z_data; }
"""
FULL = "int a_call(void) { return 1; }\nint b_call(void) { return 2; }\nint z_data = 3;\nint keep(void) { return 0; }\n"
OLD = "int keep(void) { return 0; }\n"


def _so(build: Path, name: str, source: str, args: Sequence[str] = ()) -> bytes:
    assert CC is not None
    build.mkdir(parents=True, exist_ok=True)
    src = build / (name.replace(".", "_") + ".c")
    src.write_text(source)
    out = build / name
    proc = subprocess.run(
        [CC, "-shared", "-fPIC", "-o", str(out), str(src), *args], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return out.read_bytes()


def _site(tmp_path: Path, *, old: bool, user: str = USER, now: bool = False, two: bool = False) -> Path:
    """``import pkg`` loads ``pkg/_ext`` (RTLD_NOW|RTLD_LOCAL), which needs libuser.so.1, built against a
    libdep.so.1 that defines what it uses; ``old`` installs a libdep.so.1 that lacks them. ``two``: the
    extension needs liba.so.1 then libb.so.1, each with its own unbound reference (one dlopen, two objects)."""
    site = site_packages(tmp_path / "venv")
    build = tmp_path / "build"
    dep = _so(build, "libdep.so.1", FULL, ["-Wl,-soname,libdep.so.1"])
    link = ["-L", str(build), "-l:libdep.so.1", "-Wl,-rpath,$ORIGIN", *(["-Wl,-z,now"] if now else [])]
    files: dict[str, bytes | str] = {
        "pkg/__init__.py": "from . import _ext\n",
        "pkg/libdep.so.1": _so(build / "old", "libdep.so.1", OLD, ["-Wl,-soname,libdep.so.1"]) if old else dep,
    }
    if two:
        for x in "ab":
            source = f"extern int {x}_call(void); int u{x}(void) {{ return {x}_call(); }}\n"
            files[f"pkg/lib{x}.so.1"] = _so(build, f"lib{x}.so.1", source, [f"-Wl,-soname,lib{x}.so.1", *link])
        needs = ["-L", str(build), "-l:liba.so.1", "-l:libb.so.1"]
    else:
        files["pkg/libuser.so.1"] = _so(build, "libuser.so.1", user, ["-Wl,-soname,libuser.so.1", *link])
        needs = ["-L", str(build), "-l:libuser.so.1"]
    files[f"pkg/_ext{SUFFIX}"] = _so(
        build,
        f"_ext{SUFFIX}",
        "int ext_fn(void) { return 0; }\nvoid *PyInit__ext(void) { return 0; }\n",
        ["-Wl,--no-as-needed", *needs, "-Wl,-rpath,$ORIGIN"],
    )
    write_dist(site, "pkg", "1.0", files)
    return site


def _real_error(site: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    _libs, error = loaded_libraries("pkg", site_paths=[str(site)])
    assert error is not None
    return error


def _undefined(text: str) -> str:
    return text.split("undefined symbol: ", 1)[1].split(",")[0].split(";")[0].strip()


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)


def test_relocation_order_is_rela_then_plt_not_by_name(tmp_path: Path):
    lib = tmp_path / "libuser.so.1"
    lib.write_bytes(_so(tmp_path / "b", "libuser.so.1", USER))
    assert relocation_order(lib, ["a_call", "b_call", "z_data", "not_relocated"]) == (
        "z_data",
        "b_call",
        "a_call",
        "not_relocated",
    )


@pytest.mark.parametrize("now", [False, True], ids=["lazy-built", "bind-now-built"])
def test_static_prediction_names_the_symbol_the_real_import_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, now: bool
):
    site = _site(tmp_path, old=True, now=now)
    real = _real_error(site, monkeypatch)
    doc, clean = static_document("pkg", [str(site)])
    assert not clean
    assert "undefined symbol" in doc["error"]
    assert _undefined(doc["error"]) == _undefined(real) == "z_data"
    assert doc["error"].startswith(os.path.realpath(site / "pkg/libuser.so.1"))
    (item,) = doc["unbound"]
    assert item["details"][:3] == ["undefined symbol: z_data", "undefined symbol: b_call", "undefined symbol: a_call"]


def test_functions_only_name_the_first_plt_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Without a data reference the PLT's order decides: b_call is called first, so relocated first."""
    user = "extern int b_call(void);\nextern int a_call(void);\nint user(void) { return b_call() + a_call(); }\n"
    site = _site(tmp_path, old=True, user=user)
    real = _real_error(site, monkeypatch)
    doc, _clean = static_document("pkg", [str(site)])
    assert _undefined(doc["error"]) == _undefined(real) == "b_call"


def test_two_objects_in_one_load_the_last_needed_is_relocated_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """liba.so.1 and libb.so.1 both fail; dl_open_worker relocates l_initfini from its end (libb first)."""
    site = _site(tmp_path, old=True, two=True)
    real = _real_error(site, monkeypatch)
    doc, _clean = static_document("pkg", [str(site)])
    assert _undefined(doc["error"]) == _undefined(real) == "b_call"
    assert [os.path.basename(u["object"]) for u in doc["unbound"]] == ["libb.so.1", "liba.so.1"]


def test_clean_twin_binds_and_exits_zero(tmp_path: Path):
    site = _site(tmp_path, old=False)
    doc, clean = static_document("pkg", [str(site)])
    assert clean, doc.get("error")
    assert doc["unbound"] == []
    assert "error" not in doc


def test_symbols_item_leads_with_the_symbol_the_loader_reports(tmp_path: Path):
    site = _site(tmp_path, old=True)
    inv = installed_wheels([str(site)], reader=None)
    resolver = Resolver(SearchConfig.from_environment({}), owner=inv.owner)
    (finding,) = [f for f in extension_symbol_findings(inv, resolver, read_symbols) if f.severity.name == "ERROR"]
    assert finding.details[0] == "undefined symbol: z_data"
    assert "(undefined symbol: z_data)" in finding.cause
    assert finding.facts.required.split()[0] == "z_data"
    assert loader_message(finding) == f"{os.path.realpath(site / 'pkg/libuser.so.1')}: undefined symbol: z_data"


def test_real_import_error_of_the_stand_in_is_the_dlopen_error(tmp_path: Path):
    """The oracle itself: the child's error is ld.so's message, not the module's init."""
    site = _site(tmp_path, old=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", "import pkg"], env=env, capture_output=True, text=True, check=False)
    assert "undefined symbol: z_data" in proc.stderr


def test_broken_relocation_tables_are_elf_errors_naming_the_file(tmp_path: Path):
    """A truncated or garbled library: relocation_order raises ElfError (the finding falls back to names),
    never a struct or index error."""
    from pytest_cudastack.errors import ElfError

    good = _so(tmp_path / "b", "libuser.so.1", USER)
    for n, data in enumerate((good[: len(good) // 3], good[:64], b"\x7fELF" + b"\xff" * 200, b"not an elf")):
        bad = tmp_path / f"bad{n}.so"
        bad.write_bytes(data)
        with pytest.raises(ElfError, match=str(bad)):
            relocation_order(bad, ["z_data"])
    flipped = bytearray(good)
    for at in range(64, len(flipped), 97):  # garbage through the dynamic table and relocation records
        flipped[at] ^= 0xFF
    bad = tmp_path / "flipped.so"
    bad.write_bytes(bytes(flipped))
    with contextlib.suppress(ElfError):  # an ElfError is fine; any other exception fails the test
        assert set(relocation_order(bad, ["z_data", "a_call"])) == {"z_data", "a_call"}
