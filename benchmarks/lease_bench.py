"""The library's side of the benchmark, runnable against any database:
``python benchmarks/lease_bench.py --url URL [--quick]`` (not part of the installed package).

Every measurement uses the public API (``SqlLeaseProvider``, ``hold``); none of them runs inside
the test suite. ``benchmarks/run.py`` puts these figures beside the raw-driver floors and the peers
(Redis lock, tooz) measured in the same run.

Measurements (times are wall-clock ``time.perf_counter``; latencies in milliseconds):

- cycles: acquire a free key, then release it; cycles per second with 1 and with N workers.
- contention: W workers race for one key; attempts per second, acquisitions, the most holders
  ever seen inside the critical section at once (must be 1) and errors (must be 0).
- scale: acquire (new key) and renew latency p50/p99 with 10^3 and with 10^6 rows in the table.
- sweep: sweep 10^6 expired rows with ``ExpirySweeper`` (its defaults: batches of 500, at most a
  quarter of the time)
  while W workers acquire and release; sweep time and the workers' p99 during the sweep against
  without it.
- renewals: L leases held with ``hold()`` and renewed every 5 s (Mastra's cadence); statements per
  second and the client's CPU share (process CPU time / wall time). ``hold()`` coalesces the
  renewals of one provider (``renew_many``): about L / 1000 statements per interval.
- handoffs (``--only handoffs``): 64 tasks take one key in turn with ``acquire_lease_wait``, on one
  provider, on 8 and on 32 (standing for processes; 2 connections each); statements per handoff.

One measurement alone: ``--only renewals --leases 10000 --renew-every 5 --seconds 20``,
``--only contention --waiters 64 --seconds 3``, ``--only handoffs --waiters 64``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sql_lease.holding import ExpirySweeper, hold
from sql_lease.sql.provider import SqlLeaseProvider

BENCH_TABLE = "sql_lease_bench"
BENCH_VERSION_TABLE = "sql_lease_bench_alembic_version"


def percentile(samples: list[float], fraction: float) -> float:
    """The ``fraction`` quantile (nearest rank) of ``samples``."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def bench_provider(url: str, **options: Any) -> SqlLeaseProvider:
    """A provider on the benchmark's own table, apart from any real leases."""
    return SqlLeaseProvider(url, table_name=BENCH_TABLE, version_table=BENCH_VERSION_TABLE, **options)


async def _reset(provider: SqlLeaseProvider) -> None:
    """Empty the benchmark table; on PostgreSQL also VACUUM it, so that one measurement's million
    dead rows (autovacuum may not have reached them yet) do not slow the next one down."""
    await provider.migrate()
    await _execute(provider, f"DELETE FROM {BENCH_TABLE}")
    if provider.dialect_name == "postgresql":
        await _execute(provider, f"VACUUM ANALYZE {BENCH_TABLE}")


async def _execute(provider: SqlLeaseProvider, sql: str) -> None:
    from sqlalchemy import text

    engine = provider.engine.execution_options(isolation_level="AUTOCOMMIT")  # VACUUM runs outside a transaction
    async with engine.connect() as conn:
        await conn.execute(text(sql))


async def _cycles(provider: SqlLeaseProvider, count: int, tag: str, latencies: list[float] | None = None) -> None:
    for i in range(count):
        key, owner = f"{tag}:{i % 64}", uuid.uuid4().hex
        started = time.perf_counter()
        result = await provider.acquire_lease(key, owner, 15_000)
        if not result.acquired:
            raise AssertionError(f"benchmark key {key} was not free")
        await provider.release_lease(key, owner)
        if latencies is not None:
            latencies.append((time.perf_counter() - started) * 1000)


async def throughput(run: Callable[[int, str, int], Awaitable[None]], cycles: int, workers: int) -> dict[str, float]:
    """Cycles per second of ``run(count, tag, worker)`` (``count`` cycles on keys tagged ``tag``, as
    worker number ``worker``) with 1 worker and with ``workers`` workers, after 50 warm-up cycles."""
    await run(50, "warm", 0)
    started = time.perf_counter()
    await run(cycles, "seq", 0)
    sequential = cycles / (time.perf_counter() - started)
    per_worker = cycles // workers
    started = time.perf_counter()
    await asyncio.gather(*(run(per_worker, f"w{j}", j) for j in range(workers)))
    concurrent = per_worker * workers / (time.perf_counter() - started)
    return {"1_worker": sequential, f"{workers}_workers": concurrent}


async def cycle_throughput(provider: SqlLeaseProvider, cycles: int, workers: int) -> dict[str, float]:
    """Acquire-then-release cycles per second with 1 worker and with ``workers`` workers."""
    return await throughput(lambda count, tag, _: _cycles(provider, count, tag), cycles, workers)


