"""Every statement sql_lease sends to PostgreSQL, written out whole: what you read is what the
driver runs. The reasoning is in docs/statements.md; tests/test_statement_texts.py checks that each
text is sent as written and that each is sent by some operation.

Placeholders (the only substitution, made once per provider by
:func:`sql_lease.sql.statements.statements_for`, with identifiers quoted by SQLAlchemy's
PostgreSQL dialect):

    {table}                   the lease table, e.g. "sql_leases" or "my_schema"."sql_leases"
    {table_literal}           the same name as a string literal, '"sql_leases"' (for ::regclass)
    {fence_sequence_literal}  the fence sequence's name as a string literal, '"sql_leases_fence_seq"'
    {fence_table}             the table of accepted fences, "sql_leases_fences"

Lease statements take positional parameters ($1, ...), run in autocommit on the provider's
connections; fenced-write statements (CHECK_HELD, ACCEPT_FENCE, ACCEPTED) take named parameters
(SQLAlchemy ``text()``) and run in the caller's transaction.

Variants. Acquire, renew and transfer must commit with ``synchronous_commit`` at least ``on``. On
the provider's own connections that is pinned once per session (SESSION_SETUP) and the plain
statement runs; on borrowed connections and with ``pgbouncer=True`` the ``*_PINNED`` statement
pins it for its own transaction. Release is relaxed (``synchronous_commit = off`` for its own
transaction) unless ``durable_release=True``. :func:`texts` picks one statement per name.
"""

from __future__ import annotations

__all__ = ["PLACEHOLDERS", "SESSION_SETUP", "SLOT_STEP_NAMES", "slot_steps", "texts"]

PLACEHOLDERS = (
    "table",
    "table_literal",
    "fence_sequence_literal",
    "fence_table",
    "slot_table",
    "slot_acquire_function",
    "slot_release_function",
)

# -- set up once on each connection the provider makes itself (not borrowed, not via PgBouncer) ---

# () no sequential scans for key lookups (docs/statements.md, "Plans")
SET_NO_SEQSCAN = "SET enable_seqscan = off"

# () synchronous_commit raised to 'on' for the session if it is 'off' (stronger settings kept)
SET_DURABLE_SESSION = """SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, false)"""

SESSION_SETUP = (SET_NO_SEQSCAN, SET_DURABLE_SESSION)

# -- acquire --------------------------------------------------------------------------------------

# acquire ($1 key, $2 owner, $3 ttl_ms, $4 data JSON text | NULL, $5 lock_timeout '2500ms' | NULL)
#   -> (acquired, owner, fence, expires_at, remaining_ms): granted, or refused naming the holder
ACQUIRE = """
WITH busy AS (
    SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - now()) * 1000)::float8 AS remaining,
           has_waiters FROM {table}
     WHERE key = $1 AND expires_at + interval '0' > now() AND (owner <> $2 OR released)
), bounded AS (
    SELECT set_config('lock_timeout', coalesce($5::text, current_setting('lock_timeout')), true) AS limit_
), serialised AS (
    SELECT pg_advisory_xact_lock({table_literal}::regclass::oid::int4, hashtext($1::varchar))
      FROM bounded WHERE NOT EXISTS (SELECT FROM busy)
), locked AS (
    SELECT l.key FROM {table} AS l WHERE l.key = $1 AND EXISTS (SELECT FROM serialised) FOR NO KEY UPDATE
), granted AS (
    SELECT clock_timestamp() AS at FROM serialised, (SELECT count(*) FROM locked) AS row_lock
), attempt AS (
    INSERT INTO {table} AS held (key, owner, fence, expires_at, data, acquired_at)
    SELECT $1, $2, nextval({fence_sequence_literal}), at + $3::float8 * interval '1 millisecond', $4::json, at
      FROM granted
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = clock_timestamp() + $3::float8 * interval '1 millisecond',
           fence = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                        THEN held.fence ELSE nextval({fence_sequence_literal}) END,
           data = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                       THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
           acquired_at = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                              THEN held.acquired_at ELSE clock_timestamp() END,
           has_waiters = held.has_waiters AND held.owner = excluded.owner,
           released = false
     WHERE (held.owner = excluded.owner AND NOT held.released) OR held.expires_at <= clock_timestamp()
    RETURNING held.owner, held.fence, held.expires_at
)
SELECT true, owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8
  FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at, remaining FROM busy"""

# acquire, pinned durable for its own transaction: parameters and result as ACQUIRE
ACQUIRE_PINNED = """
WITH busy AS (
    SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - now()) * 1000)::float8 AS remaining,
           has_waiters FROM {table}
     WHERE key = $1 AND expires_at + interval '0' > now() AND (owner <> $2 OR released)
), bounded AS (
    SELECT set_config('lock_timeout', coalesce($5::text, current_setting('lock_timeout')), true) AS limit_
), serialised AS (
    SELECT pg_advisory_xact_lock({table_literal}::regclass::oid::int4, hashtext($1::varchar)),
           set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
      FROM bounded WHERE NOT EXISTS (SELECT FROM busy)
), locked AS (
    SELECT l.key FROM {table} AS l WHERE l.key = $1 AND EXISTS (SELECT FROM serialised) FOR NO KEY UPDATE
), granted AS (
    SELECT clock_timestamp() AS at FROM serialised, (SELECT count(*) FROM locked) AS row_lock
), attempt AS (
    INSERT INTO {table} AS held (key, owner, fence, expires_at, data, acquired_at)
    SELECT $1, $2, nextval({fence_sequence_literal}), at + $3::float8 * interval '1 millisecond', $4::json, at
      FROM granted
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = clock_timestamp() + $3::float8 * interval '1 millisecond',
           fence = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                        THEN held.fence ELSE nextval({fence_sequence_literal}) END,
           data = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                       THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
           acquired_at = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                              THEN held.acquired_at ELSE clock_timestamp() END,
           has_waiters = held.has_waiters AND held.owner = excluded.owner,
           released = false
     WHERE (held.owner = excluded.owner AND NOT held.released) OR held.expires_at <= clock_timestamp()
    RETURNING held.owner, held.fence, held.expires_at
)
SELECT true, owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8
  FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at, remaining FROM busy"""

