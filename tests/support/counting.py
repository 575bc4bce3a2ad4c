"""Counting the statements a SQL provider sends, to assert that bad input sends none and that
waiters do not poll."""

from __future__ import annotations

from typing import Any


class StatementCounter:
    """Counts every statement ``provider`` runs from now on (zero for non-SQL providers), through
    the provider's public ``on_statement`` hook."""

    def __init__(self, provider: Any) -> None:
        self.count = 0
        hook = getattr(provider, "on_statement", None)
        if hook is not None:
            hook(self._count)

    def _count(self, sql: str, params: tuple[Any, ...]) -> None:
        self.count += 1
