"""The SQL in sql_lease/sql/dialects/*.py is what the drivers run, and nothing there is dead.

Each statement is a constant written out whole; the table names are the only substitution. These
tests run every operation in every variant on SQLite and PostgreSQL and compare the statements the
driver was given with the constants (after that substitution), check that every constant is sent
by some operation, and that every dialect answers the same statement names in every variant.
"""

from __future__ import annotations

import asyncio
import string
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import create_engine, event
from sqlalchemy.ext.asyncio import create_async_engine

from sql_lease import SqlLeaseProvider, StaleFenceError, SyncSqlLeaseProvider
from sql_lease.sql import setup as lease_setup
from sql_lease.sql.dialects import STATEMENT_NAMES, VARIANTS, dialect_module, mysql, postgresql, sqlite
from sql_lease.sql.schema import LeaseTableNames
from sql_lease.sql.statements import filled_texts, placeholder_values
from sql_lease.sql.urls import to_async_url, to_sync_url
from tests.conftest import run_in_own_loop

DIALECTS = ("postgresql", "sqlite", "mysql")
TTL = 60_000


def statement_constants(module: ModuleType) -> dict[str, str]:
    """The statement constants of a dialect module: every upper-case ``str`` but the clock fragment."""
    return {
        name: value
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and name not in ("NOW_MS",)
    }


def fields(text: str) -> set[str]:
    """The ``{placeholder}`` names of ``text`` (``ValueError`` for a stray brace)."""
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


# -- the texts themselves (no database) ------------------------------------------------------------


@pytest.mark.parametrize("dialect_name", DIALECTS)
def test_every_dialect_answers_the_same_statement_names_in_every_variant(dialect_name: str) -> None:
    module = dialect_module(dialect_name)
    absent = {name for name, text in module.texts(**VARIANTS[0]).items() if text is None}
    for variant in VARIANTS:
        texts = module.texts(**variant)
        assert tuple(texts) == STATEMENT_NAMES, variant
        assert {name for name, text in texts.items() if text is None} == absent, variant
    assert absent <= {"notify_channel"}  # only SQLite lacks one: it has no LISTEN


@pytest.mark.parametrize("dialect_name", DIALECTS)
def test_each_constant_is_the_text_of_some_operation_and_fills_only_the_table_names(dialect_name: str) -> None:
    module = dialect_module(dialect_name)
    constants = statement_constants(module)
    chosen = {text for variant in VARIANTS for text in module.texts(**variant).values() if text is not None}
    chosen |= set(module.steps().values()) if hasattr(module, "steps") else set()  # MySQL's transactions
    chosen |= {text for variant in VARIANTS for text in module.slot_steps(**variant).values()}
    chosen.discard(None)
    setup = set(getattr(module, "SESSION_SETUP", ()))
    assert set(constants.values()) == chosen | setup
    used: set[str] = set()
    for name, text in constants.items():
        assert fields(text) <= set(module.PLACEHOLDERS), name
        used |= fields(text)
    assert used == set(module.PLACEHOLDERS)


def test_the_placeholders_are_the_quoted_table_names() -> None:
    names = LeaseTableNames("my_t", "my_schema")
    assert placeholder_values("postgresql", names) == {
        "table": '"my_schema"."my_t"',
        "table_literal": '\'"my_schema"."my_t"\'',
        "fence_sequence_literal": '\'"my_schema"."my_t_fence_seq"\'',
        "fence_table": '"my_schema"."my_t_fences"',
        "slot_table": '"my_schema"."my_t_slots"',
        "slot_acquire_function": '"my_schema"."my_t_slot_acquire"',
        "slot_release_function": '"my_schema"."my_t_slot_release"',
    }
    assert placeholder_values("sqlite", LeaseTableNames()) == {
        "table": '"sql_leases"',
        "fence_counter": '"sql_leases_fence"',
        "fence_table": '"sql_leases_fences"',
        "slot_table": '"sql_leases_slots"',
        "slot_live_index": "ix_sql_leases_slots_live",
    }
    filled = filled_texts("postgresql", names, durable_session=True)
    assert filled["owner"] == (
        'SELECT owner FROM "my_schema"."my_t" WHERE key = $1 AND expires_at + interval \'0\' > now()'
    )
    with pytest.raises(ValueError, match="oracle"):
        filled_texts("oracle", names)


# -- what the drivers are given --------------------------------------------------------------------


