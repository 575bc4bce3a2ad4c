"""Every statement sql_lease sends to SQLite, written out whole: what you read is what the driver
runs. The reasoning is in docs/statements.md; tests/test_statement_texts.py checks that each text is
sent as written and that each is sent by some operation.

Placeholders (the only substitution, made once per provider by
:func:`sql_lease.sql.statements.statements_for`, with identifiers quoted by SQLAlchemy's SQLite
dialect):

    {table}          the lease table, e.g. "sql_leases" or "main"."sql_leases"
    {fence_counter}  the one-row table of the last fence handed out, "sql_leases_fence"
    {fence_table}    the table of accepted fences, "sql_leases_fences"

Times are SQLite's own clock as integer Unix epoch milliseconds,
``CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`` ('now' is stable within one
statement; SQLite 3.40 has no unixepoch('subsec')). Lease statements take positional parameters
(?1, ...) and each runs as its own write transaction; fenced-write statements (CHECK_HELD,
ACCEPT_FENCE, ACCEPTED) take named parameters (SQLAlchemy ``text()``) and run in the caller's
transaction. SQLite has one text per operation: no durability variants (each commit follows the
database's ``synchronous`` setting) and no NOTIFY (waiters poll).
"""

from __future__ import annotations

__all__ = ["NOW_MS", "PLACEHOLDERS", "slot_steps", "texts"]

PLACEHOLDERS = ("table", "fence_counter", "fence_table", "slot_table", "slot_live_index")

NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
"""SQLite's clock in epoch milliseconds, as written in every statement below (for scripts)."""

# acquire (?1 key, ?2 owner, ?3 ttl_ms integer, ?4 data JSON text | NULL)
#   -> (1, owner, fence, expires_at, remaining_ms) if granted; no row if refused (the plan then reads HOLDER)
ACQUIRE = """
INSERT INTO {table} AS held (key, owner, fence, expires_at, data, acquired_at)
VALUES (?1, ?2, (SELECT last_fence + 1 FROM {fence_counter}),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3, ?4,
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner,
       expires_at = excluded.expires_at,
       fence = CASE WHEN held.owner = excluded.owner
                         AND held.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                    THEN held.fence ELSE excluded.fence END,
       data = CASE WHEN held.owner = excluded.owner
                        AND held.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                   THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
       acquired_at = CASE WHEN held.owner = excluded.owner
                               AND held.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                          THEN held.acquired_at ELSE excluded.acquired_at END,
       released = 0
 WHERE (held.owner = excluded.owner AND NOT held.released)
    OR held.expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
RETURNING 1, owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# holder (?1 key) -> (owner, fence, expires_at, remaining_ms, data, acquired_at, released) of the unexpired lease
HOLDER = """
SELECT owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), data,
       acquired_at, released FROM {table}
 WHERE key = ?1 AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# owner (?1 key) -> (owner,) of the unexpired lease
OWNER = """
SELECT owner FROM {table} WHERE key = ?1 AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# list_leases (?1 prefix, ?2 include_expired, ?3 limit, ?4 upper bound of the prefix): a page of at most ?3
#   rows of the table, each semaphore's head (owner '') replaced by its slots (unexpired ones unless ?2),
#   oldest tenure first, at most ?3 rows in all; one statement however many semaphores
#   -> rows (key, owner, fence, expires_at, remaining_ms, data, acquired_at, released) by key (BINARY collation)
LIST_LEASES = """
WITH page AS (
    SELECT key, owner, fence, expires_at, data, acquired_at, released FROM {table}
     WHERE key >= ?1 AND key < ?4 AND (?2 OR expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
     ORDER BY key
     LIMIT ?3
)
SELECT key, owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), data,
       acquired_at, released FROM (
    SELECT key, owner, fence, expires_at, data, acquired_at, released FROM page WHERE owner <> ''
    UNION ALL
    SELECT s.key, s.owner, s.fence, s.expires_at, s.data, s.acquired_at, s.released
      FROM page JOIN {slot_table} AS s ON s.key = page.key
     WHERE page.owner = '' AND (?2 OR s.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
)
 ORDER BY key, acquired_at, fence
 LIMIT ?3"""

# list_all (?1 include_expired, ?2 limit) -> rows as LIST_LEASES, every key
LIST_ALL = """
WITH page AS (
    SELECT key, owner, fence, expires_at, data, acquired_at, released FROM {table}
     WHERE ?1 OR expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
     ORDER BY key
     LIMIT ?2
)
SELECT key, owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), data,
       acquired_at, released FROM (
    SELECT key, owner, fence, expires_at, data, acquired_at, released FROM page WHERE owner <> ''
    UNION ALL
    SELECT s.key, s.owner, s.fence, s.expires_at, s.data, s.acquired_at, s.released
      FROM page JOIN {slot_table} AS s ON s.key = page.key
     WHERE page.owner = '' AND (?1 OR s.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
)
 ORDER BY key, acquired_at, fence
 LIMIT ?2"""

# release (?1 key, ?2 owner, ?3 fence | NULL: any, ?4 min_hold_ms | NULL) -> (was_unexpired,) if owner's row
#   was deleted: unless released already or (with ?4) still to be kept (RELEASE_KEEPING)
RELEASE = """
DELETE FROM {table} WHERE key = ?1 AND owner = ?2 AND (?3 IS NULL OR fence = ?3)
   AND (expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
        OR (NOT released
            AND (?4 IS NULL
                 OR coalesce(acquired_at, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) + ?4
                    <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))))
