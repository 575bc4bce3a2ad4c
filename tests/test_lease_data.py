"""Lease data: a small JSON object stored with a lease at acquire or transfer, read back by
get_lease and list_leases on every provider and both faces; bad data refused before any SQL; the
migration that adds the column, under live holders (issue 11)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sql_lease import (
    InMemoryLeaseProvider,
    SqlLeaseProvider,
    SyncInMemoryLeaseProvider,
    SyncSqlLeaseProvider,
    hold,
    is_lease_provider,
    leased,
)
from sql_lease.contract import MAX_DATA_BYTES, MAX_DATA_DEPTH, AcquireResult, LeaseInfo, LeaseProvider
from sql_lease.errors import SchemaMissingError
from sql_lease.sql.migrate import HEAD_REVISION
from sql_lease.sql.operations import Query

# Every JSON type, nesting, non-ASCII and NUL text, an int beyond 64 bits and floats whose text
# PostgreSQL's jsonb would rewrite (1e300 would come back as an int): read back equal, same types.
SAMPLE = {
    "host": "build-3",
    "pid": 4242,
    "job": {"id": "nightly-report", "attempt": 2, "tags": ["a", "ü", "\x00", "😀"]},
    "ratio": 0.1,
    "huge": 1e300,
    "big": 2**70,
    "ok": True,
    "none": None,
    "z": {},
    "a": [],
}


def _types(value: Any) -> Any:
    """``value`` with every leaf replaced by its type, so equality also compares types (1 vs 1.0)."""
    if isinstance(value, dict):
        return {name: _types(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_types(item) for item in value]
    return type(value)


def _same(read: dict[str, Any] | None, written: dict[str, Any]) -> None:
    assert read == written
    assert _types(read) == _types(written)
    assert list(read) == list(written)  # key order kept too (PostgreSQL json, not jsonb)


async def test_round_trip_async(provider: Any, key: str) -> None:
    assert (await provider.acquire_lease(key, "o", 30_000, data=SAMPLE)).acquired
    _same((await provider.get_lease(key)).data, SAMPLE)
    (listed,) = [lease for lease in await provider.list_leases(prefix=key) if lease.key == key]
    _same(listed.data, SAMPLE)
    assert await provider.renew_lease(key, "o", 30_000)
    _same((await provider.get_lease(key)).data, SAMPLE)  # renewals keep it
    read = (await provider.get_lease(key)).data
    read["host"] = "changed by the reader"
    assert (await provider.get_lease(key)).data["host"] == "build-3"  # each read is a copy


def test_round_trip_sync(sync_provider: Any, key: str) -> None:
    assert sync_provider.acquire_lease(key, "o", 30_000, data=SAMPLE).acquired
    _same(sync_provider.get_lease(key).data, SAMPLE)
    (listed,) = sync_provider.list_leases(prefix=key)
    _same(listed.data, SAMPLE)
    assert sync_provider.renew_lease(key, "o", 30_000)
    assert sync_provider.transfer_lease(key, "o", "p", 30_000, data={"next": 1})
    assert sync_provider.get_lease(key).data == {"next": 1}


async def test_tenure_semantics(provider: Any, key: str) -> None:
    """Data belongs to a tenure: a new tenure stores what it was given (None: none); the same
    tenure keeps its data when given None and replaces it when given a dict."""

    async def data() -> Any:
        lease = await provider.get_lease(key)
        return None if lease is None else lease.data

    first = await provider.acquire_lease(key, "a", 30_000, data={"v": 1})
    assert await data() == {"v": 1}
    again = await provider.acquire_lease(key, "a", 30_000)  # idempotent retry: kept
    assert again.fence == first.fence and await data() == {"v": 1}
    await provider.acquire_lease(key, "a", 30_000, data={"v": 2})  # same tenure, new data: replaced
    assert await data() == {"v": 2}
    assert not (await provider.acquire_lease(key, "b", 30_000, data={"v": 3})).acquired
    assert await data() == {"v": 2}  # a refusal changes nothing

    assert await provider.transfer_lease(key, "a", "a", 30_000)  # to oneself: a renewal, data kept
    assert await data() == {"v": 2}
    assert await provider.transfer_lease(key, "a", "a", 30_000, data={"v": 4})
    assert await data() == {"v": 4}
    assert not await provider.transfer_lease(key, "b", "c", 30_000, data={"v": 5})  # not b's
    assert await data() == {"v": 4}
    assert await provider.transfer_lease(key, "a", "b", 30_000)  # a new owner without data: none
    assert await data() is None
    assert await provider.transfer_lease(key, "b", "c", 30_000, data={"v": 6})
    assert await data() == {"v": 6}

    assert await provider.release_lease(key, "c")
    await provider.acquire_lease(key, "c", 30_000)  # a new tenure of the same owner: none
    assert await data() is None
    await provider.acquire_lease(key, "c", 30_000, data={})  # an empty object is data, not none
    assert await data() == {}


async def test_an_expired_tenure_does_not_pass_its_data_on(provider: Any, key: str) -> None:
    await provider.acquire_lease(key, "a", 30, data={"stale": True})
    await asyncio.sleep(0.08)
    assert (await provider.acquire_lease(key, "a", 30_000)).acquired  # same owner, new tenure
    assert (await provider.get_lease(key)).data is None
    assert [lease.data for lease in await provider.list_leases(prefix=key)] == [None]


def _bad_values() -> list[Any]:
    looped: dict[str, Any] = {}
    looped["self"] = looped
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_DATA_DEPTH):
        node["d"] = {}
        node = node["d"]
    return [
        pytest.param([1, 2], TypeError, id="not-an-object"),
        pytest.param("{}", TypeError, id="json-text"),
        pytest.param({1: "x"}, TypeError, id="int-key"),
        pytest.param({"a": {None: 1}}, TypeError, id="nested-none-key"),
        pytest.param({"a": (1, 2)}, TypeError, id="tuple"),
        pytest.param({"a": {1, 2}}, TypeError, id="set"),
        pytest.param({"a": b"bytes"}, TypeError, id="bytes"),
        pytest.param({"a": math.nan}, ValueError, id="nan"),
        pytest.param({"a": [1, -math.inf]}, ValueError, id="infinity"),
        pytest.param({"a": "\ud800"}, ValueError, id="lone-surrogate"),
        pytest.param({"a": "x" * MAX_DATA_BYTES}, ValueError, id="too-large"),
        pytest.param({"a": list(range(MAX_DATA_BYTES))}, ValueError, id="too-many-values"),
        pytest.param(deep, ValueError, id="too-deep"),
        pytest.param(looped, ValueError, id="refers-to-itself"),
    ]


@pytest.mark.parametrize(("bad", "error"), _bad_values())
async def test_bad_data_is_refused_before_any_sql(
    sql_provider: SqlLeaseProvider, key: str, bad: Any, error: type[Exception]
) -> None:
    sent: list[str] = []
    sql_provider.on_statement(lambda sql, params: sent.append(sql))
    with pytest.raises(error):
        await sql_provider.acquire_lease(key, "o", 30_000, data=bad)
    with pytest.raises(error):
        await sql_provider.transfer_lease(key, "o", "p", 30_000, data=bad)
    with pytest.raises(error):
        sql_provider.hold(key, "o", data=bad)
    with pytest.raises(error):
        await sql_provider.acquire_lease_wait(key, "o", 30_000, 1, data=bad)
    assert sent == []
    assert await sql_provider.get_lease(key) is None  # nothing written


@pytest.mark.parametrize(("bad", "error"), _bad_values()[:3])
def test_bad_data_is_refused_before_any_sql_sync(
    sync_sql_provider: SyncSqlLeaseProvider, key: str, bad: Any, error: type[Exception]
) -> None:
    sent: list[str] = []
    sync_sql_provider.on_statement(lambda sql, params: sent.append(sql))
    with pytest.raises(error):
        sync_sql_provider.acquire_lease(key, "o", 30_000, data=bad)
    with pytest.raises(error):
        sync_sql_provider.transfer_lease(key, "o", "p", 30_000, data=bad)
    with pytest.raises(error):
        sync_sql_provider.hold(key, "o", data=bad)
    with pytest.raises(error):
        sync_sql_provider.acquire_lease_wait(key, "o", 30_000, 1, data=bad)
    assert sent == []
    assert sync_sql_provider.get_lease(key) is None


@pytest.mark.parametrize("memory", [InMemoryLeaseProvider, SyncInMemoryLeaseProvider])
def test_memory_providers_refuse_bad_data(memory: Callable[[], Any], key: str) -> None:
    leases = memory()

    def call(result: Any) -> Any:
        return asyncio.run(result) if asyncio.iscoroutine(result) else result

    with pytest.raises(TypeError):
        call(leases.acquire_lease(key, "o", 30_000, data={"a": (1,)}))
    assert call(leases.get_lease(key)) is None
    call(leases.acquire_lease(key, "o", 30_000, data={"kept": 1}))
    with pytest.raises(ValueError):
        call(leases.transfer_lease(key, "o", "p", 30_000, data={"a": math.nan}))
    assert call(leases.get_lease(key)).data == {"kept": 1}


async def test_size_limit_is_in_utf8_bytes_of_compact_json(provider: Any, key: str) -> None:
    envelope = len('{"p":""}')
    fits = {"p": "é" * ((MAX_DATA_BYTES - envelope) // 2)}  # 2 bytes each: exactly the limit
    assert (MAX_DATA_BYTES - envelope) % 2 == 0
    assert (await provider.acquire_lease(key, "o", 30_000, data=fits)).acquired
    assert (await provider.get_lease(key)).data == fits
    with pytest.raises(ValueError, match=str(MAX_DATA_BYTES)):
        await provider.acquire_lease(key, "o", 30_000, data={"p": fits["p"] + "x"})  # one byte over
    assert (await provider.get_lease(key)).data == fits


async def test_hold_and_waiters_pass_data_on(provider: Any, key: str) -> None:
    async with hold(provider, key, "first", ttl_ms=5_000, data={"run": 1}) as first:
        assert first.data == {"run": 1}
        assert (await provider.get_lease(key)).data == {"run": 1}
        waiting = asyncio.ensure_future(provider.acquire_lease_wait(key, "second", 5_000, 10, data={"run": 2}))
        await asyncio.sleep(0.1)
        assert not waiting.done()
    assert (await waiting).acquired  # woken by the release (NOTIFY on PostgreSQL)
    assert (await provider.get_lease(key)).data == {"run": 2}
    async with hold(provider, key, "second", ttl_ms=5_000) as again:  # the same owner's tenure: kept
        assert (await provider.get_lease(key)).data == {"run": 2}
        assert await again.transfer_to("third", data={"run": 3})
    assert (await provider.get_lease(key)).data == {"run": 3}
    async with hold(provider, f"{key}:w", "w", ttl_ms=5_000, wait=True, timeout_s=5, data={"w": 1}):
        assert (await provider.get_lease(f"{key}:w")).data == {"w": 1}


def test_sync_hold_and_the_decorator_pass_data_on(sync_provider: Any, key: str) -> None:
    with sync_provider.hold(key, ttl_ms=5_000, data={"job": 7}) as lease:
        assert sync_provider.get_lease(key).data == {"job": 7}
        assert lease.transfer_to("next", data={"job": 8})
    assert sync_provider.get_lease(key).data == {"job": 8}

    @leased(sync_provider, f"{key}:d", ttl_ms=5_000, data={"task": "report"})
    def job() -> Any:
        return sync_provider.get_lease(f"{key}:d").data

    assert job() == {"task": "report"}
    with pytest.raises(TypeError):
        leased(sync_provider, f"{key}:d", data={"task": ("tuple",)})

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(sync_provider.acquire_lease_wait, key, "waiter", 5_000, 10, data={"w": 1})
        time.sleep(0.1)
        assert not waiting.done()
        assert sync_provider.release_lease(key, "next")
        assert waiting.result().acquired  # woken by the release (NOTIFY on PostgreSQL)
    assert sync_provider.get_lease(key).data == {"w": 1}


class _OldContractProvider:
    """A third-party provider written to the contract before lease data: no ``data`` anywhere."""

    def __init__(self, leases: Any = None) -> None:
        self.leases = leases or InMemoryLeaseProvider()

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> AcquireResult:
        return await self.leases.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.leases.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> bool:
        return await self.leases.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int | float) -> bool:
        return await self.leases.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int | float) -> bool:
        return await self.leases.transfer_lease(key, from_owner, to_owner, ttl_ms)


async def test_providers_without_data_still_qualify_and_serve_hold(key: str) -> None:
    old = _OldContractProvider()
    assert is_lease_provider(old) and isinstance(old, LeaseProvider)
    async with hold(old, key, "a", ttl_ms=5_000) as lease:
        assert await lease.transfer_to("b")
    from sql_lease.holding import acquire_lease_wait

    assert (await acquire_lease_wait(old, f"{key}:2", "c", 5_000, 1)).acquired

    @leased(old, f"{key}:3", ttl_ms=5_000)
    async def job() -> str | None:
        return await old.get_lease_owner(f"{key}:3")

    assert (await job()) is not None
    with pytest.raises(TypeError, match="data"):  # asked for data it cannot store: said so
        async with hold(old, f"{key}:4", "d", data={"x": 1}):
            pass


# -- the migration that adds the column ------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def old_schema(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlLeaseProvider]:
    """A provider on a database no other test uses, with nothing migrated yet."""
    if request.param == "sqlite":
        sqlite3.connect(tmp_path / "old.db").close()
        made = SqlLeaseProvider(f"sqlite:///{tmp_path}/old.db")
    else:
        made = SqlLeaseProvider(request.getfixturevalue("pg_url"), schema=request.getfixturevalue("fresh_pg_schema"))
    yield made
    await made.close()


async def _migrate_to(provider: SqlLeaseProvider, revision: str) -> None:
    from alembic import command

    from sql_lease.sql.migrate import alembic_config

    def upgrade(connection: Any) -> None:
        command.upgrade(alembic_config(provider.names, connection=connection), revision)

    async with provider.engine.begin() as conn:
        await conn.run_sync(upgrade)


class _PreviousRelease(_OldContractProvider):
    """Holders running the release before lease data: its acquire names no ``data`` column (the
    statement below); its renew and release statements are this release's, unchanged."""

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int | float) -> AcquireResult:
        p, names = self.leases, self.leases.names
        if p.dialect_name == "postgresql":
            sql = (
                f'INSERT INTO "{names.schema}".{names.table} (key, owner, fence, expires_at) '
                f"VALUES ($1, $2, nextval('\"{names.schema}\".{names.fence_sequence}'), "
                "now() + $3::float8 * interval '1 millisecond') RETURNING fence, expires_at"
            )
        else:
            sql = (
                f"INSERT INTO {names.table} (key, owner, fence, expires_at) VALUES (?1, ?2, "
                f"(SELECT last_fence + 1 FROM {names.fence_counter}), "
                "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3) RETURNING fence, expires_at"
            )

        def plan() -> Any:
            return (yield Query(sql, (key, owner, ttl_ms)))

        row = await p._executor.run(plan)
        return AcquireResult(True, owner, row[0], p.statements.to_datetime(row[1]), float(ttl_ms))

    async def renew_lease_info(self, key: str, owner: str, ttl_ms: int | float) -> LeaseInfo | None:
        return await self.leases.renew_lease_info(key, owner, ttl_ms)

    async def renew_many(self, items: Any) -> dict[str, LeaseInfo]:
        return await self.leases.renew_many(items)


