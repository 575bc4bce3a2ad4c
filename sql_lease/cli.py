"""The ``sql-lease`` command line: ``exec`` (flock(1) for a fleet), ``migrate``, ``status``, ``sweep``.

Exit codes of ``sql-lease exec`` (the sysexits.h names where one fits):

    the command's own   the command ran; its exit status (128+N when killed by signal N)
    75  EX_TEMPFAIL     the lease is held by another owner (or --wait timed out)
    76  LEASE_LOST      the lease was lost while the command ran, or the command stayed stopped for a
                        whole TTL; the command and its process group were terminated
    69  EX_UNAVAILABLE  the database failed or could not be reached
    78  EX_CONFIG       the lease table is missing (run `sql-lease migrate`) or bad configuration
    126 / 127           the command could not be run / was not found (as in shells)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import re
import shutil
import signal
import sys
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click

from .contract import validate_fence, validate_key, validate_owner, validate_sweep, validate_ttl_ms
from .errors import LeaseBackendError, LeaseConfigError, LeaseError, LeaseNotAcquiredError, SchemaMissingError
from .holding import SWEEP_BATCH_SIZE, acquire_lease_wait, hold, new_owner_id

T = TypeVar("T")

EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EXIT_LEASE_LOST = 76
EX_CONFIG = 78

DEFAULT_URL = "sqlite:///sql_lease.db"
URL_ENV = "SQL_LEASE_URL"

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION = re.compile(rf"\s*(?:{_NUMBER}\s*(?:ms|s|m|h|d)\s*)+\Z|\s*{_NUMBER}\s*\Z")
_DURATION_PART = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d)?")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, None: 1.0}
MAX_DURATION_S = 10 * 365 * 86_400
"""Longest duration any option accepts: 10 years (87600h), in seconds."""


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as ``500ms``, ``30s``, ``5m``, ``1h``, ``2d``, ``1h30m`` (parts add up) or
    ``2.5`` (a bare number is seconds); value in seconds."""

    name = "duration"

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not _DURATION.match(str(value)):
            self._bad(f"{_printable(value)!r} is not a duration like 500ms, 30s, 5m, 1h30m or 2d", param, ctx)
        seconds = sum(float(n) * _UNIT_SECONDS[unit or None] for n, unit in _DURATION_PART.findall(str(value)))
        if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
            self._bad(f"{_printable(value)!r} is too long: at most 10 years (87600h)", param, ctx)
        if seconds <= 0 and not (self.allow_zero and seconds == 0):
            self._bad(f"{_printable(value)!r} must be longer than zero", param, ctx)
        return seconds

    def _bad(self, message: str, param: click.Parameter | None, ctx: click.Context | None) -> NoReturn:
        """On the command line: one line naming the option, exit 2; elsewhere click's BadParameter."""
        if ctx is None or param is None:
            self.fail(message, param, ctx)
        _fail(2, f"{param.opts[0] if param.opts else param.name}: {message}")


DURATION = Duration()

CONFIG_ENV = "SQL_LEASE_CONFIG"
SYSTEM_CONFIG = "/etc/sql-lease/config.toml"
_SYSTEM_CONFIG_ENV = "_SQL_LEASE_TEST_SYSTEM_CONFIG"  # private: tests point the system file elsewhere
CONFIG_KEYS = ("url", "table", "schema")
DEFAULT_TABLE = "sql_leases"
_SOURCE = "sql_lease.url_source"


@dataclasses.dataclass(frozen=True)
class _UrlSource:
    """Where the CLI's database URL came from, and the table and schema a config file gave with it."""

    origin: str  # "--url", "$SQL_LEASE_URL", "config", "default"
    path: str | None = None  # the config file (origin "config"), or its default's SQLite file
    table: str | None = None
    schema: str | None = None


def _config_file() -> str | None:
    """The config file to read: $SQL_LEASE_CONFIG (it must exist), else the first that exists of
    $XDG_CONFIG_HOME/sql-lease/config.toml (~/.config/... when unset) and /etc/sql-lease/config.toml."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        return os.path.abspath(named)
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".config")
    system = os.environ.get(_SYSTEM_CONFIG_ENV) or SYSTEM_CONFIG
    for candidate in (os.path.join(base, "sql-lease", "config.toml"), system):
        if os.path.lexists(candidate):  # a dangling link is a broken file, not a missing one
            return candidate
    return None


def _read_config(path: str) -> dict[str, str]:
    """The settings of the TOML file ``path``; exit 78 naming it if it cannot be read, is not
    TOML, names a key other than url, table and schema, or gives one that is not a string."""
    import tomllib

    try:
        with open(path, "rb") as f:
            settings = tomllib.load(f)
    except OSError as exc:
        _fail(EX_CONFIG, f"config file {path} cannot be read: {exc.strerror or exc}")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        _fail(EX_CONFIG, f"config file {path} is not valid TOML: {' '.join(str(exc).split())}")
    for name, value in settings.items():
        if name not in CONFIG_KEYS:
            _fail(EX_CONFIG, f"config file {path}: unknown key {_printable(repr(name))} (expected url, table, schema)")
        if not isinstance(value, str):
            _fail(EX_CONFIG, f"config file {path}: {name!r} must be a string")
    return settings


def _resolve_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--url, else $SQL_LEASE_URL, else ``url`` of the config file, else the local SQLite default."""
    if ctx.resilient_parsing:
        return value
    if value is not None:
        source = _UrlSource("--url")
    elif os.environ.get(URL_ENV):
        value, source = os.environ[URL_ENV], _UrlSource(f"${URL_ENV}")
    else:
        path = _config_file()
        settings = _read_config(path) if path is not None else {}
        table, schema = settings.get("table"), settings.get("schema")
        if "url" in settings:
            value, source = settings["url"], _UrlSource("config", path, table, schema)
        else:
            default_file = os.path.abspath(DEFAULT_URL.removeprefix("sqlite:///"))
            value, source = DEFAULT_URL, _UrlSource("default", default_file, table, schema)
    ctx.meta[_SOURCE] = source
    return value


def _config_default(name: str, fallback: str | None) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback giving --table / --schema the config file's value when the option is not given."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None or ctx.resilient_parsing:
            return value
        source = ctx.meta.get(_SOURCE)
        configured = getattr(source, name, None) if source is not None else None
        return configured if configured is not None else fallback

    return callback


