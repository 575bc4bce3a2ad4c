"""APScheduler 3 in every process (gunicorn's workers, several hosts): each scheduled run happens
exactly once across all of them.

    python examples/apscheduler_jobs.py --url "$DATABASE_URL" --seconds 60   # start it several times

Each process runs a ``BackgroundScheduler`` with the same interval job, firing on whole seconds.
The job is ``@leased`` with a key per slot (its scheduled second, so processes whose clocks or
schedulers differ a little still agree on the key): the first process to fire takes the slot's
lease, the others skip. When the run is done it hands the lease to a ``done`` marker
(``lease.transfer_to``) that keeps the slot taken for ``DONE_TTL_MS``, so a process that fires late,
after the run, still skips it: a released key would be free again.

Environment: ``SQL_LEASE_SCHEMA`` (optional), ``RECIPE_RUN_LOG``: a file each run appends
``slot pid`` to (the test reads it).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from sql_lease import LeaseLostError, SyncHeldLease, SyncSqlLeaseProvider, leased

INTERVAL_S = 1
DONE_TTL_MS = 60_000  # longer than any two processes fire apart


def current_slot() -> str:
    """The scheduled second this run belongs to: the job fires on whole seconds, a little late."""
    return datetime.fromtimestamp(round(time.time()), UTC).strftime("%Y-%m-%dT%H:%M:%S")


def make_job(leases: SyncSqlLeaseProvider):  # type: ignore[no-untyped-def]
    @leased(leases, lambda: f"report:{current_slot()}", ttl_ms=30_000, on_conflict="skip")
    def report(lease: SyncHeldLease) -> None:
        slot = lease.key.removeprefix("report:")
        if log := os.environ.get("RECIPE_RUN_LOG"):  # the real work goes here
            with open(log, "a") as f:
                f.write(f"{slot} {os.getpid()}\n")
        lease.transfer_to(f"done:{slot}", ttl_ms=DONE_TTL_MS)  # keep the slot taken: no late rerun

    def job() -> None:
        try:
            report()
        except LeaseLostError as lost:  # lost during the run (broken, expired): say so, no traceback
            print(f"report run lost its lease: {lost.reason}", flush=True)

    return job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("SQL_LEASE_URL", "sqlite:///sql_lease.db"))
    parser.add_argument("--schema", default=os.environ.get("SQL_LEASE_SCHEMA"))
    parser.add_argument("--seconds", type=float, default=60.0, help="run the scheduler this long")
    args = parser.parse_args()

    with SyncSqlLeaseProvider(args.url, schema=args.schema) as leases:
        first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)  # whole seconds
        scheduler = BackgroundScheduler(timezone=UTC)
        scheduler.add_job(
            make_job(leases),
            IntervalTrigger(seconds=INTERVAL_S, start_date=first, timezone=UTC),
            id="report",
            coalesce=True,
            max_instances=1,
        )
        scheduler.start()
        try:
            time.sleep(args.seconds)
        finally:
            scheduler.shutdown(wait=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
