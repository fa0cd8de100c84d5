"""The healthy matrix (issue 33): the most downloaded CUDA packages, each in its own environment, listed once in
tests/matrix.toml and built by .ci/build-matrix under $CUDASTACK_MATRIX (default /opt/cudastack-matrix).

Standard library only: .ci/build-matrix runs this module with the host's python3 (``python3 -m
tests.helpers.matrix ...`` from the repository root) before any test venv exists.

Each environment is proven healthy by its own means, in children of its own interpreter, without a GPU:

1. its ``health`` code (imports that load its CUDA libraries, the package's own version checks), followed by a
   report of every shared object the process mapped (from /proc/self/maps);
2. ``ldd`` of each mapped library: no ``not found``, except a name that a library already mapped in that same
   process answers (glibc's loader matches a loaded object's soname before it searches, as the process did);
3. ``pip check`` in the environment (``uv pip check --python`` for an environment uv made).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import struct
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MatrixEnv", "Proof", "load", "matrix_root", "not_installable", "prove", "uv_binary"]

MATRIX_FILE = Path(__file__).resolve().parents[1] / "matrix.toml"

# appended to an environment's health code: the shared objects the process has mapped, one JSON line
_MAPS = """
import json as _j
_seen = {}
with open('/proc/self/maps') as _f:
    for _line in _f:
        _p = _line.split(maxsplit=5)
        if len(_p) == 6 and '.so' in _p[5].rsplit('/', 1)[-1] and _p[5].startswith('/'):
            _seen.setdefault(_p[5].strip(), None)
print('CUDASTACK-MAPPED ' + _j.dumps(sorted(_seen)))
"""


@dataclass(frozen=True)
class MatrixEnv:
    """One environment of the matrix, as tests/matrix.toml describes it."""

    name: str
    packages: tuple[str, ...]  # the PyPI packages (as ranked in the package list) it stands for
    cuda: int  # the CUDA major of its build
    installer: str  # "pip" or "uv": which tool made it (and checks it)
    build: tuple[str, ...]  # bash commands; $ENV is its directory, $UV uv, $MATRIX the matrix root
    health: str  # Python run in a child of its interpreter; must exit 0
    cuda_driver: str  # a driver that supports the build (for --cuda-driver)
    cuda_arch: str  # an arch the build ships code for (for --cuda-arch)
    site: str = "lib/python3.11/site-packages"  # relative to its directory
    ld_library_path: tuple[str, ...] = ()  # set as the docs say, relative to site (both for proof and check)
    note: str = ""
    open: str = ""  # a false alarm the checker still gives here, and its mechanism: its checker tests xfail

    def path(self, root: Path) -> Path:
        return root / self.name

    def python(self, root: Path) -> Path:
        return self.path(root) / "bin/python"

    def site_dir(self, root: Path) -> Path:
        return self.path(root) / self.site

    def child_env(self, root: Path) -> dict[str, str]:
        """The environment its children run in: this one, less PYTHONPATH and LD_LIBRARY_PATH, plus its
        documented LD_LIBRARY_PATH; they write no bytecode."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # no .pyc in the matrix: its size is budgeted
        if self.ld_library_path:
            env["LD_LIBRARY_PATH"] = ":".join(str(self.site_dir(root) / p) for p in self.ld_library_path)
        return env


@dataclass
class Proof:
    """The outcome of proving one environment healthy: ``ok`` and what each step said."""

    env: str
    ok: bool = True
    steps: list[str] = field(default_factory=list)
    mapped: list[str] = field(default_factory=list)

    def fail(self, step: str) -> None:
        self.ok = False
        self.steps.append("FAILED " + step)

    def text(self) -> str:
        return f"{self.env}: {'healthy' if self.ok else 'NOT healthy'}\n" + "\n".join(self.steps)


def matrix_root() -> Path:
    return Path(os.environ.get("CUDASTACK_MATRIX", "/opt/cudastack-matrix"))


def uv_binary(root: Path) -> Path:
    return root / ".tools/bin/uv"


