"""One instance of N runs the scheduler: leader election in a FastAPI lifespan.

    pip install 'sql-lease[recipes]'        # FastAPI and uvicorn among them
    export SQL_LEASE_URL=postgresql://user@db:5432/app    # the same database for every instance
    uvicorn fastapi_leader:app --port 8001               # start it on N hosts (or ports)

Every instance serves requests; one of them also runs the scheduler. The lifespan starts
``lead()`` in a background task: it waits for the ``scheduler`` lease (``hold(..., wait=True)``),
runs the scheduler while it holds it (the lease is renewed in the background), and steps down when
it loses it: ``hold()`` cancels the block, so the scheduler stops, and the ``async with`` raises
``LeaseLostError``; the instance reports it and waits for the lease again. If the leader dies
(``kill -9``, a lost host), its lease expires within the TTL and a waiting instance takes over with
a larger fence; on a clean shutdown the lease is released and another takes over at once.
``GET /leader`` tells whether this instance leads.

Environment: ``SQL_LEASE_URL`` (default ``sqlite:///example.db``), ``SQL_LEASE_SCHEMA``, ``LEADER_KEY`` (default
``scheduler``), ``LEADER_TTL_MS`` (default 10000), ``INSTANCE_ID`` (default ``host:pid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from sql_lease import LeaseBackendError, LeaseLostError, SqlLeaseProvider

URL = os.environ.get("SQL_LEASE_URL", "sqlite:///example.db")
SCHEMA = os.environ.get("SQL_LEASE_SCHEMA") or None  # PostgreSQL: the lease table's schema (None: search_path)
KEY = os.environ.get("LEADER_KEY", "scheduler")
TTL_MS = int(os.environ.get("LEADER_TTL_MS", "10000"))
INSTANCE = os.environ.get("INSTANCE_ID") or f"{socket.gethostname()}:{os.getpid()}"


async def run_scheduler(fence: int) -> None:
    """The leader's work, until cancelled. Pass ``fence`` to what it writes, so a store can refuse
    a leader that has already been replaced (``accept_fence``)."""
    while True:
        print(f"{INSTANCE}: scheduler tick (fence {fence})", flush=True)
        await asyncio.sleep(1)


async def lead(leases: SqlLeaseProvider, state: dict[str, Any]) -> None:
    """Wait for leadership, lead until it is lost, and wait again; for the life of the app."""
    while True:
        print(f"{INSTANCE}: waiting for {KEY}", flush=True)
        try:
            async with leases.hold(KEY, owner=INSTANCE, ttl_ms=TTL_MS, wait=True) as lease:
                state["fence"] = lease.fence
                print(f"{INSTANCE}: leader of {KEY} with fence {lease.fence}", flush=True)
                await run_scheduler(lease.fence)
        except LeaseLostError as lost:  # broken, expired during a stall, taken over: step down
            print(f"{INSTANCE}: stepped down from {KEY}: {lost.reason}", flush=True)
        except LeaseBackendError as error:  # the database did not answer: try again shortly
            print(f"{INSTANCE}: lease database unavailable ({error}); retrying", flush=True)
            await asyncio.sleep(1)
        finally:
            state["fence"] = None


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with SqlLeaseProvider(URL, schema=SCHEMA) as leases:
        if URL.startswith("sqlite"):
            await leases.migrate()  # PostgreSQL: run `sql-lease migrate` in your deploy instead
        app.state.leadership = state = {"fence": None}
        leader = asyncio.create_task(lead(leases, state))
        try:
            yield
        finally:  # shutdown: leaving the hold releases the lease, so another instance takes over now
            leader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leader


app = FastAPI(lifespan=lifespan)


@app.get("/leader")
async def leader() -> dict[str, Any]:
    fence = app.state.leadership["fence"]
    return {"instance": INSTANCE, "leader": fence is not None, "fence": fence}
