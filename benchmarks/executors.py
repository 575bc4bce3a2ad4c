"""The executors beside the raw-driver floors, in one run (issue "One core, two executors").

    python benchmarks/executors.py [--pg URL] [--cycles 3000] [--json FILE]

Rows: acquire-then-release cycles per second, 1 worker and 8 workers:
  provider from a URL (asyncpg's pool)         vs raw asyncpg (floor.py pg-raw)
  provider on the application's AsyncEngine    vs raw asyncpg
  SQLite provider, synchronous FULL and NORMAL vs sqlite3 with one thread hop, same setting
Targets: URL >= 0.9 x raw asyncpg (1 and 8 workers); engine >= 0.6 x; SQLite >= 0.8 x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lease_bench import bench_provider, cycle_throughput
from run import DEFAULT_FLOOR, load_floor, machine
from sqlalchemy.ext.asyncio import create_async_engine


async def provider_cycles(url: str, cycles: int, **options: Any) -> dict[str, float]:
    async with bench_provider(url, **options) as provider:
        await provider.migrate()
        return await cycle_throughput(provider, cycles, 8)


async def engine_cycles(url: str, cycles: int) -> dict[str, float]:
    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://"), pool_size=10)
    try:
        return await provider_cycles_on(engine, cycles)
    finally:
        await engine.dispose()


async def provider_cycles_on(engine: Any, cycles: int) -> dict[str, float]:
    async with bench_provider(engine) as provider:  # type: ignore[arg-type]
        await provider.migrate()
        return await cycle_throughput(provider, cycles, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--floor", type=Path, default=DEFAULT_FLOOR)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    floor = load_floor(args.floor)
    raw = asyncio.run(floor.pg_raw(args.pg, args.cycles, 8))
    url = asyncio.run(provider_cycles(args.pg, args.cycles))
    engine = asyncio.run(engine_cycles(args.pg, args.cycles))
    raw_again = asyncio.run(floor.pg_raw(args.pg, args.cycles, 8))
    pg_floor = ((raw[0] + raw_again[0]) / 2, (raw[1] + raw_again[1]) / 2)
    sqlite: dict[str, tuple[float, float]] = {}
    for synchronous in ("FULL", "NORMAL"):
        hop = asyncio.run(floor.sqlite_hop(args.cycles, synchronous))[0]
        path = os.path.join(tempfile.mkdtemp(), "bench.db")
        mine = asyncio.run(provider_cycles(f"sqlite:///{path}", args.cycles, sqlite_synchronous=synchronous))
        sqlite[synchronous] = (mine["1_worker"], hop)
    rows = [
        ("PostgreSQL URL, 1 worker / raw asyncpg", url["1_worker"], pg_floor[0], 0.9),
        ("PostgreSQL URL, 8 workers / raw asyncpg", url["8_workers"], pg_floor[1], 0.9),
        ("application engine, 1 worker / raw asyncpg", engine["1_worker"], pg_floor[0], 0.6),
        ("application engine, 8 workers / raw asyncpg", engine["8_workers"], pg_floor[1], 0.6),
        ("SQLite FULL, 1 worker / one-hop floor", *sqlite["FULL"], 0.8),
        ("SQLite NORMAL, 1 worker / one-hop floor", *sqlite["NORMAL"], 0.8),
    ]
    lines = [f"machine: {machine()}", "", f"{'row':46s} {'cycles/s':>9s} {'floor':>9s} {'ratio':>6s}  goal   met"]
    for name, mine_rate, floor_rate, goal in rows:
        ratio = mine_rate / floor_rate
        met = "yes" if ratio >= goal else "NO"
        lines.append(f"{name:46s} {mine_rate:9.0f} {floor_rate:9.0f} {ratio:6.2f}  >={goal:<4} {met}")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
