"""A cron job on several hosts, run once at a time with the ``@leased`` decorator.

    */5 * * * * python /srv/app/examples/cron_job.py --url "$DATABASE_URL"

Every host runs it; the one that gets the ``cleanup`` lease does the work (renewing the lease while
it runs), the others print that they skipped and exit 0. The same without any Python, for any
command, is ``sql-lease exec`` (it exits 75 when another host holds the key):

    */5 * * * * sql-lease exec cleanup --url "$DATABASE_URL" --ttl 60s -- /srv/app/cleanup.sh
"""

from __future__ import annotations

import argparse
import os
import time

from sql_lease import SyncSqlLeaseProvider, leased


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("SQL_LEASE_URL", "sqlite:///sql_lease.db"))
    parser.add_argument("--schema", default=os.environ.get("SQL_LEASE_SCHEMA"))
    parser.add_argument("--work-seconds", type=float, default=1.0, help="how long the pretend work takes")
    args = parser.parse_args()

    with SyncSqlLeaseProvider(args.url, schema=args.schema) as leases:

        @leased(leases, "cleanup", ttl_ms=60_000, on_conflict="skip")
        def cleanup(fence: int) -> int:
            print(f"cleanup running with fence {fence}", flush=True)
            time.sleep(args.work_seconds)  # the real work; write with the fence
            return fence

        if cleanup() is None:
            print("cleanup skipped: another host is running it", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
