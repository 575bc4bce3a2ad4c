"""The ``sql-lease`` command line: ``exec`` (flock(1) for a fleet), ``migrate``, ``status``, ``sweep``.

Exit codes of ``sql-lease exec`` (the sysexits.h names where one fits):

    the command's own   the command ran; its exit status (128+N when killed by signal N)
    75  EX_TEMPFAIL     the lease is held by another owner (or --wait timed out)
    76  LEASE_LOST      the lease was lost while the command ran; the command was terminated
    69  EX_UNAVAILABLE  the database failed or could not be reached
    78  EX_CONFIG       the lease table is missing (run `sql-lease migrate`) or bad configuration
    126 / 127           the command could not be run / was not found (as in shells)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click

from .contract import validate_key, validate_owner, validate_sweep, validate_ttl_ms
from .errors import LeaseBackendError, LeaseError, LeaseNotAcquiredError, SchemaMissingError
from .holding import hold, new_owner_id

T = TypeVar("T")

EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EXIT_LEASE_LOST = 76
EX_CONFIG = 78

DEFAULT_URL = "sqlite:///sql_lease.db"
URL_ENV = "SQL_LEASE_URL"

_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*\Z")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as ``500ms``, ``30s``, ``5m``, ``1h`` or ``2.5`` (seconds); value in seconds."""

    name = "duration"

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        match = _DURATION.match(str(value))
        if not match:
            self.fail(f"{value!r} is not a duration like 500ms, 30s, 5m or 1h", param, ctx)
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        if seconds <= 0 and not (self.allow_zero and seconds == 0):
            self.fail(f"{value!r} must be longer than zero", param, ctx)
        return seconds


DURATION = Duration()

url_option = click.option(
    "--url",
    envvar=URL_ENV,
    default=DEFAULT_URL,
    show_default=True,
    help=f"Database URL (postgresql://... or sqlite:///path). Also read from ${URL_ENV}.",
)
table_option = click.option("--table", "table_name", default="sql_leases", show_default=True, help="Lease table name.")
schema_option = click.option("--schema", default=None, help="PostgreSQL schema of the lease table.")


def _fail(code: int, message: str) -> NoReturn:
    click.echo(f"sql-lease: {message}", err=True)
    sys.exit(code)


def _provider(url: str, table_name: str, schema: str | None) -> Any:
    from .sql.provider import SqlLeaseProvider

    try:
        return SqlLeaseProvider(url, table_name=table_name, schema=schema)
    except (TypeError, ValueError) as exc:
        _fail(EX_CONFIG, str(exc))


