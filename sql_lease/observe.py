"""Observers: what the library reports about its operations, for metrics and tracing.

Every lease operation of the SQL providers passes through one place per face (the providers'
``_run``), and ``hold()`` reports losses and renewal failures. With no observer registered (the
default) the only cost is one check of an empty tuple per operation; with one, each operation
builds one :class:`OperationEvent` and hands it to every observer, in the thread or task that ran
the operation. The Prometheus and OpenTelemetry exporters (:mod:`sql_lease.metrics`) are
observers; write your own by subclassing :class:`LeaseObserver`::

    class Slow(LeaseObserver):
        def on_operation(self, event: OperationEvent) -> None:
            if event.duration_s > 0.5:
                print(event.operation, event.key, event.outcome)

    remove = add_observer(Slow())

Observers are process-wide (as metrics registries are): ``hold()`` serves any provider, the
held-lease count is a property of the process, and one registration covers every provider, sync
and async. An observer that raises never breaks the operation: its first exception is logged
(ERROR, logger ``sql_lease``), later ones are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HoldEvent",
    "LeaseObserver",
    "OperationEvent",
    "add_observer",
    "count_held_with",
    "held_leases",
    "observers",
]

log = logging.getLogger("sql_lease")


@dataclass(frozen=True, slots=True)
class OperationEvent:
    """One lease operation that ran (arguments valid), reported after it ended.

    Attributes:
        operation: ``acquire``, ``get_owner``, ``get_lease``, ``release``, ``renew``,
            ``renew_many`` (``hold()``'s batched renewals), ``transfer``, ``sweep``, ``list``, ``break``,
            or an all-or-nothing call on several keys: ``acquire_leases``, ``release_leases``,
            ``renew_leases``.
        outcome: ``acquired``/``refused`` (acquire), ``renewed``/``lost`` (renew; renew_many:
            ``renewed`` when it renewed at least one lease), ``released``/``not_held`` (release),
            ``transferred``/``refused`` (transfer), ``found``/``absent`` (get_owner, get_lease),
            ``broken``/``absent`` (break), ``swept``, ``listed``; ``acquired``/``refused``
            (acquire_leases), ``released``/``not_held`` (release_leases: at least one / none),
            ``renewed``/``lost`` (renew_leases: every key / not every key); ``error`` when it raised,
            ``cancelled`` when its task was cancelled.
        key: the lease key, None for operations on many keys (renew_many, the ``*_leases`` calls, sweep, list).
        duration_s: seconds from the start of the operation (after validation) to its end, by a
            monotonic clock; pool checkout and retries included.
        backend: ``postgresql`` or ``sqlite``.
        rows: rows swept (sweep), listed (list) or renewed (renew_many); the number of keys of an
            ``acquire_leases``/``renew_leases`` call, the leases released by ``release_leases``; else None.
        error: the exception the caller got (a ``LeaseError`` subclass: ``LeaseBackendError``,
            ``SchemaMissingError``, ...), original on ``__cause__``; None on success.
    """

    operation: str
    outcome: str
    key: str | None
    duration_s: float
    backend: str
    rows: int | None = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class HoldEvent:
    """Something that happened to a lease held by ``hold()`` (either face).

    Attributes:
        kind: ``lost`` (the lease was declared lost) or ``renewal_failed`` (a renewal raised or had
            no answer in time; it is retried until the lease's deadline).
        key, owner, fence: the lease.
        reason: ``refused`` (a renewal was refused: expired, broken or taken over) or ``expired``
            (no renewal succeeded in time) for ``lost``; for ``renewal_failed``, the exception's
            class name, or ``no_answer``.
        message: the full reason, as logged.
    """

    kind: str
    key: str
    owner: str
    fence: int | None
    reason: str
    message: str


class LeaseObserver:
    """Base class of observers: override what you need; every method is called synchronously in
    the thread or task that reported it, so it must be quick and must not block."""

    def on_operation(self, event: OperationEvent) -> None:
        """A lease operation ended (see :class:`OperationEvent`)."""

    def on_hold(self, event: HoldEvent) -> None:
        """A ``hold()`` lease was lost or failed a renewal (see :class:`HoldEvent`)."""


class _Registration:
    __slots__ = ("complained", "observer")

    def __init__(self, observer: LeaseObserver) -> None:
        self.observer = observer
        self.complained = False


observers: tuple[_Registration, ...] = ()
"""The registered observers; empty (the default) means nothing is measured or built."""

_lock = threading.Lock()


def add_observer(observer: LeaseObserver) -> Callable[[], None]:
    """Register ``observer`` (a :class:`LeaseObserver`) for every provider and ``hold()`` of this
    process; returns a function that removes it (calling it again does nothing). ``TypeError`` for
    anything that is not a ``LeaseObserver``."""
    global observers
    if not isinstance(observer, LeaseObserver):
        raise TypeError(f"observer must be a sql_lease.observe.LeaseObserver, not {type(observer).__name__}")
    registration = _Registration(observer)
    with _lock:
        observers = (*observers, registration)

    def remove() -> None:
        global observers
        with _lock:
            observers = tuple(r for r in observers if r is not registration)

    return remove


def _deliver(method: str, event: Any) -> None:
    for registration in observers:
        try:
            getattr(registration.observer, method)(event)
        except Exception:
            if not registration.complained:
                registration.complained = True
                log.exception("the observer %r raised; its later errors are not logged", registration.observer)


_KINDS = {"get owner of": "get_owner", "read": "get_lease"}

_OUTCOMES = {
    "acquire": ("acquired", "refused"),
    "renew": ("renewed", "lost"),
    "renew_many": ("renewed", "lost"),
    "release": ("released", "not_held"),
    "transfer": ("transferred", "refused"),
    "get_owner": ("found", "absent"),
    "get_lease": ("found", "absent"),
    "break": ("broken", "absent"),
    "sweep": ("swept", "swept"),
    "list": ("listed", "listed"),
    "acquire_leases": ("acquired", "refused"),
    "release_leases": ("released", "not_held"),
    "renew_leases": ("renewed", "lost"),
}


def _kind(operation: str, key: str | None) -> str:
    if operation == "renew" and key is None:
        return "renew_many"
    return _KINDS.get(operation, operation.replace(" ", "_"))


def operation_done(operation: str, key: str | None, backend: str, duration_s: float, result: object) -> None:
    """Report a successful operation (called by the providers' ``_run`` with the name it uses in
    messages; ``result``: what the operation returns)."""
    kind = _kind(operation, key)
    rows = result if type(result) is int else len(result) if isinstance(result, (list, dict)) else None
    if kind in ("acquire_leases", "renew_leases") and isinstance(result, list):
        success: object = all(result)
    else:
        success = getattr(result, "acquired", result)
    outcome = _OUTCOMES.get(kind, ("ok", "ok"))[0 if success else 1]
    _deliver("on_operation", OperationEvent(kind, outcome, key, duration_s, backend, rows))


def operation_failed(operation: str, key: str | None, backend: str, duration_s: float, error: BaseException) -> None:
    """Report an operation that raised ``error`` (or was cancelled)."""
    outcome = "cancelled" if isinstance(error, asyncio.CancelledError) else "error"
    _deliver("on_operation", OperationEvent(_kind(operation, key), outcome, key, duration_s, backend, None, error))


def lease_lost(lease: Any, reason: str) -> None:
    """Report that ``hold()`` declared ``lease`` (a held lease of either face) lost."""
    cause = "refused" if reason.startswith("renewal refused") else "expired"
    _deliver("on_hold", HoldEvent("lost", lease.key, lease.owner, lease.fence, cause, reason))


def renewal_failed(lease: Any, error: BaseException | None) -> None:
    """Report that a renewal of ``lease`` raised ``error`` (None: it had no answer in time)."""
    cause = "no_answer" if error is None else type(error).__name__
    message = "the database did not answer in time" if error is None else f"{type(error).__name__}: {error}"
    _deliver("on_hold", HoldEvent("renewal_failed", lease.key, lease.owner, lease.fence, cause, message))


_held_counts: list[Callable[[], int]] = []


def count_held_with(count: Callable[[], int]) -> None:
    """Register ``count``, a function returning how many leases one registry of ``hold()`` blocks
    holds now; :func:`held_leases` sums them. Each face of :mod:`sql_lease.holding` registers
    its own when imported (so this module reads no private state of the layer above it)."""
    with _lock:
        _held_counts.append(count)


def held_leases() -> int:
    """How many leases ``hold()`` blocks of this process hold now, both faces (nested holds of one
    owner and key count once; lost and transferred ones not at all). Read from the holds' own
    registries when asked (registered with :func:`count_held_with`), so holding costs nothing extra."""
    return sum(count() for count in tuple(_held_counts))