class Seen:
    """The statement constants a run sent, by their name in the dialect module."""

    def __init__(self, dialect_name: str, names: LeaseTableNames) -> None:
        self.module = dialect_module(dialect_name)
        values = placeholder_values(dialect_name, names)
        constants = statement_constants(self.module)
        self.name_of = {text: name for name, text in constants.items()}
        assert len(self.name_of) == len(constants)  # no two constants alike
        self.constant_of = {text.format_map(values): name for name, text in constants.items()}
        self.names: set[str] = set()
        self.strays: list[str] = []

    def statement(self, sql: str, _params: object = None) -> None:
        """A statement the provider sent: it must be one of the constants, filled."""
        if sql in self.constant_of:
            self.names.add(self.constant_of[sql])
        else:
            self.strays.append(sql)

    def driver(self, sql: str) -> None:
        """A statement seen at the driver (beside its own catalogue queries): kept if a constant."""
        if sql in self.constant_of:
            self.names.add(self.constant_of[sql])

    def expected(self, variant: dict[str, bool], without: tuple[str, ...] = ()) -> set[str]:
        """The constants ``variant``'s operations send, less the operations named in ``without``."""
        texts = self.module.texts(**variant)
        slots = self.module.slot_steps(**variant)
        texts = {**texts, **{name: text for name, text in slots.items() if name not in texts}}
        if "acquire_waiting" in without:  # no LISTEN: no waiter flags a head, no release wakes one
            without = (*without, "slot_flag", "slot_wake")
        return {self.name_of[text] for name, text in texts.items() if text is not None and name not in without}


def fence_capture(sync_engine: Any, seen: Seen) -> None:
    """Record the ``text()`` each statement on ``sync_engine`` was given (check_held, accept_fence)."""

    @event.listens_for(sync_engine, "before_execute")
    def before_execute(_conn: Any, clause: Any, *_args: Any) -> None:
        seen.statement(clause.text)


async def exercise_async(provider: SqlLeaseProvider, engine: Any, prefix: str) -> None:
    """Every operation of the async face, each path once."""
    key, other = f"{prefix}:a", f"{prefix}:b"
    assert await provider.acquire_lease(key, "alice", TTL)  # new
    assert await provider.acquire_lease(key, "alice", TTL, data={"job": 1})  # own
    assert not await provider.acquire_lease(key, "bob", TTL)  # refused
    waiter = provider.release_waiter(key)
    if waiter is not None:  # PostgreSQL with LISTEN: a refusal that flags the row
        async with waiter:
            assert not await waiter.acquire("bob", TTL)
    short = await provider.acquire_lease(other, "carol", 1)  # expires at once (by the database's clock)
    await asyncio.sleep(max(0.0, short.remaining_ms or 0.0) / 1000 + 0.01)
    assert (await provider.acquire_lease(other, "dave", TTL)).owner == "dave"  # takeover
    assert await provider.renew_lease(key, "alice", TTL)
    assert set(await provider.renew_many([(key, "alice", TTL), (other, "dave", TTL)])) == {key, other}
    assert await provider.get_lease(other) is not None
    assert await provider.get_lease_owner(key) == "alice"
    assert [lease.key for lease in await provider.list_leases(prefix=prefix)] == [key, other]
    assert await provider.list_leases(limit=1)
    held = await provider.acquire_lease(key, "alice", TTL)
    async with engine.begin() as conn:
        await provider.check_held(conn, key, "alice", held.fence)
        assert await provider.accept_fence(conn, f"{prefix}:resource", held.fence + 1) == held.fence + 1
    async with engine.begin() as conn:
        with pytest.raises(StaleFenceError):
            await provider.accept_fence(conn, f"{prefix}:resource", held.fence)
    assert await provider.transfer_lease(key, "alice", "erin", TTL)
    assert await provider.release_lease(key, "erin")
    assert await provider.break_lease(other) is not None
    kept = await provider.acquire_lease(other, "frank", TTL)
    assert await provider.release_lease(other, "frank", fence=kept.fence, min_hold_ms=TTL)  # kept
    several = [f"{prefix}:c", f"{prefix}:d"]
    assert all(await provider.acquire_leases(several, "gina", TTL))  # granted
    assert not any(await provider.acquire_leases([*several, f"{prefix}:e"], "hal", TTL))  # refused: holders read
    assert await provider.renew_leases(several, "gina", TTL) == [True, True]
    assert await provider.release_leases(several, "gina") == 2
    lapsing = await provider.acquire_leases(several, "ivy", 1)
    await asyncio.sleep(max(0.0, lapsing[0].remaining_ms or 0.0) / 1000 + 0.01)
    assert all(await provider.acquire_leases(several, "jay", TTL))  # expired keys taken over
    assert await provider.acquire_lease(key, "alice", 1)
    assert (await provider.acquire_lease(f"{prefix}:lapsing", "kim", 1, limit=2)).acquired  # a slot to sweep
    await asyncio.sleep(0.01)
    assert await provider.sweep_expired(grace_ms=0) >= 0
    await exercise_semaphore_async(provider, engine, f"{prefix}:sem")


