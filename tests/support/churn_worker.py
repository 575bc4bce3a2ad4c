"""One process of the fence-churn test: tasks acquire, renew, transfer and release a few keys with
tiny TTLs as fast as they can. Prints a JSON summary: refusals that named a stale holder."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from sql_lease import SqlLeaseProvider


async def main(args: argparse.Namespace) -> dict[str, int]:
    stats = {"operations": 0, "stale_refusals": 0}
    keys = [f"{args.prefix}:{i}" for i in range(args.keys)]
    ttls = [1, 2, 5, 20, 100]

    async with SqlLeaseProvider(args.url, schema=args.schema or None) as provider:

        async def task(me: str) -> None:
            held: set[str] = set()
            deadline = time.monotonic() + args.duration
            while time.monotonic() < deadline:
                key, ttl = random.choice(keys), random.choice(ttls)
                stats["operations"] += 1
                if key not in held:
                    sent = time.time()
                    result = await provider.acquire_lease(key, me, ttl)
                    if result.acquired:
                        held.add(key)
                    elif result.owner == me or (result.expires_at and result.expires_at.timestamp() < sent - 0.002):
                        stats["stale_refusals"] += 1
                    continue
                choice = random.random()
                if choice < 0.3:
                    if not await provider.renew_lease(key, me, ttl):
                        held.discard(key)
                elif choice < 0.6:
                    held.discard(key)
                    await provider.transfer_lease(key, me, f"{me}>next", ttl)
                else:
                    held.discard(key)
                    await provider.release_lease(key, me)

        await asyncio.gather(*(task(f"p{args.worker}t{j}") for j in range(args.tasks)))
    return stats


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", default="")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--worker", type=int, default=0)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
