"""The whole benchmark: sql_lease beside the raw-driver floors and the peers, in one run.

    python benchmarks/run.py [--pg URL] [--floor ../shared/bench/floor.py] [--quick] [--json FILE]

Floors and peers come from the workplace's ``floor.py`` (raw asyncpg, stdlib sqlite3, sqlite3 with
one thread hop per operation, redis-py's asyncio Lock on 127.0.0.1:6379, tooz's PostgreSQL driver),
measured in this same run, so every ratio compares figures taken minutes apart on one machine.
Needs the ``bench`` extra (``pip install -e '.[bench]'``) and a Redis on 127.0.0.1:6379.

Targets (issue "Performance"; ratios in one run, this machine), each printed with met / NOT met:
  PostgreSQL 1 worker and 8 workers >= 0.9 x raw asyncpg (the floor's two durable commits)
  PostgreSQL 8 workers >= 1.2 x redis-py Lock
  SQLite through the async API >= 0.8 x the one-hop floor at the same synchronous, FULL and NORMAL
  10,000 held leases renewed every 5 s: <= 20 statements/s, <= 5 % of a client core, none lost
  p99 acquire during a 10^6-row sweep <= 1.5 x without; p50 acquire at 10^6 rows <= 1.25 x at 10^3
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lease_bench import _cycles, _reset, bench_provider, cycle_throughput, run_all

HERE = Path(__file__).resolve().parent
DEFAULT_FLOOR = HERE.parent.parent / "shared" / "bench" / "floor.py"


def load_floor(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("floor", path)
    if spec is None or spec.loader is None or not path.exists():
        raise SystemExit(f"floor.py not found at {path}; pass --floor PATH")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def side_by_side(floor: Any, pg_url: str, cycles: int, rounds: int) -> dict[str, Any]:
    """sql_lease and its floors and peers measured in alternating rounds; the median of each
    figure, and the median of each per-round ratio (noise on a shared machine moves both sides of
    a round together)."""
    per_round: dict[str, list[float]] = {}

    def note(name: str, value: float) -> None:
        per_round.setdefault(name, []).append(value)

    workdir = tempfile.mkdtemp()
    async with bench_provider(pg_url) as provider:
        await _reset(provider)
        for _ in range(rounds):
            raw_1, raw_8 = await floor.pg_raw(pg_url, cycles, 8)
            redis_1, redis_8 = await floor.redis_lock(cycles, 8)
            await _reset(provider)  # the floor starts each round on a new table; ours on a vacuumed one
            ours = await cycle_throughput(provider, cycles, 8)
            note("pg_raw_1", raw_1), note("pg_raw_8", raw_8), note("redis_1", redis_1), note("redis_8", redis_8)
            note("pg_1", ours["1_worker"]), note("pg_8", ours["8_workers"])
    for synchronous in ("NORMAL", "FULL"):
        async with bench_provider(f"sqlite:///{workdir}/{synchronous}.db", sqlite_synchronous=synchronous) as lite:
            await lite.migrate()
            for _ in range(rounds):
                note(f"hop_{synchronous}", (await floor.sqlite_hop(cycles, synchronous))[0])
                await _cycles(lite, 50, "warm")
                started = time.perf_counter()
                await _cycles(lite, cycles, "seq")
                note(f"sqlite_{synchronous}", cycles / (time.perf_counter() - started))

    def ratios(ours: str, base: str) -> float:
        return statistics.median(o / b for o, b in zip(per_round[ours], per_round[base], strict=True))

    return {
        "rounds": per_round,
        "medians": {name: statistics.median(values) for name, values in per_round.items()},
        "ratios": {
            "pg_raw_1": ratios("pg_1", "pg_raw_1"),
            "pg_raw_8": ratios("pg_8", "pg_raw_8"),
            "redis_8": ratios("pg_8", "redis_8"),
            "sqlite_NORMAL": ratios("sqlite_NORMAL", "hop_NORMAL"),
            "sqlite_FULL": ratios("sqlite_FULL", "hop_FULL"),
        },
    }


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pg", default=os.environ.get("SQL_LEASE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--floor", type=Path, default=DEFAULT_FLOOR)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of sql_lease and its floors")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "latest.json")
    args = parser.parse_args()
    cycles = 500 if args.quick else 3000
    floor = load_floor(args.floor)

    rounds = 3 if args.quick else args.rounds
    print(f"measuring sql_lease beside the floors and peers, {rounds} interleaved rounds ...", file=sys.stderr)
    side = asyncio.run(side_by_side(floor, args.pg, cycles, rounds))
    floors = asyncio.run(floor.measure(["tooz-pg", "sqlite-raw"], args.pg, cycles, 8))
    print("measuring sql_lease on PostgreSQL ...", file=sys.stderr)
    pg = asyncio.run(run_all(args.pg, quick=args.quick))
    print("measuring sql_lease on SQLite ...", file=sys.stderr)
    workdir = tempfile.mkdtemp()
    sqlite = asyncio.run(run_all(f"sqlite:///{workdir}/bench.db", quick=args.quick, sqlite_synchronous="NORMAL"))

    ratio = side["ratios"]
    scale = pg["scale"]
    small, large = sorted(scale, key=int)[0], sorted(scale, key=int)[-1]
    sweep = pg["sweep"]
    renewals = pg["renewals"]
    held = f"{renewals['leases']:,} held leases, renewed every {renewals['renew_every_s']:g} s"
    targets = [
        ("PostgreSQL 1 worker / raw asyncpg", ratio["pg_raw_1"], ">= 0.9", 0.9),
        ("PostgreSQL 8 workers / raw asyncpg", ratio["pg_raw_8"], ">= 0.9", 0.9),
        ("PostgreSQL 8 workers / redis-py Lock", ratio["redis_8"], ">= 1.2", 1.2),
        ("SQLite FULL 1 worker / one-hop floor FULL", ratio["sqlite_FULL"], ">= 0.8", 0.8),
        ("SQLite NORMAL 1 worker / one-hop floor NORMAL", ratio["sqlite_NORMAL"], ">= 0.8", 0.8),
        (f"{held}: statements/s", renewals["statements_per_s"], "<= 20", -20.0),
        (f"{held}: client CPU share", renewals["client_cpu_share"], "<= 0.05", -0.05),
        (f"{held}: leases lost", renewals["lost"], "<= 0", -0.0),
        (
            "p99 acquire during a sweep / without",
            sweep["worker_p99_ms_during_sweep"] / sweep["worker_p99_ms_without_sweep"],
            "<= 1.5",
            -1.5,
        ),
        (
            f"p50 acquire {int(large):,} rows / {int(small):,} rows",
            scale[large]["acquire"]["p50_ms"] / scale[small]["acquire"]["p50_ms"],
            "<= 1.25",
            -1.25,
        ),
    ]

    med = side["medians"]
    lines = [
        f"machine: {machine()}",
        "",
        f"cycles/s (acquire a free key, then release it), median of {rounds} interleaved rounds   1 worker   8 workers",
    ]
    rows = [
        ("sql_lease PostgreSQL", med["pg_1"], med["pg_8"]),
        ("  floor: raw asyncpg", med["pg_raw_1"], med["pg_raw_8"]),
        ("  peer: redis-py Lock", med["redis_1"], med["redis_8"]),
        ("  peer: tooz PostgreSQL (sync)", floors["tooz-pg"][0], None),
        ("sql_lease SQLite, synchronous=NORMAL", med["sqlite_NORMAL"], None),
        ("sql_lease SQLite, synchronous=FULL (default)", med["sqlite_FULL"], None),
        ("  floor: sqlite3 + one thread hop, NORMAL", med["hop_NORMAL"], None),
        ("  floor: sqlite3 + one thread hop, FULL", med["hop_FULL"], None),
        ("  floor: sqlite3 synchronous", floors["sqlite-raw"][0], None),
    ]
    for name, one, eight in rows:
        lines.append(f"{name:46s} {one:9,.0f}  {eight:10,.0f}" if eight else f"{name:46s} {one:9,.0f}  {'':>10s}")
    lines += ["", f"{'target (ratios: median of the per-round ratios)':55s}  value   goal     met"]
    for name, ratio, goal, bound in targets:
        met = ratio >= bound if bound > 0 else ratio <= -bound
        lines.append(f"{name:55s} {ratio:6.2f}   {goal:7s}  {'yes' if met else 'NO'}")
    from lease_bench import format_results

    lines += ["", format_results(args.pg, pg), "", format_results("sqlite (synchronous=NORMAL)", sqlite)]
    report = "\n".join(lines)
    print(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "machine": machine(),
                "floors": {k: {"1_worker": v[0], "8_workers": v[1]} for k, v in floors.items()},
                "side_by_side": side,
                "postgresql": pg,
                "sqlite": sqlite,
                "targets": [
                    {"name": n, "value": r, "goal": g, "met": r >= b if b > 0 else r <= -b} for n, r, g, b in targets
                ],
                "report": report,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
