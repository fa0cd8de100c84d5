from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_cudastack.findings import Severity
from pytest_cudastack.linker.elf import read_elf
from pytest_cudastack.wheels.inventory import (
    Distribution,
    install_prefix,
    installed_wheels,
    is_shared_lib_path,
    record_abspath,
    site_dirs,
)
from tests.helpers.sitebuild import HAVE_CC, compile_so, site_packages, write_dist

needs_cc = pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")


def inv_of(*sites: Path):
    return installed_wheels([str(s) for s in sites], reader=read_elf)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("nvidia/cudnn/lib/libcudnn.so.9", True, id="versioned"),
        pytest.param("torch/_C.cpython-311-x86_64-linux-gnu.so", True, id="extension"),
        pytest.param("nvidia/nccl/lib/libnccl.so.2.30.7", True, id="long version"),
        pytest.param("nvidia/nccl/lib/libnccl_device.bc", False, id="bitcode"),
        pytest.param("foo/so/bar.py", False, id="so dir"),
        pytest.param("foo/libx.sox", False, id="not so"),
    ],
)
def test_is_shared_lib_path(path, expected):
    assert is_shared_lib_path(path) is expected


def test_distribution_key_is_the_pep503_name():
    dist = Distribution("Nvidia_CUDNN.cu12", "1", "/s", "/s/x-1.dist-info", (), (), (), None, "", ())
    assert dist.key == "nvidia-cudnn-cu12"


def test_install_prefix_and_record_paths(tmp_path):
    site = site_packages(tmp_path / "venv")
    assert install_prefix(str(site)) == str(tmp_path / "venv")
    assert record_abspath(str(site), "a/b.py") == str(site / "a/b.py")
    assert record_abspath(str(site), "../../../bin/torchrun") == str(tmp_path / "venv/bin/torchrun")
    assert record_abspath(str(site), "../../../../etc/passwd") is None
    assert record_abspath(str(site), "/etc/passwd") is None
    assert record_abspath(str(site), str(site / "x.py")) == str(site / "x.py")
    other = tmp_path / "plain"
    other.mkdir()
    assert install_prefix(str(other)) == str(other)
    assert record_abspath(str(other), "../x") is None


@needs_cc
def test_distribution_fields(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "nvidia-foo-cu13",
        "1.2.3",
        {
            "nvidia/foo/lib/libfoo.so.1": compile_so("libfoo.so.1"),
            "nvidia/foo/__init__.py": "",
            "nvidia/foo/lib/libcheckpoint.so": compile_so("libcheckpoint.so"),
        },
        requires=['bar==1; platform_system == "Linux"'],
        summary="Foo runtime",
    )
    write_dist(
        site,
        "Bar_Pkg",
        "1",
        {"bar/_ext.cpython-311-x86_64-linux-gnu.so": compile_so(None, pyinit="_ext", needed=["libfoo.so.1"])},
    )
    inv = inv_of(site)
    assert inv.findings == ()
    assert inv.site_dirs == (str(site),)
    foo = inv.get("NVIDIA_foo.cu13")
    assert foo is not None
    assert (foo.name, foo.version, foo.location, foo.summary) == ("nvidia-foo-cu13", "1.2.3", str(site), "Foo runtime")
    assert foo.requires == ('bar==1; platform_system == "Linux"',)
    assert foo.label == "nvidia-foo-cu13 1.2.3"
    libs = {os.path.basename(lib.path): lib for lib in foo.libraries}
    assert set(libs) == {"libfoo.so.1", "libcheckpoint.so"}
    assert libs["libfoo.so.1"].soname == "libfoo.so.1"
    assert libs["libfoo.so.1"].exists
    assert libs["libcheckpoint.so"].pyinit is None  # a .so suffix alone does not make a module
    bar = inv.get("bar-pkg")
    assert bar is not None
    (ext,) = bar.libraries
    assert ext.pyinit == "PyInit__ext"
    assert ext.soname is None
    # owner / shipping
    assert inv.owner(str(site / "nvidia/foo/lib/libfoo.so.1")) == "nvidia-foo-cu13 1.2.3"
    assert inv.owner(str(site / "bar/../nvidia/foo/lib/libfoo.so.1")) == "nvidia-foo-cu13 1.2.3"
    assert inv.owner(str(site / "nowhere.so")) is None
    ((dist, path),) = inv.shipping("libfoo.so.1")
    assert dist is foo
    assert path == str(site / "nvidia/foo/lib/libfoo.so.1")
    assert inv.shipping("libnothing.so.1") == ()
    assert isinstance(foo.cuda_evidence, str)
    assert foo.to_json()["name"] == "nvidia-foo-cu13"


