"""Mutual exclusion between real OS processes, on SQLite (one file) and PostgreSQL."""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from sql_lease import SqlLeaseProvider
from tests.support.processes import json_summaries, run_scripts

WORKER = Path(__file__).with_name("support") / "fault_worker.py"
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_processes_never_share_a_key(backend: dict[str, str], tmp_path: Path) -> None:
    workers, keys, duration = 6, 3, 3.0
    prefix = f"excl-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "sections.log"
    markers = tmp_path / "markers"
    markers.mkdir()
    argvs = [
        [
            "hammer",
            "--url",
            backend["url"],
            "--schema",
            backend["schema"],
            "--prefix",
            prefix,
            "--keys",
            str(keys),
            "--duration",
            str(duration),
            "--dir",
            str(markers),
            "--log",
            str(log),
            "--worker",
            str(i),
        ]
        for i in range(workers)
    ]
    summaries = json_summaries(run_scripts(WORKER, argvs, REPO, duration + 60))
    total = {k: sum(s[k] for s in summaries) for k in summaries[0]}
    print("totals", backend["url"].split(":")[0], total)
    assert total["violations"] == 0, total
    assert total["errors"] == 0, total  # SQLite: no "database is locked" ever surfaces
    assert total["acquired"] >= 50, total
    assert total["refused"] > 0, total  # the keys really were contended
    fences: dict[str, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines():
        key, fence, _owner = line.split(" ")
        fences[key].append(int(fence))
    assert len(fences) == keys
    for key, seq in fences.items():
        assert all(a < b for a, b in itertools.pairwise(seq)), (key, seq)
    assert sum(len(seq) for seq in fences.values()) == total["acquired"]


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_fences_never_go_backwards_under_churn(pg_url: str, fresh_pg_schema: str) -> None:
    """Regression: nextval() drawn before ON CONFLICT waited for a row lock let a later owner get
    a smaller fence. A trigger logs every fence the table takes; per key, in commit order, the fence
    must strictly increase whenever it changes."""
    import asyncpg

    from tests.conftest import run_in_own_loop

    schema = fresh_pg_schema

    async def setup() -> None:
        async with SqlLeaseProvider(pg_url, schema=schema) as provider:
            await provider.migrate()
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute(f"""
                CREATE TABLE "{schema}".fence_log (id bigserial PRIMARY KEY, key text, owner text, fence bigint);
                CREATE FUNCTION "{schema}".log_fence() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    INSERT INTO "{schema}".fence_log (key, owner, fence) VALUES (NEW.key, NEW.owner, NEW.fence);
                    RETURN NEW;
                END $$;
                CREATE TRIGGER log_fence AFTER INSERT OR UPDATE ON "{schema}".sql_leases
                    FOR EACH ROW EXECUTE FUNCTION "{schema}".log_fence();""")
        finally:
            await conn.close()

    async def fetch_log() -> list[Any]:
        conn = await asyncpg.connect(pg_url)
        try:
            return list(await conn.fetch(f'SELECT key, owner, fence FROM "{schema}".fence_log ORDER BY id'))
        finally:
            await conn.close()

    run_in_own_loop(setup)
    worker = Path(__file__).with_name("support") / "churn_worker.py"
    argvs = [
        ["--url", pg_url, "--schema", schema, "--prefix", "churn", "--duration", "5", "--worker", str(i)]
        for i in range(3)
    ]
    summaries = json_summaries(run_scripts(worker, argvs, REPO, 90))
    assert sum(s["stale_refusals"] for s in summaries) == 0, summaries
    log = run_in_own_loop(fetch_log)
    assert len(log) > 500, len(log)
    last: dict[str, tuple[str, int]] = {}
    violations = []
    for key, owner, fence in log:
        if key in last:
            prev_owner, prev_fence = last[key]
            if fence != prev_fence and fence < prev_fence:
                violations.append((key, prev_owner, prev_fence, owner, fence))
            if owner != prev_owner and fence == prev_fence:
                violations.append((key, prev_owner, prev_fence, owner, fence))
        last[key] = (owner, max(fence, last.get(key, ("", 0))[1]))
    assert violations == [], violations[:5]
