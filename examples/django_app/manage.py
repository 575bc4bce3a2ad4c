#!/usr/bin/env python
"""A minimal Django project that uses sql_lease: the lease URL comes from ``settings.DATABASES``.

    pip install 'sql-lease[recipes]'        # psycopg 3 and Django (among others)
    export DATABASE_URL=postgresql://app:secret@127.0.0.1:5432/app
    sql-lease migrate --url "$DATABASE_URL"  # the lease table, once
    cd examples/django_app
    python manage.py migrate                 # the app's own tables
    python manage.py nightly_report          # runs once at a time across every host (see reports/)
    python manage.py runserver               # POST /threads/<id>/claim with run=<run id>

Environment: ``DATABASE_URL`` (required), ``DJANGO_DB_SCHEMA`` (optional: the schema Django's
tables go in, through ``search_path``), ``SQL_LEASE_SCHEMA`` (optional: the lease table's schema).
"""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "leasesite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
