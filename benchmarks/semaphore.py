"""Semaphore cycles against plain lease cycles (issue 25), side by side on one database:
``python benchmarks/semaphore.py --url URL [--seconds 3] [--rounds 3]`` (not part of the package).

A cycle is an acquire of a free slot (or key) and its release, through the public async API. Per
worker count (1 and 8 asyncio workers on one provider, pool of 10):

- plain: each worker acquires and releases a key of its own (``limit=1``);
- semaphore: each worker acquires and releases a slot of a key of its own (``limit=2``);
- shared: every worker takes one slot of one key (``limit`` = the worker count: never refused).

Rounds alternate plain and semaphore runs, so a loaded machine slows both alike; the figure
reported is cycles per second (the best round of each) and the ratio semaphore / plain
(issue 25 asks >= 0.8).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

from sql_lease.sql.provider import SqlLeaseProvider

TABLE = "sql_lease_sem_bench"
VERSION_TABLE = "sql_lease_sem_bench_alembic_version"
TTL = 30_000


async def _cycles(provider: SqlLeaseProvider, workers: int, seconds: float, mode: str) -> float:
    stop = time.perf_counter() + seconds
    run = uuid.uuid4().hex[:8]
    counts = [0] * workers

    async def worker(i: int) -> None:
        key = f"bench:{run}:shared" if mode == "shared" else f"bench:{run}:{i}"
        limit = {"plain": 1, "semaphore": 2, "shared": max(2, workers)}[mode]
        owner = f"w{i}"
        while time.perf_counter() < stop:
            result = await provider.acquire_lease(key, owner, TTL, limit=limit)
            assert result.acquired, (mode, result)
            assert await provider.release_lease(key, owner)
            counts[i] += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return sum(counts) / (time.perf_counter() - started)


async def main(url: str, seconds: float, rounds: int) -> dict[str, object]:
    figures: dict[str, object] = {"url": url.split("@")[-1], "seconds": seconds, "rounds": rounds}
    async with SqlLeaseProvider(url, table_name=TABLE, version_table=VERSION_TABLE, pool_size=10) as provider:
        await provider.migrate()
        for workers in (1, 8):
            best = {"plain": 0.0, "semaphore": 0.0, "shared": 0.0}
            for _ in range(rounds):
                for mode in best:
                    best[mode] = max(best[mode], await _cycles(provider, workers, seconds, mode))
            figures[f"{workers} workers"] = {
                **{f"{mode} cycles/s": round(value, 1) for mode, value in best.items()},
                "ratio semaphore/plain": round(best["semaphore"] / best["plain"], 3),
                "ratio shared/plain": round(best["shared"] / best["plain"], 3),
            }
        await provider.sweep_expired(batch_size=100_000)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    print(json.dumps(asyncio.run(main(arguments.url, arguments.seconds, arguments.rounds)), indent=2))
