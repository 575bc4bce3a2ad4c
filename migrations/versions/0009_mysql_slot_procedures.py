"""MySQL/MariaDB semaphore slots as stored procedures (issue 25's speed row).

MySQL/MariaDB: the procedures ``<table>_slot_acquire`` and ``<table>_slot_release``, whose bodies are the
slot grant and slot release transactions the provider's own connections sent as multi-statement packets
before 0009 (the same statements, locks, order and answer row; docs/statements.md, "MySQL slot
procedures"): the server parses a procedure's statements once per connection, not on every call. Each
``CREATE PROCEDURE`` goes to the server as one statement (``DELIMITER`` is the ``mysql`` client's: the
offline script, ``sql-lease migrate --sql``, sets it around them). ``SQL SECURITY INVOKER``: the caller's
privileges on the tables apply (it needs EXECUTE on the procedures); creating them needs CREATE ROUTINE.
Downgrading drops them. Nothing changes on PostgreSQL or SQLite.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import context, op

from sql_lease.sql.migrate import mysql_object_missing

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# the slot grant: parameters and result row as SLOT_ACQUIRE_CALL (sql_lease/sql/dialects/mysql.py); a row
# is a plain lease if the upsert left it plain (its clock is taken before any lock wait: a later one would
# grant a slot beside a row still plain, then raise its expiry)
_ACQUIRE = """CREATE PROCEDURE {procedure}(IN p_key VARBINARY(2048), IN p_owner VARBINARY(2048), IN p_ttl_us BIGINT,
                             IN p_data LONGTEXT CHARACTER SET utf8mb4, IN p_limit INT)
SQL SECURITY INVOKER
BEGIN
START TRANSACTION;
INSERT INTO {table} (`key`, owner, fence, expires_at, acquired_at, has_waiters)
VALUES (p_key, '', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), FALSE)
ON DUPLICATE KEY UPDATE data = IF(owner <> '' AND expires_at <= UTC_TIMESTAMP(6), NULL, data),
                        released = IF(owner <> '' AND expires_at <= UTC_TIMESTAMP(6), FALSE, released),
                        owner = IF(owner <> '' AND expires_at <= UTC_TIMESTAMP(6), '', owner);
SELECT MAX(h.owner <> ''), MAX(h.owner), MAX(h.fence), MAX(h.expires_at),
       MAX(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), h.expires_at) / 1000), MAX(h.released),
       NOT MAX(h.owner <> '')
       AND COALESCE(MAX(s.owner = p_owner AND s.expires_at > UTC_TIMESTAMP(6)), 0)
       AND NOT COALESCE(MAX(s.owner = p_owner AND s.released), 0),
       NOT MAX(h.owner <> '')
       AND NOT COALESCE(MAX(s.owner = p_owner AND s.expires_at > UTC_TIMESTAMP(6)), 0)
       AND COUNT(CASE WHEN s.owner <> p_owner AND s.expires_at > UTC_TIMESTAMP(6) THEN 1 END) < p_limit,
       MAX(CASE WHEN s.owner = p_owner THEN s.fence END), MAX(CASE WHEN s.owner = p_owner THEN s.acquired_at END),
       MAX(CASE WHEN s.owner <> p_owner AND s.expires_at > UTC_TIMESTAMP(6) THEN s.expires_at END),
       MIN(CASE WHEN s.owner <> p_owner AND s.expires_at > UTC_TIMESTAMP(6) THEN s.acquired_at END),
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL p_ttl_us MICROSECOND
  INTO @ss_plain, @ss_owner, @ss_row_fence, @ss_row_expires_at, @ss_row_remaining_ms, @ss_row_released,
       @ss_extend, @ss_grant, @ss_mine_fence, @ss_mine_since, @ss_others_until, @ss_others_since, @ss_now, @ss_until
  FROM {table} AS h LEFT JOIN {slot_table} AS s ON s.`key` = h.`key`
 WHERE h.`key` = p_key;
UPDATE {slot_table} SET expires_at = @ss_until, data = COALESCE(p_data, data)
 WHERE `key` = p_key AND owner = p_owner AND @ss_extend;
INSERT INTO {fence_counter} (id) SELECT NULL FROM DUAL WHERE @ss_grant;
DELETE FROM {slot_table} WHERE `key` = p_key AND owner = p_owner AND @ss_grant;
INSERT INTO {slot_table} (`key`, owner, fence, acquired_at, expires_at, data, released)
SELECT p_key, p_owner, LAST_INSERT_ID(), @ss_now, @ss_until, p_data, FALSE FROM DUAL WHERE @ss_grant;
UPDATE {table}
   SET acquired_at = LEAST(CAST(COALESCE(@ss_others_since, IF(@ss_grant, @ss_now, @ss_mine_since)) AS DATETIME(6)),
                           CAST(IF(@ss_grant, @ss_now, @ss_mine_since) AS DATETIME(6))),
       expires_at = GREATEST(CAST(COALESCE(@ss_others_until, @ss_until) AS DATETIME(6)),
                             CAST(@ss_until AS DATETIME(6))),
       fence = GREATEST(fence, IF(@ss_grant, LAST_INSERT_ID(), fence))
 WHERE `key` = p_key AND (@ss_extend OR @ss_grant);
