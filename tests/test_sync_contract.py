"""The LeaseProvider contract over the synchronous providers (memory, SQLite, PostgreSQL): every
numbered rule of tests/test_contract.py and the bad-input cases of tests/test_validation.py, with
plain calls from threads instead of awaits."""

from __future__ import annotations

import concurrent.futures
import inspect
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sql_lease import (
    MAX_KEY_LENGTH,
    MAX_OWNER_LENGTH,
    MAX_TTL_MS,
    AcquireResult,
    ProviderClosedError,
    SchemaMissingError,
    SyncInMemoryLeaseProvider,
    SyncSqlLeaseProvider,
    is_lease_provider,
)
from tests.support.counting import StatementCounter
from tests.support.keys import KeysSeen, key_order, look_alike_keys
from tests.test_validation import CASES, KW_CASES, SneakyStr

TTL = 10_000
SHORT_TTL = 300  # ms; tests wait SHORT_WAIT seconds for it to lapse
SHORT_WAIT = 0.6
RENEWED_TTL = 1_000  # ms; renewed every RENEWED_TTL/4 for longer than RENEWED_TTL
GOOD_KEY, GOOD_OWNER, GOOD_TTL = "validation:key", "validation-owner", 1000


@pytest.fixture
def provider(sync_provider: Any) -> Any:
    return sync_provider


@pytest.fixture
def sql_provider(sync_sql_provider: Any) -> Any:
    return sync_sql_provider


def assert_near_now_plus(moment: datetime | None, ttl_ms: float, slack_s: float = 5.0) -> None:
    assert moment is not None and moment.tzinfo is not None
    assert moment.utcoffset() == timedelta(0)
    expected = datetime.now(UTC) + timedelta(milliseconds=ttl_ms)
    assert abs((moment - expected).total_seconds()) < slack_s


def test_on_statement_sees_every_statement(sql_provider: Any, key: str) -> None:
    seen: list[tuple[str, tuple[Any, ...]]] = []
    remove = sql_provider.on_statement(lambda sql, params: seen.append((sql, params)))
    sql_provider.acquire_lease(key, "alice", TTL)
    s = sql_provider.statements  # SQLite may read first; MySQL's acquire is a transaction (grant_new names the owner)
    named_owner = (s.acquire, s.steps.get("grant_new"), s.steps.get("acquire_packet"))
    acquires = [params for sql, params in seen if sql in named_owner and len(params) > 1]
    assert acquires and acquires[0][:2] == (key, "alice")
    count = len(seen)
    remove()
    sql_provider.release_lease(key, "alice")
    assert len(seen) == count


def test_is_a_lease_provider(provider: Any) -> None:
    assert is_lease_provider(provider)
    assert not inspect.iscoroutinefunction(provider.acquire_lease)


# 1. acquire on a free key
def test_acquire_free_key(provider: Any, key: str) -> None:
    result = provider.acquire_lease(key, "alice", TTL)
    assert result == AcquireResult(True, "alice", result.fence, result.expires_at)
    assert isinstance(result.fence, int) and result.fence > 0
    assert_near_now_plus(result.expires_at, TTL)
    assert provider.get_lease_owner(key) == "alice"


# 2. refused while another owner holds it, with the holder described
def test_acquire_held_by_other_is_refused_with_holder(provider: Any, key: str) -> None:
    held = provider.acquire_lease(key, "alice", TTL)
    refused = provider.acquire_lease(key, "bob", TTL)
    assert not refused.acquired and not refused
    assert (refused.owner, refused.fence, refused.expires_at) == (held.owner, held.fence, held.expires_at)
    assert provider.get_lease_owner(key) == "alice"


# 3. acquire by the current owner: idempotent, expiry reset, fence unchanged
def test_reacquire_by_owner_extends_and_keeps_fence(provider: Any, key: str) -> None:
    first = provider.acquire_lease(key, "alice", 1_000)
    time.sleep(0.02)
    again = provider.acquire_lease(key, "alice", TTL)
    assert again.acquired and again.fence == first.fence
    assert again.expires_at is not None and first.expires_at is not None
    assert again.expires_at > first.expires_at
    assert_near_now_plus(again.expires_at, TTL)