# acquire of a waiter ($1 key, $2 owner, $3 ttl_ms, $4 data, $5 lock_timeout) -> ACQUIRE's columns and
#   flagged: a refusal also sets has_waiters, unless another transaction locks the row (flagged false)
ACQUIRE_WAITING = """
WITH busy AS (
    SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - now()) * 1000)::float8 AS remaining,
           has_waiters FROM {table}
     WHERE key = $1 AND expires_at + interval '0' > now() AND (owner <> $2 OR released)
), bounded AS (
    SELECT set_config('lock_timeout', coalesce($5::text, current_setting('lock_timeout')), true) AS limit_
), serialised AS (
    SELECT pg_advisory_xact_lock({table_literal}::regclass::oid::int4, hashtext($1::varchar))
      FROM bounded WHERE NOT EXISTS (SELECT FROM busy)
), locked AS (
    SELECT l.key FROM {table} AS l WHERE l.key = $1 AND EXISTS (SELECT FROM serialised) FOR NO KEY UPDATE
), granted AS (
    SELECT clock_timestamp() AS at FROM serialised, (SELECT count(*) FROM locked) AS row_lock
), attempt AS (
    INSERT INTO {table} AS held (key, owner, fence, expires_at, data, acquired_at)
    SELECT $1, $2, nextval({fence_sequence_literal}), at + $3::float8 * interval '1 millisecond', $4::json, at
      FROM granted
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = clock_timestamp() + $3::float8 * interval '1 millisecond',
           fence = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                        THEN held.fence ELSE nextval({fence_sequence_literal}) END,
           data = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                       THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
           acquired_at = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                              THEN held.acquired_at ELSE clock_timestamp() END,
           has_waiters = held.has_waiters AND held.owner = excluded.owner,
           released = false
     WHERE (held.owner = excluded.owner AND NOT held.released) OR held.expires_at <= clock_timestamp()
    RETURNING held.owner, held.fence, held.expires_at
), flag AS (
    SELECT key FROM {table}
     WHERE key = $1 AND NOT has_waiters AND NOT EXISTS (SELECT FROM attempt)
       FOR NO KEY UPDATE SKIP LOCKED
), waiting AS (
    UPDATE {table} AS l SET has_waiters = true FROM flag
     WHERE l.key = flag.key
    RETURNING l.owner, l.fence, l.expires_at, l.released
)
SELECT true, owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8, true
  FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8, true
  FROM waiting WHERE expires_at > clock_timestamp() AND (owner <> $2 OR released)
UNION ALL
SELECT false, owner, fence, expires_at, remaining, has_waiters FROM busy WHERE NOT EXISTS (SELECT FROM waiting)"""

# acquire of a waiter, pinned durable for its own transaction: parameters and result as ACQUIRE_WAITING
ACQUIRE_WAITING_PINNED = """
WITH busy AS (
    SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - now()) * 1000)::float8 AS remaining,
           has_waiters FROM {table}
     WHERE key = $1 AND expires_at + interval '0' > now() AND (owner <> $2 OR released)
), bounded AS (
    SELECT set_config('lock_timeout', coalesce($5::text, current_setting('lock_timeout')), true) AS limit_
), serialised AS (
    SELECT pg_advisory_xact_lock({table_literal}::regclass::oid::int4, hashtext($1::varchar)),
           set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
      FROM bounded WHERE NOT EXISTS (SELECT FROM busy)
), locked AS (
    SELECT l.key FROM {table} AS l WHERE l.key = $1 AND EXISTS (SELECT FROM serialised) FOR NO KEY UPDATE
), granted AS (
    SELECT clock_timestamp() AS at FROM serialised, (SELECT count(*) FROM locked) AS row_lock
), attempt AS (
    INSERT INTO {table} AS held (key, owner, fence, expires_at, data, acquired_at)
    SELECT $1, $2, nextval({fence_sequence_literal}), at + $3::float8 * interval '1 millisecond', $4::json, at
      FROM granted
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = clock_timestamp() + $3::float8 * interval '1 millisecond',
           fence = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                        THEN held.fence ELSE nextval({fence_sequence_literal}) END,
           data = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                       THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
           acquired_at = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                              THEN held.acquired_at ELSE clock_timestamp() END,
           has_waiters = held.has_waiters AND held.owner = excluded.owner,
           released = false
     WHERE (held.owner = excluded.owner AND NOT held.released) OR held.expires_at <= clock_timestamp()
    RETURNING held.owner, held.fence, held.expires_at
), flag AS (
    SELECT key FROM {table}
     WHERE key = $1 AND NOT has_waiters AND NOT EXISTS (SELECT FROM attempt)
       FOR NO KEY UPDATE SKIP LOCKED
), waiting AS (
    UPDATE {table} AS l SET has_waiters = true FROM flag
     WHERE l.key = flag.key
    RETURNING l.owner, l.fence, l.expires_at, l.released
)
SELECT true, owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8, true
  FROM attempt
UNION ALL
SELECT false, owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8, true
  FROM waiting WHERE expires_at > clock_timestamp() AND (owner <> $2 OR released)
UNION ALL
SELECT false, owner, fence, expires_at, remaining, has_waiters FROM busy WHERE NOT EXISTS (SELECT FROM waiting)"""

# -- reads ----------------------------------------------------------------------------------------

# holder ($1 key) -> (owner, fence, expires_at, remaining_ms, data, acquired_at, released) of the unexpired lease
HOLDER = """
SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - now()) * 1000)::float8, data::text, acquired_at,
       released
  FROM {table} WHERE key = $1 AND expires_at + interval '0' > now()"""

# owner ($1 key) -> (owner,) of the unexpired lease
OWNER = "SELECT owner FROM {table} WHERE key = $1 AND expires_at + interval '0' > now()"

# list_leases ($1 prefix, $2 include_expired, $3 limit, $4 upper bound of the prefix): a page of at most $3
#   rows of the table, each semaphore's head (owner '') replaced by its slots (unexpired ones unless $2),
#   oldest tenure first, at most $3 rows in all (a head with no such slot takes no place: "Stale heads");
#   one statement however many semaphores
#   -> rows (key, owner, fence, expires_at, remaining_ms, data, acquired_at, released) by key
LIST_LEASES = """
WITH page AS (
    SELECT key, owner, fence, expires_at, data, acquired_at, released FROM {table} AS l
     WHERE key COLLATE "C" >= $1::varchar AND key COLLATE "C" < $4::varchar
       AND ($2::boolean OR expires_at + interval '0' > now())
       AND (owner <> '' OR EXISTS (SELECT FROM {slot_table} AS s
                                    WHERE s.key = l.key AND ($2::boolean OR s.expires_at > now())))
     ORDER BY key
     LIMIT $3
)
SELECT key, owner, fence, expires_at, (extract(epoch FROM expires_at - now()) * 1000)::float8, data::text,
       acquired_at, released FROM (
    SELECT key, owner, fence, expires_at, data, acquired_at, released FROM page WHERE owner <> ''
    UNION ALL
    SELECT s.key, s.owner, s.fence, s.expires_at, s.data, s.acquired_at, s.released
      FROM page JOIN {slot_table} AS s ON s.key = page.key
     WHERE page.owner = '' AND ($2::boolean OR s.expires_at > now())
) AS listed
 ORDER BY key, acquired_at, fence
 LIMIT $3"""

