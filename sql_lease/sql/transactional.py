"""The lease operations as short transactions, for databases whose statements cannot report what
they did (MySQL, MariaDB: no ``RETURNING``): plans without I/O, as in :mod:`.operations`, which
validates the arguments and hands over here when ``statements.transactional``.

Each transaction locks the lease row (``SELECT ... FOR UPDATE``), decides, acts, and reads the row
back before ``COMMIT``; a failed statement rolls it back. A deadlock (the server rolled the
transaction back) or a duplicate key (another acquirer inserted the same new key first) runs the
transaction again, at most :data:`CONFLICT_RETRIES` times; the operation's time limit bounds the
whole. A statement that reports no rows answers one row, its row count (the executors' rule for
these dialects). The reasoning is in docs/statements.md ("MySQL and MariaDB").
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..contract import AcquireResult, LeaseInfo, RenewItem
from .plans import RENEW_BATCH_SIZE, Plan, Query
from .statements import LeaseStatements
from .translate import schema_behind

__all__ = [
    "CONFLICT_RETRIES",
    "HEAD",
    "PLAIN",
    "acquire",
    "acquire_keys",
    "break_lease",
    "release",
    "release_kept_or_deleted",
    "renew",
    "renew_checked",
    "retried",
    "slot_acquire",
    "slot_break",
    "slot_refresh_head",
    "slot_refusal",
    "slot_release",
    "slot_renew",
    "slot_sweep",
    "slot_transfer",
    "sweep",
    "transfer",
]

T = TypeVar("T")

CONFLICT_RETRIES = 20
"""How many times a transaction that met a deadlock or a duplicate key runs again."""

SWEEP_DELETE_KEYS = 1000
"""At most this many keys go in one of the sweep's deletes (MySQL; a batch may be larger than a packet)."""


def _transaction(
    s: LeaseStatements, body: Callable[[], Plan[T]], *, packed: bool = False, slots: bool = False
) -> Plan[T]:
    """``body()`` between ``BEGIN`` and ``COMMIT`` (``packed``: a packet that begins and commits
    itself; ``slots``: the semaphore statements' own, ``s.slots``, on every dialect); rolled back
    when a statement fails, and run again after a deadlock or a duplicate key (``s.conflicted``)."""
    steps: dict[str, Any] = s.slots if slots else s.steps
    prefix = "slot_" if slots else ""
    attempt = 0
    while True:
        if not packed:
            yield Query(steps[prefix + "begin"], ())
        try:
            if slots and steps["slot_pin"] is not None:
                yield Query(steps["slot_pin"], ())
            result = yield from body()
        except Exception as exc:
            with contextlib.suppress(Exception):  # the connection is gone: the server rolls back
                yield Query(steps[prefix + "rollback"], ())
            if s.conflicted(exc) and attempt < CONFLICT_RETRIES:
                attempt += 1
                continue
            raise
        if not packed:
            yield Query(steps[prefix + "commit"], ())
        return result


def retried(s: LeaseStatements, query: Query) -> Plan[Any]:
    """``query`` (one statement in autocommit), run again after a deadlock or a duplicate key that
    rolled it back (``s.conflicted``), at most CONFLICT_RETRIES times; then the error is raised."""
    attempt = 0
    while True:
        try:
            return (yield query)
        except Exception as exc:
            if not s.conflicted(exc) or attempt >= CONFLICT_RETRIES:
                raise
            attempt += 1


def _granted(s: LeaseStatements, key: str) -> Plan[AcquireResult]:
    row = yield Query(s.steps["granted"], (key,))
    return AcquireResult(True, row[0], row[1], s.to_datetime(row[2]), float(row[3]))


def _acquire_locked(
    s: LeaseStatements, key: str, owner: str, ttl: Any, data: str | None, lock: str
) -> Plan[AcquireResult]:
    steps = s.steps
    row = yield Query(steps[lock], (key,))
    if row is not None and row[6] and (row[0] != owner or row[7]):  # another's, or released and kept
        return s.refusal(row)
    if row is not None and row[6]:  # the owner's own unexpired lease: the tenure goes on
        yield Query(steps["extend"], (key, ttl, data))
    elif row is None:  # the insert locks the new row; only then is its fence drawn
        yield Query(steps["grant_new"], (key, owner, ttl, data))
        yield Query(steps["next_fence"], ())
        yield Query(steps["set_fence"], (key,))
    else:  # locked by lock_row: the fence is drawn after the lock
        yield Query(steps["next_fence"], ())
        yield Query(steps["take_over"], (key, owner, ttl, data))
    return (yield from _granted(s, key))


