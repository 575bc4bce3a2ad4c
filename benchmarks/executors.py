"""The executors beside the raw-driver floors, in one run (issue "One core, two executors").

    python benchmarks/executors.py [--pg URL] [--cycles 3000] [--rounds 3] [--json FILE]

Rows: acquire-then-release cycles per second, 1 worker and 8 workers:
  provider from a URL (its own asyncpg connections)  vs raw asyncpg (floor.py pg-raw)
  provider on the application's AsyncEngine          vs raw asyncpg
  SQLite provider, synchronous FULL and NORMAL       vs sqlite3 with one thread hop, same setting
and two rows that show what bounds the others, against raw asyncpg too:
  sql_lease's own acquire and release run on raw asyncpg connections set up as the provider's
  (what the statements cost, without the provider's Python);
  the floor's two statements run the way an application would on an ``AsyncEngine``
  (``async with engine.connect()`` and ``exec_driver_sql`` on an ``AUTOCOMMIT`` engine).
Targets: URL >= 0.9 x raw asyncpg (1 and 8 workers); engine >= 0.6 x; SQLite >= 0.8 x.

Every figure is taken in ``--rounds`` interleaved rounds (a busy machine slows all sides of a round
alike); a ratio is the median of its per-round ratios. Each round gives the providers an emptied,
vacuumed table, as the floor creates a new one each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from lease_bench import _reset, bench_provider, cycle_throughput, throughput
from run import DEFAULT_FLOOR, load_floor, machine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def asyncpg_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+asyncpg://", 1)


async def provider_cycles(provider: Any, cycles: int) -> dict[str, float]:
    await _reset(provider)
    return await cycle_throughput(provider, cycles, 8)


async def sqlalchemy_pattern(floor: Any, engine: AsyncEngine, cycles: int) -> dict[str, float]:
    """The floor's acquire and release, each in ``async with engine.connect()`` + ``exec_driver_sql``."""
    from sqlalchemy import text

    async with engine.begin() as conn:
        for statement in floor.PG_CREATE.split(";"):
            if statement.strip():
                await conn.execute(text(statement))

    async def run(n: int, tag: str, _worker: int) -> None:
        for i in range(n):
            key, owner = f"{tag}:{i % 64}", uuid.uuid4().hex
            async with engine.connect() as conn:
                row = (await conn.exec_driver_sql(floor.PG_ACQUIRE, (key, owner, 15000.0))).fetchone()
            assert row is not None and row[0] == owner
            async with engine.connect() as conn:
                await conn.exec_driver_sql(floor.PG_RELEASE, (key, owner))

    return await throughput(run, cycles, 8)


async def statements_on_raw_asyncpg(url: str, cycles: int) -> dict[str, float]:
    """sql_lease's PostgreSQL acquire and release on 8 raw asyncpg connections (durable sessions,
    as the provider sets up its own), on the benchmark table: the statements without the provider."""
    import asyncpg
    from lease_bench import BENCH_TABLE, BENCH_VERSION_TABLE

    from sql_lease.sql.schema import LeaseTableNames
    from sql_lease.sql.statements import OWN_CONNECTION_SETUP, PostgresStatements

    statements = PostgresStatements(LeaseTableNames(BENCH_TABLE, None, BENCH_VERSION_TABLE), durable_session=True)
    conns = [await asyncpg.connect(url) for _ in range(8)]
    try:
        for conn in conns:
            for setup in OWN_CONNECTION_SETUP:
                await conn.execute(setup)
        await conns[0].execute(f"DELETE FROM {BENCH_TABLE}")
        await conns[0].execute(f"VACUUM ANALYZE {BENCH_TABLE}")

        async def run(n: int, tag: str, worker: int) -> None:
            conn = conns[worker]
            for i in range(n):
                key, owner = f"{tag}:{i % 64}", uuid.uuid4().hex
                rows = await conn.fetch(statements.acquire, *statements.acquire_params(key, owner, 15000.0, None, None))
                assert rows and rows[0][0]
                await conn.fetch(statements.release, key, owner, None, None)  # any tenure, no minimum hold

        return await throughput(run, cycles, 8)
    finally:
        for conn in conns:
            await conn.close()


