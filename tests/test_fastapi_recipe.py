"""Leader election in an asyncio service (issue 21, item 6): the FastAPI lifespan recipe
(``examples/fastapi_leader.py``) with two real instances, the leader killed with SIGKILL; and
``examples/metrics_app.py`` surviving ``sql-lease break`` of its lease. Every example handles a
loss (a source check over ``examples/``).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


class Process:
    """A child process whose merged output lines are read by a thread, so a test can wait for one."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.popen = subprocess.Popen(
            args,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout_s: float, since: int | None = None) -> re.Match[str]:
        """The first line from now on (or from line ``since`` of those read) that matches
        ``pattern``; fails after ``timeout_s``."""
        for line in self.lines[since:] if since is not None else ():
            match = re.search(pattern, line)
            if match:
                return match
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(0.01, left))
            except queue.Empty:
                line = ""
            if line is None:
                raise AssertionError(f"exited {self.popen.wait()} before {pattern!r}:\n" + "\n".join(self.lines))
            if line:
                self.lines.append(line)
                match = re.search(pattern, line)
                if match:
                    return match
            if time.monotonic() >= deadline:
                raise AssertionError(f"no line matching {pattern!r} within {timeout_s} s:\n" + "\n".join(self.lines))

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 10) -> str:
        """Signal the process group, wait for the end; everything it printed."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        self._reader.join(timeout=5)
        if self.popen.stdout is not None and not self._reader.is_alive():
            self.popen.stdout.close()
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return "\n".join(self.lines)


@pytest.fixture
def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.stop(signal.SIGKILL)


def sql_lease(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sql_lease", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_metrics_app_survives_a_broken_lease(tmp_path: Path, env: dict[str, str], processes: list[Process]) -> None:
    pytest.importorskip("prometheus_client")
    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    app = Process([sys.executable, str(EXAMPLES / "metrics_app.py"), url, "--port", "0"], env, tmp_path)
    processes.append(app)
    for _ in range(5):  # the app holds 2 s of every 3: break it while held
        fence = int(app.wait_for(r"holding report:daily with fence (\d+)", 30)[1])
        broken = sql_lease(env, "break", "report:daily", "--url", url, "--yes")
        if broken.returncode == 0:
            break
    else:
        raise AssertionError(f"never broke the lease while held: {broken.stdout}{broken.stderr}")
    app.wait_for(r"lost report:daily", 15)  # the loss is an event the app reports...
    again = int(app.wait_for(r"holding report:daily with fence (\d+)", 15)[1])  # ...and it goes on
    assert again > fence
    assert app.popen.poll() is None
    output = app.stop()
    assert "Traceback" not in output, output


# -- the FastAPI leader recipe ---------------------------------------------------------------------

TTL_S = 3.0
TAKEOVER_MARGIN_S = 5.0  # scheduling, process start-up and the waiter's wake-up on a loaded VM


def get_json(port: int, path: str) -> dict[str, object]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def start_instance(env: dict[str, str], name: str, processes: list[Process]) -> tuple[Process, int]:
    args = [sys.executable, "-m", "uvicorn", "fastapi_leader:app", "--host", "127.0.0.1", "--port", "0"]
    instance = Process(args, {**env, "INSTANCE_ID": name}, EXAMPLES)
    processes.append(instance)
    port = int(instance.wait_for(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", 30)[1])
    return instance, port


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def leader_env(request: pytest.FixtureRequest, env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    leader = {"LEADER_KEY": f"scheduler-{os.getpid()}-{time.monotonic_ns()}", "LEADER_TTL_MS": str(int(TTL_S * 1000))}
    if request.param == "sqlite":
        return {**env, **leader, "SQL_LEASE_URL": f"sqlite:///{tmp_path / 'leader.db'}"}
    url, schema = request.getfixturevalue("pg_schema")
    from sqlalchemy.engine import make_url

    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return {**env, **leader, "SQL_LEASE_URL": plain, "SQL_LEASE_SCHEMA": schema}


def test_fastapi_leader_takes_over_after_kill_9(leader_env: dict[str, str], processes: list[Process]) -> None:
    env = leader_env
    first, first_port = start_instance(env, "instance-a", processes)
    fence_a = int(first.wait_for(r"instance-a: leader of \S+ with fence (\d+)", 30, since=0)[1])
    second, second_port = start_instance(env, "instance-b", processes)
    second.wait_for(r"instance-b: waiting for", 30, since=0)
    assert get_json(first_port, "/leader") == {"instance": "instance-a", "leader": True, "fence": fence_a}
    assert get_json(second_port, "/leader")["leader"] is False  # serves requests, does not lead

    killed_at = time.monotonic()
    first.stop(signal.SIGKILL)  # no release: the lease must expire
    fence_b = int(second.wait_for(r"instance-b: leader of \S+ with fence (\d+)", TTL_S + TAKEOVER_MARGIN_S)[1])
    took_over_s = time.monotonic() - killed_at
    print(f"took over {took_over_s:.2f} s after kill -9 (TTL {TTL_S:g} s)")
    assert fence_b > fence_a
    assert took_over_s <= TTL_S + TAKEOVER_MARGIN_S
    assert not any("instance-b: leader" in line for line in second.lines[:-1])  # not before the kill
    second.wait_for(r"instance-b: scheduler tick", 10)

    # a loss is an event: the leader steps down, and (alone) leads again with a larger fence
    broken = sql_lease(
        env,
        "break",
        env["LEADER_KEY"],
        "--url",
        env["SQL_LEASE_URL"],
        "--yes",
        *(["--schema", env["SQL_LEASE_SCHEMA"]] if "SQL_LEASE_SCHEMA" in env else []),
    )
    assert broken.returncode == 0, broken.stdout + broken.stderr
    second.wait_for(r"instance-b: stepped down from \S+: ", TTL_S + TAKEOVER_MARGIN_S)
    fence_again = int(second.wait_for(r"instance-b: leader of \S+ with fence (\d+)", TTL_S + TAKEOVER_MARGIN_S)[1])
    assert fence_again > fence_b

    output = second.stop(signal.SIGTERM)  # a clean shutdown releases the lease
    assert "Traceback" not in output, output
    listed = sql_lease(
        env,
        "list",
        "--url",
        env["SQL_LEASE_URL"],
        *(["--schema", env["SQL_LEASE_SCHEMA"]] if "SQL_LEASE_SCHEMA" in env else []),
    )
    assert listed.returncode == 0 and env["LEADER_KEY"] not in listed.stdout, listed.stdout + listed.stderr


def test_every_example_that_holds_a_lease_handles_its_loss() -> None:
    """A loss is an event to handle: every example that holds a lease (``hold``, ``@leased``)
    catches ``LeaseLostError`` (the plain acquires of the web examples hold nothing across calls)."""
    holders = [path for path in sorted(EXAMPLES.rglob("*.py")) if re.search(r"\.hold\(|@leased\(", path.read_text())]
    assert len(holders) >= 7, holders
    unhandled = [str(path.relative_to(REPO)) for path in holders if "except LeaseLostError" not in path.read_text()]
    assert not unhandled, unhandled
