"""The process's lease provider: one per process, shared by every thread, for ``DATABASES["default"]``.

Module level is fine: it reads the settings and connects on first use (after gunicorn/uWSGI forked
its workers; under ``manage.py test``, in the test database).
"""

from sql_lease.django import provider

leases = provider("default")
