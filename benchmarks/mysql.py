"""MySQL/MariaDB beside its raw-driver floor and beside PostgreSQL, in one run.

    python benchmarks/mysql.py [--mysql URL] [--pg URL] [--cycles 2000] [--rounds 3]

Measures acquire + release cycles per second (async, 1 task and 8 tasks on distinct keys) on:
- sql_lease on MySQL (a database of its own, created and dropped here);
- the floor: raw asyncmy doing the least a correct lease needs per cycle on MySQL, an atomic
  ``INSERT ... ON DUPLICATE KEY UPDATE`` and a ``DELETE``, each its own durable commit (no
  fence, no holder reported: what a lock without those guarantees costs);
- the same floor driver sending sql_lease's own statements per cycle (its acquire packet and its
  release ``DELETE``) on connections made and set up as the provider makes its own (its connect
  arguments and session statements), in the provider's loop (the same keys, a new owner id per
  cycle): what the statements cost without the provider, so ``sql_lease / own statements`` is the
  provider's overhead;
- sql_lease on PostgreSQL (its session schema), for scale.
The measures alternate, ``--rounds`` times each, each round starting one measure later (so none always
follows the same one); the medians are printed with the ratios, the client's CPU time per cycle, and
the median of each round's ratio to the own statements (measured side by side).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lease_bench import _cycles, bench_provider


async def _floor_cycles(pool: Any, count: int, tag: str, table: str) -> None:
    async with pool.acquire() as conn, conn.cursor() as cur:
        for i in range(count):
            key = f"{tag}:{i}"
            await cur.execute(
                f"INSERT INTO {table} (k, owner, expires_at) VALUES (%s, %s, UTC_TIMESTAMP(6) + INTERVAL 5 SECOND) "
                "ON DUPLICATE KEY UPDATE owner = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner)",
                (key, tag),
            )
            await cur.execute(f"DELETE FROM {table} WHERE k = %s AND owner = %s", (key, tag))


async def _statement_cycles(pool: Any, count: int, tag: str, statements: Any, session: tuple[str, ...]) -> None:
    from sql_lease.sql.rows import named, pyformat

    acquire, release = pyformat(statements.steps["acquire_packet"]), pyformat(statements.release)
    ttl = statements.ttl_param(15_000.0)
    async with pool.acquire() as conn, conn.cursor() as cur:
        for statement in session:
            await cur.execute(statement)
        for i in range(count):
            key, owner = f"{tag}:{i % 64}", uuid.uuid4().hex  # as lease_bench._cycles
            await cur.execute(acquire, named((key, owner, ttl, None)))
            while True:
                if cur.description is not None:
                    granted = await cur.fetchall()
                if not await cur.nextset():
                    break
            if granted[0][5] is None or granted[0][5].decode() != owner:
                raise AssertionError(f"benchmark key {key} was not free: {granted}")
            await cur.execute(release, named((key, owner, None, None)))


async def _rate(run: Any, cycles: int, workers: int) -> tuple[float, float]:
    """Cycles per second, and this process's CPU time per cycle in microseconds (the client's)."""
    per = max(1, cycles // workers)
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(run(per, f"w{uuid.uuid4().hex[:6]}{j}") for j in range(workers)))
    return per * workers / (time.perf_counter() - started), (time.process_time() - cpu) * 1e6 / (per * workers)


async def _close_pool(pool: Any) -> None:
    pool.close()
    await pool.wait_closed()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default="mysql://root@127.0.0.1:3306/test")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import asyncmy
    import sqlalchemy as sa

    from sql_lease import SqlLeaseProvider
    from sql_lease.sql import setup

    database = f"bench_{uuid.uuid4().hex[:10]}"
    url = sa.make_url(args.mysql)
    rows: dict[str, list[tuple[float, float]]] = {}
    async with contextlib.AsyncExitStack() as cleanup:  # whatever was made is dropped, whatever fails
        admin = await asyncmy.connect(
            host=url.host, port=url.port or 3306, user=url.username, password=url.password or ""
        )
        cleanup.callback(admin.close)
        async with admin.cursor() as cur:
            await cur.execute(f"CREATE DATABASE `{database}`")

        async def drop_database() -> None:
            async with admin.cursor() as cur:
                await cur.execute(f"DROP DATABASE IF EXISTS `{database}`")

        cleanup.push_async_callback(drop_database)
        floor_table = f"`{database}`.floor"
        async with admin.cursor() as cur:
            await cur.execute(
                f"CREATE TABLE {floor_table} (k VARBINARY(2048) PRIMARY KEY, owner VARBINARY(2048), "
                "expires_at DATETIME(6)) ENGINE=InnoDB"
            )
        server = {"host": url.host, "port": url.port or 3306, "user": url.username, "password": url.password or ""}
        pool = await asyncmy.create_pool(**server, autocommit=True, maxsize=10)
        cleanup.push_async_callback(_close_pool, pool)
        mysql = SqlLeaseProvider(args.mysql, schema=database)
        cleanup.push_async_callback(mysql.close)
        await mysql.migrate()
        # the provider's own connect arguments (client flags, autocommit), session statements and statements
        packet_pool = await asyncmy.create_pool(
            **setup.mysql_connect_kwargs(mysql.engine.sync_engine, mysql.operation_timeout_s), maxsize=10
        )
        cleanup.push_async_callback(_close_pool, packet_pool)
        session = setup.mysql_session_setup(mysql.operation_timeout_s)
        statements = mysql.statements
        pg_schema = f"bench_{uuid.uuid4().hex[:10]}"
        pg = bench_provider(args.pg, schema=pg_schema)
        cleanup.push_async_callback(pg.close)

        async def drop_schema() -> None:
            async with pg.engine.begin() as conn:
                await conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')

        cleanup.push_async_callback(drop_schema)
        await pg.migrate()
        measures = [
            ("sql_lease mysql", lambda n, tag: _cycles(mysql, n, tag)),
            ("raw asyncmy floor", lambda n, tag: _floor_cycles(pool, n, tag, floor_table)),
            ("raw asyncmy, own statements", lambda n, tag: _statement_cycles(packet_pool, n, tag, statements, session)),
            ("sql_lease postgresql", lambda n, tag: _cycles(pg, n, tag)),
        ]
        for round_number in range(args.rounds):
            turn = round_number % len(measures)  # each measure follows each other one in turn, not always the same
            for workers in (1, 8):
                for name, run in measures[turn:] + measures[:turn]:
                    rows.setdefault(f"{name}, {workers} worker(s)", []).append(await _rate(run, args.cycles, workers))
    medians = {name: statistics.median(rate for rate, _ in values) for name, values in rows.items()}
    cpu = {name: statistics.median(used for _, used in values) for name, values in rows.items()}
    print(
        f"acquire + release cycles/s and client CPU µs/cycle, medians of {args.rounds} rounds of {args.cycles} cycles"
    )
    for name, value in medians.items():
        print(f"  {name:38s} {value:8.0f} {cpu[name]:8.0f}")
    for workers in (1, 8):
        lease = medians[f"sql_lease mysql, {workers} worker(s)"]
        floor = medians[f"raw asyncmy floor, {workers} worker(s)"]
        own = medians[f"raw asyncmy, own statements, {workers} worker(s)"]
        print(
            f"  {workers} worker(s): sql_lease on MySQL = {lease / floor:.2f} x the raw floor, "
            f"{lease / own:.2f} x its own statements on the raw driver"
        )
    for workers in (1, 8):  # measured side by side in each round: less of the machine's noise
        leases, owns = (
            rows[f"sql_lease mysql, {workers} worker(s)"],
            rows[f"raw asyncmy, own statements, {workers} worker(s)"],
        )
        paired = statistics.median(lease / own for (lease, _), (own, _) in zip(leases, owns, strict=True))
        extra = statistics.median(lease - own for (_, lease), (_, own) in zip(leases, owns, strict=True))
        print(
            f"  {workers} worker(s): median of the rounds' sql_lease / own statements {paired:.2f}; "
            f"client CPU per cycle {extra:+.0f} µs"
        )


if __name__ == "__main__":
    asyncio.run(main())
