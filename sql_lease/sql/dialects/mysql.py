"""Every statement sql_lease sends to MySQL 8 and MariaDB 10.5+, written out whole: what you read
is what the driver runs (``$n`` becomes the driver's ``%(pn)s``). The reasoning is in
docs/statements.md; tests/test_statement_texts.py checks that each text is sent as written and that
each is sent by some operation.

Placeholders (the only substitution, made once per provider by
:func:`sql_lease.sql.statements.statements_for`, with identifiers quoted by SQLAlchemy's MySQL
dialect):

    {table}          the lease table, e.g. `sql_leases` or `my_db`.`sql_leases`
    {fence_counter}  the one-row table of the last fence handed out, `sql_leases_fence`
    {fence_table}    the table of accepted fences, `sql_leases_fences`
    {slot_table}     the slots of semaphores, `sql_leases_slots`
    {slot_acquire_function}  migration 0009's slot grant procedure, `sql_leases_slot_acquire`
    {slot_release_function}  migration 0009's slot release procedure, `sql_leases_slot_release`

Neither server has ``RETURNING`` on every statement (MySQL has none), so an operation that must
report what it did is a short transaction: it locks the row (``SELECT ... FOR UPDATE``), acts, and
reads the row back before ``COMMIT``; the plan (:mod:`sql_lease.sql.transactional`) decides between
the steps. Time is the server's ``UTC_TIMESTAMP(6)`` (``DATETIME(6)`` columns in UTC, microseconds
kept); TTLs go in as integer microseconds. Keys and owners are ``VARBINARY``: compared byte for
byte, no collation, no trailing-space padding. Fences are drawn from the AUTO_INCREMENT of the
fence table once the key's row is locked (inserted, or locked for update), so each tenure of a key
gets a larger fence than the one before it, and no lock is held across keys; ``LAST_INSERT_ID()``
carries the value to the next statement of the same session. There is no NOTIFY: waiters poll.
"""

from __future__ import annotations

__all__ = ["PLACEHOLDERS", "SESSION_SETUP", "STEP_NAMES", "slot_steps", "steps", "texts"]

PLACEHOLDERS = ("table", "fence_counter", "fence_table", "slot_table", "slot_acquire_function", "slot_release_function")

# -- set up once on each connection the provider makes itself (never on a borrowed one) ------------

# () READ COMMITTED: a lock on a key without a row takes no gap lock (fewer deadlocks between
#   acquirers of new keys; under REPEATABLE READ they are retried)
SET_READ_COMMITTED = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"

SESSION_SETUP = (SET_READ_COMMITTED,)

# -- transactions ---------------------------------------------------------------------------------

BEGIN = "START TRANSACTION"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

# -- reads ----------------------------------------------------------------------------------------

# holder ($1 key) -> (owner, fence, expires_at, remaining_ms, data, acquired_at, released) of the unexpired lease
HOLDER = """
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000, data,
       acquired_at, released FROM {table}
 WHERE `key` = $1 AND expires_at > UTC_TIMESTAMP(6)"""

# owner ($1 key) -> (owner,) of the unexpired lease
OWNER = """
SELECT owner FROM {table} WHERE `key` = $1 AND expires_at > UTC_TIMESTAMP(6)"""

# list_leases ($1 prefix, $2 include_expired, $3 limit, $4 upper bound of the prefix): a page of at most $3
#   rows of the table, each semaphore's head (owner '') replaced by its slots (unexpired ones unless $2),
#   oldest tenure first, at most $3 rows in all; one statement however many semaphores
#   -> rows (key, owner, fence, expires_at, remaining_ms, data, acquired_at, released) by key (byte order)
LIST_LEASES = """
WITH page AS (
    SELECT `key`, owner, fence, expires_at, data, acquired_at, released FROM {table}
     WHERE `key` >= $1 AND `key` < $4 AND ($2 OR expires_at > UTC_TIMESTAMP(6))
     ORDER BY `key`
     LIMIT $3
)
SELECT `key`, owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000, data,
       acquired_at, released FROM (
    SELECT `key`, owner, fence, expires_at, data, acquired_at, released FROM page WHERE owner <> ''
    UNION ALL
    SELECT s.`key`, s.owner, s.fence, s.expires_at, s.data, s.acquired_at, s.released
      FROM page JOIN {slot_table} AS s ON s.`key` = page.`key`
     WHERE page.owner = '' AND ($2 OR s.expires_at > UTC_TIMESTAMP(6))
) AS listed
 ORDER BY `key`, acquired_at, fence
 LIMIT $3"""

# list_all ($1 include_expired, $2 limit) -> rows as LIST_LEASES, every key
LIST_ALL = """
WITH page AS (
    SELECT `key`, owner, fence, expires_at, data, acquired_at, released FROM {table}
     WHERE $1 OR expires_at > UTC_TIMESTAMP(6)
     ORDER BY `key`
     LIMIT $2
)
SELECT `key`, owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000, data,
       acquired_at, released FROM (
    SELECT `key`, owner, fence, expires_at, data, acquired_at, released FROM page WHERE owner <> ''
    UNION ALL
    SELECT s.`key`, s.owner, s.fence, s.expires_at, s.data, s.acquired_at, s.released
      FROM page JOIN {slot_table} AS s ON s.`key` = page.`key`
     WHERE page.owner = '' AND ($1 OR s.expires_at > UTC_TIMESTAMP(6))
) AS listed
 ORDER BY `key`, acquired_at, fence
 LIMIT $2"""

# -- the steps of a transaction -------------------------------------------------------------------

# lock_row ($1 key) -> (owner, fence, expires_at, remaining_ms, data, acquired_at, live, released) locked for
#   update until the transaction ends; no row if the key has none
LOCK_ROW = """
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000, data,
       acquired_at, expires_at > UTC_TIMESTAMP(6), released FROM {table}
 WHERE `key` = $1 FOR UPDATE"""

# lock_row_nowait ($1 key) -> as LOCK_ROW; fails at once (1205 on MariaDB, 3572 on MySQL) if another
#   transaction locks the row: for a call whose time limit is shorter than the lock wait timeout
LOCK_ROW_NOWAIT = """
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000, data,
       acquired_at, expires_at > UTC_TIMESTAMP(6), released FROM {table}
 WHERE `key` = $1 FOR UPDATE NOWAIT"""