RETURNING expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# release with a minimum hold (?1 key, ?2 owner, ?3 fence | NULL, ?4 min_hold_ms integer) -> (fence,) if owner's
#   unexpired tenure began less than min_hold_ms ago: kept, marked released, until then
RELEASE_KEEPING = """
UPDATE {table}
   SET released = 1, expires_at = coalesce(acquired_at, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) + ?4
 WHERE key = ?1 AND owner = ?2 AND (?3 IS NULL OR fence = ?3) AND NOT released
   AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
   AND coalesce(acquired_at, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) + ?4
       > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
RETURNING fence"""

# renew (?1 key, ?2 owner, ?3 ttl_ms integer, ?4 fence | NULL: any) -> (owner, fence, expires_at, remaining_ms)
#   if renewed; ('', ...) if the key is a semaphore's head, left as it was (the slot steps renew the owner's slot)
RENEW = """
UPDATE {table} SET expires_at = CASE WHEN owner = '' THEN expires_at
                                     ELSE CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3 END
 WHERE key = ?1 AND (owner = '' OR (owner = ?2
       AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
       AND NOT released AND (?4 IS NULL OR fence = ?4)))
RETURNING owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# renew_many (?1 JSON array of [key, owner, ttl_ms] or [key, owner, ttl_ms, fence | NULL: any])
#   -> rows (key, owner, fence, expires_at, remaining_ms) renewed; (key, '', ...) of each key that is a
#   semaphore's head, left as it was (the slot steps renew the owner's slot)
RENEW_MANY = """
UPDATE {table} SET expires_at = CASE WHEN owner = '' THEN expires_at
                                     ELSE CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + r.ttl END
  FROM (SELECT value ->> 0 AS k, value ->> 1 AS o, value ->> 2 AS ttl, value ->> 3 AS f FROM json_each(?1)) AS r
 WHERE key = r.k AND (owner = '' OR (owner = r.o
       AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
       AND NOT released AND (r.f IS NULL OR fence = r.f)))
RETURNING key, owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# transfer (?1 key, ?2 from_owner, ?3 to_owner, ?4 ttl_ms integer, ?5 data JSON text | NULL, ?6 fence | NULL: any)
#   -> (owner, fence, expires_at, remaining_ms) if transferred; ('', ...) if the key is a semaphore's head, left
#   as it was (the slot steps pass the owner's slot on)
TRANSFER = """
UPDATE {table}
   SET owner = CASE WHEN owner = '' THEN owner ELSE ?3 END,
       expires_at = CASE WHEN owner = '' THEN expires_at
                         ELSE CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?4 END,
       fence = CASE WHEN owner = ?3 OR owner = '' THEN fence ELSE (SELECT last_fence + 1 FROM {fence_counter}) END,
       data = CASE WHEN owner = '' THEN data WHEN owner = ?3 THEN coalesce(?5, data) ELSE ?5 END,
       acquired_at = CASE WHEN owner = ?3 OR owner = '' THEN acquired_at
                          ELSE CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) END
 WHERE key = ?1 AND (owner = '' OR (owner = ?2
       AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
       AND NOT released AND (?6 IS NULL OR fence = ?6)))
RETURNING owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# break_lease (?1 key, ?2 fence | NULL: any) -> (owner, fence, expires_at, remaining_ms, data, acquired_at,
#   released, was_unexpired) of the row deleted (not a semaphore's head: the slot steps break it)
BREAK_LEASE = """
DELETE FROM {table} WHERE key = ?1 AND owner <> '' AND (?2 IS NULL OR fence = ?2)
RETURNING owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
          data, acquired_at, released, expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# sweep (?1 grace_ms, ?2 batch_size) -> one row per row deleted: true for a lease, false for a semaphore's head