async def postgres_rounds(floor: Any, url: str, cycles: int, rounds: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}

    def note(name: str, result: dict[str, float] | tuple[float, float]) -> None:
        one, eight = result if isinstance(result, tuple) else (result["1_worker"], result["8_workers"])
        figures.setdefault(f"{name}_1", []).append(one)
        figures.setdefault(f"{name}_8", []).append(eight)

    engine = create_async_engine(asyncpg_url(url), pool_size=10)
    plain = create_async_engine(asyncpg_url(url), pool_size=10, isolation_level="AUTOCOMMIT")
    try:
        async with bench_provider(url) as own, bench_provider(engine) as borrowed:  # type: ignore[arg-type]
            for _ in range(rounds):
                note("raw", await floor.pg_raw(url, cycles, 8))
                note("url", await provider_cycles(own, cycles))
                note("statements", await statements_on_raw_asyncpg(url, cycles))
                note("engine", await provider_cycles(borrowed, cycles))
                note("sqlalchemy", await sqlalchemy_pattern(floor, plain, cycles))
    finally:
        await engine.dispose()
        await plain.dispose()
    return figures


async def sqlite_rounds(floor: Any, cycles: int, rounds: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    for synchronous in ("FULL", "NORMAL"):
        path = os.path.join(tempfile.mkdtemp(), "bench.db")
        async with bench_provider(f"sqlite:///{path}", sqlite_synchronous=synchronous) as provider:
            for _ in range(rounds):
                figures.setdefault(f"hop_{synchronous}", []).append((await floor.sqlite_hop(cycles, synchronous))[0])
                mine = await provider_cycles(provider, cycles)
                figures.setdefault(f"sqlite_{synchronous}", []).append(mine["1_worker"])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--floor", type=Path, default=DEFAULT_FLOOR)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    floor = load_floor(args.floor)
    figures = asyncio.run(postgres_rounds(floor, args.pg, args.cycles, args.rounds))
    figures.update(asyncio.run(sqlite_rounds(floor, args.cycles, args.rounds)))

    def row(label: str, mine: str, base: str, goal: float | None) -> tuple[str, float, float, float, float | None]:
        ratio = statistics.median(m / b for m, b in zip(figures[mine], figures[base], strict=True))
        return label, statistics.median(figures[mine]), statistics.median(figures[base]), ratio, goal

    rows = [
        row("PostgreSQL URL, 1 worker / raw asyncpg", "url_1", "raw_1", 0.9),
        row("PostgreSQL URL, 8 workers / raw asyncpg", "url_8", "raw_8", 0.9),
        row("(bound) sql_lease's statements, 8 workers / raw", "statements_8", "raw_8", None),
        row("PostgreSQL URL, 8 workers / its statements", "url_8", "statements_8", None),
        row("application engine, 1 worker / raw asyncpg", "engine_1", "raw_1", 0.6),
        row("application engine, 8 workers / raw asyncpg", "engine_8", "raw_8", 0.6),
        row("(bound) SQLAlchemy pattern, 1 worker / raw", "sqlalchemy_1", "raw_1", None),
        row("(bound) SQLAlchemy pattern, 8 workers / raw", "sqlalchemy_8", "raw_8", None),
        row("application engine, 8 workers / SQLAlchemy", "engine_8", "sqlalchemy_8", None),
        row("SQLite FULL, 1 worker / one-hop floor", "sqlite_FULL", "hop_FULL", 0.8),
        row("SQLite NORMAL, 1 worker / one-hop floor", "sqlite_NORMAL", "hop_NORMAL", 0.8),
    ]
    lines = [
        f"machine: {machine()}; median of {args.rounds} interleaved rounds of {args.cycles} cycles",
        "",
        f"{'row':46s} {'cycles/s':>9s} {'floor':>9s} {'ratio':>6s}  goal   met",
    ]
    for name, mine_rate, floor_rate, ratio, goal in rows:
        met = "" if goal is None else "yes" if ratio >= goal else "NO"
        target = "" if goal is None else f">={goal:<4}"
        lines.append(f"{name:46s} {mine_rate:9.0f} {floor_rate:9.0f} {ratio:6.2f}  {target:6s} {met}")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "rows": rows, "rounds": figures}, indent=2))


if __name__ == "__main__":
    main()
