"""SQLite: each semaphore slot grant, renewal and release as one statement (issue 25's speed row).
Three triggers on the slot table keep the key's head row in the lease table exact (its expiry, the
oldest tenure's start, the largest fence, so the fence counter advances through the lease table's
own triggers), and the index ``ix_<table>_slots_live`` on (key, expires_at) counts a key's live
slots; the one-statement operations name it (``INDEXED BY``), so on a table still at 0006 they fail
with "no such index" (read as "older than this sql_lease: run sql-lease migrate") instead of
writing a slot without its head. Nothing changes on PostgreSQL and MySQL. Downgrading drops the
triggers and the index (0006's code keeps heads exact in its own transactions).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# SQLite's clock in epoch milliseconds, as in sql_lease/sql/dialects/sqlite.py ('now' is stable within
# one statement, its triggers included)
NOW = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"


def _names():  # type: ignore[no-untyped-def]
    return context.config.attributes["sql_lease_names"]


def _refresh(table: str, slots: str, row: str) -> str:
    # The head's expiry (the latest live slot's, else now: free), tenure start (the oldest holder's)
    return (
        f'UPDATE "{table}" SET expires_at = coalesce((SELECT max(expires_at) FROM "{slots}" '
        f"WHERE key = {row}.key AND expires_at > {NOW}), {NOW}), "
        f'acquired_at = coalesce((SELECT min(acquired_at) FROM "{slots}" '
        f"WHERE key = {row}.key AND expires_at > {NOW}), acquired_at)"
    )


def _sqlite():  # type: ignore[no-untyped-def]
    # The table names and the schema prefix of DDL (trigger bodies take bare names), or None off SQLite
    if op.get_context().dialect.name != "sqlite":
        return None
    names = _names()
    return names, f'"{names.schema}".' if names.schema else ""


def upgrade() -> None:
    target = _sqlite()
    if target is None:
        return
    names, prefix = target
    table, slots = names.table, names.slot_table
    granted, renewed, freed = names.slot_triggers()
    op.execute(f'CREATE INDEX {prefix}"{names.slot_live_index}" ON "{slots}" (key, expires_at)')
    # Trigger bodies may not qualify table names: they act on the trigger's own database.
    # A granted or renewed slot: the key's head made (or an expired plain lease's row turned into
    # it), refreshed, its fence raised to the slot's (the lease table's fence trigger advances the counter)
    head = (
        f'INSERT INTO "{table}" (key, owner, fence, expires_at, acquired_at) '
        f"VALUES (NEW.key, '', NEW.fence, NEW.expires_at, NEW.acquired_at) "
        f"ON CONFLICT (key) DO UPDATE SET owner = '', data = NULL, released = 0 WHERE owner <> ''; "
        f"{_refresh(table, slots, 'NEW')}, fence = max(fence, NEW.fence) WHERE key = NEW.key AND owner = ''; "
    )
    for trigger, event in ((granted, "INSERT"), (renewed, "UPDATE OF expires_at")):
        op.execute(f'CREATE TRIGGER {prefix}"{trigger}" AFTER {event} ON "{slots}"\nBEGIN {head}END')
    # A live slot deleted (released, broken): the head refreshed; an expired one (the sweep) changes nothing
    op.execute(
        f'CREATE TRIGGER {prefix}"{freed}" AFTER DELETE ON "{slots}" WHEN OLD.expires_at > {NOW}\n'
        f"BEGIN {_refresh(table, slots, 'OLD')} WHERE key = OLD.key AND owner = ''; END"
    )


def downgrade() -> None:
    target = _sqlite()
    if target is None:
        return
    names, prefix = target
    for trigger in names.slot_triggers():
        op.execute(f'DROP TRIGGER IF EXISTS {prefix}"{trigger}"')
    op.execute(f'DROP INDEX IF EXISTS {prefix}"{names.slot_live_index}"')