# 4. fences strictly increase at every change of owner
def test_fence_increases_on_every_change_of_owner(provider: Any, key: str) -> None:
    fences = [(provider.acquire_lease(key, "alice", TTL)).fence]
    assert provider.release_lease(key, "alice")
    fences.append((provider.acquire_lease(key, "bob", TTL)).fence)
    assert provider.release_lease(key, "bob")
    fences.append((provider.acquire_lease(key, "bob", TTL)).fence)  # same owner after a release
    assert provider.transfer_lease(key, "bob", "carol", TTL)
    fences.append((provider.acquire_lease(key, "carol", TTL)).fence)
    assert provider.release_lease(key, "carol")
    fences.append((provider.acquire_lease(key, "dave", SHORT_TTL)).fence)
    time.sleep(SHORT_WAIT)
    fences.append((provider.acquire_lease(key, "erin", TTL)).fence)  # takeover after expiry
    assert all(isinstance(f, int) for f in fences)
    assert fences == sorted(set(fences)), fences  # type: ignore[type-var]


def test_fence_increases_after_sweep(provider: Any, key: str) -> None:
    first = provider.acquire_lease(key, "alice", SHORT_TTL)
    time.sleep(SHORT_WAIT)
    assert provider.sweep_expired(batch_size=1_000_000) >= 1  # type: ignore[attr-defined]
    assert provider.get_lease_owner(key) is None
    second = provider.acquire_lease(key, "bob", TTL)
    assert second.acquired and second.fence > first.fence  # type: ignore[operator]


def test_fences_independent_keys_never_repeat(provider: Any, key: str) -> None:
    seen = set()
    for i in range(20):
        result = provider.acquire_lease(f"{key}:{i}", f"owner{i}", TTL)
        seen.add(result.fence)
    assert len(seen) == 20


# 5. get_lease_owner of expired or released leases
def test_owner_of_expired_or_released_is_none(provider: Any, key: str) -> None:
    assert provider.get_lease_owner(key) is None
    provider.acquire_lease(key, "alice", TTL)
    assert provider.get_lease_owner(key) == "alice"
    assert provider.renew_lease(key, "alice", SHORT_TTL)  # read under a long TTL, then let it lapse
    time.sleep(SHORT_WAIT)
    assert provider.get_lease_owner(key) is None
    provider.acquire_lease(key, "bob", TTL)
    assert provider.release_lease(key, "bob")
    assert provider.get_lease_owner(key) is None


# 6. release by a non-owner or a former owner
def test_release_by_non_owner_is_refused(provider: Any, key: str) -> None:
    held = provider.acquire_lease(key, "alice", TTL)
    assert provider.release_lease(key, "mallory") is False
    assert provider.release_lease(f"{key}:other", "alice") is False
    again = provider.acquire_lease(key, "alice", TTL)
    assert again.fence == held.fence and provider.get_lease_owner(key) == "alice"


def test_release_by_former_owner_after_takeover_is_refused(provider: Any, key: str) -> None:
    provider.acquire_lease(key, "alice", SHORT_TTL)
    time.sleep(SHORT_WAIT)
    taken = provider.acquire_lease(key, "bob", TTL)
    assert taken.acquired
    assert provider.release_lease(key, "alice") is False
    assert provider.get_lease_owner(key) == "bob"


def test_release_of_own_expired_lease_reports_false(provider: Any, key: str) -> None:
    provider.acquire_lease(key, "alice", SHORT_TTL)
    time.sleep(SHORT_WAIT)
    assert provider.release_lease(key, "alice") is False
    assert (provider.acquire_lease(key, "bob", TTL)).acquired


def test_release_frees_the_key_at_once(provider: Any, key: str) -> None:
    provider.acquire_lease(key, "alice", TTL)
    assert provider.release_lease(key, "alice") is True
    assert (provider.acquire_lease(key, "bob", TTL)).acquired


# 7. renew
def test_renew_by_owner_extends(provider: Any, key: str) -> None:
    provider.acquire_lease(key, "alice", TTL)
    assert provider.renew_lease(key, "alice", 3 * TTL) is True
    lease = provider.get_lease(key)
    assert lease is not None and lease.owner == "alice" and lease.remaining_ms > TTL  # past the first TTL
    assert not (provider.acquire_lease(key, "bob", TTL)).acquired


