"""Faults for the synchronous face: a throwaway cluster frozen with SIGSTOP, a link partitioned by
stopping the TCP proxy's process (run as ``python -m tests.support.freeze HOST PORT``), and a ticking
thread that measures how long the whole process stalled.

Only processes these tests started themselves are ever stopped (never the shared server). Whatever
freezes is resumed by a separate process after ``at_most_s`` too: a test whose process is itself
stalled (a C call holding the GIL) could never resume it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.tcp_proxy import TcpProxy

__all__ = ["Ticker", "cluster_pids", "frozen", "proxy_process"]


def cluster_pids(executor: Any) -> list[int]:
    """The postmaster of a throwaway cluster (from its ``postmaster.pid``) and its children."""
    postmaster = int(Path(executor.datadir, "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path("/proc", entry, "stat").read_text()
            # the fields after the command name (which may hold spaces) start with state, ppid
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                pids.append(int(entry))
    return pids


@contextlib.contextmanager
def frozen(pids: list[int], at_most_s: float) -> Iterator[None]:
    """SIGSTOP ``pids``, SIGCONT them on the way out, or after ``at_most_s`` seconds by a process of
    its own, whichever comes first."""
    resumer = subprocess.Popen(
        ["sh", "-c", f"sleep {at_most_s}; kill -CONT {' '.join(map(str, pids))} 2>/dev/null"],
        start_new_session=True,
    )
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        _wait_until_stopped(pids)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        resumer.kill()
        resumer.wait()


def _wait_until_stopped(pids: list[int], within_s: float = 5.0) -> None:
    """Until every thread of ``pids`` is stopped: a signal stops a process's threads one by one, and
    a running thread of a multi-threaded server (MariaDB) could still answer a statement meanwhile."""
    deadline = time.monotonic() + within_s
    while True:
        running = []
        for pid in pids:
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        state = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0]
                        if state not in ("T", "t", "Z", "X"):
                            running.append(f"{pid}/{task}:{state}")
        if not running:
            return
        assert time.monotonic() < deadline, f"threads still running after SIGSTOP: {running[:5]}"
        time.sleep(0.005)


class Ticker:
    """A thread that wakes every ``interval_s`` and records the longest gap between two wake-ups:
    how long the whole process (the GIL) was stalled."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.longest_gap_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            self.longest_gap_s = max(self.longest_gap_s, now - last - self.interval_s)
            last = now

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def proxy_process(target_host: str, target_port: int) -> Iterator[tuple[int, int]]:
    """A :class:`TcpProxy` in a process of its own: (its port, its pid). SIGSTOP the pid to
    partition the link (the kernel still completes new TCP handshakes; no byte moves either way)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.freeze", target_host, str(target_port)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent.parent,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield port, process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


async def _serve(target_host: str, target_port: int) -> None:
    proxy = TcpProxy(target_host, target_port)
    await proxy.start()
    print(proxy.port, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2])))
