"""exec's process supervisor: the command in a process group of its own, the terminal's
foreground, forwarded signals, the parent-death signal, and terminating the group (SIGTERM, then
SIGKILL after a grace). It knows nothing of leases: the caller says when to stop (an event)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import os
import shutil
import signal
import sys
from collections.abc import Callable

import click

from .render import printable

_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Signals:
    """SIGINT/SIGTERM/SIGHUP handling, installed by the current task before the command starts.

    While ``cancel_on_signal`` is True (exec: while the lease is being acquired) a signal cancels
    the task (the caller then undoes what it may have done); after that and before the command
    starts, a signal is only recorded (the command is then not started); once the command runs,
    signals go to its process group."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.received: int | None = None
        self.group: int | None = None
        self.cancel_on_signal = True
        self.cancelled = False
        for signum in _FORWARDED_SIGNALS:
            self.loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        if self.group is not None:
            _signal_group(self.group, signum)
            return
        if self.received is None:
            self.received = signum
        if self.cancel_on_signal and not self.cancelled and self.task is not None:
            self.cancelled = True
            self.task.cancel("sql-lease: signal before the command started")

    def take_cancellation(self) -> bool:
        """True if the task's cancellation came from a signal (it is then consumed); else False
        (the cancellation is someone else's and must go on)."""
        if not self.cancelled or self.received is None or self.task is None or self.task.cancelling() == 0:
            return False
        self.task.uncancel()
        return True

    def exit_code(self) -> int:
        """128+N for the signal N that stopped exec before the command started."""
        assert self.received is not None
        click.echo(
            f"sql-lease: {signal.Signals(self.received).name} before the command started; not running it",
            err=True,
        )
        return 128 + self.received

    def close(self) -> None:
        for signum in _FORWARDED_SIGNALS:
            self.loop.remove_signal_handler(signum)


def _exists(program: str) -> bool:
    return shutil.which(program) is not None or os.path.exists(program)


