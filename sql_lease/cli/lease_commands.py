"""``sql-lease acquire``, ``renew``, ``release``, ``transfer`` and ``break``: operating leases by hand.

Exit codes for scripts: 0 success; 1 nothing there (break: nothing to break); 2 bad arguments; 75
held by another / not ours (as exec's EX_TEMPFAIL); 69 database failure; 78 configuration (missing
table, refused role or privilege). Text from the database goes through ``printable()``; JSON is printed
with json.dumps' ASCII escapes."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from ..contract import validate_fence, validate_key, validate_min_hold_ms, validate_owner
from ..errors import LeaseNotAcquiredError
from ..holding.rules import limit_kw
from .exits import EX_TEMPFAIL, fail
from .options import (
    DURATION,
    checked_ttl_ms,
    data_option,
    json_option,
    limit_option,
    owner_required,
    parse_data,
    schema_option,
    table_option,
    ttl_option,
    url_option,
    validated,
)
from .render import describe_lease, expires_in, lease_json, print_json, printable
from .runner import is_embedded_sqlite, lease_holders, open_provider, run, slots_held


@click.command(name="break")
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
    left alone (exit 1, naming its holder). A semaphore key: every holder, each by its fence, each
    one broken named.
    """
    validated(lambda: validate_key(key))
    if fence is not None:
        validated(lambda: validate_fence(fence))
    if not yes and not sys.stdin.isatty():
        fail(2, f"refusing to break lease {printable(repr(key))} without --yes: stdin is not a terminal")
    provider = open_provider(url, table_name, schema)

    async def main() -> tuple[list[Any], bool, Any]:
        """(the leases broken, confirmed, the current lease when the tenure to break was not there)."""
        async with provider:
            if fence is None:
                holders = await lease_holders(provider, key)
                if len(holders) > 1:
                    return *(await _break_holders(provider, key, holders, yes)), None
            broken, confirmed, now = await _break_one(provider, key, fence, yes)
            return ([] if broken is None else [broken]), confirmed, now

    every, confirmed, now = run(main)
    broken = every[0] if every else None
    if as_json:
        holders = [lease_json(lease, read_row=False) for lease in every]
        print_json(None if broken is None else {**lease_json(broken, read_row=False), "holders": holders})
    if broken is None and now is not None:
        why = "changed hands" if fence is None else f"has no tenure with fence {fence}"
        fail(
            1,
            f"not broken: lease {printable(repr(key))} {why}: now held by {printable(now.owner)} "
            f"(fence {now.fence}), expires in {expires_in(now.remaining_ms)}",
        )
    if as_json:
        pass  # printed above
    elif len(every) > 1:
        named = ", ".join(
            f"{printable(lease.owner)} (fence {lease.fence}, {expires_in(lease.remaining_ms)} left)" for lease in every
        )
        click.echo(f"broke {printable(key)}, a semaphore: {len(every)} holders: {named}")
    elif broken is not None:
        left = expires_in(broken.remaining_ms)
        click.echo(
            f"broke {printable(broken.key)}: it was held by {printable(broken.owner)} "
            f"(fence {broken.fence}, {left} left)"
        )
    elif confirmed:
        click.echo(f"{printable(key)}: free, nothing to break")
    else:
        click.echo("not broken")
    sys.exit(0 if broken is not None else 1)


async def _break_holders(provider: Any, key: str, holders: list[Any], yes: bool) -> tuple[list[Any], bool]:
    """(every holder of a semaphore's key broken, each by its fence, so each one named was broken: a
    slot let go or granted meanwhile is neither broken nor named; confirmed), asking first on a terminal."""
    if not yes:
        for lease in holders:
            click.echo(describe_lease(lease))
        if not click.confirm(f"Break all {len(holders)}? Each loses its slot at its next renewal", default=False):
            return [], False
    broken = [await provider.break_lease(key, fence=lease.fence) for lease in holders]
    return [lease for lease in broken if lease is not None], True


async def _break_one(provider: Any, key: str, fence: int | None, yes: bool) -> tuple[Any, bool, Any]:
    """(the lease broken, confirmed, the current lease when the tenure to break was not there)."""
    expected = fence
    if not yes:
        holders = await lease_holders(provider, key)  # a semaphore's: the slot with that fence, if any
        if not holders:
            return None, True, None
        current = holders[0] if fence is None else next((h for h in holders if h.fence == fence), None)
        if current is None:
            return None, True, holders[0]
        click.echo(describe_lease(current))
        if not click.confirm("Break it? Its holder loses it at its next renewal", default=False):
            return None, False, None
        expected = current.fence  # the tenure shown, not whoever holds the key by now
    broken = await provider.break_lease(key, fence=expected)
    if broken is None and expected is not None:
        return None, True, await provider.get_lease(key)
    return broken, True, None


def _not_ours(key: str, owner: str, fence: int | None = None) -> NoReturn:
    tenure = "" if fence is None else f" with fence {fence}"
    fail(
        EX_TEMPFAIL,
        f"lease {printable(repr(key))} is not held by {printable(repr(owner))}{tenure} (expired, released, "
        "or held by another)",
    )


tenure_option = click.option(
    "--fence",
    type=int,
    default=None,
    help="Act only on the tenure with this fencing token (as acquire or show printed it): a later "
    "tenure of the same owner id is left alone (exit 75).",
)


def _checked_fence(fence: int | None) -> None:
    if fence is not None:
        validated(lambda: validate_fence(fence))


def _print_fence(lease: Any, as_json: bool, read_row: bool = False, **extra: Any) -> None:
    if as_json:
        print_json({**extra, **lease_json(lease, read_row)})
    else:
        click.echo(f"fence={lease.fence}")


