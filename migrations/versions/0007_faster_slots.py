"""Faster semaphore slots (issue 25's speed row).

SQLite: each slot grant, renewal and release as one statement. Three triggers on the slot table
keep the key's head row in the lease table exact (its expiry, the oldest tenure's start, the
largest fence, so the fence counter advances through the lease table's own triggers), and the
index ``ix_<table>_slots_live`` on (key, expires_at) counts a key's live slots; the one-statement
operations name it (``INDEXED BY``), so on a table still at 0006 they fail with "no such index"
(read as "older than this sql_lease: run sql-lease migrate") instead of writing a slot without its
head. Downgrading drops the triggers and the index (0006's code keeps heads exact in its own
transactions).

PostgreSQL: the slot acquire and release functions of 0006 replaced by shorter bodies (the same
signatures and answers: fewer statements per grant and release). Downgrading restores 0006's.
Nothing changes on MySQL.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

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


# The acquire of 0006 with fewer statements: the owner's slot and the count read in one statement
# (after the other owners' expired slots are locked, as before), no DELETE of a slot the owner
# does not have, the head refreshed from the values granted, the answer from them too.
_ACQUIRE_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}(p_key varchar, p_owner varchar, p_ttl float8, p_data json, p_limit int,
                                      p_waiting boolean, p_durable text)
RETURNS TABLE (r_acquired boolean, r_owner varchar, r_fence bigint, r_expires_at timestamptz,
               r_remaining float8, r_plain boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    head record;
    mine record;
    granted bigint;
    until_ timestamptz;
    started timestamptz;
    locked boolean := false;
BEGIN
    IF p_durable IS NOT NULL THEN
        PERFORM set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                           WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true);
    END IF;
    FOR attempt IN 1..3 LOOP
        SELECT l.owner, l.fence, l.expires_at, l.released, l.has_waiters,
               l.expires_at > clock_timestamp() AS live INTO head
          FROM {table} AS l WHERE l.key = p_key FOR NO KEY UPDATE;
        IF FOUND THEN
            locked := true;
            EXIT;
        END IF;
        INSERT INTO {table} (key, owner, fence, expires_at, acquired_at)
        VALUES (p_key, '', 0, clock_timestamp(), clock_timestamp()) ON CONFLICT (key) DO NOTHING;
    END LOOP;
    IF NOT locked THEN
        RAISE EXCEPTION 'the head row of a semaphore vanished while it was locked';
    END IF;
    IF head.owner <> '' AND head.live THEN
        IF p_waiting AND NOT head.has_waiters THEN
            UPDATE {table} SET has_waiters = true WHERE key = p_key;
        END IF;
        RETURN QUERY SELECT head.owner = p_owner AND NOT head.released, head.owner, head.fence, head.expires_at,
                            (extract(epoch FROM head.expires_at - clock_timestamp()) * 1000)::float8, true;
        RETURN;
    END IF;
    IF head.owner <> '' THEN
        UPDATE {table} SET owner = '', data = NULL, released = false WHERE key = p_key;
    END IF;
    -- an expired slot whose holder still guards a write (check_held) is waited for before it is not counted
    PERFORM 1 FROM {slot_table} AS s WHERE s.key = p_key AND s.owner <> p_owner AND s.expires_at <= clock_timestamp()
        FOR UPDATE;
    SELECT count(*) FILTER (WHERE s.owner <> p_owner AND s.expires_at > clock_timestamp()) AS others,
           max(s.fence) FILTER (WHERE s.owner = p_owner) AS fence,
           coalesce(bool_or(s.expires_at > clock_timestamp()) FILTER (WHERE s.owner = p_owner), false) AS live,
           coalesce(bool_or(s.released) FILTER (WHERE s.owner = p_owner), false) AS released
      INTO mine FROM {slot_table} AS s WHERE s.key = p_key;
    IF mine.live AND NOT mine.released THEN
        UPDATE {slot_table} AS s SET expires_at = clock_timestamp() + p_ttl * interval '1 millisecond',
               data = coalesce(p_data, s.data)
         WHERE s.key = p_key AND s.owner = p_owner
        RETURNING s.fence, s.expires_at, s.acquired_at INTO granted, until_, started;
    ELSIF mine.live OR mine.others >= p_limit THEN
        IF p_waiting AND NOT head.has_waiters THEN
            UPDATE {table} SET has_waiters = true WHERE key = p_key;
        END IF;
        RETURN QUERY SELECT false, h.owner, h.fence, h.expires_at,
                            (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::float8, false
          FROM {slot_table} AS h WHERE h.key = p_key AND h.expires_at > clock_timestamp()
         ORDER BY h.acquired_at, h.fence LIMIT 1;
        RETURN;
    ELSE
        granted := nextval({sequence});
        IF mine.fence IS NOT NULL THEN
            DELETE FROM {slot_table} AS s WHERE s.key = p_key AND s.owner = p_owner;
        END IF;
        INSERT INTO {slot_table} AS s (key, owner, fence, acquired_at, expires_at, data)
        VALUES (p_key, p_owner, granted, clock_timestamp(), clock_timestamp() + p_ttl * interval '1 millisecond',
                p_data)
        RETURNING s.expires_at, s.acquired_at INTO until_, started;
    END IF;
    UPDATE {table} AS l
       SET expires_at = greatest(l.expires_at, until_), fence = greatest(l.fence, granted),
           acquired_at = CASE WHEN l.expires_at > clock_timestamp() THEN least(l.acquired_at, started) ELSE started END
     WHERE l.key = p_key;
    RETURN QUERY SELECT true, p_owner, granted, until_,
                        (extract(epoch FROM until_ - clock_timestamp()) * 1000)::float8, false;
END
$fn$"""