# next_fence () -> nothing; a fence drawn from the AUTO_INCREMENT of the fence table (no lock held
#   to COMMIT), kept as the session's LAST_INSERT_ID(); drawn only once the key's row is locked
NEXT_FENCE = """
INSERT INTO {fence_counter} () VALUES ()"""

# grant_new ($1 key, $2 owner, $3 ttl_us, $4 data JSON text | NULL) -> nothing; a new row (locked by
#   this insert), its fence set by SET_FENCE after NEXT_FENCE
GRANT_NEW = """
INSERT INTO {table} (`key`, owner, fence, expires_at, data, acquired_at, has_waiters)
VALUES ($1, $2, 0, UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, $4, UTC_TIMESTAMP(6), FALSE)"""

# set_fence ($1 key) -> nothing; the new row's fence, from NEXT_FENCE
SET_FENCE = """
UPDATE {table} SET fence = LAST_INSERT_ID() WHERE `key` = $1"""

# take_over ($1 key, $2 owner, $3 ttl_us, $4 data) -> nothing; a locked row gets a new tenure, fence from NEXT_FENCE
TAKE_OVER = """
UPDATE {table}
   SET owner = $2, fence = LAST_INSERT_ID(), expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND,
       data = $4, acquired_at = UTC_TIMESTAMP(6), has_waiters = FALSE, released = FALSE
 WHERE `key` = $1"""

# extend ($1 key, $2 ttl_us, $3 data | NULL: keep) -> nothing; a locked row's tenure goes on
EXTEND = """
UPDATE {table}
   SET expires_at = UTC_TIMESTAMP(6) + INTERVAL $2 MICROSECOND, data = COALESCE($3, data)
 WHERE `key` = $1"""

# renew ($1 key, $2 owner, $3 ttl_us, $4 fence | NULL: any) -> row count: 1 if owner's unexpired lease was renewed
RENEW = """
UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND
 WHERE `key` = $1 AND owner = $2 AND expires_at > UTC_TIMESTAMP(6) AND NOT released AND ($4 IS NULL OR fence = $4)"""

# renew_many ($1 JSON array of [stored key (up to 1024 characters), owner, ttl_us] or [..., fence]) -> row
#   count: the owners' unexpired leases (of that fence, if given) renewed
RENEW_MANY = """
UPDATE JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$[0]',
                                    o VARCHAR(512) CHARACTER SET utf8mb4 PATH '$[1]',
                                    ttl BIGINT PATH '$[2]',
                                    f BIGINT PATH '$[3]')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k AND held.owner = r.o
   SET held.expires_at = UTC_TIMESTAMP(6) + INTERVAL r.ttl MICROSECOND
 WHERE held.expires_at > UTC_TIMESTAMP(6) AND NOT held.released AND (r.f IS NULL OR held.fence = r.f)"""

# renewed_many ($1 JSON array as RENEW_MANY) -> rows (key, owner, fence, expires_at, remaining_ms) of
#   the owners' unexpired leases, read back inside the transaction
RENEWED_MANY = """
SELECT held.`key`, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000
  FROM {table} AS held
  JOIN JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$[0]',
                                      o VARCHAR(512) CHARACTER SET utf8mb4 PATH '$[1]',
                                      f BIGINT PATH '$[3]')) AS r
    ON held.`key` = r.k AND held.owner = r.o
 WHERE held.expires_at > UTC_TIMESTAMP(6) AND NOT held.released AND (r.f IS NULL OR held.fence = r.f)"""

# granted ($1 key) -> (owner, fence, expires_at, remaining_ms) read back inside the transaction
GRANTED = """
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000 FROM {table}
 WHERE `key` = $1"""

# delete_row ($1 key) -> nothing; a locked row deleted (break_lease)
DELETE_ROW = """
DELETE FROM {table} WHERE `key` = $1"""

# -- one packet per acquire, on the provider's own connections (multi-statement packets) ------------

# acquire_packet ($1 key, $2 owner, $3 ttl_us, $4 data JSON text | NULL) -> (refused_by_holder, holder
#   owner, fence, expires_at, remaining_ms, then the row's owner, fence, expires_at, remaining_ms,
#   released after the transaction); the steps of the acquire transaction in one round trip, decided
#   in user variables: the holder read without a lock first (a lease held by another, or the owner's
#   own released one kept for its minimum hold, refuses it: every later statement then touches no
#   row, `key` = NULL), then the row locked, inserted (new key) or taken over (expired) with a fence
#   drawn only after that lock, or extended (the owner's own, not released)
ACQUIRE_PACKET = """
SELECT MAX(owner), MAX(fence), MAX(expires_at), MAX(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000),
       IF(MAX(owner) <> $2 OR MAX(released), NULL, $1)
  INTO @sl_owner, @sl_fence, @sl_expires_at, @sl_remaining_ms, @sl_key
  FROM {table} WHERE `key` = $1 AND expires_at > UTC_TIMESTAMP(6);
START TRANSACTION;
SELECT COUNT(*), MAX(owner), MAX(expires_at > UTC_TIMESTAMP(6)), MAX(released)
  INTO @sl_rows, @sl_locked_owner, @sl_live, @sl_released
  FROM {table} WHERE `key` = @sl_key FOR UPDATE;
INSERT INTO {table} (`key`, owner, fence, expires_at, data, acquired_at, has_waiters)
SELECT $1, $2, 0, UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, $4, UTC_TIMESTAMP(6), FALSE FROM DUAL
 WHERE @sl_key IS NOT NULL AND @sl_rows = 0;
INSERT INTO {fence_counter} (id) SELECT NULL FROM DUAL WHERE @sl_key IS NOT NULL AND (@sl_rows = 0 OR NOT @sl_live);
UPDATE {table}
   SET owner = $2, fence = LAST_INSERT_ID(), expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND,
       data = $4, acquired_at = UTC_TIMESTAMP(6), has_waiters = FALSE, released = FALSE
 WHERE `key` = @sl_key AND (@sl_rows = 0 OR NOT @sl_live);
UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, data = COALESCE($4, data)
 WHERE `key` = @sl_key AND @sl_live AND @sl_locked_owner = $2 AND NOT @sl_released;
SELECT @sl_key IS NULL, @sl_owner, @sl_fence, CAST(@sl_expires_at AS DATETIME(6)), @sl_remaining_ms,
       MAX(owner), MAX(fence), MAX(expires_at), MAX(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000),
       MAX(released)
  FROM {table} WHERE `key` = @sl_key;
COMMIT"""