def _str_tuple(value: object, key: str, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{MATRIX_FILE}: {name}.{key} must be a list of strings")
    return tuple(value)


def load(path: Path = MATRIX_FILE) -> list[MatrixEnv]:
    """Every environment of the matrix, in file order, validated."""
    import tomllib  # Python 3.11+; the callers skip or stop on older ones

    data = tomllib.loads(path.read_text())
    defaults: Mapping[str, object] = data.get("defaults", {})
    prelude = str(data.get("prelude", ""))
    out: list[MatrixEnv] = []
    for raw in data["env"]:
        row = {**defaults, **raw}
        name = str(row["name"])
        unknown = set(row) - {f for f in MatrixEnv.__dataclass_fields__}
        if unknown:
            raise ValueError(f"{path}: {name}: unknown keys {sorted(unknown)}")
        if row["installer"] not in ("pip", "uv"):
            raise ValueError(f"{path}: {name}: installer must be pip or uv")
        out.append(
            MatrixEnv(
                name=name,
                packages=_str_tuple(row["packages"], "packages", name),
                cuda=int(row["cuda"]),  # type: ignore[call-overload]
                installer=str(row["installer"]),
                build=_str_tuple(row["build"], "build", name),
                health=prelude + str(row["health"]),
                cuda_driver=str(row["cuda_driver"]),
                cuda_arch=str(row["cuda_arch"]),
                site=str(row.get("site", MatrixEnv.site)),
                ld_library_path=_str_tuple(row.get("ld_library_path", []), "ld_library_path", name),
                note=str(row.get("note", "")),
                open=str(row.get("open", "")),
            )
        )
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate environment names")
    return out


def not_installable(path: Path = MATRIX_FILE) -> list[tuple[tuple[str, ...], str]]:
    """The packages left out of the matrix, each group with why."""
    import tomllib

    data = tomllib.loads(path.read_text())
    return [
        (_str_tuple(row["packages"], "packages", "not_installable"), str(row["reason"]))
        for row in data["not_installable"]
    ]


def _soname(path: str) -> str | None:
    """DT_SONAME of a 64-bit little-endian ELF shared object, or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            shoff, shentsize, shnum = struct.unpack_from("<Q", head, 0x28)[0], *struct.unpack_from("<HH", head, 0x3A)
            f.seek(shoff)
            sections = [struct.unpack("<IIQQQQIIQQ", f.read(shentsize)[:64]) for _ in range(shnum)]
            for _, kind, _, _, offset, size, link, _, _, entsize in sections:
                if kind != 6:  # SHT_DYNAMIC
                    continue
                f.seek(offset)
                dyn = f.read(size)
                strtab = sections[link]
                for i in range(0, len(dyn) - 15, entsize or 16):
                    tag, val = struct.unpack_from("<qQ", dyn, i)
                    if tag == 14:  # DT_SONAME
                        f.seek(strtab[4] + val)
                        return f.read(256).split(b"\0", 1)[0].decode()
                    if tag == 0:
                        break
    except (OSError, struct.error, IndexError, UnicodeDecodeError):
        return None
    return None


def _run(argv: Sequence[str], env: Mapping[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, env=dict(env), timeout=timeout, check=False)


def _tail(text: str, n: int = 1500) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def prove(env: MatrixEnv, root: Path) -> Proof:
    """Prove ``env`` healthy by its own means (see the module's doc); never raises on an unhealthy one."""
    proof = Proof(env.name)
    python = env.python(root)
    if not python.exists():
        proof.fail(f"absent: {python}")
        return proof
    child = env.child_env(root)
    if env.ld_library_path:
        proof.steps.append(f"LD_LIBRARY_PATH={child['LD_LIBRARY_PATH']}")
    # 1. its own health code, then the shared objects the process mapped
    try:
        done = _run([str(python), "-c", env.health + "\n" + _MAPS], child)
    except subprocess.TimeoutExpired:
        proof.fail("health code: timed out")
        return proof
    out = [line for line in done.stdout.splitlines() if not line.startswith("CUDASTACK-MAPPED ")]
    mapped_line = [line for line in done.stdout.splitlines() if line.startswith("CUDASTACK-MAPPED ")]
    if done.returncode != 0 or not mapped_line:
        proof.fail(f"health code: rc {done.returncode}\n{_tail(done.stdout)}\n{_tail(done.stderr)}")
        return proof
    proof.mapped = json.loads(mapped_line[0].split(" ", 1)[1])
    proof.steps.append("health code: ok\n  " + "\n  ".join(out))
    inside = [m for m in proof.mapped if m.startswith(str(env.path(root)) + "/") or m.startswith(str(root) + "/")]
    proof.steps.append(f"mapped: {len(proof.mapped)} shared objects, {len(inside)} of them in the environment")
    # 2. ldd of each mapped library; a name a mapped library answers (by soname or file name) is satisfied
    answered = {Path(m).name for m in proof.mapped} | {s for m in proof.mapped if (s := _soname(m))}
    ldd_env = {k: v for k, v in child.items()}
    missing: list[str] = []
    by_mapped: set[str] = set()
    for lib in proof.mapped:
        done = _run(["ldd", lib], ldd_env, timeout=120)
        for line in done.stdout.splitlines():
            if "not found" in line:
                name = line.split("=>")[0].strip()
                if name in answered:
                    by_mapped.add(f"{Path(lib).name}: {name}")
                else:
                    missing.append(f"{lib}: {name}")
    if missing:
        proof.fail("ldd: not found:\n  " + "\n  ".join(missing))
    else:
        proof.steps.append(f"ldd: {len(proof.mapped)} mapped libraries, no name unresolved")
    if by_mapped:
        proof.steps.append("ldd: found only as already mapped in the process:\n  " + "\n  ".join(sorted(by_mapped)))
    # 3. the installer's own consistency check
    if env.installer == "uv":
        uv = uv_binary(root)
        argv = [str(uv), "pip", "check", "--python", str(python)]
        child = {**child, "UV_NO_CONFIG": "1"}
    else:
        argv = [str(python), "-m", "pip", "check"]
    done = _run(argv, child, timeout=300)
    said = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        proof.fail(f"{' '.join(argv[:3])} check: rc {done.returncode}: {_tail(said)}")
    else:
        proof.steps.append(
            f"{'uv pip' if env.installer == 'uv' else 'pip'} check: {said.splitlines()[-1] if said else 'ok'}"
        )
    return proof


def _digest(path: str, cache: dict[int, str]) -> str:
    ino = os.lstat(path).st_ino
    if ino not in cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        cache[ino] = h.hexdigest()
    return cache[ino]


def dedupe(root: Path, news: Sequence[Path], min_size: int = 1024) -> tuple[int, int]:
    """Hard-link each regular file under ``news`` to an identical one elsewhere under ``root`` (same size, mode,
    owner and bytes), as uv's hardlink mode shares its cache: (files linked, bytes saved). Only files of a size
    some other file has are read, so a new environment costs a walk of the matrix and little reading. (For an
    environment uv made, pass its cache too: its files are the environment's, by hard link.)"""
    prefixes = tuple(str(n) + os.sep for n in news)
    by_size: dict[tuple[int, int, int], list[str]] = {}
    for top, _dirs, files in os.walk(root):
        if (top + os.sep).startswith(prefixes):
            continue
        for name in files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size >= min_size:
                by_size.setdefault((st.st_size, st.st_mode, st.st_uid), []).append(path)
    digests: dict[int, str] = {}
    linked = saved = 0
    for new in news:
        for top, _dirs, files in os.walk(new):
            for name in files:
                path = os.path.join(top, name)
                st = os.lstat(path)
                others = by_size.get((st.st_size, st.st_mode, st.st_uid)) if stat.S_ISREG(st.st_mode) else None
                if not others or any(os.lstat(o).st_ino == st.st_ino for o in others):
                    continue  # no file of its size elsewhere, or already one of them
                mine = _digest(path, digests)
                for other in others:
                    if _digest(other, digests) == mine:
                        tmp = path + ".cudastack-link"
                        os.link(other, tmp)
                        os.replace(tmp, path)
                        linked, saved = linked + 1, saved + (st.st_size if st.st_nlink == 1 else 0)
                        break
    return linked, saved


def _by_name(names: Sequence[str]) -> list[MatrixEnv]:
    envs = load()
    if not names:
        return envs
    known = {e.name: e for e in envs}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown environment(s): {', '.join(unknown)}")
    return [known[n] for n in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.helpers.matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="the matrix root (default $CUDASTACK_MATRIX)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("names", help="the environments' names, one a line")
    build = sub.add_parser("build", help="an environment's build commands, NUL-separated")
    build.add_argument("name")
    link = sub.add_parser("dedupe", help="hard-link an environment's files to identical ones in the matrix")
    link.add_argument("name")
    check = sub.add_parser("prove", help="prove environments healthy (exit 1 when one is not)")
    check.add_argument("names", nargs="*")
    check.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    root: Path = args.root or matrix_root()
    if args.cmd == "names":
        print("\n".join(e.name for e in load()))
        return 0
    if args.cmd == "dedupe":
        (env,) = _by_name([args.name])
        news = [env.path(root)] + ([root / ".uv-cache"] if env.installer == "uv" else [])
        linked, saved = dedupe(root, news)
        print(f"{args.name}: {linked} files hard-linked to identical ones, {saved / 2**30:.1f} GiB saved")
        return 0
    if args.cmd == "build":
        (env,) = _by_name([args.name])
        sys.stdout.write("".join(c + "\0" for c in env.build))
        return 0
    ok = True
    for env in _by_name(args.names):
        proof = prove(env, root)
        ok = ok and proof.ok
        if not args.quiet:
            print(proof.text(), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
