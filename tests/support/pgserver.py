"""PostgreSQL for the tests: a DSN from the environment, else testcontainers, else a throwaway
cluster started from the local binaries by pytest-postgresql's executor."""

from __future__ import annotations

import contextlib
import gc
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV_URL = "SQL_LEASE_TEST_POSTGRES_URL"
PG_BINDIR = os.environ.get("SQL_LEASE_PG_BINDIR", "/usr/lib/postgresql/15/bin")
PG_CTL_AS_POSTGRES = Path(__file__).with_name("pg_ctl_as_postgres")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _docker_works() -> bool:
    try:
        import docker
    except ImportError:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # a failed probe leaves its socket to the GC
        try:
            with docker.from_env(timeout=3) as client:
                return bool(client.ping())
        except Exception:
            return False
        finally:
            gc.collect()  # here, under this filter, not during some later test


@contextlib.contextmanager
def testcontainers_postgres() -> Iterator[str]:
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:15", driver=None) as container:
        yield container.get_connection_url()


@contextlib.contextmanager
def throwaway_postgres(**server_options: str) -> Iterator[tuple[str, object]]:
    """Start a new cluster from the local binaries on a free port; yields (url, executor).

    As root, pg_ctl runs as the ``postgres`` OS user (initdb refuses root). ``server_options``
    become ``-c name=value`` settings.
    """
    from pytest_postgresql.executors.proc import PostgreSQLExecutor

    as_root = os.geteuid() == 0
    workdir = tempfile.mkdtemp(prefix="sql_lease_pg_")
    os.chmod(workdir, 0o755)
    if as_root:
        pg_user = pwd.getpwnam("postgres")
        os.chown(workdir, pg_user.pw_uid, pg_user.pw_gid)
    options = " ".join(f"-c {name}={value}" for name, value in server_options.items())
    for attempt in range(3):  # a free port can be taken before the server binds it (parallel suites)
        port = _free_port()
        executor = PostgreSQLExecutor(
            executable=str(PG_CTL_AS_POSTGRES) if as_root else os.path.join(PG_BINDIR, "pg_ctl"),
            host="127.0.0.1",
            port=port,
            datadir=os.path.join(workdir, "data"),
            unixsocketdir=workdir,
            logfile=os.path.join(workdir, "postgresql.log"),
            startparams="-w",
            dbname="postgres",
            postgres_options=options,
        )
        try:
            executor.start()
            _wait_until_accepting(port)
            break
        except Exception:
            with contextlib.suppress(Exception):
                executor.stop()
            if attempt == 2:
                shutil.rmtree(workdir, ignore_errors=True)
                raise
            time.sleep(1.0)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", executor
    finally:
        with contextlib.suppress(Exception):
            executor.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_until_accepting(port: int, timeout_s: float = 60) -> None:
    """Until the server on ``port`` accepts connections: the executor returns once the port is open,
    which can be while the server still says "the database system is starting up"."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = subprocess.run(
            [os.path.join(PG_BINDIR, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-t", "1"],
            check=False,
        )
        if ready.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the throwaway cluster on port {port} did not accept connections in {timeout_s:g} s")
        time.sleep(0.05)


def start_again(executor: Any, attempts: int = 3) -> None:
    """Start a throwaway cluster stopped with ``-m immediate`` (a crash); under load its first
    start has been seen to fail, so try again a few times before giving up."""
    for attempt in range(attempts):
        try:
            executor.start()
            _wait_until_accepting(executor.port)
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            with contextlib.suppress(Exception):
                executor._clear_process()  # mirakuru's handle of the launcher, so start() launches again
            time.sleep(1.0)


@contextlib.contextmanager
def postgres_url() -> Iterator[str]:
    """The PostgreSQL the tests use, in the documented order of preference."""
    if os.environ.get(ENV_URL):
        yield os.environ[ENV_URL]
    elif _docker_works():
        with testcontainers_postgres() as url:
            yield url
    else:
        with throwaway_postgres() as (url, _executor):
            yield url
