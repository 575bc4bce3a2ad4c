"""Checks on the constructor arguments both SQL providers share (async and sync)."""

from __future__ import annotations

from typing import NamedTuple

MAX_SQLITE_BUSY_TIMEOUT_MS = 2**31 - 1  # SQLite's busy timeout is a C int: larger values wrap to 0


class ProviderOptions(NamedTuple):
    """The checked arguments: `operation_timeout_s` as a float, the others as given."""

    operation_timeout_s: float
    pool_size: int | None
    sqlite_busy_timeout_ms: int | None
    sqlite_synchronous: str


def validate_provider_options(
    operation_timeout_s: float, pool_size: int | None, sqlite_busy_timeout_ms: int | None, sqlite_synchronous: str
) -> ProviderOptions:
    """Check the arguments before any I/O: `TypeError` for a wrong type, `ValueError` out of range."""
    if isinstance(operation_timeout_s, bool) or not isinstance(operation_timeout_s, (int, float)):
        raise TypeError("operation_timeout_s must be a number of seconds")
    if not 0 < operation_timeout_s <= 86_400:
        raise ValueError(f"operation_timeout_s must be > 0 and at most 86400 seconds, got {operation_timeout_s!r}")
    if sqlite_synchronous not in ("FULL", "NORMAL", "EXTRA"):
        raise ValueError("sqlite_synchronous must be 'FULL', 'NORMAL' or 'EXTRA'")
    if pool_size is not None and (isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1):
        raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
    if sqlite_busy_timeout_ms is not None:
        if isinstance(sqlite_busy_timeout_ms, bool) or not isinstance(sqlite_busy_timeout_ms, (int, float)):
            kind = type(sqlite_busy_timeout_ms).__name__
            raise TypeError(f"sqlite_busy_timeout_ms must be a number of milliseconds, not {kind}")
        if not 0 <= sqlite_busy_timeout_ms <= MAX_SQLITE_BUSY_TIMEOUT_MS:
            raise ValueError(
                f"sqlite_busy_timeout_ms must be 0 to {MAX_SQLITE_BUSY_TIMEOUT_MS} milliseconds "
                f"(SQLite's limit, about 24.8 days), got {sqlite_busy_timeout_ms!r}"
            )
    return ProviderOptions(float(operation_timeout_s), pool_size, sqlite_busy_timeout_ms, sqlite_synchronous)
