"""Issue 20 item 13: lease data (and every other statement parameter) never reaches an error
message, a log record or a span: SQLAlchemy's ``DBAPIError`` text carries ``[parameters: ...]``
and ``[SQL: ...]``, and the engine path used to pass it on."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from sql_lease import LeaseError, SqlLeaseProvider
from sql_lease.metrics import enable_opentelemetry
from tests.conftest import _execute

SECRET = "s3cr3t-token-4711"
DATA = {"api_token": SECRET}


@pytest.fixture
def spans() -> Iterator[Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exported))
    exporter = enable_opentelemetry(tracer_provider=tracer_provider)
    yield exported
    exporter.close()
    tracer_provider.shutdown()


def watch_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Every record of sql_lease's logger, and INFO and above of every other (aiosqlite's DEBUG
    records show each call's arguments: the application opts into them)."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="sql_lease")


def assert_secret_nowhere(exc: BaseException, caplog: pytest.LogCaptureFixture, spans: Any) -> None:
    assert SECRET not in str(exc)
    assert "api_token" not in str(exc) and "INSERT" not in str(exc)
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        if record.exc_info:
            assert SECRET not in "".join(traceback.format_exception(*record.exc_info))
    # the whole chain a traceback shows (what a logger's exc_info prints)
    assert SECRET not in "".join(traceback.format_exception(exc))
    finished = spans.get_finished_spans()
    assert finished, "no span was recorded"
    for span in finished:
        assert SECRET not in str(span.status.description)
        for event in span.events:
            assert all(SECRET not in str(value) for value in event.attributes.values())


@pytest.mark.postgres
@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_a_failed_statement_on_a_given_engine_shows_no_parameter(
    pg_url: str, fresh_pg_schema: str, driver: str, caplog: pytest.LogCaptureFixture, spans: Any
) -> None:
    schema = fresh_pg_schema
    engine = create_async_engine(pg_url.replace("postgresql://", f"postgresql+{driver}://"))
    watch_logs(caplog)
    try:
        async with SqlLeaseProvider(engine, schema=schema) as leases:
            with pytest.raises(LeaseError) as missing:  # no table yet: SchemaMissingError
                await leases.acquire_lease("k", "o", 10_000, data=DATA)
            assert_secret_nowhere(missing.value, caplog, spans)
            await leases.migrate()
            # a column of the wrong type: the server refuses the statement (a LeaseBackendError)
            await _execute(pg_url, f'ALTER TABLE "{schema}".sql_leases ALTER COLUMN data TYPE integer USING NULL')
            with pytest.raises(LeaseError) as failed:
                await leases.acquire_lease("k", "o", 10_000, data=DATA)
            assert_secret_nowhere(failed.value, caplog, spans)
    finally:
        await engine.dispose()


async def test_a_failed_statement_on_an_aiosqlite_engine_shows_no_parameter(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, spans: Any
) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/x.db")
    watch_logs(caplog)
    try:
        async with SqlLeaseProvider(engine) as leases:
            with pytest.raises(LeaseError) as missing:
                await leases.acquire_lease("k", "o", 10_000, data=DATA)
            assert_secret_nowhere(missing.value, caplog, spans)
    finally:
        await engine.dispose()


@pytest.mark.postgres
def test_the_sync_face_shows_no_parameter_or_sql(
    pg_url: str, fresh_pg_schema: str, caplog: pytest.LogCaptureFixture, spans: Any
) -> None:
    from sql_lease import SyncSqlLeaseProvider

    watch_logs(caplog)
    with SyncSqlLeaseProvider(pg_url, schema=fresh_pg_schema) as leases:
        with pytest.raises(LeaseError) as missing:
            leases.acquire_lease("k", "o", 10_000, data=DATA)
        assert_secret_nowhere(missing.value, caplog, spans)
        assert "LINE" not in str(missing.value)  # libpq's statement excerpt


@pytest.mark.postgres
@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_a_failed_statement_on_the_providers_own_pool_shows_no_parameter(
    pg_url: str,
    fresh_pg_schema: str,
    driver: str,
    caplog: pytest.LogCaptureFixture,
    spans: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sql_lease.sql import provider as provider_module

    monkeypatch.setattr(provider_module, "async_postgres_driver", lambda: driver)
    watch_logs(caplog)
    async with SqlLeaseProvider(pg_url, schema=fresh_pg_schema) as leases:
        with pytest.raises(LeaseError) as missing:
            await leases.acquire_lease("k", "o", 10_000, data=DATA)
        assert_secret_nowhere(missing.value, caplog, spans)
        assert "LINE" not in str(missing.value)
        await leases.migrate()
        await _execute(pg_url, f'ALTER TABLE "{fresh_pg_schema}".sql_leases ALTER COLUMN data TYPE integer USING NULL')
        with pytest.raises(LeaseError) as failed:
            await leases.acquire_lease("k", "o", 10_000, data=DATA)
        assert_secret_nowhere(failed.value, caplog, spans)
        assert "LINE" not in str(failed.value)
