"""Flask: one lease provider per app (``app.extensions["sql_lease"]``), and a route that takes a
conversation thread for this instance or tells the caller which instance has it.

    pip install 'sql-lease[recipes]'
    export DATABASE_URL=postgresql://app:secret@127.0.0.1:5432/app
    sql-lease migrate --url "$DATABASE_URL"
    INSTANCE_ID=web-1 flask --app examples.flask_app run --port 5001
    INSTANCE_ID=web-2 flask --app examples.flask_app run --port 5002
    curl -X POST localhost:5001/threads/42/messages -d 'hello'   # 200: web-1 handles thread 42
    curl -X POST localhost:5002/threads/42/messages -d 'again'   # 409 {"holder": "web-1", ...}

The first instance to get a message for a thread owns the thread's lease (TTL ``THREAD_TTL_MS``,
extended by each message it handles); the others answer 409 with the holder, so the caller (or a
load balancer with sticky routing) sends the work there.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from flask import Flask, current_app, jsonify, request

from sql_lease import SyncSqlLeaseProvider

THREAD_TTL_MS = 30_000


def create_app(database_url: str | None = None, *, schema: str | None = None, instance_id: str | None = None) -> Flask:
    app = Flask(__name__)
    app.config["INSTANCE_ID"] = instance_id or os.environ.get("INSTANCE_ID") or f"{socket.gethostname()}:{os.getpid()}"
    # One provider per process, shared by every request thread; it connects on first use.
    app.extensions["sql_lease"] = SyncSqlLeaseProvider(
        database_url or os.environ["DATABASE_URL"], schema=schema or os.environ.get("SQL_LEASE_SCHEMA")
    )

    @app.post("/threads/<thread_id>/messages")
    def post_message(thread_id: str) -> Any:
        leases: SyncSqlLeaseProvider = current_app.extensions["sql_lease"]
        me = current_app.config["INSTANCE_ID"]
        # Ours already: the acquire renews it (same fence). Free: it becomes ours. Else: refused.
        result = leases.acquire_lease(f"thread:{thread_id}", me, ttl_ms=THREAD_TTL_MS)
        if not result.acquired:
            return jsonify(holder=result.owner, fence=result.fence, retry_after_ms=result.remaining_ms), 409
        handle_message(thread_id, request.get_data(as_text=True), fence=result.fence)
        return jsonify(handled_by=me, fence=result.fence)

    @app.delete("/threads/<thread_id>/lease")
    def let_go(thread_id: str) -> Any:
        leases: SyncSqlLeaseProvider = current_app.extensions["sql_lease"]
        return jsonify(released=leases.release_lease(f"thread:{thread_id}", current_app.config["INSTANCE_ID"]))

    return app


def handle_message(thread_id: str, text: str, *, fence: int) -> None:
    """The work; write with the fence so a store can reject an instance that lost the thread."""


if __name__ == "__main__":
    create_app().run()
