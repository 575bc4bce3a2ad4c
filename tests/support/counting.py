"""Counting the statements a SQL provider sends, to assert that bad input sends none and that
waiters do not poll."""

from __future__ import annotations

from typing import Any


class StatementCounter:
    """Counts every statement ``provider`` runs from now on (zero for non-SQL providers)."""

    def __init__(self, provider: Any) -> None:
        self.count = 0
        driver = getattr(provider, "_driver", None)
        if driver is None:
            return
        for name in ("fetch_one", "fetch_all"):
            original = getattr(driver, name)

            async def counted(*args: Any, _original: Any = original) -> Any:
                self.count += 1
                return await _original(*args)

            setattr(driver, name, counted)