# acquire_packet_nowait ($1 .. $4 as ACQUIRE_PACKET) -> as ACQUIRE_PACKET; its row lock fails at once
#   (1205 on MariaDB, 3572 on MySQL) if another transaction locks the row, as LOCK_ROW_NOWAIT
ACQUIRE_PACKET_NOWAIT = """
SELECT MAX(owner), MAX(fence), MAX(expires_at), MAX(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000),
       IF(MAX(owner) <> $2 OR MAX(released), NULL, $1)
  INTO @sl_owner, @sl_fence, @sl_expires_at, @sl_remaining_ms, @sl_key
  FROM {table} WHERE `key` = $1 AND expires_at > UTC_TIMESTAMP(6);
START TRANSACTION;
SELECT COUNT(*), MAX(owner), MAX(expires_at > UTC_TIMESTAMP(6)), MAX(released)
  INTO @sl_rows, @sl_locked_owner, @sl_live, @sl_released
  FROM {table} WHERE `key` = @sl_key FOR UPDATE NOWAIT;
INSERT INTO {table} (`key`, owner, fence, expires_at, data, acquired_at, has_waiters)
SELECT $1, $2, 0, UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, $4, UTC_TIMESTAMP(6), FALSE FROM DUAL
 WHERE @sl_key IS NOT NULL AND @sl_rows = 0;
INSERT INTO {fence_counter} (id) SELECT NULL FROM DUAL WHERE @sl_key IS NOT NULL AND (@sl_rows = 0 OR NOT @sl_live);
UPDATE {table}
   SET owner = $2, fence = LAST_INSERT_ID(), expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND,
       data = $4, acquired_at = UTC_TIMESTAMP(6), has_waiters = FALSE, released = FALSE
 WHERE `key` = @sl_key AND (@sl_rows = 0 OR NOT @sl_live);
UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, data = COALESCE($4, data)
 WHERE `key` = @sl_key AND @sl_live AND @sl_locked_owner = $2 AND NOT @sl_released;
SELECT @sl_key IS NULL, @sl_owner, @sl_fence, CAST(@sl_expires_at AS DATETIME(6)), @sl_remaining_ms,
       MAX(owner), MAX(fence), MAX(expires_at), MAX(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000),
       MAX(released)
  FROM {table} WHERE `key` = @sl_key;
COMMIT"""

# renew_packet ($1 key, $2 owner, $3 ttl_us, $4 fence | NULL: any) -> (owner, fence, expires_at,
#   remaining_ms) of the owner's unexpired lease (of that fence, not released), renewed, read back
#   under the lock the UPDATE took; the head's row (owner '') if the key is a semaphore's (the slot steps
#   renew the owner's slot); no row if none was renewed
RENEW_PACKET = """
START TRANSACTION;
UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND
 WHERE `key` = $1 AND owner = $2 AND expires_at > UTC_TIMESTAMP(6) AND NOT released AND ($4 IS NULL OR fence = $4);
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000 FROM {table}
 WHERE `key` = $1 AND (ROW_COUNT() > 0 OR owner = '');
COMMIT"""

# renew_many_packet ($1 JSON array as RENEW_MANY) -> rows (key, owner, fence, expires_at, remaining_ms)
#   of the owners' unexpired leases (of that fence, if given), renewed and read back in one transaction
RENEW_MANY_PACKET = """
START TRANSACTION;
UPDATE JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$[0]',
                                    o VARCHAR(512) CHARACTER SET utf8mb4 PATH '$[1]',
                                    ttl BIGINT PATH '$[2]',
                                    f BIGINT PATH '$[3]')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k AND held.owner = r.o
   SET held.expires_at = UTC_TIMESTAMP(6) + INTERVAL r.ttl MICROSECOND
 WHERE held.expires_at > UTC_TIMESTAMP(6) AND NOT held.released AND (r.f IS NULL OR held.fence = r.f);
SELECT held.`key`, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000
  FROM {table} AS held
  JOIN JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$[0]',
                                      o VARCHAR(512) CHARACTER SET utf8mb4 PATH '$[1]',
                                      f BIGINT PATH '$[3]')) AS r
    ON held.`key` = r.k AND held.owner = r.o
 WHERE held.expires_at > UTC_TIMESTAMP(6) AND NOT held.released AND (r.f IS NULL OR held.fence = r.f);
COMMIT"""

# -- single statements ----------------------------------------------------------------------------

# release ($1 key, $2 owner, $3 fence | NULL: any, $4 min_hold_us | NULL) -> row count: 1 if owner's unexpired
#   lease was deleted: unless released already or (with $4) still to be kept (RELEASE_KEEPING)
RELEASE = """
DELETE FROM {table} WHERE `key` = $1 AND owner = $2 AND ($3 IS NULL OR fence = $3) AND NOT released
   AND expires_at > UTC_TIMESTAMP(6)
   AND ($4 IS NULL OR COALESCE(acquired_at, UTC_TIMESTAMP(6)) + INTERVAL $4 MICROSECOND <= UTC_TIMESTAMP(6))"""

# release with a minimum hold ($1 key, $2 owner, $3 fence | NULL, $4 min_hold_us) -> row count: 1 if owner's
#   unexpired tenure began less than min_hold ago: kept, marked released, until then
RELEASE_KEEPING = """
UPDATE {table} SET released = TRUE, expires_at = COALESCE(acquired_at, UTC_TIMESTAMP(6)) + INTERVAL $4 MICROSECOND
 WHERE `key` = $1 AND owner = $2 AND ($3 IS NULL OR fence = $3) AND NOT released
   AND expires_at > UTC_TIMESTAMP(6)
   AND COALESCE(acquired_at, UTC_TIMESTAMP(6)) + INTERVAL $4 MICROSECOND > UTC_TIMESTAMP(6)"""