@pytest.mark.parametrize("revision", ["0001", "0002", "0003"])
async def test_migrating_under_live_holders_loses_no_lease(old_schema: SqlLeaseProvider, revision: str) -> None:
    await _migrate_to(old_schema, revision)
    previous = _PreviousRelease(old_schema)
    keys = [f"live:{i}" for i in range(4)]
    async with contextlib.AsyncExitStack() as stack:
        held = [
            await stack.enter_async_context(hold(previous, key, f"holder-{i}", ttl_ms=1_500, renew_every_ms=150))
            for i, key in enumerate(keys)
        ]
        await asyncio.sleep(0.2)
        assert await old_schema.migrate() == HEAD_REVISION
        migrated = {lease.key: lease.expires_at for lease in held}
        await asyncio.sleep(0.6)  # four renewal intervals after the migration
        for lease in held:
            assert not lease.lost.is_set(), lease.lost_reason
            assert lease.expires_at is not None and lease.expires_at > migrated[lease.key]  # still renewing
            info = await old_schema.get_lease(lease.key)
            assert info is not None and (info.owner, info.fence, info.data) == (lease.owner, lease.fence, None)
        assert [info.key for info in await old_schema.list_leases(prefix="live:")] == keys
    assert await old_schema.list_leases(prefix="live:") == []  # released by their holders
    assert (await old_schema.acquire_lease("new", "o", 5_000, data={"after": revision})).acquired
    assert (await old_schema.get_lease("new")).data == {"after": revision}  # type: ignore[union-attr]


