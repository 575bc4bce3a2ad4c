"""Cost of ``check_held`` per transaction (issue 15): the same small write transaction with and
without the check, on the application's own SQLAlchemy connection.

    python benchmarks/check_held_cost.py --url postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/check_held_cost.py --url sqlite:///tmp/cost.db

Each transaction: BEGIN; [check_held]; INSERT one row; COMMIT. Prints the statements each sends
(counted with SQLAlchemy's before_cursor_execute event; each is one round trip) and the latency
p50/p99 in ms, sync (psycopg / sqlite3) and async (asyncpg / aiosqlite).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider
from sql_lease.sql.urls import to_async_url, to_sync_url


def summary(name: str, samples: list[float], statements: float) -> str:
    samples = sorted(samples)
    p50 = statistics.median(samples) * 1000
    p99 = samples[int(len(samples) * 0.99) - 1] * 1000
    return f"{name:<34} {statements:4.1f} statements/txn   p50 {p50:7.3f} ms   p99 {p99:7.3f} ms"


def run_sync(url: str, schema: str | None, n: int) -> None:
    key = f"cost:{uuid.uuid4().hex}"
    engine = sa.create_engine(to_sync_url(url))
    table = f'"{schema}".check_held_cost' if schema else "check_held_cost"
    counted = [0]
    sa.event.listen(engine, "before_cursor_execute", lambda *a: counted.__setitem__(0, counted[0] + 1))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        conn.exec_driver_sql(f"CREATE TABLE {table} (id bigint, fence bigint)")
    insert = sa.text(f"INSERT INTO {table} (id, fence) VALUES (:i, :f)")
    with SyncSqlLeaseProvider(url, schema=schema) as leases:
        held = leases.acquire_lease(key, "me", 600_000)
        for guarded in (False, True, False, True):
            counted[0] = 0
            samples = []
            for i in range(n):
                start = time.perf_counter()
                with engine.begin() as conn:
                    if guarded:
                        leases.check_held(conn, key, "me", held.fence)
                    conn.execute(insert, {"i": i, "f": held.fence})
                samples.append(time.perf_counter() - start)
            label = "sync, with check_held" if guarded else "sync, without"
            print(summary(label, samples, counted[0] / n))
        leases.release_lease(key, "me")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")
    engine.dispose()


async def run_async(url: str, schema: str | None, n: int) -> None:
    key = f"cost:{uuid.uuid4().hex}"
    engine = create_async_engine(to_async_url(url))
    table = f'"{schema}".check_held_cost_a' if schema else "check_held_cost_a"
    counted = [0]
    sa.event.listen(engine.sync_engine, "before_cursor_execute", lambda *a: counted.__setitem__(0, counted[0] + 1))
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        await conn.exec_driver_sql(f"CREATE TABLE {table} (id bigint, fence bigint)")
    insert = sa.text(f"INSERT INTO {table} (id, fence) VALUES (:i, :f)")
    async with SqlLeaseProvider(url, schema=schema) as leases:
        held = await leases.acquire_lease(key, "me", 600_000)
        for guarded in (False, True, False, True):
            counted[0] = 0
            samples = []
            for i in range(n):
                start = time.perf_counter()
                async with engine.begin() as conn:
                    if guarded:
                        await leases.check_held(conn, key, "me", held.fence)
                    await conn.execute(insert, {"i": i, "f": held.fence})
                samples.append(time.perf_counter() - start)
            label = "async, with check_held" if guarded else "async, without"
            print(summary(label, samples, counted[0] / n))
        await leases.release_lease(key, "me")
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"DROP TABLE {table}")
    await engine.dispose()


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", default=None)
    parser.add_argument("-n", type=int, default=2000, help="transactions per run (each mode runs twice)")
    args = parser.parse_args(argv)
    with SyncSqlLeaseProvider(args.url, schema=args.schema) as leases:
        leases.migrate()
    print(f"check_held cost on {to_sync_url(args.url).get_backend_name()}, {args.n} transactions per run")
    run_sync(args.url, args.schema, args.n)
    asyncio.run(run_async(args.url, args.schema, args.n))


if __name__ == "__main__":
    main()