url_option = click.option(
    "--url",
    default=None,
    is_eager=True,  # resolved first: a config file's table and schema are the other options' defaults
    callback=_resolve_url,
    help=f"Database URL (postgresql://... or sqlite:///path). Else ${URL_ENV}, else `url` in the TOML "
    f"config file (${CONFIG_ENV}, else $XDG_CONFIG_HOME/sql-lease/config.toml, else "
    f"{SYSTEM_CONFIG}), else {DEFAULT_URL} in the working directory (said on stderr).",
)
table_option = click.option(
    "--table",
    "table_name",
    default=None,
    callback=_config_default("table", DEFAULT_TABLE),
    help=f"Lease table name [default: the config file's `table`, else {DEFAULT_TABLE}].",
)
schema_option = click.option(
    "--schema",
    default=None,
    callback=_config_default("schema", None),
    help="PostgreSQL schema of the lease table [default: the config file's `schema`].",
)


def _url_source() -> _UrlSource | None:
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_SOURCE)


def _describe_source(url: str) -> str:
    """Where the URL came from, for `sql-lease check`."""
    from .sql.urls import safe_url

    source = _url_source()
    shown = safe_url(url)
    if source is None or source.origin in ("--url", f"${URL_ENV}"):
        return f"{shown} from {source.origin if source else '--url'}"
    if source.origin == "config":
        return f"{shown} from the config file {source.path}"
    return (
        f"{shown}: the default (no --url, ${URL_ENV} or config file gave one), the SQLite file "
        f"{source.path}, which excludes only processes on this machine"
    )


def _announce_default() -> None:
    """Say on stderr, in one line, that the local SQLite default is used (not with --quiet)."""
    ctx = click.get_current_context(silent=True)
    source = _url_source()
    if ctx is None or source is None or source.origin != "default" or ctx.params.get("quiet"):
        return
    click.echo(
        f"sql-lease: no --url, ${URL_ENV} or config file gives a database: using the SQLite file "
        f"{source.path}, which excludes only processes on this machine",
        err=True,
    )


def _fail(code: int, message: str) -> NoReturn:
    click.echo(f"sql-lease: {message}", err=True)
    sys.exit(code)


def _provider(url: str, table_name: str, schema: str | None, version_table: str | None = None) -> Any:
    from .sql.provider import SqlLeaseProvider

    _announce_default()
    try:
        return SqlLeaseProvider(url, table_name=table_name, schema=schema, version_table=version_table)
    except (TypeError, ValueError, LeaseConfigError) as exc:  # LeaseConfigError: a driver not installed
        _fail(EX_CONFIG, str(exc) + _from_config_file())


def _from_config_file() -> str:
    """`` (from the config file PATH)`` when the settings came from one, else ``""``."""
    source = _url_source()
    return f" (from the config file {source.path})" if source is not None and source.origin == "config" else ""


