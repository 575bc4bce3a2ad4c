"""Stateful property test: random acquire/renew/release/transfer/get/sweep sequences on a few keys
and owners give the same answers from the SQL providers as from ``InMemoryLeaseProvider`` (the
model, on a clock the test controls).

The SQL providers expire leases by the database's clock, which the test cannot move. Time is
therefore discrete: a TTL is either LONG (ten minutes: never expires during a run) or SHORT
(1 ms: the test sleeps a few milliseconds right after the call, so the lease has expired before the
next call by both clocks, and the model's clock is moved on by as much).

Fences are global counters that differ in value between the model and a database, so they are
compared by order: each model fence maps to one SQL fence; a fence first seen must be new to the
database too and ordered against every known SQL fence as the model's fence is against the model's,
and a known one must map back to the same SQL fence.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from sql_lease import InMemoryLeaseProvider, SqlLeaseProvider
from sql_lease.contract import decode_key, encode_key
from sql_lease.sql.operations import prefix_upper_bound
from tests.conftest import MYSQL_URL
from tests.support.keys import key_order

T = TypeVar("T")

KEYS = ("k0", "k\x00", "k\x01\x01")  # a NUL key and its stored form written out: two keys (issue 24)
OWNERS = ("a", "b", "c")
LONG_MS = 600_000
SHORT_MS = 1
EXPIRY_SLEEP_S = 0.006

keys = st.sampled_from(KEYS)
owners = st.sampled_from(OWNERS)
ttls = st.sampled_from((LONG_MS, SHORT_MS))

SETTINGS = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    database=None,  # no example database written into the repository
    suppress_health_check=[HealthCheck.too_slow],
)


def machine_for(
    sql: SqlLeaseProvider, loop: asyncio.AbstractEventLoop, stats: dict[str, int], limits: tuple[int, ...] = (1,)
) -> type[Any]:
    """The machine comparing ``sql`` with the model; ``limits``: the acquires' semaphore limits
    (more than plain 1: every holder of each key is compared too, ``get_lease_holders``)."""

    class LeaseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.now_ms = 0.0
            self.model = InMemoryLeaseProvider(clock=lambda: self.now_ms)
            self.prefix = f"prop-{uuid.uuid4().hex[:10]}"
            self.fences: dict[int, int] = {}
            stats["runs"] += 1

        def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
            stats["calls"] += 1
            return loop.run_until_complete(coroutine)

        def both(self, method: str, key: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            expected = self.run(getattr(self.model, method)(key, *args, **kwargs))
            actual = self.run(getattr(sql, method)(f"{self.prefix}:{key}", *args, **kwargs))
            return expected, actual

        def settle(self, ttl: int) -> None:
            """After a call with the SHORT TTL, let it expire by both clocks."""
            if ttl == SHORT_MS:
                time.sleep(EXPIRY_SLEEP_S)
                self.now_ms += EXPIRY_SLEEP_S * 1000

        def same_fence(self, expected: int | None, actual: int | None) -> None:
            if expected is None:
                assert actual is None
                return
            assert isinstance(actual, int)
            if expected in self.fences:
                assert self.fences[expected] == actual, ("a known tenure changed its fence", expected, actual)
            else:
                # a tenure first seen now (it may have begun earlier, unobserved): its SQL fence is
                # new too, and ordered against every known one as the model's fence is
                for model_fence, sql_fence in self.fences.items():
                    assert sql_fence != actual, ("two tenures share a fence", expected, actual, self.fences)
                    assert (model_fence < expected) == (sql_fence < actual), (expected, actual, self.fences)
                self.fences[expected] = actual

        @rule(key=keys, owner=owners, ttl=ttls, limit=st.sampled_from(limits))
        def acquire(self, key: str, owner: str, ttl: int, limit: int) -> None:
            sent = datetime.now(UTC)
            expected, actual = self.both("acquire_lease", key, owner, ttl, **({"limit": limit} if limit != 1 else {}))
            self.settle(ttl)
            assert (actual.acquired, actual.owner) == (expected.acquired, expected.owner), (expected, actual)
            self.same_fence(expected.fence, actual.fence)
            if actual.acquired and ttl == LONG_MS:
                assert actual.expires_at is not None
                assert abs(actual.expires_at - (sent + timedelta(milliseconds=LONG_MS))) < timedelta(seconds=5)

        @rule(key=keys, owner=owners, ttl=ttls)
        def renew(self, key: str, owner: str, ttl: int) -> None:
            expected, actual = self.both("renew_lease", key, owner, ttl)
            self.settle(ttl)
            assert actual == expected

        @rule(key=keys, owner=owners)
        def release(self, key: str, owner: str) -> None:
            expected, actual = self.both("release_lease", key, owner)
            assert actual == expected

        @rule(key=keys, from_owner=owners, to_owner=owners, ttl=ttls)
        def transfer(self, key: str, from_owner: str, to_owner: str, ttl: int) -> None:
            expected, actual = self.both("transfer_lease", key, from_owner, to_owner, ttl)
            self.settle(ttl)
            assert actual == expected

        @rule(key=keys)
        def get_owner(self, key: str) -> None:
            expected, actual = self.both("get_lease_owner", key)
            assert actual == expected

        @rule(grace_ms=st.sampled_from((0, 60_000)))
        def sweep(self, grace_ms: int) -> None:
            # The whole batch: with a smaller one the model and the database may pick different
            # expired rows, and an expired row left in place is observable (its owner re-acquiring
            # keeps its fence).
            expected = self.run(self.model.sweep_expired(1000, grace_ms))
            actual = self.run(sql.sweep_expired(1000, grace_ms))
            assert actual == expected

        @rule()
        def advance_clock(self) -> None:
            self.settle(SHORT_MS)

        @invariant()
        def leases_agree(self) -> None:
            for key in KEYS:
                expected, actual = self.both("get_lease", key)
                assert (actual is None) == (expected is None), (key, expected, actual)
                if expected is not None:
                    assert actual.owner == expected.owner, (key, expected, actual)
                    self.same_fence(expected.fence, actual.fence)
                if limits != (1,):  # every holder, oldest tenure first
                    expected, actual = self.both("get_lease_holders", key)
                    assert [h.owner for h in actual] == [h.owner for h in expected], (key, expected, actual)
                    for model_holder, sql_holder in zip(expected, actual, strict=True):
                        self.same_fence(model_holder.fence, sql_holder.fence)

        def teardown(self) -> None:
            for key in KEYS:  # leave no row behind for the next run's sweeps to count
                for owner in OWNERS:
                    self.run(sql.release_lease(f"{self.prefix}:{key}", owner))
            self.run(sql.sweep_expired(100_000, 0))  # expired slots, which no release removes

    return LeaseMachine


def check_against_the_model(url: str, schema: str | None, label: str, limits: tuple[int, ...] = (1,)) -> None:
    loop = asyncio.new_event_loop()
    stats = {"runs": 0, "calls": 0}
    started = time.monotonic()
    try:
        sql = SqlLeaseProvider(url, schema=schema, operation_timeout_s=10)
        try:
            loop.run_until_complete(sql.migrate())
            run_state_machine_as_test(machine_for(sql, loop, stats, limits), settings=SETTINGS)
        finally:
            loop.run_until_complete(sql.close())
    finally:
        pending = asyncio.all_tasks(loop)
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    print(f"\nCOUNTS property={label} {stats} in {time.monotonic() - started:.1f} s", flush=True)


@pytest.mark.slow
def test_sqlite_behaves_like_the_model(tmp_path: Path) -> None:
    check_against_the_model(f"sqlite:///{tmp_path}/model.db", None, "sqlite")


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_behaves_like_the_model(pg_url: str, fresh_pg_schema: str) -> None:
    check_against_the_model(pg_url, fresh_pg_schema, "postgres")


SEMAPHORE_LIMITS = (1, 2, 3)
"""Plain acquires and semaphores of 2 and 3 slots, on the same keys: the two kinds must refuse each other."""


@pytest.mark.slow
def test_sqlite_semaphores_behave_like_the_model(tmp_path: Path) -> None:
    check_against_the_model(f"sqlite:///{tmp_path}/model.db", None, "sqlite-semaphores", SEMAPHORE_LIMITS)


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_semaphores_behave_like_the_model(pg_url: str, fresh_pg_schema: str) -> None:
    check_against_the_model(pg_url, fresh_pg_schema, "postgres-semaphores", SEMAPHORE_LIMITS)


@pytest.mark.slow
@pytest.mark.mysql
def test_mysql_semaphores_behave_like_the_model(fresh_mysql_db: str) -> None:
    """Keys taken as slots and as plain leases in turn: the provider's memory of semaphore keys is often
    wrong about them, and the answers must not depend on it (docs/statements.md, "Semaphore hints"). A
    database of its own: other tests' expired rows would count in its sweeps."""
    check_against_the_model(MYSQL_URL, fresh_mysql_db, "mysql-semaphores", SEMAPHORE_LIMITS)


