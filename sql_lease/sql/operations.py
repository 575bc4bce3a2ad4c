"""Each lease operation as a plan without I/O: validate, then yield statements and decode rows.

A plan is a generator. It validates its arguments when it is made (so bad input raises
``TypeError``/``ValueError`` before any connection is touched), then yields :class:`Query` objects
and receives each query's rows; its return value is the operation's result. The async and the sync
provider run the same plans on their own executors (:func:`run_async`, :func:`run_sync`), so both
faces share every statement, every retry rule and every decoding step.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from operator import itemgetter
from typing import Any, TypeVar, cast

from ..contract import (
    MAX_KEY_LENGTH,
    AcquireResult,
    LeaseInfo,
    RenewItem,
    decode_key,
    encode_data,
    encode_key,
    validate_fence,
    validate_fences,
    validate_key,
    validate_keys,
    validate_limit,
    validate_list,
    validate_owner,
    validate_renew_items,
    validate_sweep,
    validate_tenure_options,
    validate_ttl_ms,
)
from . import transactional
from .plans import RENEW_BATCH_SIZE, LockRetry, Plan, Query
from .statements import LeaseStatements

__all__ = [
    "Plan",
    "Query",
    "acquire",
    "acquire_keys",
    "break_lease",
    "get_holders",
    "get_lease",
    "get_owner",
    "list_leases",
    "prefix_upper_bound",
    "release",
    "release_keys",
    "renew",
    "renew_checked",
    "renew_keys",
    "renew_many",
    "run_async",
    "run_sync",
    "stored_key",
    "sweep",
    "transfer",
    "validate_renew_items",
]

T = TypeVar("T")
Row = Sequence[Any]


def stored_key(key: object) -> str:
    """``key`` validated, in its stored form (:func:`~sql_lease.contract.encode_key`): what every
    plan binds and carries; the statements' decoding gives the key back as it was given."""
    return encode_key(validate_key(key))