# list_all ($1 include_expired, $2 limit) -> rows as LIST_LEASES, every key
LIST_ALL = """
WITH page AS (
    SELECT key, owner, fence, expires_at, data, acquired_at, released FROM {table} AS l
     WHERE ($1::boolean OR expires_at + interval '0' > now())
       AND (owner <> '' OR EXISTS (SELECT FROM {slot_table} AS s
                                    WHERE s.key = l.key AND ($1::boolean OR s.expires_at > now())))
     ORDER BY key
     LIMIT $2
)
SELECT key, owner, fence, expires_at, (extract(epoch FROM expires_at - now()) * 1000)::float8, data::text,
       acquired_at, released FROM (
    SELECT key, owner, fence, expires_at, data, acquired_at, released FROM page WHERE owner <> ''
    UNION ALL
    SELECT s.key, s.owner, s.fence, s.expires_at, s.data, s.acquired_at, s.released
      FROM page JOIN {slot_table} AS s ON s.key = page.key
     WHERE page.owner = '' AND ($1::boolean OR s.expires_at > now())
) AS listed
 ORDER BY key, acquired_at, fence
 LIMIT $2"""

# notify_channel () -> (channel,) the LISTEN channel of the table
NOTIFY_CHANNEL = "SELECT 'sql_lease_' || {table_literal}::regclass::oid"

# -- release --------------------------------------------------------------------------------------

# release, relaxed ($1 key, $2 owner, $3 fence | NULL: any, $4 min_hold_ms | NULL) -> (was_unexpired, notified)
#   if owner's row was deleted: unless released already or (with $4) still to be kept (RELEASE_KEEPING);
#   for a semaphore's key (its head, owner '', is no one's row) the owner's slot released by migration
#   0006's function instead, in the same round trip: (released, NULL); the function sets the commit mode
#   itself (commit_mode runs only if the planner reaches it, which a DELETE matching no row need not)
RELEASE_RELAXED = """
WITH commit_mode AS (SELECT set_config('synchronous_commit', 'off', true)), gone AS (
    DELETE FROM {table} USING commit_mode WHERE key = $1 AND owner = $2 AND ($3::bigint IS NULL OR fence = $3::bigint)
       AND (expires_at + interval '0' <= now() OR (NOT released AND ($4::float8 IS NULL
            OR coalesce(acquired_at, now()) + $4::float8 * interval '1 millisecond' <= now())))
    RETURNING key, expires_at > now() AS was_unexpired, has_waiters
)
SELECT was_unexpired, CASE WHEN has_waiters THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END
  FROM gone
UNION ALL
SELECT {slot_release_function}($1::varchar, $2::varchar, $3::bigint, $4::float8, 'off'), NULL FROM {table}
 WHERE key = $1 AND owner = '' AND NOT EXISTS (SELECT FROM gone)"""

# release, durable on a durable session: parameters and result as RELEASE_RELAXED
RELEASE_DURABLE = """
WITH gone AS (
    DELETE FROM {table} WHERE key = $1 AND owner = $2 AND ($3::bigint IS NULL OR fence = $3::bigint)
       AND (expires_at + interval '0' <= now() OR (NOT released AND ($4::float8 IS NULL
            OR coalesce(acquired_at, now()) + $4::float8 * interval '1 millisecond' <= now())))
    RETURNING key, expires_at > now() AS was_unexpired, has_waiters
)
SELECT was_unexpired, CASE WHEN has_waiters THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END
  FROM gone
UNION ALL
SELECT {slot_release_function}($1::varchar, $2::varchar, $3::bigint, $4::float8, NULL), NULL FROM {table}
 WHERE key = $1 AND owner = '' AND NOT EXISTS (SELECT FROM gone)"""

# release, durable, pinned for its own transaction: parameters and result as RELEASE_RELAXED
RELEASE_DURABLE_PINNED = """
WITH commit_mode AS (
    SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
), gone AS (
    DELETE FROM {table} USING commit_mode WHERE key = $1 AND owner = $2 AND ($3::bigint IS NULL OR fence = $3::bigint)
       AND (expires_at + interval '0' <= now() OR (NOT released AND ($4::float8 IS NULL
            OR coalesce(acquired_at, now()) + $4::float8 * interval '1 millisecond' <= now())))
    RETURNING key, expires_at > now() AS was_unexpired, has_waiters
)
SELECT was_unexpired, CASE WHEN has_waiters THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END
  FROM gone
UNION ALL
SELECT {slot_release_function}($1::varchar, $2::varchar, $3::bigint, $4::float8, 'on'), NULL FROM {table}
 WHERE key = $1 AND owner = '' AND NOT EXISTS (SELECT FROM gone)"""

# slot_release_first, relaxed ($1 key, $2 owner, $3 fence | NULL, $4 min_hold_ms | NULL) -> (released,) by
#   migration 0006's function if the key's row is a semaphore's head, else no row: the release of a key the
#   provider remembers as a semaphore's ("Semaphore hints"), without RELEASE_RELAXED's plain DELETE
SLOT_RELEASE_FIRST_RELAXED = """
SELECT {slot_release_function}($1::varchar, $2::varchar, $3::bigint, $4::float8, 'off') FROM {table}
 WHERE key = $1 AND owner = ''"""

# slot_release_first, durable on a durable session: parameters and result as SLOT_RELEASE_FIRST_RELAXED
SLOT_RELEASE_FIRST_DURABLE = """
SELECT {slot_release_function}($1::varchar, $2::varchar, $3::bigint, $4::float8, NULL) FROM {table}
 WHERE key = $1 AND owner = ''"""

# slot_release_first, durable, pinned for its own transaction: parameters and result as SLOT_RELEASE_FIRST_RELAXED
SLOT_RELEASE_FIRST_DURABLE_PINNED = """
SELECT {slot_release_function}($1::varchar, $2::varchar, $3::bigint, $4::float8, 'on') FROM {table}
 WHERE key = $1 AND owner = ''"""

# release with a minimum hold ($1 key, $2 owner, $3 fence | NULL, $4 min_hold_ms) -> (fence,) if owner's
#   unexpired tenure began less than min_hold_ms ago: kept, marked released, until then (no NOTIFY)
RELEASE_KEEPING = """
UPDATE {table} SET released = true, expires_at = coalesce(acquired_at, now()) + $4::float8 * interval '1 millisecond'
 WHERE key = $1 AND owner = $2 AND ($3::bigint IS NULL OR fence = $3::bigint) AND NOT released
   AND expires_at + interval '0' > now()
   AND coalesce(acquired_at, now()) + $4::float8 * interval '1 millisecond' > now()
RETURNING fence"""

# release with a minimum hold, pinned durable for its own transaction: parameters and result as RELEASE_KEEPING
RELEASE_KEEPING_PINNED = """
WITH durable AS (
    SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
)
UPDATE {table} SET released = true, expires_at = coalesce(acquired_at, now()) + $4::float8 * interval '1 millisecond'
  FROM durable
 WHERE key = $1 AND owner = $2 AND ($3::bigint IS NULL OR fence = $3::bigint) AND NOT released
   AND expires_at + interval '0' > now()
   AND coalesce(acquired_at, now()) + $4::float8 * interval '1 millisecond' > now()
RETURNING fence"""

# -- renew ----------------------------------------------------------------------------------------