async def test_new_code_on_an_old_schema_names_the_migrate_command(old_schema: SqlLeaseProvider) -> None:
    await _migrate_to(old_schema, "0002")
    await _PreviousRelease(old_schema).acquire_lease("old", "o", 60_000)
    calls: list[Callable[[], Any]] = [
        lambda: old_schema.acquire_lease("k", "o", 1_000),
        lambda: old_schema.get_lease("old"),
        lambda: old_schema.list_leases(),
        lambda: old_schema.transfer_lease("old", "o", "p", 1_000),
    ]
    for call in calls:
        with pytest.raises(SchemaMissingError, match=r"older than this sql_lease.*run `sql-lease migrate --url URL"):
            await call()
    url = str(old_schema.engine.url.render_as_string(hide_password=False))
    with (
        SyncSqlLeaseProvider(url, schema=old_schema.names.schema) as sync,
        pytest.raises(SchemaMissingError, match="sql-lease migrate"),
    ):
        sync.acquire_lease("k", "o", 1_000)
    await old_schema.migrate()
    info = await old_schema.get_lease("old")  # the row of the previous release is still held
    assert info is not None and info.owner == "o" and info.data is None


# -- data another writer stored badly (issue 20 item 14) ----------------------------------------------

DEEP = '{"a": ' + "[" * 3000 + "]" * 3000 + "}"
BAD_STORED = {  # key suffix -> (SQL literal text, backends that can store it)
    "deep": (DEEP, ("sqlite", "postgres")),
    "huge": ('{"x": 1e400}', ("sqlite", "postgres")),
    "list": ("[1, 2]", ("sqlite", "postgres")),
    "invalid": ('{"a": ', ("sqlite",)),
    "nan": ('{"x": NaN}', ("sqlite",)),
    "bytes": (b"\xff\xfe{}", ("sqlite",)),
}