def test_renew_keeps_a_lease_past_its_ttl(provider: Any, key: str) -> None:
    provider.acquire_lease(key, "alice", RENEWED_TTL)
    for _ in range(5):  # 1.25 s in all, past the 1 s TTL; each renewal 0.75 s before the lease would lapse
        time.sleep(RENEWED_TTL / 4000)
        assert provider.renew_lease(key, "alice", RENEWED_TTL)
    assert provider.get_lease_owner(key) == "alice"


def test_renew_after_expiry_or_by_non_owner_fails(provider: Any, key: str) -> None:
    assert provider.renew_lease(key, "alice", TTL) is False  # never held
    provider.acquire_lease(key, "alice", SHORT_TTL)
    assert provider.renew_lease(key, "bob", TTL) is False
    time.sleep(SHORT_WAIT)
    assert provider.renew_lease(key, "alice", TTL) is False  # expired, nobody took it
    assert provider.get_lease_owner(key) is None


# 8. transfer
def test_transfer_hands_over_with_new_fence(provider: Any, key: str) -> None:
    held = provider.acquire_lease(key, "alice", TTL)
    assert provider.transfer_lease(key, "alice", "bob", 3 * TTL) is True
    assert provider.get_lease_owner(key) == "bob"
    lease = provider.get_lease(key)
    assert lease is not None and lease.remaining_ms > TTL  # the new TTL counts from the transfer
    refused = provider.acquire_lease(key, "alice", TTL)
    assert not refused.acquired and refused.owner == "bob"
    assert refused.fence > held.fence  # type: ignore[operator]
    assert provider.release_lease(key, "alice") is False


def test_transfer_to_self_acts_as_renew(provider: Any, key: str) -> None:
    held = provider.acquire_lease(key, "alice", TTL)
    assert provider.transfer_lease(key, "alice", "alice", 3 * TTL) is True
    lease = provider.get_lease(key)
    assert lease is not None and lease.remaining_ms > TTL  # renewed, as renew_lease would
    again = provider.acquire_lease(key, "alice", TTL)
    assert again.fence == held.fence


def test_transfer_by_non_owner_or_after_expiry_changes_nothing(provider: Any, key: str) -> None:
    assert provider.transfer_lease(key, "alice", "bob", TTL) is False
    assert provider.get_lease_owner(key) is None
    held = provider.acquire_lease(key, "alice", TTL)
    assert provider.transfer_lease(key, "mallory", "bob", TTL) is False
    again = provider.acquire_lease(key, "alice", TTL)
    assert again.fence == held.fence
    assert provider.renew_lease(key, "alice", SHORT_TTL)  # then let it lapse
    time.sleep(SHORT_WAIT)
    assert provider.transfer_lease(key, "alice", "bob", TTL) is False
    assert provider.get_lease_owner(key) is None


