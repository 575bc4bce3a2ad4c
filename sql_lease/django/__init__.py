"""Django: the lease table by ``manage.py migrate``, a provider for a database alias, fenced ORM writes.

::

    # settings.py
    INSTALLED_APPS += ["sql_lease.django"]  # manage.py migrate [--database ALIAS] creates the lease table

    # myproject/leases.py
    from sql_lease.django import provider

    leases = provider("default")  # module level: reads DATABASES["default"] and connects on first use

The app's migration runs the Alembic migrations' statements on Django's connection (see
:mod:`sql_lease.django.schema`); :func:`provider` follows the alias to the test database under
``manage.py test``. :func:`sql_lease_url_from_django` gives the alias's URL itself.

The provider keeps connections of its own (psycopg 3 in autocommit, or the standard ``sqlite3``):
lease statements never run inside Django's transaction (``ATOMIC_REQUESTS``, ``transaction.atomic``),
so an acquire commits at once and stays done when the request's transaction rolls back.

Fenced writes with Django's ORM: :func:`check_held` and :func:`accept_fence` run the statements of
``SyncSqlLeaseProvider.check_held``/``accept_fence`` on Django's own connection, inside your
``transaction.atomic()`` block, so the ORM writes of that block commit only while the lease is held::

    from django.db import transaction
    from sql_lease.django import check_held

    from myproject.leases import leases  # the provider above

    with leases.hold("invoice:42", ttl_ms=15_000) as lease, transaction.atomic():
        check_held(lease.key, lease.owner, lease.fence)  # else LeaseLostError: the block rolls back
        Invoice.objects.filter(pk=42).update(sent=True)

Django itself is imported only inside the functions: importing this module needs no Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from ..sql.fencing import (
    accept_fence_result,
    check_held_result,
    format_paramstyle_statement,
    validate_check,
    validate_fence,
    validate_resource,
)
from ..sql.schema import DEFAULT_TABLE_NAME, LeaseTableNames
from .providers import DjangoSqlLeaseProvider, provider
from .schema import ONLY_POSTGRES_AND_SQLITE

__all__ = ["DjangoSqlLeaseProvider", "accept_fence", "check_held", "provider", "sql_lease_url_from_django"]

_POSTGRES_ENGINES = (
    "django.db.backends.postgresql",
    "django.db.backends.postgresql_psycopg2",
    "django.contrib.gis.db.backends.postgis",
)
_SQLITE_ENGINES = ("django.db.backends.sqlite3", "django.contrib.gis.db.backends.spatialite")
# OPTIONS Django reads itself; they are not libpq connection parameters.
_DJANGO_ONLY_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "pool", "assume_role", "cursor_factory", "context", "prepare_threshold"}
)


def sql_lease_url_from_django(alias: str = "default") -> str:
    """The ``sql_lease`` URL of the database ``settings.DATABASES[alias]`` names.

    PostgreSQL (``django.db.backends.postgresql``, PostGIS) becomes
    ``postgresql://USER:PASSWORD@HOST:PORT/NAME``, each part percent-encoded; a ``HOST`` that is a
    Unix socket directory (``/var/run/postgresql``) and the libpq parameters of ``OPTIONS``
    (``sslmode``, ``sslrootcert``, ``options``, ``service``, ``application_name``...: every
    ``str``/``int`` value except the options Django reads itself, such as ``isolation_level`` and
    ``pool``) go into the query. SQLite (``django.db.backends.sqlite3``) becomes
    ``sqlite:////absolute/path/of/NAME``.

    The URL holds the password in clear: pass it to ``SyncSqlLeaseProvider`` (or
    ``SqlLeaseProvider``), do not log it (the providers' ``repr`` and messages mask it).

    Raises ``KeyError`` for an alias that ``DATABASES`` lacks, and ``ValueError`` for another
    database engine or an in-memory SQLite database (each connection would see its own).
    """
    from django.conf import settings  # type: ignore[import-not-found,import-untyped,unused-ignore]

    databases: Mapping[str, Mapping[str, Any]] = settings.DATABASES
    if alias not in databases:
        raise KeyError(f"settings.DATABASES has no alias {alias!r} (it has {', '.join(map(repr, databases))})")
    return _url_from_settings_dict(databases[alias], alias)


def _url_from_settings_dict(db: Mapping[str, Any], alias: str) -> str:
    from sqlalchemy.engine import URL

    engine = str(db.get("ENGINE", ""))
    name = db.get("NAME")
    if engine in _SQLITE_ENGINES:
        text = str(name) if isinstance(name, (str, PurePath)) else ""
        if text in ("", ":memory:") or text.startswith("file:"):
            raise ValueError(
                f"DATABASES[{alias!r}] is an in-memory or URI SQLite database; leases need a file path "
                "(or use SyncInMemoryLeaseProvider in tests)"
            )
        import os

        return "sqlite:///" + os.path.abspath(text)
    if engine not in _POSTGRES_ENGINES:
        raise ValueError(f"DATABASES[{alias!r}] uses {engine or 'no ENGINE'}: {ONLY_POSTGRES_AND_SQLITE}")
    query: dict[str, str] = {}
    options: Mapping[str, Any] = db.get("OPTIONS") or {}
    for option, value in options.items():
        if option in _DJANGO_ONLY_OPTIONS or isinstance(value, bool) or not isinstance(value, (str, int)):
            continue
        query[option] = str(value)
    host = str(db.get("HOST") or "") or None
    if host is not None and host.startswith("/"):  # a Unix socket directory: libpq takes it as host=
        query["host"] = host
        host = None
    port = db.get("PORT")
    url = URL.create(
        "postgresql",
        username=str(db.get("USER") or "") or None,
        password=str(db.get("PASSWORD") or "") or None,
        host=host,
        port=int(port) if port not in (None, "") else None,
        database=str(name) if name else None,
        query=query,
    )
    return url.render_as_string(hide_password=False)


# -- fenced writes on Django's connection ------------------------------------------------------


def _atomic_connection(using: str, function: str) -> tuple[Any, str]:
    """Django's connection ``using`` and its dialect; ``RuntimeError`` outside ``transaction.atomic()``."""
    from django.db import connections  # type: ignore[import-not-found,import-untyped,unused-ignore]

    connection = connections[using]
    if not connection.in_atomic_block:
        raise RuntimeError(
            f"sql_lease.django.{function}() must run inside transaction.atomic(using={using!r}): in autocommit "
            "its lock would end with the statement and guard none of your writes"
        )
    vendor = connection.vendor
    if vendor not in ("postgresql", "sqlite"):
        raise ValueError(f"DATABASES[{using!r}] is {vendor}: {ONLY_POSTGRES_AND_SQLITE}")
    return connection, vendor


def check_held(
    key: str,
    owner: str,
    fence: int,
    *,
    using: str = "default",
    table_name: str = DEFAULT_TABLE_NAME,
    schema: str | None = None,
) -> None:
    """``SyncSqlLeaseProvider.check_held`` on Django's connection ``using``, in your
    ``transaction.atomic()`` block.

    Raises ``LeaseLostError`` unless ``owner`` holds ``key`` with exactly ``fence``, unexpired by
    the database's clock; raise it out of the ``atomic`` block and Django rolls your writes back.
    Otherwise the lease row stays locked (PostgreSQL ``FOR SHARE``; SQLite: the write lock) until
    the block commits, so the lease cannot change hands before your writes do. Renewals, transfers
    and takeovers of ``key`` wait for your transaction: keep it short. ``table_name``/``schema``
    name the lease table as the provider's do. Bad arguments raise ``TypeError``/``ValueError``
    before any SQL; ``RuntimeError`` outside an ``atomic`` block.
    """
    params = validate_check(key, owner, fence)
    names = LeaseTableNames(table_name, schema)
    connection, vendor = _atomic_connection(using, "check_held")
    sql, args = format_paramstyle_statement(vendor, names, "check_held", params)
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        row = cursor.fetchone()
    check_held_result(key, params["owner"], params["fence"], row)  # the key as given, not its stored form


def accept_fence(
    resource: str,
    fence: int,
    *,
    using: str = "default",
    table_name: str = DEFAULT_TABLE_NAME,
    schema: str | None = None,
) -> int:
    """``SyncSqlLeaseProvider.accept_fence`` on Django's connection ``using``, in your
    ``transaction.atomic()`` block: records ``fence`` as the highest accepted for ``resource`` (in
    the table ``<table_name>_fences``) and returns it, or raises ``StaleFenceError`` (``.accepted``:
    the larger fence on record). An equal fence is accepted. ``RuntimeError`` outside ``atomic``.
    """
    resource, fence = validate_resource(resource), validate_fence(fence)
    params: dict[str, Any] = {"resource": resource, "fence": fence}
    names = LeaseTableNames(table_name, schema)
    connection, vendor = _atomic_connection(using, "accept_fence")
    sql, args = format_paramstyle_statement(vendor, names, "accept_fence", params)
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        row = cursor.fetchone()
        accepted = None
        if row is None:
            sql, args = format_paramstyle_statement(vendor, names, "accepted", params)
            cursor.execute(sql, args)
            found = cursor.fetchone()
            accepted = None if found is None else int(found[0])
    return accept_fence_result(resource, fence, row, accepted)
