"""The lease schema on Django's connection: what ``manage.py migrate`` runs for ``sql_lease.django``.

The statements are the Alembic migrations' own (``migrations/versions``), compiled offline by Alembic
for the connection's vendor (PostgreSQL or SQLite) and run on Django's connection, inside the
Django migration's transaction. They record the revision in Alembic's version table
(``sql_lease_alembic_version``) as ``sql-lease migrate`` does, so either tool finds the other's
work current: after ``manage.py migrate``, ``sql-lease migrate`` says "already at", and a table
``sql-lease migrate`` built first makes the Django migration a no-op.

Django is imported only by the callers (the migration module): this module needs only a DB-API
cursor and a ``vendor`` string.
"""

from __future__ import annotations

from typing import Any

from ..sql.schema import LeaseTableNames

ONLY_POSTGRES_AND_SQLITE = (
    "sql_lease.django serves PostgreSQL and SQLite; on MySQL or MariaDB leave it out of INSTALLED_APPS, "
    "create the table with 'sql-lease migrate --url mysql://...' and use SyncSqlLeaseProvider('mysql://...') "
    "(docs/recipes.md, 'Django on MySQL or MariaDB')"
)

__all__ = ["alembic_statements", "downgrade_connection", "upgrade_connection"]

# The same lock env.py and migrate.py take, so manage.py migrate and sql-lease migrate never interleave.
_POSTGRES_LOCK = "SELECT pg_advisory_xact_lock(hashtext('sql_lease migrate'))"
# Offline compilation needs only the dialect; no connection is made to this URL.
_OFFLINE_URLS = {"postgresql": "postgresql://", "sqlite": "sqlite:///offline.db"}


class _Statements:
    """An Alembic output buffer: Alembic writes each statement (or comment) with one ``write``."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def write(self, text: str) -> None:
        statement = text.strip()
        if statement.endswith(";"):
            statement = statement[:-1].rstrip()
        if statement and not statement.startswith("--") and statement.upper() not in ("BEGIN", "COMMIT"):
            self.items.append(statement)

    def flush(self) -> None:
        pass


def alembic_statements(vendor: str, names: LeaseTableNames, revisions: str, *, downgrade: bool = False) -> list[str]:
    """The statements of Alembic's offline ``upgrade``/``downgrade`` ``revisions`` (``"0003"``,
    ``"0001:0003"``, ``"0003:base"``) for ``vendor`` (``"postgresql"`` or ``"sqlite"``), version
    table updates included, without the transaction's BEGIN/COMMIT. ``ValueError`` for another vendor."""
    from alembic import command

    from ..sql.migrate import alembic_config

    if vendor not in _OFFLINE_URLS:
        raise ValueError(f"{vendor}: {ONLY_POSTGRES_AND_SQLITE}")
    buffer = _Statements()
    config = alembic_config(names, offline_url=_OFFLINE_URLS[vendor])
    config.output_buffer = buffer  # type: ignore[assignment]  # Alembic calls only write() and flush()
    (command.downgrade if downgrade else command.upgrade)(config, revisions, sql=True)
    return buffer.items


def _state(cursor: Any, vendor: str, names: LeaseTableNames) -> tuple[bool, list[str] | None]:
    """(does the lease table exist, the revisions in its version table or None if that is missing),
    for the unqualified names (PostgreSQL: the first match on the search_path)."""
    if vendor == "postgresql":
        cursor.execute(
            "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL", [names.table, names.version_table]
        )
        table_exists, version_exists = cursor.fetchone()
    else:
        cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (%s, %s)",
            [names.table, names.version_table],
        )
        found = {row[0] for row in cursor.fetchall()}
        table_exists, version_exists = names.table in found, names.version_table in found
    if not version_exists:
        return bool(table_exists), None
    cursor.execute(f"SELECT version_num FROM {names.version_table}")
    return bool(table_exists), sorted(row[0] for row in cursor.fetchall())


def _revision_number(revision: str) -> int:
    return int(revision) if revision.isdigit() else -1


def upgrade_connection(connection: Any, target: str) -> str:
    """Bring the default lease table (``sql_leases``) on Django's ``connection`` to Alembic revision
    ``target`` (or leave a later one); returns what it did, for the migration's log.

    Raises ``ValueError`` for a vendor other than PostgreSQL and SQLite, and ``RuntimeError`` for a
    state only ``sql-lease migrate`` can sort out (a table without a version, a version without
    the table): the message names the command.
    """
    vendor = connection.vendor
    if vendor not in _OFFLINE_URLS:
        raise ValueError(
            f"DATABASES[{connection.alias!r}] is {vendor}: {ONLY_POSTGRES_AND_SQLITE}; with other databases "
            "beside, keep the sql_lease app off this one with a database router (allow_migrate)"
        )
    names = LeaseTableNames()
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(_POSTGRES_LOCK)
        table_exists, versions = _state(cursor, vendor, names)
        if (
            table_exists
            and versions
            and len(versions) == 1
            and _revision_number(versions[0]) >= _revision_number(target)
        ):
            return f"lease table already at {versions[0]}"
        if not table_exists and not versions:
            start = None
        elif table_exists and versions and len(versions) == 1:
            start = versions[0]
        else:
            raise RuntimeError(
                f"the lease table {names.table} of DATABASES[{connection.alias!r}] is in a state manage.py migrate "
                f"does not repair (table {'present' if table_exists else 'missing'}, version table "
                f"{names.version_table} recording {versions or 'nothing'}): run `sql-lease migrate --url URL` "
                "for that database, then manage.py migrate again"
            )
        revisions = target if start is None else f"{start}:{target}"
        for statement in alembic_statements(vendor, names, revisions):
            cursor.execute(statement)
    return f"lease table migrated from {start or 'nothing'} to {target}"


def downgrade_connection(connection: Any, target: str = "base") -> str:
    """Bring the default lease table back to Alembic revision ``target``: ``"base"`` drops it and
    what belongs to it (``manage.py migrate sql_lease zero``), a revision undoes the later ones
    (``"0003"``: ``manage.py migrate sql_lease 0001``). Nothing to do when the table is missing or
    not past ``target``."""
    vendor = connection.vendor
    names = LeaseTableNames()
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(_POSTGRES_LOCK)
        table_exists, versions = _state(cursor, vendor, names)
        if not table_exists or not versions or len(versions) != 1:
            return "no lease table to drop"
        if target != "base" and _revision_number(versions[0]) <= _revision_number(target):
            return f"lease table already at {versions[0]}"
        for statement in alembic_statements(vendor, names, f"{versions[0]}:{target}", downgrade=True):
            cursor.execute(statement)
    if target == "base":
        return f"lease table dropped (was at {versions[0]})"
    return f"lease table migrated back from {versions[0]} to {target}"
