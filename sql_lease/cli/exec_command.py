"""``sql-lease exec``: acquire a lease, run a command while holding it, release it; exit codes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import sys
from typing import Any

import click

from ..contract import validate_key, validate_min_hold_ms, validate_owner, validate_ttl_ms
from ..errors import LeaseNotAcquiredError
from ..holding import acquire_lease_wait, hold, new_owner_id
from ..holding.rules import Handoff, fence_kw, limit_kw
from .exits import EX_TEMPFAIL, EXIT_LEASE_LOST, fail
from .options import DURATION, data_option, limit_option, parse_data, schema_option, table_option, url_option
from .render import expiry_words, printable
from .runner import is_embedded_sqlite, open_provider, run, slots_held
from .supervisor import Ending, Signals, Supervision, poll, run_in_group


class _ExecCommand(click.Command):
    """``exec`` splits its arguments at the first ``--``: options and KEY before it, the command
    after it, untouched (so the command's own options never reach sql-lease's parser)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            split = args.index("--")
            ctx.meta["sql_lease.command"] = args[split + 1 :]
            args = args[:split]
        elif not any(a in ("-h", "--help") for a in args):
            raise click.UsageError("put -- before the command: sql-lease exec KEY [OPTIONS] -- COMMAND [ARGS]...", ctx)
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "KEY [OPTIONS] -- COMMAND [ARGS]...")


_EXEC_HELP = """Run COMMAND while holding the lease KEY: flock(1) for a fleet.

    \b
    sql-lease exec nightly-report --ttl 1m -- ./report.sh --full

    Acquires KEY, runs COMMAND with SQL_LEASE_KEY, SQL_LEASE_OWNER and SQL_LEASE_FENCE in its
    environment, renews the lease every TTL/3, releases it when COMMAND and its process group are
    done, and exits with COMMAND's status. Exit 75 if another owner holds KEY, 76 if the lease was
    lost while COMMAND ran (COMMAND and its process group are then terminated; also when the release
    after COMMAND ended finds the lease gone, broken or expired before a renewal saw it), 69 if the database
    fails, 78 if the lease table is missing. A sqlite:// database gets its schema on first use;
    PostgreSQL must be migrated first (sql-lease migrate). --data stores job metadata with the
    lease (a JSON object, @FILE or - for stdin), shown by `sql-lease show` and `list`.

    \b
    COMMAND leads a process group of its own; SIGINT, SIGTERM and SIGHUP sent to exec are
    forwarded to that group (a signal that arrives before COMMAND starts releases the lease
    and exits 128+N). Background jobs COMMAND leaves behind are handled by --on-exit: "kill"
    (default) sends them SIGTERM, then SIGKILL after --kill-after, before the lease is
    released; "wait" keeps holding (and renewing) the lease until the group is empty. A
    process that calls setsid() or setpgid() leaves the group and escapes both.

    \b
    If exec itself dies (kill -9), a watchdog SIGKILLs COMMAND's process group (and on
    Linux the parent-death signal kills COMMAND too); the lease expires after the TTL.
    When stdin is the terminal and exec runs in its foreground, COMMAND gets the
    terminal's foreground (it can read it; Ctrl-C and Ctrl-Z reach it directly); exec
    takes it back afterwards. COMMAND stopped (SIGSTOP, Ctrl-Z) for a whole TTL is
    terminated and exec exits 76: a stopped command's lease is not renewed forever.

    \b
    An owner id names one holder: with --owner, exec refuses (exit 75) to run while that
    owner already holds KEY (another run with the same --owner) unless --retry-owner says
    this run retries the same job (it then shares that tenure and its fence).

    \b
    --limit N: at most N of these jobs at once across the fleet. KEY is then a semaphore:
    each run holds one of N slots (with a fence of its own), exit 75 when all N are held
    (--wait: until any slot is let go). Every run of one KEY should pass the same N; a
    KEY held as a plain lease refuses a semaphore run, and the other way round.
    """


