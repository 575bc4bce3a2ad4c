"""Metrics, spans and logs after real operations: the Prometheus exporter read from a private
registry, OpenTelemetry from in-memory readers, on SQLite and PostgreSQL, both faces; the Grafana
dashboard queries only metrics the exporter emits; the example app serves them."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import make_url

from sql_lease import LeaseBackendError, SchemaMissingError, SqlLeaseProvider, SyncSqlLeaseProvider, observe
from sql_lease.metrics import PrometheusExporter, enable_opentelemetry, enable_prometheus
from tests.support.tcp_proxy import TcpProxy

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def lease_logs_reach_caplog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI, run in-process by other tests, stops the library's logger from propagating."""
    monkeypatch.setattr(logging.getLogger("sql_lease"), "propagate", True)


@pytest.fixture
def prometheus() -> Iterator[PrometheusExporter]:
    """The Prometheus exporter on a registry of its own, removed afterwards."""
    exporter = enable_prometheus(CollectorRegistry())
    yield exporter
    exporter.close()


def value(exporter: PrometheusExporter, name: str, **labels: str) -> float:
    found = exporter.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def ops(exporter: PrometheusExporter, operation: str, outcome: str) -> float:
    return value(exporter, "sql_lease_operations_total", operation=operation, outcome=outcome)


