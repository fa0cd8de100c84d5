"""The walks of trees that come from the user or an image (the rootdir's import scan has its own tests, in
test_robust_projectscan.py): ``--cudastack-scan=DIR`` (checks/scan.py), ``cudastack fleet DIR`` (model/fleet.py)
and a root directory judged as an image (checks/container.py walks a root that has no layers' record). On a
2,000-deep tree each ends without ``RecursionError`` (``os.walk`` recursed once a level), reads to
``dirwalk.MAX_DEPTH`` levels and says which directory it did not enter, the way its module says what it did not
read; each follows no link to a directory, as ``os.walk`` did, lists what ``os.walk`` listed in its order, and
reads a directory bind-mounted inside its own tree once (``os.walk`` read it again below the mount point).

The deep chains are built and removed through directory descriptors, one level at a time: their paths come
near PATH_MAX, and ``shutil.rmtree`` (which pytest's tmp_path cleanup uses) recurses once a level."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from pytest_cudastack.checks.scan import run, scan_walk, skipped_files
from pytest_cudastack.cli import main
from pytest_cudastack.dirwalk import MAX_DEPTH, Listing, walk_tree
from pytest_cudastack.findings import Finding, Severity
from pytest_cudastack.image.rootfs import ImageRoot
from pytest_cudastack.model.fleet import snapshot_files
from pytest_cudastack.settings import ENV, Settings
from pytest_cudastack.stack import Stack
from tests.helpers.deeptree import build_chain, clean_run, remove_chain
from tests.helpers.elfbuild import synth_elf
from tests.helpers.fleetbuild import snap
from tests.helpers.sitebuild import site_packages

DEEP = 2000
LEVELS = (1, MAX_DEPTH, MAX_DEPTH + 1, DEEP)  # a file at each: the first two are read, the others not
BAKED = "libnvidia-ml.so.535.104.05"  # a driver library the container check finds baked into an image
DRIVER = "580.65.06"


def _chain(top: Path, files: Mapping[str, bytes], depth: int = DEEP) -> None:
    """``top/d/d/.../d``, ``depth`` levels; ``files`` (name -> bytes) at each level of ``LEVELS``."""
    build_chain(top, depth, lambda level: files if level in LEVELS else {})


def _at(top: Path | str, level: int, name: str = "") -> str:
    """The path ``level`` directories down the chain under ``top`` (``name`` in it, when given)."""
    return os.path.join(top, *["d"] * level, *([name] if name else []))


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Three 2,000-deep chains, built once (read only): ``scan/`` with an ELF ``app`` at each of ``LEVELS``,
    ``fleet/`` with a snapshot ``node.json``, ``image/`` (a root) with a baked driver library."""
    base = tmp_path_factory.mktemp("deep")
    elf = synth_elf(base / "app.elf", needed=["libc.so.6"]).read_bytes()
    doc = json.dumps(snap(site_packages(base / "venv"), name="gpu01")).encode()
    tops = {"scan": {"app": elf}, "fleet": {"node.json": doc}, "image": {BAKED: b"\x7fELF-not-really"}}
    for name, files in tops.items():
        (base / name).mkdir()
        _chain(base / name, files)
    yield base
    for name in tops:
        remove_chain(base / name)


@pytest.fixture(autouse=True)
def _own_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDASTACK_CACHE_DIR", str(tmp_path / "cache"))
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


class _Stack:
    """run() of a directory target reads nothing from the stack."""


