"""A provider used before ``os.fork()`` (Celery's prefork pool, gunicorn ``--preload``,
multiprocessing's 'fork' context): the child gets connections of its own, never uses or closes the
parent's, and both go on giving the database's answers."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sql_lease import SyncSqlLeaseProvider

CHILD_WITHIN_S = 30.0


def in_child(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Fork; the child runs ``work()`` and sends back what it returned (or its error) as JSON, then
    leaves with ``os._exit``; the parent waits at most CHILD_WITHIN_S for it."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "this process is multi-threaded"
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read_end)
            try:
                payload = json.dumps(work())
                code = 0
            except BaseException as exc:
                payload = json.dumps({"error": repr(exc), "trace": traceback.format_exc()})
            data = payload.encode()
            while data:
                data = data[os.write(write_end, data) :]
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + CHILD_WITHIN_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the child did not finish within {CHILD_WITHIN_S:g} s")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(b"".join(chunks) or b'{"error": "no answer"}')
    return result


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def provider_of(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., SyncSqlLeaseProvider]]:
    """Makes providers of one database (SQLite file or the session's PostgreSQL schema)."""
    made: list[SyncSqlLeaseProvider] = []

    def make(**options: Any) -> SyncSqlLeaseProvider:
        if request.param == "sqlite":
            path = tmp_path / "fork.db"
            if not path.exists():
                shutil.copyfile(request.getfixturevalue("sync_sqlite_template"), path)
            provider = SyncSqlLeaseProvider(f"sqlite:///{path}", **options)
        else:
            url, schema = request.getfixturevalue("mysql_db" if request.param == "mysql" else "pg_schema")
            provider = SyncSqlLeaseProvider(url, schema=schema, **options)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.close()


def child_work(provider: SyncSqlLeaseProvider, key: str) -> Callable[[], dict[str, Any]]:
    def work() -> dict[str, Any]:
        started = time.monotonic()
        acquired = provider.acquire_lease(key + ":child", "child", 60_000)
        answers = {
            "acquired": acquired.acquired,
            "fence": acquired.fence,
            "owner_of_parents": provider.get_lease_owner(key),
            "refused": provider.acquire_lease(key, "child", 60_000).owner,
            "released": provider.release_lease(key + ":child", "child"),
        }
        provider.close()  # closes the child's connections, never the parent's
        answers["took_s"] = time.monotonic() - started
        return answers

    return work


def test_a_child_uses_the_parents_provider_with_connections_of_its_own(
    provider_of: Callable[..., SyncSqlLeaseProvider], key: str
) -> None:
    provider = provider_of(operation_timeout_s=5)
    assert provider.acquire_lease(key, "parent", 60_000).acquired  # its pool has a connection now
    answers = in_child(child_work(provider, key))
    assert "error" not in answers, answers.get("trace")
    assert answers["acquired"] and answers["owner_of_parents"] == "parent" and answers["refused"] == "parent"
    assert answers["released"]
    # the parent goes on on its own connections, which the child neither used nor closed
    for _ in range(3):
        assert provider.get_lease_owner(key) == "parent"
        assert provider.renew_lease(key, "parent", 60_000)
    check = provider_of()
    assert check.get_lease_owner(key) == "parent" and check.get_lease_owner(key + ":child") is None


def test_a_fork_while_an_operation_is_in_flight_leaves_the_child_a_working_provider(
    provider_of: Callable[..., SyncSqlLeaseProvider], key: str
) -> None:
    provider = provider_of(operation_timeout_s=5, pool_size=1)
    assert provider.acquire_lease(key, "parent", 60_000).acquired
    forked, entered = threading.Event(), threading.Event()
    parent = threading.current_thread()

    def hook(sql: str, params: tuple[Any, ...]) -> None:
        if threading.current_thread() is not parent and not forked.is_set():
            entered.set()  # this thread holds the only pooled connection, mid-operation, at the fork
            forked.wait(10)

    remove = provider.on_statement(hook)
    renewed: list[object] = []

    def renew() -> None:
        try:
            renewed.append(provider.renew_lease(key, "parent", 60_000))
        except Exception as exc:
            renewed.append(exc)

    busy = threading.Thread(target=renew)
    busy.start()
    try:
        assert entered.wait(10)
        answers = in_child(child_work(provider, key))
    finally:
        forked.set()
        busy.join(10)
        remove()
    assert "error" not in answers, answers.get("trace")
    assert answers["acquired"] and answers["owner_of_parents"] == "parent" and answers["released"]
    assert answers["took_s"] < 5, answers  # no wait for a connection only the parent could give back
    assert renewed == [True]  # the parent's operation in flight at the fork went on undisturbed
    assert provider.get_lease_owner(key) == "parent"
    assert provider.renew_lease(key, "parent", 60_000)


@pytest.mark.postgres
def test_a_childs_waiters_are_woken_by_a_listen_connection_of_its_own(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    with SyncSqlLeaseProvider(url, schema=schema, operation_timeout_s=5) as provider:
        waiter = provider.release_waiter(key + ":parent")
        assert waiter is not None
        with waiter:
            assert waiter.acquire("parent", 60_000, None).acquired  # the parent LISTENs now
        assert waiter.listening
        assert provider.acquire_lease(key, "other", 60_000).acquired

        def work() -> dict[str, Any]:
            child_waiter = provider.release_waiter(key)
            assert child_waiter is not None
            with child_waiter:
                refused = child_waiter.acquire("child", 60_000, None)  # flags the row: NOTIFY on release
                provider.release_lease(key, "other")
                started = time.monotonic()
                woken = child_waiter.wait(5)
                waited = time.monotonic() - started
                acquired = child_waiter.acquire("child", 60_000, None).acquired
            provider.close()
            return {"refused": refused.acquired, "woken": woken, "waited_s": waited, "acquired": acquired}

        answers = in_child(work)
        assert "error" not in answers, answers.get("trace")
        assert not answers["refused"] and answers["woken"] and answers["acquired"], answers
        assert answers["waited_s"] < 2.0, answers
        assert waiter.listening  # the parent's LISTEN connection is still its own, still listening
        assert provider.get_lease_owner(key) == "child"