_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    """libc's prctl(2) on Linux, loaded before the fork (the child only calls it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl  # type: ignore[no-any-return]


def _child_setup(terminal: int | None) -> Callable[[], None] | None:
    """What the child does between fork and exec: on Linux, ask for SIGKILL when exec dies (the
    parent-death signal; checked against a parent that died before the request); with a terminal,
    take its foreground (SIGTTOU blocked, as the child's group is not yet the foreground).

    preexec_fn runs in the forked child of a process that may have threads (aiosqlite's): it only
    makes system calls through functions resolved before the fork, and takes no lock."""
    prctl = _prctl()
    if prctl is None and terminal is None:
        return None
    parent = os.getpid()

    def setup() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # exec died before the request: the signal will never come
                os.kill(os.getpid(), signal.SIGKILL)
        if terminal is not None:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
            try:
                os.tcsetpgrp(terminal, os.getpgrp())
            except OSError:
                pass
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    return setup


def _foreground_terminal() -> int | None:
    """0 if stdin is exec's controlling terminal and exec runs in its foreground process group."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _take_terminal_back(terminal: int) -> None:
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(terminal, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


async def _start(
    command: tuple[str, ...], env: dict[str, str], terminal: int | None = None
) -> asyncio.subprocess.Process | int:
    """Start ``command`` in a process group of its own; on failure, the shell's exit code."""
    try:
        return await asyncio.create_subprocess_exec(
            *command, env=env, process_group=0, preexec_fn=_child_setup(terminal)
        )
    except FileNotFoundError:
        if not _exists(command[0]):
            click.echo(f"sql-lease: command not found: {printable(command[0])}", err=True)
            return 127
        click.echo(f"sql-lease: cannot execute {printable(command[0])}: bad interpreter or missing library", err=True)
        return 126
    except OSError as exc:
        click.echo(f"sql-lease: cannot execute {printable(command[0])}: {exc.strerror or exc}", err=True)
        return 126


class Ending(enum.Enum):
    """Why the supervisor terminated the command's group."""

    STOP = "stop"  # the caller's ``stop`` event was set (exec: the lease was lost)
    STOPPED = "stopped"  # the command stayed stopped (SIGSTOP, Ctrl-Z) for ``stopped_limit_s``


@dataclasses.dataclass(frozen=True)
class Supervision:
    """How the command's process group is watched and ended (durations in seconds)."""

    stopped_limit_s: float  # a command stopped this long is terminated (Ending.STOPPED)
    kill_after_s: float  # grace between SIGTERM and SIGKILL when the group is terminated
    on_exit: str  # "kill": terminate what the command left behind; "wait": wait until the group is empty
    poll_s: float  # how often the group's states are read


async def run_in_group(
    command: tuple[str, ...],
    env: dict[str, str],
    signals: Signals,
    stop: asyncio.Event,
    how: Supervision,
    announce: Callable[[Ending], None],
) -> int | Ending:
    """Run ``command`` leading a process group of its own (with the terminal's foreground when
    exec has it), forward ``signals`` to the group, and wait for the command and then its group
    (``how.on_exit``). ``stop`` set, or the command stopped for ``how.stopped_limit_s``: call
    ``announce`` and terminate the group. The command's exit status (128+N for signal N; 126/127
    when it could not be started), or the :class:`Ending` that terminated it."""
    terminal = _foreground_terminal()
    watchdog = await Watchdog.start()  # before the command: no moment in which exec's death spares its group
    proc = await _start(command, env, terminal)
    if isinstance(proc, int):
        await watchdog.close(group_empty=True)
        return proc
    watchdog.watch(proc.pid)
    signals.group = proc.pid
    if signals.received is not None:  # arrived while the command was being started
        _signal_group(proc.pid, signals.received)
    # With the terminal given away, exec is in the background: it must not stop writing to it.
    previous_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN) if terminal is not None else None
    try:
        return await _supervise(proc, stop, how, announce)
    finally:
        if terminal is not None:
            _take_terminal_back(terminal)
            signal.signal(signal.SIGTTOU, signal.SIG_DFL if previous_ttou is None else previous_ttou)
        await watchdog.close(group_empty=not _group_alive(proc.pid))


# The watchdog: reads the command's process group from exec (none: the command never started), then
# one line; "done" (exec is finished with the group) ends it, anything else, or end of file (exec died:
# kill -9, the OOM killer), SIGKILLs the group.
_WATCHDOG = 'read -r group || exit 0; read -r said; [ "$said" = done ] || kill -s KILL -- "-$group" 2>/dev/null'


class Watchdog:
    """A process outliving exec that kills the command's whole process group if exec dies: the
    parent-death signal reaches the command alone, not the processes it started. It runs in a
    session of its own (no terminal signal reaches it) and holds only the read end of a pipe whose
    write end exec alone keeps (non-inheritable: the command, started later, does not get it). It is
    started before the command and told the command's group right after the command starts."""

    def __init__(self, process: asyncio.subprocess.Process | None, write_end: int | None) -> None:
        self._process, self._write_end = process, write_end

    @classmethod
    async def start(cls) -> Watchdog:
        """A watchdog, told its group by :meth:`watch`; a warning on stderr and none if it cannot be started."""
        read_end, write_end = os.pipe()  # non-inheritable: only the watchdog's stdin gets read_end
        try:
            process = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", _WATCHDOG, "sql-lease-watchdog",
                stdin=read_end, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            os.close(write_end)
            click.echo(
                f"sql-lease: no watchdog for the command's group ({exc.strerror or exc}): if exec dies, "
                "processes the command started run on",
                err=True,
            )
            return cls(None, None)
        finally:
            os.close(read_end)
        return cls(process, write_end)

    def watch(self, group: int) -> None:
        """Tell the watchdog the command's process group (it leads one; pgid == its pid)."""
        if self._write_end is not None:
            with contextlib.suppress(OSError):
                os.write(self._write_end, f"{group}\n".encode())

    async def close(self, *, group_empty: bool) -> None:
        """Let the watchdog go: it exits, and kills what is left of the group unless ``group_empty``."""
        if self._write_end is None or self._process is None:
            return
        with contextlib.suppress(OSError):
            if group_empty:
                os.write(self._write_end, b"done\n")
        os.close(self._write_end)
        self._write_end = None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._process.wait(), 5)


async def _supervise(
    proc: asyncio.subprocess.Process, stop: asyncio.Event, how: Supervision, announce: Callable[[Ending], None]
) -> int | Ending:
    """Wait for the command and then its process group (``how.on_exit``); terminate them when
    ``stop`` is set or when stopped for ``how.stopped_limit_s``."""
    loop = asyncio.get_running_loop()
    group = proc.pid

    async def end(ending: Ending, exited: asyncio.Future[int] | None) -> Ending:
        announce(ending)
        await _terminate_group(group, exited, how.kill_after_s)
        return ending

    exited = asyncio.ensure_future(proc.wait())
    stopped = asyncio.ensure_future(stop.wait())
    stopped_since: float | None = None
    try:
        while not exited.done():
            await asyncio.wait({exited, stopped}, timeout=how.poll_s, return_when=asyncio.FIRST_COMPLETED)
            if stopped.done():
                return await end(Ending.STOP, exited)
            if exited.done():
                break
            stopped_since = _still_stopped(_is_stopped(proc.pid), stopped_since, loop.time())
            if stopped_since is not None and loop.time() - stopped_since >= how.stopped_limit_s:
                return await end(Ending.STOPPED, exited)
        status = _exit_status(exited.result())
        if how.on_exit == "kill":
            if _group_alive(group):
                await _terminate_group(group, None, how.kill_after_s)
            if stop.is_set():
                return await end(Ending.STOP, None)
            return status
        stopped_since = None
        while _group_alive(group):  # --on-exit wait
            await asyncio.wait({stopped}, timeout=how.poll_s)
            if stopped.done():
                return await end(Ending.STOP, None)
            stopped_since = _still_stopped(_group_stopped(group), stopped_since, loop.time())
            if stopped_since is not None and loop.time() - stopped_since >= how.stopped_limit_s:
                return await end(Ending.STOPPED, None)
        return status
    finally:
        stopped.cancel()


def _still_stopped(stopped: bool, since: float | None, now: float) -> float | None:
    return (since if since is not None else now) if stopped else None


async def _terminate_group(group: int, exited: asyncio.Future[int] | None, kill_after_s: float) -> None:
    """SIGTERM the process group (and SIGCONT it, so stopped members see the SIGTERM); SIGKILL it
    after ``kill_after_s`` seconds unless it is gone by then; wait (a little) until it is empty."""

    def gone() -> bool:
        return (exited is None or exited.done()) and not _group_alive(group)

    _signal_group(group, signal.SIGTERM)
    _signal_group(group, signal.SIGCONT)
    await poll(gone, kill_after_s)
    _signal_group(group, signal.SIGKILL)
    if exited is not None:
        await exited
    if not await poll(lambda: not _group_alive(group), 2.0):
        click.echo(f"sql-lease: processes of the command's group {group} could not be killed", err=True)


async def poll(done: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> bool:
    """Check ``done()`` every ``step_s`` seconds for up to ``timeout_s`` seconds; its last value.
    (Nothing signals that a process group became empty: it is polled.)"""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if done():
            return True
        left = deadline - loop.time()
        if left <= 0:
            return False
        await asyncio.sleep(min(step_s, left))


def _signal_group(group: int, signum: int) -> None:
    """Signal the command's whole process group (it leads one of its own; pgid == its pid)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _proc_stat(pid: str) -> tuple[str, int] | None:
    """(state, process group) of a process from /proc (Linux), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) "; comm may hold anything
    return fields[0].decode("ascii", "replace"), int(fields[2])


def _group_states(group: int) -> list[str] | None:
    """States of the processes in ``group`` (Linux: from /proc); None where /proc is missing."""
    if not os.path.isdir("/proc/self"):
        return None
    states = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _proc_stat(name)
            if stat is not None and stat[1] == group:
                states.append(stat[0])
    return states


def _group_alive(group: int) -> bool:
    """True while a process of ``group`` lives (zombies waiting for their reaper do not count)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    states = _group_states(group)
    return states is None or any(state != "Z" for state in states)


def _group_stopped(group: int) -> bool:
    """True if every live process of ``group`` is stopped (Linux; elsewhere never detected)."""
    live = [state for state in _group_states(group) or () if state != "Z"]
    return bool(live) and all(state == "T" for state in live)


def _is_stopped(pid: int) -> bool:
    """True if the process is stopped by a signal (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU)."""
    stat = _proc_stat(str(pid))
    if stat is not None:
        return stat[0] == "T"
    try:  # no /proc: ask without reaping (the event loop's child watcher reaps it)
        info = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError, AttributeError):
        return False
    return info is not None and info.si_code == os.CLD_STOPPED


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
