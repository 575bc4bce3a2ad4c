"""Where the client's time goes in acquire/release cycles on PostgreSQL, sampled by py-spy.

    python benchmarks/profile_hot_path.py [--pg URL] [--workers 8] [--cycles 2500] [--engine]

``--engine`` runs the provider on an application's ``AsyncEngine`` (the engine executor) instead
of a URL.

Runs the cycles under ``py-spy record`` (the ``bench`` extra installs it; sampling a child needs no
privileges) and prints the share of samples per function: its own time, and the time inside each
sql_lease frame including what it calls. The driver, asyncio and the kernel's socket writes
appear under their own names, so what sql_lease itself costs stands apart.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent


async def cycles(url: str, workers: int, count: int, on_engine: bool) -> None:
    sys.path.insert(0, str(HERE))
    from lease_bench import _cycles, _reset, bench_provider
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://"), pool_size=10)
    try:
        async with bench_provider(engine if on_engine else url) as provider:
            await _reset(provider)
            await _cycles(provider, 200, "warm")
            await asyncio.gather(*(_cycles(provider, count, f"w{j}") for j in range(workers)))
    finally:
        await engine.dispose()


def summary(raw: Path, top: int) -> str:
    own: Counter[str] = Counter()
    inside: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any(frame.startswith("_cycles (") for frame in frames):
            continue  # start-up, imports, set-up: not the cycles
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inside[frame] += n
    lines = [
        f"{total} samples inside the cycles (idle waits in the event loop's select excluded)",
        "",
        "own time (top):",
    ]
    lines += [f"{n / total:6.1%}  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "sql_lease frames, with what they call:"]
    lines += [f"{n / total:6.1%}  {frame}" for frame, n in inside.most_common() if "sql_lease/" in frame][:top]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pg", default=os.environ.get("SQL_LEASE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=2500, help="per worker")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--engine", action="store_true", help="run on an application's AsyncEngine")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(cycles(args.pg, args.workers, args.cycles, args.engine))
        return
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "samples.txt"
        child = [sys.executable, __file__, "--child", "--pg", args.pg, "--workers", str(args.workers)]
        child += ["--cycles", str(args.cycles)] + (["--engine"] if args.engine else [])
        subprocess.run(
            [py_spy, "record", "-r", "500", "-f", "raw", "-o", str(raw), "--", *child],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(summary(raw, args.top))


if __name__ == "__main__":
    main()