@click.command(name="exec", cls=_ExecCommand, help=_EXEC_HELP)
@click.argument("key")
@url_option
@table_option
@schema_option
@click.option(
    "--ttl",
    default="30s",
    type=DURATION,
    show_default=True,
    help="Lease TTL, renewed every TTL/3. Durations: 500ms, 30s, 5m, 1h, 2d, 1h30m (a bare number is seconds).",
)
@click.option("--owner", default=None, help="Owner id (default host:pid:random). One holder per owner id.")
@data_option
@click.option(
    "--retry-owner",
    is_flag=True,
    help="With --owner: this run retries a job whose earlier run may still hold KEY under the same "
    "owner id; run even then (sharing its tenure) instead of refusing.",
)
@limit_option
@click.option("--wait", is_flag=True, help="Wait for the lease instead of exiting 75 when it is held.")
@click.option("--timeout", default=None, type=DURATION, help="With --wait: give up after this long (exit 75).")
@click.option(
    "--min-hold",
    default=None,
    type=DURATION,
    help="At most one run per period: when COMMAND ends sooner, keep the lease (released) until this long "
    "after it was taken, by the database's clock, so another host's exec exits 75 until then.",
)
@click.option(
    "--on-exit",
    type=click.Choice(["kill", "wait"]),
    default="kill",
    show_default=True,
    help="When COMMAND exits and processes of its group remain: kill them (SIGTERM, SIGKILL after "
    "--kill-after) before releasing, or wait for them while holding the lease.",
)
@click.option(
    "--kill-after",
    default=None,
    type=DURATION,
    help="Grace between SIGTERM and SIGKILL when the command's group is terminated (lease lost, "
    "command stopped too long, --on-exit kill) [default: TTL/10, the time left before another "
    "owner can take a lost lease; longer is refused unless --allow-kill-after-beyond-ttl].",
)
@click.option(
    "--allow-kill-after-beyond-ttl",
    is_flag=True,
    help="Accept a --kill-after longer than TTL/10, although the command may then still run after "
    "another owner took the lease.",
)
@click.option(
    "--conflict-exit-code",
    default=EX_TEMPFAIL,
    show_default=True,
    type=click.IntRange(0, 255),
    help="Exit code when another owner holds the lease (as flock -E).",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Print nothing when another owner holds the lease (or --wait times out), as flock -n: "
    "cron mails what a job prints. Also hushes the note that the local SQLite default is used.",
)
@click.pass_context
def exec_(
    ctx: click.Context,
    key: str,
    url: str,
    table_name: str,
    schema: str | None,
    ttl: float,
    owner: str | None,
    data_json: str | None,
    retry_owner: bool,
    limit: int,
    wait: bool,
    timeout: float | None,
    min_hold: float | None,
    on_exit: str,
    kill_after: float | None,
    allow_kill_after_beyond_ttl: bool,
    conflict_exit_code: int,
    quiet: bool,
) -> None:
    command = tuple(ctx.meta.get("sql_lease.command", ()))
    if not command:
        fail(2, "no command given: sql-lease exec KEY [OPTIONS] -- COMMAND [ARGS]...")
    try:
        validate_key(key)
        claim = owner is not None and not retry_owner  # a given owner id may already hold KEY
        owner = validate_owner(owner) if owner is not None else new_owner_id()
    except (TypeError, ValueError) as exc:
        fail(2, str(exc))
    try:
        validate_ttl_ms(ttl * 1000)
    except ValueError:
        fail(2, f"--ttl must be between 1ms and 365 days (8760h), got {ttl:g} s")
    data = parse_data(data_json)
    min_hold_ms = None if min_hold is None else min_hold * 1000
    if min_hold_ms is not None:
        try:
            validate_min_hold_ms(min_hold_ms)
        except ValueError:
            fail(2, f"--min-hold must be at most 365 days (8760h), got {min_hold:g} s")
    if timeout is not None and not wait:
        fail(2, "--timeout goes with --wait")
    if retry_owner and ctx.params.get("owner") is None:
        fail(2, "--retry-owner goes with --owner")
    if kill_after is None:
        kill_after = ttl / 10
    elif kill_after > ttl / 10 * (1 + 1e-9) and not allow_kill_after_beyond_ttl:
        fail(
            2,
            f"--kill-after {kill_after:g} s is longer than TTL/10 ({ttl / 10:g} s): after a loss the command "
            "could still run when another owner takes the lease. Shorten it, lengthen --ttl, or pass "
            "--allow-kill-after-beyond-ttl",
        )
    provider = open_provider(url, table_name, schema)
    options = _ExecOptions(
        key,
        owner,
        claim,
        ttl,
        wait,
        timeout,
        kill_after,
        on_exit,
        command,
        conflict_exit_code,
        quiet,
        data,
        min_hold_ms,
        limit,
    )
    code = run(lambda: _exec(provider, url, options))
    sys.exit(code)


@dataclasses.dataclass(frozen=True)
class _ExecOptions:
    key: str
    owner: str
    claim: bool  # check that the owner does not already hold the key (see _acquire_as_new_holder)
    ttl_s: float
    wait: bool
    timeout_s: float | None
    kill_after_s: float
    on_exit: str
    command: tuple[str, ...]
    conflict_exit_code: int
    quiet: bool = False  # a refusal prints nothing
    data: dict[str, Any] | None = None  # --data, stored with the lease
    min_hold_ms: float | None = None  # --min-hold, kept by the release
    limit: int = 1  # --limit: one of this many slots (a semaphore); 1, a plain lease


_TEST_HOOK_ENV = "_SQL_LEASE_TEST_AFTER_ACQUIRE"  # private: tests pause exec between acquire and start