def test_owner_through_symlinked_lib64(tmp_path):
    prefix = tmp_path / "venv"
    site = site_packages(prefix)
    (prefix / "lib64").symlink_to("lib")
    write_dist(site, "pkg", "1", {"pkg/__init__.py": ""})
    inv = installed_wheels([str(site), str(prefix / "lib64/python3.11/site-packages")], reader=read_elf)
    assert len(inv.site_dirs) == 1  # the same directory twice is looked at once
    assert inv.owner(str(prefix / "lib64/python3.11/site-packages/pkg/__init__.py")) == "pkg 1"


def test_missing_library_is_listed_not_read(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": b"x" * 10}, write_files=False)
    inv = inv_of(site)
    (lib,) = inv.get("nvidia-nccl-cu13").libraries
    assert (lib.exists, lib.soname, lib.size) == (False, None, None)
    assert inv.shipping("libnccl.so.2")[0][1] == lib.path  # claimed by file name even when gone


def test_not_an_elf_and_fifo_do_not_crash(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "junk", "1", {"junk/libjunk.so": "not an elf"})
    fifo = site / "junk/libfifo.so.1"
    os.mkfifo(fifo)
    dist_info = site / "junk-1.dist-info"
    with open(dist_info / "RECORD", "a") as f:
        f.write("junk/libfifo.so.1,,\n")
    inv = inv_of(site)
    libs = {os.path.basename(lib.path): lib for lib in inv.get("junk").libraries}
    assert libs["libjunk.so"].exists
    assert libs["libjunk.so"].problem
    assert libs["libfifo.so.1"].problem == "not a regular file"


def test_bad_input_becomes_findings(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(
        site,
        "badrec",
        "1",
        {"badrec/__init__.py": ""},
        extra_rows=[
            "only-one-field",
            "badrec/x.py,sha256=abc,notanumber",
            "badrec/y.py,md5nohash,3",
            "/etc/passwd,,",
            "../../../../../etc/shadow,,",
            "../../../bin/badrec-script,sha256=abc,12",
            '"unterminated,quote',
        ],
    )
    write_dist(site, "nometa", "2", {"nometa.py": ""}, metadata="")
    norecord = write_dist(site, "norecord", "3", {"norecord.py": ""})
    (norecord.dist_info / "RECORD").unlink()
    (site / "emptymeta-1.dist-info").mkdir()
    (site / "emptymeta-1.dist-info" / "METADATA").write_text("garbage without headers\n")
    inv = inv_of(site)
    by_name = {d.name: d for d in inv.distributions}
    bad = by_name["badrec"]
    text = "\n".join(bad.problems)
    assert "expected 3 fields" in text
    assert "'notanumber' is not a byte count" in text
    assert "not '<algorithm>=<digest>'" in text
    assert "outside the install prefix" in text
    assert "/etc/passwd" in text
    assert "badrec-script" not in text  # a script entry inside the prefix is legitimate
    assert "no readable METADATA" in by_name["nometa"].problems[0]
    assert by_name["nometa"].version == "2"
    assert "no readable RECORD" in by_name["norecord"].problems[0]
    assert by_name["emptymeta"].version == "1"
    assert all(f.check == "integrity" and f.severity is Severity.WARNING for f in inv.findings)
    subjects = {f.subject for f in inv.findings}
    assert {"badrec 1", "nometa 2", "norecord 3", "emptymeta 1"} <= subjects


def test_unreadable_dist_info_dir(tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "locked", "1", {"locked.py": ""})
    d = site / "locked-1.dist-info"
    d.chmod(0)
    try:
        inv = inv_of(site)
    finally:
        d.chmod(0o755)
    (dist,) = inv.distributions
    if os.geteuid() != 0:  # root reads anyway
        assert dist.problems


def test_duplicates_same_dir_and_shadowed(tmp_path):
    site = site_packages(tmp_path / "venv")
    user = tmp_path / "user-site"
    user.mkdir()
    write_dist(site, "dup", "1.0", {"dup/__init__.py": "a"})
    write_dist(site, "dup", "2.0", {"dup/__init__.py": "b"})
    write_dist(user, "shadow", "1", {"shadow.py": ""})
    write_dist(site, "shadow", "2", {"shadow.py": ""})
    inv = inv_of(user, site)
    msgs = {f.subject: f for f in inv.findings}
    assert "installed 2 times" in msgs["dup"].message
    assert "left over" in msgs["dup"].cause
    assert "shadowed" in msgs["shadow"].cause
    assert inv.get("shadow").version == "1"  # first in search order
    assert len(inv.all_named("dup")) == 2


def test_pth_added_dirs(tmp_path):
    site = site_packages(tmp_path / "venv")
    extra = tmp_path / "extra"
    extra.mkdir()
    write_dist(extra, "fromp th".replace(" ", ""), "1", {"x.py": ""})
    (site / "a.pth").write_text(f"# comment\nimport os; os.environ['CUDASTACK_PTH_RAN']='1'\n{extra}\nmissing-dir\n")
    hidden = tmp_path / "hidden"
    write_dist(hidden, "hidden", "1", {"h.py": ""})
    (site / ".hidden.pth").write_text(f"{hidden}\n")  # site.addsitedir skips hidden .pth files
    inv = inv_of(site)
    assert inv.site_dirs == (str(site), str(extra))
    assert inv.get("frompth") is not None
    assert "CUDASTACK_PTH_RAN" not in os.environ


def test_default_paths_are_this_interpreters(monkeypatch, tmp_path):
    site = site_packages(tmp_path / "venv")
    write_dist(site, "only-here", "1", {"only_here.py": ""})
    monkeypatch.setattr(sys, "path", [str(site), str(tmp_path / "missing")])
    dirs = site_dirs()
    assert dirs[0] == str(site)
    inv = installed_wheels(reader=read_elf)
    assert inv.get("only-here") is not None


def test_memo_reader_reads_once_and_remembers_errors():
    from pytest_cudastack.errors import ElfError
    from pytest_cudastack.wheels.inventory import memo_reader

    calls: list[str] = []

    def reader(path):
        calls.append(path)
        if path == "bad":
            raise ElfError("bad: not an ELF file")
        return path.upper()

    read = memo_reader(reader)
    assert read("a") == read("a") == "A"
    for _ in range(2):
        with pytest.raises(ElfError):
            read("bad")
    assert calls == ["a", "bad"]


def test_prefix_and_lib64_twin(tmp_path):
    prefix = tmp_path / "venv"
    site = site_packages(prefix)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    plat = prefix / "lib64/python3.11/site-packages"
    plat.mkdir(parents=True)
    write_dist(site, "pure", "1", {"pure.py": ""})
    write_dist(plat, "plat", "1", {"plat.py": ""})
    # the prefix stands for its site directories
    assert site_dirs([str(prefix)]) == (str(site), str(plat))
    # a site directory brings its lib64 twin
    assert site_dirs([str(site)]) == (str(site), str(plat))
    inv = installed_wheels([str(prefix)], reader=read_elf)
    assert {d.name for d in inv.distributions} == {"pure", "plat"}


def _weird_site(tmp_path):
    site = site_packages(tmp_path / "venv")
    rows = {
        "a-1": "x/y.so,,\n../../../bin/t,sha256=a,1\n./x/z.so,,\n/abs/p,,\nd/,,\nd/.,,\n..foo,,\nx//w.so,,\n"
        "x/./v.so,,\n  ,, \n , x,\nx/y.so,,\nq\n",
        "b-2": 'x/y.so,,\nx/z.so,,\n"x/c,omma.so",,\n../../../lib/libk.so,,\nx/./v.so,,\r\nlast/\n',
        "c-3": "x/z.so,,\nx/w.so,,\n..foo,,\n",
    }
    for stem, record in rows.items():
        name, version = stem.split("-")
        write_dist(site, name, version, record=record)
    return site


def test_owners_of_unusual_record_paths(tmp_path):
    """RECORD paths with ``..``, ``./``, ``//``, trailing slashes, quotes, CRLF, blank fields: every owner,
    first in search order, and the RECORD-only OwnerIndex agrees with the full inventory."""
    from pytest_cudastack.wheels.inventory import owner_index

    site = _weird_site(tmp_path)
    venv = tmp_path / "venv"
    inv = installed_wheels([str(venv)], reader=read_elf)
    expect = {
        "x/y.so": ["a 1", "b 2"],
        "x/z.so": ["a 1", "b 2", "c 3"],
        "x/w.so": ["a 1", "c 3"],
        "x/v.so": ["a 1", "b 2"],
        "d": ["a 1"],
        "..foo": ["a 1", "c 3"],
        "x/c,omma.so": ["b 2"],
        "q": ["a 1"],
        "last": ["b 2"],
        "nope": [],
        str(venv / "bin/t"): ["a 1"],
        str(venv / "lib/libk.so"): ["b 2"],
        "/abs/p": [],
    }
    index = owner_index([str(venv)])
    for rel, owners in expect.items():
        path = rel if rel.startswith("/") else str(site / rel)
        assert [d.label for d in inv.owners(path)] == owners, rel
        assert index.owner(path) == (owners[0] if owners else None), rel
        assert inv.owner(path) == index.owner(path)
    assert index.owner(str(site / "torch" / ".." / "x/y.so")) == "a 1"  # normalised before the lookup