def _os_walk(top: str) -> list[tuple[str, tuple[str, ...]]]:
    """What the walks read before: ``os.walk`` with each ``dirnames`` sorted, its files sorted."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        out.append((dirpath, tuple(sorted(filenames))))
    return out


def _links(d: Path, outside: Path) -> None:
    """Links that loop, or lead out of ``d``: to its parent, to itself, to a directory outside, at each other."""
    (d / "up").symlink_to("..")
    (d / "self").symlink_to(".")
    (d / "out").symlink_to(outside)
    (d / "l1").symlink_to("l2")
    (d / "l2").symlink_to("l1")


# ------------------------------------------------------------------------------------------- the walker


def test_the_walk_lists_what_os_walk_lists_in_its_order(tmp_path: Path):
    top = tmp_path / "top"
    for sub in ("b/y", "a/z", "a/Z", "c", ".hidden"):
        (top / sub).mkdir(parents=True)
    for f in ("a/z/f", "a/g", "b/h", ".hidden/i", "k", "B"):
        (top / f).write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o").write_text("x")
    _links(top / "a", outside)
    (top / "file-link").symlink_to("k")
    (top / "dangling").symlink_to("nowhere")
    os.mkfifo(top / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(top / "sock"))
    try:
        listed = [(level.path, level.files) for level in walk_tree(str(top))]
        assert listed == _os_walk(str(top))
        assert [p for p, _ in listed] == [str(top / d) for d in ("", ".hidden", "a", "a/Z", "a/z", "b", "b/y", "c")]
        (tmp_path / "top-link").symlink_to(top)  # a link given as the top is followed, as os.walk does
        assert [level.files for level in walk_tree(str(tmp_path / "top-link"))] == [f for _, f in listed]
    finally:
        sock.close()


def test_the_walk_names_each_directory_below_its_depth_cap_and_skips_what_it_is_told(tmp_path: Path):
    for sub in ("a/a1/a2", "b", "skipped"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "link").symlink_to("a")
    root = str(tmp_path)
    assert list(walk_tree(root, max_depth=0)) == [
        Listing(root, 0, (), (str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "skipped")))
    ]
    shallow = list(walk_tree(root, max_depth=1, skip=lambda parent, name: parent == root and name == "skipped"))
    assert [(x.path, x.depth, x.deep) for x in shallow] == [
        (root, 0, ()),
        (str(tmp_path / "a"), 1, (str(tmp_path / "a" / "a1"),)),
        (str(tmp_path / "b"), 1, ()),
    ]
    assert list(walk_tree(str(tmp_path / "nowhere"))) == []


def test_the_walk_reads_1999_levels_when_its_cap_allows(deep: Path):
    """Far past the interpreter's recursion limit (1000): the walk keeps its own stack."""
    levels = list(walk_tree(str(deep / "scan"), max_depth=DEEP - 1))
    assert len(levels) == DEEP
    assert (levels[-1].depth, levels[-1].files, levels[-1].deep) == (DEEP - 1, (), (_at(deep / "scan", DEEP),))


# ------------------------------------------------------------------------------------------- --cudastack-scan


def test_a_scan_of_a_2000_deep_tree_reads_to_the_depth_cap_and_warns_of_the_directory_below(deep: Path):
    top = deep / "scan"
    targets, dirs = scan_walk(["scan"], str(deep))
    assert targets == (
        (os.path.join("scan", "d", "app"), _at(top, 1, "app")),
        (_at("scan", MAX_DEPTH, "app"), _at(top, MAX_DEPTH, "app")),
    )
    assert dirs == (("scan", str(top)),)
    found = run(_Stack(), ("scan", str(top)))
    assert [(f.severity, f.subject, f.message) for f in found] == [
        (
            Severity.WARNING,
            _at("scan", MAX_DEPTH + 1),
            f"not checked: a directory {MAX_DEPTH + 1} levels below the scanned one: not walked, past the scan's "
            f"depth cap of {MAX_DEPTH} levels (name it in --cudastack-scan to scan its binaries)",
        )
    ]


def test_cudastack_check_scan_of_a_deep_tree_ends_without_a_traceback(deep: Path, tmp_path: Path):
    argv = [sys.executable, "-m", "pytest_cudastack.cli", "check", f"--cuda-driver={DRIVER}", "--cudastack-scan=scan"]
    done = clean_run(argv, cwd=deep, cache=tmp_path / "cache")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cudastack::scan[scan/d/app]" in done.stdout
    assert f"cudastack::scan[{_at('scan', MAX_DEPTH, 'app')}]" in done.stdout
    assert f"{_at('scan', MAX_DEPTH + 1)}: not checked: a directory {MAX_DEPTH + 1} levels below" in done.stdout


