"""``python manage.py nightly_report``: run from cron on every host; one at a time runs it.

    */10 * * * * cd /srv/app && python manage.py nightly_report

While another host holds the ``nightly-report`` lease, the command prints that it skipped and
exits 0.
"""

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from sql_lease import LeaseLostError, SyncHeldLease, leased
from sql_lease.django import check_held

from ...leases import leases
from ...models import Report


@leased(leases, "nightly-report", ttl_ms=60_000, on_conflict="skip")
def build_report(lease: SyncHeldLease, work_seconds: float = 0.0) -> Report:
    with transaction.atomic():
        time.sleep(work_seconds)  # the report's real work
        check_held(lease.key, lease.owner, lease.fence)  # lost: LeaseLostError, the block rolls back
        return Report.objects.create(name="nightly", fence=lease.fence)


class Command(BaseCommand):
    help = "Build the nightly report, unless another process is building it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--work-seconds", type=float, default=0.0, help="pretend the work takes this long")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = build_report(work_seconds=options["work_seconds"])
        except LeaseLostError as lost:  # lost while building: its transaction was rolled back
            raise CommandError(f"nightly report stopped: {lost}") from lost
        if report is None:
            self.stdout.write("skipped: another process holds the nightly-report lease")
        else:
            self.stdout.write(f"report {report.pk} written with fence {report.fence}")
