"""Opening the provider a command names and running a command's coroutine: library errors to exit codes."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import LeaseBackendError, LeaseConfigError, LeaseError, SchemaMissingError
from .config import announce_default, from_config_file
from .exits import EX_CONFIG, EX_UNAVAILABLE, fail
from .render import printable

T = TypeVar("T")


def open_provider(
    url: str, table_name: str, schema: str | None, version_table: str | None = None, announce: bool = True
) -> Any:
    """The provider for the command's URL and table (exit 78 naming the problem if it cannot be
    made); ``announce``: say on stderr when the local SQLite default is used."""
    from ..sql.provider import SqlLeaseProvider

    if announce:
        announce_default()
    try:
        return SqlLeaseProvider(url, table_name=table_name, schema=schema, version_table=version_table)
    except (TypeError, ValueError, LeaseConfigError) as exc:  # LeaseConfigError: a driver not installed
        fail(EX_CONFIG, str(exc) + from_config_file())


async def lease_holders(provider: Any, key: str) -> list[Any]:
    """Every holder of ``key`` (``get_lease_holders``), or the lease of a provider without it."""
    reader = getattr(provider, "get_lease_holders", None)
    if callable(reader):
        return list(await reader(key))
    lease = await provider.get_lease(key)
    return [] if lease is None else [lease]


NAMED_HOLDERS = 10  # a refusal names at most this many slot holders


async def slots_held(provider: Any, key: str, limit: int) -> str:
    """For a refused acquire of ``--limit N``: "; K of N slots held: 'a', 'b'" as the database has
    them now; of a plain one (N = 1) refused by several slots, that the key is a semaphore; of N > 1
    refused by one holder, that it is a plain lease. Empty otherwise, or if they cannot be read (the
    refusal itself is what matters)."""
    try:
        holders = await lease_holders(provider, key)
    except Exception:
        return ""
    named = ", ".join(printable(repr(lease.owner)) for lease in holders[:NAMED_HOLDERS])
    named += f" and {len(holders) - NAMED_HOLDERS} more" if len(holders) > NAMED_HOLDERS else ""
    if limit == 1:
        if len(holders) < 2:  # a plain lease, or a lone slot
            return ""
        free = "without --limit the key is free only when no slot is held"
        return f"; held as a semaphore: {len(holders)} slots held: {named} ({free})"
    if len(holders) < limit:  # not refused for want of a slot (or slots were freed since)
        return "; a plain lease holds the key: no slot is free until it ends" if len(holders) == 1 else ""
    return f"; {len(holders)} of {limit} slots held: {named}"


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` and turn the library's errors into messages and exit codes."""
    try:
        return asyncio.run(main())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)
    except (SchemaMissingError, LeaseConfigError) as exc:
        fail(EX_CONFIG, str(exc))
    except LeaseBackendError as exc:
        fail(EX_UNAVAILABLE, str(exc))
    except LeaseError as exc:
        fail(EX_UNAVAILABLE, str(exc))


def is_embedded_sqlite(url: str) -> bool:
    return url.startswith("sqlite")