def test_the_machine_catches_a_wrong_answer(tmp_path: Path) -> None:
    """The comparison has teeth: a provider that forgets the fence rule is caught."""

    class ForgetsFences(SqlLeaseProvider):
        async def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> Any:
            result = await super().acquire_lease(key, owner, ttl_ms)
            if result.acquired and result.fence is not None:
                return type(result)(True, owner, result.fence + 1_000_000, result.expires_at)
            return result

    loop = asyncio.new_event_loop()
    try:
        sql = ForgetsFences(f"sqlite:///{tmp_path}/broken.db")
        try:
            loop.run_until_complete(sql.migrate())
            machine = machine_for(sql, loop, {"runs": 0, "calls": 0})
            with pytest.raises(AssertionError):
                run_state_machine_as_test(
                    machine,
                    settings=settings(SETTINGS, max_examples=30, report_multiple_bugs=False, phases=[Phase.generate]),
                )
        finally:
            loop.run_until_complete(sql.close())
    finally:
        loop.close()


# -- the stored form of a key (issue 24): injective, prefix- and order-keeping ------------------

any_text = st.text(st.characters(exclude_categories=()), max_size=40)  # surrogates and NUL included
# Few characters, the escape's neighbours among them, so that keys collide in prefixes often.
tricky = st.text(st.sampled_from("\x00\x01\x02a\u0800\u07ff\ud800\udbff\udc00\udfff\ue000\U0010ffff\\"), max_size=8)