async def contention(provider: SqlLeaseProvider, workers: int = 64, seconds: float = 3.0) -> dict[str, float]:
    """``workers`` tasks race for one key for ``seconds``; each winner stays inside ~1 ms."""
    key = f"contended:{uuid.uuid4().hex}"
    inside, most_inside = 0, 0
    attempts = acquisitions = errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(n: int) -> None:
        nonlocal inside, most_inside, attempts, acquisitions, errors
        owner = f"racer-{n}"
        while time.perf_counter() < deadline:
            attempts += 1
            try:
                result = await provider.acquire_lease(key, owner, 5_000)
                if not result.acquired:
                    continue
                acquisitions += 1
                inside += 1
                most_inside = max(most_inside, inside)
                await asyncio.sleep(0.001)
                inside -= 1
                await provider.release_lease(key, owner)
            except Exception:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(workers)))
    elapsed = time.perf_counter() - started
    return {
        "workers": workers,
        "attempts_per_s": attempts / elapsed,
        "acquisitions": acquisitions,
        "attempts_per_acquisition": attempts / max(1, acquisitions),
        "most_holders_at_once": most_inside,
        "errors": errors,
    }


async def waiting_handoffs(
    url: str, waiters: int = 64, providers: int = 1, handoffs: int = 200, **options: Any
) -> dict[str, float]:
    """``waiters`` tasks (spread over ``providers`` providers, each standing for a process) take one
    key in turn with ``acquire_lease_wait``, hold it ~1 ms and release it, until ``handoffs``
    acquisitions; statements sent per handoff (all providers together)."""
    from sql_lease.holding import acquire_lease_wait

    made = [bench_provider(url, **options) for _ in range(providers)]
    statements = 0

    def counted(sql: str, params: tuple[Any, ...]) -> None:
        nonlocal statements
        statements += 1

    for provider in made:
        provider.on_statement(counted)
    key = f"handoff:{uuid.uuid4().hex}"
    done = 0
    inside, most_inside = 0, 0

    async def worker(n: int) -> None:
        nonlocal done, inside, most_inside
        provider, owner = made[n % providers], f"waiter-{n}"
        while done < handoffs:
            await acquire_lease_wait(provider, key, owner, 5_000, timeout_s=30)
            inside += 1
            most_inside = max(most_inside, inside)
            await asyncio.sleep(0.001)
            inside -= 1
            done += 1
            await provider.release_lease(key, owner)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker(n) for n in range(waiters)))
        elapsed = time.perf_counter() - started
    finally:
        for provider in made:
            await provider.close()
    return {
        "waiters": waiters,
        "providers": providers,
        "handoffs": done,
        "handoffs_per_s": done / elapsed,
        "statements_per_handoff": statements / max(1, done),
        "most_holders_at_once": most_inside,
    }


async def _fill(provider: SqlLeaseProvider, first: int, last: int, expires_in_s: int) -> None:
    """Insert rows ``fill:first`` .. ``fill:last`` expiring ``expires_in_s`` seconds from now."""
    names = provider.names
    if provider.dialect_name == "postgresql":
        sql = (
            f"INSERT INTO {names.table} (key, owner, fence, expires_at) "
            f"SELECT 'fill:' || g, 'filler', nextval('{names.fence_sequence}'), "
            f"now() + make_interval(secs => {expires_in_s}) FROM generate_series({first}, {last}) g"
        )
    else:
        from sql_lease.sql.statements import SQLITE_NOW_MS

        sql = (
            f"WITH RECURSIVE g(x) AS (SELECT {first} UNION ALL SELECT x + 1 FROM g WHERE x < {last}) "
            f"INSERT INTO {names.table} (key, owner, fence, expires_at) "
            f"SELECT 'fill:' || x, 'filler', (SELECT last_fence FROM {names.fence_counter}) + x, "
            f"{SQLITE_NOW_MS} + {expires_in_s * 1000} FROM g"
        )
    await _execute(provider, sql)
    if provider.dialect_name == "postgresql":
        await _execute(provider, f"ANALYZE {names.table}")