async def run_async(
    plan: Plan[T],
    fetch: Callable[[str, tuple[Any, ...]], Awaitable[Sequence[Row]]],
    lock_retry: LockRetry | None = None,
) -> T:
    """Run ``plan`` with an async ``fetch`` that returns a statement's rows (all its queries on one
    connection); a query that is not ``many`` receives its first row, or None. A statement that
    raised is sent again while ``lock_retry`` allows."""
    query = next(plan)
    while True:
        try:
            rows = await fetch(query.sql, query.params)
        except Exception as exc:  # the plan may answer it (a lock wait that ran out); else it is raised
            if lock_retry is not None and lock_retry(exc, query):
                continue
            try:
                query = plan.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            continue
        try:
            query = plan.send(rows if query.many else rows[0] if rows else None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def run_sync(
    plan: Plan[T],
    fetch_one: Callable[[str, tuple[Any, ...]], Row | None],
    fetch_all: Callable[[str, tuple[Any, ...]], list[Row]],
    lock_retry: LockRetry | None = None,
) -> T:
    """Run ``plan`` with blocking fetch functions (all its queries on one connection), as
    :func:`run_async` runs it."""
    query = next(plan)
    while True:
        try:
            rows = (fetch_all if query.many else fetch_one)(query.sql, query.params)
        except Exception as exc:  # the plan may answer it (a lock wait that ran out); else it is raised
            if lock_retry is not None and lock_retry(exc, query):
                continue
            try:
                query = plan.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            continue
        try:
            query = plan.send(rows)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def acquire(
    s: LeaseStatements,
    key: str,
    owner: str,
    ttl_ms: object,
    *,
    waiting: bool = False,
    data: object = None,
    lock_wait_ms: float | None = None,
    limit: object = 1,
) -> Plan[AcquireResult]:
    """Acquire with lease ``data`` (a dict or None); ``waiting`` marks a refused row so that its
    release sends NOTIFY (PostgreSQL). ``lock_wait_ms``: how long the statement may wait for a
    lock (a caller's ``check_held`` transaction guarding an expired lease) before it answers
    "not acquired" (PostgreSQL; None: no bound of its own). ``limit`` (checked first): 1, a plain
    lease (today's statements); 2 or more, a slot of a semaphore (docs/statements.md, "Semaphores")."""
    checked_limit = validate_limit(limit)
    key, owner = stored_key(key), validate_owner(owner)
    ttl, text = s.ttl_param(validate_ttl_ms(ttl_ms)), encode_data(data)

    plain = functools.partial(_plain_acquire, s, key, owner, ttl, text, lock_wait_ms, waiting)
    if checked_limit == 1:
        return _named_refusal(s, key, plain)
    return _slot_acquire(s, key, owner, ttl, text, checked_limit, waiting, plain)


def _plain_acquire(
    s: LeaseStatements, key: str, owner: str, ttl: Any, text: str | None, lock_wait_ms: float | None, waiting: bool
) -> Plan[AcquireResult]:
    if s.transactional:
        return transactional.acquire(s, key, owner, ttl, text, lock_wait_ms)
    return _guarded_acquire(s, key, owner, s.acquire_params(key, owner, ttl, text, lock_wait_ms), waiting)


def _named_refusal(s: LeaseStatements, key: str, plain: Callable[[], Plan[AcquireResult]]) -> Plan[AcquireResult]:
    # Refused by a semaphore's head (owner ''): the refusal names its oldest holder instead. A head
    # that names none is stale (docs/statements.md, "Stale heads"): refreshed, then asked once more.
    for attempt in range(2):
        result = yield from plain()
        if result.acquired or result.owner != "":
            return result
        refusal = yield from transactional.slot_refusal(s, key)
        if refusal.owner is not None or attempt:
            break
        yield from transactional.slot_refresh_head(s, key)
    return refusal


def _slot_acquire(
    s: LeaseStatements,
    key: str,
    owner: str,
    ttl: Any,
    text: str | None,
    limit: int,
    waiting: bool,
    plain: Callable[[], Plan[AcquireResult]],
) -> Plan[AcquireResult]:
    result = yield from transactional.slot_acquire(s, key, owner, ttl, text, limit, waiting)
    if result is transactional.PLAIN:  # the owner's own plain lease: re-acquired as such
        return (yield from _named_refusal(s, key, plain))
    if result.acquired:
        s.semaphore_keys.remember(key)
    return result  # type: ignore[no-any-return]


def _guarded_acquire(
    s: LeaseStatements, key: str, owner: str, params: tuple[Any, ...], waiting: bool
) -> Plan[AcquireResult]:
    # A lock wait that ran out wrote nothing (its transaction rolled back): not acquired, naming
    # the holder if an unexpired one is visible now.
    try:
        return (yield from _acquire(s, key, owner, params, waiting))
    except Exception as exc:
        if not s.lock_timed_out(exc):
            raise
    holder = yield Query(s.holder, (key,))
    return s.refusal(holder) if s.refuses(holder, owner) else AcquireResult(False, None)


LOCK_WAIT_SHARE = 0.5
"""The share of an acquire's time limit its statement may wait for a lock (a caller's ``check_held``
transaction guarding an expired lease) before it answers "not acquired" (PostgreSQL)."""

UNFLAGGED_RETRIES = 2
"""A waiting acquire refused against a locked row asks again this many times before it answers
with a refusal that flagged nothing (docs/statements.md, "Waiters beside a guarded transaction")."""


def _acquire(s: LeaseStatements, key: str, owner: str, params: tuple[Any, ...], waiting: bool) -> Plan[AcquireResult]:
    # No row: refused by a holder the statement's snapshot could not see, or the key was freed
    # meanwhile. A waiting acquire asks again until it acquires or its refusal flags the row:
    # any other answer (the holder read afresh, or "free" after the key changed hands under us)
    # flags nothing, no NOTIFY ends the wait, and the waiter sleeps its whole fallback timer.
    # Each empty answer means another transaction changed the key since the statement's
    # snapshot, so this loop only spins while others make progress; the executor's operation
    # timeout bounds it (docs/statements.md).
    if s.acquire_tries_quick:  # a held lease is refused without waiting long for the write lock
        try:
            row = yield Query(s.acquire, params, quick=True)
        except Exception as exc:
            if not s.lock_timed_out(exc):
                raise
        else:
            if row is not None:
                return s.acquire_result(row)
        holder = yield Query(s.holder, (key,))
        if s.refuses(holder, owner):
            return s.refusal(holder)
    elif s.acquire_reads_first:  # a held lease is refused without waiting for the write lock
        holder = yield Query(s.holder, (key,))
        if s.refuses(holder, owner):
            return s.refusal(holder)
    if waiting:
        unflagged = 0
        while True:
            row = yield Query(s.acquire_waiting, params)
            if row is None:
                continue
            # Refused but not flagged: a transaction locks the row (a caller's check_held, or a
            # write under way). Ask again a few times; then answer at once (no NOTIFY will come).
            if len(row) > 5 and not row[0] and not row[5] and unflagged < UNFLAGGED_RETRIES:
                unflagged += 1
                continue
            return s.acquire_result(row)
    for _ in range(3):
        row = yield Query(s.acquire, params)
        if row is not None:
            return s.acquire_result(row)
        holder = yield Query(s.holder, (key,))
        if s.refuses(holder, owner):
            return s.refusal(holder)
    holder = yield Query(s.holder, (key,))
    if s.refuses(holder, owner):
        return s.refusal(holder)
    return AcquireResult(False, None)


def get_owner(s: LeaseStatements, key: str) -> Plan[str | None]:
    key = stored_key(key)
    return _owner(s, key)


def _owner(s: LeaseStatements, key: str) -> Plan[str | None]:
    row = yield Query(s.owner, (key,))
    if row is None or row[0] != "":
        return None if row is None else row[0]  # type: ignore[no-any-return]
    oldest = yield from _holders(s, key)  # a semaphore's head: its oldest holder
    return oldest[0].owner if oldest else None


def get_lease(s: LeaseStatements, key: str) -> Plan[LeaseInfo | None]:
    key = stored_key(key)
    return _lease(s, key)


def _lease(s: LeaseStatements, key: str) -> Plan[LeaseInfo | None]:
    row = yield Query(s.holder, (key,))
    if row is None or row[0] != "":
        return None if row is None else s.held(key, row)
    oldest = yield from _holders(s, key)
    return oldest[0] if oldest else None


def get_holders(s: LeaseStatements, key: str) -> Plan[list[LeaseInfo]]:
    """Every unexpired holder of ``key``: its plain lease, or each slot of a semaphore, oldest tenure
    first (then fence)."""
    return _holders(s, stored_key(key))


def _holders(s: LeaseStatements, key: str) -> Plan[list[LeaseInfo]]:
    rows = yield Query(s.slots["slot_holders"], (key,), many=True)
    return [s.held(key, row) for row in rows]


def release(s: LeaseStatements, key: str, owner: str, fence: object = None, min_hold_ms: object = None) -> Plan[bool]:
    """Release ``owner``'s lease (of tenure ``fence`` if given); with ``min_hold_ms``, keep it,
    marked released, until that long after its tenure began (``release_keeping``), freeing it at
    once (``release``) if that moment has passed. True iff the owner's unexpired lease was released."""
    key, owner = stored_key(key), validate_owner(owner)
    checked_fence, min_hold = validate_tenure_options(fence, min_hold_ms)
    params = (key, owner, checked_fence, None if min_hold is None else s.ttl_param(min_hold))
    plain = transactional.release(s, params) if s.transactional else _release(s, params)
    if s.packed:  # MySQL's own connections: the packets ask, and use the hint, themselves
        return plain
    if not s.release_covers_slots:
        if s.slots["slot_release_one"] is None:  # one read asks whether the key is a semaphore's first
            plain = transactional.or_head(s, key, plain, False)
        else:  # the slot's release is one statement (SQLite): it asks itself
            plain = _head_unless(plain, True)
        plain = _or_slot(plain, lambda: transactional.slot_release(s, params))
    if key in s.semaphore_keys:
        return _slot_first(s, params, plain)
    return plain


def _slot_first(s: LeaseStatements, params: tuple[Any, ...], plain: Plan[bool]) -> Plan[bool]:
    # A key remembered as a semaphore's (a hint, docs/statements.md "Semaphore hints"): the slot's own
    # release first; the whole plain path only if it released nothing, so a wrong hint changes no answer.
    first = s.slots["slot_release_first"]
    if first is not None:  # PostgreSQL: the release function, if the key's row is a head
        row = yield from transactional.retried(s, Query(first, params))
        if row is not None:
            return bool(row[0])
        s.semaphore_keys.forget(params[0])
    elif s.slots["slot_release_one"] is not None and (yield from transactional.slot_release(s, params)):
        return True  # SQLite's one-statement slot release
    return (yield from plain)


def _head_unless(plain: Plan[Any], done: object) -> Plan[Any]:
    # Any answer but ``done`` goes on to the slot statement.
    result = yield from plain
    return result if result is done else transactional.HEAD


def _or_slot(plain: Plan[Any], slot: Callable[[], Plan[T]]) -> Plan[T]:
    # The plain statement answered that the key is a semaphore's head: the owner's slot, if any.
    result = yield from plain
    if result is transactional.HEAD:
        return (yield from slot())
    return result  # type: ignore[no-any-return]


def _release(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[bool]:
    return transactional.release_kept_or_deleted(s, s.release_keeping, s.release, params)


def renew(s: LeaseStatements, key: str, owner: str, ttl_ms: object, fence: object = None) -> Plan[LeaseInfo | None]:
    key, owner = stored_key(key), validate_owner(owner)
    checked_fence = validate_tenure_options(fence)[0]
    params = (key, owner, s.ttl_param(validate_ttl_ms(ttl_ms)), checked_fence)
    plain = (
        transactional.renew(s, *params)
        if s.transactional
        else _single(Query(s.renew, params), lambda row: transactional.renewed_or_head(s, key, row))
    )
    return _or_slot(plain, lambda: transactional.slot_renew(s, *params))


def renew_many(s: LeaseStatements, items: object) -> Plan[dict[str, LeaseInfo]]:
    """Renew every ``(key, owner, ttl_ms)`` or ``(key, owner, ttl_ms, fence)`` of ``items`` (keys
    distinct), ``RENEW_BATCH_SIZE`` per statement; the renewed leases by key. A key absent from the
    result was refused (not that owner's unexpired lease of that fence). An empty ``items`` sends
    nothing."""
    return renew_checked(s, validate_renew_items(items))


def renew_checked(s: LeaseStatements, items: list[RenewItem]) -> Plan[dict[str, LeaseInfo]]:
    """``renew_many`` for items :func:`validate_renew_items` returned (not checked again), sent in
    ascending key order, as every statement on several keys sends its keys (rows locked in one order)."""
    items = [(encode_key(key), owner, ttl, fence) for key, owner, ttl, fence in items]
    items.sort(key=itemgetter(0))
    heads: set[str] | None = None  # stored keys that are semaphores' heads (None: not reported)
    if s.transactional:
        renewed = yield from transactional.renew_checked(s, items)
    else:
        renewed, heads = {}, set()
        for start in range(0, len(items), RENEW_BATCH_SIZE):
            chunk = items[start : start + RENEW_BATCH_SIZE]
            rows = yield Query(s.renew_many, s.renew_many_params(chunk), many=True)
            for row in rows:
                if row[1] == "":
                    heads.add(row[0])
                    continue
                lease = s.lease_info(row[0], row[1:])
                renewed[lease.key] = lease
    if len(renewed) == len(items):
        return renewed
    for key, owner, ttl, fence in items:  # not renewed as plain leases: semaphores' slots, if any
        if decode_key(key) in renewed:
            continue
        if heads is None:  # one read instead of the slot transaction for a plain lease lost
            if (yield Query(s.slots["slot_is_head"], (key,))) is None:
                continue
        elif key not in heads:
            continue
        slot = yield from transactional.slot_renew(s, key, owner, s.ttl_param(ttl), fence)
        if slot is not None:
            renewed[slot.key] = slot
    return renewed


def transfer(
    s: LeaseStatements,
    key: str,
    from_owner: str,
    to_owner: str,
    ttl_ms: object,
    data: object = None,
    fence: object = None,
) -> Plan[bool]:
    key, from_owner = stored_key(key), validate_owner(from_owner, "from_owner")
    to_owner = validate_owner(to_owner, "to_owner")
    ttl, text, checked_fence = (
        s.ttl_param(validate_ttl_ms(ttl_ms)),
        encode_data(data),
        validate_tenure_options(fence)[0],
    )
    params = (key, from_owner, to_owner, ttl, text, checked_fence)
    plain = (
        transactional.transfer(s, *params)
        if s.transactional
        else _single(Query(s.transfer, params), lambda row: transactional.HEAD if row[0] == "" else True, False)
    )
    return _or_slot(plain, lambda: transactional.slot_transfer(s, *params))


def sweep(s: LeaseStatements, batch_size: object = 1000, grace_ms: object = 0) -> Plan[int]:
    size, grace = validate_sweep(batch_size, grace_ms)
    return _sweep(s, (s.ttl_param(grace) if grace else 0, size))


def _sweep(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[int]:
    if s.transactional:
        count = yield from transactional.sweep(s, params)
    else:
        rows = yield from transactional.retried(s, Query(s.sweep, params, many=True))
        count = s.swept_count(rows)
    if s.slots["slot_sweep"] is None:  # MySQL: transactions that lock the keys' rows first, skipping held ones
        return count + (yield from transactional.slot_sweep(s, params))
    slots = yield from transactional.retried(s, Query(s.slots["slot_sweep"], params, many=True))  # expired slots
    return count + s.swept_count(slots)


def _single(query: Query, decode: Callable[[Row], T], missing: Any = None) -> Plan[Any]:
    row = yield query
    return missing if row is None else decode(row)


def list_leases(
    s: LeaseStatements, prefix: object = None, include_expired: object = False, limit: object = 1000
) -> Plan[list[LeaseInfo]]:
    """Leases by key (the database's order): those starting with ``prefix`` (all if None), only
    unexpired ones unless ``include_expired`` (an expired row has ``remaining_ms <= 0``), at most
    ``limit``."""
    prefix, include_expired, limit = validate_list(prefix, include_expired, limit)
    if prefix is None:
        query = Query(s.list_all, (include_expired, limit), many=True)
    else:
        stored = encode_key(prefix)
        query = Query(s.list_leases, (stored, include_expired, limit, prefix_upper_bound(stored)), many=True)
    return _list(s, query)


def _list(s: LeaseStatements, query: Query) -> Plan[list[LeaseInfo]]:
    # One statement: a semaphore's head comes back as its slots' rows, oldest tenure first.
    rows = yield query
    return [s.listed(row) for row in rows]


_LAST_CODE_POINT = 0x10FFFF


def prefix_upper_bound(prefix: str) -> str:
    """The least string above every string that starts with ``prefix``, in code point order (the
    order of UTF-8 bytes): the prefix with its last character incremented (surrogates skipped; a
    trailing U+10FFFF carried). An all-U+10FFFF prefix gets a bound longer than any key."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < _LAST_CODE_POINT:
            following = last + 1 if last + 1 != 0xD800 else 0xE000
            return "".join(chars) + chr(following)
    return chr(_LAST_CODE_POINT) * (MAX_KEY_LENGTH + 1)


def break_lease(s: LeaseStatements, key: str, fence: object = None) -> Plan[LeaseInfo | None]:
    """Delete the lease on ``key`` whoever holds it, or (``fence`` given) only the tenure with that
    fence; the lease it broke, or None if there was no such unexpired one (a matching expired row
    is deleted all the same)."""
    key = stored_key(key)
    fence = None if fence is None else validate_fence(fence)
    return _break(s, key, fence)


def _break(s: LeaseStatements, key: str, fence: int | None) -> Plan[LeaseInfo | None]:
    # The plain statement first; a semaphore's head goes to the slot steps, and back here if it was
    # made a plain lease in between (at most HEAD_RETRIES times).
    for _ in range(transactional.HEAD_RETRIES):
        if s.transactional:
            broken = yield from transactional.break_lease(s, key, fence)
        elif s.slots["slot_is_head"] is None:  # the statement answers a head itself
            broken = yield from _single(Query(s.break_lease, (key, fence)), lambda row: _broken(s, key, row))
        else:
            plain = _single(Query(s.break_lease, (key, fence)), lambda row: _broken(s, key, row))
            broken = yield from transactional.or_head(s, key, plain, None)
        if broken is not transactional.HEAD:
            return broken  # type: ignore[no-any-return]
        broken = yield from transactional.slot_break(s, key, fence)
        if broken is not transactional.PLAIN:
            return broken  # type: ignore[no-any-return]
    return None


def _broken(s: LeaseStatements, key: str, row: Row) -> Any:
    if row[0] == "":
        return transactional.HEAD
    return s.held(key, row) if row[7] else None


# -- several keys at once, all or nothing (issue 25; docs/statements.md, "All-or-nothing acquire") --


def _stored_keys(keys: object) -> list[str]:
    return [encode_key(key) for key in validate_keys(keys)]


def acquire_keys(
    s: LeaseStatements,
    keys: object,
    owner: object,
    ttl_ms: object,
    *,
    data: object = None,
    lock_wait_ms: float | None = None,
) -> Plan[list[AcquireResult]]:
    """Acquire every key of ``keys`` for ``owner`` or none; the results in the order of ``keys``
    (a refusal names the holder of each key that blocked, the others are ``AcquireResult(False,
    None)``). ``lock_wait_ms`` as :func:`acquire`'s. ``TypeError``/``ValueError`` before any I/O."""
    stored, owner = _stored_keys(keys), validate_owner(owner)
    ttl, text = s.ttl_param(validate_ttl_ms(ttl_ms)), encode_data(data)

    def plan() -> Plan[list[AcquireResult]]:
        if s.transactional:
            return transactional.acquire_keys(s, stored, owner, ttl, text, lock_wait_ms)
        params = s.acquire_params(s.keys_param(sorted(stored)), owner, ttl, text, lock_wait_ms)
        return _acquire_keys(s, stored, owner, params)

    return _keys_named(s, stored, plan)


def _keys_named(
    s: LeaseStatements, keys: list[str], plan: Callable[[], Plan[list[AcquireResult]]]
) -> Plan[list[AcquireResult]]:
    # A key refused by a semaphore's head (owner ''): its refusal names the oldest holder instead.
    # Refused only by stale heads (none names a holder): they are refreshed, then the call runs once more.
    for attempt in range(2):
        results = yield from plan()
        stale = []
        for i, result in enumerate(results):
            if not result.acquired and result.owner == "":
                results[i] = yield from transactional.slot_refusal(s, keys[i])
                stale += [keys[i]] if results[i].owner is None else []
        if attempt or not stale or any(result.owner is not None for result in results):
            return results
        for key in stale:
            yield from transactional.slot_refresh_head(s, key)
    return results


def _acquire_keys(
    s: LeaseStatements, keys: list[str], owner: str, params: tuple[Any, ...]
) -> Plan[list[AcquireResult]]:
    # No answer either way (a holder the statement could not see, a lock wait that ran out, PostgreSQL's
    # deliberate refusal): the holders read afresh name the refusal, or the statement runs again.
    quick, conflicts = s.acquire_tries_quick, 0
    for _ in range(3):
        try:
            rows = yield Query(s.acquire_keys, params, many=True, quick=quick)
        except Exception as exc:
            if s.conflicted(exc) and conflicts < transactional.CONFLICT_RETRIES:
                conflicts += 1  # a deadlock the database broke: nothing was written
                continue
            if not (s.refused_all(exc) or s.lock_timed_out(exc)):
                raise
            rows = []
        quick = False
        results = s.keys_results(keys, rows)
        if results is not None:
            return results
        holders = yield Query(s.holders, (params[0],), many=True)
        refused = s.keys_refusals(keys, owner, holders)
        if refused is not None:
            return refused
    return [AcquireResult(False, None)] * len(keys)


def release_keys(s: LeaseStatements, keys: object, owner: object, fences: object = None) -> Plan[int]:
    """Release ``owner``'s leases on ``keys`` (only the tenure each of ``fences`` names, if given: a
    sequence aligned with ``keys``) in one statement; how many unexpired ones it released (one
    released already and kept for its minimum hold is left alone)."""
    stored, owner = _stored_keys(keys), validate_owner(owner)
    tenures = None if fences is None else dict(zip(stored, validate_fences(fences, len(stored)), strict=True))
    return _release_keys_or_slots(s, stored, owner, cast("dict[str, int] | None", tenures))


def _release_keys_or_slots(s: LeaseStatements, keys: list[str], owner: str, fences: dict[str, int] | None) -> Plan[int]:
    # Fewer released than asked: the owner's slots of the keys that are semaphores, one by one.
    keys = sorted(keys)
    param = s.keys_param(keys)
    tenures = None if fences is None else s.keys_param([fences[key] for key in keys])
    released = yield from _release_keys(s, (param, owner, tenures))
    if released < len(keys):
        heads = [row[0] for row in (yield Query(s.holders, (param,), many=True)) if row[1] == ""]
        for key in heads:
            params = (key, owner, None if fences is None else fences[key], None)
            # PostgreSQL's release statement covers slots, with the release's commit mode
            slot = _release(s, params) if s.release_covers_slots else transactional.slot_release(s, params)
            released += bool((yield from slot))
    return released


def _release_keys(s: LeaseStatements, params: tuple[Any, ...]) -> Plan[int]:
    rows = yield from transactional.retried(s, Query(s.release_keys, params, many=True))
    return sum(int(row[0]) for row in rows)  # a flag per row deleted; MySQL: one row, the row count


def renew_keys(
    s: LeaseStatements, keys: object, owner: object, ttl_ms: object, fences: object = None
) -> Plan[list[bool]]:
    """Renew ``owner``'s unexpired leases on ``keys`` (of the tenure each of ``fences`` names, if
    given: a sequence aligned with ``keys``) with ``renew_many``'s statement; whether each was renewed,
    in the order of ``keys``."""
    checked, owner, ttl = validate_keys(keys), validate_owner(owner), validate_ttl_ms(ttl_ms)
    tenures = validate_fences(fences, len(checked))
    return _renew_keys(s, checked, [(key, owner, ttl, fence) for key, fence in zip(checked, tenures, strict=True)])


def _renew_keys(s: LeaseStatements, keys: list[str], items: list[RenewItem]) -> Plan[list[bool]]:
    renewed = yield from renew_checked(s, items)
    return [key in renewed for key in keys]