async def wait_until(condition: Any, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def wait_until_sync(condition: Any, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


EXPECTED_OPERATIONS = {
    ("acquire", "acquired"): 3,
    ("acquire", "refused"): 1,
    ("get_owner", "found"): 1,
    ("get_lease", "absent"): 1,
    ("renew", "renewed"): 1,
    ("renew", "lost"): 1,
    ("transfer", "transferred"): 1,
    ("release", "not_held"): 1,
    ("release", "released"): 1,
    ("break", "broken"): 1,
    ("break", "absent"): 1,
    ("list", "listed"): 1,
    ("sweep", "swept"): 1,
}


async def exercise(provider: Any, key: str) -> None:
    """Each operation with the outcomes of EXPECTED_OPERATIONS."""
    assert (await provider.acquire_lease(key, "a", 60_000)).acquired
    assert not (await provider.acquire_lease(key, "b", 60_000)).acquired
    assert await provider.get_lease_owner(key) == "a"
    assert await provider.get_lease(key + ":none") is None
    assert await provider.renew_lease(key, "a", 60_000)
    assert not await provider.renew_lease(key, "b", 60_000)
    assert await provider.transfer_lease(key, "a", "b", 60_000)
    assert not await provider.release_lease(key, "a")
    assert await provider.release_lease(key, "b")
    assert (await provider.acquire_lease(key + ":short", "c", 1)).acquired
    await asyncio.sleep(0.01)  # past its 1 ms TTL before the list (a fast SQLite lists within 1 ms)
    assert (await provider.acquire_lease(key + ":broken", "c", 60_000)).acquired
    assert await provider.break_lease(key + ":broken") is not None
    assert await provider.break_lease(key + ":none") is None
    await provider.list_leases(prefix=key)
    await provider.sweep_expired()


def exercise_sync(provider: Any, key: str) -> None:
    assert provider.acquire_lease(key, "a", 60_000).acquired
    assert not provider.acquire_lease(key, "b", 60_000).acquired
    assert provider.get_lease_owner(key) == "a"
    assert provider.get_lease(key + ":none") is None
    assert provider.renew_lease(key, "a", 60_000)
    assert not provider.renew_lease(key, "b", 60_000)
    assert provider.transfer_lease(key, "a", "b", 60_000)
    assert not provider.release_lease(key, "a")
    assert provider.release_lease(key, "b")
    assert provider.acquire_lease(key + ":short", "c", 1).acquired
    time.sleep(0.01)  # past its 1 ms TTL before the list (a fast SQLite lists within 1 ms)
    assert provider.acquire_lease(key + ":broken", "c", 60_000).acquired
    assert provider.break_lease(key + ":broken") is not None
    assert provider.break_lease(key + ":none") is None
    provider.list_leases(prefix=key)
    provider.sweep_expired()


def assert_counted(exporter: PrometheusExporter) -> None:
    for (operation, outcome), count in EXPECTED_OPERATIONS.items():
        assert ops(exporter, operation, outcome) == count, (operation, outcome)
    for operation in {operation for operation, _ in EXPECTED_OPERATIONS}:
        total = sum(c for (o, _), c in EXPECTED_OPERATIONS.items() if o == operation)
        assert value(exporter, "sql_lease_operation_duration_seconds_count", operation=operation) == total, operation
        assert value(exporter, "sql_lease_operation_duration_seconds_sum", operation=operation) > 0
    assert value(exporter, "sql_lease_operations_total", operation="acquire", outcome="error") == 0


async def test_prometheus_counts_each_operation_by_outcome(
    sql_provider: SqlLeaseProvider, key: str, prometheus: PrometheusExporter
) -> None:
    await exercise(sql_provider, key)
    assert_counted(prometheus)


def test_prometheus_counts_each_operation_by_outcome_sync(
    sync_sql_provider: SyncSqlLeaseProvider, key: str, prometheus: PrometheusExporter
) -> None:
    exercise_sync(sync_sql_provider, key)
    assert_counted(prometheus)


async def test_swept_rows_are_counted(sql_provider: SqlLeaseProvider, key: str, prometheus: PrometheusExporter) -> None:
    for n in range(3):
        assert (await sql_provider.acquire_lease(f"{key}:{n}", "a", 1)).acquired
    await asyncio.sleep(0.02)
    swept = 0
    while (batch := await sql_provider.sweep_expired(batch_size=1000)) > 0:
        swept += batch
    assert swept >= 3  # other tests' expired rows in the shared PostgreSQL schema may go too
    assert value(prometheus, "sql_lease_swept_rows_total") == swept


async def test_hold_loss_and_held_gauge(
    sql_provider: SqlLeaseProvider, key: str, prometheus: PrometheusExporter
) -> None:
    before = value(prometheus, "sql_lease_held_leases")
    async with sql_provider.hold(key, ttl_ms=1_500, on_lost="flag") as lease:
        assert value(prometheus, "sql_lease_held_leases") == before + 1
        assert (await sql_provider.break_lease(key)) is not None
        await asyncio.wait_for(lease.lost.wait(), 5)
        assert value(prometheus, "sql_lease_held_leases") == before
    assert value(prometheus, "sql_lease_leases_lost_total", reason="refused") == 1
    assert value(prometheus, "sql_lease_operations_total", operation="renew_many", outcome="lost") >= 1


def test_hold_loss_and_held_gauge_sync(
    sync_sql_provider: SyncSqlLeaseProvider, key: str, prometheus: PrometheusExporter
) -> None:
    before = value(prometheus, "sql_lease_held_leases")
    with sync_sql_provider.hold(key, ttl_ms=1_500, on_lost="flag") as lease:
        assert value(prometheus, "sql_lease_held_leases") == before + 1
        assert sync_sql_provider.break_lease(key) is not None
        assert lease.lost.wait(5)
        assert value(prometheus, "sql_lease_held_leases") == before
    assert value(prometheus, "sql_lease_leases_lost_total", reason="refused") == 1
    assert value(prometheus, "sql_lease_operations_total", operation="renew", outcome="lost") >= 1


def lock_sqlite(path: Path) -> sqlite3.Connection:
    """Another connection taking the SQLite write lock until it is closed."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


async def test_renewal_failures_then_expiry_counted_and_logged_once_each(
    tmp_path: Path, key: str, prometheus: PrometheusExporter, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "leases.db"
    async with SqlLeaseProvider(f"sqlite:///{path}", sqlite_busy_timeout_ms=10) as provider:
        await provider.migrate()
        caplog.set_level(logging.WARNING, logger="sql_lease")
        async with provider.hold(key, owner="worker-1", ttl_ms=400, on_lost="flag") as lease:
            locker = lock_sqlite(path)
            try:
                await asyncio.wait_for(lease.lost.wait(), 5)
            finally:
                locker.close()
    failures = value(prometheus, "sql_lease_renewal_failures_total", error="LeaseBackendError")
    assert failures >= 1
    assert value(prometheus, "sql_lease_leases_lost_total", reason="expired") == 1
    assert value(prometheus, "sql_lease_operation_errors_total", operation="renew_many", error="LeaseBackendError") >= 1
    assert_log_lines(caplog, key, "worker-1", lease.fence, failures)


def test_renewal_failures_then_expiry_counted_and_logged_once_each_sync(
    tmp_path: Path, key: str, prometheus: PrometheusExporter, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "leases.db"
    with SyncSqlLeaseProvider(f"sqlite:///{path}", sqlite_busy_timeout_ms=10) as provider:
        provider.migrate()
        caplog.set_level(logging.WARNING, logger="sql_lease")
        with provider.hold(key, owner="worker-1", ttl_ms=400, on_lost="flag") as lease:
            locker = lock_sqlite(path)
            try:
                assert lease.lost.wait(5)
            finally:
                locker.close()
    failures = value(prometheus, "sql_lease_renewal_failures_total", error="LeaseBackendError")
    failures += value(prometheus, "sql_lease_renewal_failures_total", error="no_answer")
    assert failures >= 1
    assert value(prometheus, "sql_lease_leases_lost_total", reason="expired") == 1
    assert_log_lines(caplog, key, "worker-1", lease.fence, failures)


def assert_log_lines(
    caplog: pytest.LogCaptureFixture, key: str, owner: str, fence: int | None, failures: float
) -> None:
    """One WARNING line per renewal failure (retried) and one for the loss, each naming the lease."""
    mine = [r for r in caplog.records if r.name == "sql_lease" and r.levelno == logging.WARNING]
    naming = f"{key!r} held by {owner!r} (fence {fence})"
    lost = [r for r in mine if " lost: " in r.getMessage()]
    retried = [r for r in mine if "failed, retrying" in r.getMessage()]
    assert len(lost) == 1
    assert 1 <= len(retried) <= failures  # the last failure, at the deadline, is the loss's line
    for record in lost + retried:
        assert naming in record.getMessage()
        assert "\n" not in record.getMessage()
    assert all(r.levelno < logging.ERROR for r in caplog.records if r.name == "sql_lease")


def assert_backend_error_counted(exporter: PrometheusExporter, password: str, caplog: Any, error: Exception) -> None:
    assert ops(exporter, "acquire", "error") == 1
    assert value(exporter, "sql_lease_operation_errors_total", operation="acquire", error="LeaseBackendError") == 1
    assert value(exporter, "sql_lease_operation_duration_seconds_count", operation="acquire") == 1
    assert password not in str(error)
    assert all(password not in r.getMessage() for r in caplog.records)


async def test_backend_error_counted_as_error(prometheus: PrometheusExporter, caplog: pytest.LogCaptureFixture) -> None:
    password = uuid.uuid4().hex
    async with SqlLeaseProvider(f"postgresql://postgres:{password}@127.0.0.1:1/test", operation_timeout_s=0.5) as dead:
        with pytest.raises(LeaseBackendError) as raised:
            await dead.acquire_lease("k", "o", 1000)
    assert_backend_error_counted(prometheus, password, caplog, raised.value)


def test_backend_error_counted_as_error_sync(prometheus: PrometheusExporter, caplog: pytest.LogCaptureFixture) -> None:
    password = uuid.uuid4().hex
    url = f"postgresql://postgres:{password}@127.0.0.1:1/test"
    with SyncSqlLeaseProvider(url, operation_timeout_s=0.5) as dead, pytest.raises(LeaseBackendError) as raised:
        dead.acquire_lease("k", "o", 1000)
    assert_backend_error_counted(prometheus, password, caplog, raised.value)


@pytest.mark.postgres
async def test_backend_error_in_hold_logs_one_warning_without_password(
    pg_schema: tuple[str, str], key: str, prometheus: PrometheusExporter, caplog: pytest.LogCaptureFixture
) -> None:
    url, schema = pg_schema
    address = make_url(url)
    password = uuid.uuid4().hex  # trust authentication: never checked, but part of the URL
    caplog.set_level(logging.WARNING, logger="sql_lease")
    async with TcpProxy(address.host or "127.0.0.1", address.port or 5432) as proxy:
        proxied = address.set(host="127.0.0.1", port=proxy.port, password=password)
        leases = SqlLeaseProvider(proxied.render_as_string(hide_password=False), schema=schema, operation_timeout_s=1.0)
        async with leases, leases.hold(key, owner="worker-2", ttl_ms=3_000, renew_every_ms=100) as lease:
            proxy.stall()
            await wait_until(lambda: value(prometheus, "sql_lease_renewal_failures_total", error="LeaseBackendError"))
            proxy.resume()
            await proxy.drop()
    retried = [r for r in caplog.records if "failed, retrying" in r.getMessage()]
    assert retried, [r.getMessage() for r in caplog.records]
    message = retried[0].getMessage()
    assert retried[0].levelno == logging.WARNING
    assert f"{key!r} held by 'worker-2' (fence {lease.fence})" in message and "LeaseBackendError" in message
    assert "://postgres:***@127.0.0.1" in message
    assert all(password not in r.getMessage() for r in caplog.records)
    assert value(prometheus, "sql_lease_leases_lost_total", reason="expired") == 0


class Raising(observe.LeaseObserver):
    def __init__(self) -> None:
        self.calls = 0

    def on_operation(self, event: observe.OperationEvent) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")


async def test_observer_errors_never_break_an_operation_and_are_logged_once(
    tmp_path: Path, key: str, prometheus: PrometheusExporter, caplog: pytest.LogCaptureFixture
) -> None:
    raising = Raising()
    remove = observe.add_observer(raising)
    try:
        async with SqlLeaseProvider(f"sqlite:///{tmp_path}/leases.db") as provider:
            await provider.migrate()
            assert (await provider.acquire_lease(key, "a", 60_000)).acquired
            assert await provider.release_lease(key, "a")
            assert await provider.get_lease_owner(key) is None
    finally:
        remove()
    assert raising.calls == 3
    complaints = [r for r in caplog.records if "observer" in r.getMessage()]
    assert len(complaints) == 1 and complaints[0].levelno == logging.ERROR
    assert ops(prometheus, "release", "released") == 1  # observers after the raising one still hear


def test_an_observer_removed_hears_nothing_more(tmp_path: Path, key: str) -> None:
    registry = CollectorRegistry()
    exporter = enable_prometheus(registry)
    with SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/leases.db") as provider:
        provider.migrate()
        provider.acquire_lease(key, "a", 1000)
        exporter.close()
        exporter.close()
        provider.acquire_lease(key, "a", 1000)
    assert (
        registry.get_sample_value("sql_lease_operations_total", {"operation": "acquire", "outcome": "acquired"}) is None
    )
    assert observe.observers == ()
    with pytest.raises(TypeError, match="LeaseObserver"):
        observe.add_observer(object())  # type: ignore[arg-type]


def test_bad_arguments_are_not_operations(tmp_path: Path, prometheus: PrometheusExporter) -> None:
    with SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/leases.db") as provider:
        provider.migrate()
        with pytest.raises(ValueError):
            provider.acquire_lease("", "a", 1000)
        with pytest.raises(ValueError):
            provider.acquire_lease("k", "a", 1000, timeout_s=-1)
        provider.acquire_lease("k", "a", 1000)
    assert value(prometheus, "sql_lease_operation_duration_seconds_count", operation="acquire") == 1
    assert value(prometheus, "sql_lease_operations_total", operation="acquire", outcome="acquired") == 1


def test_extras_are_imported_only_when_enabled_and_named_when_missing() -> None:
    probe = (
        "import sys, sql_lease, sql_lease.metrics, sql_lease.observe\n"
        "from sql_lease import SyncSqlLeaseProvider, SqlLeaseProvider\n"
        "assert not any(m.split('.')[0] in ('prometheus_client', 'opentelemetry') for m in sys.modules), 'imported'\n"
        "sys.modules['prometheus_client'] = None\n"
        "sys.modules['opentelemetry'] = None\n"
        "for enable, extra in ((sql_lease.metrics.enable_prometheus, 'prometheus'), "
        "(sql_lease.metrics.enable_opentelemetry, 'opentelemetry')):\n"
        "    try:\n"
        "        enable()\n"
        "    except ImportError as exc:\n"
        "        assert f\"pip install 'sql-lease[{extra}]'\" in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError('no ImportError')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# -- OpenTelemetry ---------------------------------------------------------------------------------


@pytest.fixture
def otel() -> Iterator[tuple[Any, Any]]:
    """(metric reader, span exporter) of an OpenTelemetry exporter on SDK providers of its own."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[reader])
    exporter = enable_opentelemetry(meter_provider=meter_provider, tracer_provider=tracer_provider)
    yield reader, spans
    exporter.close()
    meter_provider.shutdown()
    tracer_provider.shutdown()


def otel_points(reader: Any) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def otel_count(points: dict[str, list[Any]], name: str, **attributes: str) -> float:
    return sum(p.value for p in points.get(name, []) if all(p.attributes.get(k) == v for k, v in attributes.items()))


def assert_otel(reader: Any, span_exporter: Any, key: str, backend: str) -> None:
    points = otel_points(reader)
    for (operation, outcome), count in EXPECTED_OPERATIONS.items():
        attributes = {"sql_lease.operation": operation, "sql_lease.outcome": outcome}
        assert otel_count(points, "sql_lease.operations", **attributes) == count, (operation, outcome)
    durations = {p.attributes["sql_lease.operation"]: p for p in points["sql_lease.operation.duration"]}
    assert durations["acquire"].count == 4 and durations["acquire"].sum > 0
    spans = span_exporter.get_finished_spans()
    assert len(spans) == sum(EXPECTED_OPERATIONS.values())
    acquires = [s for s in spans if s.name == "sql_lease acquire" and s.attributes["sql_lease.key"] == key]
    assert [s.attributes["sql_lease.outcome"] for s in acquires] == ["acquired", "refused"]
    assert all(s.attributes["db.system"] == backend for s in spans)
    assert all(0 < s.end_time - s.start_time < 10e9 for s in spans)
    listed = next(s for s in spans if s.name == "sql_lease list")
    assert "sql_lease.key" not in listed.attributes and listed.attributes["sql_lease.rows"] == 0


async def test_opentelemetry_metrics_and_spans(sql_provider: SqlLeaseProvider, key: str, otel: tuple[Any, Any]) -> None:
    reader, spans = otel
    await exercise(sql_provider, key)
    assert_otel(reader, spans, key, sql_provider.dialect_name)


def test_opentelemetry_metrics_and_spans_sync(
    sync_sql_provider: SyncSqlLeaseProvider, key: str, otel: tuple[Any, Any]
) -> None:
    reader, spans = otel
    exercise_sync(sync_sql_provider, key)
    assert_otel(reader, spans, key, sync_sql_provider.dialect_name)


async def test_opentelemetry_error_span_loss_and_held_leases(tmp_path: Path, key: str, otel: tuple[Any, Any]) -> None:
    from opentelemetry.trace import StatusCode

    reader, span_exporter = otel
    async with SqlLeaseProvider(f"sqlite:///{tmp_path}/missing.db") as missing:
        with pytest.raises(SchemaMissingError):
            await missing.get_lease(key)
    async with SqlLeaseProvider(f"sqlite:///{tmp_path}/leases.db") as provider:
        await provider.migrate()
        async with provider.hold(key, ttl_ms=300, on_lost="flag") as lease:
            held = otel_count(otel_points(reader), "sql_lease.held_leases")
            await provider.break_lease(key)
            await asyncio.wait_for(lease.lost.wait(), 5)
            assert otel_count(otel_points(reader), "sql_lease.held_leases") == held - 1
    points = otel_points(reader)
    assert otel_count(points, "sql_lease.leases.lost", **{"sql_lease.reason": "refused"}) == 1
    errors = {"sql_lease.operation": "get_lease", "error.type": "SchemaMissingError"}
    assert otel_count(points, "sql_lease.operation.errors", **errors) == 1
    failed = [s for s in span_exporter.get_finished_spans() if s.status.status_code == StatusCode.ERROR]
    assert [s.name for s in failed] == ["sql_lease get_lease"]
    assert failed[0].attributes["error.type"] == "SchemaMissingError"
    assert failed[0].events[0].name == "exception"


def test_spans_are_children_of_the_callers_span(tmp_path: Path, key: str, otel: tuple[Any, Any]) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    _, span_exporter = otel
    caller = TracerProvider().get_tracer("app")
    with SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/leases.db") as provider:
        provider.migrate()
        with caller.start_as_current_span("job") as job:
            provider.acquire_lease(key, "a", 1000)
    (span,) = span_exporter.get_finished_spans()
    assert span.parent is not None and span.parent.span_id == job.get_span_context().span_id


# -- the dashboard and the example app -----------------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}
PROMQL_WORD = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def queried(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL expression uses: functions (a name before '('),
    keywords, strings, numbers and range durations are not metric names."""
    labels: set[str] = set()
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    for matchers in re.findall(r"\{([^}]*)\}", text):
        labels.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for grouping in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        labels.update(name.strip() for name in grouping.split(",") if name.strip())
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    names = set()
    for match in PROMQL_WORD.finditer(text):
        word, rest = match.group(), text[match.end() :].lstrip()
        if word in PROMQL_KEYWORDS or rest.startswith("("):
            continue
        names.add(word)
    return names, labels


def test_promql_reader_finds_metrics_and_labels() -> None:
    names, labels = queried(
        'histogram_quantile(0.99, sum by (le, operation) (rate(a_bucket{job=~"$x", b="c}"}[5m]))) / on(job) b_total'
    )
    assert names == {"a_bucket", "b_total"}
    assert labels == {"le", "operation", "job", "b"}


async def test_dashboard_queries_only_emitted_metrics(tmp_path: Path, key: str, prometheus: PrometheusExporter) -> None:
    async with SqlLeaseProvider(f"sqlite:///{tmp_path}/missing.db") as missing:
        with pytest.raises(SchemaMissingError):
            await missing.get_lease(key)  # an error
    path = tmp_path / "leases.db"
    async with SqlLeaseProvider(f"sqlite:///{path}", sqlite_busy_timeout_ms=10) as provider:
        await provider.migrate()
        await exercise(provider, key)
        assert (await provider.acquire_lease(key + ":gone", "a", 1)).acquired
        await asyncio.sleep(0.01)
        assert await provider.sweep_expired() >= 1
        async with provider.hold(key, ttl_ms=400, on_lost="flag") as lease:
            locker = lock_sqlite(path)  # a renewal failure, then the loss
            try:
                await asyncio.wait_for(lease.lost.wait(), 5)
            finally:
                locker.close()
    emitted: dict[str, set[str]] = {}
    for metric in prometheus.registry.collect():
        for sample in metric.samples:
            emitted.setdefault(sample.name, set()).update(sample.labels)
    dashboard = json.loads((REPO / "dashboards" / "sql_lease.json").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    assert len(expressions) >= 10
    used: set[str] = set()
    for expr in expressions:
        names, labels = queried(re.sub(r"label_values\(([^,]+),[^)]*\)", r"\1", expr))
        assert names, expr
        for name in names:
            assert name in emitted, f"{name} (in {expr}) is not emitted; emitted: {sorted(emitted)}"
        scraped = {"job", "instance"}  # added by Prometheus at scrape time
        known = set().union(*(emitted[n] for n in names)) | scraped
        assert labels <= known, (expr, labels - known)
        used |= names
    assert {"sql_lease_operations_total", "sql_lease_held_leases", "sql_lease_leases_lost_total"} <= used
    assert {
        "sql_lease_renewal_failures_total",
        "sql_lease_swept_rows_total",
        "sql_lease_operation_errors_total",
    } <= used


def test_example_app_serves_metrics(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(REPO / "examples" / "metrics_app.py"), f"sqlite:///{tmp_path}/app.db", "--port", "0"]
    with (
        open(tmp_path / "stderr.txt", "w") as stderr,
        subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True) as app,
    ):
        try:
            assert app.stdout is not None
            first = app.stdout.readline()
            address = re.search(r"http://\S+/metrics", first)
            assert address, first + (tmp_path / "stderr.txt").read_text()
            page = ""

            def holding() -> bool:
                nonlocal page
                with urllib.request.urlopen(address.group(), timeout=5) as response:
                    assert response.status == 200
                    page = response.read().decode()
                return "sql_lease_held_leases 1.0" in page  # inside its hold() block

            wait_until_sync(holding, within_s=20)
            acquired = re.search(r'sql_lease_operations_total\{operation="acquire",outcome="acquired"\} (\d+)', page)
            assert acquired and int(acquired.group(1)) >= 1, page
            timed = re.search(r'sql_lease_operation_duration_seconds_count\{operation="acquire"\} (\d+)', page)
            assert timed and int(timed.group(1)) >= int(acquired.group(1)), page
        finally:
            app.terminate()
            app.wait(10)
