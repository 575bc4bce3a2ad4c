"""Running the Alembic migrations that ship with the package, on an engine or for offline SQL.

The Alembic environment is ``migrations/`` in a checkout and ``sql_lease/_migrations`` inside an
installed wheel. It keeps its own version table (default ``sql_lease_alembic_version``) so it never
touches the host application's Alembic history.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import LeaseError
from .schema import LeaseTableNames

__all__ = ["alembic_config", "migrations_dir", "offline_sql", "upgrade_engine"]

NAMES_ATTRIBUTE = "sql_lease_names"


def migrations_dir() -> Path:
    """The Alembic environment: packaged in the wheel, or ``migrations/`` of a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise LeaseError(f"sql_lease's migrations are missing next to {package}; reinstall the package")


def alembic_config(names: LeaseTableNames, **attributes: Any) -> Config:
    """An Alembic ``Config`` for the packaged migrations and the tables named by ``names``."""
    config = Config(stdout=io.StringIO())
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes[NAMES_ATTRIBUTE] = names
    config.attributes.update(attributes)
    return config


def _upgrade_sync(connection: Connection, names: LeaseTableNames) -> str | None:
    command.upgrade(alembic_config(names, connection=connection), "head")
    context = MigrationContext.configure(
        connection,
        opts={"version_table": names.version_table, "version_table_schema": names.schema},
    )
    return context.get_current_revision()


async def upgrade_engine(engine: AsyncEngine, names: LeaseTableNames) -> str | None:
    """Upgrade the lease schema on ``engine`` to head; returns the revision now in place.

    Concurrent upgrades are serialised: within this process by a lock (Alembic's ``context`` and
    ``op`` are process-global), across processes on PostgreSQL by an advisory lock taken in
    ``env.py`` and on SQLite by a lock file next to the database file.
    """
    async with _locked(_PROCESS_LOCK):
        if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
            return await _upgrade_in_transaction(engine, names)
        from filelock import FileLock

        async with _locked(FileLock(f"{engine.url.database}.migrate.lock", thread_local=False)):
            return await _upgrade_in_transaction(engine, names)


_PROCESS_LOCK = threading.Lock()


@contextlib.asynccontextmanager
async def _locked(lock: Any) -> AsyncIterator[None]:
    """Hold a blocking lock, waiting for it in a worker thread so the event loop keeps running."""
    await asyncio.to_thread(lock.acquire)
    try:
        yield
    finally:
        lock.release()


async def _upgrade_in_transaction(engine: AsyncEngine, names: LeaseTableNames) -> str | None:
    async with engine.connect() as conn:
        revision = await conn.run_sync(_upgrade_sync, names)
        await conn.commit()
    return revision


def offline_sql(url: str | URL, names: LeaseTableNames) -> str:
    """The SQL that upgrades an empty database to head, for a DBA to review and run (``--sql``)."""
    buffer = io.StringIO()
    config = alembic_config(names, offline_url=url)
    config.output_buffer = buffer
    command.upgrade(config, "head", sql=True)
    return buffer.getvalue()
