"""The public surface: exports, structural detection, the no-op fallback, result types."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

import sql_lease
from sql_lease import AcquireResult, InMemoryLeaseProvider, LeaseProvider, NoopLeaseProvider, is_lease_provider


def test_all_names_every_public_object() -> None:
    # Submodules are attributes once imported (by this or an earlier test in the same process): not exports
    public = {
        name
        for name in dir(sql_lease)
        if not name.startswith("_") and not isinstance(getattr(sql_lease, name), ModuleType)
    }
    assert set(sql_lease.__all__) == public | {"SqlLeaseProvider", "SyncSqlLeaseProvider"}
    for name in sql_lease.__all__:
        assert getattr(sql_lease, name) is not None


def test_import_needs_no_database_package() -> None:
    code = (
        "import sys; import sql_lease; "
        "assert 'sqlalchemy' not in sys.modules and 'asyncpg' not in sys.modules, sorted(sys.modules); "
        "sql_lease.SqlLeaseProvider; assert 'sqlalchemy' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class DuckProvider:
    """Never imports sql_lease's protocol: structural detection must still accept it."""

    async def acquire_lease(self, key: str, owner: str, ttl_ms: float) -> Any: ...
    async def get_lease_owner(self, key: str) -> Any: ...
    async def release_lease(self, key: str, owner: str) -> Any: ...
    async def renew_lease(self, key: str, owner: str, ttl_ms: float) -> Any: ...
    async def transfer_lease(self, key: str, a: str, b: str, ttl_ms: float) -> Any: ...


class Incomplete:
    async def acquire_lease(self, key: str, owner: str, ttl_ms: float) -> Any: ...


class NotCallable(DuckProvider):
    renew_lease = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (DuckProvider(), True),
        (NoopLeaseProvider(), True),
        (InMemoryLeaseProvider(), True),
        (Incomplete(), False),
        (NotCallable(), False),
        (DuckProvider, False),  # a class is not a provider
        (None, False),
        ("acquire_lease", False),
    ],
)
def test_is_lease_provider_is_structural(candidate: object, expected: bool) -> None:
    assert is_lease_provider(candidate) is expected
    if expected:
        assert isinstance(candidate, LeaseProvider)


async def test_noop_provider_follows_mastra() -> None:
    noop = NoopLeaseProvider()
    assert await noop.acquire_lease("k", "a", 1000) == AcquireResult(True, "a", None, None)
    assert (await noop.acquire_lease("k", "b", 1000)).acquired  # every caller "owns" every key
    assert await noop.get_lease_owner("k") is None
    assert await noop.release_lease("k", "nobody") is True
    assert await noop.renew_lease("k", "a", 1000) is True
    assert await noop.transfer_lease("k", "a", "b", 1000) is True


def test_acquire_result_is_frozen_and_falsy_when_refused() -> None:
    result = AcquireResult(False, "holder", 3, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.acquired = True  # type: ignore[misc]
    assert not result and AcquireResult(True, "me")


async def test_memory_provider_clock_is_replaceable() -> None:
    now = [0.0]
    provider = InMemoryLeaseProvider(clock=lambda: now[0])
    first = await provider.acquire_lease("k", "a", 1000)
    now[0] = 999.0
    assert await provider.get_lease_owner("k") == "a"
    now[0] = 1000.0  # expiry is inclusive: at T + ttl the lease is over
    assert await provider.get_lease_owner("k") is None
    second = await provider.acquire_lease("k", "b", 1000)
    assert second.fence > first.fence  # type: ignore[operator]
    assert first.expires_at is not None and second.expires_at is not None
    assert (second.expires_at - first.expires_at).total_seconds() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "provider_class", ["SqlLeaseProvider", "SyncSqlLeaseProvider", "InMemoryLeaseProvider", "SyncInMemoryLeaseProvider"]
)
@pytest.mark.parametrize("method", ["release_lease", "renew_lease", "renew_lease_info", "transfer_lease"])
def test_tenure_scoped_methods_state_units_and_what_they_raise(provider_class: str, method: str) -> None:
    """The methods that gained ``fence`` (and ``min_hold_ms``) say their units and errors (house rule)."""
    import inspect

    function = vars(getattr(sql_lease, provider_class))[method]
    doc = inspect.getdoc(function) or ""
    assert "fence" in inspect.signature(function).parameters
    assert re.search(r"\bmilliseconds\b|\bms\b(?!`)", doc), doc
    assert "TypeError" in doc and "ValueError" in doc, doc
