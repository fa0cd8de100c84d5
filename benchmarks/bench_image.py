"""Cost of ``cudastack image`` on a large image, cold and after a one-layer change, against ``tar -x`` of the
same layers.

Usage: python benchmarks/bench_image.py [DIR] [--json] [--keep WORKDIR]
(default DIR: $CUDASTACK_TORCH_VENV). Targets (issue #21): cold <= 0.7x the time ``tar -x`` takes to unpack
the image's layers (same run), warm after a one-layer change <= 0.1x cold.

Last figures (the 5.4 GB torch venv, 22,000 files, 187 of them 256 KiB or more; a 2-core VM whose ext4 makes a
figure vary from run to run), two runs: ``tar -x`` 19.1 s / 21.2 s; cold 10.9 s / 13.4 s = 0.57x / 0.63x (met; the
root alone varies from 5.1 s to 8.4 s between runs on this disk, the old code's as much); the root alone 0.27x /
0.40x; the items alone 0.24x / 0.24x; warm 0.91 s / 0.99 s = 0.083x / 0.074x cold (met; runs 1.21, 0.90, 0.91 s
and 1.02, 0.76, 0.99 s). The large files of a plain layer are placeholders read in place (see
``pytest_cudastack._sysio``), so the cold run writes none of the 5.4 GB; what is left of its root is creating
22,000 files and 2,000 directories, the costly calls on this disk (an inode allocated: 0.25 ms a file, 0.2-0.8 ms
a directory, where a hard link is 15 us). A warm run creates none of them: it takes over the first image's root,
undoes its top layer from the journal kept when it was applied and applies its own (before: a copy of the lower
layers' root, 2,000 directories created and 22,000 files linked, 0.45-1.3 s); its items recall the symbol verdicts
(nothing they were computed from changed: 0.03 s, not 0.28 s) and find modules with one finder for every reach
process; what is left is the interpreter and this package's imports (0.2 s) and the items over cached facts. The
peer's own cleanup is not charged to the run after it: ext4 skips an inode freed in the last minute when it
allocates one (``recently_deleted``), which cost a cold run after ``tar -x``'s output was removed up to 15 s of
system time, so every directory is removed at the end (and a run started within a minute of another's end pays for
its cleanup).

The image is an OCI layout built here with ``tarfile`` (uncompressed layers, so that building it stays
cheap): layer 1 is DIR under /opt/venv (its Python on the image's PATH: the wheels are the image's), with
the interpreter its ``bin/python3`` links to at its own path (the links, the executable, its libpython), as
an image of that venv holds it; layer 2 a small file. The second image differs from the first in layer 2
only. Each measurement runs ``cudastack image IMAGE --cuda-driver=580.65.06 --cuda-arch=sm_90 --json`` in a
fresh child process:

* ``cold``: an empty CUDASTACK_CACHE_DIR (every layer read, digests checked, the root materialised, every
  item run with no cached ELF fact);
* ``warm``: the second image with the same cache directory (the first image's root taken over, its top layer
  undone and the second's applied, ELF facts and symbol verdicts cached); then the first and the second
  again, each a one-layer change from the run before: the median of the three;
* ``cold_root_only``: the first image's root materialised alone in another empty cache directory, no item
  run (what of ``cold`` is the reading of the layers: its floor is ``tar -x``'s, the same files created and
  bytes written);
* ``cold_items_only``: then the first image checked with that cache directory: its root reused, every item
  run with no ELF or Python fact cached (what of ``cold`` is the items' first reading of the image: a floor
  that no way of reading the layers removes).

``tar -x`` unpacks both layer tars of the first image into an empty directory, in the same run (then it is
removed). The page cache is not dropped: all figures are with warm pages; dirty pages are written out
(``sync``) before each timed run, so that none pays for the writeback of what an earlier step wrote. The
layer tar is hard-linked into both images' blobs (one copy on disk and in the page cache). The checks run
in an empty directory (the project whose imports ``cudastack`` scans is the cwd's, not the image's: run
from a repository, its tests would be parsed in both runs), with the package's modules compiled
beforehand, as an installed package's are.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any


def _layer(path: str, entries: list[tuple[str, str | bytes]]) -> str:
    """Write a layer tar at ``path``: ``(arcname, source dir or file bytes)``; its sha256 digest."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for arcname, src in entries:
            if isinstance(src, bytes):
                info = tarfile.TarInfo(arcname)
                info.size = len(src)
                tf.addfile(info, io.BytesIO(src))
            else:
                tf.add(src, arcname=arcname)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _interpreter(venv: str) -> list[tuple[str, str]]:
    """The files outside ``venv`` that its ``bin/python3`` runs (the links it goes through, the executable
    and its prefix's ``libpython3*.so*``), each at its own path: a venv copied alone into an image has no
    Python (its link dangles there), so the image's wheels would not be judged."""
    out: list[tuple[str, str]] = []
    path, seen = os.path.join(venv, "bin", "python3"), set()
    inside = os.path.abspath(venv) + os.sep
    while os.path.islink(path) and path not in seen:
        seen.add(path)
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        if not path.startswith(inside) and os.path.lexists(path):
            out.append((path.lstrip("/"), path))
    prefix = os.path.dirname(os.path.dirname(path))
    if not path.startswith(inside):
        out.extend((lib.lstrip("/"), lib) for lib in sorted(glob.glob(os.path.join(prefix, "lib", "libpython3*.so*"))))
    return out