def _store_badly(kind: str, url: str, schema: str | None, key: str, value: str | bytes) -> None:
    """Overwrite the data of the row of ``key`` as another writer might."""
    if kind == "sqlite":
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn, conn:
            conn.execute("UPDATE sql_leases SET data = ? WHERE key = ?", (value, key))
        return
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(f'UPDATE "{schema}".sql_leases SET data = %s::json WHERE key = %s', (value, key))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def bad_rows(request: pytest.FixtureRequest, tmp_path: Path, key: str) -> dict[str, Any]:
    """A migrated database with a good lease ``<key>:good`` and one badly stored one per case."""
    if request.param == "sqlite":
        url, schema = f"sqlite:///{tmp_path}/bad.db", None
    else:
        url, schema = request.getfixturevalue("pg_schema")
    with SyncSqlLeaseProvider(url, schema=schema) as leases:
        leases.migrate()
        assert leases.acquire_lease(f"{key}:good", "o", 60_000, data={"ok": 1}).acquired
        cases = [name for name, (_, kinds) in BAD_STORED.items() if request.param in kinds]
        for name in cases:
            assert leases.acquire_lease(f"{key}:{name}", "o", 60_000, data={"was": "fine"}).acquired
            _store_badly(request.param, url, schema, f"{key}:{name}", BAD_STORED[name][0])
    return {"kind": request.param, "url": url, "schema": schema, "cases": cases}


