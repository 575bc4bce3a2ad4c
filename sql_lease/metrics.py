"""Prometheus and OpenTelemetry exporters: observers (:mod:`sql_lease.observe`) that turn the
library's reports into metrics and spans.

    from sql_lease.metrics import enable_prometheus
    enable_prometheus()                 # into prometheus_client's default REGISTRY

    from sql_lease.metrics import enable_opentelemetry
    enable_opentelemetry()              # the global MeterProvider and TracerProvider

Each needs its extra (``sql-lease[prometheus]``: prometheus-client; ``sql-lease[opentelemetry]``:
opentelemetry-api); nothing of either is imported until its ``enable_*`` is called, and a missing
one raises ``ImportError`` naming the extra. The metric names and what they count are listed in
the README ("Metrics and tracing"); ``dashboards/sql_lease.json`` is a Grafana dashboard on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import observe
from .observe import HoldEvent, LeaseObserver, OperationEvent

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider
    from prometheus_client import CollectorRegistry

__all__ = [
    "DURATION_BUCKETS_S",
    "OpenTelemetryExporter",
    "PrometheusExporter",
    "enable_opentelemetry",
    "enable_prometheus",
]

DURATION_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the operation latency histogram: lease statements take from a fraction
of a millisecond (SQLite) to the operation timeout (10 s by default)."""


