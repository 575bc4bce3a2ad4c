"""Slot grants serialised with plain acquires (issue 25: fences in the order owners change).

PostgreSQL: 0008's slot acquire function, which first takes the key's transaction-level advisory
lock, the one every plain acquire statement takes before it draws a fence. A plain acquire could
otherwise draw its fence, meet a head made after its snapshot (so not locked by it), wait for it, and
insert that older fence after a slot grant drew a larger one and the head was deleted
(docs/statements.md, "Fences are drawn in the order owners change"). Slot transfers take the same
lock as a step of their own transaction (no migration needed). Downgrading restores 0008's function.
Nothing changes on SQLite (one writer at a time) or MySQL (its plain acquire locks the key's row
before it draws).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# the first statement of 0008's slot acquire body
_BODY_START = """BEGIN
    IF p_durable IS NOT NULL THEN
"""

# 0010's: the key's advisory lock (ACQUIRE's "serialised" step) before anything else
_SERIALISED_START = """BEGIN
    PERFORM pg_advisory_xact_lock({table_literal}::regclass::oid::int4, hashtext(p_key));
    IF p_durable IS NOT NULL THEN
"""


def _revision(name: str) -> ModuleType:
    # an earlier revision's module, loaded from this directory
    spec = importlib.util.spec_from_file_location(f"sql_lease_{name[:4]}", Path(__file__).with_name(name))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _functions_0008() -> tuple[ModuleType, str, str]:
    # 0007's module (it formats and runs function bodies) and 0008's acquire and release bodies
    r7, r8 = _revision("0007_faster_slots.py"), _revision("0008_quiet_heads.py")
    acquire = r8._replaced(r7._ACQUIRE_FUNCTION, r8._GRANT_HEAD_0007, r8._GRANT_HEAD)
    release = r8._replaced(
        r8._replaced(r7._RELEASE_FUNCTION, r8._RELEASE_HEAD_0007, r8._RELEASE_HEAD), r8._KEEP_0007, r8._KEEP
    )
    return r7, acquire, release


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    r7, acquire, release = _functions_0008()
    if acquire.count(_BODY_START) != 1:
        raise RuntimeError("migration 0010: 0008's slot acquire function is not as expected")
    r7._postgres_functions(acquire.replace(_BODY_START, _SERIALISED_START), release)


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    r7, acquire, release = _functions_0008()
    r7._postgres_functions(acquire, release)
