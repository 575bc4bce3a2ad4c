"""Where the database URL comes from: --url, $SQL_LEASE_URL, a TOML config file, or the SQLite default."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import click

from .exits import EX_CONFIG, fail
from .render import printable

DEFAULT_URL = "sqlite:///sql_lease.db"
URL_ENV = "SQL_LEASE_URL"
CONFIG_ENV = "SQL_LEASE_CONFIG"
SYSTEM_CONFIG = "/etc/sql-lease/config.toml"
_SYSTEM_CONFIG_ENV = "_SQL_LEASE_TEST_SYSTEM_CONFIG"  # private: tests point the system file elsewhere
CONFIG_KEYS = ("url", "table", "schema")
DEFAULT_TABLE = "sql_leases"
_SOURCE = "sql_lease.url_source"


@dataclasses.dataclass(frozen=True)
class UrlSource:
    """Where the CLI's database URL came from, and the table and schema a config file gave with it."""

    origin: str  # "--url", "$SQL_LEASE_URL", "config", "default"
    path: str | None = None  # the config file (origin "config"), or its default's SQLite file
    table: str | None = None
    schema: str | None = None


def config_candidates() -> list[str]:
    """The config files looked for, in order: $SQL_LEASE_CONFIG alone when set, else
    $XDG_CONFIG_HOME/sql-lease/config.toml (~/.config/... when unset) and /etc/sql-lease/config.toml."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        return [os.path.abspath(named)]
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".config")
    system = os.environ.get(_SYSTEM_CONFIG_ENV) or SYSTEM_CONFIG
    return [os.path.join(base, "sql-lease", "config.toml"), system]


def _config_file() -> str | None:
    """The config file to read: $SQL_LEASE_CONFIG (it must exist), else the first of
    :func:`config_candidates` that exists."""
    candidates = config_candidates()
    if os.environ.get(CONFIG_ENV):
        return candidates[0]
    for candidate in candidates:
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
        fail(EX_CONFIG, f"config file {path} cannot be read: {exc.strerror or exc}")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        fail(EX_CONFIG, f"config file {path} is not valid TOML: {' '.join(str(exc).split())}")
    for name, value in settings.items():
        if name not in CONFIG_KEYS:
            fail(EX_CONFIG, f"config file {path}: unknown key {printable(repr(name))} (expected url, table, schema)")
        if not isinstance(value, str):
            fail(EX_CONFIG, f"config file {path}: {name!r} must be a string")
    return settings


def resolve_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--url, else $SQL_LEASE_URL, else ``url`` of the config file, else the local SQLite default."""
    if ctx.resilient_parsing:
        return value
    if value is not None:
        source = UrlSource("--url")
    elif URL_ENV in os.environ:
        value, source = os.environ[URL_ENV], UrlSource(f"${URL_ENV}")
        if not value.strip():
            fail(
                EX_CONFIG,
                f"${URL_ENV} is set but empty: set it to the database URL, or unset it to use a config file "
                "or the local SQLite default",
            )
    else:
        path = _config_file()
        settings = _read_config(path) if path is not None else {}
        table, schema = settings.get("table"), settings.get("schema")
        if "url" in settings:
            value, source = settings["url"], UrlSource("config", path, table, schema)
        else:
            default_file = os.path.abspath(DEFAULT_URL.removeprefix("sqlite:///"))
            value, source = DEFAULT_URL, UrlSource("default", default_file, table, schema)
    ctx.meta[_SOURCE] = source
    return value


def config_default(name: str, fallback: str | None) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback giving --table / --schema the config file's value when the option is not given."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None or ctx.resilient_parsing:
            return value
        source = ctx.meta.get(_SOURCE)
        configured = getattr(source, name, None) if source is not None else None
        return configured if configured is not None else fallback

    return callback


def url_source() -> UrlSource | None:
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_SOURCE)


def describe_source(url: str) -> str:
    """Where the URL came from, for `sql-lease check`."""
    from ..sql.urls import safe_url

    source = url_source()
    shown = safe_url(url)
    if source is None or source.origin in ("--url", f"${URL_ENV}"):
        return f"{shown} from {source.origin if source else '--url'}"
    if source.origin == "config":
        return f"{shown} from the config file {source.path}"
    return (
        f"{shown}: the default (no --url, ${URL_ENV} or config file gave one), the SQLite file "
        f"{source.path}, which excludes only processes on this machine; config files looked for: "
        f"{', '.join(config_candidates())}"
    )


def uses_default() -> bool:
    """True if no --url, $SQL_LEASE_URL or config file gave the URL: the local SQLite default is used."""
    source = url_source()
    return source is not None and source.origin == "default"


def announce_default() -> None:
    """Say on stderr, in one line, that the local SQLite default is used (not with --quiet)."""
    ctx = click.get_current_context(silent=True)
    source = url_source()
    if ctx is None or source is None or source.origin != "default" or ctx.params.get("quiet"):
        return
    click.echo(
        f"sql-lease: no --url, ${URL_ENV} or config file gives a database: using the SQLite file "
        f"{source.path}, which excludes only processes on this machine",
        err=True,
    )


def from_config_file() -> str:
    """`` (from the config file PATH)`` when the settings came from one, else ``""``."""
    source = url_source()
    return f" (from the config file {source.path})" if source is not None and source.origin == "config" else ""
