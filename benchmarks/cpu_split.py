"""Where a cycle's CPU goes with 8 workers: the client, PostgreSQL, redis-server, the machine.

    python benchmarks/cpu_split.py [--pg URL] [--cycles 4000] [--workers 8] [--rounds 5]

Rounds alternate the raw asyncpg floor (``../shared/bench/floor.py``'s statements), sql_lease on a
URL and redis-py's Lock. Per cycle (median over rounds): the client's CPU (``getrusage``), the CPU
of every ``postgres`` and ``redis-server`` process (``/proc/<pid>/stat``) and the whole machine's
busy time (``/proc/stat``, steal included). On two cores shared by client and server, throughput
with 8 workers is two cores divided by the machine's CPU per cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import resource
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from lease_bench import _cycles, _reset, bench_provider
from run import DEFAULT_FLOOR, load_floor

TICK = os.sysconf("SC_CLK_TCK")


def _processes_cpu(name: str) -> float:
    total = 0.0
    for pid_dir in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{pid_dir}/comm") as comm:
                if not comm.read().startswith(name):
                    continue
            with open(f"{pid_dir}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _machine_cpu() -> float:
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / TICK


async def _measure(run: Callable[[int], Awaitable[Any]], cycles: int) -> dict[str, float]:
    before = (_client_cpu(), _processes_cpu("postgres"), _processes_cpu("redis-server"), _machine_cpu())
    started = time.perf_counter()
    await run(cycles)
    wall = time.perf_counter() - started
    after = (_client_cpu(), _processes_cpu("postgres"), _processes_cpu("redis-server"), _machine_cpu())
    per = [1e6 * (b - a) / cycles for a, b in zip(before, after, strict=True)]
    return {"rate": cycles / wall, "client": per[0], "postgres": per[1], "redis": per[2], "machine": per[3]}


async def main(pg_url: str, cycles: int, workers: int, rounds: int) -> None:
    import asyncpg
    import redis.asyncio as redis

    floor = load_floor(DEFAULT_FLOOR)
    cycles = cycles // workers * workers
    conns = [await asyncpg.connect(pg_url) for _ in range(workers)]
    await conns[0].execute(floor.PG_CREATE)
    client = redis.Redis(host="127.0.0.1", port=6379)

    async def raw(n: int) -> None:
        async def one(conn: Any, count: int, tag: str) -> None:
            for i in range(count):
                key, owner = f"{tag}:{i % 64}", uuid.uuid4().hex
                await conn.fetchrow(floor.PG_ACQUIRE, key, owner, 15000.0)
                await conn.execute(floor.PG_RELEASE, key, owner)

        await asyncio.gather(*(one(c, n // workers, f"r{j}") for j, c in enumerate(conns)))

    async def redis_lock(n: int) -> None:
        async def one(count: int, tag: str) -> None:
            for i in range(count):
                lock = client.lock(f"cpu_split:{tag}:{i % 64}", timeout=15)
                assert await lock.acquire(blocking=False)
                await lock.release()

        await asyncio.gather(*(one(n // workers, f"w{j}") for j in range(workers)))

    results: dict[str, list[dict[str, float]]] = {"raw asyncpg": [], "sql_lease": [], "redis-py Lock": []}
    try:
        async with bench_provider(pg_url) as provider:

            async def ours(n: int) -> None:
                await asyncio.gather(*(_cycles(provider, n // workers, f"w{j}") for j in range(workers)))

            runs = {"raw asyncpg": raw, "sql_lease": ours, "redis-py Lock": redis_lock}
            await _reset(provider)
            for run in runs.values():
                await run(workers * 50)  # warm: connections open, statements prepared
            for _ in range(rounds):
                for name, run in runs.items():
                    if name == "sql_lease":
                        await _reset(provider)
                    results[name].append(await _measure(run, cycles))
    finally:
        await client.aclose()
        await conns[0].execute(f"DROP TABLE IF EXISTS {floor.PG_TABLE}")
        for conn in conns:
            await conn.close()
    print(f"{workers} workers, {cycles} cycles per round, median of {rounds} rounds; CPU in µs per cycle")
    print(f"{'':16s} {'cycles/s':>9s} {'client':>7s} {'postgres':>9s} {'redis':>6s} {'machine':>8s}")
    for name, rows in results.items():
        med = {field: statistics.median(row[field] for row in rows) for field in rows[0]}
        print(
            f"{name:16s} {med['rate']:9,.0f} {med['client']:7.0f} {med['postgres']:9.0f} "
            f"{med['redis']:6.0f} {med['machine']:8.0f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pg", default=os.environ.get("SQL_LEASE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--cycles", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.pg, args.cycles, args.workers, args.rounds))
