"""``ExpirySweeper``: deletes expired lease rows in the background, in bounded batches (asyncio)."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ..contract import validate_seconds, validate_sweep
from ..errors import LeaseError

__all__ = ["SWEEP_BATCH_SIZE", "ExpirySweeper", "SweepsExpired"]

log = logging.getLogger("sql_lease")


SWEEP_BATCH_SIZE = 500
"""Rows an ``ExpirySweeper`` (and ``sql-lease sweep``) deletes per statement by default
(docs/statements.md, "Sweeping")."""


class SweepsExpired(Protocol):
    """A provider an :class:`ExpirySweeper` can sweep: it has ``sweep_expired`` (the SQL and
    in-memory async providers do)."""

    async def sweep_expired(self, batch_size: int = ..., grace_ms: int | float = ...) -> int: ...


class ExpirySweeper:
    """Deletes expired lease rows in the background, in bounded batches.

    ``provider`` must have ``sweep_expired(batch_size, grace_ms)`` (the SQL and in-memory providers
    do). Every ``interval_s`` seconds it sweeps batches of at most ``batch_size`` rows until a batch
    comes back short, spending at most ``duty_cycle`` (a fraction, default 0.25) of the time on it
    (it pauses between batches; ``batch_size`` default 500). Rows are removed only ``grace_ms``
    milliseconds after they expired. Errors are logged and the next round tries again. Use as
    ``async with ExpirySweeper(provider):`` or ``start()``/``await stop()``.
    """

    def __init__(
        self,
        provider: SweepsExpired,
        interval_s: float = 60.0,
        batch_size: int = SWEEP_BATCH_SIZE,
        grace_ms: int | float = 0,
        duty_cycle: float = 0.25,
    ) -> None:
        if not callable(getattr(provider, "sweep_expired", None)):
            raise TypeError(f"{type(provider).__name__} has no sweep_expired(); it cannot be swept")
        self.interval_s = validate_seconds(interval_s, "interval_s")
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        self.batch_size, self.grace_ms = validate_sweep(batch_size, grace_ms)
        if isinstance(duty_cycle, bool) or not isinstance(duty_cycle, (int, float)) or not 0 < duty_cycle <= 1:
            raise ValueError(f"duty_cycle must be a number in (0, 1], got {duty_cycle!r}")
        self.duty_cycle = float(duty_cycle)
        self.provider = provider
        self.swept_total = 0
        self._task: asyncio.Task[None] | None = None

    async def sweep_once(self) -> int:
        """Sweep batches until one comes back short; the number of rows removed.

        Between full batches it pauses so that sweeping takes at most ``duty_cycle`` of the time
        (default a quarter, in batches of 500): a backlog of a million rows never crowds out the
        acquires running beside it (docs/statements.md, "Sweeping").
        """
        removed = 0
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            batch: int = await self.provider.sweep_expired(batch_size=self.batch_size, grace_ms=self.grace_ms)
            removed += batch
            self.swept_total += batch
            if batch < self.batch_size:
                return removed
            await asyncio.sleep((loop.time() - started) * (1 / self.duty_cycle - 1))

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except LeaseError as exc:
                log.warning("sweeping expired leases failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sql_lease sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # the caller's own cancellation, if any, goes on from here

    async def __aenter__(self) -> ExpirySweeper:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