SWEEP = """
DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table}
     WHERE expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - ?1
     ORDER BY expires_at LIMIT ?2
) RETURNING owner <> ''"""

# -- fenced writes, on the caller's connection in the caller's transaction ------------------------

# check_held (:key, :owner, :fence) -> (fence,) iff owner holds key with that fence, unexpired; takes the
#   write lock (a no-op UPDATE: the fence triggers fire on UPDATE OF fence only)
CHECK_HELD = """
UPDATE {table} SET owner = owner
 WHERE key = :key AND owner = :owner AND fence = :fence
   AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) AND NOT released
RETURNING fence"""

# accept_fence (:resource, :fence) -> (fence,) iff fence >= the highest one accepted so far
ACCEPT_FENCE = """
INSERT INTO {fence_table} AS seen (resource, fence, accepted_at)
VALUES (:resource, :fence, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, accepted_at = excluded.accepted_at
 WHERE seen.fence <= excluded.fence
RETURNING fence"""

# accepted (:resource) -> (fence,) the highest fence accepted (for StaleFenceError)
ACCEPTED = "SELECT fence FROM {fence_table} WHERE resource = :resource"


# -- several keys at once, all or nothing (issue 25; docs/statements.md, "All-or-nothing acquire") --

# acquire_keys (?1 JSON array of stored keys, ?2 owner, ?3 ttl_ms integer, ?4 data JSON text | NULL)
#   -> rows (stored key, 1, owner, fence, expires_at, remaining_ms), one per key, if no key is held by
#   another owner (or released and kept); else no row and nothing written (the plan then reads HOLDERS).
#   Each new tenure's fence is the counter at the start plus its position plus one (the triggers advance it)
ACQUIRE_KEYS = """
INSERT INTO {table} AS held (key, owner, fence, expires_at, data, acquired_at)
SELECT w.value, ?2, (SELECT last_fence FROM {fence_counter}) + w.key + 1,
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3, ?4,
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
  FROM json_each(?1) AS w
 WHERE NOT EXISTS (
       SELECT 1 FROM json_each(?1) AS k JOIN {table} AS l ON l.key = k.value
        WHERE l.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
          AND (l.owner <> ?2 OR l.released))
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner,
       expires_at = excluded.expires_at,
       fence = CASE WHEN held.owner = excluded.owner
                         AND held.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                    THEN held.fence ELSE excluded.fence END,
       data = CASE WHEN held.owner = excluded.owner
                        AND held.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                   THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
       acquired_at = CASE WHEN held.owner = excluded.owner
                               AND held.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                          THEN held.acquired_at ELSE excluded.acquired_at END,
       released = 0
 WHERE (held.owner = excluded.owner AND NOT held.released)
    OR held.expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
RETURNING key, 1, owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# keys_holders (?1 JSON array of stored keys) -> rows (stored key, owner, fence, expires_at, remaining_ms, data,
#   acquired_at, released) of the unexpired leases among the keys
KEYS_HOLDERS = """
SELECT l.key, l.owner, l.fence, l.expires_at, l.expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
       l.data, l.acquired_at, l.released
  FROM json_each(?1) AS w JOIN {table} AS l ON l.key = w.value
 WHERE l.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# release_keys (?1 JSON array of stored keys, ?2 owner, ?3 JSON array of fences in the order of ?1 | NULL: any)