@click.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@owner_required
@ttl_option
@data_option
@limit_option
@json_option
def acquire(
    key: str,
    url: str,
    table_name: str,
    schema: str | None,
    owner: str,
    ttl: float,
    data_json: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Acquire KEY for --owner; print its fence (exit 0), or exit 75 naming the holder.

    Re-acquiring a lease the same owner holds extends it and keeps the fence (and its data, unless
    --data replaces it). With --limit N, a slot of the semaphore KEY: granted while fewer than N
    other owners hold slots (exit 75 naming the oldest holder when all N are held). A sqlite://
    database gets its schema on first use, as with exec.
    """
    from ..contract import LeaseInfo

    validated(lambda: (validate_key(key), validate_owner(owner)))
    ttl_ms = checked_ttl_ms(ttl)
    data = parse_data(data_json)
    provider = open_provider(url, table_name, schema)

    async def main() -> tuple[Any, str]:
        async with provider:
            if is_embedded_sqlite(url):
                await provider.migrate()
            result = await provider.acquire_lease(key, owner, ttl_ms, data=data, **limit_kw(limit))
            return result, "" if result.acquired else await slots_held(provider, key, limit)

    result, slots = run(main)
    if result.acquired:
        _print_fence(
            LeaseInfo(key, owner, result.fence, result.expires_at, result.remaining_ms), as_json, acquired=True
        )
        return
    refusal = LeaseNotAcquiredError(key, result.owner, result.fence, result.expires_at)
    if as_json:
        print_json({"acquired": False, "key": key, "holder": result.owner, "fence": result.fence})
    fail(EX_TEMPFAIL, printable(refusal) + slots)


@click.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@owner_required
@ttl_option
@tenure_option
@json_option
def renew(
    key: str, url: str, table_name: str, schema: str | None, owner: str, ttl: float, fence: int | None, as_json: bool
) -> None:
    """Extend --owner's lease on KEY to now + --ttl; print its fence (exit 0), or exit 75 if it is
    not that owner's (expired, released, held by another, or with --fence another tenure)."""
    validated(lambda: (validate_key(key), validate_owner(owner)))
    _checked_fence(fence)
    ttl_ms = checked_ttl_ms(ttl)
    provider = open_provider(url, table_name, schema)

    async def main() -> Any:
        async with provider:
            return await provider.renew_lease_info(key, owner, ttl_ms, fence=fence)

    lease = run(main)
    if lease is None:
        _not_ours(key, owner, fence)
    _print_fence(lease, as_json, renewed=True)


@click.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@owner_required
@tenure_option
@click.option(
    "--min-hold",
    default=None,
    type=DURATION,
    help="Keep the lease (released) until this long after its tenure began, by the database's clock; "
    "free it at once if that has passed.",
)
@json_option
def release(
    key: str,
    url: str,
    table_name: str,
    schema: str | None,
    owner: str,
    fence: int | None,
    min_hold: float | None,
    as_json: bool,
) -> None:
    """Release --owner's lease on KEY (exit 0), or exit 75 if it is not that owner's (with --fence:
    not that tenure)."""
    validated(lambda: (validate_key(key), validate_owner(owner)))
    _checked_fence(fence)
    min_hold_ms = None if min_hold is None else min_hold * 1000
    if min_hold_ms is not None:
        validated(lambda: validate_min_hold_ms(min_hold_ms))
    provider = open_provider(url, table_name, schema)

    async def main() -> bool:
        async with provider:
            return bool(await provider.release_lease(key, owner, fence=fence, min_hold_ms=min_hold_ms))

    if not run(main):
        _not_ours(key, owner, fence)
    if as_json:
        print_json({"released": True, "key": key, "owner": owner})
    else:
        click.echo("released")


@click.command()
@click.argument("key")
@url_option
@table_option
@schema_option
@click.option("--from", "from_owner", required=True, help="The current owner.")
@click.option("--to", "to_owner", required=True, help="The next owner.")
@ttl_option
@data_option
@tenure_option
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
    fence: int | None,
    as_json: bool,
) -> None:
    """Hand KEY from --from to --to atomically (the key is never free in between); print the new
    fence (exit 0), or exit 75 if --from does not hold it (with --fence: that tenure). The next
    owner gets --data (none without it)."""
    validated(lambda: (validate_key(key), validate_owner(from_owner, "--from"), validate_owner(to_owner, "--to")))
    _checked_fence(fence)
    ttl_ms = checked_ttl_ms(ttl)
    data = parse_data(data_json)
    provider = open_provider(url, table_name, schema)

    async def main() -> tuple[bool, Any]:
        async with provider:
            moved = await provider.transfer_lease(key, from_owner, to_owner, ttl_ms, data=data, fence=fence)
            holders = {lease.owner: lease for lease in await provider.get_lease_holders(key)}
            return moved, holders

    moved, holders = run(main)
    if not moved and from_owner in holders and to_owner in holders and from_owner != to_owner:
        fail(EX_TEMPFAIL, f"{printable(repr(to_owner))} already holds a slot of semaphore {printable(repr(key))}")
    if not moved:
        _not_ours(key, from_owner, fence)
    lease = holders.get(to_owner)  # a semaphore's slot, or the plain lease
    if lease is None:  # released or lost in the instant since
        fail(
            EX_TEMPFAIL,
            f"lease {printable(repr(key))} was transferred but is no longer held by {printable(repr(to_owner))}",
        )
    _print_fence(lease, as_json, read_row=True, transferred=True)