def test_transfer_leaves_no_gap(provider: Any, key: str) -> None:
    """A contender hammering acquire never gets the key between the two owners."""
    provider.acquire_lease(key, "owner0", TTL)
    stolen = []

    def contender() -> None:
        for _ in range(200):
            if (provider.acquire_lease(key, "thief", TTL)).acquired:
                stolen.append(True)
            time.sleep(0)

    def relay() -> None:
        for i in range(40):
            assert provider.transfer_lease(key, f"owner{i}", f"owner{i + 1}", TTL)
            time.sleep(0)

    threads = [threading.Thread(target=contender), threading.Thread(target=relay)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stolen == []
    assert provider.get_lease_owner(key) == "owner40"


# 9. limits that must be accepted
def test_documented_limits_are_accepted(provider: Any, key: str) -> None:
    long_key = key + "k" * (MAX_KEY_LENGTH - len(key))
    long_owner = "o" * MAX_OWNER_LENGTH
    assert (provider.acquire_lease(long_key, long_owner, 24 * 3600 * 1000)).acquired
    assert provider.get_lease_owner(long_key) == long_owner
    assert provider.renew_lease(long_key, long_owner, MAX_TTL_MS)
    assert (provider.acquire_lease(key, "alice", 1.5)).acquired  # fractional milliseconds


def test_keys_and_owners_round_trip_exactly(provider: Any, key: str) -> None:
    odd = ["it's", 'say "hi"', "100%", "a_b", "back\\slash", "new\nline", "tab\t", "emoji 🔒", "ünïcödé", " "]
    for _i, text in enumerate(odd):
        assert (provider.acquire_lease(f"{key}:{text}", text, TTL)).acquired
        assert provider.get_lease_owner(f"{key}:{text}") == text
    # LIKE metacharacters are not wildcards: "a_b" and "a%b" are different keys from "axb"
    assert provider.get_lease_owner(f"{key}:axb") is None
    base = key + "x" * (MAX_KEY_LENGTH - len(key) - 1)
    assert (provider.acquire_lease(base + "1", "one", TTL)).acquired
    assert (provider.acquire_lease(base + "2", "two", TTL)).acquired
    assert provider.get_lease_owner(base + "1") == "one"


# 11. any str is a key (issue 24): the cases of tests/test_contract.py on this face
def test_any_str_is_a_key_of_its_own_and_reads_back_exactly(provider: Any, key: str) -> None:
    keys = look_alike_keys(key + ":")
    for i, k in enumerate(keys):
        assert provider.acquire_lease(k, f"o{i}", TTL, data={"i": i}).acquired, repr(k)
    for i, k in enumerate(keys):
        lease = provider.get_lease(k)
        assert lease is not None and (lease.key, lease.owner, lease.data) == (k, f"o{i}", {"i": i})
        assert provider.get_lease_owner(k) == f"o{i}"
    in_order = sorted(keys, key=key_order)
    listed = provider.list_leases(prefix=key + ":")
    assert [(lease.key, lease.owner) for lease in listed] == [(k, f"o{keys.index(k)}") for k in in_order]
    for part in ("\x00", "\x01", "\x01\x01", "\ud800", "\ud83d", "\\"):
        expected = [k for k in in_order if k.startswith(f"{key}:{part}")]
        assert expected
        assert [lease.key for lease in provider.list_leases(prefix=f"{key}:{part}")] == expected

    nul, escape, surrogate = keys[0], keys[5], keys[7]
    renewed = provider.renew_lease_info(nul, "o0", TTL)
    assert renewed is not None and renewed.key == nul
    assert provider.transfer_lease(nul, "o0", "next", TTL)
    assert not provider.transfer_lease(keys[2], "o0", "next", TTL)
    assert provider.get_lease_owner(nul) == "next" and provider.get_lease_owner(keys[2]) == "o2"
    assert provider.release_lease(escape, "o5")
    assert provider.get_lease_owner(escape) is None and provider.get_lease_owner(keys[3]) == "o3"
    broken = provider.break_lease(surrogate)
    assert broken is not None and (broken.key, broken.owner) == (surrogate, "o7")
    assert provider.get_lease_owner(keys[6]) == "o6" and provider.get_lease_owner(keys[9]) == "o9"

    expiring = key + ":\x00\ud800gone"
    assert provider.acquire_lease(expiring, "short", SHORT_TTL).acquired
    time.sleep(SHORT_WAIT)
    expired = provider.list_leases(prefix=key + ":\x00\ud800", include_expired=True)
    assert [(lease.key, lease.remaining_ms is not None and lease.remaining_ms <= 0) for lease in expired] == [
        (expiring, True)
    ]
    assert provider.sweep_expired(batch_size=1_000_000) >= 1
    assert provider.list_leases(prefix=key + ":\x00\ud800", include_expired=True) == []
    assert provider.get_lease_owner(keys[1]) == "o1"


def test_observers_and_errors_name_the_key_as_given(sql_provider: Any, key: str) -> None:
    from sql_lease import LeaseNotAcquiredError
    from sql_lease.observe import add_observer

    odd = key + ":resource\x00thread\x01\ud800"
    keys = KeysSeen(key)
    remove = add_observer(keys)
    try:
        assert sql_provider.acquire_lease(odd, "alice", TTL).acquired
        with pytest.raises(LeaseNotAcquiredError) as refused:
            sql_provider.acquire_lease_wait(odd, "bob", TTL, timeout_s=0)
    finally:
        remove()
    assert keys.seen and set(keys.seen) == {odd}
    assert refused.value.key == odd and repr(odd) in str(refused.value)


@pytest.mark.parametrize("char", ["\x00", "\x01", "\ud800", "\U0010ffff"])
def test_key_length_counts_the_key_as_given(provider: Any, key: str, char: str) -> None:
    longest = key + char * (MAX_KEY_LENGTH - len(key))
    assert provider.acquire_lease(longest, "alice", TTL).acquired
    lease = provider.get_lease(longest)
    assert lease is not None and lease.key == longest
    assert [lease.key for lease in provider.list_leases(prefix=longest)] == [longest]
    assert provider.release_lease(longest, "alice")
    with pytest.raises(ValueError):
        provider.acquire_lease(longest + char, "alice", TTL)


# 10. the client's clock and time zone never matter (SQL providers read the database's clock)
def test_client_clock_and_timezone_do_not_matter(sql_provider: Any, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    provider = sql_provider
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() - 10 * 365 * 86400)
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    try:
        result = provider.acquire_lease(key, "alice", TTL)
        assert result.acquired
        assert_near_now_plus(result.expires_at, TTL)  # datetime.now is unaffected by the patch
        assert not (provider.acquire_lease(key, "bob", TTL)).acquired
    finally:
        monkeypatch.undo()
        time.tzset()


def test_concurrent_acquires_elect_exactly_one(provider: Any, key: str) -> None:
    barrier = threading.Barrier(16)

    def contend(i: int) -> AcquireResult:
        barrier.wait()
        result: AcquireResult = provider.acquire_lease(key, f"w{i}", TTL)
        return result

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(contend, range(16)))
    winners = [r for r in results if r.acquired]
    assert len(winners) == 1
    assert {r.owner for r in results} == {winners[0].owner}