def _acquire_packed(s: LeaseStatements, packet: str, params: tuple[Any, ...]) -> Plan[AcquireResult]:
    row = yield Query(packet, params)
    if row[0]:  # refused by the holder read: no row was locked or changed
        return s.refusal(row[1:5])
    if row[5] is None:
        return AcquireResult(False, None)
    if row[5] != params[1] or row[9]:  # taken by another acquirer between the read and the lock, or kept
        return s.refusal(row[5:9])
    return AcquireResult(True, row[5], row[6], s.to_datetime(row[7]), float(row[8]))


def acquire(
    s: LeaseStatements, key: str, owner: str, ttl: Any, data: str | None, lock_wait_ms: float | None
) -> Plan[AcquireResult]:
    """Acquire: a read of the holder first (a plain read: no lock waits for it), so a held lease
    is refused in one statement, whatever transaction locks its row; only a free, expired or own
    lease goes on to the transaction, which waits for the row lock (a caller's ``check_held``
    guarding an expired lease) for the session's lock wait timeout if ``lock_wait_ms`` (the call's
    share of its time limit) allows it, else not at all (``NOWAIT``), then answers "not acquired"."""
    waits = s.lock_wait_ms is not None and (lock_wait_ms is None or lock_wait_ms >= s.lock_wait_ms)
    try:
        if s.packed:  # the holder read, the lock and the steps in one packet
            packet = s.steps["acquire_packet" if waits else "acquire_packet_nowait"]
            params = (key, owner, ttl, data)
            return (yield from _transaction(s, functools.partial(_acquire_packed, s, packet, params), packed=True))
        holder = yield Query(s.holder, (key,))
        if s.refuses(holder, owner):
            return s.refusal(holder)
        lock = "lock_row" if waits else "lock_row_nowait"
        return (yield from _transaction(s, lambda: _acquire_locked(s, key, owner, ttl, data, lock)))
    except Exception as exc:
        if not s.lock_timed_out(exc):
            raise
    holder = yield Query(s.holder, (key,))
    return s.refusal(holder) if s.refuses(holder, owner) else AcquireResult(False, None)