class _Taken:
    """Owner ids under which the key may be held while exec acquires it (released on a signal)."""

    def __init__(self) -> None:
        self.owners: list[str] = []

    def add(self, owner: str) -> None:
        if owner not in self.owners:
            self.owners.append(owner)

    async def release(self, provider: Any, key: str) -> None:
        for owner in self.owners:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(provider.release_lease(key, owner), 5.0)


async def _exec(provider: Any, url: str, opts: _ExecOptions) -> int:
    signals = Signals()
    taken = _Taken()
    try:
        async with provider:
            try:
                if is_embedded_sqlite(url):
                    await provider.migrate()
                return await _acquire_and_run(provider, opts, signals, taken)
            except asyncio.CancelledError:
                if not signals.take_cancellation():
                    raise
                await taken.release(provider, opts.key)
                return signals.exit_code()
            except LeaseNotAcquiredError as exc:
                if not opts.quiet:
                    slots = (
                        await slots_held(provider, opts.key, opts.limit) if not isinstance(exc, _SameOwnerError) else ""
                    )
                    click.echo(f"sql-lease: {printable(exc)}{slots}", err=True)
                return opts.conflict_exit_code
    except asyncio.CancelledError:  # while the provider opened or closed
        if not signals.take_cancellation():
            raise
        return signals.exit_code()
    finally:
        signals.close()


async def _acquire_and_run(provider: Any, opts: _ExecOptions, signals: Signals, taken: _Taken) -> int:
    ttl_ms = opts.ttl_s * 1000
    wait = opts.wait
    status = _WaitStatus(provider, opts) if opts.wait and not opts.quiet and sys.stderr.isatty() else None
    try:
        handoff = None
        if opts.claim:
            handoff = await _acquire_as_new_holder(provider, opts, taken)
            wait = False
        taken.add(opts.owner)
        held = hold(
            provider,
            opts.key,
            opts.owner,
            ttl_ms,
            wait=wait,
            timeout_s=opts.timeout_s if wait else None,  # after a handoff: no wait
            on_lost="flag",
            data=opts.data,
            min_hold_ms=opts.min_hold_ms,
            limit=opts.limit,
        )
        if handoff is not None:  # the tenure just handed to opts.owner, not a second acquire
            held.adopting(handoff)
        async with held as lease:
            if status is not None:
                await status.stop()
            signals.cancel_on_signal = False
            code = await _run_command(lease, opts, signals)
        return _lost_unseen(lease, code)
    finally:
        if status is not None:
            await status.stop()


class _WaitStatus:
    """While ``exec --wait`` waits on a terminal: one line on stderr, "waiting for KEY, held by
    OWNER, expires in 12s", redrawn in place every second from the lease the database reports,
    and erased when the wait ends."""

    REFRESH_S = 1.0

    def __init__(self, provider: Any, opts: _ExecOptions) -> None:
        self.provider = provider
        self.opts = opts
        self.shown = False
        self.task: asyncio.Task[None] | None = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:  # the waiter reports database failures; the status line only goes quiet
                if self.opts.limit > 1:
                    await self._draw_slots()
                else:
                    lease = await self.provider.get_lease(self.opts.key)
                    if lease is not None and lease.owner != self.opts.owner:
                        self._draw(
                            f"waiting for {printable(self.opts.key)}, held by {printable(lease.owner)}, "
                            f"{expiry_words(lease.remaining_ms)}"
                        )
            except Exception:
                pass
            await asyncio.sleep(self.REFRESH_S)

    async def _draw_slots(self) -> None:
        """A semaphore's line: how many slots are held, and the first expiry among them."""
        holders = await self.provider.get_lease_holders(self.opts.key)
        if holders:
            first = min(holders, key=lambda holder: holder.remaining_ms or 0.0)
            self._draw(
                f"waiting for a slot of {printable(self.opts.key)}, {len(holders)} of {self.opts.limit} held, "
                f"the first {expiry_words(first.remaining_ms)}"
            )

    def _draw(self, text: str) -> None:
        width = shutil.get_terminal_size().columns - 1  # never wrap: a wrapped line cannot be redrawn
        if width > 0 and len(text) > width:
            text = text[: max(width - 1, 0)] + "…"
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()
        self.shown = True

    async def stop(self) -> None:
        """Stop redrawing and erase the line (idempotent)."""
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # a cancellation of exec itself still propagates
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False