# renew ($1 key, $2 owner, $3 ttl_ms, $4 fence | NULL: any) -> (owner, fence, expires_at, remaining_ms) if renewed;
#   ('', NULL, NULL, NULL) if the key is a semaphore's head (the owner's slot is renewed by the slot steps)
RENEW = """
WITH renewed AS (
    UPDATE {table} SET expires_at = now() + $3::float8 * interval '1 millisecond'
     WHERE key = $1 AND owner = $2 AND expires_at + interval '0' > now() AND NOT released
       AND ($4::bigint IS NULL OR fence = $4::bigint)
    RETURNING owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8
)
SELECT * FROM renewed
UNION ALL
SELECT '', NULL::bigint, NULL::timestamptz, NULL::float8 FROM {table}
 WHERE key = $1 AND owner = '' AND NOT EXISTS (SELECT FROM renewed)"""

# renew, pinned durable for its own transaction: parameters and result as RENEW
RENEW_PINNED = """
WITH durable AS (
    SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
), renewed AS (
    UPDATE {table} SET expires_at = now() + $3::float8 * interval '1 millisecond'
      FROM durable
     WHERE key = $1 AND owner = $2 AND expires_at + interval '0' > now() AND NOT released
       AND ($4::bigint IS NULL OR fence = $4::bigint)
    RETURNING owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8
)
SELECT * FROM renewed
UNION ALL
SELECT '', NULL::bigint, NULL::timestamptz, NULL::float8 FROM {table}
 WHERE key = $1 AND owner = '' AND NOT EXISTS (SELECT FROM renewed)"""

# renew_many ($1 keys varchar[], $2 owners varchar[], $3 ttls_ms float8[], $4 fences bigint[], NULL: any)
#   -> rows (key, owner, fence, expires_at, remaining_ms) of the leases renewed, and (key, '', NULL, NULL, NULL)
#   of each key that is a semaphore's head (its owner's slot is renewed by the slot steps)
RENEW_MANY = """
WITH renewed AS (
    UPDATE {table} AS l SET expires_at = now() + r.ttl * interval '1 millisecond'
      FROM unnest($1::varchar[], $2::varchar[], $3::float8[], $4::bigint[]) AS r(key, owner, ttl, fence)
     WHERE l.key = r.key AND l.owner = r.owner AND l.expires_at + interval '0' > now() AND NOT l.released
       AND (r.fence IS NULL OR l.fence = r.fence)
    RETURNING l.key, l.owner, l.fence, l.expires_at,
              (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::float8
)
SELECT * FROM renewed
UNION ALL
SELECT h.key, '', NULL::bigint, NULL::timestamptz, NULL::float8 FROM {table} AS h
 WHERE h.key = ANY($1::varchar[]) AND h.owner = ''"""

# renew_many, pinned durable for its own transaction: parameters and result as RENEW_MANY
RENEW_MANY_PINNED = """
WITH durable AS (
    SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
), renewed AS (
    UPDATE {table} AS l SET expires_at = now() + r.ttl * interval '1 millisecond'
      FROM durable, unnest($1::varchar[], $2::varchar[], $3::float8[], $4::bigint[]) AS r(key, owner, ttl, fence)
     WHERE l.key = r.key AND l.owner = r.owner AND l.expires_at + interval '0' > now() AND NOT l.released
       AND (r.fence IS NULL OR l.fence = r.fence)
    RETURNING l.key, l.owner, l.fence, l.expires_at,
              (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::float8
)
SELECT * FROM renewed
UNION ALL
SELECT h.key, '', NULL::bigint, NULL::timestamptz, NULL::float8 FROM {table} AS h
 WHERE h.key = ANY($1::varchar[]) AND h.owner = ''"""

# -- transfer -------------------------------------------------------------------------------------

# transfer ($1 key, $2 from_owner, $3 to_owner, $4 ttl_ms, $5 data JSON text | NULL, $6 fence | NULL: any)
#   -> (owner, fence, expires_at, remaining_ms, notified) if transferred; ('', NULL, NULL, NULL, NULL) if the
#   key is a semaphore's head (the owner's slot is passed on by the slot steps)
TRANSFER = """
WITH serialised AS (
    SELECT pg_advisory_xact_lock({table_literal}::regclass::oid::int4, hashtext($1::varchar))
), mine AS (
    SELECT l.key, l.has_waiters, l.expires_at FROM {table} AS l, serialised
     WHERE l.key = $1 AND l.owner = $2 AND l.expires_at + interval '0' > now() AND NOT l.released
       AND ($6::bigint IS NULL OR l.fence = $6::bigint)
       FOR UPDATE OF l
), granted AS (
    SELECT key, has_waiters, at FROM (SELECT key, has_waiters, expires_at, clock_timestamp() AS at FROM mine) AS locked
     WHERE expires_at > at
), moved AS (
    UPDATE {table} AS l
       SET owner = $3::varchar,
           expires_at = granted.at + $4::float8 * interval '1 millisecond',
           fence = CASE WHEN l.owner = $3::varchar THEN l.fence ELSE nextval({fence_sequence_literal}) END,
           data = CASE WHEN l.owner = $3::varchar THEN coalesce($5::json, l.data) ELSE $5::json END,
           acquired_at = CASE WHEN l.owner = $3::varchar THEN l.acquired_at ELSE granted.at END,
           has_waiters = l.has_waiters AND l.owner = $3::varchar
      FROM granted
     WHERE l.key = granted.key
    RETURNING l.key, l.owner, l.fence, l.expires_at, granted.has_waiters AS had_waiters
)
SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8,
       CASE WHEN had_waiters AND $2 <> $3 THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END
  FROM moved
UNION ALL
SELECT '', NULL, NULL, NULL, NULL FROM {table} WHERE key = $1 AND owner = '' AND NOT EXISTS (SELECT FROM moved)"""

# transfer, pinned durable for its own transaction: parameters and result as TRANSFER
TRANSFER_PINNED = """
WITH serialised AS (
    SELECT pg_advisory_xact_lock({table_literal}::regclass::oid::int4, hashtext($1::varchar)),
           set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
), mine AS (
    SELECT l.key, l.has_waiters, l.expires_at FROM {table} AS l, serialised
     WHERE l.key = $1 AND l.owner = $2 AND l.expires_at + interval '0' > now() AND NOT l.released
       AND ($6::bigint IS NULL OR l.fence = $6::bigint)
       FOR UPDATE OF l
), granted AS (
    SELECT key, has_waiters, at FROM (SELECT key, has_waiters, expires_at, clock_timestamp() AS at FROM mine) AS locked
     WHERE expires_at > at
), moved AS (
    UPDATE {table} AS l
       SET owner = $3::varchar,
           expires_at = granted.at + $4::float8 * interval '1 millisecond',
           fence = CASE WHEN l.owner = $3::varchar THEN l.fence ELSE nextval({fence_sequence_literal}) END,
           data = CASE WHEN l.owner = $3::varchar THEN coalesce($5::json, l.data) ELSE $5::json END,
           acquired_at = CASE WHEN l.owner = $3::varchar THEN l.acquired_at ELSE granted.at END,
           has_waiters = l.has_waiters AND l.owner = $3::varchar
      FROM granted
     WHERE l.key = granted.key
    RETURNING l.key, l.owner, l.fence, l.expires_at, granted.has_waiters AS had_waiters
)
SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8,
       CASE WHEN had_waiters AND $2 <> $3 THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END
  FROM moved
UNION ALL
SELECT '', NULL, NULL, NULL, NULL FROM {table} WHERE key = $1 AND owner = '' AND NOT EXISTS (SELECT FROM moved)"""

