"""A worker process of tests/test_semaphore_races.py: races acquire(limit=N)/release on one key.

``cycle``: for ``--duration`` seconds, acquire a slot; when granted, read the database's clock
(expires_at - remaining_ms of its own slot) just after the grant and just before the release, hold
a few ms in between, release; prints one JSON line per grant and a summary last. ``die``: take a
slot and exit without releasing it (prints the grant).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sql_lease import SyncSqlLeaseProvider


def db_now_ms(provider: SyncSqlLeaseProvider, key: str, owner: str) -> tuple[float | None, float | None]:
    """The database's clock and the slot's tenure start (epoch ms), read from the owner's own slot;
    (None, None) if it holds none."""
    for holder in provider.get_lease_holders(key):
        if holder.owner == owner and holder.acquired_at is not None:
            now = holder.expires_at - timedelta(milliseconds=holder.remaining_ms)
            return now.timestamp() * 1000, holder.acquired_at.timestamp() * 1000
    return None, None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["cycle", "die"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", default="")
    parser.add_argument("--key", required=True)
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--worker", required=True)
    args = parser.parse_args()
    summary = {"granted": 0, "refused": 0, "errors": 0, "lost": 0}
    with SyncSqlLeaseProvider(args.url, schema=args.schema or None) as provider:
        if args.mode == "die":
            owner = f"dead-{args.worker}"
            result = provider.acquire_lease(args.key, owner, args.ttl, limit=args.limit)
            print(json.dumps({"owner": owner, "acquired": result.acquired, "fence": result.fence}), flush=True)
            os._exit(0)  # no release, no close: the slot must outlive its holder until expiry
        owner = f"w{args.worker}-{os.getpid()}"
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            try:
                result = provider.acquire_lease(args.key, owner, args.ttl, limit=args.limit)
            except Exception as exc:  # counted: the audit wants none
                summary["errors"] += 1
                print(json.dumps({"error": repr(exc)}), file=sys.stderr, flush=True)
                continue
            if not result.acquired:
                summary["refused"] += 1
                time.sleep(random.uniform(0.0, 0.005))
                continue
            summary["granted"] += 1
            start, granted_at = db_now_ms(provider, args.key, owner)
            time.sleep(random.uniform(0.005, 0.02))
            end, _ = db_now_ms(provider, args.key, owner)
            released = provider.release_lease(args.key, owner, fence=result.fence)
            if start is None or end is None or not released:
                summary["lost"] += 1
            print(
                json.dumps(
                    {"owner": owner, "fence": result.fence, "granted_at": granted_at, "start": start, "end": end}
                ),
                flush=True,
            )
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
