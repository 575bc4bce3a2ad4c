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

from sql_lease import LeaseLostError, SyncHeldLease, SyncSqlLeaseProvider, leased


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("SQL_LEASE_URL", "sqlite:///sql_lease.db"))
    parser.add_argument("--schema", default=os.environ.get("SQL_LEASE_SCHEMA"))
    parser.add_argument("--work-seconds", type=float, default=1.0, help="how long the pretend work takes")
    args = parser.parse_args()

    with SyncSqlLeaseProvider(args.url, schema=args.schema) as leases:

        @leased(leases, "cleanup", ttl_ms=60_000, on_conflict="skip")
        def cleanup(lease: SyncHeldLease) -> int:
            print(f"cleanup running with fence {lease.fence}", flush=True)
            time.sleep(args.work_seconds)  # the real work, in steps; write with lease.fence
            lease.check()  # between steps: LeaseLostError once a renewal was refused (broken, expired)
            return lease.fence

        try:
            if cleanup() is None:
                print("cleanup skipped: another host is running it", flush=True)
        except LeaseLostError as lost:  # stop: another host may be running it now
            print(f"cleanup stopped: {lost}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
