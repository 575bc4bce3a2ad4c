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

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """The first line from now on that matches ``pattern``; fails after ``timeout_s``."""
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


def test_metrics_app_survives_a_broken_lease(
    tmp_path: Path, env: dict[str, str], processes: list[Process]
) -> None:
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