# release_expired ($1 key, $2 owner, $3 fence | NULL: any) -> row count: owner's expired row deleted (the release
#   reports False)
RELEASE_EXPIRED = """
DELETE FROM {table} WHERE `key` = $1 AND owner = $2 AND ($3 IS NULL OR fence = $3) AND expires_at <= UTC_TIMESTAMP(6)"""

# prune_fences () -> row count: the fence table's rows but the newest deleted (the newest keeps
#   the AUTO_INCREMENT above every fence handed out, across restarts)
PRUNE_FENCES = """
DELETE FROM {fence_counter} WHERE id < (SELECT newest FROM (SELECT MAX(id) AS newest FROM {fence_counter}) AS last)"""

# The sweep: the expired rows read without a lock, then deleted by key in ascending key order if still
#   expired (docs/statements.md, "Sweeping": a locking scan of the expires_at index deadlocks with grants)

# sweep ($1 grace_us, $2 batch_size, $3 heads: FALSE leases, TRUE semaphores' heads) -> rows (key,) of
#   expired rows, oldest first
SWEEP = """
SELECT `key` FROM {table} WHERE expires_at <= UTC_TIMESTAMP(6) - INTERVAL $1 MICROSECOND AND (owner = '') = $3
 ORDER BY expires_at LIMIT $2"""

# sweep_delete ($1 JSON array of stored keys, ascending, $2 grace_us, $3 heads) -> row count: those still
#   expired deleted (heads not counted: a head expires with its last slot)
SWEEP_DELETE = """
DELETE h FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS d
  STRAIGHT_JOIN {table} AS h FORCE INDEX (PRIMARY) ON h.`key` = d.k
 WHERE h.expires_at <= UTC_TIMESTAMP(6) - INTERVAL $2 MICROSECOND AND (h.owner = '') = $3"""

# -- fenced writes, on the caller's connection in the caller's transaction ------------------------

# check_held (:key, :owner, :fence) -> (fence,) iff owner holds key with that fence, unexpired; the
#   row keeps a shared lock until the caller's transaction ends (every change of it waits)
CHECK_HELD = """
SELECT fence FROM {table}
 WHERE `key` = :key AND owner = :owner AND fence = :fence AND expires_at > UTC_TIMESTAMP(6) AND NOT released
 LOCK IN SHARE MODE"""

# accept_fence (:resource, :fence) -> nothing; the resource's row locked, its fence raised to :fence
#   if larger (accepted_at first: it reads the fence before the change)
ACCEPT_FENCE = """
INSERT INTO {fence_table} (resource, fence, accepted_at) VALUES (:resource, :fence, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE accepted_at = IF(fence <= VALUES(fence), VALUES(accepted_at), accepted_at),
                        fence = GREATEST(fence, VALUES(fence))"""

# accepted (:resource) -> (fence,) the highest fence accepted (ACCEPT_FENCE accepted iff it is :fence)
ACCEPTED = "SELECT fence FROM {fence_table} WHERE resource = :resource"


# -- several keys at once, all or nothing (issue 25; docs/statements.md, "All-or-nothing acquire") --

# holders ($1 JSON array of stored keys) -> rows (stored key, owner, fence, expires_at, remaining_ms, data,
#   acquired_at, released) of the unexpired leases among the keys, read without a lock (an all-or-nothing
#   acquire's first statement; then, unless one is held by another, a transaction locking each key's row
#   in key order, as acquire's)
HOLDERS_OF_KEYS = """
SELECT held.`key`, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000, held.data, held.acquired_at,
       held.released
  FROM {table} AS held
  JOIN JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r ON held.`key` = r.k
 WHERE held.expires_at > UTC_TIMESTAMP(6)"""

# release_keys ($1 JSON array of stored keys, $2 owner, $3 JSON array of fences in the order of $1 | NULL: any)
#   -> row count: the owner's unexpired leases (of those tenures) deleted (not those released already and kept
#   for a minimum hold); the keys drive the join (STRAIGHT_JOIN), so only their rows are locked, in key order
RELEASE_KEYS = """
DELETE held
  FROM JSON_TABLE($1, '$[*]' COLUMNS (i FOR ORDINALITY, k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  LEFT JOIN JSON_TABLE(COALESCE($3, '[]'), '$[*]' COLUMNS (i FOR ORDINALITY, f BIGINT PATH '$')) AS f ON f.i = r.i
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k
 WHERE held.owner = $2 AND NOT held.released AND held.expires_at > UTC_TIMESTAMP(6)
   AND ($3 IS NULL OR held.fence = f.f)"""

# lock_rows ($1 JSON array of stored keys, in byte order) -> rows (key, owner, fence, expires_at, remaining_ms,
#   data, acquired_at, live, released) of the keys that have a row, locked for update in key order
LOCK_ROWS = """
SELECT held.`key`, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000, held.data, held.acquired_at,
       held.expires_at > UTC_TIMESTAMP(6), held.released
  FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k
 ORDER BY held.`key` FOR UPDATE"""

# lock_rows_nowait ($1 as LOCK_ROWS) -> as LOCK_ROWS; fails at once (1205 on MariaDB, 3572 on MySQL) if another
#   transaction locks a row, as LOCK_ROW_NOWAIT
LOCK_ROWS_NOWAIT = """
SELECT held.`key`, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000, held.data, held.acquired_at,
       held.expires_at > UTC_TIMESTAMP(6), held.released
  FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k
 ORDER BY held.`key` FOR UPDATE NOWAIT"""

# grant_new_keys ($1 JSON array of stored keys without a row, in byte order, $2 owner, $3 ttl_us, $4 data JSON
#   text | NULL) -> nothing; new rows (locked by this insert), each fence set after NEXT_FENCE by SET_FENCE
GRANT_NEW_KEYS = """
INSERT INTO {table} (`key`, owner, fence, expires_at, data, acquired_at, has_waiters)
SELECT r.k, $2, 0, UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, $4, UTC_TIMESTAMP(6), FALSE
  FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r"""

# extend_keys ($1 JSON array of stored keys the owner holds, rows locked, $2 ttl_us, $3 data | NULL: keep)
#   -> nothing; their tenures go on
EXTEND_KEYS = """
UPDATE JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k
   SET held.expires_at = UTC_TIMESTAMP(6) + INTERVAL $2 MICROSECOND, held.data = COALESCE($3, held.data)"""

