"""A PostgreSQL cluster under Patroni with a one-node etcd, for the failover tests.

Everything lives in a temporary directory and listens on free loopback ports; PostgreSQL and
Patroni run as the ``postgres`` OS user when the tests run as root (initdb refuses root). The
packages ``etcd-server`` and ``patroni`` must be installed (``.ci/run`` installs them); without
them :func:`patroni_cluster` raises, it never skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PG_BINDIR = os.environ.get("SQL_LEASE_PG_BINDIR", "/usr/lib/postgresql/15/bin")
SUPERUSER_PASSWORD = "failover-test-pw"
SCOPE = "sql-lease-failover"
# Patroni timings (seconds): a dead leader's key expires after TTL; loop_wait + 2 * retry_timeout <= TTL.
PATRONI_TTL = 10
PATRONI_LOOP_WAIT = 1
PATRONI_RETRY_TIMEOUT = 3
STARTUP_TIMEOUT_S = 180.0


class ClusterError(RuntimeError):
    """The Patroni cluster did not reach the state a test waits for (its logs are attached)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``condition()`` until it returns something truthy (returned); ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):
            result = condition()
            if result:
                return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:g} s for {what}")
        time.sleep(interval_s)


def require_packages() -> None:
    """Raise (never skip) when etcd or Patroni is missing: the failover tests are part of CI."""
    missing = [name for name in ("etcd", "patroni", "patronictl") if shutil.which(name) is None]
    if missing or not os.path.exists(os.path.join(PG_BINDIR, "postgres")):
        raise ClusterError(
            f"the failover tests need etcd, Patroni and PostgreSQL 15 ({', '.join(missing) or PG_BINDIR} missing): "
            "apt-get install -y --no-install-recommends etcd-server patroni (.ci/run does this)"
        )


@dataclass
class Node:
    name: str
    pg_port: int
    api_port: int
    config: Path
    data_dir: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/{path}", timeout=2) as response:
            return json.loads(response.read())

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        return None