def release(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[bool]:
    """Release as ``params`` (key, owner, fence, min_hold) say: kept (``release_keeping``) or
    deleted; True if it was the owner's unexpired lease (an expired one is deleted too). A statement
    the server ended in a deadlock (beside a semaphore's transaction on the same row) runs again.
    ``s.packed``: a plain release that released nothing is followed by ``slot_release_packet``
    (the owner's slot, if the key is a semaphore's), so the answer covers slots; for a key remembered as a
    semaphore's (``s.semaphore_keys``) ``slot_release_first_packet`` goes first, and the plain steps only if
    it found no head."""
    return _transaction(s, functools.partial(_release_body, s, params), packed=True)


def _release_body(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[bool]:
    if s.packed and params[0] in s.semaphore_keys:
        released = yield from _slot_released(s, params, "slot_release_first_packet")
        if released is not None:
            return released
    if params[3] is not None:
        (kept,) = yield Query(s.release_keeping, params)
        if kept:
            return True
    (count,) = yield Query(s.release, params)
    if count:
        return True
    if s.packed:  # the expired row's delete and the owner's slot, if a semaphore's, in one packet
        try:
            return bool((yield from _slot_released(s, params)))
        except Exception as exc:  # a table at 0005 (no slot table): a plain "no" stays one unless a head
            if not schema_behind(exc):
                raise
            yield Query(s.steps["rollback"], ())  # the packet stopped inside its transaction
            if (yield Query(s.slots["slot_is_head"], (params[0],))) is not None:
                raise
            return False
    yield Query(s.steps["release_expired"], params[:3])
    return False


def _slot_released(
    s: LeaseStatements, params: tuple[Any, ...], packet: str = "slot_release_packet"
) -> Plan[bool | None]:
    # Whether the owner's slot was released; None if the key's row was no semaphore's head when locked.
    row = yield Query(s.steps[packet], params)
    if not row[0]:
        s.semaphore_keys.forget(params[0])
        return None
    s.semaphore_keys.remember(params[0])
    return bool(row[1])


def renewed_or_head(s: LeaseStatements, key: str, row: Any) -> Any:
    """A renew's answer from its row: None (none), :data:`HEAD` (the key is a semaphore's), the lease."""
    return None if row is None else HEAD if row[0] == "" else s.lease_info(key, row)


def release_kept_or_deleted(s: LeaseStatements, keeping: str, deleting: str, params: tuple[Any, ...]) -> Plan[bool]:
    """Release as ``params`` (key, owner, fence, min_hold) say with one statement each, as RELEASE_KEEPING
    and RELEASE do: kept, or else deleted (the delete refuses a row still to be kept, so a tenure
    that began between the two statements is left alone: docs/statements.md, "A minimum hold").
    Each runs again after a deadlock that rolled it back."""
    if params[3] is not None:
        kept = yield from retried(s, Query(keeping, params))
        if kept is not None:
            return True
    row = yield from retried(s, Query(deleting, params))
    return False if row is None else bool(row[0])


def _renewed(s: LeaseStatements, key: str, owner: str, ttl: Any, fence: int | None) -> Plan[Any]:
    (count,) = yield Query(s.renew, (key, owner, ttl, fence))
    row = yield Query(s.steps["granted"], (key,))  # the lease renewed, or a head's row
    if count:
        return s.lease_info(key, row)
    return HEAD if row is not None and row[0] == "" else None


def _renewed_packed(s: LeaseStatements, key: str, owner: str, ttl: Any, fence: int | None) -> Plan[Any]:
    return renewed_or_head(s, key, (yield Query(s.steps["renew_packet"], (key, owner, ttl, fence))))


def renew(s: LeaseStatements, key: str, owner: str, ttl: Any, fence: int | None) -> Plan[Any]:
    """Renew the owner's plain lease: the lease renewed, None, or :data:`HEAD` for a semaphore's key."""
    if s.packed:
        return (yield from _transaction(s, lambda: _renewed_packed(s, key, owner, ttl, fence), packed=True))
    return (yield from _transaction(s, lambda: _renewed(s, key, owner, ttl, fence)))


def renew_checked(s: LeaseStatements, items: list[RenewItem]) -> Plan[dict[str, LeaseInfo]]:
    """Renew the items, ``RENEW_BATCH_SIZE`` per transaction (one ``UPDATE`` joined to the items
    as JSON, then the renewed rows read back; one packet when ``s.packed``); the renewed leases by key."""

    def body(params: tuple[Any, ...]) -> Plan[dict[str, LeaseInfo]]:
        if s.packed:
            rows = yield Query(s.steps["renew_many_packet"], params, many=True)
        else:
            yield Query(s.renew_many, params)
            rows = yield Query(s.steps["renewed_many"], params, many=True)
        return {lease.key: lease for lease in (s.lease_info(row[0], row[1:]) for row in rows)}

    renewed: dict[str, LeaseInfo] = {}
    for start in range(0, len(items), RENEW_BATCH_SIZE):
        params = s.renew_many_params(items[start : start + RENEW_BATCH_SIZE])
        batch = _transaction(s, lambda params=params: body(params), packed=s.packed)  # type: ignore[misc]
        renewed.update((yield from batch))
    return renewed


def transfer(
    s: LeaseStatements, key: str, from_owner: str, to_owner: str, ttl: Any, data: str | None, fence: int | None
) -> Plan[Any]:
    """Transfer the plain lease: True, False, or :data:`HEAD` for a semaphore's key."""

    def body() -> Plan[Any]:
        row = yield Query(s.steps["lock_row"], (key,))
        if row is not None and row[0] == "":
            return HEAD
        if row is None or not row[6] or row[0] != from_owner or row[7] or fence not in (None, row[1]):
            return False
        if to_owner == from_owner:
            yield Query(s.steps["extend"], (key, ttl, data))
        else:
            yield Query(s.steps["next_fence"], ())
            yield Query(s.steps["take_over"], (key, to_owner, ttl, data))
        return True

    return (yield from _transaction(s, body))


def break_lease(s: LeaseStatements, key: str, fence: int | None) -> Plan[Any]:
    """Break the plain lease: the lease broken, None, or :data:`HEAD` for a semaphore's key."""

    def body() -> Plan[Any]:
        row = yield Query(s.steps["lock_row"], (key,))
        if row is not None and row[0] == "":
            return HEAD
        if row is None or (fence is not None and row[1] != fence):
            return None
        yield Query(s.steps["delete_row"], (key,))
        return s.held(key, (*row[:6], row[7])) if row[6] else None  # lock_row: live before released

    return (yield from _transaction(s, body))


def sweep(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[int]:
    """Delete expired leases and semaphores' expired heads, up to ``params[1]`` of each: read without a
    lock, then locked in key order, skipping a row another transaction holds, and deleted if still
    expired (docs/statements.md, "Sweeping"); then the fence table's rows but the newest. The number
    of leases deleted."""
    count = 0
    for heads in (False, True):
        doomed = yield Query(s.sweep, (*params, heads), many=True)

        def delete(chunk: list[str], locked: set[str], heads: bool = heads) -> Plan[int]:
            free = [key for key in chunk if key in locked]
            if not free:
                return 0
            (deleted,) = yield Query(s.steps["sweep_delete"], (json.dumps(free), params[0], heads))
            return int(deleted)

        deleted = yield from _in_locked_chunks(s, [row[0] for row in doomed], delete)
        count += 0 if heads else deleted
    yield from retried(s, Query(s.steps["prune_fences"], ()))
    return count


def slot_sweep(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[int]:
    """Delete up to ``params[1]`` slots expired ``params[0]`` ago (MySQL): read without a lock, then
    their keys' rows locked in key order, skipping any another transaction holds, and the slots of
    the rows locked (and of keys without one) deleted if still expired (docs/statements.md,
    "Semaphores"); the number deleted."""
    doomed = yield Query(s.slots["slot_sweep_doomed"], params, many=True)
    by_key: dict[str, list[str]] = {}
    headless: set[str] = set()
    for key, owner, headed in doomed:
        by_key.setdefault(key, []).append(owner)
        if not headed:
            headless.add(key)

    def delete(chunk: list[str], locked: set[str]) -> Plan[int]:
        slots = [[key, owner] for key in chunk if key in locked or key in headless for owner in by_key[key]]
        if not slots:
            return 0
        rows = yield Query(s.slots["slot_sweep_delete"], (json.dumps(slots), params[0]), many=True)
        return s.swept_count(rows)

    return (yield from _in_locked_chunks(s, list(by_key), delete))


def _in_locked_chunks(
    s: LeaseStatements, keys: list[str], delete: Callable[[list[str], set[str]], Plan[int]]
) -> Plan[int]:
    """MySQL's sweeps: ``keys`` in ascending order (code point order: the stored keys' byte order), at
    most SWEEP_DELETE_KEYS a transaction (a batch may outgrow a packet), whose rows are first locked
    skipping any another transaction holds; ``delete(chunk, locked keys)`` then; the sum of its answers."""
    ordered, total = sorted(keys), 0
    for start in range(0, len(ordered), SWEEP_DELETE_KEYS):
        chunk = ordered[start : start + SWEEP_DELETE_KEYS]

        def body(chunk: list[str] = chunk) -> Plan[int]:
            locked = yield Query(s.slots["slot_sweep_lock"], (json.dumps(chunk),), many=True)
            return (yield from delete(chunk, {row[0] for row in locked}))

        total += yield from _transaction(s, body, slots=True)
    return total


# -- semaphores (every dialect): one transaction per operation, the head row locked first ----------
# Head rows (owner '') are docs/statements.md's "Semaphores"; a lease-table row is read as
# (owner, fence, expires_at, remaining_ms, data, acquired_at, live, released, has_waiters).

PLAIN = object()
"""A slot plan's answer when the key is held as a plain lease: the plain operation decides."""

HEAD = object()
"""A plain plan's answer when the key is a semaphore's head (owner ''): the slot plan decides."""

HEAD_RETRIES = 3


def or_head(s: LeaseStatements, key: str, plain: Plan[T], refused: object) -> Plan[Any]:
    """``plain``'s answer, or :data:`HEAD` when it answered ``refused`` and the key's row is a
    semaphore's head (one read, no lock: for statements that cannot report a row they leave)."""
    result = yield from plain
    if result is refused and (yield Query(s.slots["slot_is_head"], (key,))) is not None:
        return HEAD
    return result


def _head(s: LeaseStatements, key: str, *, create: bool) -> Plan[Any]:
    """The key's lease-table row, locked to COMMIT; ``create``: an expired head made for a key
    without a row (None otherwise)."""
    for _ in range(HEAD_RETRIES):  # a sweep may delete the row between the insert and the lock
        row = yield Query(s.slots["slot_lock_head" if create else "slot_lock_only_head"], (key,))
        if row is not None or not create:
            return row
        yield Query(s.slots["slot_make_head"], (key,))
    raise RuntimeError("the head row of a semaphore vanished while it was locked")


def _refresh(s: LeaseStatements, key: str, fence: int | None) -> Plan[None]:
    yield Query(s.slots["slot_refresh_head"], (key, fence))


def _wake(s: LeaseStatements, key: str, head: Any) -> Plan[None]:
    if head[8] and s.slots["slot_wake"] is not None:  # waiters flagged the head (PostgreSQL)
        yield Query(s.slots["slot_wake"], (key,))


def _draw_fence(s: LeaseStatements) -> Plan[int]:
    row = yield Query(s.slots["slot_next_fence"], ())
    if s.slots["slot_drawn_fence"] is not None:
        row = yield Query(s.slots["slot_drawn_fence"], ())
    return int(row[0])


def slot_refresh_head(s: LeaseStatements, key: str) -> Plan[None]:
    """Set a semaphore head's expiry from its unexpired slots (now when none: free), under its lock:
    a head PostgreSQL's slot functions left outliving its slots (migration 0008: released or expired
    slots; docs/statements.md, "Stale heads") no longer refuses plain acquires."""

    def body() -> Plan[None]:
        head = yield from _head(s, key, create=False)
        if head is not None and head[0] == "":
            yield from _refresh(s, key, None)

    yield from _transaction(s, body, slots=True)


def slot_refusal(s: LeaseStatements, key: str) -> Plan[AcquireResult]:
    """A refusal naming the oldest unexpired holder of ``key`` (none named if none is left)."""
    return _oldest_refusal(s, key)


def _oldest_refusal(s: LeaseStatements, key: str) -> Plan[AcquireResult]:
    rows = yield Query(s.slots["slot_holders"], (key,), many=True)
    return s.refusal(rows[0]) if rows else AcquireResult(False, None)


def slot_acquire(
    s: LeaseStatements, key: str, owner: str, ttl: Any, data: str | None, limit: int, waiting: bool
) -> Plan[Any]:
    """A semaphore acquire (``limit`` >= 2): granted iff fewer than ``limit`` other owners hold
    unexpired slots, the owner's own slot renewed (same fence), or refused naming the oldest holder;
    :data:`PLAIN` for a key the owner holds as a plain lease (re-acquired as such)."""
    slots = s.slots
    if slots["slot_acquire_call"] is not None:  # one round trip (PostgreSQL's function)
        row = yield from retried(s, Query(slots["slot_acquire_call"], (key, owner, ttl, data, limit, waiting)))
        return _slot_called(s, row)  # one call in autocommit: a deadlock rolled all of it back
    if slots["slot_grant"] is not None:  # one statement (SQLite, migration 0007's triggers)
        try:
            return (yield from _slot_grant(s, key, owner, ttl, data, limit))
        except Exception as exc:  # the write lock's wait ran out: refused, as below
            if not s.lock_timed_out(exc):
                raise
        return (yield from _oldest_refusal(s, key))
    if s.packed:  # the transaction below in one round trip (MySQL's own connections: migration 0009's procedure)
        packet = functools.partial(_slot_acquire_packed, s, (key, owner, ttl, data, limit))
        try:
            return (yield from _transaction(s, packet, packed=True))
        except Exception as exc:  # a lock wait that ran out: refused, as below
            if not s.lock_timed_out(exc):
                raise
        return (yield from _oldest_refusal(s, key))

    def body() -> Plan[Any]:
        head = yield from _head(s, key, create=True)
        if head[0] != "" and head[6]:  # a plain lease, unexpired
            if head[0] == owner and not head[7]:
                return PLAIN
            if waiting and slots["slot_flag"] is not None and not head[8]:
                yield Query(slots["slot_flag"], (key,))
            return s.refusal(head)
        if head[0] != "":
            yield Query(slots["slot_to_head"], (key,))
        others, mine_fence, mine_live, mine_released, _ = yield Query(slots["slot_state"], (key, owner, None))
        if mine_live and not mine_released:  # the owner's slot: its tenure goes on
            yield Query(slots["slot_extend"], (key, owner, ttl, data))
            yield from _refresh(s, key, None)
        elif mine_live or others >= limit:
            if waiting and slots["slot_flag"] is not None and not head[8]:
                yield Query(slots["slot_flag"], (key,))
            return (yield from _oldest_refusal(s, key))
        else:
            fence = yield from _draw_fence(s)
            if mine_fence is not None:  # the owner's expired slot: a new tenure, a new row
                yield Query(slots["slot_delete"], (key, owner))
            yield Query(slots["slot_insert"], (key, owner, ttl, data, fence))
            yield from _refresh(s, key, fence)
        row = yield Query(slots["slot_mine"], (key, owner))
        return AcquireResult(True, row[0], row[1], s.to_datetime(row[2]), float(row[3]))

    try:
        return (yield from _transaction(s, body, slots=True))
    except Exception as exc:  # a lock wait that ran out (a holder's check_held guard): refused, as a plain acquire
        if not s.lock_timed_out(exc):
            raise
    return (yield from _oldest_refusal(s, key))


def _slot_acquire_packed(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[Any]:
    row = yield Query(s.steps["slot_acquire_packet"], params)
    if row[0] and row[5] is not None and float(row[5]) <= 0:  # expired while the packet waited for its row:
        row = yield Query(s.steps["slot_acquire_packet"], params)  # the next one turns it into the head
    if row[0]:  # an unexpired plain lease: the owner's own (not released) is re-acquired as such
        return PLAIN if row[2] == params[1] and not row[6] else s.refusal(row[2:6])
    if row[7] is None:  # refused, no unexpired slot left to name
        return AcquireResult(False, None)
    return AcquireResult(bool(row[1]), row[7], row[8], s.to_datetime(row[9]), float(row[10]))


def _slot_grant(s: LeaseStatements, key: str, owner: str, ttl: Any, data: str | None, limit: int) -> Plan[Any]:
    row = yield Query(s.slots["slot_grant"], (key, owner, ttl, data, limit))
    if row is not None:
        return AcquireResult(True, row[0], row[1], s.to_datetime(row[2]), float(row[3]))
    head = yield Query(s.slots["slot_lock_head"], (key,))  # refused: by a plain lease, or by the slots
    if head is not None and head[0] != "" and head[6]:
        return PLAIN if head[0] == owner and not head[7] else s.refusal(head)
    return (yield from _oldest_refusal(s, key))


def _slot_called(s: LeaseStatements, row: Any) -> Any:
    if row is None:
        return AcquireResult(False, None)
    if row[5] and row[0]:  # the owner's own plain lease
        return PLAIN
    return AcquireResult(bool(row[0]), row[1], row[2], s.to_datetime(row[3]), float(row[4]))


def _live_slot(state: Any, fence: int | None) -> bool:
    """Whether a ``slot_state`` row shows the owner's unexpired, unreleased slot of tenure ``fence``."""
    return state[1] is not None and bool(state[2]) and not state[3] and fence in (None, state[1])


def slot_renew(s: LeaseStatements, key: str, owner: str, ttl: Any, fence: int | None) -> Plan[LeaseInfo | None]:
    """Renew ``owner``'s slot of ``key`` (of tenure ``fence``); None if it holds none."""
    slots = s.slots
    if slots["slot_renew_one"] is not None:  # one statement (SQLite, migration 0007's triggers)
        row = yield Query(slots["slot_renew_one"], (key, owner, ttl, fence))
        return None if row is None else s.lease_info(key, row)

    def body() -> Plan[LeaseInfo | None]:
        head = yield from _head(s, key, create=False)
        if head is None or head[0] != "":
            return None
        state = yield Query(slots["slot_state"], (key, owner, None))
        if not _live_slot(state, fence):
            return None
        if not _extended((yield Query(slots["slot_extend"], (key, owner, ttl, None)))):
            return None
        yield from _refresh(s, key, None)
        row = yield Query(slots["slot_mine"], (key, owner))
        return None if row is None else s.lease_info(key, row)

    return (yield from _transaction(s, body, slots=True))


def _extended(row: Sequence[Any] | None) -> bool:
    """Whether ``SLOT_EXTEND`` (its row, or MySQL's row count) extended the slot: one read live
    before may have lapsed since, and the extension, which re-checks its expiry, changes nothing."""
    return row is not None and bool(row[0])


def slot_release(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[bool]:
    """Release ``owner``'s slot as ``params`` (key, owner, fence, min_hold) say: kept until its
    tenure start + min_hold, or deleted (an expired one is deleted too, and answered False)."""
    key, owner, fence, min_hold = params
    slots = s.slots
    if slots["slot_release_one"] is not None:  # one statement (SQLite, migration 0007's triggers)
        try:
            return (yield from release_kept_or_deleted(s, slots["slot_keep_one"], slots["slot_release_one"], params))
        except Exception as exc:  # a table at 0006 (no slot index): a plain "no" stays one unless a head
            if not schema_behind(exc) or (yield Query(slots["slot_is_head"], (key,))) is not None:
                raise
            return False

    if s.packed:  # the transaction below in one packet (MySQL's own connections)
        return bool((yield from _transaction(s, functools.partial(_slot_released, s, params), packed=True)))

    def body() -> Plan[bool]:
        head = yield from _head(s, key, create=False)
        if head is None or head[0] != "":
            return False
        state = yield Query(slots["slot_state"], (key, owner, min_hold))
        if state[1] is None or fence not in (None, state[1]) or (state[2] and state[3]):
            return False
        if state[2] and min_hold is not None and state[4]:
            yield Query(slots["slot_keep"], (key, owner, min_hold))
            yield from _refresh(s, key, None)
            return True
        yield Query(slots["slot_delete"], (key, owner))
        yield from _refresh(s, key, None)
        yield from _wake(s, key, head)
        return bool(state[2])

    return (yield from _transaction(s, body, slots=True))


def slot_transfer(
    s: LeaseStatements, key: str, from_owner: str, to_owner: str, ttl: Any, data: str | None, fence: int | None
) -> Plan[bool]:
    """Pass ``from_owner``'s slot to ``to_owner`` (a new tenure, a new fence), or renew it when they
    are the same; False if ``to_owner`` holds a slot of the key already."""
    slots = s.slots

    def body() -> Plan[bool]:
        if slots["slot_serialise"] is not None:
            yield Query(slots["slot_serialise"], (key,))
        head = yield from _head(s, key, create=False)
        if head is None or head[0] != "":
            return False
        state = yield Query(slots["slot_state"], (key, from_owner, None))
        if not _live_slot(state, fence):
            return False
        if to_owner == from_owner:
            if not _extended((yield Query(slots["slot_extend"], (key, from_owner, ttl, data)))):
                return False
            yield from _refresh(s, key, None)
            return True
        theirs = yield Query(slots["slot_state"], (key, to_owner, None))
        if theirs[2]:
            return False
        new_fence = yield from _draw_fence(s)
        yield Query(slots["slot_delete"], (key, from_owner))
        if theirs[1] is not None:
            yield Query(slots["slot_delete"], (key, to_owner))
        yield Query(slots["slot_insert"], (key, to_owner, ttl, data, new_fence))
        yield from _refresh(s, key, new_fence)
        yield from _wake(s, key, head)
        return True

    return (yield from _transaction(s, body, slots=True))


def slot_break(s: LeaseStatements, key: str, fence: int | None) -> Plan[Any]:
    """End every slot of ``key`` (or the one of tenure ``fence``); the oldest unexpired holder it
    ended (or that slot, if unexpired), else None; :data:`PLAIN` for a key held as a plain lease."""
    slots = s.slots

    def body() -> Plan[Any]:
        head = yield from _head(s, key, create=False)
        if head is None or head[0] != "":
            return PLAIN
        rows = yield Query(slots["slot_rows"], (key,), many=True)
        chosen = [row for row in rows if (row[7] if fence is None else row[1] == fence)]
        if fence is not None and not chosen:
            return None
        yield from _wake(s, key, head)
        if fence is None:
            yield Query(slots["slot_delete_all"], (key,))
            if slots["slot_delete_head"] is not None:
                yield Query(slots["slot_delete_head"], (key,))
        else:
            yield Query(slots["slot_delete"], (key, chosen[0][0]))
            yield from _refresh(s, key, None)
        return s.held(key, chosen[0]) if chosen and chosen[0][7] else None

    return (yield from _transaction(s, body, slots=True))


class _Refused(Exception):
    """Keys of an all-or-nothing acquire were refused under their row locks: the transaction rolls back."""

    def __init__(self, refusals: dict[str, AcquireResult]) -> None:
        super().__init__(*refusals)
        self.refusals = refusals


def _acquire_keys_locked(
    s: LeaseStatements, keys: list[str], owner: str, ttl: Any, data: str | None, lock: str
) -> Plan[dict[str, AcquireResult]]:
    # Packed (the provider's own connections): BEGIN with the lock, each fence with its write, the
    # read-back with COMMIT; else a statement per step.
    steps, packed = s.steps, s.packed and lock == "lock_rows"
    rows = yield Query(steps["lock_rows_packet" if packed else lock], (s.keys_param(keys),), many=True)
    found = {row[0]: row[1:] for row in rows}
    refused = {key: s.refusal(row) for key, row in found.items() if row[6] and (row[0] != owner or row[7])}
    if refused:  # another's, or the owner's released one kept
        raise _Refused(refused)
    missing = [key for key in keys if key not in found]
    own = [key for key in keys if key in found and found[key][6]]
    if missing:  # the insert locks the new rows; only then are their fences drawn
        yield Query(steps["grant_new_keys"], (s.keys_param(missing), owner, ttl, data))
    if own:  # the owner's own unexpired leases: their tenures go on
        yield Query(steps["extend_keys"], (s.keys_param(own), ttl, data))
    for key in keys:  # a fence for each new tenure, drawn after its row's lock
        if key in own:
            continue
        if packed:
            taken_over = key in found
            params = (key, owner, ttl, data) if taken_over else (key,)
            yield Query(steps["fence_take_over_packet" if taken_over else "fence_new_packet"], params)
            continue
        yield Query(steps["next_fence"], ())
        if key in found:
            yield Query(steps["take_over"], (key, owner, ttl, data))
        else:
            yield Query(steps["set_fence"], (key,))
    rows = yield Query(steps["granted_keys_packet" if packed else "granted_keys"], (s.keys_param(keys),), many=True)
    return {row[0]: AcquireResult(True, row[1], row[2], s.to_datetime(row[3]), float(row[4])) for row in rows}


def _keys_packet(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[list[Any]]:
    rows: list[Any] = yield Query(s.steps["acquire_keys_packet"], params, many=True)
    return rows


def _acquire_keys_packed(
    s: LeaseStatements, keys: list[str], params: tuple[Any, ...]
) -> Plan[list[AcquireResult] | None]:
    """The call as one packet (``acquire_keys_packet``); None when the server cannot draw its fences in
    bulk (nothing was locked or changed, and no key refused at the read): the plan goes on step by step."""
    for _ in range(3):
        rows = yield from _transaction(s, functools.partial(_keys_packet, s, params), packed=True)
        free, bulk, granted = rows[0][9:12]
        if granted:
            found = {row[0]: AcquireResult(True, row[1], row[2], s.to_datetime(row[3]), float(row[4])) for row in rows}
            return [found[key] for key in keys]
        if free and not bulk:
            return None
        refused = s.keys_refusals(keys, params[1], [row[:8] for row in rows if row[8]])
        if refused is not None:  # held by another at the read, or under the lock
            return refused
    return [AcquireResult(False, None)] * len(keys)  # a holder gone each time before the read-back


def acquire_keys(
    s: LeaseStatements, keys: list[str], owner: str, ttl: Any, data: str | None, lock_wait_ms: float | None
) -> Plan[list[AcquireResult]]:
    """Acquire every stored key of ``keys`` or none: a plain read of their holders first (a held key is
    refused in one statement), then one transaction that locks every key's row in byte order of the
    keys (so overlapping calls never wait for each other in a cycle), inserts the missing keys,
    extends the owner's own and draws a fence for each new tenure after the locks, as :func:`acquire`
    does for one key; a key refused under its lock rolls it all back (changes nothing). On the
    provider's own connections all of it is one packet (``acquire_keys_packet``) where the server
    hands out an insert's auto-increment values consecutively (``innodb_autoinc_lock_mode`` 0 or 1),
    else a packet per step and a fence per key."""
    waits = s.lock_wait_ms is not None and (lock_wait_ms is None or lock_wait_ms >= s.lock_wait_ms)
    lock = "lock_rows" if waits else "lock_rows_nowait"
    ordered = sorted(keys, key=str.encode)
    try:
        if s.packed and waits:
            answer = yield from _acquire_keys_packed(s, keys, (s.keys_param(ordered), owner, ttl, data))
            if answer is not None:
                return answer
        else:
            refused = s.keys_refusals(keys, owner, (yield Query(s.holders, (s.keys_param(ordered),), many=True)))
            if refused is not None:
                return refused
        body = functools.partial(_acquire_keys_locked, s, ordered, owner, ttl, data, lock)
        granted = yield from _transaction(s, body, packed=s.packed and waits)
    except _Refused as blocked:
        return [blocked.refusals.get(key, AcquireResult(False, None)) for key in keys]
    except Exception as exc:
        if not s.lock_timed_out(exc):
            raise
        refused = s.keys_refusals(keys, owner, (yield Query(s.holders, (s.keys_param(ordered),), many=True)))
        return refused if refused is not None else [AcquireResult(False, None)] * len(keys)
    return [granted[key] for key in keys]