# granted_keys ($1 JSON array of stored keys) -> rows (key, owner, fence, expires_at, remaining_ms) read back
#   inside the transaction
GRANTED_KEYS = """
SELECT held.`key`, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000
  FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k"""

# -- several keys at once, in packets on the provider's own connections (multi-statement packets) ---

# acquire_keys_packet ($1 JSON array of stored keys, in byte order, $2 owner, $3 ttl_us, $4 data JSON text | NULL)
#   -> rows, one per key of $1: (stored key, owner, fence, expires_at, remaining_ms, data, acquired_at, released,
#   live; NULLs for a key without a row, free, bulk, granted); the whole all-or-nothing acquire in one round
#   trip, decided in user variables: the holders read without a lock first (free: no key held by another or
#   released and kept; bulk: free, and one insert's auto-increment values come consecutively: lock mode 0 or 1,
#   increment 1; and the lists of positions uncut: group_concat_max_len at least its default, 1024, where 100
#   keys' positions take 291 bytes); every row of the keys locked in key order (the keys drive the LEFT JOIN),
#   noting the positions (FOR ORDINALITY) of the keys without a row and of the new tenures; granted iff no row
#   is held by another under the lock: the missing keys inserted (1062: another acquirer inserted one first), one fence
#   value per key drawn by one insert once every row is locked, each new tenure's fence the first value plus
#   its position minus one (an upsert that also extends the owner's own tenures, fence 0 marking those), every
#   row read back, COMMIT. Nothing changes unless granted; not bulk: nothing is locked (the plan goes on step
#   by step)
ACQUIRE_KEYS_PACKET = """
SELECT COUNT(*) = 0, COUNT(*) = 0 AND @@innodb_autoinc_lock_mode < 2 AND @@auto_increment_increment = 1
                     AND @@group_concat_max_len >= 1024
  INTO @sl_free, @sl_bulk
  FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k
 WHERE held.expires_at > UTC_TIMESTAMP(6) AND (held.owner <> $2 OR held.released);
START TRANSACTION;
SELECT @sl_bulk AND COUNT(CASE WHEN held.expires_at > UTC_TIMESTAMP(6) AND (held.owner <> $2 OR held.released)
                               THEN 1 END) = 0,
       COALESCE(GROUP_CONCAT(CASE WHEN held.`key` IS NULL THEN r.n END), ''),
       COALESCE(GROUP_CONCAT(CASE WHEN held.`key` IS NULL OR held.expires_at <= UTC_TIMESTAMP(6) THEN r.n END), '')
  INTO @sl_granted, @sl_missing, @sl_new
  FROM JSON_TABLE(IF(@sl_bulk, $1, '[]'),
                  '$[*]' COLUMNS (n FOR ORDINALITY, k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  LEFT JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k
   FOR UPDATE;
INSERT INTO {table} (`key`, owner, fence, expires_at, data, acquired_at, has_waiters)
SELECT r.k, $2, 0, UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, $4, UTC_TIMESTAMP(6), FALSE
  FROM JSON_TABLE(IF(@sl_granted, $1, '[]'),
                  '$[*]' COLUMNS (n FOR ORDINALITY, k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
 WHERE FIND_IN_SET(r.n, @sl_missing);
INSERT INTO {fence_counter} (id)
SELECT NULL FROM JSON_TABLE(IF(@sl_granted AND @sl_new <> '', $1, '[]'),
                            '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r;
INSERT INTO {table} (`key`, owner, fence, expires_at, data, acquired_at, has_waiters)
SELECT r.k, $2, IF(FIND_IN_SET(r.n, @sl_new), LAST_INSERT_ID() + r.n - 1, 0),
       UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, $4, UTC_TIMESTAMP(6), FALSE
  FROM JSON_TABLE(IF(@sl_granted, $1, '[]'),
                  '$[*]' COLUMNS (n FOR ORDINALITY, k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
    ON DUPLICATE KEY UPDATE owner = VALUES(owner), expires_at = VALUES(expires_at),
       data = IF(VALUES(fence) = 0, COALESCE(VALUES(data), data), VALUES(data)),
       acquired_at = IF(VALUES(fence) = 0, acquired_at, VALUES(acquired_at)),
       has_waiters = IF(VALUES(fence) = 0, has_waiters, FALSE), released = FALSE,
       fence = IF(VALUES(fence) = 0, fence, VALUES(fence));
SELECT r.k, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000, held.data, held.acquired_at,
       held.released, held.expires_at > UTC_TIMESTAMP(6), @sl_free, @sl_bulk, @sl_granted
  FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  LEFT JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k;
COMMIT"""

# Where acquire_keys_packet cannot draw its fences in bulk (innodb_autoinc_lock_mode 2, MySQL 8's default, or
#   auto_increment_increment > 1: one insert's values may interleave with another's), a packet per step:

# lock_rows_packet ($1 as LOCK_ROWS) -> as LOCK_ROWS; START TRANSACTION, then LOCK_ROWS, in one round trip
LOCK_ROWS_PACKET = """
START TRANSACTION;
SELECT held.`key`, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000, held.data, held.acquired_at,
       held.expires_at > UTC_TIMESTAMP(6), held.released
  FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k
 ORDER BY held.`key` FOR UPDATE"""

# fence_new_packet ($1 key) -> row count; NEXT_FENCE then SET_FENCE of a row GRANT_NEW_KEYS inserted (locked)
FENCE_NEW_PACKET = """
INSERT INTO {fence_counter} () VALUES ();
UPDATE {table} SET fence = LAST_INSERT_ID() WHERE `key` = $1"""

# fence_take_over_packet ($1 key, $2 owner, $3 ttl_us, $4 data) -> row count; NEXT_FENCE then TAKE_OVER of a
#   locked expired row
FENCE_TAKE_OVER_PACKET = """
INSERT INTO {fence_counter} () VALUES ();
UPDATE {table}
   SET owner = $2, fence = LAST_INSERT_ID(), expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND,
       data = $4, acquired_at = UTC_TIMESTAMP(6), has_waiters = FALSE, released = FALSE
 WHERE `key` = $1"""

