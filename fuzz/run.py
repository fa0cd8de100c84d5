"""Mutation fuzzing of one parser: ``python -m fuzz.run --parser elf --inputs 100000`` (see README.md).

The parent starts a worker (``--worker``: this module again, in a child) that builds the target's seeds,
then for input i = start, start+1, ... derives a mutant from the seeds with ``random.Random(f"{seed}:{i}")``
(so every input can be rebuilt from its index) and runs the target's check on it, under guards:

* memory: ``RLIMIT_AS`` of ``--memory`` bytes (2 GiB) for the worker, so an input needing more ends in a
  MemoryError (escaping: uncaught; converted by the parser to its error: counted as over the limit);
* time: ``ITIMER_REAL`` of ``--timeout`` seconds (2) per input, raising an exception the parser cannot catch
  (it derives from BaseException); the input counts as over time.

The worker writes the index of the input it is on before running it, so when it dies (a segfault, the OOM
killer) the parent saves that input as a reproducer and starts a new worker after it. Reproducers go to
``--out`` (``fuzz/out/<parser>/``). The last line printed is the summary: inputs, uncaught exceptions,
contract violations (for ELF: disagreements of the two readers), over time, over memory, max time, max RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from fuzz.targets import TARGETS, Target

_INTERESTING32 = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
_INTERESTING64 = [*_INTERESTING32, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 1 << 32, 1 << 40]


class InputTimeout(BaseException):
    """One input ran past --timeout (a BaseException: no ``except Exception`` in a parser swallows it)."""


def mutate(seeds: list[bytes], rng: random.Random, target: Target) -> bytes:
    """One mutant: a seed with 1-8 mutations (bit flips, interesting integers at aligned offsets, bytes
    set, chunks deleted, duplicated or spliced from another seed, truncation, extension)."""
    data = rng.choice(seeds)
    if target.structured is not None and rng.random() < 0.5:
        for _ in range(rng.randint(1, 3)):
            got = target.structured(data, rng)
            if got is None:
                break
            data = got
        if rng.random() < 0.7:
            return data
    buf = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 2, 3, 4, 8])):
        n = len(buf)
        op = rng.randrange(9)
        if n == 0:
            buf += rng.randbytes(rng.randint(1, 64))
            continue
        pos = rng.randrange(n)
        if op == 0:
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[pos] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op in (2, 3):
            width = 4 if op == 2 else 8
            pos -= pos % width
            if pos + width <= n:
                pool = _INTERESTING32 if width == 4 else _INTERESTING64
                v = rng.choice([*pool, rng.randrange(1 << (8 * width)), n, n - 1, n + 1, pos])
                buf[pos : pos + width] = (v % (1 << (8 * width))).to_bytes(width, rng.choice(["little", "big"]))
        elif op == 4:
            end = min(n, pos + rng.choice([1, 4, 16, 64, 512]))
            del buf[pos:end]
        elif op == 5:
            end = min(n, pos + rng.choice([4, 16, 64, 512]))
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = buf[pos:end]
        elif op == 6:
            other = rng.choice(seeds)
            if other:
                a = rng.randrange(len(other))
                chunk = other[a : a + rng.choice([8, 64, 512])]
                buf[pos : pos + len(chunk)] = chunk
        elif op == 7:
            del buf[rng.randrange(n) :]
        else:
            buf += rng.randbytes(rng.choice([1, 15, 16, 64]))
    return bytes(buf)


# ---------------------------------------------------------------------------------------------- worker
def _worker(args: argparse.Namespace) -> int:
    target = TARGETS[args.parser]
    resource.setrlimit(resource.RLIMIT_AS, (args.memory, args.memory))
    root = Path(args.scratch)
    work = root / "work"
    work.mkdir(parents=True, exist_ok=True)
    seeds = target.seeds(work)
    scratch = root / "s"
    scratch.mkdir(exist_ok=True)
    # one untimed seed first: a target's lazy imports (packaging, the CLI) are not the first input's time
    with contextlib.suppress(Exception):
        target.check(seeds[0], scratch)
    out = Path(args.out)

    def expire(*_a: object) -> None:
        raise InputTimeout()

    signal.signal(signal.SIGALRM, expire)
    cursor = os.open(args.cursor, os.O_WRONLY | os.O_CREAT, 0o600)
    report = sys.stdout
    max_time = 0.0
    for i in range(args.start, args.start + args.count):
        data = mutate(seeds, random.Random(f"{args.seed}:{i}"), target)
        os.pwrite(cursor, b"%12d" % i, 0)
        kind = detail = ""
        t = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, args.timeout)
        try:
            problem = target.check(data, scratch)
            if problem is not None:
                kind, detail = ("memory" if problem.startswith("over the memory") else "violation"), problem
        except InputTimeout:
            kind, detail = "time", f"over {args.timeout} s"
        except MemoryError:
            kind, detail = "uncaught", "MemoryError"
        except Exception as e:
            kind, detail = "uncaught", "".join(traceback.format_exception_only(type(e), e)).strip()[:500]
            detail += " | " + traceback.format_tb(e.__traceback__)[-1].strip().replace("\n", " ")[:300]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        dt = time.perf_counter() - t
        max_time = max(max_time, dt)
        if kind:
            name = out / f"{kind}-{hashlib.sha1(data).hexdigest()[:16]}.bin"
            out.mkdir(parents=True, exist_ok=True)
            name.write_bytes(data)
            report.write(json.dumps({"i": i, "kind": kind, "detail": detail, "file": str(name)}) + "\n")
        if (i + 1) % 500 == 0 or i == args.start + args.count - 1:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            report.write(json.dumps({"done": i + 1, "max_time": max_time, "max_rss": rss}) + "\n")
            report.flush()
    return 0


# ---------------------------------------------------------------------------------------------- parent
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.split("\n")[0])
    ap.add_argument("--parser", required=True, choices=sorted(TARGETS))
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=0, help="stop after this long (0: no limit)")
    ap.add_argument("--seed", default="cudastack")
    ap.add_argument("--start", type=int, default=0, help="index of the first input (to resume or shard)")
    ap.add_argument("--timeout", type=float, default=2.0, help="per-input limit in seconds")
    ap.add_argument("--memory", type=int, default=2 << 30, help="worker address-space limit in bytes")
    ap.add_argument("--out", default=None, help="reproducer directory (default fuzz/out/<parser>)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--cursor", default="", help=argparse.SUPPRESS)
    ap.add_argument("--scratch", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(Path(__file__).parent / "out" / args.parser)
    if args.worker:
        return _worker(args)

    started = time.monotonic()
    done = args.start
    end = args.start + args.inputs
    counts = {"uncaught": 0, "violation": 0, "time": 0, "memory": 0, "crash": 0}
    max_time = 0.0
    max_rss = 0
    seen: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="cudastack-fuzz-") as tmp:
        cursor = os.path.join(tmp, "cursor")
        while done < end and not (args.seconds and time.monotonic() - started > args.seconds):
            chunk = min(end - done, 5000)
            cmd = [sys.executable, "-m", "fuzz.run", "--worker", "--parser", args.parser, "--seed", args.seed]
            cmd += ["--start", str(done), "--count", str(chunk), "--timeout", str(args.timeout)]
            cmd += ["--memory", str(args.memory), "--out", args.out, "--cursor", cursor, "--scratch", tmp]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
            assert proc.stdout is not None
            last_done = done
            for line in proc.stdout:
                rec = json.loads(line)
                if "done" in rec:
                    last_done = rec["done"]
                    max_time = max(max_time, rec["max_time"])
                    max_rss = max(max_rss, rec["max_rss"])
                    if args.seconds and time.monotonic() - started > args.seconds:
                        proc.terminate()
                        break
                    continue
                counts[rec["kind"]] += 1
                key = rec["kind"] + ": " + rec["detail"].split(" | ")[0][:160]
                if key not in seen:
                    seen[key] = rec["i"]
                    print(f"[{rec['i']}] {rec['kind']}: {rec['detail']} -> {rec['file']}", flush=True)
            rc = proc.wait()
            if rc != 0 and proc.returncode != -signal.SIGTERM:
                with open(cursor, "rb") as f:
                    i = int(f.read().strip() or done)
                counts["crash"] += 1
                print(f"[{i}] crash: worker exited {rc}; rerun with --start {i} --inputs 1 to reproduce", flush=True)
                last_done = i + 1
            done = last_done
            print(f"  {done - args.start} inputs, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - started
    n = done - args.start
    print(
        f"SUMMARY parser={args.parser} inputs={n} uncaught={counts['uncaught']} violations={counts['violation']} "
        f"crashes={counts['crash']} over_{args.timeout:g}s={counts['time']} "
        f"over_{args.memory >> 30}GiB={counts['memory']} "
        f"max_time={max_time:.3f}s max_rss={max_rss / (1 << 20):.0f}MiB seconds={elapsed:.0f} "
        f"rate={n / elapsed if elapsed else 0:.0f}/s distinct={len(seen)}"
    )
    return 1 if any(counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