def test_a_scan_follows_no_directory_link_and_says_each_looping_link(tmp_path: Path):
    d = tmp_path / "bin"
    (d / "sub").mkdir(parents=True)
    synth_elf(d / "sub" / "libok.so.1")
    outside = tmp_path / "outside"
    outside.mkdir()
    synth_elf(outside / "app")
    _links(d, outside)
    (d / "libx.so.1").symlink_to("sub/libok.so.1")  # a linked file is scanned
    targets, dirs = scan_walk(["bin"], str(tmp_path))
    assert targets == (("bin/libx.so.1", str(d / "libx.so.1")), ("bin/sub/libok.so.1", str(d / "sub" / "libok.so.1")))
    assert dirs == (("bin", str(d)),)
    loop = "cannot be examined: Too many levels of symbolic links"
    assert skipped_files(str(d)) == ((str(d / "l1"), loop), (str(d / "l2"), loop))


# ------------------------------------------------------------------------------------------- cudastack fleet


def test_a_fleet_directory_2000_deep_is_read_to_the_depth_cap_and_the_directory_below_is_said(deep: Path):
    top = deep / "fleet"
    unread: list[tuple[str, str]] = []
    assert list(snapshot_files([str(top)], unread)) == [_at(top, 1, "node.json"), _at(top, MAX_DEPTH, "node.json")]
    below = _at(top, MAX_DEPTH + 1)
    assert unread == [
        (
            below,
            f"{below}: not read: it is {MAX_DEPTH + 1} directory levels below {top}, past the walk's depth cap "
            f"({MAX_DEPTH} levels): name it on the command line to read the snapshots under it",
        )
    ]


def test_cudastack_fleet_of_a_deep_tree_groups_what_it_read_and_says_what_it_did_not(
    deep: Path, capsys: pytest.CaptureFixture[str]
):
    code = main(["fleet", str(deep / "fleet")])
    out, err = capsys.readouterr()
    assert code == 2  # as for a file that is not a snapshot: not every node was read
    assert out.splitlines()[0] == "cudastack fleet: 2 nodes, 1 stack"
    assert err == (
        f"cudastack fleet: error: {_at(deep / 'fleet', MAX_DEPTH + 1)}: not read: it is {MAX_DEPTH + 1} directory "
        f"levels below {deep / 'fleet'}, past the walk's depth cap ({MAX_DEPTH} levels): name it on the command "
        "line to read the snapshots under it\n"
    )
    assert main(["fleet", "--format", "json", str(deep / "fleet")]) == 2
    payload = json.loads(capsys.readouterr().out)
    assert [u["source"] for u in payload["unreadable"]] == [_at(deep / "fleet", MAX_DEPTH + 1)]


