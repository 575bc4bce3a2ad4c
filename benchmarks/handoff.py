"""Handoff latency: from the moment a holder starts releasing to the next waiter's successful
acquire, between two OS processes that take turns on one key.

    python benchmarks/handoff.py [--pg URL] [--rounds 200] [--hold-ms 20] [--json out.json]

Modes: PostgreSQL with LISTEN/NOTIFY, PostgreSQL polling only (listen_notify=False), SQLite
(polling). Each round: process A holds the key for --hold-ms while B waits in
``acquire_lease_wait``; A releases; B's acquire completes; then they swap roles. Times are
``time.monotonic()``, which is one system-wide clock on Linux, so the two processes' readings
compare directly.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from multiprocessing.connection import Connection
from typing import Any

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


def _player(
    url: str,
    schema: str | None,
    listen_notify: bool,
    key: str,
    rounds: int,
    hold_ms: float,
    first: bool,
    peer: Connection,
    out: Connection,
) -> None:
    from sql_lease import SqlLeaseProvider, acquire_lease_wait

    async def play() -> dict[str, list[float]]:
        owner = f"{'A' if first else 'B'}-{uuid.uuid4().hex[:6]}"
        record: dict[str, list[float]] = {"acquired": [], "release_started": [], "fences": []}
        async with SqlLeaseProvider(url, schema=schema, listen_notify=listen_notify) as leases:
            mine = range(0, rounds + 1, 2) if first else range(1, rounds + 1, 2)
            for turn in mine:
                if turn > 0:
                    peer.recv()  # the other side holds the key now: start waiting for it
                result = await acquire_lease_wait(leases, key, owner, 30_000, timeout_s=60)
                record["acquired"].append(time.monotonic())
                record["fences"].append(result.fence)
                peer.send("got")
                await asyncio.sleep(hold_ms / 1000)  # the other side is waiting by now
                record["release_started"].append(time.monotonic())
                assert await leases.release_lease(key, owner)
        return record

    out.send(asyncio.run(play()))


def measure(
    url: str, schema: str | None, listen_notify: bool, rounds: int = 200, hold_ms: float = 20
) -> dict[str, Any]:
    """Run ``rounds`` handoffs between two processes; latencies in milliseconds."""
    ctx = multiprocessing.get_context("spawn")
    a_peer, b_peer = ctx.Pipe()
    a_out, a_in = ctx.Pipe(duplex=False)
    b_out, b_in = ctx.Pipe(duplex=False)
    key = f"handoff:{uuid.uuid4().hex}"
    procs = [
        ctx.Process(target=_player, args=(url, schema, listen_notify, key, rounds, hold_ms, True, a_peer, a_in)),
        ctx.Process(target=_player, args=(url, schema, listen_notify, key, rounds, hold_ms, False, b_peer, b_in)),
    ]
    for p in procs:
        p.start()
    a, b = a_out.recv(), b_out.recv()
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            raise RuntimeError(f"handoff player exited with {p.exitcode}")
    # turn t is A's for even t, B's for odd t; handoff t: release of turn t-1 -> acquire of turn t
    acquired = {t: v for t, v in zip(range(0, rounds + 1, 2), a["acquired"], strict=True)}
    acquired |= {t: v for t, v in zip(range(1, rounds + 1, 2), b["acquired"], strict=True)}
    released = {t: v for t, v in zip(range(0, rounds + 1, 2), a["release_started"], strict=True)}
    released |= {t: v for t, v in zip(range(1, rounds + 1, 2), b["release_started"], strict=True)}
    fences = {t: f for t, f in zip(range(0, rounds + 1, 2), a["fences"], strict=True)}
    fences |= {t: f for t, f in zip(range(1, rounds + 1, 2), b["fences"], strict=True)}
    latencies = sorted((acquired[t] - released[t - 1]) * 1000 for t in range(1, rounds + 1))
    ordered_fences = [fences[t] for t in range(rounds + 1)]
    return {
        "handoffs": rounds,
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, round(0.99 * len(latencies)) - 1)],
        "max_ms": latencies[-1],
        "fences_increase": all(x < y for x, y in itertools.pairwise(ordered_fences)),
        "latencies_ms": latencies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL URL (migrated with sql-lease migrate)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--hold-ms", type=float, default=20)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    sqlite_url = f"sqlite:///{tempfile.mkdtemp()}/handoff.db"

    async def migrate() -> None:
        from sql_lease import SqlLeaseProvider

        for url in (args.pg, sqlite_url):
            async with SqlLeaseProvider(url) as leases:
                await leases.migrate()

    asyncio.run(migrate())
    results = {
        "postgresql LISTEN/NOTIFY": measure(args.pg, None, True, args.rounds, args.hold_ms),
        "postgresql polling only": measure(args.pg, None, False, args.rounds, args.hold_ms),
        "sqlite polling": measure(sqlite_url, None, False, args.rounds, args.hold_ms),
    }
    print(
        f"handoff latency, release started -> next waiter acquired ({args.rounds} handoffs, "
        f"holder keeps the key {args.hold_ms:g} ms)"
    )
    print(f"{'mode':28s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s}  fences increase")
    for mode, r in results.items():
        print(f"{mode:28s} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['max_ms']:8.2f}  {r['fences_increase']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({m: {k: v for k, v in r.items() if k != "latencies_ms"} for m, r in results.items()}, f, indent=2)
    sys.exit(0 if all(r["fences_increase"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