async def _acquire_as_new_holder(provider: Any, opts: _ExecOptions, taken: _Taken) -> Handoff:
    """Acquire the key for ``opts.owner`` only if nobody, that owner included, holds it.

    An acquire by the current owner succeeds (semantic 3: a retry), so a second run with the same
    --owner would run alongside the first. Instead the key is taken under a fresh, unique owner id
    (refused if anyone holds it, and exclusive), then transferred to ``opts.owner`` (atomic: the
    key is never free in between; the fence grows). Sound for every provider, at the cost of a
    second statement; the claim id shows in ``status`` for that moment. Returns the transfer,
    for ``hold()`` to adopt: acquiring again as ``opts.owner`` would succeed on any tenure of that
    owner, a later run's included, once this one expired."""
    claim = new_owner_id()
    taken.add(claim)
    ttl_ms = opts.ttl_s * 1000
    slots = limit_kw(opts.limit)
    try:
        if opts.wait:
            result = await acquire_lease_wait(
                provider, opts.key, claim, ttl_ms, opts.timeout_s, data=opts.data, limit=opts.limit
            )
        else:
            result = await provider.acquire_lease(opts.key, claim, ttl_ms, data=opts.data, **slots)
            if not result.acquired:
                raise LeaseNotAcquiredError(opts.key, result.owner, result.fence, result.expires_at)
    except LeaseNotAcquiredError as exc:
        if exc.holder == opts.owner and not await _kept(provider, opts.key):
            raise _SameOwnerError(opts.key, exc.holder, exc.fence, exc.expires_at) from None
        raise
    taken.add(opts.owner)
    sent = asyncio.get_running_loop().time()
    moved = await provider.transfer_lease(
        opts.key, claim, opts.owner, ttl_ms, data=opts.data, **fence_kw(provider, result.fence)
    )
    if not moved and slots:  # refused: the owner may hold a slot already; the claim's slot is let go
        await provider.release_lease(opts.key, claim, **fence_kw(provider, result.fence))
        mine = [h for h in await provider.get_lease_holders(opts.key) if h.owner == opts.owner]
        if mine:
            raise _SameOwnerError(opts.key, opts.owner, mine[0].fence, mine[0].expires_at)
    if not moved:
        raise LeaseNotAcquiredError(opts.key, None)  # expired between two statements: TTL too short
    return Handoff(opts.key, opts.owner, ttl_ms, sent, result.fence)


async def _kept(provider: Any, key: str) -> bool:
    """Whether the lease on ``key`` is one its owner released with a minimum hold (an earlier run's)."""
    lease = await provider.get_lease(key)
    return bool(getattr(lease, "released", False))


class _SameOwnerError(LeaseNotAcquiredError):
    def __str__(self) -> str:
        return (
            f"lease {self.key!r} is already held by this owner, {self.holder!r} (fence {self.fence}): another "
            "run with the same --owner is running. An owner id names one holder; pass --retry-owner only "
            "to retry a run of the same job that may still hold the lease"
        )


async def _test_hook(signals: Signals) -> None:
    path = os.environ.get(_TEST_HOOK_ENV)
    if not path:
        return
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    await poll(lambda: signals.received is not None, 10.0)


def _lost_unseen(lease: Any, code: int) -> int:
    """The command's exit status; 76 if the lease was lost while it ran without exec terminating
    it (the release at the end found it gone: broken, expired or released elsewhere before a
    renewal could tell)."""
    if code == EXIT_LEASE_LOST or lease.released is not False:
        return code
    reason = lease.lost_reason or "the release after the command found it no longer held: broken or expired"
    click.echo(
        f"sql-lease: lease {printable(repr(lease.key))} lost while the command ran ({printable(reason)}); "
        f"the command exited {code}",
        err=True,
    )
    return EXIT_LEASE_LOST


async def _run_command(lease: Any, opts: _ExecOptions, signals: Signals) -> int:
    env = dict(os.environ, SQL_LEASE_KEY=lease.key, SQL_LEASE_OWNER=lease.owner, SQL_LEASE_FENCE=str(lease.fence))
    await _test_hook(signals)
    if signals.received is not None:
        name = signal.Signals(signals.received).name
        click.echo(f"sql-lease: {name} before the command started; releasing the lease, not running it", err=True)
        return 128 + signals.received

    def announce(ending: Ending) -> None:
        if ending is Ending.STOP:
            reason = printable(lease.lost_reason)
            click.echo(
                f"sql-lease: lease {printable(repr(lease.key))} lost ({reason}); terminating the command", err=True
            )
        else:
            click.echo(
                f"sql-lease: the command has been stopped for {opts.ttl_s:g} s (the lease TTL); terminating it "
                "rather than renewing the lease for a stopped command",
                err=True,
            )

    how = Supervision(
        stopped_limit_s=opts.ttl_s,
        kill_after_s=opts.kill_after_s,
        on_exit=opts.on_exit,
        poll_s=min(0.5, opts.ttl_s / 4),
    )
    outcome = await run_in_group(opts.command, env, signals, lease.lost, how, announce)
    return EXIT_LEASE_LOST if isinstance(outcome, Ending) else outcome