SELECT @ss_plain, @ss_extend OR @ss_grant, @ss_owner, @ss_row_fence, CAST(@ss_row_expires_at AS DATETIME(6)),
       @ss_row_remaining_ms, @ss_row_released, IF(@ss_extend OR @ss_grant, p_owner, s.owner),
       CAST(IF(@ss_grant, LAST_INSERT_ID(), IF(@ss_extend, @ss_mine_fence, s.fence)) AS SIGNED),
       IF(@ss_extend OR @ss_grant, CAST(@ss_until AS DATETIME(6)), s.expires_at),
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), IF(@ss_extend OR @ss_grant, @ss_until, s.expires_at)) / 1000
  FROM {table} AS h
  LEFT JOIN {slot_table} AS s
    ON s.`key` = h.`key` AND NOT (@ss_extend OR @ss_grant) AND s.expires_at > UTC_TIMESTAMP(6)
 WHERE h.`key` = p_key
 ORDER BY s.acquired_at, s.fence
 LIMIT 1;
COMMIT;
END"""

# the slot release: parameters and result row as SLOT_RELEASE_FIRST_CALL (sql_lease/sql/dialects/mysql.py)
_RELEASE = """CREATE PROCEDURE {procedure}(IN p_key VARBINARY(2048), IN p_owner VARBINARY(2048), IN p_fence BIGINT,
                             IN p_min_hold_us BIGINT)
SQL SECURITY INVOKER
BEGIN
SELECT IF(COUNT(*), p_key, NULL) INTO @sr_key FROM {table} WHERE `key` = p_key AND owner = '';
START TRANSACTION;
SELECT COUNT(*) INTO @sr_locked FROM {table} WHERE `key` = @sr_key AND owner = '' FOR UPDATE;
SELECT COALESCE(MAX(CASE WHEN owner = p_owner THEN fence END) IS NOT NULL
                AND (p_fence IS NULL OR MAX(CASE WHEN owner = p_owner THEN fence END) = p_fence)
                AND NOT (MAX(owner = p_owner AND expires_at > UTC_TIMESTAMP(6))
                         AND MAX(owner = p_owner AND released)), 0),
       COALESCE(MAX(owner = p_owner AND expires_at > UTC_TIMESTAMP(6)), 0),
       COALESCE(MAX(owner = p_owner AND expires_at > UTC_TIMESTAMP(6)) AND p_min_hold_us IS NOT NULL
                AND MAX(owner = p_owner AND acquired_at + INTERVAL p_min_hold_us MICROSECOND > UTC_TIMESTAMP(6)), 0),
       MAX(CASE WHEN owner = p_owner THEN acquired_at END),
       MAX(CASE WHEN owner = p_owner THEN acquired_at END) + INTERVAL p_min_hold_us MICROSECOND,
       MAX(CASE WHEN owner <> p_owner AND expires_at > UTC_TIMESTAMP(6) THEN expires_at END),
       MIN(CASE WHEN owner <> p_owner AND expires_at > UTC_TIMESTAMP(6) THEN acquired_at END), UTC_TIMESTAMP(6)
  INTO @sr_mine, @sr_live, @sr_keep, @sr_since, @sr_until, @sr_others_until, @sr_others_since, @sr_now
  FROM {slot_table} WHERE `key` = @sr_key AND @sr_locked;
UPDATE {slot_table} SET released = TRUE, expires_at = acquired_at + INTERVAL p_min_hold_us MICROSECOND
 WHERE `key` = p_key AND owner = p_owner AND @sr_mine AND @sr_keep;
DELETE FROM {slot_table} WHERE `key` = p_key AND owner = p_owner AND @sr_mine AND NOT @sr_keep;
UPDATE {table}
   SET acquired_at = IF(@sr_keep, LEAST(CAST(COALESCE(@sr_others_since, @sr_since) AS DATETIME(6)),
                                        CAST(@sr_since AS DATETIME(6))),
                        COALESCE(@sr_others_since, acquired_at)),
       expires_at = IF(@sr_keep, GREATEST(CAST(COALESCE(@sr_others_until, @sr_until) AS DATETIME(6)),
                                          CAST(@sr_until AS DATETIME(6))),
                       COALESCE(@sr_others_until, @sr_now))
 WHERE `key` = p_key AND owner = '' AND @sr_mine;
SELECT @sr_locked, @sr_mine AND (@sr_keep OR @sr_live);
COMMIT;
END"""


def _procedures() -> list[tuple[str, str, str]]:
    # (name, quoted name, CREATE PROCEDURE statement) of each procedure, the table names filled in
    names = context.config.attributes["sql_lease_names"]
    prefix = f"`{names.schema}`." if names.schema else ""
    tables = {
        "table": f"{prefix}`{names.table}`",
        "slot_table": f"{prefix}`{names.slot_table}`",
        "fence_counter": f"{prefix}`{names.fence_counter}`",
    }
    made = []
    for text, name in ((_ACQUIRE, names.slot_acquire_function), (_RELEASE, names.slot_release_function)):
        procedure = f"{prefix}`{name}`"
        made.append((name, procedure, text.format(procedure=procedure, **tables)))
    return made


def upgrade() -> None:
    if op.get_context().dialect.name not in ("mysql", "mariadb"):
        return
    for name, _, statement in _procedures():
        if not mysql_object_missing("procedure", name):  # made by a migrate that stopped partway
            continue
        if context.is_offline_mode():  # for the mysql client: the body's semicolons are not the statement's end
            op.get_context().impl.static_output(f"DELIMITER //\n{statement}//\nDELIMITER ;")
        else:
            op.execute(statement)


def downgrade() -> None:
    if op.get_context().dialect.name not in ("mysql", "mariadb"):
        return
    for _, procedure, _ in _procedures():
        op.execute(f"DROP PROCEDURE IF EXISTS {procedure}")