# -- bad input: TypeError/ValueError before any SQL, nothing written (tests/test_validation.py) --


@pytest.mark.parametrize(("method", "args", "expected"), CASES)
def test_bad_input_is_rejected_before_any_sql(provider: Any, method: str, args: tuple, expected: type) -> None:
    assert provider.acquire_lease(GOOD_KEY, GOOD_OWNER, 60_000).acquired
    before = provider.get_lease(GOOD_KEY)
    counter = StatementCounter(provider)
    with pytest.raises(expected):
        getattr(provider, method)(*args)
    assert counter.count == 0
    after = provider.get_lease(GOOD_KEY)
    assert (after.owner, after.fence, after.expires_at) == (before.owner, before.fence, before.expires_at)


@pytest.mark.parametrize(
    ("method", "args", "kwargs", "expected"),
    [case for case in KW_CASES if case.values[0] != "renew_many"],  # the sync face renews one by one
)
def test_bad_fences_and_minimum_holds_are_rejected_before_any_sql(
    provider: Any, method: str, args: tuple, kwargs: dict[str, Any], expected: type
) -> None:
    held = provider.acquire_lease(GOOD_KEY, GOOD_OWNER, 60_000)
    before = provider.get_lease(GOOD_KEY)
    counter = StatementCounter(provider)
    with pytest.raises(expected):
        getattr(provider, method)(*args, **kwargs)
    if "min_hold_ms" in kwargs:  # with a good fence beside it, too
        with pytest.raises(expected):
            getattr(provider, method)(*args, fence=held.fence, **kwargs)
    assert counter.count == 0
    after = provider.get_lease(GOOD_KEY)
    assert (after.owner, after.fence, after.expires_at, after.released) == (
        before.owner,
        before.fence,
        before.expires_at,
        False,
    )


@pytest.mark.parametrize(
    ("value", "bad_key"),
    [(SneakyStr("k" * (MAX_KEY_LENGTH + 1)), True), (SneakyStr("a\x00b"), False), (SneakyStr("a\ud800"), False)],
    ids=["long", "nul", "surrogate"],
)
def test_str_subclasses_cannot_slip_past(provider: Any, value: str, bad_key: bool) -> None:
    counter = StatementCounter(provider)
    if bad_key:
        with pytest.raises(ValueError):
            provider.acquire_lease(value, GOOD_OWNER, GOOD_TTL)
    with pytest.raises(ValueError):
        provider.acquire_lease(GOOD_KEY, value, GOOD_TTL)
    assert counter.count == 0


@pytest.mark.parametrize("ttl", [10**400, -(10**400), 0.5, 1e-6, 5e-324])
def test_extreme_ttls_are_value_errors(provider: Any, ttl: Any) -> None:
    with pytest.raises(ValueError):
        provider.acquire_lease(GOOD_KEY, GOOD_OWNER, ttl)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"batch_size": 0}, ValueError),
        ({"batch_size": 1.5}, TypeError),
        ({"batch_size": True}, TypeError),
        ({"grace_ms": -1}, ValueError),
        ({"grace_ms": "1"}, TypeError),
    ],
)
def test_sweep_arguments_are_validated(provider: Any, kwargs: dict[str, Any], expected: type) -> None:
    counter = StatementCounter(provider)
    with pytest.raises(expected):
        provider.sweep_expired(**kwargs)
    assert counter.count == 0