# granted_keys_packet ($1 as GRANTED_KEYS) -> as GRANTED_KEYS; the rows read back, then COMMIT, in one round trip
GRANTED_KEYS_PACKET = """
SELECT held.`key`, held.owner, held.fence, held.expires_at,
       TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), held.expires_at) / 1000
  FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS r
  STRAIGHT_JOIN {table} AS held FORCE INDEX (PRIMARY) ON held.`key` = r.k;
COMMIT"""

# -- one statement per semaphore slot grant or release, on the provider's own connections ------------
# The steps of slot_acquire's and slot_release's transactions (SLOT_* below) in one round trip each: the
# procedures of migration 0009 (their bodies there; docs/statements.md, "MySQL slot procedures"), which lock
# the head row before anything else and decide in user variables (@ss_*, @sr_*) as ACQUIRE_PACKET does. A
# CALL answers its row, then the CALL's own result: the executors read every result of what they send.

# slot_acquire_call ($1 key, $2 owner, $3 ttl_us, $4 data JSON text | NULL, $5 limit) -> (plain: the key's row is
#   an unexpired plain lease (nothing changed), granted (a new slot or the owner's own renewed), the key's row's
#   owner, fence, expires_at, remaining_ms, released, then the owner's slot if granted, else the oldest
#   unexpired slot: owner, fence, expires_at, remaining_ms); a refusal writes nothing but the head it made
SLOT_ACQUIRE_CALL = """
CALL {slot_acquire_function}($1, $2, $3, $4, $5)"""

# slot_release_first_call ($1 key, $2 owner, $3 fence | NULL: any, $4 min_hold_us | NULL) -> (the key's row was a
#   semaphore's head when locked, the owner's slot released: kept, or deleted unexpired); sent first for a key
#   remembered as a semaphore's (docs/statements.md, "Semaphore hints")
SLOT_RELEASE_FIRST_CALL = """
CALL {slot_release_function}($1, $2, $3, $4)"""

# slot_release_packet ($1 .. $4 as SLOT_RELEASE_FIRST_CALL) -> as SLOT_RELEASE_FIRST_CALL; sent after RELEASE (and
#   RELEASE_KEEPING) released nothing: RELEASE_EXPIRED, then SLOT_RELEASE_FIRST_CALL
SLOT_RELEASE_PACKET = RELEASE_EXPIRED + ";" + SLOT_RELEASE_FIRST_CALL

STEP_NAMES = (
    "begin",
    "commit",
    "rollback",
    "lock_row",
    "lock_row_nowait",
    "next_fence",
    "grant_new",
    "set_fence",
    "take_over",
    "extend",
    "granted",
    "delete_row",
    "release_expired",
    "renewed_many",
    "prune_fences",
    "sweep_delete",
    "acquire_packet",
    "acquire_packet_nowait",
    "renew_packet",
    "renew_many_packet",
    "lock_rows",
    "lock_rows_nowait",
    "grant_new_keys",
    "extend_keys",
    "granted_keys",
    "lock_rows_packet",
    "fence_new_packet",
    "fence_take_over_packet",
    "granted_keys_packet",
    "acquire_keys_packet",
    "slot_acquire_packet",
    "slot_release_packet",
    "slot_release_first_packet",
)
"""The statements of MySQL's transactions beyond :data:`~sql_lease.sql.dialects.STATEMENT_NAMES`."""


def texts(*, durable_session: bool, durable_release: bool) -> dict[str, str | None]:
    """The statement each operation sends, by name; the same for every variant (durability is the
    server's ``innodb_flush_log_at_trx_commit``). An operation that is a transaction names its
    first statement of its own here; the rest are in :func:`steps`."""
    return {
        "acquire": HOLDER,  # then, unless held by another, a transaction from LOCK_ROW (steps)
        "acquire_waiting": HOLDER,
        "holder": HOLDER,
        "owner": OWNER,
        "list_leases": LIST_LEASES,
        "list_all": LIST_ALL,
        "notify_channel": None,  # no LISTEN on MySQL: waiters poll
        "release": RELEASE,
        "release_keeping": RELEASE_KEEPING,
        "renew": RENEW,
        "renew_many": RENEW_MANY,
        "transfer": LOCK_ROW,
        "break_lease": LOCK_ROW,
        "sweep": SWEEP,
        "check_held": CHECK_HELD,
        "accept_fence": ACCEPT_FENCE,
        "accepted": ACCEPTED,
        "acquire_keys": HOLDERS_OF_KEYS,  # then a transaction from LOCK_ROWS (steps; own connections: one packet)
        "holders": HOLDERS_OF_KEYS,
        "release_keys": RELEASE_KEYS,
    }


def steps() -> dict[str, str]:
    """The statements of MySQL's transactions by name (:data:`STEP_NAMES`)."""
    return {
        "begin": BEGIN,
        "commit": COMMIT,
        "rollback": ROLLBACK,
        "lock_row": LOCK_ROW,
        "lock_row_nowait": LOCK_ROW_NOWAIT,
        "next_fence": NEXT_FENCE,
        "grant_new": GRANT_NEW,
        "set_fence": SET_FENCE,
        "take_over": TAKE_OVER,
        "extend": EXTEND,
        "granted": GRANTED,
        "delete_row": DELETE_ROW,
        "release_expired": RELEASE_EXPIRED,
        "renewed_many": RENEWED_MANY,
        "prune_fences": PRUNE_FENCES,
        "sweep_delete": SWEEP_DELETE,
        "acquire_packet": ACQUIRE_PACKET,
        "acquire_packet_nowait": ACQUIRE_PACKET_NOWAIT,
        "renew_packet": RENEW_PACKET,
        "renew_many_packet": RENEW_MANY_PACKET,
        "lock_rows": LOCK_ROWS,
        "lock_rows_nowait": LOCK_ROWS_NOWAIT,
        "grant_new_keys": GRANT_NEW_KEYS,
        "extend_keys": EXTEND_KEYS,
        "granted_keys": GRANTED_KEYS,
        "lock_rows_packet": LOCK_ROWS_PACKET,
        "fence_new_packet": FENCE_NEW_PACKET,
        "fence_take_over_packet": FENCE_TAKE_OVER_PACKET,
        "granted_keys_packet": GRANTED_KEYS_PACKET,
        "acquire_keys_packet": ACQUIRE_KEYS_PACKET,
        "slot_acquire_packet": SLOT_ACQUIRE_CALL,
        "slot_release_packet": SLOT_RELEASE_PACKET,
        "slot_release_first_packet": SLOT_RELEASE_FIRST_CALL,
    }


