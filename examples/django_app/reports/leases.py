"""The process's lease provider: one per process, shared by every thread, built from ``settings.DATABASES``."""

from django.conf import settings

from sql_lease import SyncSqlLeaseProvider
from sql_lease.django import sql_lease_url_from_django

# Module level is fine: it connects on first use (after gunicorn/uWSGI forked its workers).
leases = SyncSqlLeaseProvider(sql_lease_url_from_django("default"), schema=settings.SQL_LEASE_SCHEMA)
