"""Add the slot table ``<table>_slots``: one row per holder of a key held as a semaphore
(``acquire_lease(..., limit=N)``, N >= 2; issue 25). Such a key keeps a head row in the lease
table (owner ``''``), which every slot operation locks first (docs/statements.md, "Semaphores").
On PostgreSQL it also creates the functions ``<table>_slot_acquire`` and ``<table>_slot_release``:
the slot acquire and release transactions in one round trip each (each statement of a PL/pgSQL
function takes a new snapshot, so the count after the head lock sees every committed slot).
Downgrading drops the table with its slots (and the functions), and deletes the heads (a release
before 0006 would read a head as a lease held by ``''``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mysql

from sql_lease.sql.migrate import mysql_object_missing

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

STORED_KEY_LENGTH = 1024
OWNER_LENGTH = 512


def _names():  # type: ignore[no-untyped-def]
    return context.config.attributes["sql_lease_names"]


def upgrade() -> None:
    names = _names()
    dialect = op.get_context().dialect.name
    # As the lease table's columns: VARBINARY (byte for byte) on MySQL, DATETIME(6) in UTC
    key_type: sa.types.TypeEngine = sa.String(STORED_KEY_LENGTH if dialect == "postgresql" else OWNER_LENGTH)
    owner_type: sa.types.TypeEngine = sa.String(OWNER_LENGTH)
    data_type: sa.types.TypeEngine = sa.Text()
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import JSON

        expires_at_type: sa.types.TypeEngine = sa.DateTime(timezone=True)
        data_type = JSON()
    elif dialect in ("mysql", "mariadb"):
        key_type = owner_type = mysql.VARBINARY(2048)
        expires_at_type, data_type = mysql.DATETIME(fsp=6), mysql.LONGTEXT()
    else:
        expires_at_type = sa.BigInteger()
    if dialect in ("mysql", "mariadb"):
        if not mysql_object_missing("table", names.slot_table):  # made by a migrate that stopped partway
            return
        # InnoDB keys hold at most 3072 bytes: the primary key takes the owner's first 1024 (the
        # slot statements insert, never upsert, so two owners alike that far collide loudly)
        prefix = f"`{names.schema}`." if names.schema else ""
        op.execute(
            f"CREATE TABLE {prefix}`{names.slot_table}` (`key` VARBINARY(2048) NOT NULL, "
            "owner VARBINARY(2048) NOT NULL, fence BIGINT NOT NULL, acquired_at DATETIME(6) NOT NULL, "
            "expires_at DATETIME(6) NOT NULL, data LONGTEXT NULL, released BOOL NOT NULL DEFAULT false, "
            f"PRIMARY KEY (`key`, owner(1024)), INDEX `{names.slot_expires_at_index}` (expires_at)) ENGINE=InnoDB"
        )
        return
    op.create_table(
        names.slot_table,
        sa.Column("key", key_type, primary_key=True),
        sa.Column("owner", owner_type, primary_key=True),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", expires_at_type, nullable=False),
        sa.Column("expires_at", expires_at_type, nullable=False),
        sa.Column("data", data_type, nullable=True),
        sa.Column("released", sa.Boolean(), nullable=False, server_default=sa.false()),
        schema=names.schema,
        sqlite_with_rowid=False,
        mysql_engine="InnoDB",
    )
    # the sweep's order (without it PostgreSQL's lease sessions, enable_seqscan off, plan a sort)
    op.create_index(names.slot_expires_at_index, names.slot_table, ["expires_at"], schema=names.schema)
    if dialect == "postgresql":
        _create_functions()


# The slot acquire and release of docs/statements.md ("Semaphores") as PL/pgSQL: the head row locked
# first, then the count in a statement of its own (a fresh snapshot), clock_timestamp() throughout
# (statement_timestamp() would be the call's start, before the lock wait).
_ACQUIRE_FUNCTION = """
CREATE FUNCTION {function}(p_key varchar, p_owner varchar, p_ttl float8, p_data json, p_limit int,
                           p_waiting boolean, p_durable text)