def test_renew_lease_info_returns_the_databases_expiry(provider: Any, key: str) -> None:
    held = provider.acquire_lease(key, "alice", TTL)
    info = provider.renew_lease_info(key, "alice", 3 * TTL)
    assert info.fence == held.fence and info.owner == "alice"
    assert_near_now_plus(info.expires_at, 3 * TTL)
    assert provider.renew_lease_info(key, "bob", TTL) is None


def test_sweep_removes_expired_rows(provider: Any, key: str) -> None:
    provider.acquire_lease(key, "alice", SHORT_TTL)
    time.sleep(SHORT_WAIT)
    assert provider.sweep_expired(batch_size=1_000_000) >= 1
    assert provider.sweep_expired(batch_size=1_000_000) == 0


def test_closed_provider_refuses(sync_provider: Any, key: str) -> None:
    sync_provider.close()
    if isinstance(sync_provider, SyncInMemoryLeaseProvider):
        return  # nothing to close
    with pytest.raises(ProviderClosedError):
        sync_provider.acquire_lease(key, "alice", TTL)
    with pytest.raises(TypeError):  # bad input is still bad input
        sync_provider.acquire_lease(None, "alice", TTL)
    sync_provider.close()  # idempotent


def test_a_missing_sqlite_file_is_never_created(tmp_path: Any) -> None:
    path = tmp_path / "absent.db"
    with SyncSqlLeaseProvider(f"sqlite:///{path}") as provider:
        with pytest.raises(SchemaMissingError, match="migrate"):
            provider.acquire_lease("k", "alice", TTL)
        assert not path.exists()
        assert provider.migrate() is not None
        assert provider.acquire_lease("k", "alice", TTL).acquired


@pytest.mark.postgres
def test_a_missing_table_is_schema_missing(pg_url: str) -> None:
    with SyncSqlLeaseProvider(pg_url, table_name="no_such_lease_table") as provider:
        with pytest.raises(SchemaMissingError, match="--table no_such_lease_table") as info:
            provider.get_lease_owner("k")
        assert info.value.__cause__ is not None


@pytest.mark.postgres
def test_a_missing_database_is_a_config_error(pg_url: str) -> None:
    from sqlalchemy.engine import make_url

    from sql_lease import LeaseConfigError

    url = make_url(pg_url.replace("postgres://", "postgresql://")).set(database="sql_lease_no_such_db")
    with SyncSqlLeaseProvider(url, operation_timeout_s=5) as provider:
        started = time.monotonic()
        with pytest.raises(LeaseConfigError, match="does not exist"):
            provider.get_lease_owner("k")
        assert time.monotonic() - started < 3  # reported at once, not after the timeout


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"table_name": "x; drop table y"}, ValueError),
        ({"table_name": None}, TypeError),
        ({"schema": "a;b"}, ValueError),
        ({"operation_timeout_s": 0}, ValueError),
        ({"operation_timeout_s": "5"}, TypeError),
        ({"sqlite_synchronous": "OFF"}, ValueError),
        ({"pool_size": 0}, ValueError),
        ({"sqlite_busy_timeout_ms": -1}, ValueError),
    ],
)
def test_bad_construction_arguments(kwargs: dict[str, Any], expected: type, tmp_path: Any) -> None:
    with pytest.raises(expected):
        SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/unused.db", **kwargs)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("oracle://root@localhost/test", ValueError),
        ("mysql+mysqlconnector://root@localhost/test", ValueError),
        ("postgresql+pg8000://u@h/db", ValueError),
        ("sqlite://", ValueError),
        ("sqlite:///:memory:", ValueError),
        ("not a url", ValueError),
        (42, TypeError),
    ],
)
def test_bad_urls(url: Any, expected: type) -> None:
    with pytest.raises(expected):
        SyncSqlLeaseProvider(url)


