"""A plan: one lease operation as a generator of statements, without I/O (:mod:`.operations` makes
them, :mod:`.transactional` for databases whose operations are transactions; the executors run
them)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple, TypeVar

__all__ = ["RENEW_BATCH_SIZE", "LockRetry", "Plan", "Query"]

T = TypeVar("T")

RENEW_BATCH_SIZE = 1000
"""At most this many leases are renewed by one ``renew_many`` statement; larger batches take several."""


class Query(NamedTuple):
    """One statement to run; ``many`` asks for every row instead of the first (or None).
    ``quick``: the statement waits only a moment for another writer's lock (SQLite, on a
    provider's own connections), then its lock error is raised into the plan. A named tuple: two
    are made per acquire/release cycle, and a frozen dataclass costs three times as much to make."""

    sql: str
    params: tuple[Any, ...]
    many: bool = False
    quick: bool = False


Plan = Generator[Query, Any, T]
LockRetry = Callable[[BaseException, Query], bool]
"""Whether a statement that raised may be sent again as it is (it wrote nothing): an executor's
rule for lock waits it bounds itself (:class:`.retry.SqliteLockWait`)."""
