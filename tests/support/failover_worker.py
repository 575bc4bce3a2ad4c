"""A load process for tests/test_failover.py: acquires, renews, transfers and releases on a few keys
until SIGTERM, and logs every operation as one JSON line.

Records: ``{"op", "key", "owner", "t0", "t1"}`` (process clock, seconds since the epoch, before the
call and after the answer) plus ``"error"`` and ``"kind"`` (the exception's class), or the answer: ``fence``
and ``expires`` (the database's clock) of an acquire, renewal or the read after a transfer,
``ok`` of a release or transfer. On one machine the database's clock is the process clock.
A refused renewal or release of a lease whose last acknowledged expiry is still ahead is a lost
acknowledgement: logged as ``"op": "violation"``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO, TypeVar

from sql_lease import SqlLeaseProvider

T = TypeVar("T")
# A refusal this long before the acknowledged expiry cannot be the expiry itself.
MARGIN_S = 0.25


async def run(args: argparse.Namespace, log: TextIO) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    owners = [f"w{args.worker}a-{os.getpid()}", f"w{args.worker}b-{os.getpid()}"]

    def write(record: dict[str, Any]) -> None:
        log.write(json.dumps(record) + "\n")

    async def call(
        op: str, key: str, owner: str, make: Callable[[], Awaitable[T]], tenure: int | None = None
    ) -> tuple[bool, T | None]:
        t0 = time.time()
        base = {"op": op, "key": key, "owner": owner, "tenure": tenure, "t0": t0}
        try:
            answer = await make()
        except Exception as exc:  # the test requires every one to be a LeaseBackendError
            write({**base, "t1": time.time(), "error": str(exc)[:200], "kind": type(exc).__name__})
            await asyncio.sleep(0.05)
            return False, None
        record: dict[str, Any] = {**base, "t1": time.time()}
        if isinstance(answer, bool):
            record["ok"] = answer
        elif answer is not None:
            record["ok"] = bool(getattr(answer, "acquired", True))
            record["fence"] = answer.fence  # type: ignore[attr-defined]
            record["expires"] = answer.expires_at.timestamp()  # type: ignore[attr-defined]
            record["holder"] = answer.owner  # type: ignore[attr-defined]
        else:
            record["ok"] = False
        write(record)
        return True, answer

    def lost_ack(op: str, key: str, owner: str, expires: float, t0: float) -> None:
        if expires - t0 > MARGIN_S:
            write({"op": "violation", "key": key, "owner": owner, "what": f"{op} refused {expires - t0:.2f} s early"})

    async with SqlLeaseProvider(args.url, operation_timeout_s=args.op_timeout_s, pool_size=4) as provider:
        while not stop.is_set():
            key = f"{args.prefix}:{random.randrange(args.keys)}"
            owner = owners[0]
            answered, result = await call(
                "acquire", key, owner, functools.partial(provider.acquire_lease, key, owner, args.ttl_ms)
            )
            if not answered or result is None or not result.acquired:
                await asyncio.sleep(random.uniform(0.005, 0.02))
                continue
            expires, fence = result.expires_at.timestamp(), result.fence  # type: ignore[union-attr]
            for _ in range(random.randint(1, 2)):
                await asyncio.sleep(random.uniform(0, 0.01))
                t0 = time.time()
                answered, info = await call(
                    "renew", key, owner, functools.partial(provider.renew_lease_info, key, owner, args.ttl_ms), fence
                )
                if answered and info is None:
                    lost_ack("renew", key, owner, expires, t0)
                    break
                if info is not None:
                    expires = info.expires_at.timestamp()
            if random.random() < 0.3:
                t0 = time.time()
                answered, moved = await call(
                    "transfer",
                    key,
                    owner,
                    functools.partial(provider.transfer_lease, key, owner, owners[1], args.ttl_ms),
                    fence,
                )
                if answered and not moved:
                    lost_ack("transfer", key, owner, expires, t0)
                if moved:
                    owner = owners[1]
                    _, read = await call("read", key, owner, functools.partial(provider.get_lease, key))
                    fence = read.fence if read is not None and read.owner == owner else None
            t0 = time.time()
            answered, released = await call(
                "release", key, owner, functools.partial(provider.release_lease, key, owner), fence
            )
            if answered and not released and owner == owners[0]:
                lost_ack("release", key, owner, expires, t0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--ttl-ms", type=int, default=5_000)
    parser.add_argument("--op-timeout-s", type=float, default=2.0)
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--log", required=True)
    parsed = parser.parse_args()
    with open(parsed.log, "a", buffering=1) as log_file:
        asyncio.run(run(parsed, log_file))