# The release of 0006 with fewer statements: the slot deleted (or, within a minimum hold, kept) by
# one statement that checks it, instead of a read and then the write.
_RELEASE_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}(p_key varchar, p_owner varchar, p_fence bigint, p_min_hold float8,
                                      p_commit text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    head record;
    was_live boolean;
BEGIN
    IF p_commit = 'off' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    ELSIF p_commit IS NOT NULL THEN
        PERFORM set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                           WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true);
    END IF;
    SELECT l.has_waiters INTO head FROM {table} AS l WHERE l.key = p_key AND l.owner = '' FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM {slot_table} AS s
     WHERE s.key = p_key AND s.owner = p_owner AND (p_fence IS NULL OR s.fence = p_fence)
       AND (s.expires_at <= clock_timestamp() OR (NOT s.released AND (p_min_hold IS NULL
            OR s.acquired_at + p_min_hold * interval '1 millisecond' <= clock_timestamp())))
    RETURNING s.expires_at > clock_timestamp() INTO was_live;
    IF NOT FOUND THEN
        IF p_min_hold IS NULL THEN
            RETURN false;
        END IF;
        UPDATE {slot_table} AS s SET released = true, expires_at = s.acquired_at + p_min_hold * interval '1 millisecond'
         WHERE s.key = p_key AND s.owner = p_owner AND (p_fence IS NULL OR s.fence = p_fence) AND NOT s.released
           AND s.expires_at > clock_timestamp()
           AND s.acquired_at + p_min_hold * interval '1 millisecond' > clock_timestamp();
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        was_live := true;
    END IF;
    UPDATE {table} AS head_row
       SET expires_at = coalesce(live.latest, clock_timestamp()),
           acquired_at = coalesce(live.oldest, head_row.acquired_at),
           has_waiters = false
      FROM (SELECT max(s.expires_at) AS latest, min(s.acquired_at) AS oldest FROM {slot_table} AS s
             WHERE s.key = p_key AND s.expires_at > clock_timestamp()) AS live
     WHERE head_row.key = p_key;
    IF head.has_waiters THEN
        PERFORM pg_notify('sql_lease_' || {table_literal}::regclass::oid, p_key);
    END IF;
    RETURN was_live;
END
$fn$"""


def _revision_0006():  # type: ignore[no-untyped-def]
    # 0006's module (its functions, its names), loaded from this directory
    spec = importlib.util.spec_from_file_location("sql_lease_0006", Path(__file__).with_name("0006_semaphore_slots.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _postgres_functions(acquire: str, release: str) -> None:
    values = _revision_0006()._postgres_names()
    op.execute(acquire.format(function=values["acquire"], **values))
    op.execute(release.format(function=values["release"], **values))


def _sqlite():  # type: ignore[no-untyped-def]
    # The table names and the schema prefix of DDL (trigger bodies take bare names), or None off SQLite
    if op.get_context().dialect.name != "sqlite":
        return None
    names = _names()
    return names, f'"{names.schema}".' if names.schema else ""


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _postgres_functions(_ACQUIRE_FUNCTION, _RELEASE_FUNCTION)
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
        f"ON CONFLICT (key) DO UPDATE SET owner = '', data = NULL, released = 0 "
        f"WHERE owner <> '' AND expires_at <= {NOW}; "
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
    if op.get_context().dialect.name == "postgresql":
        old = _revision_0006()
        replace = "CREATE OR REPLACE FUNCTION"
        _postgres_functions(
            *(text.replace("CREATE FUNCTION", replace, 1) for text in (old._ACQUIRE_FUNCTION, old._RELEASE_FUNCTION))
        )
    target = _sqlite()
    if target is None:
        return
    names, prefix = target
    for trigger in names.slot_triggers():
        op.execute(f'DROP TRIGGER IF EXISTS {prefix}"{trigger}"')
    op.execute(f'DROP INDEX IF EXISTS {prefix}"{names.slot_live_index}"')
