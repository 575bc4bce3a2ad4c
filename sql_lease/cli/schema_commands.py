"""``sql-lease migrate`` and ``sql-lease check``: the lease table's schema and what this role may do."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import click

from ..errors import LeaseConfigError, LeaseError, SchemaMissingError
from .config import announce_default, describe_source, from_config_file, uses_default
from .exits import EX_CONFIG, EX_UNAVAILABLE, fail
from .options import json_option, schema_option, table_option, url_option
from .render import as_given, print_json, printable
from .runner import open_provider, run


@click.command()
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
    from ..sql.migrate import Upgrade, create_fence_table, fence_table_sql, offline_sql, upgrade_engine_report
    from ..sql.schema import LeaseTableNames
    from ..sql.urls import safe_url, to_async_url

    try:
        names = LeaseTableNames(table_name, schema, version_table)
        to_async_url(url)  # refused here, before any connection
        shown_url = safe_url(url)  # as the user gave it, password masked
    except (TypeError, ValueError) as exc:
        fail(EX_CONFIG, str(exc) + from_config_file())
    if fences_only:
        if offline:
            click.echo(fence_table_sql(url, names), nl=False)
            return

        async def fences() -> str:
            return await create_fence_table(url, names)

        announce_default()
        click.echo(f"sql_lease fence table {run(fences)} on {shown_url}")
        return
    if offline:
        click.echo(offline_sql(url, names), nl=False)
        return
    provider = open_provider(url, table_name, schema, version_table)

    async def main() -> Upgrade:
        async with provider:
            return await upgrade_engine_report(provider.engine, provider.names)

    done = run(main)  # read under the migration lock: concurrent runs each say what they did
    table = f"{names.schema}.{names.table}" if names.schema else names.table
    if not done.table_existed:
        click.echo(f"created {table} at revision {done.revision} on {shown_url}")
    elif not done.changed:
        click.echo(f"{table} already at revision {done.revision} on {shown_url}")
    else:
        earlier = ", ".join(done.previous or ()) or "unknown"
        click.echo(f"migrated {table} from revision {earlier} to {done.revision} on {shown_url}")


@dataclasses.dataclass
class _Check:
    name: str
    ok: bool | None  # None: informational
    detail: str
    warning: bool = False  # informational, but worth a look (the local SQLite default is used)


def _quoted(names: Any, name: str) -> str:
    """``name`` (a table or sequence of ``names``) quoted for PostgreSQL, with its schema if any."""
    from sqlalchemy.dialects import postgresql

    quote = postgresql.dialect().identifier_preparer.quote_identifier  # type: ignore[no-untyped-call]
    return f"{quote(names.schema)}.{quote(name)}" if names.schema else quote(name)


# Each database's clock (epoch seconds) and version, and its name.
_CLOCKS = {
    "postgresql": (
        "SELECT extract(epoch FROM clock_timestamp())::float8, current_setting('server_version')",
        "PostgreSQL",
    ),
    "sqlite": ("SELECT (julianday('now') - 2440587.5) * 86400.0, sqlite_version()", "SQLite"),
    "mysql": ("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) / 1e6, VERSION()", "MySQL"),
}


async def _checks(provider: Any, url: str, names: Any) -> tuple[list[_Check], int]:
    """Each check of ``sql-lease check`` and the exit code (0, 69 or 78)."""
    import time

    import sqlalchemy as sa

    from ..sql.migrate import HEAD_REVISION, migrate_error, mysql_setup_problems, read_state
    from ..sql.urls import safe_url

    checks: list[_Check] = [_Check("url", None, describe_source(url), warning=uses_default())]
    postgres = provider.dialect_name == "postgresql"
    path = getattr(provider, "database_file", None)
    if path is not None and path.exists() and not path.is_file():  # said without a connect that must fail
        checks.append(_Check("database", False, f"the SQLite database {path} is not a file; fix the path in the URL"))
        return checks, EX_CONFIG
    try:
        async with provider.engine.connect() as conn:
            clock_sql, product = _CLOCKS[provider.dialect_name]
            before = time.time()
            row = (await conn.exec_driver_sql(clock_sql)).one()
            after = time.time()
            if provider.dialect_name == "mysql" and "mariadb" in str(row[1]).lower():
                product = "MariaDB"
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
            unreadable = None
            if postgres:
                unreadable = await _version_table_readable(conn, names, sa)
            elif provider.dialect_name == "mysql":
                unreadable = await _mysql_version_table_readable(conn, names)
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
                checks.append(await _grants(conn, names, sa))
            elif provider.dialect_name == "mysql" and table_exists:
                checks.append(await _mysql_grants(conn, names))
            if provider.dialect_name == "mysql":
                problems = await conn.run_sync(mysql_setup_problems, names)
                fit = "the session's sql_mode has STRICT_TRANS_TABLES; the lease tables found are InnoDB"
                checks.append(_Check("setup", not problems, "; ".join(problems) or fit))
            elif provider.dialect_name == "sqlite":
                checks.append(_sqlite_access(provider))
    except LeaseError as exc:
        checks.append(_Check("database", False, str(exc)))
        return checks, EX_CONFIG if isinstance(exc, (SchemaMissingError, LeaseConfigError)) else EX_UNAVAILABLE
    except Exception as exc:
        error = migrate_error(exc, provider.engine.url, "checking")  # one line, the driver's words
        checks.append(_Check("database", False, str(error)))
        return checks, EX_CONFIG if isinstance(error, (SchemaMissingError, LeaseConfigError)) else EX_UNAVAILABLE
    return checks, 0 if all(check.ok is not False for check in checks) else EX_CONFIG


async def _version_table_readable(conn: Any, names: Any, sa: Any) -> tuple[bool, str] | None:
    """None if this role may read the lease table's Alembic version table (or it is missing), else
    (does the lease table exist, why its revision cannot be checked): a least-privilege role has no
    SELECT on the version table."""
    version_table = _quoted(names, names.version_table)
    row = (
        await conn.execute(
            sa.text("SELECT to_regclass(:v) IS NULL OR has_table_privilege(:v, 'SELECT'), to_regclass(:t) IS NOT NULL"),
            {"v": version_table, "t": _quoted(names, names.table)},
        )
    ).one()
    if row[0]:
        return None
    where = "exists" if row[1] else "not found"
    return bool(row[1]), (
        f"lease table {names.table} {where}; its revision is unknown to this role (no SELECT on "
        f"{version_table}): run `sql-lease check` as the role that migrates to see it"
    )


async def _grants(conn: Any, names: Any, sa: Any) -> _Check:
    table, slots = _quoted(names, names.table), _quoted(names, names.slot_table)
    sequence = _quoted(names, names.fence_sequence)
    wanted = ("SELECT", "INSERT", "UPDATE", "DELETE")
    columns = ", ".join(f"has_table_privilege(:t, '{p}')" for p in wanted)
    slot_columns = ", ".join(
        f"CASE WHEN to_regclass(:l) IS NOT NULL THEN has_table_privilege(:l, '{p}') END" for p in wanted
    )
    functions = (
        f"{_quoted(names, names.slot_acquire_function)}(varchar, varchar, float8, json, int, boolean, text)",
        f"{_quoted(names, names.slot_release_function)}(varchar, varchar, bigint, float8, text)",
    )
    function_columns = ", ".join(
        f"CASE WHEN to_regprocedure(:f{i}) IS NOT NULL THEN has_function_privilege(:f{i}, 'EXECUTE') END"
        for i in range(len(functions))
    )
    row = (
        await conn.execute(
            sa.text(
                f"SELECT {columns}, CASE WHEN to_regclass(:s) IS NOT NULL THEN has_sequence_privilege(:s, 'USAGE') "
                f"END, current_user, {slot_columns}, {function_columns}"
            ),
            {"t": table, "s": sequence, "l": slots, **{f"f{i}": f for i, f in enumerate(functions)}},
        )
    ).one()
    missing = [f"{p} on {table}" for p, has in zip(wanted, row[:4], strict=True) if not has]
    if row[4] is None:  # checked, not raised: the sequence exists from the first revision on
        return _Check("privileges", False, f"the fence sequence {sequence} is missing: run `sql-lease migrate`")
    if not row[4]:
        missing.append(f"USAGE on sequence {sequence}")
    # the slot table of semaphores (revision 0006; a table before it is reported by the schema check)
    missing += [f"{p} on {slots}" for p, has in zip(wanted, row[6:10], strict=True) if has is False]
    missing += [f"EXECUTE on function {f}" for f, has in zip(functions, row[10:12], strict=True) if has is False]
    role = row[5]
    if not missing:
        return _Check(
            "privileges",
            True,
            f"role {role} has SELECT, INSERT, UPDATE, DELETE on {table} and {slots}, USAGE on {sequence} "
            "and EXECUTE on the slot functions",
        )
    return _Check(
        "privileges", False, f"role {role} lacks {'; '.join(missing)} (see the README's least-privilege GRANTs)"
    )


def _mysql_quoted(names: Any, name: str) -> str:
    """``name`` (a table of ``names``) quoted for MySQL, with its database (``schema``) if any."""
    from sqlalchemy.dialects import mysql

    quote = mysql.dialect().identifier_preparer.quote_identifier  # type: ignore[no-untyped-call]
    return f"{quote(names.schema)}.{quote(name)}" if names.schema else quote(name)


async def _mysql_version_table_readable(conn: Any, names: Any) -> tuple[bool, str] | None:
    """As :func:`_version_table_readable`, on MySQL: None if this user may read the version table
    (or it is missing), else (does the lease table exist, why its revision cannot be checked)."""
    from ..sql.migrate import mysql_denied

    version_table = _mysql_quoted(names, names.version_table)
    if not await conn.run_sync(mysql_denied, f"SELECT 1 FROM {version_table} WHERE 1 = 0"):
        return None  # readable, or missing (read_state says what is missing)
    found = await conn.exec_driver_sql(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) "
        "AND TABLE_NAME = %(table)s",
        {"schema": names.schema, "table": names.table},
    )
    exists = bool(found.scalar_one())
    return exists, (
        f"lease table {names.table} {'exists' if exists else 'not found'}; its revision is unknown to this user "
        f"(no SELECT on {version_table}): run `sql-lease check` as the user that migrates to see it"
    )


async def _mysql_grants(conn: Any, names: Any) -> _Check:
    """The privileges every lease operation needs on MySQL: on the lease table and the fence counter
    (``INSERT`` draws a fence, the sweeper's ``DELETE`` prunes it), each probed by ``EXPLAIN``."""
    table, counter = _mysql_quoted(names, names.table), _mysql_quoted(names, names.fence_counter)
    slots = _mysql_quoted(names, names.slot_table)
    probes = [
        ("SELECT", table, f"SELECT 1 FROM {table} WHERE 1 = 0"),
        ("INSERT", table, f"INSERT INTO {table} () VALUES ()"),
        ("UPDATE", table, f"UPDATE {table} SET fence = 0 WHERE 1 = 0"),
        ("DELETE", table, f"DELETE FROM {table} WHERE 1 = 0"),
        ("SELECT", counter, f"SELECT 1 FROM {counter} WHERE 1 = 0"),
        ("INSERT", counter, f"INSERT INTO {counter} () VALUES ()"),
        ("DELETE", counter, f"DELETE FROM {counter} WHERE 1 = 0"),
        ("SELECT", slots, f"SELECT 1 FROM {slots} WHERE 1 = 0"),
        ("INSERT", slots, f"INSERT INTO {slots} () VALUES ()"),
        ("UPDATE", slots, f"UPDATE {slots} SET fence = 0 WHERE 1 = 0"),
        ("DELETE", slots, f"DELETE FROM {slots} WHERE 1 = 0"),
    ]
    from ..sql.migrate import mysql_denied

    missing = [
        f"{privilege} on {on}" for privilege, on, explained in probes if await conn.run_sync(mysql_denied, explained)
    ]
    missing += [f"EXECUTE on procedure {name}" for name in await _mysql_procedures_not_executable(conn, names)]
    user = (await conn.exec_driver_sql("SELECT CURRENT_USER()")).scalar_one()
    if not missing:
        return _Check(
            "privileges",
            True,
            f"user {user} has SELECT, INSERT, UPDATE, DELETE on {table} and {slots}, SELECT, INSERT, DELETE "
            f"on {counter}, and EXECUTE on the slot procedures",
        )
    return _Check(
        "privileges", False, f"user {user} lacks {'; '.join(missing)} (see Operations: the least-privilege user)"
    )


async def _mysql_procedures_not_executable(conn: Any, names: Any) -> list[str]:
    """Migration 0009's slot procedures this user may not run: information_schema lists a procedure only to
    a user with a privilege on it (a table before 0009, without them, is reported by the schema check)."""
    wanted = [names.slot_acquire_function, names.slot_release_function]
    if not await _mysql_at_0009(conn, names):
        return []
    found = await conn.exec_driver_sql(
        "SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = COALESCE(%(schema)s, DATABASE()) "
        "AND ROUTINE_TYPE = 'PROCEDURE'",
        {"schema": names.schema},
    )
    visible = {row[0] for row in found}
    return [_mysql_quoted(names, name) for name in wanted if name not in visible]


async def _mysql_at_0009(conn: Any, names: Any) -> bool:
    """Whether the lease tables are at revision 0009 or later, as far as this user can tell (a user without
    SELECT on the version table: assumed so, the schema check says it cannot tell)."""
    from ..sql.migrate import mysql_denied

    version_table = _mysql_quoted(names, names.version_table)
    if await conn.run_sync(mysql_denied, f"SELECT 1 FROM {version_table} WHERE 1 = 0") is not False:
        return True
    versions = await conn.exec_driver_sql(f"SELECT version_num FROM {version_table}")
    return any(row[0] >= "0009" for row in versions)


def _sqlite_access(provider: Any) -> _Check:
    path = getattr(provider, "database_file", None)
    if path is None:
        return _Check("privileges", None, "no file to check (a uri=true SQLite URL)")
    if os.access(path, os.R_OK | os.W_OK) and os.access(path.parent, os.W_OK):
        return _Check("privileges", True, f"{path} and its directory are writable (WAL files live beside it)")
    return _Check("privileges", False, f"{path} or its directory is not writable by this user")


@click.command()
@url_option
@table_option
@schema_option
@click.option("--version-table", default=None, help="Alembic version table of sql_lease, if not the default.")
@json_option
def check(url: str, table_name: str, schema: str | None, version_table: str | None, as_json: bool) -> None:
    """Check the database answers, the schema is at head, and the role may use the lease table.

    First prints where the URL came from (--url, $SQL_LEASE_URL, a config file, or the local
    SQLite default: a warning naming the config files looked for). Also prints the offset between
    this machine's clock and the database's (informational: expiry is decided by the database's
    clock alone). Exit 0 all good, 78 a missing or old schema or a missing privilege (the message
    names the fix), 69 the database does not answer.
    """
    provider = open_provider(url, table_name, schema, version_table, announce=False)  # its url line says it

    async def main() -> tuple[list[_Check], int]:
        async with provider:
            return await _checks(provider, url, provider.names)

    checks, code = run(main)
    if as_json:
        print_json([dict(dataclasses.asdict(c), detail=as_given(c.detail)) for c in checks])
    else:
        for c in checks:
            mark = ("warn" if c.warning else "info") if c.ok is None else ("ok" if c.ok else "FAIL")
            click.echo(f"{mark:<5} {c.name:<11} {printable(as_given(c.detail))}")
    sys.exit(code)
