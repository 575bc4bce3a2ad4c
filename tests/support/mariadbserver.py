"""A throwaway MariaDB server for the tests that stop, crash, freeze or kill it: a data directory
of its own (``mariadb-install-db``), ``mariadbd`` on a free loopback port, user ``root`` without
a password, a database ``test``. Never the shared server on 3306.

The binaries come from ``$SQL_LEASE_MARIADB_BINDIR`` or the PATH, else /usr/sbin and /usr/bin
(``.ci/run`` installs mariadb-server). Missing binaries are an error, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.pgserver import _free_port

__all__ = ["MariadbServer", "throwaway_mariadb"]

START_TIMEOUT_S = 60.0


def _binary(*names: str) -> str:
    """The first of ``names`` found on ``$SQL_LEASE_MARIADB_BINDIR``, the PATH, /usr/sbin or /usr/bin."""
    bindir = os.environ.get("SQL_LEASE_MARIADB_BINDIR")
    path = os.pathsep.join([*([bindir] if bindir else []), os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    for name in names:
        found = shutil.which(name, path=path)
        if found:
            return found
    raise FileNotFoundError(
        f"no {' or '.join(names)} found (install mariadb-server, as .ci/run does, or set SQL_LEASE_MARIADB_BINDIR)"
    )


class MariadbServer:
    """One ``mariadbd`` on ``port`` over the data directory in ``workdir``: :meth:`start`,
    :meth:`stop` (``fast``: SIGTERM, a clean shutdown; ``immediate``: SIGKILL, a crash whose next
    start recovers from the redo log), :attr:`pid` (for SIGSTOP)."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.workdir, self.port = workdir, port
        self.datadir = workdir / "data"
        self.log = workdir / "mariadb.log"
        self.url = f"mysql://root@127.0.0.1:{port}/test"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None, "the server is not running"
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def install(self) -> None:
        subprocess.run(
            [
                _binary("mariadb-install-db", "mysql_install_db"),
                "--no-defaults",
                f"--datadir={self.datadir}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--innodb-log-file-size=8M",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        """Start the server and wait until it answers a query (a crash recovery included)."""
        assert self._process is None or self._process.poll() is not None, "already running"
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    _binary("mariadbd", "mysqld"),
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    f"--socket={self.workdir / 'mariadb.sock'}",
                    f"--pid-file={self.workdir / 'mariadb.pid'}",
                    f"--port={self.port}",
                    "--bind-address=127.0.0.1",
                    "--user=root",
                    "--skip-name-resolve",
                    "--skip-log-bin",
                    "--innodb-buffer-pool-size=32M",
                    "--innodb-log-file-size=8M",
                    "--max-connections=300",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the test run is not the server's
            )
        self._wait_until_answering()

    def _wait_until_answering(self) -> None:
        import pymysql

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"mariadbd on port {self.port} exited: {self.log_tail()}")
            try:
                pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=1).close()
                return
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"mariadbd on port {self.port} did not answer in {START_TIMEOUT_S:g} s: {self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """``fast``: SIGTERM and wait for the shutdown; ``immediate``: SIGKILL (a crash)."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM if mode == "fast" else signal.SIGKILL)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def execute(self, *statements: str) -> None:
        """Run ``statements`` as root (PyMySQL, autocommit)."""
        from tests.conftest import mysql_execute

        mysql_execute(self.url, *statements)

    def kill_sessions(self) -> int:
        """``KILL CONNECTION`` every client session but this one; how many were killed."""
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", autocommit=True)
        killed = 0
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST "
                    "WHERE ID <> CONNECTION_ID() AND USER <> 'system user' AND COMMAND NOT IN ('Daemon', 'Killed')"
                )
                for (session,) in cursor.fetchall():
                    try:
                        cursor.execute(f"KILL CONNECTION {int(session)}")
                        killed += 1
                    except pymysql.err.OperationalError as exc:
                        if exc.args[0] != 1094:  # ER_NO_SUCH_THREAD: it ended meanwhile
                            raise
        finally:
            conn.close()
        return killed

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


@contextlib.contextmanager
def throwaway_mariadb() -> Iterator[MariadbServer]:
    """A new MariaDB server of its own on a free port, with a database ``test``; removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="sql_lease_mariadb_"))
    server: MariadbServer | None = None
    try:
        for attempt in range(3):  # a free port can be taken before the server binds it (parallel suites)
            server = MariadbServer(workdir, _free_port())
            if attempt == 0:
                server.install()
            try:
                server.start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        assert server is not None
        server.execute("CREATE DATABASE IF NOT EXISTS test")
        yield server
    finally:
        if server is not None:
            server.stop("immediate")
        shutil.rmtree(workdir, ignore_errors=True)
