"""One worker process of the mutual-exclusion test.

Loops for DURATION seconds: acquire one of KEYS keys; while holding it, claim a marker file with
O_EXCL (a second holder inside the same key would find it taken: a violation), append
"key fence" to the shared log, release. Prints a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

from sql_lease import LeaseBackendError, SqlLeaseProvider


async def main(args: argparse.Namespace) -> dict[str, int]:
    stats = {"acquired": 0, "refused": 0, "violations": 0, "errors": 0}
    owner = f"worker-{args.worker}-{os.getpid()}"
    log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    async with SqlLeaseProvider(args.url, schema=args.schema or None) as provider:
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            key = f"{args.prefix}:{random.randrange(args.keys)}"
            try:
                result = await provider.acquire_lease(key, owner, 5_000)
            except LeaseBackendError as exc:
                stats["errors"] += 1
                print(f"error: {exc}", flush=True, file=__import__("sys").stderr)
                continue
            if not result.acquired:
                stats["refused"] += 1
                await asyncio.sleep(random.uniform(0, 0.002))
                continue
            stats["acquired"] += 1
            marker = Path(args.dir) / key.replace(":", "_")
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.close(fd)
            except FileExistsError:
                stats["violations"] += 1
                marker = None  # type: ignore[assignment]
            os.write(log_fd, f"{key} {result.fence} {owner}\n".encode())
            await asyncio.sleep(random.uniform(0, 0.003))
            if marker is not None:
                os.unlink(marker)
            try:
                if not await provider.release_lease(key, owner):
                    stats["violations"] += 1  # we held it unexpired, so the release must succeed
            except LeaseBackendError:
                stats["errors"] += 1
    os.close(log_fd)
    return stats


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", default="")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--worker", type=int, default=0)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
