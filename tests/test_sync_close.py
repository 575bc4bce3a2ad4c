"""Closing the synchronous provider while an operation is still in flight (it outlived close()'s
wait), and the LISTEN connection's setup under a deadline."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sql_lease import LeaseBackendError, SyncSqlLeaseProvider


@pytest.mark.postgres
def test_an_operation_that_outlives_close_ends_with_the_librarys_error(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    provider = SyncSqlLeaseProvider(url, schema=schema, operation_timeout_s=0.3)
    entered, closed = threading.Event(), threading.Event()
    caller = threading.current_thread()

    def slow_hook(sql: str, params: tuple[Any, ...]) -> None:
        if threading.current_thread() is not caller:
            entered.set()
            closed.wait(10)  # the operation goes on after close() has given up waiting for it

    provider.on_statement(slow_hook)
    outcome: list[BaseException | object] = []

    def operate() -> None:
        try:
            outcome.append(provider.get_lease_owner(key))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=operate)
    worker.start()
    assert entered.wait(10)
    provider.close()  # waits operation_timeout_s + 1 for it, then closes the pool
    closed.set()
    worker.join(10)
    assert not worker.is_alive()
    [result] = outcome
    # its connection was aborted at the deadline: the library's error for that, not for a bug
    assert isinstance(result, LeaseBackendError), repr(result)
    causes = []
    cause: BaseException | None = result
    while cause is not None:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    assert not any(isinstance(c, AttributeError) for c in causes), causes


@pytest.mark.postgres
def test_listen_setup_is_bounded_by_the_operation_timeout(pg_schema: tuple[str, str], key: str) -> None:
    url, schema = pg_schema
    with SyncSqlLeaseProvider(url, schema=schema, operation_timeout_s=0.5) as provider:
        opener = provider._executor.listen_connection  # type: ignore[attr-defined]

        def stalling_opener(timeout_s: float) -> tuple[Any, Any]:
            conn, discard = opener(timeout_s)
            original = conn.execute

            def execute(*args: Any, **kwargs: Any) -> Any:
                # as a server that stopped answering: the statement is sent, no reply comes
                return original("SELECT pg_sleep(30)")

            conn.execute = execute
            return conn, discard

        waiter = provider.release_waiter(key)
        assert waiter is not None
        provider._listener._open_connection = stalling_opener  # type: ignore[union-attr]
        started = time.monotonic()
        with waiter:
            result = waiter.acquire("alice", 10_000, None)
        took = time.monotonic() - started
        assert result.acquired
        assert not waiter.listening  # the setup failed: the waiter polls
        assert took < 0.5 + 1.0, took
        started = time.monotonic()
    assert time.monotonic() - started < 2.0  # close() did not wait for the stalled setup either
