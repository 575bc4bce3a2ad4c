"""Alembic environment of sql_lease.

Used three ways:
- by ``sql-lease migrate`` / ``SqlLeaseProvider.migrate()``, which pass a connection and the table
  names in ``config.attributes``;
- by ``sql-lease migrate --sql``, offline, with the URL in ``config.attributes["offline_url"]``;
- by ``alembic -x url=... upgrade head`` from a checkout (or the URL in ``SQL_LEASE_URL``)
  and optional ``-x table=... -x schema=... -x version_table=...``.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from sql_lease.sql.migrate import COMMITS_ATTRIBUTE, NAMES_ATTRIBUTE, migration_lock
from sql_lease.sql.schema import DEFAULT_TABLE_NAME, LeaseTableNames, lease_metadata
from sql_lease.sql.urls import to_async_url

config = context.config
x_args = context.get_x_argument(as_dictionary=True)


def _names() -> LeaseTableNames:
    names = config.attributes.get(NAMES_ATTRIBUTE)
    if names is None:
        names = LeaseTableNames(
            x_args.get("table", DEFAULT_TABLE_NAME),
            x_args.get("schema") or None,
            x_args.get("version_table") or None,  # default: derived from the table name
        )
        config.attributes[NAMES_ATTRIBUTE] = names
    return names


def _url() -> str:
    url = config.attributes.get("offline_url") or x_args.get("url") or os.environ.get("SQL_LEASE_URL")
    if not url:
        raise SystemExit("sql_lease migrations: give the database URL with -x url=... or SQL_LEASE_URL")
    return str(url)


def _configure(names: LeaseTableNames, dialect_name: str, **kwargs: object) -> None:
    context.configure(
        target_metadata=lease_metadata(names, dialect_name),
        version_table=names.version_table,
        version_table_schema=names.schema,
        version_table_pk=dialect_name not in ("mysql", "mariadb"),  # MySQL warns that it ignores the PK's name
        include_schemas=names.schema is not None,
        **kwargs,  # type: ignore[arg-type]
    )


def run_offline() -> None:
    names = _names()
    url = to_async_url(_url())
    _configure(names, url.get_backend_name(), url=url, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_on(connection: Connection, commits: bool = False) -> None:
    """Run the migrations on ``connection``; ``commits``: its transactions are this run's to end."""
    names = _names()
    dialect_name = connection.dialect.name
    with migration_lock(connection):  # concurrent deploys: the second waits, then finds the schema at head
        if dialect_name == "postgresql" and names.schema:
            connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{names.schema}"'))
        if commits and dialect_name in ("mysql", "mariadb"):
            # No transaction open: Alembic then commits each revision with its version row (DDL commits by itself).
            connection.commit()
        _configure(names, dialect_name, connection=connection)
        with context.begin_transaction():
            context.run_migrations()


async def _run_with_new_engine() -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(to_async_url(_url()))
    try:
        async with engine.connect() as conn:
            await conn.run_sync(run_on, True)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_offline()
elif config.attributes.get("connection") is not None:
    run_on(config.attributes["connection"], bool(config.attributes.get(COMMITS_ATTRIBUTE)))
else:
    asyncio.run(_run_with_new_engine())
