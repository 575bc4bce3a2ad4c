"""Semaphores under racing processes (issue 25): never more than ``limit`` holders at once, fences
distinct and increasing, and a holder that dies keeps its slot until it expires. PostgreSQL, SQLite
and MariaDB/MySQL, each with real OS processes."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sql_lease import SqlLeaseProvider
from tests.support.processes import run_scripts

WORKER = Path(__file__).with_name("support") / "semaphore_worker.py"
REPO = Path(__file__).resolve().parent.parent
LIMIT = 3


def _lines(results: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
    lines = []
    for code, out, err in results:
        assert code == 0, err
        lines += [json.loads(line) for line in out.strip().splitlines()]
    return lines


def _argv(mode: str, backend: dict[str, str], key: str, worker: int, *more: str) -> list[str]:
    """A worker's arguments: ``mode`` on ``key`` with ``LIMIT`` slots, then ``more``."""
    where = ["--url", backend["url"], "--schema", backend["schema"], "--key", key, "--limit", str(LIMIT)]
    return [mode, *where, "--worker", str(worker), *more]


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals that overlap (an end at the moment of a start does not)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, step in events:  # at equal times ends (-1) come first
        current += step
        most = max(most, current)
    return most


@pytest.mark.slow
def test_racing_processes_never_hold_more_than_limit_slots(backend: dict[str, str]) -> None:
    workers, duration = 6, 3.0
    key = f"sem-race-{uuid.uuid4().hex[:8]}"
    argvs = [_argv("cycle", backend, key, i, "--duration", str(duration)) for i in range(workers)]
    lines = _lines(run_scripts(WORKER, argvs, REPO, duration + 90))
    summaries = [line for line in lines if "granted" in line]
    grants = [line for line in lines if "fence" in line]
    total = {name: sum(s[name] for s in summaries) for name in summaries[0]}
    print("totals", backend["url"].split(":")[0], total)
    assert total["errors"] == 0 and total["lost"] == 0, total
    assert total["granted"] >= 30 and total["refused"] > 0, total  # contended, and making progress
    assert len(grants) == total["granted"]
    intervals = [(grant["start"], grant["end"]) for grant in grants]
    assert all(start <= end for start, end in intervals)
    assert most_at_once(intervals) <= LIMIT
    assert most_at_once(intervals) >= 2  # the slots really were shared
    fences = [grant["fence"] for grant in grants]
    assert len(set(fences)) == len(fences)  # every grant its own fence
    # grants are serialised by the head lock: a larger fence never began (by the database's clock,
    # its acquired_at) before a smaller one
    by_fence = sorted(grants, key=lambda grant: grant["fence"])
    assert all(a["granted_at"] <= b["granted_at"] for a, b in itertools.pairwise(by_fence))


@pytest.mark.slow
async def test_holders_that_die_keep_their_slots_until_they_expire(backend: dict[str, str]) -> None:
    key, ttl = f"sem-dead-{uuid.uuid4().hex[:8]}", 4_000
    argvs = [_argv("die", backend, key, i, "--ttl", str(ttl)) for i in range(LIMIT)]
    started = time.monotonic()
    grants = _lines(run_scripts(WORKER, argvs, REPO, 90))
    assert all(grant["acquired"] for grant in grants)
    async with SqlLeaseProvider(backend["url"], schema=backend["schema"] or None) as provider:
        refused = await provider.acquire_lease(key, "alive", 10_000, limit=LIMIT)
        if time.monotonic() - started < ttl / 1000 - 0.5:  # the dead holders' slots have not expired yet
            assert not refused.acquired and refused.owner is not None and refused.owner.startswith("dead-")
            assert len(await provider.get_lease_holders(key)) == LIMIT
        holders = await provider.get_lease_holders(key)
        wait_s = max((holder.remaining_ms for holder in holders), default=0.0) / 1000 + 0.3
        await asyncio.sleep(wait_s)
        granted = await provider.acquire_lease(key, "alive", 10_000, limit=LIMIT)
        assert granted.acquired and granted.fence > max(grant["fence"] for grant in grants)
        assert [holder.owner for holder in await provider.get_lease_holders(key)] == ["alive"]
