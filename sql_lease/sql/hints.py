"""A provider's memory of which keys are semaphores' (docs/statements.md, "Semaphore hints"): a hint that
picks which statement a release sends first, never an answer. No I/O, no lock (each step is one atomic
dict operation, and a step lost to a race only costs a round trip), so a forked child may keep it."""

from __future__ import annotations

__all__ = ["SEMAPHORE_KEYS_REMEMBERED", "SemaphoreKeys"]

SEMAPHORE_KEYS_REMEMBERED = 4096
"""How many keys :class:`SemaphoreKeys` remembers by default; the least recently remembered go first."""


class SemaphoreKeys:
    """The stored keys a provider was last granted a slot of, or found a semaphore's head for, the
    ``capacity`` most recent ones. ``key in hints`` is a guess: the plans ask the database either way."""

    __slots__ = ("_keys", "capacity")

    def __init__(self, capacity: int = SEMAPHORE_KEYS_REMEMBERED) -> None:
        self.capacity = capacity
        self._keys: dict[str, None] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def remember(self, key: str) -> None:
        """Note ``key`` as a semaphore's, the most recent; the oldest beyond ``capacity`` are dropped."""
        keys = self._keys
        keys.pop(key, None)
        keys[key] = None
        while len(keys) > self.capacity:
            try:
                del keys[next(iter(keys))]
            except (KeyError, RuntimeError, StopIteration):  # another thread changed it meanwhile
                break

    def forget(self, key: str) -> None:
        """Note that ``key`` turned out not to be a semaphore's."""
        self._keys.pop(key, None)