def _blob(root: str, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(root, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def build(out: str, layers: list[str]) -> None:
    """An OCI layout at ``out`` of the layer tars ``layers`` (moved into its blobs)."""
    os.makedirs(os.path.join(out, "blobs", "sha256"))
    descs, diff_ids = [], []
    for tar in layers:
        digest = hashlib.sha256()
        with open(tar, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        target = os.path.join(out, "blobs", "sha256", digest.hexdigest())
        try:  # one copy of a multi-GB layer on disk and in the page cache, not one an image
            os.link(tar, target)
        except OSError:
            shutil.copyfile(tar, target)
        diff_ids.append("sha256:" + digest.hexdigest())
        descs.append(
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": diff_ids[-1],
                "size": os.path.getsize(target),
            }
        )
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/opt/venv/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": f"step {i}"} for i in range(len(layers))],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **_blob(out, json.dumps(config).encode())},
        "layers": descs,
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", **_blob(out, json.dumps(manifest).encode())}
        ],
    }
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion": "1.0.0"}')


def _timed(argv: list[str], env: dict[str, str], cwd: str | None = None) -> float:
    """Seconds ``argv`` ran (in ``cwd``); a run that fails (exit status other than 0 or 1, a check's findings)
    stops the benchmark with its stderr: a figure of a run that did not check the image is no figure."""
    os.sync()  # what earlier steps wrote reaches the disk first: no run pays for another's writeback
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"bench_image: {' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", default=os.environ.get("CUDASTACK_TORCH_VENV"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", metavar="WORKDIR", help="build in WORKDIR and keep it")
    args = parser.parse_args()
    if not args.dir or not os.path.isdir(args.dir):
        print("bench_image: no directory (pass DIR or set CUDASTACK_TORCH_VENV)", file=sys.stderr)
        return 2
    work = args.keep or tempfile.mkdtemp(prefix="bench-image-")
    os.makedirs(work, exist_ok=True)
    try:
        big = os.path.join(work, "layer1.tar")
        _layer(big, [("opt/venv", args.dir), *_interpreter(args.dir)])
        small1, small2 = os.path.join(work, "layer2a.tar"), os.path.join(work, "layer2b.tar")
        _layer(small1, [("opt/app/VERSION", b"1\n")])
        _layer(small2, [("opt/app/VERSION", b"2\n")])
        build(os.path.join(work, "img1"), [big, small1])
        build(os.path.join(work, "img2"), [big, small2])
        unpack = os.path.join(work, "unpacked")
        os.makedirs(unpack)
        tar = _timed(["sh", "-c", f"tar -xf {big} -C {unpack} && tar -xf {small1} -C {unpack}"], dict(os.environ))
        # what tar -x wrote is removed at the end, not here: ext4 skips an inode freed in the last minute
        # when it allocates one (recently_deleted), so deleting 22,000 files here would charge the next run,
        # which creates as many, for the peer's cleanup (measured: up to 15 s of system time)
        env = {**os.environ, "CUDASTACK_CACHE_DIR": os.path.join(work, "cache")}
        # the product's modules compiled once, as an installed package's are (pip writes their .pyc): a
        # PYTHONDONTWRITEBYTECODE environment would otherwise charge their compilation to every run
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        package = os.path.dirname(os.path.abspath(importlib.util.find_spec("pytest_cudastack").origin or "."))
        subprocess.run([sys.executable, "-m", "compileall", "-q", package], env=env, check=False)
        # run from an empty directory: the check's project (its cwd's own Python files, whose imports decide
        # the closure's severity) is not the image; the repository's tests would be scanned otherwise
        project = os.path.join(work, "project")
        os.makedirs(project, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pytest_cudastack.cli",
            "image",
            "--cuda-driver=580.65.06",
            "--cuda-arch=sm_90",
            "--json",
        ]
        cold = _timed([*cmd, os.path.join(work, "img1")], env, project)
        # each warm run checks the image the run before did not: img2 after img1, img1 after img2, img2 after
        # img1 (each a one-layer change); the median of the three is the figure (one run on this VM varies
        # by a third)
        warms = [_timed([*cmd, os.path.join(work, name)], env, project) for name in ("img2", "img1", "img2")]
        warm = sorted(warms)[1]
        # the cold run's floor: its root materialised alone (every layer read, digests checked, files
        # written), in another empty cache, no item run
        alone = os.path.join(work, "cache-root-only")
        code = (
            "import sys; from pytest_cudastack.image.rootfs import open_image; "
            "open_image(sys.argv[1], cache_dir=sys.argv[2])"
        )
        root = _timed([sys.executable, "-c", code, os.path.join(work, "img1"), alone], env, project)
        # the rest of the cold run's floor: every item run over that root, reused (no layer read, no file
        # written), with no ELF or Python fact cached; what a cold run costs even if the layers cost nothing
        items = _timed([*cmd, os.path.join(work, "img1")], {**env, "CUDASTACK_CACHE_DIR": alone}, project)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "tar_x_s": tar,
        "cold_s": cold,
        "cold_root_only_s": root,
        "cold_items_only_s": items,
        "warm_one_layer_s": warm,
        "warm_runs_s": warms,
        "cold_vs_tar": cold / tar,
        "warm_vs_cold": warm / cold,
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"tar -x of the layers: {tar:.2f} s")
        print(f"cudastack image, cold: {cold:.2f} s = {cold / tar:.2f}x tar -x (target <= 0.7x)")
        print(f"  of which the root alone (materialised, no item run): {root:.2f} s = {root / tar:.2f}x tar -x")
        print(f"  and the items alone (root reused, no fact cached): {items:.2f} s = {items / tar:.2f}x tar -x")
        runs = ", ".join(f"{w:.2f}" for w in warms)
        print(f"cudastack image, one layer changed: {warm:.2f} s = {warm / cold:.3f}x cold (target <= 0.1x)")
        print(f"  the median of three runs, each after the other image: {runs} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
