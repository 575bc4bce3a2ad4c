"""Overlapping all-or-nothing acquires from several OS processes (issue 25): no key held by two owners
at once, no request partially granted, every request answered within its time limit; on SQLite,
PostgreSQL and MySQL/MariaDB."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import random
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

from sql_lease import AcquireResult, SyncSqlLeaseProvider

WORKERS, KEYS, DURATION_S, TTL_MS, LIMIT_S = 4, 6, 3.0, 30_000, 10.0


def hammer(url: str, schema: str, prefix: str, worker: int) -> dict[str, Any]:
    """One process: acquire random 2-4 of the keys all or nothing, hold them briefly, release them.
    Grants carry the process-wide monotonic times between which the lease was surely held."""
    owner = f"w{worker}-{uuid.uuid4().hex[:6]}"
    rng = random.Random(worker)
    keys = [f"{prefix}:{i}\x00" for i in range(KEYS)]
    grants: list[dict[str, Any]] = []
    refusals, partial, slowest = 0, 0, 0.0
    with SyncSqlLeaseProvider(url, schema=schema or None, operation_timeout_s=LIMIT_S) as provider:
        end = time.monotonic() + DURATION_S
        while time.monotonic() < end:
            wanted = rng.sample(keys, rng.randint(2, 4))
            sent = time.monotonic()
            results = provider.acquire_leases(wanted, owner, TTL_MS)
            answered = time.monotonic()
            slowest = max(slowest, answered - sent)
            if not all(results):
                refusals += 1
                partial += any(results) or any(provider.get_lease_owner(k) == owner for k in wanted)
                continue
            time.sleep(rng.random() * 0.003)
            released_at = time.monotonic()
            assert provider.release_leases(wanted, owner) == len(wanted)
            for key, result in zip(wanted, results, strict=True):
                granted_db = (result.expires_at.timestamp() * 1000) - TTL_MS  # the database's grant time
                grants.append(
                    {"key": key, "owner": owner, "fence": result.fence, "db_ms": granted_db}
                    | {"from": answered, "to": released_at}
                )
    return {"grants": grants, "refusals": refusals, "partial": partial, "slowest": slowest}


@pytest.mark.slow
def test_overlapping_all_or_nothing_acquires_never_share_a_key(backend: dict[str, str]) -> None:
    url, schema = backend["url"], backend["schema"]
    prefix = f"multi-{uuid.uuid4().hex[:8]}"
    with multiprocessing.get_context("spawn").Pool(WORKERS) as pool:
        outcomes = pool.starmap(hammer, [(url, schema, prefix, i) for i in range(WORKERS)])
    grants = [grant for outcome in outcomes for grant in outcome["grants"]]
    assert sum(outcome["partial"] for outcome in outcomes) == 0  # no request left anything held
    assert max(outcome["slowest"] for outcome in outcomes) < LIMIT_S  # no request stalled (no deadlock)
    assert len(grants) >= 20 and sum(outcome["refusals"] for outcome in outcomes) > 0, "too little contention"
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for grant in grants:
        by_key[grant["key"]].append(grant)
    for key, tenures in by_key.items():
        tenures.sort(key=lambda grant: grant["fence"])
        assert len({grant["fence"] for grant in tenures}) == len(tenures), key  # each grant its own fence
        for earlier, later in itertools.pairwise(tenures):
            assert later["from"] > earlier["to"], (key, earlier, later)  # never two holders at once
            assert later["db_ms"] >= earlier["db_ms"] - 1, (key, earlier, later)  # fences follow grant order


@pytest.mark.postgres
async def test_a_holder_the_statement_could_not_see_undoes_the_whole_acquire(pg_schema: tuple[str, str]) -> None:
    """PostgreSQL: a key inserted by a transaction that commits while ``acquire_keys`` waits on its row
    is refused by the upsert's recheck; the statement then fails on purpose, so the keys it had
    granted are not written, and the refusal names the holder read afresh."""
    import asyncpg

    from sql_lease import SqlLeaseProvider

    url, schema = pg_schema
    prefix = f"recheck-{uuid.uuid4().hex[:8]}"
    free, raced = f"{prefix}:a", f"{prefix}:b"
    async with SqlLeaseProvider(url, schema=schema) as provider:
        rival = await asyncpg.connect(url)
        try:
            sent: list[str] = []
            provider.on_statement(lambda sql, params: sent.append(sql))
            transaction = rival.transaction()
            await transaction.start()
            await rival.execute(
                f'INSERT INTO "{schema}".sql_leases (key, owner, fence, expires_at) '
                "VALUES ($1, 'bob', nextval($2::regclass), now() + interval '30 s')",
                raced,
                f'"{schema}".sql_leases_fence_seq',
            )
            call = asyncio.ensure_future(provider.acquire_leases([free, raced], "alice", TTL_MS))
            await asyncio.sleep(0.5)  # the upsert now waits for the rival's row
            assert not call.done()
            await transaction.commit()
            results = await call
        finally:
            await rival.close()
        assert sent == [provider.statements.acquire_keys, provider.statements.holders]
        assert results[0] == AcquireResult(False, None) and (results[1].acquired, results[1].owner) == (False, "bob")
        assert await provider.get_lease_owner(free) is None  # the granted key was undone with the statement
