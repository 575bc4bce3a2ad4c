"""All-or-nothing acquire of 10 keys beside one plain acquire, per backend (issue 25's goal: <= 3 x).

    python benchmarks/multikey.py [--pg URL] [--mysql URL] [--calls 300] [--rounds 3]

SQLite always runs, on a temporary file.

Each measure is ``--calls`` grants of fresh keys on one async provider (one task): ``acquire_lease``
of one key, and ``acquire_leases`` of 10 keys. The two alternate, ``--rounds`` times each; the medians
of the mean time per call are printed with their ratio (measured side by side, so machine load cancels).
A second line measures refusals the same way: ``acquire_lease`` of a held key, ``acquire_leases`` of 10
held keys (another owner holds them).
Each backend gets a table of its own (a PostgreSQL schema, a MySQL database, a SQLite file), dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from sql_lease import SqlLeaseProvider

KEYS = 10


async def _per_call(provider: SqlLeaseProvider, calls: int, several: bool) -> float:
    tag = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    for i in range(calls):
        if several:
            results = await provider.acquire_leases([f"b:{tag}:{i}:{k}" for k in range(KEYS)], "bench", 60_000)
            assert all(results)
        else:
            assert await provider.acquire_lease(f"b:{tag}:{i}", "bench", 60_000)
    return (time.perf_counter() - started) / calls


async def _per_refusal(provider: SqlLeaseProvider, calls: int, keys: list[str]) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        if len(keys) > 1:
            assert not any(await provider.acquire_leases(keys, "other", 60_000))
        else:
            assert not await provider.acquire_lease(keys[0], "other", 60_000)
    return (time.perf_counter() - started) / calls


async def measure(name: str, provider: SqlLeaseProvider, calls: int, rounds: int) -> None:
    await provider.migrate()
    await _per_call(provider, 20, True)  # warm up connections and prepared statements
    await _per_call(provider, 20, False)
    one: list[float] = []
    ten: list[float] = []
    for _ in range(rounds):
        one.append(await _per_call(provider, calls, False))
        ten.append(await _per_call(provider, calls, True))
    single, multi = statistics.median(one), statistics.median(ten)
    print(
        f"{name:10} acquire_lease {single * 1000:7.3f} ms  acquire_leases x{KEYS} {multi * 1000:7.3f} ms"
        f"  ratio {multi / single:5.2f}"
    )
    held = [f"b:held:{uuid.uuid4().hex[:8]}:{k}" for k in range(KEYS)]
    assert all(await provider.acquire_leases(held, "bench", 600_000))
    one, ten = [], []
    for _ in range(rounds):
        one.append(await _per_refusal(provider, calls, held[:1]))
        ten.append(await _per_refusal(provider, calls, held))
    single, multi = statistics.median(one), statistics.median(ten)
    print(
        f"{'':10} refused       {single * 1000:7.3f} ms  refused        x{KEYS} {multi * 1000:7.3f} ms"
        f"  ratio {multi / single:5.2f}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--mysql", default="mysql://root@127.0.0.1:3306/test")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        async with SqlLeaseProvider(f"sqlite:///{Path(tmp) / 'multikey.db'}") as provider:
            await measure("sqlite", provider, args.calls, args.rounds)
    table = f"multikey_{uuid.uuid4().hex[:8]}"
    if args.pg:
        async with SqlLeaseProvider(args.pg, table_name=table) as provider:
            try:
                await measure("postgresql", provider, args.calls, args.rounds)
            finally:
                await _drop_pg(args.pg, table)
    if args.mysql:
        async with SqlLeaseProvider(args.mysql, table_name=table) as provider:
            try:
                await measure("mysql", provider, args.calls, args.rounds)
            finally:
                _drop_mysql(args.mysql, table)


async def _drop_pg(url: str, table: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        for name in (table, f"{table}_slots", f"{table}_fences", f"{table}_alembic_version"):
            await conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')
        await conn.execute(f'DROP SEQUENCE IF EXISTS "{table}_fence_seq"')
        for name in (f"{table}_slot_acquire", f"{table}_slot_release"):
            await conn.execute(f'DROP FUNCTION IF EXISTS "{name}"')
    finally:
        await conn.close()


def _drop_mysql(url: str, table: str) -> None:
    import pymysql
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    conn = pymysql.connect(host=parsed.host, port=parsed.port or 3306, user=parsed.username, database=parsed.database)
    try:
        with conn.cursor() as cur:
            for name in (table, f"{table}_slots", f"{table}_fence", f"{table}_fences", f"{table}_alembic_version"):
                cur.execute(f"DROP TABLE IF EXISTS `{name}`")
    finally:
        conn.close()


if __name__ == "__main__":
    asyncio.run(main())
