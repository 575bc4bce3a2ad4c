"""`sql-lease exec` as trustworthy as flock(1): the command's whole process group, the
supervisor's own death, signals before the command starts, terminals, stopped commands, bounded
exits, argument limits, owner ids that name one holder, and escaped database text. Real processes
throughout (and a real pseudo-terminal)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import re
import select
import signal
import subprocess
import termios
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sql_lease import SqlLeaseProvider
from tests.support.cli import invoke
from tests.support.tcp_proxy import TcpProxy
from tests.test_cli import CLI, process_alive, run_cli, start_cli, wait_for

HOOK_ENV = "_SQL_LEASE_TEST_AFTER_ACQUIRE"


def wait_until(predicate: object, timeout: float, what: str) -> float:
    """Poll ``predicate()`` until true; the seconds it took. Fails after ``timeout`` seconds."""
    started = time.monotonic()
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() - started < timeout, f"{what} did not happen within {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - started


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """``communicate`` with a timeout that kills the process (and fails) instead of leaking it."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        pytest.fail(f"sql-lease exec still ran after {timeout} s; stderr: {err}")


def has_open(pid: int, path: Path) -> bool:
    """True if process ``pid`` has ``path`` open (Linux /proc)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
    return False


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


# 1. The command's process group ------------------------------------------------------------------


@pytest.mark.slow
def test_on_exit_default_kills_background_jobs_before_releasing(tmp_path: Path) -> None:
    """Regression: after `sh -c 'work & exit 0'` exec released while `work` still ran."""
    script = (
        f"sleep 30 & echo $! > {tmp_path}/bg; "
        f"(trap '' TERM; sleep 30) & echo $! > {tmp_path}/stubborn; "  # ignores SIGTERM: needs SIGKILL
        "exit 0"
    )
    started = time.monotonic()
    done = run_cli(["exec", "bg", "--ttl", "3s", "--", "sh", "-c", script], tmp_path)
    elapsed = time.monotonic() - started
    background = [int((tmp_path / name).read_text()) for name in ("bg", "stubborn")]
    try:
        assert done.returncode == 0, done.stderr
        time.sleep(0.1)
        assert not any(process_alive(pid) for pid in background), "a background job outlived the lease"
        assert elapsed < 10, elapsed  # SIGTERM, then SIGKILL after --kill-after (TTL/10 = 0.3 s)
        assert invoke(["status", "bg"], tmp_path).returncode == 1
    finally:
        for pid in background:
            kill_quietly(pid)


@pytest.mark.slow
def test_on_exit_wait_holds_the_lease_until_the_group_is_empty(tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = (
        f"(while [ ! -e {go} ]; do sleep 0.05; done) & echo $! > {tmp_path}/bg; touch {tmp_path}/leader-done; exit 4"
    )
    proc = start_cli(["exec", "bgw", "--ttl", "2s", "--on-exit", "wait", "--", "sh", "-c", script], tmp_path)
    try:
        wait_for(tmp_path / "leader-done")
        background = int((tmp_path / "bg").read_text())
        time.sleep(2.5)  # longer than the TTL: the lease must be renewed meanwhile (2 s: a 1 s TTL flaked)
        assert proc.poll() is None, "exec returned while a background job of the command still ran"
        status = invoke(["status", "bgw"], tmp_path)
        assert status.returncode == 0 and "held by" in status.stdout
        refused = run_cli(["exec", "bgw", "--", "touch", str(tmp_path / "second-ran")], tmp_path)
        assert refused.returncode == 75
        go.touch()
        _out, err = finish(proc, 10)
        assert proc.returncode == 4, err  # the command's own status
        assert not process_alive(background)
        assert invoke(["status", "bgw"], tmp_path).returncode == 1
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_on_exit_choice_is_validated_and_documented(tmp_path: Path) -> None:
    assert invoke(["exec", "k", "--on-exit", "linger", "--", "true"], tmp_path).returncode == 2
    help_text = invoke(["exec", "--help"], tmp_path).stdout
    assert "--on-exit" in help_text and "setsid" in help_text


# 2. The supervisor's death, and signals before the command starts ------------------------------------


def assert_dies_with_a_killed_supervisor(tmp_path: Path, exec_args: list[str], script: str, what: str) -> None:
    """Run ``sql-lease exec EXEC_ARGS -- sh -c SCRIPT`` (SCRIPT writes a pid to ./pid), `kill -9`
    exec, and require that process to die within a few seconds."""
    proc = start_cli(["exec", *exec_args, "--", "sh", "-c", script], tmp_path)
    wait_for(tmp_path / "pid")
    wait_until(lambda: (tmp_path / "pid").read_text().strip() != "", 5, "the pid file to be written")
    pid = int((tmp_path / "pid").read_text())
    try:
        proc.kill()
        proc.wait(timeout=10)  # not communicate(): a surviving process would keep the pipes open
        wait_until(lambda: not process_alive(pid), 5, f"{what} to die with its supervisor")
        proc.communicate(timeout=10)
    finally:
        kill_quietly(pid)


@pytest.mark.slow
def test_command_dies_with_a_killed_supervisor(tmp_path: Path) -> None:
    """Regression: after `kill -9` of exec the command kept running with no lease."""
    assert_dies_with_a_killed_supervisor(
        tmp_path, ["orphan", "--ttl", "5s"], f"echo $$ > {tmp_path}/pid; exec sleep 60", "the command"
    )


@pytest.mark.slow
def test_the_commands_whole_group_dies_with_a_killed_supervisor(tmp_path: Path) -> None:
    """Regression (a new user's trial of ``exec --limit 3 -- ./render.sh``): after `kill -9` of exec
    the script died (the parent-death signal) but the work it had started ran on, orphaned, beside
    the next holder's: four renders under a limit of three. A watchdog that outlives exec kills
    what is left of the command's process group."""
    assert_dies_with_a_killed_supervisor(
        tmp_path, ["render", "--limit", "3", "--ttl", "5s"], f"sleep 60 & echo $! > {tmp_path}/pid; wait", "its worker"
    )


@pytest.mark.slow
def test_a_supervisor_runs_one_watchdog_and_leaves_none_behind(tmp_path: Path) -> None:
    """While the command runs, exec has one watchdog child; once exec has exited normally, it is gone."""
    proc = start_cli(["exec", "tidy", "--ttl", "5s", "--", "sh", "-c", "echo $PPID > ppid; sleep 1"], tmp_path)
    wait_for(tmp_path / "ppid")
    wait_until(lambda: (tmp_path / "ppid").read_text().strip() != "", 5, "the ppid file to be written")
    exec_pid = int((tmp_path / "ppid").read_text())
    found = subprocess.run(["pgrep", "-P", str(exec_pid), "-f", "sql-lease-watchdog"], capture_output=True, text=True)
    watchdogs = [int(pid) for pid in found.stdout.split()]
    assert len(watchdogs) == 1, found
    _out, err = finish(proc, 20)
    assert proc.returncode == 0, err
    wait_until(lambda: not process_alive(watchdogs[0]), 5, "the watchdog to exit")


@pytest.mark.slow
def test_sigterm_between_acquire_and_start_releases_and_exits_143(tmp_path: Path) -> None:
    """Regression: a SIGTERM after the acquire but before the command started killed exec by the
    default action and left the lease held for its TTL. The private hook makes exec pause right
    after the acquire, so the signal lands in that window deterministically."""
    hook = tmp_path / "acquired"
    env = dict(os.environ, **{HOOK_ENV: str(hook)})
    proc = subprocess.Popen(
        [*CLI, "exec", "window", "--ttl", "30s", "--", "touch", str(tmp_path / "ran")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(hook)
    proc.send_signal(signal.SIGTERM)
    _out, err = finish(proc, 10)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    assert not (tmp_path / "ran").exists()
    assert invoke(["status", "window"], tmp_path).returncode == 1, "the lease was left held"


@pytest.mark.slow
def test_sigterm_while_waiting_for_the_lease_exits_143(tmp_path: Path) -> None:
    holder = start_cli(  # holds until killed below (a fixed sleep raced a slow interpreter start)
        ["exec", "busy", "--owner", "holder", "--", "sh", "-c", f"touch {tmp_path}/s; exec sleep 60"], tmp_path
    )
    try:
        wait_for(tmp_path / "s")
        waiter = start_cli(["exec", "busy", "--wait", "--", "touch", str(tmp_path / "ran")], tmp_path)
        # exec installs its handlers before it opens the database: once the file is open, it waits
        wait_until(lambda: has_open(waiter.pid, tmp_path / "sql_lease.db"), 20, "the waiter to open the database")
        waiter.send_signal(signal.SIGTERM)
        _out, err = finish(waiter, 10)
        assert waiter.returncode == 128 + signal.SIGTERM, (waiter.returncode, err)
        assert "Traceback" not in err
        assert not (tmp_path / "ran").exists()
    finally:
        holder.kill()
        holder.communicate()


# 3. Terminals and stopped commands -------------------------------------------------------------------


def run_under_pty(args: list[str], cwd: Path, typed: bytes, timeout: float) -> tuple[int, bytes]:
    """Run the CLI with a new pseudo-terminal as its controlling terminal (stdin, stdout and stderr),
    in the terminal's foreground process group as a shell would start it; type ``typed``.
    (exit status, everything written to the terminal)."""
    master, slave = os.openpty()

    def controlling_terminal() -> None:  # in the child, after setsid() (start_new_session)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        proc = subprocess.Popen(
            [*CLI, *args],
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
    finally:
        os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        os.write(master, typed)
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError as exc:  # EIO: every slave descriptor is closed
                    if exc.errno != errno.EIO:
                        raise
                    chunk = b""
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"exec under a terminal did not finish in {timeout} s; terminal output: {output!r}")
        return proc.returncode, output
    finally:
        os.close(master)


@pytest.mark.slow
def test_interactive_command_reads_from_the_terminal(tmp_path: Path) -> None:
    """Regression: under a terminal the command (in a background process group) was stopped by
    SIGTTIN at its first read, and exec renewed its lease forever."""
    code, output = run_under_pty(
        ["exec", "tty", "--ttl", "2s", "--", "sh", "-c", "read x; echo got:$x"], tmp_path, b"hello\n", 10
    )
    assert code == 0, output
    assert b"got:hello" in output
    assert invoke(["status", "tty"], tmp_path).returncode == 1


@pytest.mark.slow
def test_a_stopped_command_is_terminated_instead_of_renewed_forever(tmp_path: Path) -> None:
    script = f"echo $$ > {tmp_path}/pid; kill -STOP $$; touch {tmp_path}/continued"
    started = time.monotonic()
    proc = start_cli(["exec", "stopped", "--ttl", "1s", "--", "sh", "-c", script], tmp_path)
    try:
        _out, err = finish(proc, 10)
        assert proc.returncode == 76, err
        assert "stopped" in err
        assert time.monotonic() - started < 8
        command = int((tmp_path / "pid").read_text())
        assert not process_alive(command)
        assert not (tmp_path / "continued").exists()
        assert invoke(["status", "stopped"], tmp_path).returncode == 1
    finally:
        if (tmp_path / "pid").exists():
            kill_quietly(int((tmp_path / "pid").read_text() or 0) or -1)


# 4. Bounded exits and argument limits ---------------------------------------------------------------


@pytest.fixture(
    params=[pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("mysql", marks=pytest.mark.mysql)]
)
def proxied_db(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, TcpProxy]]:
    """(url through a TCP proxy, schema (MySQL: database), the proxy) of the test session's
    PostgreSQL schema or MySQL database; the proxy runs on a loop in its own thread."""
    url, schema = request.getfixturevalue("mysql_db" if request.param == "mysql" else "pg_schema")
    target = urlsplit(url)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
    proxied = url.replace(target.netloc, f"{target.netloc.rsplit('@', 1)[0]}@127.0.0.1:{proxy.port}", 1)
    if "@" not in target.netloc:
        proxied = url.replace(target.netloc, f"127.0.0.1:{proxy.port}", 1)
    proxy.loop = loop  # type: ignore[attr-defined]
    try:
        yield proxied, schema, proxy
    finally:
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.slow
def test_exec_exits_76_soon_after_the_database_becomes_unreachable(
    proxied_db: tuple[str, str, TcpProxy], tmp_path: Path
) -> None:
    """Regression: after a loss caused by an unreachable database, exec spent 10 s on a doomed
    release before it exited 76."""
    url, schema, proxy = proxied_db
    key = f"partition-{uuid.uuid4().hex[:8]}"
    proc = start_cli(
        [
            "exec",
            key,
            "--url",
            url,
            "--schema",
            schema,
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            f"touch {tmp_path}/s; sleep 60",
        ],
        tmp_path,
    )
    try:
        wait_for(tmp_path / "s")
        proxy.loop.call_soon_threadsafe(proxy.stall)  # type: ignore[attr-defined]
        cut = time.monotonic()
        _out, err = finish(proc, 30)
        took = time.monotonic() - cut
        assert proc.returncode == 76, err
        # loss is declared within the TTL; then SIGTERM, SIGKILL after TTL/10, and a bounded release
        assert took < 4, f"exec took {took:.1f} s after the database became unreachable"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_kill_after_longer_than_the_safety_margin_is_refused(tmp_path: Path) -> None:
    """Regression: --kill-after beyond TTL/10 silently let the command outlive its lease."""
    refused = invoke(["exec", "k", "--ttl", "1s", "--kill-after", "500ms", "--", "true"], tmp_path)
    assert refused.returncode == 2 and "--kill-after" in refused.stderr and "TTL/10" in refused.stderr
    assert not (tmp_path / "sql_lease.db").exists()
    allowed = run_cli(
        ["exec", "k", "--ttl", "1s", "--kill-after", "500ms", "--allow-kill-after-beyond-ttl", "--", "true"], tmp_path
    )
    assert allowed.returncode == 0, allowed.stderr
    assert run_cli(["exec", "k", "--ttl", "1s", "--kill-after", "100ms", "--", "true"], tmp_path).returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ["--wait", "--timeout", "87601h"],
        ["--wait", "--timeout", "9" * 400],
        ["--ttl", "1e400h"],
        ["--ttl", "9" * 400 + "h"],
        ["--kill-after", "9" * 400, "--allow-kill-after-beyond-ttl"],
        ["--ttl", "nan"],
        ["--ttl", "inf"],
    ],
)
def test_out_of_range_durations_give_a_message_and_exit_2(args: list[str], tmp_path: Path) -> None:
    """Regression: `--wait --timeout 87601h` gave a traceback and exit 1."""
    done = invoke(["exec", "k", *args, "--", "true"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip()
    assert not (tmp_path / "sql_lease.db").exists()


# 6. Text from the database is escaped ----------------------------------------------------------------

HOSTILE_OWNER = "mallory\r\nesc: free\x1b[2J\x1b]0;title\x07\x9b31m\x7f\u2028\u2029\u202eend"


def test_status_escapes_control_characters_from_the_database(tmp_path: Path) -> None:
    """Regression: a foreign owner id was printed raw (terminal escapes, fake lines)."""
    url = f"sqlite:///{tmp_path}/sql_lease.db"

    async def plant() -> None:
        async with SqlLeaseProvider(url) as provider:
            await provider.migrate()
            assert await provider.acquire_lease("esc", HOSTILE_OWNER, 60_000)

    asyncio.run(plant())
    done = invoke(["status", "esc", "--url", url], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and done.stdout.endswith("\n")
    text = done.stdout[:-1]
    for raw in ("\r", "\x1b", "\x07", "\x9b", "\x7f", "\u2028", "\u2029", "\u202e"):
        assert raw not in text, repr(raw)
    assert "mallory\\r\\nesc: free\\x1b[2J" in text
    refused = run_cli(["exec", "esc", "--url", url, "--", "true"], tmp_path)
    assert refused.returncode == 75
    assert not any(raw in refused.stderr for raw in ("\r", "\x1b", "\x07", "\x9b", "\x7f", "\u2028"))


# Issue 8 item 5: an owner id names one holder ----------------------------------------------------------


def test_exec_with_an_owner_waits_within_its_timeout_and_lets_the_lease_go(tmp_path: Path) -> None:
    """``--owner X --wait --timeout T``: the run takes the key under a fresh id, hands it to X and runs;
    a check of hold()'s arguments (timeout_s only with wait=True) made it crash after the handoff,
    leaving X's lease held for its TTL (found by a review)."""
    url = f"sqlite:///{tmp_path}/owner.db"
    assert run_cli(["migrate", "--url", url], tmp_path).returncode == 0
    for _ in range(2):  # the second run finds the key free: the first let it go
        done = run_cli(
            ["exec", "jobkey", "--url", url, "--owner", "worker-1", "--wait", "--timeout", "10s", "--", "echo", "ran"],
            tmp_path,
        )
        assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
    assert run_cli(["status", "jobkey", "--url", url], tmp_path).returncode == 1  # free


@pytest.mark.slow
def test_a_second_exec_with_the_same_owner_is_refused(tmp_path: Path) -> None:
    """Regression: two runs with the same --owner ran at once with the same fence."""
    go = tmp_path / "go"
    first = start_cli(
        [
            "exec",
            "same",
            "--owner",
            "host-1",
            "--",
            "sh",
            "-c",
            f'echo "$SQL_LEASE_FENCE" > {tmp_path}/fence; while [ ! -e {go} ]; do sleep 0.05; done',
        ],
        tmp_path,
    )
    try:
        wait_for(tmp_path / "fence")
        wait_until(lambda: (tmp_path / "fence").read_text().strip() != "", 5, "the fence to be written")
        second = run_cli(["exec", "same", "--owner", "host-1", "--", "touch", str(tmp_path / "second-ran")], tmp_path)
        assert second.returncode == 75, second.stderr
        assert "--retry-owner" in second.stderr and "host-1" in second.stderr
        assert not (tmp_path / "second-ran").exists()
        status = invoke(["status", "same"], tmp_path)
        assert status.returncode == 0 and "held by host-1" in status.stdout  # the first still holds it
        # an explicit retry of the same job is let through (semantic 3: same owner, same fence)
        retry = run_cli(
            ["exec", "same", "--owner", "host-1", "--retry-owner", "--", "sh", "-c", 'echo "$SQL_LEASE_FENCE"'],
            tmp_path,
        )
        assert retry.returncode == 0, retry.stderr
        assert retry.stdout.strip() == (tmp_path / "fence").read_text().strip()
        go.touch()
        _out, err = finish(first, 10)
        # the retry released the tenure both runs shared while the first still ran: lost, unseen
        assert first.returncode == 76 and "lost while the command ran" in err, err
    finally:
        go.touch()
        if first.poll() is None:
            first.kill()
            first.communicate()


# Issue 21 item 4: --quiet, as flock -n: a refused run prints nothing -----------------------------------


def test_quiet_refusal_prints_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/quiet.db"
    held = invoke(["acquire", "nightly", "--url", url, "--owner", "other-host", "--ttl", "5m"], tmp_path)
    assert held.returncode == 0, held.stderr
    ran = tmp_path / "ran"
    for extra, code in (
        (["--quiet"], 75),
        (["-q"], 75),
        (["-q", "--conflict-exit-code", "0"], 0),
        (["-q", "--wait", "--timeout", "200ms"], 75),
        (["-q", "--owner", "other-host"], 75),  # the same owner id: refused as a second run
    ):
        done = run_cli(["exec", "nightly", "--url", url, *extra, "--", "touch", str(ran)], tmp_path)
        assert (done.returncode, done.stdout, done.stderr) == (code, "", ""), extra
    assert not ran.exists()
    loud = run_cli(["exec", "nightly", "--url", url, "--", "touch", str(ran)], tmp_path)
    assert loud.returncode == 75 and "held by 'other-host'" in loud.stderr
    # --quiet hushes refusals only: the command's own output and failures still show
    script = "echo out; echo err >&2; exit 3"
    free = run_cli(["exec", "free-key", "--url", url, "-q", "--", "sh", "-c", script], tmp_path)
    assert (free.returncode, free.stdout, free.stderr) == (3, "out\n", "err\n")
    bad = run_cli(["exec", "k", "-q", "--url", f"sqlite:///{tmp_path}/no-such-dir/x.db", "--", "true"], tmp_path)
    assert bad.returncode == 78 and bad.stderr.startswith("sql-lease: ")


# Issue 21 item 9: while exec --wait waits on a terminal, one status line --------------------------------


def screen(output: bytes) -> list[str]:
    """The lines a terminal shows for ``output``: a carriage return moves to the line's start,
    ESC[K erases from the cursor to its end, a newline starts the next line."""
    lines, line, col = [], "", 0
    text = output.decode("utf-8", "replace")
    i = 0
    while i < len(text):
        if text.startswith("\x1b[K", i):
            line, i = line[:col], i + 3
            continue
        ch = text[i]
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append(line)
            line, col = "", 0
        else:
            line = line[:col] + ch + line[col + 1 :]
            col += 1
        i += 1
    return [*lines, line] if line else lines


def test_waiting_on_a_terminal_shows_one_status_line_that_disappears(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/wait.db"
    held = invoke(["acquire", "report", "--url", url, "--owner", "other-host", "--ttl", "1m"], tmp_path)
    assert held.returncode == 0, held.stderr
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [*CLI, "exec", "report", "--url", url, "--wait", "--", "echo", "ran"],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
        )
    finally:
        os.close(slave)
    output, released = b"", False
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError as exc:  # EIO: the process closed the terminal
                    if exc.errno != errno.EIO:
                        raise
                    chunk = b""
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
            if not released and output.count(b"waiting for report") >= 2:  # shown, then updated in place
                release = invoke(["release", "report", "--url", url, "--owner", "other-host"], tmp_path)
                assert release.returncode == 0, release.stderr
                released = True
        assert proc.wait(timeout=10) == 0, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert released, output
    assert re.search(rb"waiting for report, held by other-host, expires in \d+s", output), output
    assert b"\n" not in output[: output.rfind(b"waiting for")]  # updated in place, on one line
    assert screen(output) == ["ran"], (screen(output), output)


def test_waiting_without_a_terminal_prints_no_status_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/wait.db"
    assert invoke(["acquire", "k", "--url", url, "--owner", "other", "--ttl", "1m"], tmp_path).returncode == 0
    done = run_cli(["exec", "k", "--url", url, "--wait", "--timeout", "1500ms", "--", "true"], tmp_path)
    assert done.returncode == 75 and "waiting for" not in done.stderr and done.stderr.count("\n") == 1


# -- issue 22: exec --data ----------------------------------------------------------------------------


@pytest.mark.parametrize("owner", [[], ["--owner", "nightly-job"]])
def test_exec_stores_data_with_its_lease(owner: list[str], tmp_path: Path) -> None:
    """`exec --data` (JSON, @file or -) is stored with exec's lease: the command sees it with `show`."""
    url = f"sqlite:///{tmp_path}/data.db"
    (tmp_path / "job.json").write_text('{"job": 42, "by": "cron"}')
    show = " ".join([*CLI, "show", "k", "--json", "--url", url])
    for data, stdin in (('{"job": 42, "by": "cron"}', None), ("@job.json", None), ("-", '{"job": 42, "by": "cron"}')):
        args = ["exec", "k", "--url", url, *owner, "--data", data, "--", "sh", "-c", show]
        done = run_cli(args, tmp_path, input=stdin)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["data"] == {"job": 42, "by": "cron"}, done.stdout


def test_exec_refuses_bad_data_before_running_anything(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/bad.db"
    for bad in ("{nope", "[1, 2]", "@missing.json"):
        done = invoke(["exec", "k", "--url", url, "--data", bad, "--", "touch", "ran"], tmp_path)
        assert done.returncode == 2 and "--data" in done.stderr, done.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "bad.db").exists()


# A run whose first statement after the claim's transfer stalls past the TTL ---------------------------


async def test_exec_claim_stalled_after_its_transfer_does_not_run(tmp_path: Path) -> None:
    """Reviewer (the decorator's deco2, in exec): after the claim's transfer, hold() acquired again
    as --owner, and an acquire by the current owner succeeds: a run stalled past the TTL after its
    transfer ran alongside the run that took the key meanwhile under the same owner."""
    from sql_lease import InMemoryLeaseProvider
    from sql_lease.cli.exec_command import _acquire_and_run, _ExecOptions, _Taken
    from sql_lease.cli.supervisor import Signals

    inner = InMemoryLeaseProvider()
    key, ttl_s, stalled = "exec-stalled", 0.3, []

    class Stalling:
        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

        async def _stall(self, owner: str) -> None:
            if owner == "job" and not stalled:
                stalled.append(True)
                await asyncio.sleep(ttl_s * 1.5)  # the tenure handed to "job" expired
                assert (await inner.acquire_lease(key, "run-b", ttl_s * 1000)).acquired
                assert await inner.transfer_lease(key, "run-b", "job", ttl_s * 1000)

        async def acquire_lease(self, k: str, owner: str, *a: object, **kw: object) -> object:
            await self._stall(owner)
            return await inner.acquire_lease(k, owner, *a, **kw)  # type: ignore[arg-type]

        async def get_lease(self, k: str) -> object:
            await self._stall("job")
            return await inner.get_lease(k)

    ran = tmp_path / "ran"
    opts = _ExecOptions(key, "job", True, ttl_s, False, None, 1.0, "kill", ("touch", str(ran)), 75, True)
    signals = Signals()
    try:
        code = await _acquire_and_run(Stalling(), opts, signals, _Taken())
    except Exception as exc:  # the fixed code answers "not acquired"
        code = type(exc).__name__  # type: ignore[assignment]
    finally:
        signals.close()
    assert stalled and not ran.exists(), "the stalled run ran alongside the run that took the key meanwhile"
    assert code == "LateAcquireError"
    assert await inner.get_lease_owner(key) == "job"  # run B's tenure, not released


# -- issue 24: exec --min-hold ---------------------------------------------------------------------


@pytest.mark.parametrize("owner", [[], ["--owner", "nightly-job"]])
def test_exec_min_hold_runs_a_job_at_most_once_per_period(owner: list[str], tmp_path: Path) -> None:
    """A 1 ms job run under `--min-hold 1h`: a second exec (another host's cron) is refused
    (75) and never runs, the lease shows as released and kept until an hour after it began."""
    url = f"sqlite:///{tmp_path}/once.db"
    first = run_cli(["exec", "nightly", "--url", url, *owner, "--min-hold", "1h", "--", "touch", "first"], tmp_path)
    assert first.returncode == 0, first.stderr
    second = run_cli(["exec", "nightly", "--url", url, "--min-hold", "1h", "--", "touch", "second"], tmp_path)
    assert second.returncode == 75 and "held by" in second.stderr, second.stderr
    assert (tmp_path / "first").exists() and not (tmp_path / "second").exists()
    shown = json.loads(invoke(["show", "nightly", "--json", "--url", url], tmp_path).stdout)
    assert shown["released"] is True and 3_500_000 < shown["remaining_ms"] <= 3_600_000


@pytest.mark.parametrize("limit", [[], ["--limit", "2"]])
def test_a_lease_broken_before_the_command_ends_exits_76(limit: list[str], tmp_path: Path) -> None:
    """An operator's `break` while the command runs, before its next renewal could notice: the
    release at the end finds the lease gone, and exec exits 76 (lost), not the command's 0."""
    url = f"sqlite:///{tmp_path}/broken.db"
    breaker = " ".join([*CLI, "break", "job", "--url", url, "--yes"])
    done = run_cli(["exec", "job", "--url", url, "--ttl", "60s", *limit, "--", "sh", "-c", breaker], tmp_path)
    assert done.returncode == 76, (done.returncode, done.stderr)
    assert "lost" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_exec_min_hold_is_validated(tmp_path: Path) -> None:
    for bad in ("-1s", "nope", "9000d"):
        done = invoke(["exec", "k", "--min-hold", bad, "--", "touch", "ran"], tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.strip(), done.stderr
    assert not (tmp_path / "ran").exists()


def test_exec_with_the_same_owner_inside_the_minimum_hold_is_refused_as_kept(tmp_path: Path) -> None:
    """The owner's earlier run released with --min-hold: a second run under that --owner is
    refused (75) as any other, not as "another run with the same --owner is running"."""
    url = f"sqlite:///{tmp_path}/kept.db"
    args = ["exec", "nightly", "--url", url, "--owner", "cron", "--min-hold", "1h", "--"]
    assert run_cli([*args, "true"], tmp_path).returncode == 0
    again = run_cli([*args, "touch", "ran"], tmp_path)
    assert again.returncode == 75 and "held by 'cron'" in again.stderr and "is running" not in again.stderr, again
    assert not (tmp_path / "ran").exists()