def test_a_fleet_directory_follows_no_directory_link(tmp_path: Path):
    nodes = tmp_path / "nodes"
    (nodes / "sub").mkdir(parents=True)
    (nodes / "a.json").write_text("{}")
    (nodes / "sub" / "b.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "c.json").write_text("{}")
    _links(nodes, outside)
    (nodes / "l1.json").symlink_to("l2.json")  # looping links named like snapshots: listed, then unreadable
    (nodes / "l2.json").symlink_to("l1.json")
    unread: list[tuple[str, str]] = []
    assert list(snapshot_files([str(nodes)], unread)) == [
        str(nodes / "a.json"),
        str(nodes / "l1.json"),
        str(nodes / "l2.json"),
        str(nodes / "sub" / "b.json"),
    ]
    assert unread == []


# ------------------------------------------------------------------------------------------- an image's root


def _container(root: Path, base: Path) -> tuple[Finding, ...]:
    """The container item's findings for the root directory ``root`` as an image (no layers' record: its files
    are walked), the host driver declared."""
    image = ImageRoot(str(root), str(root), "rootfs", {"PATH": "/usr/bin:/bin"})
    stack = Stack(Settings(cudastack=True, cuda_driver=DRIVER), image=image, cache=None, rootdir=str(base))
    return stack.findings("container")


def _baked(found: tuple[Finding, ...]) -> list[str]:
    return [f.subject for f in found if f.message.startswith("driver library ")]


def test_an_image_root_2000_deep_is_walked_to_the_depth_cap_and_the_rest_is_an_info(deep: Path):
    found = _container(deep / "image", deep)
    assert _baked(found) == [_at("/", MAX_DEPTH, BAKED), _at("/", 1, BAKED)]  # sorted: "/d/d/..." < "/d/lib..."
    infos = [f for f in found if f.severity is Severity.INFO and "not walked" in f.message]
    assert [(f.subject, f.message, f.facts.objects) for f in infos] == [
        (
            _at("/", MAX_DEPTH + 1),
            f"1 directory more than {MAX_DEPTH} levels below / is not walked (the walk's depth cap): a driver "
            "library baked there is not looked for",
            (_at("/", MAX_DEPTH + 1),),
        )
    ]


def test_an_image_root_walk_follows_no_directory_link_and_skips_the_kernels_file_systems(tmp_path: Path):
    root = tmp_path / "root"
    for d in ("usr/lib", "proc", "sys", "dev", "opt/proc"):
        (root / d).mkdir(parents=True)
        (root / d / BAKED).write_bytes(b"\x7fELF-not-really")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / BAKED).write_bytes(b"\x7fELF-not-really")
    _links(root / "usr", outside)
    (root / "lib").symlink_to("usr/lib")  # a merged-/usr image: its libraries are named once, under /usr/lib
    found = _container(root, tmp_path)
    assert _baked(found) == [f"/opt/proc/{BAKED}", f"/usr/lib/{BAKED}"]
    assert not [f for f in found if "not walked" in f.message]


# ------------------------------------------------------------------------------------------- a bind mount

_BIND_LOOP = r"""
import json, subprocess, sys
from pytest_cudastack.checks.scan import scan_walk
from pytest_cudastack.image.rootfs import ImageRoot
from pytest_cudastack.model.fleet import snapshot_files
from pytest_cudastack.settings import Settings
from pytest_cudastack.stack import Stack

top = sys.argv[1]
subprocess.run(["mount", "--bind", top, top + "/a/b"], check=True)  # a/b is top again, without a link
unread = []
image = ImageRoot(top, top, "rootfs", {"PATH": "/usr/bin:/bin"})
stack = Stack(Settings(cudastack=True, cuda_driver="580.65.06"), image=image, cache=None, rootdir=top)
print(json.dumps({
    "scan": [p for _, p in scan_walk([top], "/")[0]],
    "fleet": [list(snapshot_files([top], unread)), unread],
    "container": [f.subject for f in stack.findings("container")],
}))
"""


def _namespace() -> list[str] | None:
    """The command that runs a child in a mount namespace of its own (its bind mount gone when it ends): a user
    namespace's root, else root's own; None where neither is allowed."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    for command in (["unshare", "--user", "--map-root-user", "--mount"], ["unshare", "--mount"]):
        if subprocess.run([*command, "true"], capture_output=True, check=False, timeout=60).returncode == 0:
            return command
    return None


def test_a_bind_mount_of_a_directory_inside_its_own_tree_is_read_once(tmp_path: Path):
    """No second snapshot, target or finding under ``a/b/``: the mount's root is the top's (st_dev, st_ino)."""
    namespace = _namespace()
    if namespace is None:
        pytest.skip("needs unshare and a mount namespace (a user namespace, or root)")
    top = tmp_path / "top"
    (top / "a" / "b").mkdir(parents=True)
    (top / "n.json").write_text("{}")
    (top / "a" / BAKED).write_bytes(b"\x7fELF-not-really")
    done = clean_run([*namespace, sys.executable, "-c", _BIND_LOOP, str(top)], cache=tmp_path / "cache")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {
        "scan": [str(top / "a" / BAKED)],  # it starts like an ELF file: a target
        "fleet": [[str(top / "n.json")], []],
        "container": [f"/a/{BAKED}"],
    }
