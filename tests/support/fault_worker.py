"""A worker process for tests/test_faults.py.

hold    acquire KEYS keys with hold() (renewed every TTL/3), print one JSON line
        {"owner": ..., "fences": {key: fence}}, then keep holding until killed.
hammer  for DURATION seconds: acquire one of KEYS keys; while holding it, claim an O_EXCL
        marker file (finding it taken is a violation), append "key fence owner" to the shared
        log, renew once or twice (a refused renewal of a lease we hold is a violation),
        release (a refused release is a violation). Prints a JSON summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sql_lease import LeaseBackendError, SqlLeaseProvider


async def hold(args: argparse.Namespace) -> None:
    owner = f"holder-{os.getpid()}"
    async with SqlLeaseProvider(args.url, schema=args.schema or None) as provider, contextlib.AsyncExitStack() as stack:
        fences = {}
        for i in range(args.keys):
            key = f"{args.prefix}:{i}"
            lease = await stack.enter_async_context(provider.hold(key, owner, ttl_ms=args.ttl_ms))
            fences[key] = lease.fence
        print(json.dumps({"owner": owner, "fences": fences}), flush=True)
        await asyncio.Event().wait()  # hold until killed


async def hammer(args: argparse.Namespace) -> dict[str, int]:
    stats = {"operations": 0, "acquired": 0, "refused": 0, "renewed": 0, "violations": 0, "errors": 0}
    owner = f"hammer-{args.worker}-{os.getpid()}"
    log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def op(coroutine):  # type: ignore[no-untyped-def]
        stats["operations"] += 1
        try:
            return await coroutine
        except LeaseBackendError as exc:
            stats["errors"] += 1
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return None

    async with SqlLeaseProvider(args.url, schema=args.schema or None, pgbouncer=args.pgbouncer) as provider:
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            key = f"{args.prefix}:{random.randrange(args.keys)}"
            result = await op(provider.acquire_lease(key, owner, args.ttl_ms))
            if result is None:
                continue
            if not result.acquired:
                stats["refused"] += 1
                await asyncio.sleep(random.uniform(0, 0.002))
                continue
            stats["acquired"] += 1
            marker: Path | None = Path(args.dir) / key.replace(":", "_")
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # type: ignore[arg-type]
            except FileExistsError:
                stats["violations"] += 1
                print(f"violation: {key} marker taken while {owner} holds fence {result.fence}", file=sys.stderr)
                marker = None
            os.write(log_fd, f"{key} {result.fence} {owner}\n".encode())
            for _ in range(random.randint(1, 2)):
                await asyncio.sleep(random.uniform(0, 0.002))
                renewed = await op(provider.renew_lease(key, owner, args.ttl_ms))
                if renewed is False:
                    stats["violations"] += 1
                    print(f"violation: renewing {key} held by {owner} refused", file=sys.stderr)
                elif renewed:
                    stats["renewed"] += 1
            if marker is not None:
                os.unlink(marker)
            released = await op(provider.release_lease(key, owner))
            if released is False:
                stats["violations"] += 1
                print(f"violation: releasing {key} held by {owner} refused", file=sys.stderr)
    os.close(log_fd)
    return stats


def run_workers(argvs: Sequence[Sequence[str]], cwd: Path, timeout_s: float) -> list[tuple[int, str, str]]:
    """Run this script once per argument list, all at once; see ``processes.run_scripts``."""
    from tests.support.processes import run_scripts

    return run_scripts(__file__, argvs, cwd, timeout_s)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["hold", "hammer"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", default="")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--ttl-ms", type=int, default=5_000)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--dir", default="")
    parser.add_argument("--log", default="")
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--pgbouncer", action="store_true")
    parsed = parser.parse_args()
    if parsed.mode == "hold":
        asyncio.run(hold(parsed))
    else:
        print(json.dumps(asyncio.run(hammer(parsed))), flush=True)