#   -> rows (was_unexpired,) of the owner's rows (of those tenures) deleted (not those released already and
#   kept for a minimum hold, unless expired)
RELEASE_KEYS = """
DELETE FROM {table} WHERE key IN (SELECT value FROM json_each(?1)) AND owner = ?2
   AND (?3 IS NULL OR (key, fence) IN (SELECT k.value, f.value FROM json_each(?1) AS k
                                          JOIN json_each(?3) AS f ON f.key = k.key))
   AND (expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) OR NOT released)
RETURNING expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""


def texts(*, durable_session: bool, durable_release: bool) -> dict[str, str | None]:
    """The statement each operation sends, by name; the same for every variant (the flags are
    PostgreSQL's: SQLite's commits follow its ``synchronous`` setting)."""
    return {
        "acquire": ACQUIRE,
        "acquire_waiting": ACQUIRE,  # no NOTIFY on SQLite: a waiter's acquire flags nothing
        "holder": HOLDER,
        "owner": OWNER,
        "list_leases": LIST_LEASES,
        "list_all": LIST_ALL,
        "notify_channel": None,  # no LISTEN on SQLite: waiters poll
        "release": RELEASE,
        "release_keeping": RELEASE_KEEPING,
        "renew": RENEW,
        "renew_many": RENEW_MANY,
        "transfer": TRANSFER,
        "break_lease": BREAK_LEASE,
        "sweep": SWEEP,
        "check_held": CHECK_HELD,
        "accept_fence": ACCEPT_FENCE,
        "accepted": ACCEPTED,
        "acquire_keys": ACQUIRE_KEYS,
        "holders": KEYS_HOLDERS,
        "release_keys": RELEASE_KEYS,
    }


# -- semaphores: the slot table {slot_table} ------------------------------------------------------
# A key held as a semaphore has a head row in {table} (owner ''). A grant, renewal and release are one
# statement each (one statement holds the write lock from its start: counting is exact); migration
# 0007's triggers on {slot_table} keep the head exact, and each names the index {slot_live_index}
# (INDEXED BY), so on a table older than 0007 it fails ("no such index") before writing anything.
# Transfer and break run BEGIN IMMEDIATE (the database's write lock), read the head, act, COMMIT.

# slot_grant (?1 key, ?2 owner, ?3 ttl_ms integer, ?4 data JSON text | NULL, ?5 limit) -> (owner, fence,
#   expires_at, remaining_ms) of the owner's slot if granted: a new tenure (fence: the counter's next;
#   an expired slot of the owner's is its row reused) if no unexpired plain lease holds the key and
#   fewer than ?5 other owners hold unexpired slots, or the owner's unexpired slot's tenure going on;
#   no row if refused (the plan then reads SLOT_LOCK_HEAD and HOLDERS)
SLOT_GRANT = """
INSERT INTO {slot_table} AS mine (key, owner, fence, acquired_at, expires_at, data)
SELECT ?1, ?2, (SELECT last_fence + 1 FROM {fence_counter}), CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3, ?4
 WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE key = ?1 AND owner <> ''
                      AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
   AND ((SELECT count(*) FROM {slot_table} INDEXED BY {slot_live_index}
          WHERE key = ?1 AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
            AND owner <> ?2) < ?5
        OR EXISTS (SELECT 1 FROM {slot_table} WHERE key = ?1 AND owner = ?2 AND NOT released
                      AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)))
ON CONFLICT (key, owner) DO UPDATE
   SET fence = CASE WHEN mine.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                    THEN mine.fence ELSE excluded.fence END,
       acquired_at = CASE WHEN mine.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                          THEN mine.acquired_at ELSE excluded.acquired_at END,
       data = CASE WHEN mine.expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
                   THEN coalesce(excluded.data, mine.data) ELSE excluded.data END,
       expires_at = excluded.expires_at,
       released = 0
 WHERE mine.expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) OR NOT mine.released
RETURNING owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# slot_renew_one (?1 key, ?2 owner, ?3 ttl_ms integer, ?4 fence | NULL: any) -> (owner, fence, expires_at,
#   remaining_ms) if the owner's unexpired, unreleased slot (of that fence) was renewed
SLOT_RENEW_ONE = """
UPDATE {slot_table} INDEXED BY {slot_live_index}
   SET expires_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3
 WHERE key = ?1 AND owner = ?2 AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
   AND NOT released AND (?4 IS NULL OR fence = ?4)
RETURNING owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# slot_release_one (?1 key, ?2 owner, ?3 fence | NULL: any, ?4 min_hold_ms | NULL) -> (was_unexpired,) if the
#   owner's slot was deleted: as RELEASE for a lease (released already and kept, or still to be kept: left)
SLOT_RELEASE_ONE = """
DELETE FROM {slot_table} INDEXED BY {slot_live_index}
 WHERE key = ?1 AND owner = ?2 AND (?3 IS NULL OR fence = ?3)
   AND (expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
        OR (NOT released
            AND (?4 IS NULL OR acquired_at + ?4 <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))))
