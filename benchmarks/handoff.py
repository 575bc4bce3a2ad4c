"""Handoff latency: from the moment a holder starts releasing to the next waiter's successful
acquire, between OS processes waiting on one key.

    python benchmarks/handoff.py [--pg URL] [--rounds 200] [--hold-ms 20] [--json out.json]
    python benchmarks/handoff.py --processes 4 [--rounds 200] [--hold-ms 50] [--json out.json]

Modes: PostgreSQL with LISTEN/NOTIFY, PostgreSQL polling only (listen_notify=False), SQLite
(polling), MySQL/MariaDB (polling; ``--mysql URL``, a database of its own; '' leaves it out).
PostgreSQL runs in a schema of its own, created and migrated first and dropped after.

Two processes (the default, ``--processes 2``): each round, process A holds the key for
--hold-ms while B waits in ``acquire_lease_wait``; A releases; B's acquire completes; then they
swap roles. ``--rounds`` counts hand-overs.

A herd (``--processes N`` with N > 2, or ``--herd``): N processes each loop: wait for the key
with ``acquire_lease_wait``, hold it --hold-ms, release it, and at once wait again. They stop
after ``--rounds`` acquisitions in all (a shared counter, drawn while holding the key, numbers
them). From the merged sequence: hand-over latency (next acquire minus the previous holder's
release start) percentiles, fairness (the longest run of consecutive acquisitions by one
process; acquisitions per process), fences strictly increasing, and the statements and acquire
attempts each process sent.

Times are ``time.monotonic()``, which is one system-wide clock on Linux, so the processes'
readings compare directly.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
SLOW_MS = 1000.0  # a hand-over slower than this is reported separately (a missed wake-up)


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


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
    started = time.monotonic()
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
        "processes": 2,
        "acquisitions": rounds + 1,
        "handoffs": rounds,
        "p50_ms": statistics.median(latencies),
        "p90_ms": _percentile(latencies, 0.90),
        "p99_ms": _percentile(latencies, 0.99),
        "max_ms": latencies[-1],
        "slow_handoffs": sum(x > SLOW_MS for x in latencies),
        "fences_increase": all(x < y for x, y in itertools.pairwise(ordered_fences)),
        "wall_s": time.monotonic() - started,
        "latencies_ms": latencies,
    }


# -- a herd: N processes waiting on one key ---------------------------------------------------


def _herd_member(
    url: str,
    schema: str | None,
    listen_notify: bool,
    key: str,
    rounds: int,
    hold_ms: float,
    index: int,
    counter: Any,
    ready: Any,
    out: Connection,
) -> None:
    from sql_lease import SqlLeaseProvider, acquire_lease_wait

    async def play() -> dict[str, Any]:
        owner = f"P{index}-{uuid.uuid4().hex[:6]}"
        records: list[dict[str, Any]] = []
        drain: list[dict[str, float]] = []  # acquisitions past --rounds, taken only to stop
        statements = attempts = 0
        async with SqlLeaseProvider(url, schema=schema, listen_notify=listen_notify) as leases:
            # Count what this process sends: every statement goes through the driver's fetch_one
            # or fetch_all, every acquire attempt through _acquire (or acquire_lease).
            driver = getattr(leases, "_driver", None)
            for name in ("fetch_one", "fetch_all"):
                original = getattr(driver, name, None)
                if original is not None:

                    def counting_fetch(*args: Any, _original: Any = original) -> Any:
                        nonlocal statements
                        statements += 1
                        return _original(*args)

                    setattr(driver, name, counting_fetch)
            attempt_name = "_acquire" if hasattr(leases, "_acquire") else "acquire_lease"
            original_attempt = getattr(leases, attempt_name)

            def counting_attempt(*args: Any, **kwargs: Any) -> Any:
                nonlocal attempts
                attempts += 1
                return original_attempt(*args, **kwargs)

            setattr(leases, attempt_name, counting_attempt)
            await leases.get_lease_owner(key)  # connected (and listening) before the start
            statements = attempts = 0
            await asyncio.get_running_loop().run_in_executor(None, ready.wait)
            while True:
                with counter.get_lock():
                    if counter.value >= rounds:
                        break
                waiting_since = time.monotonic()
                result = await acquire_lease_wait(leases, key, owner, 30_000, timeout_s=60)
                acquired = time.monotonic()
                with counter.get_lock():  # we hold the key: the numbers follow the fence order
                    ticket = counter.value
                    counter.value += 1
                if ticket >= rounds:  # all acquisitions done: pass the key on so others stop too
                    release_started = time.monotonic()
                    assert await leases.release_lease(key, owner)
                    drain.append({"acquired": acquired, "release_started": release_started})
                    break
                await asyncio.sleep(hold_ms / 1000)
                release_started = time.monotonic()
                assert await leases.release_lease(key, owner)
                records.append(
                    {
                        "ticket": ticket,
                        "process": index,
                        "acquired": acquired,
                        "waited_s": acquired - waiting_since,
                        "release_started": release_started,
                        "fence": result.fence,
                    }
                )
        return {"records": records, "drain": drain, "statements": statements, "attempts": attempts}

    out.send(asyncio.run(play()))


def longest_run(holders: list[int]) -> tuple[int, int | None]:
    """The longest run of consecutive equal entries: (its length, the entry)."""
    best, who = 0, None
    for holder, run in itertools.groupby(holders):
        length = sum(1 for _ in run)
        if length > best:
            best, who = length, holder
    return best, who


def measure_herd(
    url: str, schema: str | None, listen_notify: bool, processes: int, rounds: int = 200, hold_ms: float = 50
) -> dict[str, Any]:
    """``processes`` processes wait on one key, ``rounds`` acquisitions in all; milliseconds."""
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("q", 0)
    ready = ctx.Barrier(processes + 1)
    key = f"handoff:{uuid.uuid4().hex}"
    pipes = [ctx.Pipe(duplex=False) for _ in range(processes)]
    procs = [
        ctx.Process(
            target=_herd_member,
            args=(url, schema, listen_notify, key, rounds, hold_ms, i, counter, ready, pipes[i][1]),
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    ready.wait(120)
    started = time.monotonic()
    reports = [receive.recv() for receive, _ in pipes]
    wall_s = time.monotonic() - started
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            raise RuntimeError(f"herd member exited with {p.exitcode}")
    records = sorted((r for report in reports for r in report["records"]), key=lambda r: r["acquired"])
    drain = sorted((r for report in reports for r in report["drain"]), key=lambda r: r["acquired"])
    # the hand-overs while the herd disperses (not in the statistics; a slow one is a missed wake-up)
    drain_gaps = [(b["acquired"] - a["release_started"]) * 1000 for a, b in itertools.pairwise(records[-1:] + drain)]
    if len(records) != rounds:
        raise RuntimeError(f"expected {rounds} acquisitions, got {len(records)}")
    tickets_in_order = [r["ticket"] for r in records] == list(range(rounds))
    gaps = [(b["acquired"] - a["release_started"]) * 1000 for a, b in itertools.pairwise(records)]
    latencies = sorted(gaps)
    fences = [r["fence"] for r in records]
    fence_violations = [
        {"position": i + 1, "previous": x, "next": y} for i, (x, y) in enumerate(itertools.pairwise(fences)) if x >= y
    ]
    holders = [r["process"] for r in records]
    run, run_holder = longest_run(holders)
    per_process = Counter(holders)
    # a process that just released and takes the key again at once: no other waiter got it
    self_handoffs = sum(x == y for x, y in itertools.pairwise(holders))
    waits = sorted(r["waited_s"] * 1000 for r in records)
    # hand-overs to a different process only (a holder re-taking its own key is not a hand-over
    # to a waiter, and is quick by construction)
    pairs = zip(gaps, itertools.pairwise(records), strict=True)
    to_other = sorted(g for g, (a, b) in pairs if a["process"] != b["process"])
    return {
        "processes": processes,
        "acquisitions": rounds,
        "handoffs": len(latencies),
        "p50_ms": statistics.median(latencies),
        "p90_ms": _percentile(latencies, 0.90),
        "p99_ms": _percentile(latencies, 0.99),
        "max_ms": latencies[-1],
        "slow_handoffs": sum(x > SLOW_MS for x in latencies),
        "to_other_handoffs": len(to_other),
        "to_other_p50_ms": statistics.median(to_other) if to_other else None,
        "to_other_p99_ms": _percentile(to_other, 0.99) if to_other else None,
        "to_other_max_ms": to_other[-1] if to_other else None,
        "overlaps": sum(x < 0 for x in latencies),  # acquired before the previous holder released
        "longest_run": run,
        "longest_run_process": run_holder,
        "same_process_handoffs": self_handoffs,
        "acquisitions_per_process": [per_process.get(i, 0) for i in range(processes)],
        "wait_p99_ms": _percentile(waits, 0.99),
        "wait_max_ms": waits[-1],
        "fences_increase": not fence_violations,
        "fence_violations": fence_violations,
        "tickets_follow_acquire_order": tickets_in_order,
        "statements": sum(report["statements"] for report in reports),
        "attempts": sum(report["attempts"] for report in reports),
        "statements_per_acquisition": sum(report["statements"] for report in reports) / rounds,
        "attempts_per_acquisition": sum(report["attempts"] for report in reports) / rounds,
        "wall_s": wall_s,
        "span_s": records[-1]["release_started"] - records[0]["acquired"],  # first acquire to last release
        "ideal_span_s": rounds * hold_ms / 1000,
        "dispersal_handoffs_ms": drain_gaps,
        "latencies_ms": latencies,
        "sequence": holders,
    }


# -- the schema of its own ----------------------------------------------------------------------


def _asyncpg_dsn(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+')[0]}{sep}{rest}"


async def _create_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()


async def _drop_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def _mysql(url: str, statement: str) -> None:
    import pymysql
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    conn = pymysql.connect(
        host=parsed.host, port=parsed.port or 3306, user=parsed.username, password=parsed.password or ""
    )
    try:
        with conn.cursor() as cursor:
            cursor.execute(statement)
    finally:
        conn.close()


def _markdown(results: dict[str, dict[str, Any]], herd: bool) -> str:
    if herd:
        lines = [
            "| mode | hand-overs | p50 ms | p90 ms | p99 ms | max ms | > 1 s | to another process: n, p50, p99,"
            " max ms | longest run | per process | stmts/acq | attempts/acq | span s | dispersal max ms"
            " | fences increase |",
            "|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---|",
        ]
        for mode, r in results.items():
            other = (
                f"{r['to_other_handoffs']}, {r['to_other_p50_ms']:.2f}, {r['to_other_p99_ms']:.2f}, "
                f"{r['to_other_max_ms']:.2f}"
                if r["to_other_handoffs"]
                else "0"
            )
            lines.append(
                f"| {mode} | {r['handoffs']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f}"
                f" | {r['max_ms']:.2f} | {r['slow_handoffs']} | {other} | {r['longest_run']}"
                f" | {'/'.join(map(str, r['acquisitions_per_process']))} | {r['statements_per_acquisition']:.1f}"
                f" | {r['attempts_per_acquisition']:.1f} | {r['span_s']:.1f}"
                f" | {max(r['dispersal_handoffs_ms'], default=0):.0f} | {r['fences_increase']} |"
            )
    else:
        lines = [
            "| mode | hand-overs | p50 ms | p90 ms | p99 ms | max ms | > 1 s | wall s | fences increase |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for mode, r in results.items():
            lines.append(
                f"| {mode} | {r['handoffs']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f}"
                f" | {r['max_ms']:.2f} | {r['slow_handoffs']} | {r['wall_s']:.1f} | {r['fences_increase']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL URL (a schema of its own is created there)")
    parser.add_argument(
        "--mysql", default="mysql://root@127.0.0.1:3306/test", help="MySQL/MariaDB URL ('' to leave it out)"
    )
    parser.add_argument("--rounds", type=int, default=200, help="hand-overs (2 processes) or acquisitions (herd)")
    parser.add_argument("--hold-ms", type=float, default=None, help="default 20 (2 processes), 50 (herd)")
    parser.add_argument("--processes", type=int, default=2, help="waiting processes on the key (default 2)")
    parser.add_argument("--herd", action="store_true", help="herd mode even with 2 processes")
    parser.add_argument("--json", help="also write the results to this file (appended to its runs if it exists)")
    parser.add_argument("--label", default="", help="a note stored with the run in --json")
    args = parser.parse_args()
    if args.processes < 2:
        parser.error("--processes must be at least 2")
    herd = args.herd or args.processes > 2
    hold_ms = args.hold_ms if args.hold_ms is not None else (50 if herd else 20)
    sqlite_url = f"sqlite:///{tempfile.mkdtemp()}/handoff.db"
    schema = f"handoff_{uuid.uuid4().hex[:12]}"

    async def migrate() -> None:
        from sql_lease import SqlLeaseProvider

        await _create_schema(args.pg, schema)
        targets = [(args.pg, schema), (sqlite_url, None)]
        if args.mysql:
            _mysql(args.mysql, f"CREATE DATABASE `{schema}`")
            targets.append((args.mysql, schema))
        for url, in_schema in targets:
            async with SqlLeaseProvider(url, schema=in_schema) as leases:
                await leases.migrate()

    try:
        asyncio.run(migrate())
        modes = (
            ("postgresql LISTEN/NOTIFY", args.pg, schema, True),
            ("postgresql polling only", args.pg, schema, False),
            ("sqlite polling", sqlite_url, None, False),
            *((("mysql polling", args.mysql, schema, False),) if args.mysql else ()),
        )
        results = {}
        for mode, url, in_schema, listen in modes:
            if herd:
                results[mode] = measure_herd(url, in_schema, listen, args.processes, args.rounds, hold_ms)
            else:
                results[mode] = measure(url, in_schema, listen, args.rounds, hold_ms)
    finally:
        asyncio.run(_drop_schema(args.pg, schema))
        if args.mysql:
            _mysql(args.mysql, f"DROP DATABASE IF EXISTS `{schema}`")
    if herd:
        print(
            f"handoff latency, release started -> next waiter acquired: {args.processes} processes waiting on "
            f"one key, {args.rounds} acquisitions, holder keeps the key {hold_ms:g} ms\n"
        )
    else:
        print(
            f"handoff latency, release started -> next waiter acquired: 2 processes taking turns, "
            f"{args.rounds} handoffs, holder keeps the key {hold_ms:g} ms\n"
        )
    print(_markdown(results, herd))
    for mode, r in results.items():
        for v in r.get("fence_violations", []):
            print(f"FENCE VIOLATION {mode}: position {v['position']}: {v['previous']} -> {v['next']}")
        if r.get("overlaps"):
            print(f"OVERLAP {mode}: {r['overlaps']} acquisitions before the previous holder's release started")
    if args.json:
        run = {
            "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "label": args.label,
            "command": " ".join(sys.argv),
            "mode": "herd" if herd else "two processes taking turns",
            "processes": args.processes,
            "rounds": args.rounds,
            "hold_ms": hold_ms,
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "results": {
                m: {k: v for k, v in r.items() if k not in ("latencies_ms", "sequence")} for m, r in results.items()
            },
            "sequences": {m: r["sequence"] for m, r in results.items() if "sequence" in r},
        }
        document: dict[str, Any] = {"runs": []}
        if os.path.exists(args.json):
            with open(args.json) as f:
                document = json.load(f)
        document["runs"].append(run)
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    ok = all(r["fences_increase"] and not r.get("overlaps") for r in results.values())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