def test_sqlite_busy_timeout_is_for_sqlite_only() -> None:
    with pytest.raises(ValueError, match="only for SQLite"):
        SyncSqlLeaseProvider("postgresql://u@h/db", sqlite_busy_timeout_ms=100)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db",
        "postgres://u@h/db",
        "postgresql+asyncpg://u@h/db",
        "postgresql+psycopg://u@h/db",
        "postgresql+psycopg2://u@h/db",
    ],
)
def test_each_face_picks_its_own_driver(url: str) -> None:
    from sql_lease.sql.urls import to_async_url, to_sync_url

    assert to_sync_url(url).drivername == "postgresql+psycopg"
    assert to_async_url(url).drivername == "postgresql+asyncpg"
    provider = SyncSqlLeaseProvider(url)  # nothing connects until the first operation
    assert provider.dialect_name == "postgresql"
    provider.close()


@pytest.mark.parametrize("url", ["sqlite:///x.db", "sqlite+aiosqlite:///x.db", "sqlite+pysqlite:///x.db"])
def test_sqlite_urls_for_both_faces(url: str) -> None:
    from sql_lease.sql.urls import to_async_url, to_sync_url

    assert to_sync_url(url).drivername == "sqlite+pysqlite"
    assert to_async_url(url).drivername == "sqlite+aiosqlite"


def test_the_password_never_shows(tmp_path: Any) -> None:
    provider = SyncSqlLeaseProvider("postgresql://u:hunter2@127.0.0.1:1/db?sslmode=disable")
    assert "hunter2" not in repr(provider) and "hunter2" not in provider.safe_url
    provider.close()
    with pytest.raises(ValueError) as info:
        SyncSqlLeaseProvider("postgresql://u:hunter2@127.0.0.1/db?no_such_option=1")
    assert "hunter2" not in str(info.value)


# -- issue 24: operations scoped to one tenure (fence=), and a minimum hold (min_hold_ms=) -----


def test_fence_scopes_release_renew_and_transfer(provider: Any, key: str) -> None:
    held = provider.acquire_lease(key, "alice", TTL)
    other = held.fence + 1000
    assert provider.renew_lease(key, "alice", TTL, fence=other) is False
    assert provider.renew_lease_info(key, "alice", TTL, fence=other) is None
    assert provider.transfer_lease(key, "alice", "bob", TTL, fence=other) is False
    assert provider.release_lease(key, "alice", fence=other) is False
    still = provider.get_lease(key)
    assert (still.owner, still.fence, still.expires_at) == ("alice", held.fence, held.expires_at)
    assert provider.renew_lease(key, "alice", TTL, fence=held.fence) is True
    assert provider.transfer_lease(key, "alice", "bob", TTL, fence=held.fence) is True
    moved = provider.get_lease(key)
    assert moved.owner == "bob" and moved.fence > held.fence
    assert provider.release_lease(key, "bob", fence=held.fence) is False
    assert provider.release_lease(key, "bob", fence=moved.fence) is True
    assert provider.get_lease_owner(key) is None


def test_an_old_tenures_release_never_ends_the_owners_new_one(provider: Any, key: str) -> None:
    old = provider.acquire_lease(key, "run-7", SHORT_TTL)
    time.sleep(SHORT_WAIT)
    new = provider.acquire_lease(key, "run-7", TTL)
    assert new.acquired and new.fence > old.fence
    assert provider.renew_lease(key, "run-7", TTL, fence=old.fence) is False
    assert provider.release_lease(key, "run-7", fence=old.fence) is False
    assert provider.get_lease(key).fence == new.fence


MIN_HOLD = 1_500  # ms: the kept lease is checked within it, then waited out


def test_a_min_hold_release_keeps_the_lease_until_its_tenure_is_that_old(provider: Any, key: str) -> None:
    held = provider.acquire_lease(key, "cron@a", TTL)
    assert provider.release_lease(key, "cron@a", min_hold_ms=MIN_HOLD) is True
    kept = provider.get_lease(key)
    assert kept.owner == "cron@a" and kept.fence == held.fence and kept.released is True
    assert abs((kept.expires_at - kept.acquired_at).total_seconds() * 1000 - MIN_HOLD) < 2
    assert provider.get_lease_owner(key) == "cron@a"
    refused = provider.acquire_lease(key, "cron@b", TTL)
    assert not refused.acquired and (refused.owner, refused.fence) == ("cron@a", held.fence)
    again = provider.acquire_lease(key, "cron@a", TTL)  # released: the owner is refused too
    assert not again.acquired and again.owner == "cron@a" and again.expires_at == kept.expires_at
    assert provider.renew_lease(key, "cron@a", TTL) is False
    assert provider.transfer_lease(key, "cron@a", "cron@b", TTL) is False
    assert provider.release_lease(key, "cron@a") is False  # released already: kept
    assert [(i.key, i.released) for i in provider.list_leases(prefix=key)] == [(key, True)]
    time.sleep(max(0.0, kept.remaining_ms / 1000) + 0.05)
    assert provider.get_lease_owner(key) is None
    after = provider.acquire_lease(key, "cron@b", TTL)
    assert after.acquired and after.fence > held.fence
    assert provider.get_lease(key).released is False


