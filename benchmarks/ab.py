"""Two checkouts of sql_lease side by side on the acquire hot path, interleaved so that a busy
machine slows both alike: ``python benchmarks/ab.py --a /tmp/main --b . --url URL [--url URL2]``.

Each checkout gets a long-lived worker process (``PYTHONPATH`` = the checkout, its own table
``ab_a``/``ab_b``, migrated by that checkout). The workers take turns measuring for ``--slice``
seconds, the order alternating, ``--pairs`` times per measure; a ratio is B's figure over A's in
one pair, and the median of those ratios is printed with its interquartile range. Run it with
``--a`` and ``--b`` the same checkout first: that spread is the noise floor.

Measures: acquire + release cycles per second (async, 1 task and 8 tasks on distinct keys; sync,
1 thread) and idempotent re-acquires per second (the owner's own unexpired key: the UPDATE path).
Make a checkout of main with ``git archive main | tar -x -C /tmp/main``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

MEASURES = ["async cycles/s 1 task", "async cycles/s 8 tasks", "async re-acquires/s", "sync cycles/s 1 thread"]


def worker(url: str, table: str, sqlite_synchronous: str) -> None:
    from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider

    opts = {"sqlite_synchronous": sqlite_synchronous} if url.startswith("sqlite") else {}
    loop = asyncio.new_event_loop()
    provider = SqlLeaseProvider(url, table_name=table, **opts)
    loop.run_until_complete(provider.migrate())
    sync = SyncSqlLeaseProvider(url, table_name=table, **opts)

    async def cycles(tasks: int, seconds: float) -> float:
        stop, count = time.perf_counter() + seconds, 0

        async def one(i: int) -> None:
            nonlocal count
            key = f"c{i}-{uuid.uuid4().hex[:8]}"
            while time.perf_counter() < stop:
                await provider.acquire_lease(key, "o", 30_000)
                await provider.release_lease(key, "o")
                count += 1

        await asyncio.gather(*(one(i) for i in range(tasks)))
        return count / seconds

    async def reacquires(seconds: float) -> float:
        stop, count, key = time.perf_counter() + seconds, 0, f"r-{uuid.uuid4().hex[:8]}"
        while time.perf_counter() < stop:
            await provider.acquire_lease(key, "o", 30_000)
            count += 1
        await provider.release_lease(key, "o")
        return count / seconds

    def sync_cycles(seconds: float) -> float:
        stop, count, key = time.perf_counter() + seconds, 0, f"s-{uuid.uuid4().hex[:8]}"
        while time.perf_counter() < stop:
            sync.acquire_lease(key, "o", 30_000)
            sync.release_lease(key, "o")
            count += 1
        return count / seconds

    runs = {
        MEASURES[0]: lambda s: loop.run_until_complete(cycles(1, s)),
        MEASURES[1]: lambda s: loop.run_until_complete(cycles(8, s)),
        MEASURES[2]: lambda s: loop.run_until_complete(reacquires(s)),
        MEASURES[3]: sync_cycles,
    }
    print("ready", flush=True)
    for line in sys.stdin:
        name, seconds = line.rstrip("\n").rsplit(" ", 1)
        print(runs[name](float(seconds)), flush=True)
    sync.close()
    loop.run_until_complete(provider.close())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", required=True, help="checkout B")
    parser.add_argument("--url", action="append", required=True, help="database URL; repeat for several")
    parser.add_argument("--pairs", type=int, default=25)
    parser.add_argument("--slice", type=float, default=0.5, help="seconds per measurement")
    parser.add_argument("--sqlite-synchronous", default="NORMAL", help="NORMAL: measure the code, not the disk")
    args = parser.parse_args()
    roots = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b)}
    for url in args.url:
        procs = {
            label: subprocess.Popen(
                [sys.executable, __file__, "--worker", url, f"ab_{label}", args.sqlite_synchronous],
                env=dict(os.environ, PYTHONPATH=root),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for label, root in roots.items()
        }
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

        def ask(label: str, name: str, procs: dict[str, subprocess.Popen[str]] = procs) -> float:
            proc = procs[label]
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{name} {args.slice}\n")
            proc.stdin.flush()
            return float(proc.stdout.readline())

        print(f"{url.split(':')[0]}: {args.pairs} interleaved pairs of {args.slice} s per measure")
        print(f"  {'measure':<26}{'A':>8}{'B':>8}   B/A: median of pairs (IQR)")
        for name in MEASURES:
            ask("a", name), ask("b", name)  # warm-up
            got: dict[str, list[float]] = {"a": [], "b": []}
            ratios = []
            for i in range(args.pairs):
                pair = {label: ask(label, name) for label in (("a", "b") if i % 2 == 0 else ("b", "a"))}
                got["a"].append(pair["a"])
                got["b"].append(pair["b"])
                ratios.append(pair["b"] / pair["a"])
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            a, b, ratio = statistics.median(got["a"]), statistics.median(got["b"]), statistics.median(ratios)
            print(f"  {name:<26}{a:>8.0f}{b:>8.0f}   {ratio:.3f} ({q1:.2f}-{q3:.2f})")
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(*sys.argv[2:5])
    else:
        main()
