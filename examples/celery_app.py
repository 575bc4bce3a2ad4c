"""Celery: a task that runs once at a time across every worker, with ``@leased(..., on_conflict="skip")``.

    pip install 'sql-lease[recipes]'
    export DATABASE_URL=postgresql://app:secret@127.0.0.1:5432/app
    sql-lease migrate --url "$DATABASE_URL"
    celery -A examples.celery_app worker --loglevel=info      # on as many hosts as you like
    python -c 'from examples.celery_app import rebuild_index; rebuild_index.delay()'

A ``rebuild_index`` delivered while another worker runs it returns ``"skipped"`` at once; the
holder is logged at INFO on the ``sql_lease`` logger. (``on_conflict="wait"`` would queue behind
the holder instead.)

Environment: ``DATABASE_URL``, ``SQL_LEASE_SCHEMA`` (optional), ``CELERY_BROKER_URL`` (default
Redis db 15 on 127.0.0.1), ``CELERY_QUEUE``, and ``RECIPE_RUN_LOG``: a file each run appends
``pid start end fence`` to (the test reads it).
"""

from __future__ import annotations

import logging
import os
import time

from celery import Celery

from sql_lease import LeaseLostError, SyncSqlLeaseProvider, leased

BROKER = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
logger = logging.getLogger(__name__)

app = Celery("examples.celery_app", broker=BROKER, backend=os.environ.get("CELERY_RESULT_BACKEND", BROKER))
app.conf.task_default_queue = os.environ.get("CELERY_QUEUE", "sql_lease_examples")
app.conf.worker_prefetch_multiplier = 1
app.conf.broker_connection_retry_on_startup = True

# One per process. It connects on first use, so with the prefork pool each child opens its own
# connections after the fork (nothing is opened in the parent).
leases = SyncSqlLeaseProvider(os.environ["DATABASE_URL"], schema=os.environ.get("SQL_LEASE_SCHEMA"))


@leased(leases, "celery:rebuild-index", ttl_ms=30_000, on_conflict="skip")
def rebuild_index_once(fence: int, work_seconds: float) -> int:
    start = time.time()
    time.sleep(work_seconds)  # the real work; write with the fence
    end = time.time()
    if log := os.environ.get("RECIPE_RUN_LOG"):
        with open(log, "a") as f:  # one short append: lines of concurrent writers do not mix
            f.write(f"{os.getpid()} {start:.6f} {end:.6f} {fence}\n")
    return fence


@app.task
def rebuild_index(work_seconds: float = 1.0) -> str | int:
    try:
        fence = rebuild_index_once(work_seconds=work_seconds)
    except LeaseLostError as lost:  # the lease was lost during the run: another worker may run it now
        logger.warning("rebuild_index lost its lease: %s", lost.reason)
        return "lost"
    return "skipped" if fence is None else fence