# -- operators: break and sweep -------------------------------------------------------------------

# break_lease ($1 key, $2 fence | NULL: any) -> (owner, fence, expires_at, remaining_ms, data, acquired_at,
#   released, was_unexpired, notified) of the row it deleted; a semaphore's head is not deleted but
#   answered ('', NULL, ...: the slot steps break it); no advisory lock (deleting draws no fence), no pin
BREAK_LEASE = """
WITH gone AS (
    DELETE FROM {table} WHERE key = $1 AND owner <> '' AND ($2::bigint IS NULL OR fence = $2::bigint)
    RETURNING key, owner, fence, expires_at, data, acquired_at, released, has_waiters
)
SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - now()) * 1000)::float8, data::text, acquired_at,
       released, expires_at > now(),
       CASE WHEN has_waiters THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END FROM gone
UNION ALL
SELECT '', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM {table}
 WHERE key = $1 AND owner = '' AND NOT EXISTS (SELECT FROM gone)"""

# sweep ($1 grace_ms, $2 batch_size) -> (leases deleted, notified): semaphores' heads go uncounted
SWEEP = """
WITH doomed AS (
    SELECT key FROM {table}
     WHERE expires_at <= now() - $1::float8 * interval '1 millisecond'
     ORDER BY expires_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {table} AS l USING doomed WHERE l.key = doomed.key RETURNING l.key, l.owner, l.has_waiters
)
SELECT count(*) FILTER (WHERE owner <> ''),
       count(CASE WHEN has_waiters THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END)
  FROM gone"""

# -- fenced writes, on the caller's connection in the caller's transaction ------------------------

# check_held (:key, :owner, :fence) -> (fence,) iff owner holds key with that fence, unexpired; locks the row
CHECK_HELD = """
SELECT fence FROM {table}
 WHERE key = :key AND owner = :owner AND fence = :fence AND expires_at + interval '0' > statement_timestamp()
   AND NOT released
   FOR SHARE"""

# accept_fence (:resource, :fence) -> (fence,) iff fence >= the highest one accepted so far
ACCEPT_FENCE = """
INSERT INTO {fence_table} AS seen (resource, fence, accepted_at) VALUES (:resource, :fence, statement_timestamp())
ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, accepted_at = excluded.accepted_at
 WHERE seen.fence <= excluded.fence
RETURNING fence"""

# accepted (:resource) -> (fence,) the highest fence accepted (for StaleFenceError)
ACCEPTED = "SELECT fence FROM {fence_table} WHERE resource = :resource"


# -- several keys at once, all or nothing (issue 25; docs/statements.md, "All-or-nothing acquire") --

# acquire_keys ($1 stored keys varchar[], $2 owner, $3 ttl_ms, $4 data JSON text | NULL, $5 lock_timeout | NULL)
#   -> rows (stored key, true, owner, fence, expires_at, remaining_ms), one per key, if every key was granted;
#   no row if the snapshot shows a key held by another (nothing locked or written: the plan reads HOLDERS);
#   fails with 22P02 naming "sql_lease: all-or-nothing acquire refused" (nothing written) if the upsert's
#   recheck refused a key
ACQUIRE_KEYS = """
WITH wanted AS (
    SELECT w.key, hashtext(w.key) AS lock_key FROM unnest($1::varchar[]) AS w(key)
), busy AS (
    SELECT l.key FROM wanted AS w JOIN {table} AS l ON l.key = w.key
     WHERE l.expires_at + interval '0' > now() AND (l.owner <> $2 OR l.released)
), bounded AS (
    SELECT set_config('lock_timeout', coalesce($5::text, current_setting('lock_timeout')), true) AS limit_
), serialised AS (
    SELECT ordered.key, pg_advisory_xact_lock({table_literal}::regclass::oid::int4, ordered.lock_key) AS locked
      FROM (SELECT key, lock_key FROM wanted, bounded WHERE NOT EXISTS (SELECT FROM busy)
             ORDER BY lock_key, key OFFSET 0) AS ordered
), locked AS (
    SELECT l.key FROM {table} AS l
     WHERE l.key = ANY($1::varchar[]) AND (SELECT count(*) FROM serialised) > 0
     ORDER BY l.key FOR NO KEY UPDATE
), granted AS (
    SELECT serialised.key, clock_timestamp() AS at FROM serialised, (SELECT count(*) FROM locked) AS row_locks
), attempt AS (
    INSERT INTO {table} AS held (key, owner, fence, expires_at, data, acquired_at)
    SELECT key, $2, nextval({fence_sequence_literal}), at + $3::float8 * interval '1 millisecond', $4::json, at
      FROM granted
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = clock_timestamp() + $3::float8 * interval '1 millisecond',
           fence = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                        THEN held.fence ELSE nextval({fence_sequence_literal}) END,
           data = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                       THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
           acquired_at = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                              THEN held.acquired_at ELSE clock_timestamp() END,
           has_waiters = held.has_waiters AND held.owner = excluded.owner,
           released = false
     WHERE (held.owner = excluded.owner AND NOT held.released) OR held.expires_at <= clock_timestamp()
    RETURNING held.key, held.owner, held.fence, held.expires_at
), outcome AS (
    SELECT count(*) AS taken FROM attempt
)
SELECT key, true, owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8
  FROM attempt
UNION ALL
SELECT NULL, false, NULL, NULL, NULL, NULL FROM outcome
 WHERE CASE WHEN taken < cardinality($1::varchar[]) AND NOT EXISTS (SELECT FROM busy)
            THEN CAST('sql_lease: all-or-nothing acquire refused, ' || taken || ' granted' AS integer) IS NULL
            ELSE false END"""