@dataclass
class PatroniCluster:
    workdir: Path
    nodes: list[Node]
    etcd_port: int
    strict: bool
    etcd: subprocess.Popen[bytes] | None = None
    former_primary: str | None = None
    run_as: list[str] = field(default_factory=list)

    # -- URLs ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The libpq multi-host URL of every node, following the primary (target_session_attrs=read-write)."""
        hosts = ",".join(f"127.0.0.1:{node.pg_port}" for node in self.nodes)
        return f"postgresql://postgres:{SUPERUSER_PASSWORD}@{hosts}/postgres?target_session_attrs=read-write"

    def node_url(self, name: str) -> str:
        """A URL of one node only (no failover)."""
        return f"postgresql://postgres:{SUPERUSER_PASSWORD}@127.0.0.1:{self.node(name).pg_port}/postgres"

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    # -- state --------------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (``GET /cluster`` of any node that answers)."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                return list(node.api("cluster")["members"])
        return []

    def roles(self) -> dict[str, str]:
        return {m["name"]: m["role"] for m in self.members() if m.get("state") in ("running", "streaming")}

    def leader(self) -> str | None:
        return next((name for name, role in self.roles().items() if role == "leader"), None)

    def wait_healthy(self, timeout_s: float = 120.0, members: int | None = None) -> str:
        """Wait until there is a leader and a synchronous standby (and ``members`` running nodes,
        all by default), and the leader accepts writes; return the leader's name."""
        wanted = len(self.nodes) if members is None else members

        def healthy() -> str | None:
            roles = self.roles()
            leader = next((name for name, role in roles.items() if role == "leader"), None)
            if leader is None or "sync_standby" not in roles.values() or len(roles) < wanted:
                return None
            return leader if self.node(leader).api("primary") else None

        return str(self._wait(healthy, timeout_s, "a leader and a synchronous standby"))

    def wait_leader_other_than(self, old: str, timeout_s: float = 120.0) -> str:
        def promoted() -> str | None:
            leader = self.leader()
            return leader if leader not in (None, old) and self.node(leader).api("primary") else None

        return str(self._wait(promoted, timeout_s, f"a leader other than {old}"))

    def _wait(self, condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
        try:
            return wait_for(condition, timeout_s, what, interval_s=0.25)
        except TimeoutError as exc:
            raise ClusterError(f"{exc}; members: {self.members()}\n{self.logs()}") from None

    def logs(self, tail: int = 30) -> str:
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # -- actions ------------------------------------------------------------------------------

    def start_node(self, name: str) -> None:
        node = self.node(name)
        log = open(node.log, "ab")  # noqa: SIM115 (the child keeps it)
        try:
            node.process = subprocess.Popen(
                [*self.run_as, "patroni", str(node.config)],
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def kill_node(self, name: str) -> None:
        """``kill -9`` the node's Patroni and its postmaster (a crash of the machine, as far as
        the cluster can tell; the postmaster's backends exit on its death)."""
        node = self.node(name)
        postmaster = node.postmaster_pid()
        if node.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGKILL)
            node.process.wait(timeout=30)
            node.process = None
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(postmaster, signal.SIGKILL)  # the postmaster leads its own session
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGKILL)
            wait_for(lambda: not _alive(postmaster), 30, f"postmaster {postmaster} to die")

    def switchover(self, leader: str, candidate: str) -> None:
        node = self.node(leader)
        result = subprocess.run(
            [
                *self.run_as,
                "patronictl",
                "-c",
                str(node.config),
                "switchover",
                *_flags(leader=leader, candidate=candidate),
                "--force",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise ClusterError(f"patronictl switchover failed: {result.stdout}{result.stderr}")

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.kill_node(node.name)
        if self.etcd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.etcd.pid, signal.SIGKILL)
            self.etcd.wait(timeout=30)
            self.etcd = None


def _flags(**flags: str) -> list[str]:
    """``--name value`` command-line options, ``_`` in names written ``-``."""
    return [item for name, value in flags.items() for item in ("--" + name.replace("_", "-"), value)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    return True


def _node_config(cluster: PatroniCluster, node: Node) -> dict[str, Any]:
    auth = {"username": "postgres", "password": SUPERUSER_PASSWORD}
    return {
        "scope": SCOPE,
        "name": node.name,
        "log": {"level": "WARNING"},
        "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
        "etcd3": {"hosts": [f"127.0.0.1:{cluster.etcd_port}"]},
        "bootstrap": {
            "dcs": {
                "ttl": PATRONI_TTL,
                "loop_wait": PATRONI_LOOP_WAIT,
                "retry_timeout": PATRONI_RETRY_TIMEOUT,
                "maximum_lag_on_failover": 1048576,
                "synchronous_mode": True,
                "synchronous_mode_strict": cluster.strict,
                "postgresql": {
                    "use_pg_rewind": True,
                    "parameters": {
                        "wal_log_hints": "on",
                        "max_connections": 100,
                        "fsync": "off",  # a throwaway cluster; a crash here is a killed process, not a power cut
                        "log_min_messages": "fatal",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{node.pg_port}",
            "connect_address": f"127.0.0.1:{node.pg_port}",
            "data_dir": str(node.data_dir),
            "bin_dir": PG_BINDIR,
            "pgpass": str(cluster.workdir / f"pgpass.{node.name}"),
            "authentication": {"superuser": auth, "replication": auth, "rewind": auth},
            "parameters": {"unix_socket_directories": str(cluster.workdir)},
            "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 md5", "host replication all 127.0.0.1/32 md5"],
        },
    }


@contextlib.contextmanager
def patroni_cluster(nodes: int = 2, strict: bool = False) -> Iterator[PatroniCluster]:
    """Start etcd and ``nodes`` Patroni nodes (``synchronous_mode: true``; ``strict`` adds
    ``synchronous_mode_strict: true``, which needs three nodes to survive a failover), wait for
    a leader and a synchronous standby, yield the cluster; kill everything and remove the
    directory on the way out, also after a failure."""
    require_packages()
    workdir = Path(tempfile.mkdtemp(prefix="sql_lease_patroni_"))
    os.chmod(workdir, 0o755)
    run_as: list[str] = []
    if os.geteuid() == 0:
        pg_user = pwd.getpwnam("postgres")
        os.chown(workdir, pg_user.pw_uid, pg_user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    cluster = PatroniCluster(
        workdir=workdir,
        etcd_port=_free_port(),
        strict=strict,
        run_as=run_as,
        nodes=[
            Node(
                name=f"pg{i}",
                pg_port=_free_port(),
                api_port=_free_port(),
                config=workdir / f"pg{i}.yml",
                data_dir=workdir / f"pg{i}",
                log=workdir / f"pg{i}.log",
            )
            for i in range(nodes)
        ],
    )
    try:
        peer = _free_port()
        with open(workdir / "etcd.log", "ab") as log:
            cluster.etcd = subprocess.Popen(
                [
                    *run_as,
                    "etcd",
                    *_flags(
                        name="etcd0",
                        data_dir=str(workdir / "etcd"),
                        log_level="warn",
                        listen_client_urls=f"http://127.0.0.1:{cluster.etcd_port}",
                        advertise_client_urls=f"http://127.0.0.1:{cluster.etcd_port}",
                        listen_peer_urls=f"http://127.0.0.1:{peer}",
                        initial_advertise_peer_urls=f"http://127.0.0.1:{peer}",
                        initial_cluster=f"etcd0=http://127.0.0.1:{peer}",
                    ),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        cluster._wait(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{cluster.etcd_port}/health", timeout=2).status == 200,
            60,
            "etcd",
        )
        for node in cluster.nodes:
            node.config.write_text(json.dumps(_node_config(cluster, node)))  # JSON is YAML
        cluster.start_node(cluster.nodes[0].name)  # the first bootstraps; the others clone it
        cluster._wait(cluster.leader, STARTUP_TIMEOUT_S, "the bootstrap of the first node")
        for node in cluster.nodes[1:]:
            cluster.start_node(node.name)
        cluster.wait_healthy(STARTUP_TIMEOUT_S)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
