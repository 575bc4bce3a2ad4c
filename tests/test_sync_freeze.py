"""The synchronous face when its PostgreSQL or MariaDB freezes (SIGSTOP) or the link to it is partitioned: every
operation raises at its deadline, and no call made to enforce that deadline stalls the process (a C
call that blocks holding the GIL would freeze every thread, the holder's clock included).

The faults hit processes these tests start themselves: a throwaway cluster or MariaDB server and a
TCP proxy in a process of its own (stopping it partitions the link). Never the shared servers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy.engine import make_url

from sql_lease import LeaseBackendError, SyncSqlLeaseProvider
from tests.support.freeze import Ticker, cluster_pids, frozen, proxy_process
from tests.support.mariadbserver import MariadbServer, throwaway_mariadb
from tests.support.pgserver import throwaway_postgres

TIMEOUT_S = 1.0
MARGIN_S = 0.75  # past the deadline, for a loaded machine
MAX_STALL_S = 0.5  # the longest an unrelated thread may wait for the GIL


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, Any]]:
    """A throwaway cluster these tests may stop: (url, executor)."""
    with throwaway_postgres(log_min_messages="error") as started:
        yield started


@pytest.fixture
def schema(cluster: tuple[str, Any]) -> str:
    name = f"freeze_{uuid.uuid4().hex[:10]}"
    with SyncSqlLeaseProvider(cluster[0], schema=name) as provider:
        provider.migrate()
    return name


@pytest.fixture(scope="module")
def mariadb() -> Iterator[MariadbServer]:
    """A throwaway MariaDB server these tests may stop."""
    with throwaway_mariadb() as server:
        yield server


def frozen_target(backend: str, request: pytest.FixtureRequest) -> tuple[str, str, Callable[[], list[int]], Any]:
    """(url, a freshly migrated schema or database, what gives the server's pids to freeze (its
    processes now), its executor or None) of the module's throwaway PostgreSQL cluster or MariaDB server."""
    if backend == "postgres":
        url, executor = request.getfixturevalue("cluster")
        return url, request.getfixturevalue("schema"), lambda: cluster_pids(executor), executor
    server: MariadbServer = request.getfixturevalue("mariadb")
    database = f"freeze_{uuid.uuid4().hex[:10]}"
    server.execute(f"CREATE DATABASE `{database}`")
    with SyncSqlLeaseProvider(server.url, schema=database) as provider:
        provider.migrate()
    return server.url, database, lambda: [server.pid], None


def until_it_works(call: Callable[[], Any], within_s: float) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        try:
            return call()
        except LeaseBackendError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["server-frozen", "link-partitioned", "engine-server-frozen"])
@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("mysql", marks=pytest.mark.mysql)]
)
def test_sync_operations_raise_at_their_deadline_and_never_stall_other_threads(
    backend: str, fault: str, request: pytest.FixtureRequest
) -> None:
    url, schema, server_pids, executor = frozen_target(backend, request)
    key = f"k-{uuid.uuid4().hex[:8]}"
    address = make_url(url)
    with proxy_process(address.host or "127.0.0.1", address.port or 5432) as (proxy_port, proxy_pid):
        target: Any = address.set(port=proxy_port) if fault == "link-partitioned" else url
        if fault.startswith("engine"):
            # (a pool_pre_ping of an idle connection would wait as the engine's settings say)
            driver = "mysql+pymysql" if backend == "mysql" else "postgresql+psycopg"
            target = sqlalchemy.create_engine(address.set(drivername=driver))
        with SyncSqlLeaseProvider(target, schema=schema, operation_timeout_s=TIMEOUT_S, pool_size=3) as provider:
            # (its first connection, under the 1 s limit, can take longer on a loaded machine)
            assert until_it_works(lambda: provider.acquire_lease(key, "a", 60_000), 10.0).acquired
            pids = [proxy_pid] if fault == "link-partitioned" else server_pids()
            calls: list[tuple[str, Callable[[], Any]]] = [
                ("get_lease_owner", lambda: provider.get_lease_owner(key)),  # the pooled connection
                ("acquire", lambda: provider.acquire_lease(key + "x", "b", 60_000)),  # new connections
                ("renew", lambda: provider.renew_lease(key, "a", 60_000)),
                ("release", lambda: provider.release_lease(key, "a")),
            ]
            durations: dict[str, float] = {}
            outcomes: dict[str, str] = {}
            with Ticker() as ticker, frozen(pids, at_most_s=10):
                for name, call in calls:
                    started = time.monotonic()
                    try:
                        outcomes[name] = repr(call())
                    except LeaseBackendError:
                        outcomes[name] = "LeaseBackendError"
                    durations[name] = round(time.monotonic() - started, 3)
                # the pool's own connection attempts (begun at about TIMEOUT_S) end too: libpq's
                # connect_timeout, at least 2 s, set from operation_timeout_s (PostgreSQL's pool)
                connect_error: object = "the engine's own"
                if not fault.startswith("engine") and executor is not None:
                    connect_error = None
                    executor_ = provider._executor
                    connect_bound = time.monotonic() + 3.0
                    while executor_.last_connect_error is None and time.monotonic() < connect_bound:  # type: ignore[attr-defined]
                        time.sleep(0.05)
                    connect_error = executor_.last_connect_error  # type: ignore[attr-defined]
            print(
                f"\nFREEZE backend={backend} fault={fault} durations={durations}"
                f" longest_stall_s={ticker.longest_gap_s:.3f}"
            )
            assert connect_error is not None, "a connection attempt outlived its connect_timeout"
            assert set(outcomes.values()) == {"LeaseBackendError"}, (outcomes, durations, ticker.longest_gap_s)
            assert ticker.longest_gap_s < MAX_STALL_S, (ticker.longest_gap_s, durations)
            assert max(durations.values()) < TIMEOUT_S + MARGIN_S, durations
            # the fault over, the provider works again and nothing the aborted calls sent was applied
            assert until_it_works(lambda: provider.get_lease_owner(key), 10.0) == "a"
        if isinstance(target, sqlalchemy.Engine):
            target.dispose()


@pytest.mark.postgres
def test_an_aborted_statement_is_cancelled_on_the_server(pg_schema: tuple[str, str], key: str) -> None:
    import psycopg

    url, schema = pg_schema
    with SyncSqlLeaseProvider(url, schema=schema, operation_timeout_s=0.5) as provider:
        conninfo = provider._executor._conninfo  # type: ignore[attr-defined]
        with psycopg.connect(conninfo) as blocker, psycopg.connect(conninfo, autocommit=True) as observer:
            assert provider.acquire_lease(key, "alice", 10_000).acquired
            # the lease's row, locked by an open transaction: a release waits for it
            blocker.execute(f'SELECT 1 FROM "{schema}".sql_leases WHERE key = %s FOR UPDATE', (key,))

            def waiting() -> int:
                row = observer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    (f"%{schema}%",),
                )
                return int(row.fetchone()[0])  # type: ignore[index]

            with pytest.raises(LeaseBackendError):
                provider.release_lease(key, "alice")
            # the server stops waiting for the lock at once (the cancel request), not when it is freed
            deadline = time.monotonic() + 3.0
            while waiting() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert waiting() == 0
            blocker.rollback()