# acquire_keys, pinned durable for its own transaction: parameters and result as ACQUIRE_KEYS
ACQUIRE_KEYS_PINNED = """
WITH wanted AS (
    SELECT w.key, hashtext(w.key) AS lock_key FROM unnest($1::varchar[]) AS w(key)
), busy AS (
    SELECT l.key FROM wanted AS w JOIN {table} AS l ON l.key = w.key
     WHERE l.expires_at + interval '0' > now() AND (l.owner <> $2 OR l.released)
), bounded AS (
    SELECT set_config('lock_timeout', coalesce($5::text, current_setting('lock_timeout')), true) AS limit_
), serialised AS (
    SELECT ordered.key, pg_advisory_xact_lock({table_literal}::regclass::oid::int4, ordered.lock_key) AS locked,
           set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
      FROM (SELECT key, lock_key FROM wanted, bounded WHERE NOT EXISTS (SELECT FROM busy)
             ORDER BY lock_key, key OFFSET 0) AS ordered
), locked AS (
    SELECT l.key FROM {table} AS l
     WHERE l.key = ANY($1::varchar[]) AND (SELECT count(*) FROM serialised) > 0
     ORDER BY l.key FOR NO KEY UPDATE
), granted AS (
    SELECT serialised.key, clock_timestamp() AS at FROM serialised, (SELECT count(*) FROM locked) AS row_locks
), attempt AS (
    INSERT INTO {table} AS held (key, owner, fence, expires_at, data, acquired_at)
    SELECT key, $2, nextval({fence_sequence_literal}), at + $3::float8 * interval '1 millisecond', $4::json, at
      FROM granted
    ON CONFLICT (key) DO UPDATE
       SET owner = excluded.owner,
           expires_at = clock_timestamp() + $3::float8 * interval '1 millisecond',
           fence = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                        THEN held.fence ELSE nextval({fence_sequence_literal}) END,
           data = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                       THEN coalesce(excluded.data, held.data) ELSE excluded.data END,
           acquired_at = CASE WHEN held.owner = excluded.owner AND held.expires_at > clock_timestamp()
                              THEN held.acquired_at ELSE clock_timestamp() END,
           has_waiters = held.has_waiters AND held.owner = excluded.owner,
           released = false
     WHERE (held.owner = excluded.owner AND NOT held.released) OR held.expires_at <= clock_timestamp()
    RETURNING held.key, held.owner, held.fence, held.expires_at
), outcome AS (
    SELECT count(*) AS taken FROM attempt
)
SELECT key, true, owner, fence, expires_at, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8
  FROM attempt
UNION ALL
SELECT NULL, false, NULL, NULL, NULL, NULL FROM outcome
 WHERE CASE WHEN taken < cardinality($1::varchar[]) AND NOT EXISTS (SELECT FROM busy)
            THEN CAST('sql_lease: all-or-nothing acquire refused, ' || taken || ' granted' AS integer) IS NULL
            ELSE false END"""

# keys_holders ($1 stored keys varchar[]) -> rows (stored key, owner, fence, expires_at, remaining_ms, data,
#   acquired_at, released) of the unexpired leases among the keys
KEYS_HOLDERS = """
SELECT l.key, l.owner, l.fence, l.expires_at, (extract(epoch FROM l.expires_at - now()) * 1000)::float8,
       l.data::text, l.acquired_at, l.released
  FROM unnest($1::varchar[]) AS w(key) JOIN {table} AS l ON l.key = w.key
 WHERE l.expires_at + interval '0' > now()"""

# release_keys, relaxed ($1 stored keys varchar[], $2 owner, $3 fences bigint[] in the order of $1 | NULL: any)
#   -> rows (was_unexpired, notified) of the owner's rows (of those tenures) deleted (not those released
#   already and kept for a minimum hold, unless expired)
RELEASE_KEYS_RELAXED = """
WITH commit_mode AS (SELECT set_config('synchronous_commit', 'off', true)), gone AS (
    DELETE FROM {table} USING commit_mode WHERE key = ANY($1::varchar[]) AND owner = $2
       AND ($3::bigint[] IS NULL OR (key, fence) IN (SELECT * FROM unnest($1::varchar[], $3::bigint[])))
       AND (expires_at + interval '0' <= now() OR NOT released)
    RETURNING key, expires_at > now() AS was_unexpired, has_waiters
)
SELECT was_unexpired, CASE WHEN has_waiters THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END
  FROM gone"""

# release_keys, durable on a durable session: parameters and result as RELEASE_KEYS_RELAXED
RELEASE_KEYS_DURABLE = """
WITH gone AS (
    DELETE FROM {table} WHERE key = ANY($1::varchar[]) AND owner = $2
       AND ($3::bigint[] IS NULL OR (key, fence) IN (SELECT * FROM unnest($1::varchar[], $3::bigint[])))
       AND (expires_at + interval '0' <= now() OR NOT released)
    RETURNING key, expires_at > now() AS was_unexpired, has_waiters
)
SELECT was_unexpired, CASE WHEN has_waiters THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END
  FROM gone"""

# release_keys, durable, pinned for its own transaction: parameters and result as RELEASE_KEYS_RELAXED
RELEASE_KEYS_DURABLE_PINNED = """
WITH commit_mode AS (
    SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)
), gone AS (
    DELETE FROM {table} USING commit_mode WHERE key = ANY($1::varchar[]) AND owner = $2
       AND ($3::bigint[] IS NULL OR (key, fence) IN (SELECT * FROM unnest($1::varchar[], $3::bigint[])))
       AND (expires_at + interval '0' <= now() OR NOT released)
    RETURNING key, expires_at > now() AS was_unexpired, has_waiters
)
SELECT was_unexpired, CASE WHEN has_waiters THEN pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) END
  FROM gone"""


def texts(*, durable_session: bool, durable_release: bool) -> dict[str, str | None]:
    """The statement each operation sends, by name. ``durable_session``: the connection ran
    SESSION_SETUP, so nothing is pinned per statement; ``durable_release``: releases commit durably."""
    s = durable_session
    return {
        "acquire": ACQUIRE if s else ACQUIRE_PINNED,
        "acquire_waiting": ACQUIRE_WAITING if s else ACQUIRE_WAITING_PINNED,
        "holder": HOLDER,
        "owner": OWNER,
        "list_leases": LIST_LEASES,
        "list_all": LIST_ALL,
        "notify_channel": NOTIFY_CHANNEL,
        "release": (RELEASE_DURABLE if s else RELEASE_DURABLE_PINNED) if durable_release else RELEASE_RELAXED,
        "release_keeping": RELEASE_KEEPING if s else RELEASE_KEEPING_PINNED,
        "renew": RENEW if s else RENEW_PINNED,
        "renew_many": RENEW_MANY if s else RENEW_MANY_PINNED,
        "transfer": TRANSFER if s else TRANSFER_PINNED,
        "break_lease": BREAK_LEASE,
        "sweep": SWEEP,
        "check_held": CHECK_HELD,
        "accept_fence": ACCEPT_FENCE,
        "accepted": ACCEPTED,
        "acquire_keys": ACQUIRE_KEYS if s else ACQUIRE_KEYS_PINNED,
        "holders": KEYS_HOLDERS,
        "release_keys": (
            (RELEASE_KEYS_DURABLE if s else RELEASE_KEYS_DURABLE_PINNED) if durable_release else RELEASE_KEYS_RELAXED
        ),
    }


