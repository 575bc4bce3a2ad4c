"""The synchronous face beside the raw drivers: acquire a free key, then release it, cycles/s.

    python benchmarks/sync.py [postgresql://postgres@127.0.0.1:5432/test]

The floors run the very statements the provider runs (psycopg with a RawCursor per connection;
stdlib sqlite3 at the same ``synchronous`` setting), so each ratio is what the library adds.
Targets (issue 10): sync PostgreSQL >= 0.8 x raw psycopg with 1 and 8 threads; sync SQLite
>= 0.8 x raw sqlite3 at the same setting."""

import os
import sqlite3
import sys
import tempfile
import threading
import time
import uuid

import psycopg

from sql_lease import SyncSqlLeaseProvider
from sql_lease.sql.schema import LeaseTableNames
from sql_lease.sql.statements import statements_for

PG = sys.argv[1] if len(sys.argv) > 1 else "postgresql://postgres@127.0.0.1:5432/test"
CYCLES = int(os.environ.get("CYCLES", "3000"))
SCHEMA = "bench_sync"


def run_threads(n, fn):
    per = CYCLES // n
    barrier = threading.Barrier(n + 1)

    def work(i):
        barrier.wait()
        fn(i, per)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return per * n / (time.perf_counter() - t0)


def pg_raw(threads):
    s = statements_for("postgresql", LeaseTableNames("sql_leases", SCHEMA, None))
    conns = [psycopg.connect(PG, autocommit=True, cursor_factory=psycopg.RawCursor) for _ in range(threads)]
    for c in conns:
        c.execute("SET enable_seqscan = off")

    def fn(i, n):
        cur = conns[i].cursor()
        for j in range(n):
            key, owner = f"raw{i}:{j % 64}", uuid.uuid4().hex
            cur.execute(s.acquire, (key, owner, 15000.0, None))
            assert cur.fetchone()[0]
            cur.execute(s.release, (key, owner, None, None))  # any tenure, no minimum hold
            cur.fetchone()

    fn(0, 50)
    r = run_threads(threads, fn)
    for c in conns:
        c.close()
    return r


def pg_lib(threads):
    with SyncSqlLeaseProvider(PG, schema=SCHEMA, pool_size=max(threads, 1)) as p:

        def fn(i, n):
            for j in range(n):
                key, owner = f"lib{i}:{j % 64}", uuid.uuid4().hex
                assert p.acquire_lease(key, owner, 15000).acquired
                p.release_lease(key, owner)

        fn(0, 50)
        return run_threads(threads, fn)


def sqlite_raw(path, sync):
    s = statements_for("sqlite", LeaseTableNames("sql_leases", None, None))
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    for pr in ("PRAGMA busy_timeout = 10000", "PRAGMA journal_mode = WAL", f"PRAGMA synchronous = {sync}"):
        db.execute(pr).fetchall()

    def fn(i, n):
        for j in range(n):
            key, owner = f"raw{i}:{j % 64}", uuid.uuid4().hex
            assert db.execute(s.acquire, (key, owner, 15000, None)).fetchall()[0][0]
            db.execute(s.release, (key, owner, None, None)).fetchall()

    return run_threads(1, fn)


def sqlite_lib(path, sync):
    with SyncSqlLeaseProvider(f"sqlite:///{path}", sqlite_synchronous=sync) as p:

        def fn(i, n):
            for j in range(n):
                key, owner = f"lib{i}:{j % 64}", uuid.uuid4().hex
                assert p.acquire_lease(key, owner, 15000).acquired
                p.release_lease(key, owner)

        return run_threads(1, fn)


if __name__ == "__main__":
    with SyncSqlLeaseProvider(PG, schema=SCHEMA) as p:
        p.migrate()
    for threads in (1, 8):
        raw = max(pg_raw(threads), pg_raw(threads))
        lib = max(pg_lib(threads), pg_lib(threads))
        print(
            f"postgresql {threads} thread(s): raw psycopg {raw:8.0f}  sync provider {lib:8.0f}  ratio {lib / raw:.2f}"
        )
    d = tempfile.mkdtemp()
    path = f"{d}/b.db"
    with SyncSqlLeaseProvider(f"sqlite:///{path}") as p:
        p.migrate()
    for sync in ("NORMAL", "FULL"):
        raw = max(sqlite_raw(path, sync), sqlite_raw(path, sync))
        lib = max(sqlite_lib(path, sync), sqlite_lib(path, sync))
        print(f"sqlite synchronous={sync}: raw sqlite3 {raw:8.0f}  sync provider {lib:8.0f}  ratio {lib / raw:.2f}")
    with psycopg.connect(PG, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