RETURNING expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"""

# slot_keep_one (?1 key, ?2 owner, ?3 fence | NULL, ?4 min_hold_ms integer) -> (fence,) if the owner's unexpired
#   slot's tenure began less than min_hold_ms ago: kept, marked released, until then (as RELEASE_KEEPING)
SLOT_KEEP_ONE = """
UPDATE {slot_table} INDEXED BY {slot_live_index} SET released = 1, expires_at = acquired_at + ?4
 WHERE key = ?1 AND owner = ?2 AND (?3 IS NULL OR fence = ?3) AND NOT released
   AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
   AND acquired_at + ?4 > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
RETURNING fence"""

SLOT_BEGIN = "BEGIN IMMEDIATE"
SLOT_COMMIT = "COMMIT"
SLOT_ROLLBACK = "ROLLBACK"

# slot_lock_head (?1 key) -> (owner, fence, expires_at, remaining_ms, data, acquired_at, live, released,
#   has_waiters) of the key's row in the lease table (a plain lease or a head): read after a refused grant
SLOT_LOCK_HEAD = """
SELECT owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
       data, acquired_at,
       expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), released, has_waiters
  FROM {table} WHERE key = ?1"""

# slot_lock_only_head (?1 key) -> SLOT_LOCK_HEAD's row if the key's row is a semaphore's head (owner '')
SLOT_LOCK_ONLY_HEAD = """
SELECT owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
       data, acquired_at,
       expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), released, has_waiters
  FROM {table} WHERE key = ?1 AND owner = ''"""

# slot_is_head (?1 key) -> (1,) if the key's row is a semaphore's head: read after a plain break that deleted
#   nothing (a DELETE cannot answer for a row it leaves), without the write lock (a release asks with
#   SLOT_RELEASE_ONE itself)
SLOT_IS_HEAD = "SELECT 1 FROM {table} WHERE key = ?1 AND owner = ''"

# slot_state (?1 key, ?2 owner, ?3 min_hold_ms | NULL) -> (other owners' unexpired slots, owner's slot fence |
#   NULL, owner's slot unexpired, owner's slot released, owner's tenure began less than min_hold_ms ago)
SLOT_STATE = """
SELECT count(CASE WHEN owner <> ?2
                    AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) THEN 1 END),
       max(CASE WHEN owner = ?2 THEN fence END),
       coalesce(max(CASE WHEN owner = ?2
                         THEN expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) END), 0),
       coalesce(max(CASE WHEN owner = ?2 THEN released END), 0),
       coalesce(max(CASE WHEN owner = ?2
                         THEN acquired_at + ?3 > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) END), 0)
  FROM {slot_table} WHERE key = ?1"""

# slot_next_fence () -> (fence,) the fence counter advanced
SLOT_NEXT_FENCE = """
UPDATE {fence_counter} SET last_fence = last_fence + 1 RETURNING last_fence"""

# slot_insert (?1 key, ?2 owner, ?3 ttl_ms integer, ?4 data JSON text | NULL, ?5 fence) -> nothing; a new tenure
SLOT_INSERT = """
INSERT INTO {slot_table} (key, owner, fence, acquired_at, expires_at, data)
VALUES (?1, ?2, ?5, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
        CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3, ?4)"""

# slot_delete (?1 key, ?2 owner) -> nothing; the owner's slot row deleted
SLOT_DELETE = "DELETE FROM {slot_table} WHERE key = ?1 AND owner = ?2"

# slot_extend (?1 key, ?2 owner, ?3 ttl_ms integer, ?4 data JSON text | NULL: keep) -> (1,) if the slot was
#   unexpired and is extended (the tenure goes on), else nothing
SLOT_EXTEND = """
UPDATE {slot_table} SET expires_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3,
       data = coalesce(?4, data)
 WHERE key = ?1 AND owner = ?2 AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
