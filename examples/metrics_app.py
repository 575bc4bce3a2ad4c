"""A worker that serves its lease metrics on ``/metrics`` for Prometheus to scrape.

    pip install 'sql-lease[prometheus]'
    python examples/metrics_app.py [DATABASE_URL] [--port 9108]     (default: sqlite:///example.db)

It enables the Prometheus exporter, starts prometheus_client's HTTP server (port 0 picks a free
one; the address is printed), and then does what a leader-elected worker does: tries for the
``report:daily`` lease every second, holds it for a while when it gets it (renewed in the
background), and sweeps expired rows now and then. A lost lease (``sql-lease break report:daily``,
a renewal refused after a stall) is an event it reports: the block is cancelled, and it goes back
to trying. Point Prometheus at it and import
``dashboards/sql_lease.json`` into Grafana to watch it.
"""

from __future__ import annotations

import argparse
import asyncio

from prometheus_client import start_http_server

from sql_lease import ExpirySweeper, LeaseLostError, LeaseNotAcquiredError, SqlLeaseProvider
from sql_lease.metrics import enable_prometheus


async def work(leases: SqlLeaseProvider) -> None:
    async with ExpirySweeper(leases, interval_s=30):
        while True:
            try:
                async with leases.hold("report:daily", ttl_ms=3_000) as lease:
                    print(f"holding report:daily with fence {lease.fence}", flush=True)
                    await asyncio.sleep(2)
            except LeaseNotAcquiredError as taken:
                print(f"report:daily is held by {taken.holder}", flush=True)
            except LeaseLostError as lost:  # broken, expired or taken over: the block was cancelled
                print(f"lost report:daily: {lost.reason}", flush=True)
            await asyncio.sleep(1)


async def main(url: str, port: int) -> None:
    enable_prometheus()
    server, _ = start_http_server(port, addr="127.0.0.1")
    print(f"serving metrics on http://127.0.0.1:{server.server_port}/metrics", flush=True)
    async with SqlLeaseProvider(url) as leases:
        if url.startswith("sqlite"):
            await leases.migrate()  # PostgreSQL: run `sql-lease migrate` in your deploy instead
        await work(leases)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="sqlite:///example.db")
    parser.add_argument("--port", type=int, default=9108)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.url, arguments.port))
