"""What both faces' NOTIFY wake-ups share, with no I/O: the waiters registered per key, and a
release waiter's state (its listener, key, event and acquire)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from ..contract import decode_key

__all__ = ["Acquire", "KeyedEvents", "ListenerBase", "ReleaseWaiterBase"]

R_co = TypeVar("R_co", covariant=True)


class Acquire(Protocol[R_co]):
    """A provider's acquire as a release waiter calls it (``R_co``: ``AcquireResult`` on the sync
    face, an awaitable of it on the async one); ``waiting=True`` flags a refused row so that its
    release sends NOTIFY; ``timeout_s``: the call's time limit in seconds (None: the provider's);
    ``limit``: the slots of a semaphore (1: a plain lease; a release of any slot wakes the waiter)."""

    def __call__(
        self,
        key: str,
        owner: str,
        ttl_ms: int | float,
        *,
        waiting: bool,
        data: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        limit: int = 1,
    ) -> R_co: ...


class _Event(Protocol):
    def set(self) -> None: ...


class _Listener(Protocol):
    @property
    def listening(self) -> bool: ...


E = TypeVar("E", bound=_Event)
L = TypeVar("L", bound=_Listener)
A = TypeVar("A")
O = TypeVar("O")  # noqa: E741


class KeyedEvents(Generic[E]):
    """The events of the waiters of each key (``asyncio.Event`` or ``threading.Event``); not
    thread-safe on its own (the sync listener holds its lock around each call)."""

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[str, set[E]] = {}

    def register(self, key: str, event: E) -> None:
        self._by_key.setdefault(key, set()).add(event)

    def unregister(self, key: str, event: E) -> None:
        events = self._by_key.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self._by_key[key]

    def of(self, key: str | None) -> list[E]:
        """The events of ``key``'s waiters; of every waiter when ``key`` is None."""
        if key is None:
            return [event for events in self._by_key.values() for event in events]
        return list(self._by_key.get(key, ()))

    def notified(self, payload: str) -> list[E]:
        """The events of the waiters of the key a NOTIFY names (its payload: the stored key)."""
        return self.of(decode_key(payload))


class ListenerBase(Generic[O, E]):
    """A provider's LISTEN holder as both faces make it: ``open_connection(timeout_s)`` (the
    executor's ``listen_connection``), the query that names the channel, whether the provider is
    closed, the operation timeout (seconds) that bounds the setup, the table (for logs), and the
    waiters' events by key. It knows no provider."""

    def __init__(
        self, open_connection: O, channel_query: str, is_closed: Callable[[], bool], timeout_s: float, table: str
    ) -> None:
        self._open_connection = open_connection
        self._channel_query = channel_query
        self._is_closed = is_closed
        self._timeout_s = timeout_s
        self._table = table
        self._waiters: KeyedEvents[E] = KeyedEvents()


class ReleaseWaiterBase(Generic[L, E, A]):
    """One waiter on one key: its listener, its event (set on NOTIFY), and the provider's acquire
    (``waiting=True`` flags a refused row so its release sends NOTIFY)."""

    def __init__(self, listener: L, key: str, acquire: A, event: E) -> None:
        self._listener = listener
        self._acquire = acquire
        self._event = event
        self.key = key

    @property
    def listening(self) -> bool:
        """True while NOTIFY wake-ups work; otherwise the caller polls."""
        return self._listener.listening