# -- semaphores: the slot table {slot_table}, each operation a transaction that locks the head first --
# A key held as a semaphore has a head row in {table} (owner ''): every slot operation runs
# START TRANSACTION, SLOT_LOCK_HEAD (or SLOT_MAKE_HEAD, then the lock), reads under READ COMMITTED
# (each statement sees every commit before it; the head lock orders them), acts, COMMIT.

# slot_lock_head ($1 key) -> (owner, fence, expires_at, remaining_ms, data, acquired_at, live, released,
#   has_waiters) of the key's row in the lease table (a plain lease or a head), locked for update
SLOT_LOCK_HEAD = """
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000, data,
       acquired_at, expires_at > UTC_TIMESTAMP(6), released, has_waiters FROM {table}
 WHERE `key` = $1 FOR UPDATE"""

# slot_lock_only_head ($1 key) -> SLOT_LOCK_HEAD's row if the key's row is a semaphore's head (owner ''), locked
#   to COMMIT (InnoDB locks the row it reads by primary key even when owner differs: the plain check first)
SLOT_LOCK_ONLY_HEAD = """
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000, data,
       acquired_at, expires_at > UTC_TIMESTAMP(6), released, has_waiters FROM {table}
 WHERE `key` = $1 AND owner = '' FOR UPDATE"""

# slot_is_head ($1 key) -> (1,) if the key's row is a semaphore's head: read after a plain release that deleted
#   nothing, or for an item renew_many did not renew (no lock)
SLOT_IS_HEAD = "SELECT 1 FROM {table} WHERE `key` = $1 AND owner = ''"

# slot_make_head ($1 key) -> row count; an expired head (owner '') for a key without a row (a row another
#   acquirer inserted first is left as it is: no warning, as INSERT IGNORE would give)
SLOT_MAKE_HEAD = """
INSERT INTO {table} (`key`, owner, fence, expires_at, acquired_at, has_waiters)
VALUES ($1, '', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), FALSE)
ON DUPLICATE KEY UPDATE `key` = `key`"""

# slot_to_head ($1 key) -> row count; the locked, expired plain lease of the key becomes its head
SLOT_TO_HEAD = """
UPDATE {table} SET owner = '', data = NULL, released = FALSE WHERE `key` = $1"""

# slot_state ($1 key, $2 owner, $3 min_hold_us | NULL) -> (other owners' unexpired slots, owner's slot fence |
#   NULL, owner's slot unexpired, owner's slot released, owner's tenure began less than min_hold ago)
SLOT_STATE = """
SELECT COUNT(CASE WHEN owner <> $2 AND expires_at > UTC_TIMESTAMP(6) THEN 1 END),
       MAX(CASE WHEN owner = $2 THEN fence END),
       COALESCE(MAX(owner = $2 AND expires_at > UTC_TIMESTAMP(6)), 0),
       COALESCE(MAX(owner = $2 AND released), 0),
       COALESCE(MAX(owner = $2 AND acquired_at + INTERVAL $3 MICROSECOND > UTC_TIMESTAMP(6)), 0)
  FROM {slot_table} WHERE `key` = $1"""

# slot_drawn_fence () -> (fence,) the fence NEXT_FENCE drew (the session's LAST_INSERT_ID())
SLOT_DRAWN_FENCE = "SELECT LAST_INSERT_ID()"

# slot_insert ($1 key, $2 owner, $3 ttl_us, $4 data JSON text | NULL, $5 fence) -> row count; a new tenure
SLOT_INSERT = """
INSERT INTO {slot_table} (`key`, owner, fence, acquired_at, expires_at, data, released)
VALUES ($1, $2, $5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, $4, FALSE)"""

# slot_delete ($1 key, $2 owner) -> row count; the owner's slot row deleted
SLOT_DELETE = "DELETE FROM {slot_table} WHERE `key` = $1 AND owner = $2"

# slot_extend ($1 key, $2 owner, $3 ttl_us, $4 data JSON text | NULL: keep) -> row count: 1 if the slot was
#   unexpired and is extended (the tenure goes on), else 0
SLOT_EXTEND = """
UPDATE {slot_table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL $3 MICROSECOND, data = COALESCE($4, data)
 WHERE `key` = $1 AND owner = $2 AND expires_at > UTC_TIMESTAMP(6)"""

# slot_keep ($1 key, $2 owner, $3 min_hold_us) -> row count; released, kept until its tenure start + min_hold
SLOT_KEEP = """
UPDATE {slot_table} SET released = TRUE, expires_at = acquired_at + INTERVAL $3 MICROSECOND
 WHERE `key` = $1 AND owner = $2"""

# slot_refresh_head ($1 key, $2 fence granted | NULL) -> row count; the head's expiry (the latest unexpired
#   slot's, else now: free) and tenure start (the oldest holder's), its fence raised to $2
SLOT_REFRESH_HEAD = """
UPDATE {table}
   SET expires_at = COALESCE((SELECT MAX(expires_at) FROM {slot_table}
                               WHERE `key` = $1 AND expires_at > UTC_TIMESTAMP(6)), UTC_TIMESTAMP(6)),
       acquired_at = COALESCE((SELECT MIN(acquired_at) FROM {slot_table}
                                WHERE `key` = $1 AND expires_at > UTC_TIMESTAMP(6)), acquired_at),
       fence = GREATEST(fence, COALESCE($2, fence))
 WHERE `key` = $1"""

# slot_mine ($1 key, $2 owner) -> (owner, fence, expires_at, remaining_ms) of the owner's slot (read back)
SLOT_MINE = """
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000 FROM {slot_table}
 WHERE `key` = $1 AND owner = $2"""

# slot_rows ($1 key) -> rows (owner, fence, expires_at, remaining_ms, data, acquired_at, released, live) of
#   every slot of the key, expired ones too, oldest tenure first
SLOT_ROWS = """
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000, data,
       acquired_at, released, expires_at > UTC_TIMESTAMP(6) FROM {slot_table}
 WHERE `key` = $1 ORDER BY acquired_at, fence"""

# slot_delete_all ($1 key) -> row count; every slot of the key deleted, then its head (break_lease)
SLOT_DELETE_ALL = """
DELETE FROM {slot_table} WHERE `key` = $1"""

