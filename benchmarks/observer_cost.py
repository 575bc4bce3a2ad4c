"""Cost of observing lease operations: the same acquire-then-release cycles with no observer, with
an observer that does nothing (the cost of reporting itself), with the Prometheus exporter and
with the OpenTelemetry exporter (SDK meter and tracer, spans batched to an in-memory exporter),
side by side in one run (rounds interleaved, median of the rounds).

    python benchmarks/observer_cost.py --url sqlite:///tmp/cost.db --url postgresql://postgres@127.0.0.1:5432/test

Prints per face and mode the cycles per second and the client's CPU time per cycle (process CPU
time, every thread: steadier than wall time on a loaded machine), each with its ratio to no
observer, and the cost of one report alone (``observe.operation_done`` with the exporter, no
database) in microseconds. SQLite runs with ``synchronous=NORMAL``, so the disk adds less noise.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider, observe
from sql_lease.metrics import enable_opentelemetry, enable_prometheus

TABLE = {"table_name": "sql_lease_bench", "version_table": "sql_lease_bench_alembic_version"}


def opentelemetry() -> Callable[[], None]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    tracers = TracerProvider()
    tracers.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    exporter = enable_opentelemetry(meter_provider=meters, tracer_provider=tracers)

    def stop() -> None:
        exporter.close()
        tracers.shutdown()
        meters.shutdown()

    return stop


def prometheus() -> Callable[[], None]:
    return enable_prometheus(CollectorRegistry()).close


def do_nothing() -> Callable[[], None]:
    return observe.add_observer(observe.LeaseObserver())


MODES: dict[str, Callable[[], Callable[[], None]] | None] = {
    "none": None,
    "do-nothing": do_nothing,
    "prometheus": prometheus,
    "opentelemetry": opentelemetry,
}


Figures = tuple[float, float]  # cycles per second, client CPU microseconds per cycle


async def cycles_async(provider: SqlLeaseProvider, count: int) -> Figures:
    owner = uuid.uuid4().hex
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        await provider.acquire_lease(f"cost:{i % 64}", owner, 15_000)
        await provider.release_lease(f"cost:{i % 64}", owner)
    return count / (time.perf_counter() - started), (time.process_time() - cpu) / count * 1e6


def cycles_sync(provider: SyncSqlLeaseProvider, count: int) -> Figures:
    owner = uuid.uuid4().hex
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        provider.acquire_lease(f"cost:{i % 64}", owner, 15_000)
        provider.release_lease(f"cost:{i % 64}", owner)
    return count / (time.perf_counter() - started), (time.process_time() - cpu) / count * 1e6


def medians(figures: dict[str, list[Figures]]) -> dict[str, Figures]:
    return {
        mode: (statistics.median(f[0] for f in values), statistics.median(f[1] for f in values))
        for mode, values in figures.items()
    }


def measure(run: Callable[[int], Figures], cycles: int, rounds: int) -> dict[str, Figures]:
    run(cycles // 4)  # warm up
    figures: dict[str, list[Figures]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode, enable in MODES.items():
            stop = enable() if enable is not None else None
            try:
                figures[mode].append(run(cycles))
            finally:
                if stop is not None:
                    stop()
    return medians(figures)


def report_cost(count: int = 100_000) -> dict[str, float]:
    """Microseconds per ``observe.operation_done`` call per mode (no database)."""
    costs = {}
    for mode, enable in MODES.items():
        stop = enable() if enable is not None else None
        try:
            started = time.perf_counter()
            for _ in range(count):
                if observe.observers:
                    observe.operation_done("acquire", "cost:1", "sqlite", 0.001, True)
            costs[mode] = (time.perf_counter() - started) / count * 1e6
        finally:
            if stop is not None:
                stop()
    return costs


def show(title: str, figures: dict[str, Figures]) -> None:
    rate0, cpu0 = figures["none"]
    for mode, (rate, cpu) in figures.items():
        print(
            f"{title:<18} {mode:<14} {rate:7.0f} cycles/s ({rate / rate0:.3f})   "
            f"client CPU {cpu:7.1f} us/cycle ({cpu / cpu0:.3f})",
            flush=True,
        )


async def main(urls: list[str], cycles: int, rounds: int) -> None:
    for url in urls:
        options: dict[str, Any] = {"sqlite_synchronous": "NORMAL"} if url.startswith("sqlite") else {}
        async with SqlLeaseProvider(url, **TABLE, **options) as provider:
            await provider.migrate()
            figures: dict[str, list[Figures]] = {mode: [] for mode in MODES}
            await cycles_async(provider, cycles // 4)
            for _ in range(rounds):
                for mode, enable in MODES.items():
                    stop = enable() if enable is not None else None
                    try:
                        figures[mode].append(await cycles_async(provider, cycles))
                    finally:
                        if stop is not None:
                            stop()
            show(f"{provider.dialect_name} async", medians(figures))
        with SyncSqlLeaseProvider(url, **TABLE, **options) as sync_provider:
            show(f"{sync_provider.dialect_name} sync", measure(lambda n: cycles_sync(sync_provider, n), cycles, rounds))
    costs = report_cost()
    print("one report alone: " + "   ".join(f"{mode} {us:.2f} us" for mode, us in costs.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", required=True, help="a database URL (repeat for several)")
    parser.add_argument("--cycles", type=int, default=500, help="acquire+release cycles per round")
    parser.add_argument("--rounds", type=int, default=11, help="rounds per mode, interleaved")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.url, arguments.cycles, arguments.rounds))