async def exercise_semaphore_async(provider: SqlLeaseProvider, engine: Any, key: str) -> None:
    """Every statement of semaphores on the async face, each path once."""
    short = await provider.acquire_lease(key, "plain", 1)  # an expired plain lease becomes a head
    await asyncio.sleep(max(0.0, short.remaining_ms or 0.0) / 1000 + 0.01)
    first = await provider.acquire_lease(key, "a", TTL, limit=2)
    assert first.acquired and (await provider.acquire_lease(key, "a", TTL, limit=2)).fence == first.fence
    assert (await provider.acquire_lease(key, "b", TTL, limit=2)).acquired
    assert (await provider.acquire_lease(key, "c", TTL, limit=2)).owner == "a"  # refused, oldest named
    assert (await provider.acquire_lease(key, "c", TTL)).owner == "a"  # a plain acquire refused too
    waiter = provider.release_waiter(key)
    if waiter is not None:
        async with waiter:
            assert not await waiter.acquire("c", TTL, limit=2)
    assert [h.owner for h in await provider.get_lease_holders(key)] == ["a", "b"]
    assert await provider.renew_lease(key, "a", TTL)
    assert key in await provider.renew_many([(key, "b", TTL)])
    async with engine.begin() as conn:
        await provider.check_held(conn, key, "a", first.fence)
    assert await provider.transfer_lease(key, "b", "d", TTL)
    assert await provider.transfer_lease(key, "d", "d", TTL)  # to itself: its slot renewed
    assert await provider.release_lease(key, "a", min_hold_ms=TTL)  # kept
    assert await provider.release_lease(key, "d")
    assert len(await provider.list_leases(prefix=key, include_expired=True)) == 1
    failing = provider.statements.slots["slot_state"]

    def fail_once(sql: str, _params: object) -> None:
        if sql == failing:
            remove()
            raise RuntimeError("a statement failed inside a slot transaction")

    remove = provider.on_statement(fail_once)
    with pytest.raises(Exception, match="failed inside"):  # rolled back
        await provider.transfer_lease(key, "a", "e", TTL)
    assert (await provider.break_lease(key)) is not None
    assert (await provider.acquire_lease(key, "f", TTL, limit=2)).acquired  # a key without a row: a new head


def exercise_sync(provider: SyncSqlLeaseProvider, engine: Any, prefix: str) -> None:
    """Every operation of the sync face, each path once."""
    key, other = f"{prefix}:a", f"{prefix}:b"
    assert provider.acquire_lease(key, "alice", TTL)
    assert provider.acquire_lease(key, "alice", TTL, data={"job": 1})
    assert not provider.acquire_lease(key, "bob", TTL)
    waiter = provider.release_waiter(key)
    if waiter is not None:
        with waiter:
            assert not waiter.acquire("bob", TTL, timeout_s=10)
    short = provider.acquire_lease(other, "carol", 1)
    time.sleep(max(0.0, short.remaining_ms or 0.0) / 1000 + 0.01)
    assert provider.acquire_lease(other, "dave", TTL).owner == "dave"
    assert provider.renew_lease(key, "alice", TTL)
    assert provider.get_lease(other) is not None
    assert provider.get_lease_owner(key) == "alice"
    assert [lease.key for lease in provider.list_leases(prefix=prefix)] == [key, other]
    assert provider.list_leases(limit=1)
    held = provider.acquire_lease(key, "alice", TTL)
    with engine.begin() as conn:
        provider.check_held(conn, key, "alice", held.fence)
        assert provider.accept_fence(conn, f"{prefix}:resource", held.fence + 1) == held.fence + 1
    with engine.begin() as conn, pytest.raises(StaleFenceError):
        provider.accept_fence(conn, f"{prefix}:resource", held.fence)
    assert provider.transfer_lease(key, "alice", "erin", TTL)
    assert provider.release_lease(key, "erin")
    assert provider.break_lease(other) is not None
    kept = provider.acquire_lease(other, "frank", TTL)
    assert provider.release_lease(other, "frank", fence=kept.fence, min_hold_ms=TTL)  # kept
    several = [f"{prefix}:c", f"{prefix}:d"]
    assert all(provider.acquire_leases(several, "gina", TTL))
    assert not any(provider.acquire_leases([*several, f"{prefix}:e"], "hal", TTL))
    assert provider.renew_leases(several, "gina", TTL) == [True, True]
    assert provider.release_leases(several, "gina") == 2
    assert provider.acquire_lease(key, "alice", 1)
    assert provider.acquire_lease(f"{prefix}:lapsing", "kim", 1, limit=2).acquired  # a slot to sweep
    time.sleep(0.01)
    assert provider.sweep_expired(grace_ms=0) >= 0
    exercise_semaphore_sync(provider, engine, f"{prefix}:sem")