def test_a_min_hold_already_passed_frees_at_once(provider: Any, key: str) -> None:
    held = provider.acquire_lease(key, "alice", TTL)
    time.sleep(SHORT_WAIT)
    assert provider.release_lease(key, "alice", min_hold_ms=SHORT_TTL, fence=held.fence) is True
    assert provider.get_lease_owner(key) is None
    assert provider.acquire_lease(key, "bob", TTL).acquired


ROUNDS = 1_000


def test_an_old_tenures_release_racing_a_new_acquire_never_frees_it(provider: Any, key: str) -> None:
    """As the async face's test, with two threads started together at a barrier each round."""
    barrier = threading.Barrier(2)
    order: list[str] = []

    def release(old_fence: int) -> bool:
        barrier.wait()
        released = bool(provider.release_lease(key, "job", fence=old_fence))
        order.append("release")
        return released

    def acquire() -> AcquireResult:
        barrier.wait()
        result: AcquireResult = provider.acquire_lease(key, "job", TTL)
        order.append("acquire")
        return result

    new_first = 0
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for round_ in range(ROUNDS):
            old = provider.acquire_lease(key, "job", TTL)
            assert provider.break_lease(key, fence=old.fence) is not None
            order.clear()
            releasing, acquiring = pool.submit(release, old.fence), pool.submit(acquire)
            released, new = releasing.result(), acquiring.result()
            new_first += order[0] == "acquire"
            assert released is False and new.acquired and new.fence > old.fence
            current = provider.get_lease(key)
            assert current is not None and current.fence == new.fence, f"round {round_}: the new tenure was freed"
            assert provider.release_lease(key, "job", fence=new.fence)
    assert new_first > 0  # the dangerous order (the new acquire answered before the old release) happened


# -- all-or-nothing acquire of several keys (issue 25) ----------------------------------------------


def test_acquire_leases_all_or_nothing_on_the_sync_face(provider: Any, key: str) -> None:
    keys = [f"{key}:b", f"{key}:a", f"{key}:c"]
    blocker = provider.acquire_lease(keys[2], "bob", TTL)
    refused = provider.acquire_leases(keys, "alice", TTL)
    assert refused[:2] == [AcquireResult(False, None)] * 2
    assert (refused[2].acquired, refused[2].owner, refused[2].fence) == (False, "bob", blocker.fence)
    assert [provider.get_lease_owner(k) for k in keys] == [None, None, "bob"]
    assert provider.release_lease(keys[2], "bob")
    granted = provider.acquire_leases(keys, "alice", TTL)
    assert all(granted) and len({r.fence for r in granted}) == 3 and granted[2].fence > blocker.fence
    assert [provider.get_lease(k).fence for k in keys] == [r.fence for r in granted]
    again = provider.acquire_leases(list(reversed(keys)), "alice", TTL)
    assert [r.fence for r in again] == [r.fence for r in reversed(granted)]


def test_renew_and_release_leases_on_the_sync_face(provider: Any, key: str) -> None:
    keys = look_alike_keys(key)[:4]
    assert all(provider.acquire_leases(keys[:3], "alice", SHORT_TTL))
    time.sleep(SHORT_WAIT)
    taken = provider.acquire_leases(keys[1:], "bob", TTL)  # two expired keys and a free one
    assert all(taken)
    assert provider.renew_leases(keys, "bob", TTL) == [False, True, True, True]
    assert provider.renew_leases(keys, "alice", TTL) == [False] * 4
    assert provider.release_leases(keys, "bob") == 3
    assert provider.release_leases(keys, "bob") == 0