def _run(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` and turn the library's errors into messages and exit codes."""
    try:
        return asyncio.run(main())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)
    except SchemaMissingError as exc:
        _fail(EX_CONFIG, str(exc))
    except LeaseBackendError as exc:
        _fail(EX_UNAVAILABLE, str(exc))
    except LeaseError as exc:
        _fail(EX_UNAVAILABLE, str(exc))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sql-lease")
def cli() -> None:
    """Distributed leases on the SQL database you already run."""


@cli.command()
@url_option
@table_option
@schema_option
@click.option(
    "--version-table",
    default="sql_lease_alembic_version",
    show_default=True,
    help="Alembic version table of sql_lease (kept apart from your application's).",
)
@click.option("--sql", "offline", is_flag=True, help="Print the SQL for a DBA instead of running it.")
def migrate(url: str, table_name: str, schema: str | None, version_table: str, offline: bool) -> None:
    """Create or upgrade the lease table (idempotent; safe to run concurrently)."""
    from .sql.migrate import offline_sql
    from .sql.provider import SqlLeaseProvider, to_async_url
    from .sql.schema import LeaseTableNames

    try:
        names = LeaseTableNames(table_name, schema, version_table)
        safe_url = to_async_url(url).render_as_string(hide_password=True)
    except (TypeError, ValueError) as exc:
        _fail(EX_CONFIG, str(exc))
    if offline:
        click.echo(offline_sql(url, names), nl=False)
        return

    async def main() -> str | None:
        async with SqlLeaseProvider(url, table_name=table_name, schema=schema, version_table=version_table) as p:
            return await p.migrate()

    revision = _run(main)
    click.echo(f"sql_lease schema at revision {revision} on {safe_url}")


@cli.command()
@click.argument("key")
@url_option
@table_option
@schema_option
def status(key: str, url: str, table_name: str, schema: str | None) -> None:
    """Show who holds KEY (exit 0), or that it is free (exit 1)."""
    provider = _provider(url, table_name, schema)

    async def main() -> Any:
        async with provider:
            return await provider.get_lease(key)

    try:
        validate_key(key)
    except ValueError as exc:
        _fail(EX_CONFIG, str(exc))
    lease = _run(main)
    if lease is None:
        click.echo(f"{key}: free")
        sys.exit(1)
    click.echo(f"{key}: held by {lease.owner} (fence {lease.fence}) until {lease.expires_at.isoformat()}")


@cli.command()
@url_option
@table_option
@schema_option
@click.option(
    "--batch-size",
    default=1000,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Rows deleted per statement.",
)
@click.option(
    "--grace",
    default="0s",
    type=Duration(allow_zero=True),
    show_default=True,
    help="Only remove leases expired at least this long ago.",
)
def sweep(url: str, table_name: str, schema: str | None, batch_size: int, grace: float) -> None:
    """Delete expired leases in bounded batches and print how many were removed."""
    from .holding import ExpirySweeper

    try:
        validate_sweep(batch_size, grace * 1000)
    except ValueError as exc:
        _fail(2, f"--grace: {exc}")
    provider = _provider(url, table_name, schema)

    async def main() -> int:
        async with provider:
            return await ExpirySweeper(provider, batch_size=batch_size, grace_ms=grace * 1000).sweep_once()

    removed = _run(main)
    click.echo(f"removed {removed} expired lease(s)")


@cli.command()
@url_option
@click.option("--quick", is_flag=True, help="Small sizes: a smoke run of a few seconds.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), help="Also write results here.")
@click.option(
    "--sqlite-synchronous",
    default="FULL",
    show_default=True,
    type=click.Choice(["FULL", "NORMAL"]),
    help="SQLite durability to measure with.",
)
def bench(url: str, quick: bool, json_path: str | None, sqlite_synchronous: str) -> None:
    """Measure sql_lease on this database: cycle throughput, contention, latency at 10^3 and 10^6
    rows, a sweep of 10^6 expired rows under load, and 10,000 leases renewed every 5 s.

    Uses its own table (sql_lease_bench), emptied before and after. Takes a few minutes without
    --quick; run it on a database where a million scratch rows are fine.
    """
    import json

    from .bench import format_results, run_all
    from .sql.provider import to_async_url

    safe_url = to_async_url(url).render_as_string(hide_password=True)
    options = {"sqlite_synchronous": sqlite_synchronous} if url.startswith("sqlite") else {}
    results = _run(lambda: run_all(url, quick=quick, **options))
    click.echo(format_results(safe_url, results))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"url": safe_url, "results": results}, f, indent=2)


def _is_embedded_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


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


@cli.command(name="exec", cls=_ExecCommand)
@click.argument("key")
@url_option
@table_option
@schema_option
@click.option("--ttl", default="30s", type=DURATION, show_default=True, help="Lease TTL; renewed every TTL/3.")
@click.option("--owner", default=None, help="Owner id (default host:pid:random).")
@click.option("--wait", is_flag=True, help="Wait for the lease instead of exiting 75 when it is held.")
@click.option("--timeout", default=None, type=DURATION, help="With --wait: give up after this long (exit 75).")
@click.option(
    "--kill-after",
    default=None,
    type=DURATION,
    help="After the lease is lost: SIGTERM the command, then SIGKILL it after this long "
    "[default: TTL/10, the time left before another owner can take the lease].",
)
@click.option(
    "--conflict-exit-code",
    default=EX_TEMPFAIL,
    show_default=True,
    type=click.IntRange(0, 255),
    help="Exit code when another owner holds the lease (as flock -E).",
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
    wait: bool,
    timeout: float | None,
    kill_after: float | None,
    conflict_exit_code: int,
) -> None:
    """Run COMMAND while holding the lease KEY: flock(1) for a fleet.

    \b
    sql-lease exec nightly-report --ttl 1m -- ./report.sh --full

    Acquires KEY, runs COMMAND with SQL_LEASE_KEY, SQL_LEASE_OWNER and SQL_LEASE_FENCE in its
    environment, renews the lease every TTL/3, releases it when COMMAND exits, and exits with
    COMMAND's status. Exit 75 if another owner holds KEY, 76 if the lease was lost while COMMAND
    ran (COMMAND and its process group are then terminated), 69 if the database fails, 78 if the
    lease table is missing. A sqlite:// database gets its schema on first use; PostgreSQL must be
    migrated first (sql-lease migrate).
    """
    command = tuple(ctx.meta.get("sql_lease.command", ()))
    if not command:
        _fail(2, "no command given: sql-lease exec KEY [OPTIONS] -- COMMAND [ARGS]...")
    try:
        validate_key(key)
        owner = validate_owner(owner) if owner is not None else new_owner_id()
    except (TypeError, ValueError) as exc:
        _fail(2, str(exc))
    try:
        validate_ttl_ms(ttl * 1000)
    except ValueError:
        _fail(2, f"--ttl must be between 1ms and 365 days (8760h), got {ttl:g} s")
    if timeout is not None and not wait:
        _fail(2, "--timeout goes with --wait")
    if kill_after is None:
        kill_after = ttl / 10
    provider = _provider(url, table_name, schema)
    code = _run(lambda: _exec(provider, url, key, owner, ttl, wait, timeout, kill_after, command, conflict_exit_code))
    sys.exit(code)


async def _exec(
    provider: Any,
    url: str,
    key: str,
    owner: str,
    ttl_s: float,
    wait: bool,
    timeout_s: float | None,
    kill_after_s: float,
    command: tuple[str, ...],
    conflict_exit_code: int,
) -> int:
    async with provider:
        if _is_embedded_sqlite(url):
            await provider.migrate()
        try:
            async with hold(
                provider, key, owner, ttl_s * 1000, wait=wait, timeout_s=timeout_s, on_lost="flag"
            ) as lease:
                return await _run_command(lease, command, kill_after_s)
        except LeaseNotAcquiredError as exc:
            click.echo(f"sql-lease: {exc}", err=True)
            return conflict_exit_code


def _exists(program: str) -> bool:
    return shutil.which(program) is not None or os.path.exists(program)


async def _start(command: tuple[str, ...], env: dict[str, str]) -> asyncio.subprocess.Process | int:
    """Start ``command`` in a process group of its own; on failure, the shell's exit code."""
    try:
        return await asyncio.create_subprocess_exec(*command, env=env, process_group=0)
    except FileNotFoundError:
        if not _exists(command[0]):
            click.echo(f"sql-lease: command not found: {command[0]}", err=True)
            return 127
        click.echo(f"sql-lease: cannot execute {command[0]}: bad interpreter or missing library", err=True)
        return 126
    except OSError as exc:
        click.echo(f"sql-lease: cannot execute {command[0]}: {exc.strerror or exc}", err=True)
        return 126


async def _run_command(lease: Any, command: tuple[str, ...], kill_after_s: float) -> int:
    env = dict(os.environ, SQL_LEASE_KEY=lease.key, SQL_LEASE_OWNER=lease.owner, SQL_LEASE_FENCE=str(lease.fence))
    proc = await _start(command, env)
    if isinstance(proc, int):
        return proc

    loop = asyncio.get_running_loop()
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for signum in forwarded:
        loop.add_signal_handler(signum, _signal_group, proc, signum)
    try:
        exited = asyncio.ensure_future(proc.wait())
        lost = asyncio.ensure_future(lease.lost.wait())
        await asyncio.wait({exited, lost}, return_when=asyncio.FIRST_COMPLETED)
        if not lost.done():
            lost.cancel()
            return _exit_status(exited.result())
        click.echo(
            f"sql-lease: lease {lease.key!r} lost ({lease.lost_reason}); terminating the command",
            err=True,
        )
        _signal_group(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(exited), kill_after_s)
        except TimeoutError:
            _signal_group(proc, signal.SIGKILL)
            await exited
        _signal_group(proc, signal.SIGKILL)  # whatever the command left behind in its group
        return EXIT_LEASE_LOST
    finally:
        for signum in forwarded:
            loop.remove_signal_handler(signum)


def _signal_group(proc: asyncio.subprocess.Process, signum: int) -> None:
    """Signal the command's whole process group (it leads one of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main() -> None:
    logging.getLogger("sql_lease").addHandler(logging.NullHandler())  # the CLI prints its own messages
    logging.getLogger("sql_lease").propagate = False
    cli(prog_name="sql-lease")