RETURNS TABLE (r_acquired boolean, r_owner varchar, r_fence bigint, r_expires_at timestamptz,
               r_remaining float8, r_plain boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    head record;
    slot record;
    others bigint;
    granted bigint;
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
    SELECT s.fence, s.released, s.expires_at > clock_timestamp() AS live INTO slot
      FROM {slot_table} AS s WHERE s.key = p_key AND s.owner = p_owner;
    -- an expired slot whose holder still guards a write (check_held) is waited for before it is not counted
    PERFORM 1 FROM {slot_table} AS s WHERE s.key = p_key AND s.owner <> p_owner AND s.expires_at <= clock_timestamp()
        FOR UPDATE;
    SELECT count(*) INTO others FROM {slot_table} AS s
     WHERE s.key = p_key AND s.owner <> p_owner AND s.expires_at > clock_timestamp();
    IF slot.live AND NOT slot.released THEN
        UPDATE {slot_table} AS s SET expires_at = clock_timestamp() + p_ttl * interval '1 millisecond',
               data = coalesce(p_data, s.data)
         WHERE s.key = p_key AND s.owner = p_owner;
    ELSIF slot.live OR others >= p_limit THEN
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
        DELETE FROM {slot_table} AS s WHERE s.key = p_key AND s.owner = p_owner;
        INSERT INTO {slot_table} (key, owner, fence, acquired_at, expires_at, data)
        VALUES (p_key, p_owner, granted, clock_timestamp(), clock_timestamp() + p_ttl * interval '1 millisecond',
                p_data);
    END IF;
    UPDATE {table} AS l
       SET expires_at = greatest(l.expires_at, s.expires_at), fence = greatest(l.fence, s.fence),
           acquired_at = CASE WHEN l.expires_at > clock_timestamp() THEN least(l.acquired_at, s.acquired_at)
                              ELSE s.acquired_at END
      FROM {slot_table} AS s WHERE l.key = p_key AND s.key = p_key AND s.owner = p_owner;
    RETURN QUERY SELECT true, s.owner, s.fence, s.expires_at,
                        (extract(epoch FROM s.expires_at - clock_timestamp()) * 1000)::float8, false
      FROM {slot_table} AS s WHERE s.key = p_key AND s.owner = p_owner;
END
$fn$"""

_RELEASE_FUNCTION = """
CREATE FUNCTION {function}(p_key varchar, p_owner varchar, p_fence bigint, p_min_hold float8, p_commit text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    head record;
    slot record;
BEGIN
    IF p_commit = 'off' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    ELSIF p_commit IS NOT NULL THEN
        PERFORM set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                           WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true);
    END IF;
    SELECT l.owner, l.has_waiters INTO head FROM {table} AS l WHERE l.key = p_key AND l.owner = '' FOR NO KEY UPDATE;
    IF NOT FOUND OR head.owner <> '' THEN
        RETURN false;
    END IF;
    SELECT s.fence, s.released, s.expires_at > clock_timestamp() AS live,
           s.acquired_at + p_min_hold * interval '1 millisecond' > clock_timestamp() AS within_hold INTO slot
      FROM {slot_table} AS s WHERE s.key = p_key AND s.owner = p_owner;
    IF NOT FOUND OR (p_fence IS NOT NULL AND slot.fence <> p_fence) OR (slot.live AND slot.released) THEN
        RETURN false;
    END IF;
    IF slot.live AND slot.within_hold THEN
        UPDATE {slot_table} AS s SET released = true, expires_at = s.acquired_at + p_min_hold * interval '1 millisecond'
         WHERE s.key = p_key AND s.owner = p_owner;
    ELSE
        DELETE FROM {slot_table} AS s WHERE s.key = p_key AND s.owner = p_owner;
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
    RETURN coalesce(slot.live, false);
END
$fn$"""


def _postgres_names() -> dict[str, str]:
    names = _names()
    quote = op.get_context().dialect.identifier_preparer.quote

    def qualified(name: str) -> str:
        return f"{quote(names.schema)}.{quote(name)}" if names.schema else quote(name)

    table = qualified(names.table)
    return {
        "table": table,
        "table_literal": "'" + table.replace("'", "''") + "'",
        "slot_table": qualified(names.slot_table),
        "sequence": "'" + qualified(names.fence_sequence).replace("'", "''") + "'",
        "acquire": qualified(names.slot_acquire_function),
        "release": qualified(names.slot_release_function),
    }


def _create_functions() -> None:
    values = _postgres_names()
    op.execute(_ACQUIRE_FUNCTION.format(function=values["acquire"], **values))
    op.execute(_RELEASE_FUNCTION.format(function=values["release"], **values))


def downgrade() -> None:
    names = _names()
    if op.get_context().dialect.name == "postgresql":
        values = _postgres_names()
        op.execute(f"DROP FUNCTION IF EXISTS {values['acquire']}(varchar, varchar, float8, json, int, boolean, text)")
        op.execute(f"DROP FUNCTION IF EXISTS {values['release']}(varchar, varchar, bigint, float8, text)")
    op.drop_table(names.slot_table, schema=names.schema)
    table = sa.table(names.table, sa.column("owner"), schema=names.schema)
    op.execute(table.delete().where(table.c.owner == ""))
