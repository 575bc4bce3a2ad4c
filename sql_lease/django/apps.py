"""Django app ``sql_lease.django``: ``INSTALLED_APPS += ["sql_lease.django"]`` makes ``manage.py
migrate`` create the lease table (see :mod:`sql_lease.django.schema`)."""

from __future__ import annotations

from django.apps import AppConfig  # type: ignore[import-not-found,import-untyped,unused-ignore]


class SqlLeaseConfig(AppConfig):  # type: ignore[misc,unused-ignore]
    name = "sql_lease.django"
    label = "sql_lease"
    verbose_name = "sql_lease"