def _check_unreadable(leases: list[LeaseInfo], key: str, cases: list[str]) -> None:
    from sql_lease.contract import UnreadableData

    by_key = {lease.key: lease for lease in leases}
    assert by_key[f"{key}:good"].data == {"ok": 1}
    for name in cases:
        data = by_key[f"{key}:{name}"].data
        assert isinstance(data, UnreadableData) and data.reason, (name, data)
        assert list(data) == ["sql_lease_unreadable"]


def test_badly_stored_data_reads_as_unreadable_sync(bad_rows: dict[str, Any], key: str) -> None:
    with SyncSqlLeaseProvider(bad_rows["url"], schema=bad_rows["schema"]) as leases:
        _check_unreadable(leases.list_leases(prefix=key), key, bad_rows["cases"])
        for name in bad_rows["cases"]:
            lease = leases.get_lease(f"{key}:{name}")
            assert lease is not None and "sql_lease_unreadable" in (lease.data or {})


async def test_badly_stored_data_reads_as_unreadable_async(bad_rows: dict[str, Any], key: str) -> None:
    async with SqlLeaseProvider(bad_rows["url"], schema=bad_rows["schema"]) as leases:
        _check_unreadable(await leases.list_leases(prefix=key), key, bad_rows["cases"])
        lease = await leases.get_lease(f"{key}:{bad_rows['cases'][0]}")
        assert lease is not None and "sql_lease_unreadable" in (lease.data or {})