def _require(module: str, extra: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{package} is not installed: pip install 'sql-lease[{extra}]'") from exc


class PrometheusExporter(LeaseObserver):
    """The Prometheus metrics of :func:`enable_prometheus`; :meth:`close` unregisters them."""

    def __init__(
        self, registry: CollectorRegistry | None = None, buckets: tuple[float, ...] = DURATION_BUCKETS_S
    ) -> None:
        prometheus = _require("prometheus_client", "prometheus", "prometheus-client")
        self.registry = prometheus.REGISTRY if registry is None else registry
        on = {"registry": self.registry}
        self.operations = prometheus.Counter(
            "sql_lease_operations", "Lease operations, by operation and outcome.", ["operation", "outcome"], **on
        )
        self.errors = prometheus.Counter(
            "sql_lease_operation_errors", "Lease operations that raised, by error class.", ["operation", "error"], **on
        )
        self.duration = prometheus.Histogram(
            "sql_lease_operation_duration_seconds",
            "Duration of lease operations in seconds, pool checkout and retries included.",
            ["operation"],
            buckets=buckets,
            **on,
        )
        self.held = prometheus.Gauge(
            "sql_lease_held_leases", "Leases held by hold() blocks of this process (both faces).", **on
        )
        self.held.set_function(observe.held_leases)
        self.renewal_failures = prometheus.Counter(
            "sql_lease_renewal_failures", "Renewals by hold() that raised or had no answer in time.", ["error"], **on
        )
        self.lost = prometheus.Counter(
            "sql_lease_leases_lost", "Leases hold() declared lost: refused or expired.", ["reason"], **on
        )
        self.swept_rows = prometheus.Counter("sql_lease_swept_rows", "Expired lease rows deleted by sweeps.", **on)
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._remove: Callable[[], None] | None = observe.add_observer(self)

    def on_operation(self, event: OperationEvent) -> None:
        children = self._children.get((event.operation, event.outcome))
        if children is None:
            children = self._children[(event.operation, event.outcome)] = (
                self.operations.labels(event.operation, event.outcome),
                self.duration.labels(event.operation),
            )
        children[0].inc()
        children[1].observe(event.duration_s)
        if event.error is not None:
            self.errors.labels(event.operation, type(event.error).__name__).inc()
        elif event.operation == "sweep" and event.rows:
            self.swept_rows.inc(event.rows)

    def on_hold(self, event: HoldEvent) -> None:
        if event.kind == "lost":
            self.lost.labels(event.reason).inc()
        elif event.kind == "renewal_failed":
            self.renewal_failures.labels(event.reason).inc()

    def close(self) -> None:
        """Stop observing and unregister the metrics from the registry. Calling it again does nothing."""
        if self._remove is not None:
            self._remove()
            self._remove = None
            for metric in (
                self.operations,
                self.errors,
                self.duration,
                self.held,
                self.renewal_failures,
                self.lost,
                self.swept_rows,
            ):
                self.registry.unregister(metric)


def enable_prometheus(
    registry: CollectorRegistry | None = None, *, buckets: tuple[float, ...] = DURATION_BUCKETS_S
) -> PrometheusExporter:
    """Export the library's metrics to Prometheus: registers them in ``registry`` (a
    ``prometheus_client.CollectorRegistry``; default: the global ``REGISTRY``, which
    ``start_http_server`` and ``make_wsgi_app`` serve) and starts observing every provider and
    ``hold()`` of this process. ``buckets``: the latency histogram's upper bounds in seconds.

    Returns the exporter (``close()`` undoes it). Raises ``ImportError`` naming the extra
    ``sql-lease[prometheus]`` when prometheus-client is missing, and prometheus-client's
    ``ValueError`` when the registry already holds these metrics (enabled twice)."""
    return PrometheusExporter(registry, buckets)


class OpenTelemetryExporter(LeaseObserver):
    """The OpenTelemetry instruments and spans of :func:`enable_opentelemetry`; :meth:`close` stops them."""

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        tracer_provider: TracerProvider | None = None,
        spans: bool = True,
    ) -> None:
        metrics = _require("opentelemetry.metrics", "opentelemetry", "opentelemetry-api")
        trace = _require("opentelemetry.trace", "opentelemetry", "opentelemetry-api")
        from . import __version__

        self._trace = trace
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("sql_lease", __version__)
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("sql_lease", __version__)
        self.spans = bool(spans)
        self.operations = meter.create_counter(
            "sql_lease.operations", "{operation}", "Lease operations, by operation and outcome."
        )
        self.errors = meter.create_counter(
            "sql_lease.operation.errors", "{operation}", "Lease operations that raised, by error class."
        )
        self.duration = meter.create_histogram(
            "sql_lease.operation.duration",
            "s",
            "Duration of lease operations, pool checkout and retries included.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S),
        )
        self.renewal_failures = meter.create_counter(
            "sql_lease.renewal.failures", "{renewal}", "Renewals by hold() that raised or had no answer in time."
        )
        self.lost = meter.create_counter("sql_lease.leases.lost", "{lease}", "Leases hold() declared lost.")
        self.swept_rows = meter.create_counter("sql_lease.swept_rows", "{row}", "Expired lease rows deleted by sweeps.")
        self._closed = False
        meter.create_observable_up_down_counter(
            "sql_lease.held_leases", [self._observe_held], "{lease}", "Leases held by hold() blocks of this process."
        )
        self._remove = observe.add_observer(self)

    def _observe_held(self, options: Any) -> list[Any]:
        if self._closed:
            return []
        from opentelemetry.metrics import Observation

        return [Observation(observe.held_leases())]

    def on_operation(self, event: OperationEvent) -> None:
        attributes = {"sql_lease.operation": event.operation, "sql_lease.outcome": event.outcome}
        self.operations.add(1, attributes)
        self.duration.record(event.duration_s, {"sql_lease.operation": event.operation})
        if event.error is not None:
            error_class = type(event.error).__name__
            self.errors.add(1, {"sql_lease.operation": event.operation, "error.type": error_class})
        elif event.operation == "sweep" and event.rows:
            self.swept_rows.add(event.rows)
        if self.spans:
            self._span(event)

    def _span(self, event: OperationEvent) -> None:
        # Reported after the fact: the span is given the operation's start and end times.
        end = time.time_ns()
        attributes: dict[str, Any] = {
            "sql_lease.operation": event.operation,
            "sql_lease.outcome": event.outcome,
            "db.system": event.backend,
        }
        if event.key is not None:
            attributes["sql_lease.key"] = event.key
        if event.rows is not None:
            attributes["sql_lease.rows"] = event.rows
        span = self.tracer.start_span(
            f"sql_lease {event.operation}",
            kind=self._trace.SpanKind.CLIENT,
            attributes=attributes,
            start_time=end - int(event.duration_s * 1e9),
        )
        if event.error is not None:
            span.set_attribute("error.type", type(event.error).__name__)
            span.record_exception(event.error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(event.error)))
        span.end(end_time=end)

    def on_hold(self, event: HoldEvent) -> None:
        if event.kind == "lost":
            self.lost.add(1, {"sql_lease.reason": event.reason})
        elif event.kind == "renewal_failed":
            self.renewal_failures.add(1, {"error.type": event.reason})

    def close(self) -> None:
        """Stop observing (instruments stay with the meter, silent). Calling it again does nothing."""
        self._closed = True
        self._remove()


def enable_opentelemetry(
    *, meter_provider: MeterProvider | None = None, tracer_provider: TracerProvider | None = None, spans: bool = True
) -> OpenTelemetryExporter:
    """Export the library's metrics to OpenTelemetry (the same as :func:`enable_prometheus`, named
    ``sql_lease.operations``, ``sql_lease.operation.duration`` in seconds, ...) and, unless
    ``spans=False``, one span per operation (``sql_lease acquire``, ...; attributes
    ``sql_lease.key``, ``sql_lease.operation``, ``sql_lease.outcome``, ``db.system``; status ERROR
    with the exception recorded when it raised), a child of the caller's current span.
    ``meter_provider``/``tracer_provider``: default the global ones (set them up with the
    OpenTelemetry SDK first).

    Returns the exporter (``close()`` stops it). Raises ``ImportError`` naming the extra
    ``sql-lease[opentelemetry]`` when opentelemetry-api is missing."""
    return OpenTelemetryExporter(meter_provider, tracer_provider, spans)
