"""Bad input raises TypeError/ValueError before any SQL runs, and nothing is written."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import pytest

from sql_lease import MAX_KEY_LENGTH, MAX_OWNER_LENGTH, MAX_TTL_MS, NoopLeaseProvider, SqlLeaseProvider
from tests.support.counting import StatementCounter

GOOD_KEY, GOOD_OWNER, GOOD_TTL = "validation:key", "validation-owner", 1000

BAD_TEXT: list[tuple[str, Any, type[Exception]]] = [
    ("None", None, TypeError),
    ("int", 42, TypeError),
    ("bytes", b"key", TypeError),
    ("list", ["k"], TypeError),
    ("empty", "", ValueError),
    ("NUL", "a\x00b", ValueError),
    ("oversize", "k" * (MAX_KEY_LENGTH + 1), ValueError),
    ("lone surrogate", "a\ud800b", ValueError),
]
# Any str is a key (issue 24): NUL and lone surrogates are refused in owners only.
OWNER_ONLY = ("NUL", "lone surrogate")
BAD_KEY = [case for case in BAD_TEXT if case[0] not in OWNER_ONLY]
BAD_TTL: list[tuple[str, Any, type[Exception]]] = [
    ("zero", 0, ValueError),
    ("negative", -1, ValueError),
    ("negative float", -0.5, ValueError),
    ("NaN", math.nan, ValueError),
    ("inf", math.inf, ValueError),
    ("-inf", -math.inf, ValueError),
    ("True", True, TypeError),
    ("False", False, TypeError),
    ("str", "1000", TypeError),
    ("None", None, TypeError),
    ("over max", MAX_TTL_MS + 1, ValueError),
    ("huge float", 1e300, ValueError),
]

# (method, args with one bad value, expected exception)
CASES: list[Any] = []
for label, bad, exc in BAD_KEY:
    CASES += [
        pytest.param("acquire_lease", (bad, GOOD_OWNER, GOOD_TTL), exc, id=f"acquire-key-{label}"),
        pytest.param("get_lease_owner", (bad,), exc, id=f"owner-key-{label}"),
        pytest.param("release_lease", (bad, GOOD_OWNER), exc, id=f"release-key-{label}"),
    ]
for label, bad, exc in BAD_TEXT:
    CASES += [
        pytest.param("acquire_lease", (GOOD_KEY, bad, GOOD_TTL), exc, id=f"acquire-owner-{label}"),
        pytest.param("release_lease", (GOOD_KEY, bad), exc, id=f"release-owner-{label}"),
        pytest.param("renew_lease", (GOOD_KEY, bad, GOOD_TTL), exc, id=f"renew-owner-{label}"),
        pytest.param("transfer_lease", (GOOD_KEY, bad, "next", GOOD_TTL), exc, id=f"transfer-from-{label}"),
        pytest.param("transfer_lease", (GOOD_KEY, GOOD_OWNER, bad, GOOD_TTL), exc, id=f"transfer-to-{label}"),
    ]
for label, bad, exc in BAD_TTL:
    CASES += [
        pytest.param("acquire_lease", (GOOD_KEY, GOOD_OWNER, bad), exc, id=f"acquire-ttl-{label}"),
        pytest.param("renew_lease", (GOOD_KEY, GOOD_OWNER, bad), exc, id=f"renew-ttl-{label}"),
        pytest.param("transfer_lease", (GOOD_KEY, GOOD_OWNER, "next", bad), exc, id=f"transfer-ttl-{label}"),
    ]
CASES.append(pytest.param("acquire_lease", (GOOD_KEY, "o" * (MAX_OWNER_LENGTH + 1), 1), ValueError, id="owner-513"))
# All-or-nothing calls (issue 25): a bad keys list, owner or TTL sends nothing and writes nothing.
BAD_KEYS: list[tuple[str, Any, type[Exception]]] = [
    ("str", "ab", TypeError),
    ("set", {GOOD_KEY}, TypeError),
    ("empty", [], ValueError),
    ("repeated", [GOOD_KEY, "other", GOOD_KEY], ValueError),
    ("101 keys", [f"k{i}" for i in range(101)], ValueError),
    ("an int among them", ["other", 1], TypeError),
    ("an empty key among them", ["other", ""], ValueError),
]
for label, bad, exc in BAD_KEYS:
    CASES += [
        pytest.param("acquire_leases", (bad, GOOD_OWNER, GOOD_TTL), exc, id=f"acquire-keys-{label}"),
        pytest.param("release_leases", (bad, GOOD_OWNER), exc, id=f"release-keys-{label}"),
        pytest.param("renew_leases", (bad, GOOD_OWNER, GOOD_TTL), exc, id=f"renew-keys-{label}"),
    ]
CASES += [
    pytest.param("acquire_leases", ([GOOD_KEY, "other"], None, GOOD_TTL), TypeError, id="acquire-keys-owner-None"),
    pytest.param("acquire_leases", ([GOOD_KEY, "other"], GOOD_OWNER, 0), ValueError, id="acquire-keys-ttl-0"),
    pytest.param("renew_leases", ([GOOD_KEY], GOOD_OWNER, math.nan), ValueError, id="renew-keys-ttl-NaN"),
    pytest.param("release_leases", ([GOOD_KEY], ""), ValueError, id="release-keys-owner-empty"),
]

BAD_FENCE: list[tuple[str, Any, type[Exception]]] = [
    ("zero", 0, ValueError),
    ("negative", -1, ValueError),
    ("over 2**63-1", 2**63, ValueError),
    ("True", True, TypeError),
    ("float", 1.0, TypeError),
    ("str", "1", TypeError),
]
BAD_MIN_HOLD: list[tuple[str, Any, type[Exception]]] = [
    ("negative", -1, ValueError),
    ("negative float", -0.5, ValueError),
    ("NaN", math.nan, ValueError),
    ("inf", math.inf, ValueError),
    ("True", True, TypeError),
    ("False", False, TypeError),
    ("str", "1000", TypeError),
    ("over max", MAX_TTL_MS + 1, ValueError),
]
# (method, args, keywords with one bad value, expected exception): issue 24's fence= and min_hold_ms=
KW_CASES: list[Any] = []
for label, bad, exc in BAD_FENCE:
    KW_CASES += [
        pytest.param("release_lease", (GOOD_KEY, GOOD_OWNER), {"fence": bad}, exc, id=f"release-fence-{label}"),
        pytest.param("renew_lease", (GOOD_KEY, GOOD_OWNER, GOOD_TTL), {"fence": bad}, exc, id=f"renew-fence-{label}"),
        pytest.param(
            "transfer_lease",
            (GOOD_KEY, GOOD_OWNER, "next", GOOD_TTL),
            {"fence": bad},
            exc,
            id=f"transfer-fence-{label}",
        ),
        pytest.param("renew_many", ([(GOOD_KEY, GOOD_OWNER, GOOD_TTL, bad)],), {}, exc, id=f"renew-many-fence-{label}"),
    ]
for label, bad, exc in BAD_MIN_HOLD:
    KW_CASES.append(
        pytest.param("release_lease", (GOOD_KEY, GOOD_OWNER), {"min_hold_ms": bad}, exc, id=f"release-min-hold-{label}")
    )


@pytest.mark.parametrize(("method", "args", "kwargs", "expected"), KW_CASES)
async def test_bad_fences_and_minimum_holds_are_rejected_before_any_sql(
    provider: Any, method: str, args: tuple, kwargs: dict[str, Any], expected: type
) -> None:
    held = await provider.acquire_lease(GOOD_KEY, GOOD_OWNER, 60_000)
    assert held.acquired
    before = await provider.get_lease(GOOD_KEY)
    counter = StatementCounter(provider)
    with pytest.raises(expected):
        await getattr(provider, method)(*args, **kwargs)
    if "min_hold_ms" in kwargs:  # with a good fence beside it, too
        with pytest.raises(expected):
            await getattr(provider, method)(*args, fence=held.fence, **kwargs)
    assert counter.count == 0
    after = await provider.get_lease(GOOD_KEY)
    assert (after.owner, after.fence, after.expires_at, after.released) == (
        before.owner,
        before.fence,
        before.expires_at,
        False,
    )


@pytest.mark.parametrize(("method", "args", "expected"), CASES)
async def test_bad_input_is_rejected_before_any_sql(provider: Any, method: str, args: tuple, expected: type) -> None:
    # Make sure the key is really held by someone, so a wrongly accepted call would change it.
    assert (await provider.acquire_lease(GOOD_KEY, GOOD_OWNER, 60_000)).acquired
    before = await provider.get_lease(GOOD_KEY)
    counter = StatementCounter(provider)
    with pytest.raises(expected):
        await getattr(provider, method)(*args)
    assert counter.count == 0
    after = await provider.get_lease(GOOD_KEY)
    assert (after.owner, after.fence, after.expires_at) == (before.owner, before.fence, before.expires_at)


@pytest.mark.parametrize(("method", "args", "expected"), CASES[:: max(1, len(CASES) // 12)])
async def test_noop_provider_validates_too(method: str, args: tuple, expected: type) -> None:
    with pytest.raises(expected):
        await getattr(NoopLeaseProvider(), method)(*args)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"table_name": "x; drop table y"}, ValueError),
        ({"table_name": 'le"ases'}, ValueError),
        ({"table_name": "le'ases"}, ValueError),
        ({"table_name": "public.leases"}, ValueError),
        ({"table_name": ""}, ValueError),
        ({"table_name": "1leases"}, ValueError),
        ({"table_name": "t" * 60}, ValueError),
        ({"table_name": None}, TypeError),
        ({"schema": "a;b"}, ValueError),
        ({"schema": "x.y"}, ValueError),
        ({"version_table": "v--"}, ValueError),
        ({"operation_timeout_s": 0}, ValueError),
        ({"operation_timeout_s": "5"}, TypeError),
        ({"sqlite_synchronous": "OFF"}, ValueError),
    ],
)
def test_bad_construction_arguments(kwargs: dict[str, Any], expected: type) -> None:
    with pytest.raises(expected):
        SqlLeaseProvider("sqlite:///unused.db", **kwargs)


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
        SqlLeaseProvider(url)


@pytest.mark.parametrize(
    "url", ["postgresql://u@h/db", "postgres://u@h/db", "postgresql+asyncpg://u@h/db", "sqlite:///x.db"]
)
def test_plain_urls_map_to_async_drivers(url: str) -> None:
    provider = SqlLeaseProvider(url)
    assert provider.engine.dialect.driver in ("asyncpg", "aiosqlite")


class SneakyStr(str):
    """Lies about itself: a naive check of len(), `in` or encode() would let it through."""

    def __len__(self) -> int:
        return 1

    def __contains__(self, item: object) -> bool:
        return False

    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
        return b"x"


@pytest.mark.parametrize(
    ("value", "bad_key"),
    [
        (SneakyStr("k" * (MAX_KEY_LENGTH + 1)), True),
        (SneakyStr("a\x00b"), False),  # a good key (issue 24), a bad owner
        (SneakyStr("a\ud800"), False),
    ],
)
async def test_str_subclasses_cannot_slip_past(provider: Any, value: str, bad_key: bool) -> None:
    counter = StatementCounter(provider)
    if bad_key:
        with pytest.raises(ValueError):
            await provider.acquire_lease(value, GOOD_OWNER, GOOD_TTL)
    with pytest.raises(ValueError):
        await provider.acquire_lease(GOOD_KEY, value, GOOD_TTL)
    assert counter.count == 0


async def test_a_str_subclass_key_is_escaped_as_the_plain_str(provider: Any) -> None:
    plain = f"sneaky:{uuid.uuid4().hex}:\x01\x00"  # SneakyStr hides both from `in`
    assert (await provider.acquire_lease(SneakyStr(plain), GOOD_OWNER, GOOD_TTL)).acquired
    assert (await provider.acquire_lease(plain[:-2] + "\x01\x02\x01\x01", "other", GOOD_TTL)).acquired
    lease = await provider.get_lease(plain)
    assert lease is not None and (type(lease.key), lease.key, lease.owner) == (str, plain, GOOD_OWNER)


async def test_str_subclass_keys_are_stored_as_plain_text(provider: Any) -> None:
    class Tag(str):
        pass

    assert (await provider.acquire_lease(Tag("tagged:key"), Tag("tagged-owner"), GOOD_TTL)).acquired
    assert await provider.get_lease_owner("tagged:key") == "tagged-owner"


@pytest.mark.parametrize("ttl", [10**400, -(10**400), 0.5, 1e-6, 5e-324])
async def test_extreme_ttls_are_value_errors(provider: Any, ttl: Any) -> None:
    with pytest.raises(ValueError):
        await provider.acquire_lease(GOOD_KEY, GOOD_OWNER, ttl)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"batch_size": 0}, ValueError),
        ({"batch_size": -1}, ValueError),
        ({"batch_size": 1.5}, TypeError),
        ({"batch_size": True}, TypeError),
        ({"grace_ms": -1}, ValueError),
        ({"grace_ms": math.nan}, ValueError),
        ({"grace_ms": "1"}, TypeError),
    ],
)
async def test_sweep_arguments_are_validated(provider: Any, kwargs: dict[str, Any], expected: type) -> None:
    with pytest.raises(expected):
        await provider.sweep_expired(**kwargs)


def test_sweeper_and_hold_reject_bad_numbers() -> None:
    from sql_lease import ExpirySweeper, InMemoryLeaseProvider, hold

    with pytest.raises(ValueError):
        ExpirySweeper(InMemoryLeaseProvider(), batch_size=0)
    with pytest.raises(ValueError):
        hold(InMemoryLeaseProvider(), "k", timeout_s=10**400)


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        (True, TypeError),
        (2.0, TypeError),
        ("3", TypeError),
        (None, TypeError),
        (0, ValueError),
        (10_001, ValueError),
        (-1, ValueError),
    ],
)
def test_a_semaphore_limit_is_an_int_from_1_to_10000(limit: object, error: type[Exception]) -> None:
    from sql_lease.contract import MAX_LIMIT, validate_limit

    with pytest.raises(error):
        validate_limit(limit)
    assert validate_limit(1) == 1 and validate_limit(MAX_LIMIT) == MAX_LIMIT


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ("ab", TypeError),
        (b"ab", TypeError),
        ({"a"}, TypeError),
        ([], ValueError),
        (["a", "a"], ValueError),
        ([1], TypeError),
        ([f"k{i}" for i in range(101)], ValueError),
    ],
)
def test_keys_of_an_all_or_nothing_call_are_1_to_100_distinct_keys(keys: object, error: type[Exception]) -> None:
    from sql_lease.contract import MAX_KEYS, validate_keys

    with pytest.raises(error):
        validate_keys(keys)
    assert (
        validate_keys(("a\x00b", "a")) == ["a\x00b", "a"]
        and len(validate_keys([f"k{i}" for i in range(MAX_KEYS)])) == MAX_KEYS
    )


@pytest.mark.parametrize("face", ["async", "sync"])
def test_a_misspelt_keyword_names_the_public_function_and_the_right_one(face: str) -> None:
    """`hold(..., ttl=30)` said "HoldRules.__init__() got an unexpected keyword argument 'ttl'"."""
    from sql_lease import InMemoryLeaseProvider, SyncInMemoryLeaseProvider, acquire_lease_wait, hold
    from sql_lease.sync_holding import hold as sync_hold

    calls = (
        [(hold, InMemoryLeaseProvider()), (acquire_lease_wait, InMemoryLeaseProvider())]
        if face == "async"
        else [(sync_hold, SyncInMemoryLeaseProvider())]
    )
    for function, provider in calls:
        with pytest.raises(TypeError) as raised:
            made = function(provider, "k", "o", ttl=30)
            if asyncio.iscoroutine(made):  # acquire_lease_wait, an async function: raised when awaited
                asyncio.run(made)
        message = str(raised.value)
        assert message.startswith(f"{function.__name__}() got an unexpected keyword argument 'ttl'"), message
        assert "did you mean 'ttl_ms'" in message and "HoldRules" not in message, message
    if face == "async":  # a TypeError of the call's own checks is raised as it was
        with pytest.raises(TypeError, match=r"^ttl_ms must be an int or float"):
            hold(calls[0][1], "k", "o", ttl_ms="30")


def test_a_timeout_without_waiting_is_refused_on_both_faces() -> None:
    """``timeout_s`` bounds a wait: given without one (``wait=True``, ``on_conflict="wait"``), it
    would be ignored, the acquire tried once and refused at once; the CLI refuses ``--timeout``
    without ``--wait`` too."""
    from sql_lease import InMemoryLeaseProvider, SyncInMemoryLeaseProvider, hold, hold_all, leased
    from sql_lease.sync_holding import hold as sync_hold
    from sql_lease.sync_holding import hold_all as sync_hold_all

    for provider, holds in (
        (InMemoryLeaseProvider(), (hold, hold_all)),
        (SyncInMemoryLeaseProvider(), (sync_hold, sync_hold_all)),
    ):
        one, every = holds
        with pytest.raises(ValueError, match="timeout_s goes with wait=True"):
            one(provider, "k", "o", 1000, timeout_s=5)
        with pytest.raises(ValueError, match="timeout_s goes with wait=True"):
            every(provider, ["a", "b"], "o", 1000, timeout_s=5)
        for on_conflict in ("skip", "raise"):
            with pytest.raises(ValueError, match="timeout_s goes with on_conflict='wait'"):
                leased(provider, "k", on_conflict=on_conflict, timeout_s=5)
        assert one(provider, "k", "o", 1000, wait=True, timeout_s=5) is not None
        assert leased(provider, "k", on_conflict="wait", timeout_s=5) is not None
