"""Semaphore heads written less often (issue 25's speed row, PostgreSQL).

PostgreSQL: 0007's slot functions with two changes. A grant rewrites the key's head row only when
its slot would outlive the head, and then extends the head one TTL beyond the slot, so the grants
of the next TTL leave it as it is; a release rewrites the head only to clear its waiters' flag, or to
raise its expiry to a slot kept by a minimum hold.
A head may so outlive its slots (docs/statements.md, "Stale heads"): a plain acquire refused by a
head that names no unexpired holder refreshes it and asks once more, as since 0007. Each cycle of
a semaphore then writes its slot row and, most of the time, no head row (an update of the head
moves its ``expires_at`` index entry). Downgrading restores 0007's functions. Nothing changes on
SQLite (its triggers keep heads exact) or MySQL.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# 0007's grant: the head's expiry raised to the granted slot's on every grant
_GRANT_HEAD_0007 = """    UPDATE {table} AS l
       SET expires_at = greatest(l.expires_at, until_), fence = greatest(l.fence, granted),
           acquired_at = CASE WHEN l.expires_at > clock_timestamp() THEN least(l.acquired_at, started) ELSE started END
     WHERE l.key = p_key;
"""

# 0008's grant: the head rewritten only when the slot would outlive it, then one TTL beyond the slot
_GRANT_HEAD = """    IF head.expires_at < until_ THEN
        UPDATE {table} AS l
           SET expires_at = until_ + p_ttl * interval '1 millisecond', fence = greatest(l.fence, granted),
               acquired_at = CASE WHEN l.expires_at > clock_timestamp() THEN least(l.acquired_at, started)
                                  ELSE started END
         WHERE l.key = p_key;
    END IF;
"""

# 0007's release: the head refreshed from the unexpired slots on every release
_RELEASE_HEAD_0007 = """    UPDATE {table} AS head_row
       SET expires_at = coalesce(live.latest, clock_timestamp()),
           acquired_at = coalesce(live.oldest, head_row.acquired_at),
           has_waiters = false
      FROM (SELECT max(s.expires_at) AS latest, min(s.acquired_at) AS oldest FROM {slot_table} AS s
             WHERE s.key = p_key AND s.expires_at > clock_timestamp()) AS live
     WHERE head_row.key = p_key;
"""

# 0008's release: the head rewritten only to clear its waiters' flag (its NOTIFY follows)
_RELEASE_HEAD = """    IF head.has_waiters THEN
        UPDATE {table} SET has_waiters = false WHERE key = p_key;
    END IF;
"""

# 0007's release within a minimum hold: the kept slot's new expiry left to the refresh that followed
_KEEP_0007 = """        was_live := true;
"""

# 0008's: the head raised to the kept slot's expiry (which the minimum hold may put past the head's)
_KEEP = """        was_live := true;
        UPDATE {table} AS l SET expires_at = kept.until
          FROM (SELECT max(s.expires_at) AS until FROM {slot_table} AS s
                 WHERE s.key = p_key AND s.owner = p_owner) AS kept
         WHERE l.key = p_key AND l.expires_at < kept.until;
"""


def _revision_0007():  # type: ignore[no-untyped-def]
    # 0007's module (its function bodies, and through it 0006's names), loaded from this directory
    spec = importlib.util.spec_from_file_location("sql_lease_0007", Path(__file__).with_name("0007_faster_slots.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _replaced(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError("migration 0008: 0007's slot function is not as expected")
    return text.replace(old, new)


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    old = _revision_0007()
    old._postgres_functions(
        _replaced(old._ACQUIRE_FUNCTION, _GRANT_HEAD_0007, _GRANT_HEAD),
        _replaced(_replaced(old._RELEASE_FUNCTION, _RELEASE_HEAD_0007, _RELEASE_HEAD), _KEEP_0007, _KEEP),
    )


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    old = _revision_0007()
    old._postgres_functions(old._ACQUIRE_FUNCTION, old._RELEASE_FUNCTION)