def exercise_semaphore_sync(provider: SyncSqlLeaseProvider, engine: Any, key: str) -> None:
    """Every statement of semaphores on the sync face, each path once."""
    short = provider.acquire_lease(key, "plain", 1)
    time.sleep(max(0.0, short.remaining_ms or 0.0) / 1000 + 0.01)
    first = provider.acquire_lease(key, "a", TTL, limit=2)
    assert first.acquired and provider.acquire_lease(key, "a", TTL, limit=2).fence == first.fence
    assert provider.acquire_lease(key, "b", TTL, limit=2).acquired
    assert provider.acquire_lease(key, "c", TTL, limit=2).owner == "a"
    assert provider.acquire_lease(key, "c", TTL).owner == "a"
    waiter = provider.release_waiter(key)
    if waiter is not None:
        with waiter:
            assert not waiter.acquire("c", TTL, timeout_s=10, limit=2)
    assert [h.owner for h in provider.get_lease_holders(key)] == ["a", "b"]
    assert provider.renew_lease(key, "a", TTL)
    with engine.begin() as conn:
        provider.check_held(conn, key, "a", first.fence)
    assert provider.transfer_lease(key, "b", "d", TTL)
    assert provider.transfer_lease(key, "d", "d", TTL)
    assert provider.release_lease(key, "a", min_hold_ms=TTL)
    assert provider.release_lease(key, "d")
    assert len(provider.list_leases(prefix=key, include_expired=True)) == 1
    failing = provider.statements.slots["slot_state"]

    def fail_once(sql: str, _params: object) -> None:
        if sql == failing:
            remove()
            raise RuntimeError("a statement failed inside a slot transaction")

    remove = provider.on_statement(fail_once)
    with pytest.raises(Exception, match="failed inside"):
        provider.transfer_lease(key, "a", "e", TTL)
    assert provider.break_lease(key) is not None
    assert provider.acquire_lease(key, "f", TTL, limit=2).acquired