@given(any_text)
def test_a_key_reads_back_from_its_stored_form(key: str) -> None:
    stored = encode_key(key)
    assert decode_key(stored) == key
    assert "\x00" not in stored
    assert len(stored) <= 2 * len(key) and len(stored.encode("utf-8")) <= 4 * len(key)  # UTF-8: no surrogates
    if not any(c in "\x00\x01" or 0xD800 <= ord(c) <= 0xDFFF for c in key):
        assert stored == key  # stored as it is


@given(tricky, tricky)
def test_the_stored_form_is_injective_and_keeps_prefixes_and_order(a: str, b: str) -> None:
    stored_a, stored_b = encode_key(a), encode_key(b)
    assert (stored_a == stored_b) == (a == b)
    assert stored_a.startswith(stored_b) == a.startswith(b)
    assert (stored_a < stored_b) == (key_order(a) < key_order(b))
    assert (stored_a.encode("utf-8") < stored_b.encode("utf-8")) == (stored_a < stored_b)  # bytes (MySQL) agree
    if b:  # list_leases(prefix=b) reads the range [stored b, its upper bound)
        assert (stored_b <= stored_a < prefix_upper_bound(stored_b)) == a.startswith(b)


@pytest.mark.parametrize("stored", ["a\x01b", "a\x01", "\x01\x7f\x01\x01"])
def test_text_no_key_is_stored_as_reads_back_as_it_is(stored: str) -> None:
    """A row of an older release that kept a raw U+0001 (not rewritten by migration 0005) still lists."""
    assert decode_key(stored) == stored.replace("\x01\x01", "\x00")