# slot_delete_head ($1 key) -> row count; the key's head deleted (break_lease)
SLOT_DELETE_HEAD = """
DELETE FROM {table} WHERE `key` = $1 AND owner = ''"""


# holders ($1 key) -> rows (owner, fence, expires_at, remaining_ms, data, acquired_at, released) of every
#   unexpired holder: the plain lease, or each slot of a semaphore, oldest tenure first, then fence; judged
#   at UTC_TIMESTAMP(6) (the statement's start), or at the newest tenure start the statement sees if later (it
#   read a row committed since). Scalar subqueries, not a window over a derived table: MariaDB 10.11.19
#   crashed (signal 11 in ha_maria::drop_table) running that form beside busy semaphores
def _holders(read_at: str) -> str:
    return f"""
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, {read_at}, expires_at) / 1000 AS remaining,
       data, acquired_at, released FROM {{table}}
 WHERE `key` = $1 AND owner <> '' AND expires_at > {read_at}
UNION ALL
SELECT owner, fence, expires_at, TIMESTAMPDIFF(MICROSECOND, {read_at}, expires_at) / 1000, data,
       acquired_at, released FROM {{slot_table}}
 WHERE `key` = $1 AND expires_at > {read_at}
ORDER BY acquired_at, fence"""


HOLDERS = _holders(
    "GREATEST(UTC_TIMESTAMP(6), "
    "COALESCE((SELECT MAX(acquired_at) FROM {table} WHERE `key` = $1 AND owner <> ''), UTC_TIMESTAMP(6)), "
    "COALESCE((SELECT MAX(acquired_at) FROM {slot_table} WHERE `key` = $1), UTC_TIMESTAMP(6)))"
)

# The slot sweep: the expired slots read (no lock), then in one transaction their keys' rows locked in
#   key order, skipping a row another transaction holds (a grant holds its key's row while it judges its
#   owner's slot live and extends it; a guard shares it), then the slots of the keys locked, and of keys
#   without a row (a head never expires before a live slot), deleted if they are still expired.

# slot_sweep_doomed ($1 grace_us, $2 batch_size) -> rows (key, owner, whether the key has a row) of expired slots
SLOT_SWEEP_DOOMED = """
SELECT s.`key`, s.owner, EXISTS (SELECT 1 FROM {table} AS h WHERE h.`key` = s.`key`) FROM {slot_table} AS s
 WHERE s.expires_at <= UTC_TIMESTAMP(6) - INTERVAL $1 MICROSECOND
 ORDER BY s.expires_at LIMIT $2"""

# slot_sweep_lock ($1 JSON array of stored keys, ascending) -> rows (key,) locked, in that order; a row another
#   transaction holds is skipped
SLOT_SWEEP_LOCK = """
SELECT h.`key` FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$')) AS d
  STRAIGHT_JOIN {table} AS h FORCE INDEX (PRIMARY) ON h.`key` = d.k
  FOR UPDATE SKIP LOCKED"""

# slot_sweep_delete ($1 JSON array of [stored key, owner], $2 grace_us) -> row count: those still expired
SLOT_SWEEP_DELETE = """
DELETE s FROM JSON_TABLE($1, '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$[0]',
                                             o VARCHAR(512) CHARACTER SET utf8mb4 PATH '$[1]')) AS d
  STRAIGHT_JOIN {slot_table} AS s FORCE INDEX (PRIMARY) ON s.`key` = d.k AND s.owner = d.o
 WHERE s.expires_at <= UTC_TIMESTAMP(6) - INTERVAL $2 MICROSECOND"""

# check_slot (:key, :owner, :fence) -> (fence,) iff owner holds a slot of key with that fence, unexpired;
#   the slot row keeps a shared lock until the caller's transaction ends
CHECK_SLOT = """
SELECT fence FROM {slot_table}
 WHERE `key` = :key AND owner = :owner AND fence = :fence AND expires_at > UTC_TIMESTAMP(6) AND NOT released
 LOCK IN SHARE MODE"""


def slot_steps(*, durable_session: bool, durable_release: bool = False) -> dict[str, str | None]:
    """The statements of semaphores by name (``SLOT_STEP_NAMES`` of the PostgreSQL module); the
    same in every variant."""
    return {
        "slot_grant": None,  # SQLite's one-statement slot operations
        "slot_renew_one": None,
        "slot_release_one": None,
        "slot_release_first": None,  # slot_release_first_packet, on its own connections
        "slot_keep_one": None,
        "slot_acquire_call": None,  # a transaction of the steps below
        "slot_begin": BEGIN,
        "slot_commit": COMMIT,
        "slot_rollback": ROLLBACK,
        "slot_pin": None,
        "slot_serialise": None,  # plain acquires lock the key's row before they draw
        "slot_lock_head": SLOT_LOCK_HEAD,
        "slot_lock_only_head": SLOT_LOCK_ONLY_HEAD,
        "slot_is_head": SLOT_IS_HEAD,
        "slot_make_head": SLOT_MAKE_HEAD,
        "slot_to_head": SLOT_TO_HEAD,
        "slot_state": SLOT_STATE,
        "slot_next_fence": NEXT_FENCE,
        "slot_drawn_fence": SLOT_DRAWN_FENCE,
        "slot_insert": SLOT_INSERT,
        "slot_delete": SLOT_DELETE,
        "slot_extend": SLOT_EXTEND,
        "slot_keep": SLOT_KEEP,
        "slot_refresh_head": SLOT_REFRESH_HEAD,
        "slot_mine": SLOT_MINE,
        "slot_rows": SLOT_ROWS,
        "slot_delete_all": SLOT_DELETE_ALL,
        "slot_delete_head": SLOT_DELETE_HEAD,
        "slot_wake": None,  # no NOTIFY on MySQL: waiters poll
        "slot_flag": None,
        "slot_holders": HOLDERS,
        "slot_sweep": None,  # a transaction of the three below
        "slot_sweep_doomed": SLOT_SWEEP_DOOMED,
        "slot_sweep_lock": SLOT_SWEEP_LOCK,
        "slot_sweep_delete": SLOT_SWEEP_DELETE,
        "check_slot": CHECK_SLOT,
    }
