"""``sql-lease status``, ``list`` and ``show``: reading leases."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from ..contract import validate_key
from .exits import EX_CONFIG, fail
from .options import DURATION, json_option, schema_option, table_option, url_option, validated
from .render import lease_cells, lease_json, print_json, printable, render_leases, rich_console
from .runner import lease_holders, open_provider, run


@click.command()
@click.argument("key")
@url_option
@table_option
@schema_option
def status(key: str, url: str, table_name: str, schema: str | None) -> None:
    """Show who holds KEY (exit 0), or that it is free (exit 1)."""
    provider = open_provider(url, table_name, schema)

    async def main() -> list[Any]:
        async with provider:
            return await lease_holders(provider, key)

    try:
        validate_key(key)
    except ValueError as exc:
        fail(EX_CONFIG, str(exc))
    holders = run(main)
    if not holders:
        click.echo(f"{printable(key)}: free")
        sys.exit(1)
    lease = holders[0]
    holder, until = printable(lease.owner), lease.expires_at.isoformat()
    more = (
        f" and {len(holders) - 1} more holder{'s' if len(holders) > 2 else ''} (a semaphore)"
        if len(holders) > 1
        else ""
    )
    if lease.released:  # by a minimum hold: nobody acquires it until then
        click.echo(f"{printable(key)}: released by {holder} (fence {lease.fence}), kept until {until}{more}")
    else:
        click.echo(f"{printable(key)}: held by {holder} (fence {lease.fence}) until {until}{more}")


_LIST_HELP = """List leases by key: key, owner, fence, time left and time held (both by the database's
    clock), expiry, data.

    A table on a terminal (rich, with `pip install 'sql-lease[cli]'`), plain aligned columns
    when piped; lease data is shown as compact JSON, cut at 60 characters. HELD FOR is blank for a
    lease taken before migration 0003 recorded tenure starts. A lease its owner released with a
    minimum hold shows "released, kept 12.0s" until it is free. A key held as a semaphore shows
    one row per holder, oldest tenure first (--limit counts rows). --json prints one JSON array
    of objects (key, owner, fence, expires_at, remaining_ms, expired, data, acquired_at, held_ms,
    released) on one line; with --watch, one such line per refresh.
    """


@click.command(name="list", help=_LIST_HELP)
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
    from ..contract import validate_list

    validated(lambda: validate_list(prefix, include_expired, limit))
    provider = open_provider(url, table_name, schema)
    console = None if as_json else rich_console()

    def show(leases: list[Any]) -> None:
        if len(leases) == limit:
            click.echo(f"sql-lease: showing the first {limit}; see more with --limit", err=True)
        if as_json:
            print_json([lease_json(lease) for lease in leases])
            return
        if watch is not None:
            if console is not None:
                console.clear()
            elif sys.stdout.isatty():
                click.echo("\x1b[H\x1b[2J", nl=False)
            else:
                click.echo("")
        if leases:
            render_leases(leases, console)
        else:
            click.echo("no leases" + (f" starting with '{printable(prefix)}'" if prefix else ""))

    async def main() -> None:
        async with provider:
            while True:
                show(await provider.list_leases(prefix, include_expired, limit))
                if watch is None:
                    return
                sys.stdout.flush()
                await asyncio.sleep(watch)

    run(main)


@click.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@json_option
def show(key: str, url: str, table_name: str, schema: str | None, as_json: bool) -> None:
    """Show the lease on KEY: owner, fence, expiry, data (exit 0), or that KEY is free (exit 1).

    A key held as a semaphore shows every holder, oldest tenure first. --json prints the holder
    with the oldest tenure as one object (null when free) whose "holders" lists every holder."""
    validated(lambda: validate_key(key))
    provider = open_provider(url, table_name, schema)

    async def main() -> list[Any]:
        async with provider:
            return await lease_holders(provider, key)

    holders = run(main)
    if as_json:
        print_json({**lease_json(holders[0]), "holders": [lease_json(h) for h in holders]} if holders else None)
    elif not holders:
        click.echo(f"{printable(key)}: free")
    else:
        if len(holders) > 1:
            click.echo(f"{printable(key)}: {len(holders)} holders (a semaphore), oldest tenure first")
        for number, lease in enumerate(holders):
            if number:
                click.echo("")
            for label, value in zip(
                ("key", "owner", "fence", "expires in", "held for", "expires at", "data"),
                lease_cells(lease),
                strict=True,
            ):
                click.echo(f"{label + ':':<12}{value}".rstrip())
    sys.exit(0 if holders else 1)