def test_badly_stored_data_in_the_cli_is_shown_unreadable_as_strict_json(
    bad_rows: dict[str, Any], key: str, tmp_path: Path
) -> None:
    import json

    from tests.test_cli import run_cli

    args = ["--url", bad_rows["url"], *(["--schema", bad_rows["schema"]] if bad_rows["schema"] else [])]
    listed = run_cli(["list", "--prefix", key, "--json", *args], tmp_path)
    assert listed.returncode == 0, listed.stderr

    def strict(name: str) -> None:
        raise ValueError(f"{name} in --json output")

    rows = json.loads(listed.stdout, parse_constant=strict)
    assert {row["key"] for row in rows} == {f"{key}:good", *(f"{key}:{name}" for name in bad_rows["cases"])}
    for row in rows:
        assert row["data"] == {"ok": 1} or set(row["data"]) == {"sql_lease_unreadable"}
    table = run_cli(["list", "--prefix", key, *args], tmp_path)
    assert table.returncode == 0 and "sql_lease_unreadable" in table.stdout, table.stderr
    for name in bad_rows["cases"]:
        shown = run_cli(["show", f"{key}:{name}", "--json", *args], tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert set(json.loads(shown.stdout, parse_constant=strict)["data"]) == {"sql_lease_unreadable"}


def test_decode_data_marks_what_it_cannot_read() -> None:
    from sql_lease.contract import UnreadableData, decode_data

    assert decode_data('{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    assert decode_data(None) is None
    for text in (DEEP, '{"x": 1e400}', '{"x": -Infinity}', "[1]", '"x"', "{", b"{}", '{"n": ' + "9" * 5000 + "}"):
        assert isinstance(decode_data(text), UnreadableData), text


async def test_a_semaphore_on_a_table_at_0005_says_the_table_is_older(old_schema: SqlLeaseProvider) -> None:
    await _migrate_to(old_schema, "0005")
    assert (await old_schema.acquire_lease("plain", "o", 60_000)).acquired  # plain leases work at 0005
    with pytest.raises(SchemaMissingError, match=r"older than this sql_lease.*run `sql-lease migrate --url URL"):
        await old_schema.acquire_lease("sem", "o", 60_000, limit=2)


async def test_a_semaphore_on_a_table_at_0006_says_the_table_is_older(old_schema: SqlLeaseProvider) -> None:
    """SQLite's one-statement slot operations need 0007 (its triggers keep the head exact): at 0006 a
    semaphore call fails before writing, plain leases work; PostgreSQL needs nothing of 0007."""
    await _migrate_to(old_schema, "0006")
    assert (await old_schema.acquire_lease("plain", "o", 60_000)).acquired  # plain leases work at 0006
    assert not await old_schema.release_lease("plain", "other")  # a plain "no" stays a "no" at 0006
    assert not await old_schema.release_lease("never held", "o", min_hold_ms=1_000)
    assert await old_schema.release_lease("plain", "o")
    assert not await old_schema.release_lease("plain", "o")
    if old_schema.engine.dialect.name != "sqlite":
        assert (await old_schema.acquire_lease("sem", "o", 60_000, limit=2)).acquired
        return
    with pytest.raises(SchemaMissingError, match=r"older than this sql_lease.*run `sql-lease migrate --url URL"):
        await old_schema.acquire_lease("sem", "o", 60_000, limit=2)
    assert await old_schema.get_lease_holders("sem") == []  # nothing written
    assert await old_schema.migrate() == HEAD_REVISION
    assert (await old_schema.acquire_lease("sem", "o", 60_000, limit=2)).acquired
    assert [holder.owner for holder in await old_schema.get_lease_holders("sem")] == ["o"]