# -- semaphores: the slot table {slot_table}, each operation a transaction that locks the head first --
# A key held as a semaphore has a head row in {table} (owner ''). Acquire and release call the
# PL/pgSQL functions of migration 0006 (one round trip each; since 0010 the acquire takes the key's
# advisory lock first, as ACQUIRE does); renew, transfer and break run BEGIN, (a transfer: SLOT_SERIALISE,)
# SLOT_LOCK_ONLY_HEAD, then statements of their own snapshots (READ COMMITTED: each sees every commit
# before it, the head lock orders them), then COMMIT. Times are statement_timestamp() (the
# functions: clock_timestamp()): now() would be the time of BEGIN, before the lock wait.

SLOT_BEGIN = "BEGIN"
SLOT_COMMIT = "COMMIT"
SLOT_ROLLBACK = "ROLLBACK"

# slot_acquire_call ($1 key, $2 owner, $3 ttl_ms, $4 data JSON text | NULL, $5 limit, $6 waiting) -> (acquired,
#   owner, fence, expires_at, remaining_ms, plain): the slot acquire in one round trip, by the function
#   migration 0006 made: granted, or refused naming the oldest holder; plain: the key is a plain lease
#   (acquired: the caller's own, re-acquired as such by ACQUIRE)
SLOT_ACQUIRE_CALL = """
SELECT * FROM {slot_acquire_function}($1::varchar, $2::varchar, $3::float8, $4::json, $5::int, $6::boolean, NULL)"""

# slot_acquire_call, pinned durable for its own transaction: parameters and result as SLOT_ACQUIRE_CALL
SLOT_ACQUIRE_CALL_PINNED = """
SELECT * FROM {slot_acquire_function}($1::varchar, $2::varchar, $3::float8, $4::json, $5::int, $6::boolean, 'on')"""

# slot_pin () -> synchronous_commit raised to 'on' for the transaction (on connections without SESSION_SETUP)
SLOT_PIN = """SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit')
WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)"""

# slot_serialise ($1 key) -> the key's advisory lock to COMMIT (ACQUIRE's serialised step): a transfer, which
#   draws a fence, waits for plain acquires of the key, as the acquire function of migration 0010 does
SLOT_SERIALISE = "SELECT pg_advisory_xact_lock({table_literal}::regclass::oid::int4, hashtext($1::varchar))"

# slot_lock_only_head ($1 key) -> (owner, fence, expires_at, remaining_ms, data, acquired_at, live, released,
#   has_waiters) if the key's row is a semaphore's head (owner ''), locked to COMMIT (NO KEY UPDATE: a slot
#   holder's guard, CHECK_SLOT, shares it); a plain lease's row is neither returned nor locked (its holder's
#   guard is not waited for). The acquire is SLOT_ACQUIRE_CALL's function, which locks the row itself
SLOT_LOCK_ONLY_HEAD = """
SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - statement_timestamp()) * 1000)::float8,
       data::text, acquired_at, expires_at > statement_timestamp(), released, has_waiters
  FROM {table} WHERE key = $1 AND owner = '' FOR NO KEY UPDATE"""

# slot_state ($1 key, $2 owner, $3 min_hold_ms | NULL) -> (other owners' unexpired slots, owner's slot fence |
#   NULL, owner's slot unexpired, owner's slot released, owner's tenure began less than min_hold_ms ago)
SLOT_STATE = """
SELECT count(*) FILTER (WHERE owner <> $2 AND expires_at > statement_timestamp()),
       max(fence) FILTER (WHERE owner = $2),
       coalesce(bool_or(expires_at > statement_timestamp()) FILTER (WHERE owner = $2), false),
       coalesce(bool_or(released) FILTER (WHERE owner = $2), false),
       coalesce(bool_or(acquired_at + $3::float8 * interval '1 millisecond' > statement_timestamp())
                FILTER (WHERE owner = $2), false)
  FROM {slot_table} WHERE key = $1"""

# slot_next_fence () -> (fence,) drawn from the table's fence sequence, after the head lock
SLOT_NEXT_FENCE = "SELECT nextval({fence_sequence_literal})"

# slot_insert ($1 key, $2 owner, $3 ttl_ms, $4 data JSON text | NULL, $5 fence) -> nothing; a new tenure
SLOT_INSERT = """
INSERT INTO {slot_table} (key, owner, fence, acquired_at, expires_at, data)
VALUES ($1, $2, $5::bigint, statement_timestamp(), statement_timestamp() + $3::float8 * interval '1 millisecond',
        $4::json)"""

# slot_delete ($1 key, $2 owner) -> nothing; the owner's slot row deleted
SLOT_DELETE = "DELETE FROM {slot_table} WHERE key = $1 AND owner = $2"

# slot_extend ($1 key, $2 owner, $3 ttl_ms, $4 data JSON text | NULL: keep) -> (1,) if the slot was
#   unexpired and is extended (the tenure goes on), else nothing
SLOT_EXTEND = """
UPDATE {slot_table} SET expires_at = statement_timestamp() + $3::float8 * interval '1 millisecond',
       data = coalesce($4::json, data)
 WHERE key = $1 AND owner = $2 AND expires_at > statement_timestamp()
RETURNING 1"""

# slot_refresh_head ($1 key, $2 fence granted | NULL) -> nothing; the head's expiry (the latest
#   unexpired slot's, else now: free) and tenure start (the oldest holder's), its fence raised to $2
SLOT_REFRESH_HEAD = """
UPDATE {table} AS head
   SET expires_at = coalesce(live.latest, statement_timestamp()),
       acquired_at = coalesce(live.oldest, head.acquired_at),
       fence = greatest(head.fence, coalesce($2::bigint, head.fence))
  FROM (SELECT max(expires_at) AS latest, min(acquired_at) AS oldest FROM {slot_table}
         WHERE key = $1 AND expires_at > statement_timestamp()) AS live
 WHERE head.key = $1"""

# slot_mine ($1 key, $2 owner) -> (owner, fence, expires_at, remaining_ms) of the owner's slot (read back)
SLOT_MINE = """
SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - statement_timestamp()) * 1000)::float8
  FROM {slot_table} WHERE key = $1 AND owner = $2"""

# slot_rows ($1 key) -> rows (owner, fence, expires_at, remaining_ms, data, acquired_at, released, live) of
#   every slot of the key, expired ones too, oldest tenure first
SLOT_ROWS = """
SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - statement_timestamp()) * 1000)::float8,
       data::text, acquired_at, released, expires_at > statement_timestamp()
  FROM {slot_table} WHERE key = $1 ORDER BY acquired_at, fence"""

# slot_delete_all ($1 key) -> nothing; every slot of the key and its head deleted (break_lease)
SLOT_DELETE_ALL = """
WITH slots AS (DELETE FROM {slot_table} WHERE key = $1)
DELETE FROM {table} WHERE key = $1 AND owner = ''"""