async def _latencies(samples: int, operation: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    measured = []
    for i in range(samples):
        started = time.perf_counter()
        await operation(i)
        measured.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": statistics.median(measured), "p99_ms": percentile(measured, 0.99)}


async def _acquire_nth(provider: SqlLeaseProvider, keys: list[str], i: int) -> Any:
    return await provider.acquire_lease(keys[i], "bench", 60_000)


async def _renew_nth(provider: SqlLeaseProvider, keys: list[str], i: int) -> Any:
    return await provider.renew_lease(keys[i], "bench", 60_000)


async def scale(
    provider: SqlLeaseProvider, sizes: tuple[int, ...] = (1_000, 1_000_000), samples: int = 2000
) -> dict[str, Any]:
    """Acquire and renew latency with ``sizes`` rows in the table (filled cumulatively)."""
    await _reset(provider)
    filled, results = 0, {}
    for size in sizes:
        await _fill(provider, filled + 1, size, 3600)
        filled = size
        tag = uuid.uuid4().hex[:8]
        keys = [f"{tag}:{i}" for i in range(samples)]
        acquire = await _latencies(samples, functools.partial(_acquire_nth, provider, keys))
        renew = await _latencies(samples, functools.partial(_renew_nth, provider, keys))
        results[str(size)] = {"acquire": acquire, "renew": renew}
        await _execute(provider, f"DELETE FROM {provider.names.table} WHERE key LIKE '{tag}:%'")
    return results


async def sweep_under_load(
    provider: SqlLeaseProvider,
    expired_rows: int = 1_000_000,
    workers: int = 8,
    batch_size: int | None = None,
    baseline_s: float = 5.0,
    duty_cycle: float | None = None,
) -> dict[str, float]:
    """Sweep ``expired_rows`` while ``workers`` run acquire/release cycles; compare their p99 with
    the p99 of ``baseline_s`` seconds before the sweep and ``baseline_s`` after it, pooled (the
    machine drifts: a window on one side only moved the ratio by half)."""
    await _reset(provider)
    await _fill(provider, 1, expired_rows, -3600)
    baseline: list[float] = []
    during: list[float] = []
    phase = {"samples": baseline}
    stop = asyncio.Event()

    async def worker(n: int) -> None:
        i = 0
        while not stop.is_set():
            latencies: list[float] = []
            await _cycles(provider, 1, f"load{n}:{i}", latencies)
            phase["samples"].append(latencies[0])
            i += 1

    running = [asyncio.create_task(worker(n)) for n in range(workers)]
    await asyncio.sleep(baseline_s)
    phase["samples"] = during
    started = time.perf_counter()
    sweeper = ExpirySweeper(provider) if batch_size is None else ExpirySweeper(provider, batch_size=batch_size)
    if duty_cycle is not None:
        sweeper.duty_cycle = duty_cycle
    removed = await sweeper.sweep_once()
    sweep_s = time.perf_counter() - started
    after: list[float] = []
    phase["samples"] = after
    await asyncio.sleep(baseline_s)
    stop.set()
    await asyncio.gather(*running)
    return {
        "rows_removed": removed,
        "sweep_s": sweep_s,
        "batch_size": sweeper.batch_size,
        "duty_cycle": sweeper.duty_cycle,
        "worker_p99_ms_without_sweep": percentile(baseline + after, 0.99),
        "worker_p99_ms_before_sweep": percentile(baseline, 0.99),
        "worker_p99_ms_after_sweep": percentile(after, 0.99),
        "worker_p99_ms_during_sweep": percentile(during, 0.99),
        "worker_cycles_during_sweep": len(during),
    }


async def renewal_load(
    provider: SqlLeaseProvider, leases: int = 10_000, renew_every_s: float = 5.0, seconds: float = 15.0
) -> dict[str, float]:
    """Hold ``leases`` leases with ``hold()`` (TTL 3x the renewal interval) for ``seconds``."""
    await _reset(provider)
    statements = 0

    def counted(sql: str, params: tuple[Any, ...]) -> None:
        nonlocal statements
        statements += 1

    stop_counting = provider.on_statement(counted)
    holds = [
        hold(
            provider,
            f"held:{i}",
            f"holder-{i}",
            renew_every_s * 3000,
            renew_every_ms=renew_every_s * 1000,
            on_lost="flag",
        )
        for i in range(leases)
    ]
    for chunk in range(0, leases, 500):
        await asyncio.gather(*(h.__aenter__() for h in holds[chunk : chunk + 500]))
    statements = 0
    collecting = {"started": 0.0, "seconds": 0.0, "full": 0}

    def timed(phase: str, info: dict[str, int]) -> None:  # the garbage collector's share of the CPU
        if phase == "start":
            collecting["started"] = time.process_time()
            return
        collecting["seconds"] += time.process_time() - collecting["started"]
        collecting["full"] += info["generation"] == 2

    gc.callbacks.append(timed)
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        await asyncio.sleep(seconds)
    finally:
        gc.callbacks.remove(timed)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    lost = sum(h.lost.is_set() for h in holds)
    renewed_statements = statements
    for chunk in range(0, leases, 500):
        await asyncio.gather(*(h.__aexit__(None, None, None) for h in holds[chunk : chunk + 500]))
    stop_counting()
    return {
        "leases": leases,
        "renew_every_s": renew_every_s,
        "statements_per_s": renewed_statements / wall,
        "expected_per_s": leases / renew_every_s,
        "client_cpu_share": cpu / wall,
        "gc_cpu_share": collecting["seconds"] / wall,
        "full_collections": collecting["full"],
        "lost": lost,
        "batched": callable(getattr(type(provider), "renew_many", None)),
    }


async def run_all(url: str, *, quick: bool = False, **options: Any) -> dict[str, Any]:
    """Every measurement above on ``url``; ``quick`` shrinks the sizes for a smoke run."""
    results: dict[str, Any] = {}
    async with bench_provider(url, **options) as provider:
        await _reset(provider)
        results["cycles"] = await cycle_throughput(provider, 500 if quick else 3000, 8)
        results["contention"] = await contention(provider, 64, 1.0 if quick else 3.0)
        sqlite = provider.dialect_name == "sqlite"
        if not sqlite:  # first, on a table that has not yet churned through a million rows
            results["renewals"] = await renewal_load(provider, 500 if quick else 10_000, 5.0, 6.0 if quick else 15.0)
        results["scale"] = await scale(provider, (1_000, 10_000 if quick else 1_000_000), 300 if quick else 2000)
        results["sweep"] = await sweep_under_load(
            provider, 20_000 if quick else 1_000_000, 8, None, 1.0 if quick else 3.0
        )
        await _reset(provider)
    return results


def format_results(url: str, results: dict[str, Any]) -> str:
    """A plain-text table of :func:`run_all`'s results."""
    lines = [f"sql_lease benchmark on {url}"]
    c = results["cycles"]
    lines.append("cycles/s (acquire+release):  " + "   ".join(f"{k.replace('_', ' ')} {v:,.0f}" for k, v in c.items()))
    k = results["contention"]
    lines.append(
        f"contention, {k['workers']} workers on one key: {k['attempts_per_s']:,.0f} attempts/s, "
        f"{k['acquisitions']} acquisitions ({k['attempts_per_acquisition']:,.1f} attempts each), "
        f"most holders at once {k['most_holders_at_once']}, errors {k['errors']}"
    )
    for size, r in results["scale"].items():
        lines.append(
            f"{int(size):>9,} rows: acquire p50 {r['acquire']['p50_ms']:.3f} ms p99 {r['acquire']['p99_ms']:.3f} ms"
            f" | renew p50 {r['renew']['p50_ms']:.3f} ms p99 {r['renew']['p99_ms']:.3f} ms"
        )
    s = results["sweep"]
    lines.append(
        f"sweep {s['rows_removed']:,} expired rows (batches of {s['batch_size']:,}): {s['sweep_s']:.2f} s; "
        f"workers' p99 {s['worker_p99_ms_without_sweep']:.2f} ms without, "
        f"{s['worker_p99_ms_during_sweep']:.2f} ms during"
    )
    if "renewals" in results:
        r = results["renewals"]
        lines.append(
            f"{r['leases']:,} leases renewed every {r['renew_every_s']:g} s: {r['statements_per_s']:,.0f} statements/s "
            f"(expected {r['expected_per_s']:,.0f}), client CPU {r['client_cpu_share']:.1%} "
            f"(garbage collector {r['gc_cpu_share']:.1%}, {r['full_collections']} full collections), lost {r['lost']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="sqlite:///sql_lease_bench.db")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only", choices=("renewals", "contention", "handoffs"), help="run one measurement and print it"
    )
    parser.add_argument("--leases", type=int, default=10_000, help="--only renewals: leases held")
    parser.add_argument("--renew-every", type=float, default=5.0, help="--only renewals: seconds (TTL 3x)")
    parser.add_argument("--seconds", type=float, default=20.0, help="--only renewals/contention: duration")
    parser.add_argument("--waiters", type=int, default=64, help="--only contention/handoffs: workers")
    args = parser.parse_args()
    if args.only is None:
        print(format_results(args.url, asyncio.run(run_all(args.url, quick=args.quick))))
    else:

        async def only() -> Any:
            if args.only == "handoffs":
                return [
                    await waiting_handoffs(args.url, args.waiters, providers, pool_size=2)
                    for providers in (1, min(8, args.waiters), min(32, args.waiters))
                ]
            async with bench_provider(args.url) as provider:
                await _reset(provider)
                if args.only == "renewals":
                    return await renewal_load(provider, args.leases, args.renew_every, args.seconds)
                return await contention(provider, args.waiters, args.seconds)

        print(asyncio.run(only()))
