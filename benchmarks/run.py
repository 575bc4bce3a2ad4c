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
import sys
import tempfile
from pathlib import Path
from typing import Any

from lease_bench import bench_provider, cycle_throughput, run_all

HERE = Path(__file__).resolve().parent
DEFAULT_FLOOR = HERE.parent.parent / "shared" / "bench" / "floor.py"


def load_floor(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("floor", path)
    if spec is None or spec.loader is None or not path.exists():
        raise SystemExit(f"floor.py not found at {path}; pass --floor PATH")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def sqlite_cycles(path: str, cycles: int, synchronous: str) -> dict[str, float]:
    async with bench_provider(f"sqlite:///{path}", sqlite_synchronous=synchronous) as provider:
        await provider.migrate()
        return await cycle_throughput(provider, cycles, 8)


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pg", default=os.environ.get("SQL_LEASE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--floor", type=Path, default=DEFAULT_FLOOR)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "latest.json")
    args = parser.parse_args()
    cycles = 500 if args.quick else 3000
    floor = load_floor(args.floor)

    print("measuring floors and peers ...", file=sys.stderr)
    floors = asyncio.run(
        floor.measure(["pg-raw", "redis-lock", "tooz-pg", "sqlite-raw", "sqlite-hop"], args.pg, cycles, 8)
    )
    hop_full = asyncio.run(floor.sqlite_hop(cycles, "FULL"))[0]
    print("measuring sql_lease on PostgreSQL ...", file=sys.stderr)
    pg = asyncio.run(run_all(args.pg, quick=args.quick))
    print("measuring sql_lease on SQLite ...", file=sys.stderr)
    workdir = tempfile.mkdtemp()
    sqlite_normal = asyncio.run(sqlite_cycles(f"{workdir}/normal.db", cycles, "NORMAL"))
    sqlite_full = asyncio.run(sqlite_cycles(f"{workdir}/full.db", cycles, "FULL"))
    sqlite = asyncio.run(run_all(f"sqlite:///{workdir}/bench.db", quick=args.quick, sqlite_synchronous="NORMAL"))

    pg_raw_1, pg_raw_8 = floors["pg-raw"]
    redis_1, redis_8 = floors["redis-lock"]
    hop = floors["sqlite-hop"][0]
    scale = pg["scale"]
    small, large = sorted(scale, key=int)[0], sorted(scale, key=int)[-1]
    sweep = pg["sweep"]
    renewals = pg["renewals"]
    held = f"{renewals['leases']:,} held leases, renewed every {renewals['renew_every_s']:g} s"
    targets = [
        ("PostgreSQL 1 worker / raw asyncpg", pg["cycles"]["1_worker"] / pg_raw_1, ">= 0.9", 0.9),
        ("PostgreSQL 8 workers / raw asyncpg", pg["cycles"]["8_workers"] / pg_raw_8, ">= 0.9", 0.9),
        ("PostgreSQL 8 workers / redis-py Lock", pg["cycles"]["8_workers"] / redis_8, ">= 1.2", 1.2),
        ("SQLite FULL 1 worker / one-hop floor FULL", sqlite_full["1_worker"] / hop_full, ">= 0.8", 0.8),
        ("SQLite NORMAL 1 worker / one-hop floor NORMAL", sqlite_normal["1_worker"] / hop, ">= 0.8", 0.8),
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

    lines = [f"machine: {machine()}", "", "cycles/s (acquire a free key, then release it)   1 worker   8 workers"]
    rows = [
        ("sql_lease PostgreSQL", pg["cycles"]["1_worker"], pg["cycles"]["8_workers"]),
        ("  floor: raw asyncpg", pg_raw_1, pg_raw_8),
        ("  peer: redis-py Lock", redis_1, redis_8),
        ("  peer: tooz PostgreSQL (sync)", floors["tooz-pg"][0], None),
        ("sql_lease SQLite, synchronous=NORMAL", sqlite_normal["1_worker"], sqlite_normal["8_workers"]),
        ("sql_lease SQLite, synchronous=FULL (default)", sqlite_full["1_worker"], sqlite_full["8_workers"]),
        ("  floor: sqlite3 + one thread hop, NORMAL", hop, None),
        ("  floor: sqlite3 + one thread hop, FULL", hop_full, None),
        ("  floor: sqlite3 synchronous", floors["sqlite-raw"][0], None),
    ]
    for name, one, eight in rows:
        lines.append(f"{name:46s} {one:9,.0f}  {eight:10,.0f}" if eight else f"{name:46s} {one:9,.0f}  {'':>10s}")
    lines += ["", f"{'target':55s}  value   goal     met"]
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
                "sqlite_hop_full": hop_full,
                "postgresql": pg,
                "sqlite": sqlite,
                "sqlite_cycles": {"NORMAL": sqlite_normal, "FULL": sqlite_full},
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