# slot_wake ($1 key) -> (notified,) if waiters flagged the head: NOTIFY sent, the flag cleared
SLOT_WAKE = """
WITH woken AS (UPDATE {table} SET has_waiters = false WHERE key = $1 AND has_waiters RETURNING key)
SELECT pg_notify('sql_lease_' || {table_literal}::regclass::oid, key) FROM woken"""

# holders ($1 key) -> rows (owner, fence, expires_at, remaining_ms, data, acquired_at, released) of every
#   unexpired holder: the plain lease, or each slot of a semaphore, oldest tenure first, then fence; judged
#   at now(), or at the newest tenure start the statement sees if later (it read a row committed since)
HOLDERS = """
SELECT owner, fence, expires_at, (extract(epoch FROM expires_at - read_at) * 1000)::float8, data, acquired_at,
       released FROM (
    SELECT tenures.*, greatest(now(), max(acquired_at) OVER ()) AS read_at FROM (
        SELECT owner, fence, expires_at, data::text AS data, acquired_at, released FROM {table}
         WHERE key = $1 AND owner <> ''
        UNION ALL
        SELECT owner, fence, expires_at, data::text, acquired_at, released FROM {slot_table} WHERE key = $1
    ) AS tenures
) AS seen
 WHERE expires_at > read_at
 ORDER BY acquired_at, fence"""

# slot_sweep ($1 grace_ms, $2 batch_size) -> (rows deleted,) up to $2 expired slots, each locked, and its
#   key's row locked FOR SHARE, first; a slot or a row another transaction holds is skipped, never waited
#   for (a grant holds the row while it judges its owner's slot live and extends it; a guard holds a slot);
#   a slot without a row has no grant in progress (a head never expires before a live slot)
SLOT_SWEEP = """
WITH doomed AS MATERIALIZED (
    SELECT s.key, s.owner, EXISTS (SELECT 1 FROM {table} AS h WHERE h.key = s.key) AS headed
      FROM {slot_table} AS s
     WHERE s.expires_at <= now() - $1::float8 * interval '1 millisecond'
     ORDER BY s.expires_at
     LIMIT $2
       FOR UPDATE OF s SKIP LOCKED
), heads AS MATERIALIZED (
    SELECT h.key FROM {table} AS h WHERE h.key IN (SELECT key FROM doomed) ORDER BY h.key FOR SHARE SKIP LOCKED
), gone AS (
    DELETE FROM {slot_table} AS s USING doomed
     WHERE s.key = doomed.key AND s.owner = doomed.owner
       AND s.expires_at <= now() - $1::float8 * interval '1 millisecond'
       AND (doomed.key IN (SELECT key FROM heads) OR NOT doomed.headed)
    RETURNING 1
)
SELECT count(*) FROM gone"""

# check_slot (:key, :owner, :fence) -> (fence,) iff owner holds a slot of key with that fence, unexpired;
#   locks the key's head, then the slot row, FOR SHARE (check_held of a semaphore's holder): the order of
#   every slot operation, which locks the head before it writes a slot (the other order deadlocked)
CHECK_SLOT = """
WITH head AS MATERIALIZED (SELECT key FROM {table} WHERE key = :key AND owner = '' FOR SHARE)
SELECT s.fence FROM {slot_table} AS s
 WHERE s.key = (SELECT key FROM head) AND s.owner = :owner AND s.fence = :fence
   AND s.expires_at > statement_timestamp() AND NOT s.released
   FOR SHARE OF s"""


SLOT_STEP_NAMES = (
    "slot_grant",
    "slot_renew_one",
    "slot_release_one",
    "slot_release_first",
    "slot_keep_one",
    "slot_acquire_call",
    "slot_begin",
    "slot_commit",
    "slot_rollback",
    "slot_pin",
    "slot_serialise",
    "slot_lock_head",
    "slot_lock_only_head",
    "slot_is_head",
    "slot_make_head",
    "slot_to_head",
    "slot_state",
    "slot_next_fence",
    "slot_drawn_fence",
    "slot_insert",
    "slot_delete",
    "slot_extend",
    "slot_keep",
    "slot_refresh_head",
    "slot_mine",
    "slot_rows",
    "slot_delete_all",
    "slot_delete_head",
    "slot_wake",
    "slot_flag",
    "slot_holders",
    "slot_sweep",
    "slot_sweep_doomed",
    "slot_sweep_lock",
    "slot_sweep_delete",
    "check_slot",
)
"""The statements of semaphores, by name (every dialect answers each; None where it has none)."""


def slot_steps(*, durable_session: bool, durable_release: bool = False) -> dict[str, str | None]:
    """The statements of semaphores by name (:data:`SLOT_STEP_NAMES`); ``durable_session``: the
    connection ran SESSION_SETUP, so the transaction pins nothing itself (``durable_release``: the
    same for every value; the RELEASE_* statements release slots). Acquire is one call of migration
    0006's function; renew, transfer and break are transactions of the steps below."""
    s = durable_session
    return {
        "slot_grant": None,  # SQLite's one-statement slot operations
        "slot_renew_one": None,
        "slot_release_one": None,
        "slot_release_first": (
            (SLOT_RELEASE_FIRST_DURABLE if s else SLOT_RELEASE_FIRST_DURABLE_PINNED)
            if durable_release
            else SLOT_RELEASE_FIRST_RELAXED
        ),
        "slot_keep_one": None,
        "slot_acquire_call": SLOT_ACQUIRE_CALL if s else SLOT_ACQUIRE_CALL_PINNED,
        "slot_begin": SLOT_BEGIN,
        "slot_commit": SLOT_COMMIT,
        "slot_rollback": SLOT_ROLLBACK,
        "slot_pin": None if durable_session else SLOT_PIN,
        "slot_serialise": SLOT_SERIALISE,
        "slot_lock_head": None,  # the acquire function locks the key's row itself
        "slot_lock_only_head": SLOT_LOCK_ONLY_HEAD,
        "slot_is_head": None,  # the plain statements answer a head themselves
        "slot_make_head": None,  # the acquire function makes heads
        "slot_to_head": None,
        "slot_state": SLOT_STATE,
        "slot_next_fence": SLOT_NEXT_FENCE,
        "slot_drawn_fence": None,
        "slot_insert": SLOT_INSERT,
        "slot_delete": SLOT_DELETE,
        "slot_extend": SLOT_EXTEND,
        "slot_keep": None,  # the release function keeps a slot
        "slot_refresh_head": SLOT_REFRESH_HEAD,
        "slot_mine": SLOT_MINE,
        "slot_rows": SLOT_ROWS,
        "slot_delete_all": SLOT_DELETE_ALL,
        "slot_delete_head": None,  # SLOT_DELETE_ALL deletes the head too
        "slot_wake": SLOT_WAKE,
        "slot_flag": None,  # the acquire function flags a head
        "slot_holders": HOLDERS,
        "slot_sweep": SLOT_SWEEP,
        "slot_sweep_doomed": None,  # MySQL's slot sweep, a transaction
        "slot_sweep_lock": None,
        "slot_sweep_delete": None,
        "check_slot": CHECK_SLOT,
    }
