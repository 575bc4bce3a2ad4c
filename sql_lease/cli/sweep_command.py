"""``sql-lease sweep``: delete expired leases in bounded batches."""

from __future__ import annotations

import click

from ..contract import validate_sweep
from ..holding import SWEEP_BATCH_SIZE
from .exits import fail
from .options import Duration, schema_option, table_option, url_option
from .runner import open_provider, run


@click.command()
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
    from ..holding import ExpirySweeper

    try:
        validate_sweep(batch_size, grace * 1000)
    except ValueError as exc:
        fail(2, f"--grace: {exc}")
    provider = open_provider(url, table_name, schema)

    async def main() -> int:
        async with provider:
            return await ExpirySweeper(provider, batch_size=batch_size, grace_ms=grace * 1000).sweep_once()

    removed = run(main)
    click.echo(f"removed {removed} expired lease(s)")