@pytest.fixture
def asyncpg_statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[str], None]]]:
    """Listeners called with every query asyncpg's ``execute``/``fetchval`` is given (connection
    setup, the LISTEN channel), beside the statements the provider's hook sees."""
    import asyncpg

    listeners: list[Callable[[str], None]] = []
    for method in ("execute", "fetchval"):
        original = getattr(asyncpg.Connection, method)

        def wrapped(self: Any, query: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            for listener in listeners:
                listener(query)
            return _original(self, query, *args, **kwargs)

        monkeypatch.setattr(asyncpg.Connection, method, wrapped)
    yield listeners


VARIANT = {
    "session": {"durable_session": True, "durable_release": False},
    "session, durable release": {"durable_session": True, "durable_release": True},
    "pinned": {"durable_session": False, "durable_release": False},
    "pinned, durable release": {"durable_session": False, "durable_release": True},
}


@pytest.mark.postgres
def test_postgres_sends_each_statement_as_written(
    pg_schema: tuple[str, str], asyncpg_statements: list[Callable[[str], None]]
) -> None:
    url, schema = pg_schema
    names = LeaseTableNames(schema=schema)
    async_url = url.replace("postgresql://", "postgresql+asyncpg://")
    sent: set[str] = set()
    # (how the provider is made, its variant, operations it cannot run there)
    no_listen = ("acquire_waiting", "notify_channel")
    cases: list[tuple[str, dict[str, bool], tuple[str, ...]]] = [
        ("url", VARIANT["session"], ()),
        ("url durable_release", VARIANT["session, durable release"], ()),
        ("url pgbouncer", VARIANT["pinned"], no_listen),
        ("url pgbouncer durable_release", VARIANT["pinned, durable release"], no_listen),
        ("engine", VARIANT["pinned"], ()),
        ("engine durable_release", VARIANT["pinned, durable release"], ()),
    ]
    for case, variant, without in cases:
        seen = Seen("postgresql", names)

        async def run(case: str = case, seen: Seen = seen) -> None:
            engine = create_async_engine(async_url)
            fence_capture(engine.sync_engine, seen)
            given = engine if case.startswith("engine") else url
            provider = SqlLeaseProvider(
                given, schema=schema, pgbouncer="pgbouncer" in case, durable_release="durable_release" in case
            )
            provider.on_statement(seen.statement)
            asyncpg_statements[:] = [seen.driver]
            try:
                await exercise_async(provider, engine, f"texts:{uuid.uuid4().hex}")
            finally:
                asyncpg_statements[:] = []
                await provider.close()
                await engine.dispose()

        run_in_own_loop(run)
        assert seen.strays == [], case
        setup = {"SET_NO_SEQSCAN", "SET_DURABLE_SESSION"} if case in ("url", "url durable_release") else set()
        assert seen.names == seen.expected(variant, without) | setup, case
        sent |= seen.names
    for case, variant in [("sync url", VARIANT["session"]), ("sync url pgbouncer", VARIANT["pinned"])]:
        seen = Seen("postgresql", names)
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        fence_capture(engine, seen)
        with SyncSqlLeaseProvider(url, schema=schema, pgbouncer="pgbouncer" in case) as provider:
            provider.on_statement(seen.statement)
            exercise_sync(provider, engine, f"texts:{uuid.uuid4().hex}")
        engine.dispose()
        assert seen.strays == [], case
        # The sync face renews many leases only through renew_leases; its LISTEN channel query goes through psycopg.
        without = ("notify_channel",) + (no_listen if "pgbouncer" in case else ())
        assert seen.names == seen.expected(variant, without), case
    assert sent == set(statement_constants(postgresql))  # no dead text


def test_sqlite_sends_each_statement_as_written(tmp_path: Path) -> None:
    names = LeaseTableNames()
    url = f"sqlite:///{tmp_path}/texts.db"
    with SyncSqlLeaseProvider(url) as migrating:
        migrating.migrate()
    seen = Seen("sqlite", names)

    async def run() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/texts.db")
        fence_capture(engine.sync_engine, seen)
        async with SqlLeaseProvider(url) as provider:
            provider.on_statement(seen.statement)
            await exercise_async(provider, engine, "async")
        await engine.dispose()

    run_in_own_loop(run)
    assert seen.strays == []
    assert seen.names == seen.expected(VARIANT["session"])
    assert seen.names == set(statement_constants(sqlite))  # no dead text

    synced = Seen("sqlite", names)
    engine = create_engine(f"sqlite:///{tmp_path}/texts.db")
    fence_capture(engine, synced)
    with SyncSqlLeaseProvider(url) as provider:
        provider.on_statement(synced.statement)
        exercise_sync(provider, engine, "sync")
    engine.dispose()
    assert synced.strays == []
    assert synced.names == synced.expected(VARIANT["session"])


@pytest.mark.mysql
def test_mysql_sends_each_statement_as_written(mysql_db: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both faces on MySQL/MariaDB: every statement sent is a constant of ``dialects/mysql.py``
    (filled), and every constant is sent by some operation (the session setup at connect)."""
    url, schema = mysql_db
    names = LeaseTableNames(schema=schema)
    seen = Seen("mysql", names)
    async_url = to_async_url(url).render_as_string(hide_password=False)
    sync_url = to_sync_url(url).render_as_string(hide_password=False)

    async def run() -> None:
        engine = create_async_engine(async_url)
        fence_capture(engine.sync_engine, seen)
        async with SqlLeaseProvider(url, schema=schema) as provider:
            provider.on_statement(seen.statement)
            await exercise_async(provider, engine, f"texts:{uuid.uuid4().hex}")
        async with SqlLeaseProvider(engine, schema=schema) as on_engine:  # step by step, no packets
            on_engine.on_statement(seen.statement)
            key = f"texts:{uuid.uuid4().hex}"
            assert (await on_engine.acquire_lease(key, "a", 10_000)).acquired
            assert await on_engine.renew_lease_info(key, "a", 10_000) is not None
            assert key in await on_engine.renew_many([(key, "a", 10_000)])
            pair = [f"{key}:x", f"{key}:y"]
            assert all(await on_engine.acquire_leases(pair, "a", 10_000))  # rows locked NOWAIT on an engine
            assert all(await on_engine.acquire_leases(pair, "a", 10_000))  # the owner's tenures extended
        aiomysql_url = to_async_url(url).set(drivername="mysql+aiomysql").render_as_string(hide_password=False)
        async with SqlLeaseProvider(aiomysql_url, schema=schema) as stepwise:  # its own engine: step by step
            stepwise.on_statement(seen.statement)
            assert all(await stepwise.acquire_leases([f"{key}:z"], "a", 10_000))  # rows locked, waiting
        await engine.dispose()

    run_in_own_loop(run)
    assert seen.strays == []
    synced = Seen("mysql", names)
    engine = create_engine(sync_url)
    fence_capture(engine, synced)
    with SyncSqlLeaseProvider(url, schema=schema) as provider:
        provider.on_statement(synced.statement)
        exercise_sync(provider, engine, f"texts:{uuid.uuid4().hex}")
        key = f"texts:{uuid.uuid4().hex}"
        assert provider.acquire_lease(key, "a", 50).acquired
        time.sleep(0.1)
        assert not provider.release_lease(key, "a")  # expired: deleted all the same (release_expired)
        assert provider.acquire_lease(key, "a", 50).acquired
        time.sleep(0.1)
        with engine.begin() as conn:  # an expired lease whose row another transaction locks
            conn.exec_driver_sql(f"SELECT * FROM `{schema}`.sql_leases WHERE `key` = %s FOR UPDATE", (key,))
            assert not provider.acquire_lease(key, "b", 10_000, timeout_s=1).acquired  # NOWAIT, rolled back
        # an application's engine runs the acquire step by step (no multi-statement packets)
        with SyncSqlLeaseProvider(engine, schema=schema) as on_engine:
            on_engine.on_statement(synced.statement)
            key = f"texts:{uuid.uuid4().hex}"
            assert on_engine.acquire_lease(key, "a", 50).acquired  # a new row, its fence set after the insert
            time.sleep(0.1)
            assert on_engine.acquire_lease(key, "b", 10_000).acquired  # an expired lease taken over
            assert on_engine.acquire_lease(key, "b", 10_000).acquired  # the owner's tenure extended
            # a semaphore's slot step by step: a head made for a new key, an expired plain lease made a head
            assert on_engine.acquire_lease(f"{key}:slots", "a", 10_000, limit=2).acquired
            assert on_engine.acquire_lease(f"{key}:slots", "b", 10_000, limit=2).acquired
            assert on_engine.acquire_lease(f"{key}:expired", "a", 50).acquired
            assert on_engine.acquire_lease(f"{key}:gone", "a", 50).acquired
            time.sleep(0.1)
            assert on_engine.acquire_lease(f"{key}:expired", "b", 10_000, limit=2).acquired
            # releases step by step: a plain lease kept, one deleted, an expired one; a slot kept, one deleted
            assert not on_engine.release_lease(f"{key}:gone", "a")
            assert on_engine.acquire_lease(f"{key}:kept", "a", 10_000).acquired
            assert on_engine.release_lease(f"{key}:kept", "a", min_hold_ms=60_000)
            assert on_engine.release_lease(key, "b")
            assert on_engine.release_lease(f"{key}:slots", "a", min_hold_ms=60_000)
            assert on_engine.release_lease(f"{key}:slots", "b")
    engine.dispose()
    original = lease_setup.mysql_session_setup
    step_by_two = "SET SESSION auto_increment_increment = 2"  # as lock mode 2: no fences drawn in bulk
    monkeypatch.setattr(lease_setup, "mysql_session_setup", lambda s: (*original(s), step_by_two))
    with SyncSqlLeaseProvider(url, schema=schema) as stepping:  # the all-or-nothing acquire a packet per step
        stepping.on_statement(synced.statement)
        pair = [f"texts:{uuid.uuid4().hex}:{name}" for name in ("p", "q")]
        assert all(stepping.acquire_leases(pair, "a", 50))
        time.sleep(0.1)
        assert all(stepping.acquire_leases(pair, "b", 10_000))  # expired keys taken over
    assert synced.strays == []
    setup = set(mysql.SESSION_SETUP)
    sent = {mysql.__dict__[name] for name in seen.names | synced.names}
    assert sent | setup == set(statement_constants(mysql).values())  # no dead text