RETURNING 1"""

# slot_refresh_head (?1 key, ?2 fence granted | NULL) -> nothing; the head's expiry (the latest unexpired
#   slot's, else now: free) and tenure start (the oldest holder's), its fence raised to ?2
SLOT_REFRESH_HEAD = """
UPDATE {table}
   SET expires_at = coalesce((SELECT max(expires_at) FROM {slot_table} WHERE key = ?1
                                 AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
                            CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
       acquired_at = coalesce((SELECT min(acquired_at) FROM {slot_table} WHERE key = ?1
                                  AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
                             acquired_at),
       fence = max(fence, coalesce(?2, fence))
 WHERE key = ?1"""

# slot_rows (?1 key) -> rows (owner, fence, expires_at, remaining_ms, data, acquired_at, released, live) of
#   every slot of the key, expired ones too, oldest tenure first
SLOT_ROWS = """
SELECT owner, fence, expires_at, expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), data,
       acquired_at, released,
       expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
  FROM {slot_table} WHERE key = ?1 ORDER BY acquired_at, fence"""

# slot_delete_all (?1 key) -> nothing; every slot of the key deleted, then its head (break_lease)
SLOT_DELETE_ALL = """
DELETE FROM {slot_table} WHERE key = ?1"""

# slot_delete_head (?1 key) -> nothing; the key's head deleted (break_lease)
SLOT_DELETE_HEAD = """
DELETE FROM {table} WHERE key = ?1 AND owner = ''"""

# holders (?1 key) -> rows (owner, fence, expires_at, remaining_ms, data, acquired_at, released) of every
#   unexpired holder: the plain lease, or each slot of a semaphore, oldest tenure first, then fence; judged
#   at now, or at the newest tenure start the statement sees if later (as PostgreSQL's and MySQL's)
HOLDERS = """
SELECT owner, fence, expires_at, expires_at - read_at, data, acquired_at, released FROM (
    SELECT tenures.*, max(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
                          coalesce(max(acquired_at) OVER (), 0)) AS read_at FROM (
        SELECT owner, fence, expires_at, data, acquired_at, released FROM {table} WHERE key = ?1 AND owner <> ''
        UNION ALL
        SELECT owner, fence, expires_at, data, acquired_at, released FROM {slot_table} WHERE key = ?1
    ) AS tenures
)
 WHERE expires_at > read_at
 ORDER BY 6, 2"""

# slot_sweep (?1 grace_ms, ?2 batch_size) -> one row per expired slot deleted
SLOT_SWEEP = """
DELETE FROM {slot_table} WHERE (key, owner) IN (
    SELECT key, owner FROM {slot_table}
     WHERE expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - ?1
     ORDER BY expires_at LIMIT ?2
) RETURNING 1"""

# check_slot (:key, :owner, :fence) -> (fence,) iff owner holds a slot of key with that fence, unexpired;
#   takes the write lock (a no-op UPDATE), as CHECK_HELD
CHECK_SLOT = """
UPDATE {slot_table} SET owner = owner
 WHERE key = :key AND owner = :owner AND fence = :fence
   AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) AND NOT released
RETURNING fence"""


def slot_steps(*, durable_session: bool, durable_release: bool = False) -> dict[str, str | None]:
    """The statements of semaphores by name (``SLOT_STEP_NAMES`` of the PostgreSQL module);
    the same in every variant."""
    return {
        "slot_acquire_call": None,
        "slot_grant": SLOT_GRANT,
        "slot_renew_one": SLOT_RENEW_ONE,
        "slot_release_one": SLOT_RELEASE_ONE,
        "slot_release_first": None,  # SLOT_RELEASE_ONE goes first
        "slot_keep_one": SLOT_KEEP_ONE,
        "slot_begin": SLOT_BEGIN,
        "slot_commit": SLOT_COMMIT,
        "slot_rollback": SLOT_ROLLBACK,
        "slot_pin": None,
        "slot_serialise": None,  # one writer at a time
        "slot_lock_head": SLOT_LOCK_HEAD,
        "slot_lock_only_head": SLOT_LOCK_ONLY_HEAD,
        "slot_is_head": SLOT_IS_HEAD,
        "slot_make_head": None,  # the triggers of migration 0007 make heads
        "slot_to_head": None,
        "slot_state": SLOT_STATE,
        "slot_next_fence": SLOT_NEXT_FENCE,
        "slot_drawn_fence": None,
        "slot_insert": SLOT_INSERT,
        "slot_delete": SLOT_DELETE,
        "slot_extend": SLOT_EXTEND,
        "slot_keep": None,  # SLOT_KEEP_ONE
        "slot_refresh_head": SLOT_REFRESH_HEAD,
        "slot_mine": None,  # the one-statement grant and renewal return the slot
        "slot_rows": SLOT_ROWS,
        "slot_delete_all": SLOT_DELETE_ALL,
        "slot_delete_head": SLOT_DELETE_HEAD,
        "slot_wake": None,  # no NOTIFY on SQLite: waiters poll
        "slot_flag": None,
        "slot_holders": HOLDERS,
        "slot_sweep": SLOT_SWEEP,
        "slot_sweep_doomed": None,  # MySQL's slot sweep, a transaction
        "slot_sweep_lock": None,
        "slot_sweep_delete": None,
        "check_slot": CHECK_SLOT,
    }