def _run(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` and turn the library's errors into messages and exit codes."""
    try:
        return asyncio.run(main())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)
    except (SchemaMissingError, LeaseConfigError) as exc:
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
    default=None,
    help="Alembic version table of sql_lease, kept apart from your application's "
    "[default: sql_lease_alembic_version for the default table, else TABLE_alembic_version].",
)
@click.option("--sql", "offline", is_flag=True, help="Print the SQL for a DBA instead of running it.")
@click.option(
    "--fences-only",
    is_flag=True,
    help="Create only the fence table TABLE_fences (for accept_fence on a resource in another "
    "database): CREATE TABLE IF NOT EXISTS, no Alembic version table.",
)
def migrate(
    url: str, table_name: str, schema: str | None, version_table: str | None, offline: bool, fences_only: bool
) -> None:
    """Create or upgrade the lease table (idempotent; safe to run concurrently). A sqlite:// file
    is created if missing (its directory must exist)."""
    from .sql.migrate import create_fence_table, fence_table_sql, offline_sql
    from .sql.schema import LeaseTableNames
    from .sql.urls import safe_url, to_async_url

    try:
        names = LeaseTableNames(table_name, schema, version_table)
        shown_url = safe_url(to_async_url(url))
    except (TypeError, ValueError) as exc:
        _fail(EX_CONFIG, str(exc) + _from_config_file())
    if fences_only:
        if offline:
            click.echo(fence_table_sql(url, names), nl=False)
            return

        async def fences() -> str:
            return await create_fence_table(url, names)

        _announce_default()
        click.echo(f"sql_lease fence table {_run(fences)} on {shown_url}")
        return
    if offline:
        click.echo(offline_sql(url, names), nl=False)
        return
    provider = _provider(url, table_name, schema, version_table)

    async def main() -> tuple[tuple[bool, tuple[str, ...] | None], str | None]:
        async with provider:
            before = await _schema_before(provider)
            return before, await provider.migrate()

    (existed, versions), revision = _run(main)
    table = f"{names.schema}.{names.table}" if names.schema else names.table
    if not existed:
        click.echo(f"created {table} at revision {revision} on {shown_url}")
    elif versions == (revision,):
        click.echo(f"{table} already at revision {revision} on {shown_url}")
    else:
        earlier = ", ".join(versions or ()) or "unknown"
        click.echo(f"migrated {table} from revision {earlier} to {revision} on {shown_url}")


async def _schema_before(provider: Any) -> tuple[bool, tuple[str, ...] | None]:
    """(does the lease table exist, its recorded revisions) before ``migrate``: what it then did."""
    from .sql.migrate import migrate_error, read_state

    path = getattr(provider, "database_file", None)
    if provider.dialect_name == "sqlite" and path is not None and not path.is_file():
        return False, None  # migrate creates the file (or says why it cannot); a connection here must not
    try:
        async with provider.engine.connect() as conn:
            return await conn.run_sync(read_state, provider.names)  # type: ignore[no-any-return]
    except Exception as exc:
        raise migrate_error(exc, provider.engine.url) from exc


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
        click.echo(f"{_printable(key)}: free")
        sys.exit(1)
    holder = _printable(lease.owner)
    click.echo(f"{_printable(key)}: held by {holder} (fence {lease.fence}) until {lease.expires_at.isoformat()}")


@cli.command()
@url_option
@table_option
@schema_option
@click.option(
    "--batch-size",
    default=SWEEP_BATCH_SIZE,
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


def _is_embedded_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _printable(text: object) -> str:
    """``text`` safe to print to a terminal: control characters (C0, DEL, C1), line and paragraph
    separators and invisible format characters (such as bidirectional overrides) are escaped as
    ``\\x1b``, ``\\r``, ``\\u2028``...; a backslash is doubled, so the escaping is unambiguous."""
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


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
    lost while COMMAND ran (COMMAND and its process group are then terminated), 69 if the database
    fails, 78 if the lease table is missing. A sqlite:// database gets its schema on first use;
    PostgreSQL must be migrated first (sql-lease migrate).

    \b
    COMMAND leads a process group of its own; SIGINT, SIGTERM and SIGHUP sent to exec are
    forwarded to that group (a signal that arrives before COMMAND starts releases the lease
    and exits 128+N). Background jobs COMMAND leaves behind are handled by --on-exit: "kill"
    (default) sends them SIGTERM, then SIGKILL after --kill-after, before the lease is
    released; "wait" keeps holding (and renewing) the lease until the group is empty. A
    process that calls setsid() or setpgid() leaves the group and escapes both.

    \b
    On Linux COMMAND gets SIGKILL if exec itself dies (kill -9): the parent-death signal.
    Its own children do not; elsewhere COMMAND runs on after exec dies, and the lease
    expires after the TTL. When stdin is the terminal and exec runs in its foreground,
    COMMAND gets the terminal's foreground (it can read it; Ctrl-C and Ctrl-Z reach it
    directly); exec takes it back afterwards. COMMAND stopped (SIGSTOP, Ctrl-Z) for a whole
    TTL is terminated and exec exits 76: a stopped command's lease is not renewed forever.

    \b
    An owner id names one holder: with --owner, exec refuses (exit 75) to run while that
    owner already holds KEY (another run with the same --owner) unless --retry-owner says
    this run retries the same job (it then shares that tenure and its fence).
    """


@cli.command(name="exec", cls=_ExecCommand, help=_EXEC_HELP)
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
@click.option(
    "--retry-owner",
    is_flag=True,
    help="With --owner: this run retries a job whose earlier run may still hold KEY under the same "
    "owner id; run even then (sharing its tenure) instead of refusing.",
)
@click.option("--wait", is_flag=True, help="Wait for the lease instead of exiting 75 when it is held.")
@click.option("--timeout", default=None, type=DURATION, help="With --wait: give up after this long (exit 75).")
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
    retry_owner: bool,
    wait: bool,
    timeout: float | None,
    on_exit: str,
    kill_after: float | None,
    allow_kill_after_beyond_ttl: bool,
    conflict_exit_code: int,
    quiet: bool,
) -> None:
    command = tuple(ctx.meta.get("sql_lease.command", ()))
    if not command:
        _fail(2, "no command given: sql-lease exec KEY [OPTIONS] -- COMMAND [ARGS]...")
    try:
        validate_key(key)
        claim = owner is not None and not retry_owner  # a given owner id may already hold KEY
        owner = validate_owner(owner) if owner is not None else new_owner_id()
    except (TypeError, ValueError) as exc:
        _fail(2, str(exc))
    try:
        validate_ttl_ms(ttl * 1000)
    except ValueError:
        _fail(2, f"--ttl must be between 1ms and 365 days (8760h), got {ttl:g} s")
    if timeout is not None and not wait:
        _fail(2, "--timeout goes with --wait")
    if retry_owner and ctx.params.get("owner") is None:
        _fail(2, "--retry-owner goes with --owner")
    if kill_after is None:
        kill_after = ttl / 10
    elif kill_after > ttl / 10 * (1 + 1e-9) and not allow_kill_after_beyond_ttl:
        _fail(
            2,
            f"--kill-after {kill_after:g} s is longer than TTL/10 ({ttl / 10:g} s): after a loss the command "
            "could still run when another owner takes the lease. Shorten it, lengthen --ttl, or pass "
            "--allow-kill-after-beyond-ttl",
        )
    provider = _provider(url, table_name, schema)
    options = _ExecOptions(
        key, owner, claim, ttl, wait, timeout, kill_after, on_exit, command, conflict_exit_code, quiet
    )
    code = _run(lambda: _exec(provider, url, options))
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


_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_TEST_HOOK_ENV = "_SQL_LEASE_TEST_AFTER_ACQUIRE"  # private: tests pause exec between acquire and start


class _Signals:
    """exec's SIGINT/SIGTERM/SIGHUP handling, installed before the acquire.

    While the lease is being acquired a signal cancels that (the caller then releases whatever may
    have been taken); once it is held, before the command starts, a signal is only recorded (the
    command is then not started); once the command runs, signals go to its process group."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.received: int | None = None
        self.group: int | None = None
        self.acquiring = True
        self.cancelled = False
        for signum in _FORWARDED_SIGNALS:
            self.loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        if self.group is not None:
            _signal_group(self.group, signum)
            return
        if self.received is None:
            self.received = signum
        if self.acquiring and not self.cancelled and self.task is not None:
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
    signals = _Signals()
    taken = _Taken()
    try:
        async with provider:
            try:
                if _is_embedded_sqlite(url):
                    await provider.migrate()
                return await _acquire_and_run(provider, opts, signals, taken)
            except asyncio.CancelledError:
                if not signals.take_cancellation():
                    raise
                await taken.release(provider, opts.key)
                return signals.exit_code()
            except LeaseNotAcquiredError as exc:
                if not opts.quiet:
                    click.echo(f"sql-lease: {_printable(exc)}", err=True)
                return opts.conflict_exit_code
    except asyncio.CancelledError:  # while the provider opened or closed
        if not signals.take_cancellation():
            raise
        return signals.exit_code()
    finally:
        signals.close()


async def _acquire_and_run(provider: Any, opts: _ExecOptions, signals: _Signals, taken: _Taken) -> int:
    ttl_ms = opts.ttl_s * 1000
    wait = opts.wait
    status = _WaitStatus(provider, opts) if opts.wait and not opts.quiet and sys.stderr.isatty() else None
    try:
        if opts.claim:
            await _acquire_as_new_holder(provider, opts, taken)
            wait = False  # held by opts.owner now: hold() re-acquires it (semantic 3)
        taken.add(opts.owner)
        async with hold(
            provider, opts.key, opts.owner, ttl_ms, wait=wait, timeout_s=opts.timeout_s, on_lost="flag"
        ) as lease:
            if status is not None:
                await status.stop()
            signals.acquiring = False
            return await _run_command(lease, opts, signals)
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
                lease = await self.provider.get_lease(self.opts.key)
                if lease is not None and lease.owner != self.opts.owner:
                    self._draw(
                        f"waiting for {_printable(self.opts.key)}, held by {_printable(lease.owner)}, "
                        f"{_expiry_words(lease.remaining_ms)}"
                    )
            except Exception:
                pass
            await asyncio.sleep(self.REFRESH_S)

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


def _expiry_words(remaining_ms: float | None) -> str:
    """``expires in 12s`` (whole seconds, rounded up), ``expires in 4m05s``, or ``expired``."""
    if remaining_ms is None:
        return "expiry unknown"
    if remaining_ms <= 0:
        return "expired"
    seconds = remaining_ms / 1000
    return f"expires in {math.ceil(seconds)}s" if seconds < 60 else f"expires in {_span(seconds)}"


async def _acquire_as_new_holder(provider: Any, opts: _ExecOptions, taken: _Taken) -> None:
    """Acquire the key for ``opts.owner`` only if nobody, that owner included, holds it.

    An acquire by the current owner succeeds (semantic 3: a retry), so a second run with the same
    --owner would run alongside the first. Instead the key is taken under a fresh, unique owner id
    (refused if anyone holds it, and exclusive), then transferred to ``opts.owner`` (atomic: the
    key is never free in between; the fence grows). Sound for every provider, at the cost of a
    second statement; the claim id shows in ``status`` for that moment."""
    claim = new_owner_id()
    taken.add(claim)
    ttl_ms = opts.ttl_s * 1000
    try:
        if opts.wait:
            result = await acquire_lease_wait(provider, opts.key, claim, ttl_ms, opts.timeout_s)
        else:
            result = await provider.acquire_lease(opts.key, claim, ttl_ms)
            if not result.acquired:
                raise LeaseNotAcquiredError(opts.key, result.owner, result.fence, result.expires_at)
    except LeaseNotAcquiredError as exc:
        if exc.holder == opts.owner:
            raise _SameOwnerError(opts.key, exc.holder, exc.fence, exc.expires_at) from None
        raise
    taken.add(opts.owner)
    if not await provider.transfer_lease(opts.key, claim, opts.owner, ttl_ms):
        raise LeaseNotAcquiredError(opts.key, None)  # expired between two statements: TTL too short


class _SameOwnerError(LeaseNotAcquiredError):
    def __str__(self) -> str:
        return (
            f"lease {self.key!r} is already held by this owner, {self.holder!r} (fence {self.fence}): another "
            "run with the same --owner is running. An owner id names one holder; pass --retry-owner only "
            "to retry a run of the same job that may still hold the lease"
        )


async def _test_hook(signals: _Signals) -> None:
    path = os.environ.get(_TEST_HOOK_ENV)
    if not path:
        return
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    await _poll(lambda: signals.received is not None, 10.0)


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
            click.echo(f"sql-lease: command not found: {_printable(command[0])}", err=True)
            return 127
        click.echo(f"sql-lease: cannot execute {_printable(command[0])}: bad interpreter or missing library", err=True)
        return 126
    except OSError as exc:
        click.echo(f"sql-lease: cannot execute {_printable(command[0])}: {exc.strerror or exc}", err=True)
        return 126


async def _run_command(lease: Any, opts: _ExecOptions, signals: _Signals) -> int:
    env = dict(os.environ, SQL_LEASE_KEY=lease.key, SQL_LEASE_OWNER=lease.owner, SQL_LEASE_FENCE=str(lease.fence))
    await _test_hook(signals)
    if signals.received is not None:
        name = signal.Signals(signals.received).name
        click.echo(f"sql-lease: {name} before the command started; releasing the lease, not running it", err=True)
        return 128 + signals.received
    terminal = _foreground_terminal()
    proc = await _start(opts.command, env, terminal)
    if isinstance(proc, int):
        return proc
    signals.group = proc.pid
    if signals.received is not None:  # arrived while the command was being started
        _signal_group(proc.pid, signals.received)
    # With the terminal given away, exec is in the background: it must not stop writing to it.
    previous_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN) if terminal is not None else None
    try:
        return await _supervise(proc, lease, opts)
    finally:
        if terminal is not None:
            _take_terminal_back(terminal)
            signal.signal(signal.SIGTTOU, signal.SIG_DFL if previous_ttou is None else previous_ttou)


async def _supervise(proc: asyncio.subprocess.Process, lease: Any, opts: _ExecOptions) -> int:
    """Wait for the command and then its process group (``--on-exit``); terminate them on loss or
    when stopped for a whole TTL. The exit code of exec."""
    loop = asyncio.get_running_loop()
    group = proc.pid
    poll_s = min(0.5, opts.ttl_s / 4)
    exited = asyncio.ensure_future(proc.wait())
    lost = asyncio.ensure_future(lease.lost.wait())
    stopped_since: float | None = None
    try:
        while not exited.done():
            await asyncio.wait({exited, lost}, timeout=poll_s, return_when=asyncio.FIRST_COMPLETED)
            if lost.done():
                return await _terminate_for_loss(lease, group, exited, opts.kill_after_s)
            if exited.done():
                break
            stopped_since = _still_stopped(_is_stopped(proc.pid), stopped_since, loop.time())
            if stopped_since is not None and loop.time() - stopped_since >= opts.ttl_s:
                return await _terminate_stopped(group, exited, opts)
        status = _exit_status(exited.result())
        if opts.on_exit == "kill":
            if _group_alive(group):
                await _terminate_group(group, None, opts.kill_after_s)
            if lease.lost.is_set():
                return await _terminate_for_loss(lease, group, None, opts.kill_after_s)
            return status
        stopped_since = None
        while _group_alive(group):  # --on-exit wait
            await asyncio.wait({lost}, timeout=poll_s)
            if lost.done():
                return await _terminate_for_loss(lease, group, None, opts.kill_after_s)
            stopped_since = _still_stopped(_group_stopped(group), stopped_since, loop.time())
            if stopped_since is not None and loop.time() - stopped_since >= opts.ttl_s:
                return await _terminate_stopped(group, None, opts)
        return status
    finally:
        lost.cancel()


def _still_stopped(stopped: bool, since: float | None, now: float) -> float | None:
    return (since if since is not None else now) if stopped else None


async def _terminate_for_loss(lease: Any, group: int, exited: asyncio.Future[int] | None, kill_after_s: float) -> int:
    reason = _printable(lease.lost_reason)
    click.echo(f"sql-lease: lease {_printable(repr(lease.key))} lost ({reason}); terminating the command", err=True)
    await _terminate_group(group, exited, kill_after_s)
    return EXIT_LEASE_LOST


async def _terminate_stopped(group: int, exited: asyncio.Future[int] | None, opts: _ExecOptions) -> int:
    click.echo(
        f"sql-lease: the command has been stopped for {opts.ttl_s:g} s (the lease TTL); terminating it "
        "rather than renewing the lease for a stopped command",
        err=True,
    )
    await _terminate_group(group, exited, opts.kill_after_s)
    return EXIT_LEASE_LOST


async def _terminate_group(group: int, exited: asyncio.Future[int] | None, kill_after_s: float) -> None:
    """SIGTERM the process group (and SIGCONT it, so stopped members see the SIGTERM); SIGKILL it
    after ``kill_after_s`` seconds unless it is gone by then; wait (a little) until it is empty."""

    def gone() -> bool:
        return (exited is None or exited.done()) and not _group_alive(group)

    _signal_group(group, signal.SIGTERM)
    _signal_group(group, signal.SIGCONT)
    await _poll(gone, kill_after_s)
    _signal_group(group, signal.SIGKILL)
    if exited is not None:
        await exited
    if not await _poll(lambda: not _group_alive(group), 2.0):
        click.echo(f"sql-lease: processes of the command's group {group} could not be killed", err=True)


async def _poll(done: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> bool:
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


# -- operating leases: list, show, break, acquire/renew/release/transfer, check (issue 11) ----------
#
# Exit codes for scripts: 0 success; 1 nothing there (show: free; break: nothing to break); 2 bad
# arguments; 75 held by another / not ours (as exec's EX_TEMPFAIL); 69 database failure; 78
# configuration (missing table, refused role or privilege). Text from the database goes through
# _printable(); JSON is printed with json.dumps' ASCII escapes.

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
owner_required = click.option("--owner", required=True, help="Owner id of the lease.")
ttl_option = click.option(
    "--ttl", default="30s", type=DURATION, show_default=True, help="Lease TTL (500ms, 30s, 5m, 1h30m, 2d)."
)
MAX_DATA_FILE_BYTES = 1 << 20
"""Most bytes ``--data @FILE`` / ``--data -`` read (the data itself is checked against 4096 bytes)."""


def _data_argument(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--data``'s JSON text: as given, read from the file after ``@``, or from stdin for ``-``;
    a file that cannot be read exits 2 naming it."""
    if value is None or ctx.resilient_parsing or not (value == "-" or value.startswith("@")):
        return value
    if value == "@":
        _fail(2, "--data @: give a file name after @ (or - for stdin)")
    where = "stdin" if value == "-" else value[1:]
    try:
        if value == "-":
            raw = sys.stdin.buffer.read(MAX_DATA_FILE_BYTES + 1)
        else:
            with open(where, "rb") as f:
                raw = f.read(MAX_DATA_FILE_BYTES + 1)
        if len(raw) > MAX_DATA_FILE_BYTES:
            _fail(2, f"--data {_printable(value)}: more than {MAX_DATA_FILE_BYTES} bytes (lease data is at most 4096)")
        return raw.decode("utf-8")
    except OSError as exc:
        _fail(2, f"--data {_printable(value)}: {_printable(where)} cannot be read: {exc.strerror or exc}")
    except UnicodeDecodeError:
        _fail(2, f"--data {_printable(value)}: {_printable(where)} is not UTF-8 text")


data_option = click.option(
    "--data",
    "data_json",
    default=None,
    callback=_data_argument,
    help="Lease data: a JSON object, e.g. '{\"job\": 42}', @FILE to read it from a file, or - for stdin "
    "(at most 4096 bytes).",
)
DATA_CELL_WIDTH = 60
"""Longest data cell in the ``list`` table, in characters (``--json`` and ``show`` print it whole)."""


def _data(data_json: str | None) -> dict[str, Any] | None:
    """``--data`` parsed and checked as the providers check lease data; bad JSON or data exits 2."""
    import json

    from .contract import encode_data

    if data_json is None:
        return None
    try:
        data = json.loads(data_json, object_pairs_hook=_unique_keys)
    except RecursionError:
        _fail(2, "--data is nested too deep")
    except ValueError as exc:
        _fail(2, f"--data is not valid JSON: {_printable(str(exc))}")
    try:
        encode_data(data)
    except (TypeError, ValueError) as exc:
        _fail(2, f"--data: {exc}")
    return data  # type: ignore[no-any-return]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict; ``ValueError`` naming a key given twice."""
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found:
            raise ValueError(f"the key {name!r} appears twice in one object")
        found[name] = value
    return found


def _data_text(data: dict[str, Any] | None) -> str:
    """Lease data as compact JSON for people (non-ASCII kept, control characters escaped), or ``""``."""
    import json

    return "" if data is None else _printable(json.dumps(data, ensure_ascii=False, separators=(",", ":")))


def _valid(check: Callable[[], object]) -> None:
    """Run a validator; its ``TypeError``/``ValueError`` is a usage error (exit 2)."""
    try:
        check()
    except (TypeError, ValueError) as exc:
        _fail(2, str(exc))


def _ttl_ms(ttl: float) -> float:
    try:
        return validate_ttl_ms(ttl * 1000)
    except ValueError:
        _fail(2, f"--ttl must be between 1ms and 365 days (8760h), got {ttl:g} s")


def _expires_in(remaining_ms: float | None) -> str:
    """``29.5s``, ``4m05s``, ``2h03m``, ``3d04h``; ``expired 3.0s ago`` for a lease past its expiry."""
    if remaining_ms is None:
        return "?"
    seconds = remaining_ms / 1000
    if seconds <= 0:
        return f"expired {_span(-seconds)} ago"
    return _span(seconds)


def _span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86_400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86_400}d{whole % 86_400 // 3600:02d}h"


def _held_ms(lease: Any) -> float | None:
    """How long the tenure has lasted (ms; an expired one: until it expired) by the database's
    clock alone: ``expires_at`` minus ``acquired_at``, less the ``remaining_ms`` the database
    reported; None when the start is unknown."""
    if lease.acquired_at is None or lease.remaining_ms is None:
        return None
    held_ms: float = (lease.expires_at - lease.acquired_at).total_seconds() * 1000 - max(lease.remaining_ms, 0.0)
    return held_ms


def _held_for(held_ms: float | None) -> str:
    """``12.5s``, ``4m05s``...; blank when unknown (a lease from before migration 0003)."""
    return "" if held_ms is None else _span(max(held_ms, 0.0) / 1000)


def _lease_json(lease: Any, read_row: bool = True) -> dict[str, Any]:
    """A lease for ``--json``; ``data``, ``acquired_at`` and ``held_ms`` only where the command
    read the row (list, show, transfer)."""
    fields = {
        "key": lease.key,
        "owner": lease.owner,
        "fence": lease.fence,
        "expires_at": lease.expires_at.isoformat(),
        "remaining_ms": round(lease.remaining_ms, 3) if lease.remaining_ms is not None else None,
        "expired": lease.remaining_ms is not None and lease.remaining_ms <= 0,
    }
    if not read_row:
        return fields
    held_ms = _held_ms(lease)
    return {
        **fields,
        "data": lease.data,
        "acquired_at": lease.acquired_at.isoformat() if lease.acquired_at is not None else None,
        "held_ms": round(held_ms, 3) if held_ms is not None else None,
    }


def _print_json(value: object) -> None:
    import json

    click.echo(json.dumps(value, ensure_ascii=True, allow_nan=False))  # strict JSON: no NaN or Infinity


_LIST_COLUMNS = ("KEY", "OWNER", "FENCE", "EXPIRES IN", "HELD FOR", "EXPIRES AT", "DATA")


def _lease_cells(lease: Any, data_width: int | None = None) -> tuple[str, ...]:
    expires_at = lease.expires_at.isoformat(timespec="seconds")
    data = _data_text(lease.data)
    if data_width is not None and len(data) > data_width:
        data = data[: data_width - 1] + "…"
    cells = _printable(lease.key), _printable(lease.owner), str(lease.fence), _expires_in(lease.remaining_ms)
    return (*cells, _held_for(_held_ms(lease)), expires_at, data)


def _rich_console() -> Any:
    """rich's console when rich is installed (the ``cli`` extra) and stdout is a terminal, else None."""
    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(highlight=False)


def _render_leases(leases: list[Any], console: Any) -> None:
    """A table of ``leases``: rich on a terminal, else plain text aligned in columns."""
    rows = [_lease_cells(lease, DATA_CELL_WIDTH) for lease in leases]
    if console is not None:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        table = Table(*_LIST_COLUMNS, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))  # Text: no markup is interpreted
        console.print(table)
        return
    widths = [max([len(title)] + [len(row[i]) for row in rows]) for i, title in enumerate(_LIST_COLUMNS)]
    for row in [_LIST_COLUMNS, *rows]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


_LIST_HELP = """List leases by key: key, owner, fence, time left and time held (both by the database's
    clock), expiry, data.

    A table on a terminal (rich, with `pip install 'sql-lease[cli]'`), plain aligned columns
    when piped; lease data is shown as compact JSON, cut at 60 characters. HELD FOR is blank for a
    lease taken before migration 0003 recorded tenure starts. --json prints one JSON array of
    objects (key, owner, fence, expires_at, remaining_ms, expired, data, acquired_at, held_ms) on
    one line; with --watch, one such line per refresh.
    """


@cli.command(name="list", help=_LIST_HELP)
@url_option
@table_option
@schema_option
@click.option("--prefix", default=None, help="Only keys starting with this text (taken literally: no wildcards).")
@click.option("--all", "include_expired", is_flag=True, help="Include expired leases not yet swept.")
@json_option
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 100_000), help="At most this many.")
@click.option("--watch", default=None, type=DURATION, help="Refresh every this long (Ctrl-C ends it).")
def list_(
    url: str,
    table_name: str,
    schema: str | None,
    prefix: str | None,
    include_expired: bool,
    as_json: bool,
    limit: int,
    watch: float | None,
) -> None:
    from .contract import validate_list

    _valid(lambda: validate_list(prefix, include_expired, limit))
    provider = _provider(url, table_name, schema)
    console = None if as_json else _rich_console()

    def show(leases: list[Any]) -> None:
        if len(leases) == limit:
            click.echo(f"sql-lease: showing the first {limit}; see more with --limit", err=True)
        if as_json:
            _print_json([_lease_json(lease) for lease in leases])
            return
        if watch is not None:
            if console is not None:
                console.clear()
            elif sys.stdout.isatty():
                click.echo("\x1b[H\x1b[2J", nl=False)
            else:
                click.echo("")
        if leases:
            _render_leases(leases, console)
        else:
            click.echo("no leases" + (f" starting with {_printable(prefix)!r}" if prefix else ""))

    async def main() -> None:
        async with provider:
            while True:
                show(await provider.list_leases(prefix, include_expired, limit))
                if watch is None:
                    return
                sys.stdout.flush()
                await asyncio.sleep(watch)

    _run(main)


def _describe(lease: Any) -> str:
    return (
        f"{_printable(lease.key)}: held by {_printable(lease.owner)} (fence {lease.fence}), "
        f"expires in {_expires_in(lease.remaining_ms)} at {lease.expires_at.isoformat()}"
    )


@cli.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@json_option
def show(key: str, url: str, table_name: str, schema: str | None, as_json: bool) -> None:
    """Show the lease on KEY: owner, fence, expiry, data (exit 0), or that KEY is free (exit 1)."""
    _valid(lambda: validate_key(key))
    provider = _provider(url, table_name, schema)

    async def main() -> Any:
        async with provider:
            return await provider.get_lease(key)

    lease = _run(main)
    if as_json:
        _print_json(None if lease is None else _lease_json(lease))
    elif lease is None:
        click.echo(f"{_printable(key)}: free")
    else:
        for label, value in zip(
            ("key", "owner", "fence", "expires in", "held for", "expires at", "data"), _lease_cells(lease), strict=True
        ):
            click.echo(f"{label + ':':<12}{value}".rstrip())
    sys.exit(0 if lease is not None else 1)


@cli.command(name="break")
@click.argument("key")
@url_option
@table_option
@schema_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask (required when stdin is not a terminal).")
@click.option(
    "--fence",
    type=int,
    default=None,
    help="Break only the tenure with this fencing token (as `show` printed it); if the lease changed "
    "hands meanwhile, leave it and exit 1 naming the current holder.",
)
@json_option
def break_(
    key: str, url: str, table_name: str, schema: str | None, yes: bool, fence: int | None, as_json: bool
) -> None:
    """Delete the lease on KEY (exit 0), or exit 1 if nothing is held.

    For a lease left behind by a holder that died (kill -9). The next acquire gets a new, larger
    fence; the holder, if it still runs, has its next renewal refused. Asks first on a terminal,
    and then breaks only the tenure it showed (its fence); without a terminal it refuses unless
    --yes is given. With --fence N it breaks only that tenure: a lease that changed hands since is
    left alone (exit 1, naming its holder).
    """
    _valid(lambda: validate_key(key))
    if fence is not None:
        _valid(lambda: validate_fence(fence))
    if not yes and not sys.stdin.isatty():
        _fail(2, f"refusing to break lease {_printable(repr(key))} without --yes: stdin is not a terminal")
    provider = _provider(url, table_name, schema)

    async def main() -> tuple[Any, bool, Any]:
        """(the lease broken, confirmed, the current lease when the tenure to break was not there)."""
        async with provider:
            expected = fence
            if not yes:
                current = await provider.get_lease(key)
                if current is None:
                    return None, True, None
                if fence is not None and current.fence != fence:
                    return None, True, current
                click.echo(_describe(current))
                if not click.confirm("Break it? Its holder loses it at its next renewal", default=False):
                    return None, False, None
                expected = current.fence  # the tenure shown, not whoever holds the key by now
            broken = await provider.break_lease(key, fence=expected)
            if broken is None and expected is not None:
                return None, True, await provider.get_lease(key)
            return broken, True, None

    broken, confirmed, now = _run(main)
    if as_json:
        _print_json(None if broken is None else _lease_json(broken, read_row=False))
    if broken is None and now is not None:
        _fail(1, f"not broken: lease {_printable(repr(key))} changed hands, now {_describe(now)}")
    if as_json:
        pass  # printed above
    elif broken is not None:
        left = _expires_in(broken.remaining_ms)
        click.echo(
            f"broke {_printable(broken.key)}: it was held by {_printable(broken.owner)} "
            f"(fence {broken.fence}, {left} left)"
        )
    elif confirmed:
        click.echo(f"{_printable(key)}: free, nothing to break")
    else:
        click.echo("not broken")
    sys.exit(0 if broken is not None else 1)


def _not_ours(key: str, owner: str) -> NoReturn:
    _fail(
        EX_TEMPFAIL,
        f"lease {_printable(repr(key))} is not held by {_printable(repr(owner))} "
        "(expired, released, or held by another)",
    )


def _print_fence(lease: Any, as_json: bool, read_row: bool = False, **extra: Any) -> None:
    if as_json:
        _print_json({**extra, **_lease_json(lease, read_row)})
    else:
        click.echo(f"fence={lease.fence}")


@cli.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@owner_required
@ttl_option
@data_option
@json_option
def acquire(
    key: str,
    url: str,
    table_name: str,
    schema: str | None,
    owner: str,
    ttl: float,
    data_json: str | None,
    as_json: bool,
) -> None:
    """Acquire KEY for --owner; print its fence (exit 0), or exit 75 naming the holder.

    Re-acquiring a lease the same owner holds extends it and keeps the fence (and its data, unless
    --data replaces it). A sqlite:// database gets its schema on first use, as with exec.
    """
    from .contract import LeaseInfo

    _valid(lambda: (validate_key(key), validate_owner(owner)))
    ttl_ms = _ttl_ms(ttl)
    data = _data(data_json)
    provider = _provider(url, table_name, schema)

    async def main() -> Any:
        async with provider:
            if _is_embedded_sqlite(url):
                await provider.migrate()
            return await provider.acquire_lease(key, owner, ttl_ms, data=data)

    result = _run(main)
    if result.acquired:
        _print_fence(
            LeaseInfo(key, owner, result.fence, result.expires_at, result.remaining_ms), as_json, acquired=True
        )
        return
    refusal = LeaseNotAcquiredError(key, result.owner, result.fence, result.expires_at)
    if as_json:
        _print_json({"acquired": False, "key": key, "holder": result.owner, "fence": result.fence})
    _fail(EX_TEMPFAIL, _printable(refusal))


@cli.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@owner_required
@ttl_option
@json_option
def renew(key: str, url: str, table_name: str, schema: str | None, owner: str, ttl: float, as_json: bool) -> None:
    """Extend --owner's lease on KEY to now + --ttl; print its fence (exit 0), or exit 75 if it is
    not that owner's (expired, released, or held by another)."""
    _valid(lambda: (validate_key(key), validate_owner(owner)))
    ttl_ms = _ttl_ms(ttl)
    provider = _provider(url, table_name, schema)

    async def main() -> Any:
        async with provider:
            return await provider.renew_lease_info(key, owner, ttl_ms)

    lease = _run(main)
    if lease is None:
        _not_ours(key, owner)
    _print_fence(lease, as_json, renewed=True)


@cli.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@owner_required
@json_option
def release(key: str, url: str, table_name: str, schema: str | None, owner: str, as_json: bool) -> None:
    """Release --owner's lease on KEY (exit 0), or exit 75 if it is not that owner's."""
    _valid(lambda: (validate_key(key), validate_owner(owner)))
    provider = _provider(url, table_name, schema)

    async def main() -> bool:
        async with provider:
            return bool(await provider.release_lease(key, owner))

    if not _run(main):
        _not_ours(key, owner)
    if as_json:
        _print_json({"released": True, "key": key, "owner": owner})
    else:
        click.echo("released")


@cli.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@click.option("--from", "from_owner", required=True, help="The current owner.")
@click.option("--to", "to_owner", required=True, help="The next owner.")
@ttl_option
@data_option
@json_option
def transfer(
    key: str,
    url: str,
    table_name: str,
    schema: str | None,
    from_owner: str,
    to_owner: str,
    ttl: float,
    data_json: str | None,
    as_json: bool,
) -> None:
    """Hand KEY from --from to --to atomically (the key is never free in between); print the new
    fence (exit 0), or exit 75 if --from does not hold it. The next owner gets --data (none
    without it)."""
    _valid(lambda: (validate_key(key), validate_owner(from_owner, "--from"), validate_owner(to_owner, "--to")))
    ttl_ms = _ttl_ms(ttl)
    data = _data(data_json)
    provider = _provider(url, table_name, schema)

    async def main() -> tuple[bool, Any]:
        async with provider:
            if not await provider.transfer_lease(key, from_owner, to_owner, ttl_ms, data=data):
                return False, None
            return True, await provider.get_lease(key)

    moved, lease = _run(main)
    if not moved:
        _not_ours(key, from_owner)
    if lease is None or lease.owner != to_owner:  # released or lost in the instant since
        _fail(
            EX_TEMPFAIL,
            f"lease {_printable(repr(key))} was transferred but is no longer held by {_printable(repr(to_owner))}",
        )
    _print_fence(lease, as_json, read_row=True, transferred=True)


@dataclasses.dataclass
class _Check:
    name: str
    ok: bool | None  # None: informational
    detail: str


async def _checks(provider: Any, url: str, names: Any) -> tuple[list[_Check], int]:
    """Each check of ``sql-lease check`` and the exit code (0, 69 or 78)."""
    import time

    import sqlalchemy as sa

    from .sql.migrate import HEAD_REVISION, migrate_error, read_state
    from .sql.statements import qualified_name
    from .sql.translate import translate
    from .sql.urls import safe_url

    checks: list[_Check] = [_Check("url", None, _describe_source(url))]
    postgres = provider.dialect_name == "postgresql"
    path = getattr(provider, "database_file", None)
    if path is not None and path.exists() and not path.is_file():  # said without a connect that must fail
        checks.append(_Check("database", False, f"the SQLite database {path} is not a file; fix the path in the URL"))
        return checks, EX_CONFIG
    try:
        async with provider.engine.connect() as conn:
            clock_sql = (
                "SELECT extract(epoch FROM clock_timestamp())::float8, current_setting('server_version')"
                if postgres
                else "SELECT (julianday('now') - 2440587.5) * 86400.0, sqlite_version()"
            )
            before = time.time()
            row = (await conn.exec_driver_sql(clock_sql)).one()
            after = time.time()
            product = "PostgreSQL" if postgres else "SQLite"
            checks.append(_Check("database", True, f"{product} {row[1]} answers in {(after - before) * 1000:.1f} ms"))
            offset = float(row[0]) - (before + after) / 2
            side = "ahead of" if offset >= 0 else "behind"
            checks.append(
                _Check(
                    "clock",
                    None,
                    f"the database's clock is {abs(offset):.3f} s {side} this machine's "
                    f"(±{(after - before) / 2:.3f} s; informational: expiry uses the database's clock only)",
                )
            )
            hint = f"run `sql-lease migrate --url {safe_url(url)}{provider.migrate_command_options()}`"
            unreadable = await _version_table_readable(conn, names, qualified_name, sa) if postgres else None
            if unreadable is not None:
                table_exists, versions = unreadable[0], None
                checks.append(_Check("schema", None, unreadable[1]))
            else:
                table_exists, versions = await conn.run_sync(read_state, names)
            if unreadable is not None:
                pass
            elif table_exists and versions == (HEAD_REVISION,):
                checks.append(_Check("schema", True, f"{names.table} at revision {HEAD_REVISION} (head)"))
            elif not table_exists:
                checks.append(_Check("schema", False, f"lease table {names.table} not found: {hint}"))
            else:
                at = ", ".join(versions or ()) or "unknown"
                checks.append(
                    _Check("schema", False, f"{names.table} at revision {at}, head is {HEAD_REVISION}: {hint}")
                )
            if postgres and table_exists:
                checks.append(await _grants(conn, names, qualified_name, sa))
            elif not postgres:
                checks.append(_sqlite_access(provider))
    except LeaseError as exc:
        checks.append(_Check("database", False, str(exc)))
        return checks, EX_CONFIG if isinstance(exc, (SchemaMissingError, LeaseConfigError)) else EX_UNAVAILABLE
    except Exception as exc:
        error = translate(exc, "check", provider.safe_url, provider._schema_missing)
        if not isinstance(error, SchemaMissingError):  # one line, the driver's words, no SQLAlchemy text
            error = migrate_error(exc, provider.engine.url, "checking")
        checks.append(_Check("database", False, str(error)))
        return checks, EX_CONFIG if isinstance(error, (SchemaMissingError, LeaseConfigError)) else EX_UNAVAILABLE
    return checks, 0 if all(check.ok is not False for check in checks) else EX_CONFIG


async def _version_table_readable(conn: Any, names: Any, qualified: Any, sa: Any) -> tuple[bool, str] | None:
    """None if this role may read the lease table's Alembic version table (or it is missing), else
    (does the lease table exist, why its revision cannot be checked): a least-privilege role has no
    SELECT on the version table."""
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    version_table = qualified(dialect, names, names.version_table)
    row = (
        await conn.execute(
            sa.text("SELECT to_regclass(:v) IS NULL OR has_table_privilege(:v, 'SELECT'), to_regclass(:t) IS NOT NULL"),
            {"v": version_table, "t": qualified(dialect, names, names.table)},
        )
    ).one()
    if row[0]:
        return None
    where = "exists" if row[1] else "not found"
    return bool(row[1]), (
        f"lease table {names.table} {where}; its revision is unknown to this role (no SELECT on "
        f"{version_table}): run `sql-lease check` as the role that migrates to see it"
    )


async def _grants(conn: Any, names: Any, qualified: Any, sa: Any) -> _Check:
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    table = qualified(dialect, names, names.table)
    sequence = qualified(dialect, names, names.fence_sequence)
    wanted = ("SELECT", "INSERT", "UPDATE", "DELETE")
    columns = ", ".join(f"has_table_privilege(:t, '{p}')" for p in wanted)
    row = (
        await conn.execute(
            sa.text(f"SELECT {columns}, has_sequence_privilege(:s, 'USAGE'), current_user"), {"t": table, "s": sequence}
        )
    ).one()
    missing = [f"{p} on {table}" for p, has in zip(wanted, row[:4], strict=True) if not has]
    if not row[4]:
        missing.append(f"USAGE on sequence {sequence}")
    role = row[5]
    if not missing:
        return _Check(
            "privileges", True, f"role {role} has SELECT, INSERT, UPDATE, DELETE on {table} and USAGE on {sequence}"
        )
    return _Check(
        "privileges", False, f"role {role} lacks {'; '.join(missing)} (see the README's least-privilege GRANTs)"
    )


def _sqlite_access(provider: Any) -> _Check:
    path = getattr(provider, "database_file", None)
    if path is None:
        return _Check("privileges", None, "no file to check (a uri=true SQLite URL)")
    if os.access(path, os.R_OK | os.W_OK) and os.access(path.parent, os.W_OK):
        return _Check("privileges", True, f"{path} and its directory are writable (WAL files live beside it)")
    return _Check("privileges", False, f"{path} or its directory is not writable by this user")


@cli.command()
@url_option
@table_option
@schema_option
@click.option("--version-table", default=None, help="Alembic version table of sql_lease, if not the default.")
@json_option
def check(url: str, table_name: str, schema: str | None, version_table: str | None, as_json: bool) -> None:
    """Check the database answers, the schema is at head, and the role may use the lease table.

    First prints where the URL came from (--url, $SQL_LEASE_URL, a config file, or the local
    SQLite default). Also prints the offset between this machine's clock and the database's (informational: expiry
    is decided by the database's clock alone). Exit 0 all good, 78 a missing or old schema or a
    missing privilege (the message names the fix), 69 the database does not answer.
    """
    provider = _provider(url, table_name, schema, version_table)

    async def main() -> tuple[list[_Check], int]:
        async with provider:
            return await _checks(provider, url, provider.names)

    checks, code = _run(main)
    if as_json:
        _print_json([dataclasses.asdict(c) for c in checks])
    else:
        for c in checks:
            mark = "info" if c.ok is None else ("ok" if c.ok else "FAIL")
            click.echo(f"{mark:<5} {c.name:<11} {_printable(c.detail)}")
    sys.exit(code)


def main() -> None:
    logging.getLogger("sql_lease").addHandler(logging.NullHandler())  # the CLI prints its own messages
    logging.getLogger("sql_lease").propagate = False
    cli(prog_name="sql-lease")
