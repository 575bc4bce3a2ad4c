"""``@leased``: run a job at most once at a time across the fleet (sync and async functions).

::

    leases = SyncSqlLeaseProvider(os.environ["DATABASE_URL"])

    @leased(leases, "nightly-report", ttl_ms=60_000)           # another worker has it: skipped
    def nightly_report(fence: int) -> None:
        ...

    @leased(leases, lambda tenant_id: f"sync:{tenant_id}", on_conflict="wait", timeout_s=30)
    def sync_tenant(tenant_id: str, lease: SyncHeldLease) -> None:
        ...

The lease is held, with renewal, for the duration of each call: through
:func:`sql_lease.sync_holding.hold` for plain functions (a sync provider), through
:func:`sql_lease.holding.hold` for ``async def`` functions (an async provider).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, Literal, Never, ParamSpec, Protocol, TypeVar, overload

from .contract import LeaseProvider, encode_data, is_lease_provider, validate_key, validate_owner
from .errors import LeaseNotAcquiredError
from .holding.rules import validate_hold_limit, validate_hold_options, validate_min_hold, validate_wait

if TYPE_CHECKING:
    from .contract import SyncLeaseProvider
    from .holding.aio import HeldLease
    from .holding.threads import SyncHeldLease

__all__ = ["leased"]

log = logging.getLogger("sql_lease")

OnConflict = Literal["skip", "wait", "raise"]
F = TypeVar("F", bound=Callable[..., Any])
_INJECTED = ("lease", "fence")

# -- static types: what @leased makes of a function -------------------------------------------------
# The wrapper keeps the function's signature (ParamSpec) and returns what it returns, or None when
# a call may be skipped (on_conflict="skip": _Skip is None; else Never, so ``R | _Skip`` is R); an
# async function stays a coroutine function. A function taking ``lease`` and/or ``fence`` (which
# @leased passes in) after at most two positional parameters is seen without them (their types
# kept, their names not: a type checker cannot drop a parameter by name); one taking them first,
# or after more parameters, keeps its full signature: put lease/fence last.

P = ParamSpec("P")
R = TypeVar("R")
A1 = TypeVar("A1")
A2 = TypeVar("A2")
_R_co = TypeVar("_R_co", covariant=True)
_A1_contra = TypeVar("_A1_contra", contravariant=True)
_A2_contra = TypeVar("_A2_contra", contravariant=True)
_L_contra = TypeVar("_L_contra", contravariant=True)
_Skip_co = TypeVar("_Skip_co", covariant=True)


class _Lease0(Protocol[_L_contra, _R_co]):
    def __call__(self, *, lease: _L_contra) -> _R_co: ...


class _Fence0(Protocol[_R_co]):
    def __call__(self, *, fence: int) -> _R_co: ...


class _Both0(Protocol[_L_contra, _R_co]):
    def __call__(self, *, lease: _L_contra, fence: int) -> _R_co: ...


class _Lease1(Protocol[_A1_contra, _L_contra, _R_co]):
    def __call__(self, a1: _A1_contra, /, *, lease: _L_contra) -> _R_co: ...


class _Fence1(Protocol[_A1_contra, _R_co]):
    def __call__(self, a1: _A1_contra, /, *, fence: int) -> _R_co: ...


class _Both1(Protocol[_A1_contra, _L_contra, _R_co]):
    def __call__(self, a1: _A1_contra, /, *, lease: _L_contra, fence: int) -> _R_co: ...


class _Lease2(Protocol[_A1_contra, _A2_contra, _L_contra, _R_co]):
    def __call__(self, a1: _A1_contra, a2: _A2_contra, /, *, lease: _L_contra) -> _R_co: ...


class _Fence2(Protocol[_A1_contra, _A2_contra, _R_co]):
    def __call__(self, a1: _A1_contra, a2: _A2_contra, /, *, fence: int) -> _R_co: ...


class _Both2(Protocol[_A1_contra, _A2_contra, _L_contra, _R_co]):
    def __call__(self, a1: _A1_contra, a2: _A2_contra, /, *, lease: _L_contra, fence: int) -> _R_co: ...


_T_co = TypeVar("_T_co", covariant=True)


class _Called1(Protocol[_A1_contra, _T_co]):
    """A function of one argument that @leased gave its lease or fence, called positionally or by
    keyword (a type checker cannot know the parameter's name: the value's type is checked)."""

    @overload
    def __call__(self, a1: _A1_contra, /) -> _T_co: ...
    @overload
    def __call__(self, **kwargs: _A1_contra) -> _T_co: ...


class _Called2(Protocol[_A1_contra, _A2_contra, _T_co]):
    """As :class:`_Called1`, for a function of two arguments."""

    @overload
    def __call__(self, a1: _A1_contra, a2: _A2_contra, /) -> _T_co: ...
    @overload
    def __call__(self, a1: _A1_contra, /, **kwargs: _A2_contra) -> _T_co: ...
    @overload
    def __call__(self, **kwargs: _A1_contra | _A2_contra) -> _T_co: ...


class _SyncLeasing(Protocol, Generic[_Skip_co]):
    """What ``leased(sync_provider, ...)`` returns: a decorator of plain functions."""

    @overload
    def __call__(self, func: _Both0[SyncHeldLease, R]) -> Callable[[], R | _Skip_co]: ...
    @overload
    def __call__(self, func: _Lease0[SyncHeldLease, R]) -> Callable[[], R | _Skip_co]: ...
    @overload
    def __call__(self, func: _Fence0[R]) -> Callable[[], R | _Skip_co]: ...
    @overload
    def __call__(self, func: _Both1[A1, SyncHeldLease, R]) -> _Called1[A1, R | _Skip_co]: ...
    @overload
    def __call__(self, func: _Lease1[A1, SyncHeldLease, R]) -> _Called1[A1, R | _Skip_co]: ...
    @overload
    def __call__(self, func: _Fence1[A1, R]) -> _Called1[A1, R | _Skip_co]: ...
    @overload
    def __call__(self, func: _Both2[A1, A2, SyncHeldLease, R]) -> _Called2[A1, A2, R | _Skip_co]: ...
    @overload
    def __call__(self, func: _Lease2[A1, A2, SyncHeldLease, R]) -> _Called2[A1, A2, R | _Skip_co]: ...
    @overload
    def __call__(self, func: _Fence2[A1, A2, R]) -> _Called2[A1, A2, R | _Skip_co]: ...
    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, R | _Skip_co]: ...


_Co = Coroutine[Any, Any, R]


class _AsyncLeasing(Protocol, Generic[_Skip_co]):
    """What ``leased(async_provider, ...)`` returns: a decorator of ``async def`` functions."""

    @overload
    def __call__(self, func: _Both0[HeldLease, _Co[R]]) -> Callable[[], _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: _Lease0[HeldLease, _Co[R]]) -> Callable[[], _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: _Fence0[_Co[R]]) -> Callable[[], _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: _Both1[A1, HeldLease, _Co[R]]) -> _Called1[A1, _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: _Lease1[A1, HeldLease, _Co[R]]) -> _Called1[A1, _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: _Fence1[A1, _Co[R]]) -> _Called1[A1, _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: _Both2[A1, A2, HeldLease, _Co[R]]) -> _Called2[A1, A2, _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: _Lease2[A1, A2, HeldLease, _Co[R]]) -> _Called2[A1, A2, _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: _Fence2[A1, A2, _Co[R]]) -> _Called2[A1, A2, _Co[R | _Skip_co]]: ...
    @overload
    def __call__(self, func: Callable[P, _Co[R]]) -> Callable[P, _Co[R | _Skip_co]]: ...


@overload
def leased(
    provider: SyncLeaseProvider,
    key: str | Callable[..., str],
    *,
    ttl_ms: int | float = ...,
    on_conflict: Literal["skip"] = ...,
    timeout_s: float | None = ...,
    owner: str | None = ...,
    renew_every_ms: int | float | None = ...,
    data: dict[str, Any] | None = ...,
    min_hold_ms: int | float | None = ...,
    limit: int = ...,
) -> _SyncLeasing[None]: ...
@overload
def leased(
    provider: SyncLeaseProvider,
    key: str | Callable[..., str],
    *,
    ttl_ms: int | float = ...,
    on_conflict: Literal["wait", "raise"],
    timeout_s: float | None = ...,
    owner: str | None = ...,
    renew_every_ms: int | float | None = ...,
    data: dict[str, Any] | None = ...,
    min_hold_ms: int | float | None = ...,
    limit: int = ...,
) -> _SyncLeasing[Never]: ...
@overload
def leased(
    provider: LeaseProvider,
    key: str | Callable[..., str],
    *,
    ttl_ms: int | float = ...,
    on_conflict: Literal["skip"] = ...,
    timeout_s: float | None = ...,
    owner: str | None = ...,
    renew_every_ms: int | float | None = ...,
    data: dict[str, Any] | None = ...,
    min_hold_ms: int | float | None = ...,
    limit: int = ...,
) -> _AsyncLeasing[None]: ...
@overload
def leased(
    provider: LeaseProvider,
    key: str | Callable[..., str],
    *,
    ttl_ms: int | float = ...,
    on_conflict: Literal["wait", "raise"],
    timeout_s: float | None = ...,
    owner: str | None = ...,
    renew_every_ms: int | float | None = ...,
    data: dict[str, Any] | None = ...,
    min_hold_ms: int | float | None = ...,
    limit: int = ...,
) -> _AsyncLeasing[Never]: ...


def leased(
    provider: Any,
    key: str | Callable[..., str],
    *,
    ttl_ms: int | float = 15_000,
    on_conflict: OnConflict = "skip",
    timeout_s: float | None = None,
    owner: str | None = None,
    renew_every_ms: int | float | None = None,
    data: dict[str, Any] | None = None,
    min_hold_ms: int | float | None = None,
    limit: int = 1,
) -> Any:
    """Decorate a function so that each call holds the lease ``key`` (renewed in the background)
    while it runs, and never runs while another owner holds it.

    Args:
        provider: a sync provider (``SyncSqlLeaseProvider``, ``SyncInMemoryLeaseProvider``) for a
            plain function, an async one (``SqlLeaseProvider``, ``InMemoryLeaseProvider``) for an
            ``async def`` function; a mismatch is a ``TypeError`` when decorating.
        key: the lease key, or a function of the call's arguments that returns it (called with
            the same positional and keyword arguments as the decorated function).
        ttl_ms: the lease TTL in milliseconds (default 15 s), renewed every ``renew_every_ms``
            (default TTL/3).
        on_conflict: what a call does while another owner holds the key: ``"skip"`` (default)
            returns None without running and logs the holder at INFO on the ``sql_lease`` logger;
            ``"wait"`` waits for the key, up to ``timeout_s`` seconds (None: no limit), then raises
            ``LeaseNotAcquiredError``; ``"raise"`` raises ``LeaseNotAcquiredError`` at once.
        timeout_s: with ``"wait"``, the longest wait in seconds.
        owner: the owner id of every call; default: a fresh unique id per call (``host:pid:random``).
            Calls with a fixed owner still never run at once: an acquire by the current owner
            succeeds, so each call takes the key under a fresh id (refused, or waiting, while
            anyone holds it, that owner included), then transfers it to ``owner`` (atomic: the key
            is never free in between; the fence grows), as ``sql-lease exec --owner`` does. That
            costs two statements more per call.
        data: lease data stored with every call's lease (a ``dict``, see ``LeaseProvider``); checked
            when decorating, passed to the provider only when given.
        min_hold_ms: at most one run per period: each call's release keeps the lease (marked
            released) until ``min_hold_ms`` milliseconds after the call's tenure began, by the
            provider's clock, so a call on another host in that time is skipped (or waits). Checked
            when decorating (``TypeError`` also for a provider without ``accepts_fence``).
        limit: at most ``limit`` calls at once across every process (a semaphore: each call holds
            one of ``limit`` slots of ``key``; default 1, a plain lease). Checked when decorating
            (``TypeError``/``ValueError``; ``TypeError`` also for ``limit`` > 1 with a provider
            without ``accepts_limit``). With a fixed ``owner`` the owner is one holder: a call
            while another call of that owner holds a slot raises ``LeaseNotAcquiredError`` (or is
            skipped), whatever ``on_conflict`` says.

    If the function has a parameter named ``lease``, it receives the held lease
    (``SyncHeldLease``/``HeldLease``: ``fence``, ``lost``, ``valid``, ``check()``, ``transfer_to``);
    a parameter named ``fence`` receives the fencing token (an ``int``). Callers do not pass them.
    A lease lost during the call raises ``LeaseLostError`` (an async body is cancelled; a plain
    one finds out from ``lease.check()`` or when it returns).

    Types: the decorated function keeps its signature, less ``lease`` and ``fence`` (seen when they
    follow at most two positional parameters), and returns ``R`` (``R | None`` with ``"skip"``);
    an ``async def`` function stays one.
    """
    validate_hold_limit(provider, limit)
    if on_conflict not in ("skip", "wait", "raise"):
        raise ValueError(f"on_conflict must be 'skip', 'wait' or 'raise', not {on_conflict!r}")
    if not is_lease_provider(provider):
        raise TypeError(f"{type(provider).__name__} is not a lease provider (it lacks the five lease methods)")
    if isinstance(key, str):
        validate_key(key)
    elif not callable(key):
        raise TypeError(f"key must be a str or a function of the call's arguments, not {type(key).__name__}")
    if owner is not None:
        validate_owner(owner)
    validate_hold_options(ttl_ms, renew_every_ms, timeout_s)
    validate_wait(on_conflict == "wait", timeout_s, "on_conflict='wait'")
    encode_data(data)
    validate_min_hold(provider, min_hold_ms)
    provider_is_async = inspect.iscoroutinefunction(provider.acquire_lease)
    options: dict[str, Any] = {
        "renew_every_ms": renew_every_ms,
        "wait": on_conflict == "wait",
        "timeout_s": timeout_s if on_conflict == "wait" else None,
    }
    if data is not None:
        options["data"] = data
    if limit != 1:
        options["limit"] = limit
    # The hold the body runs in releases with the minimum hold; a claim handed on to the fixed
    # owner never ran it.
    running = options if min_hold_ms is None else {**options, "min_hold_ms": min_hold_ms}
    claiming = options if owner is not None else running
    # The hold under the fixed owner, once the key is ours: nothing to wait for.
    handed_on = {**running, "wait": False, "timeout_s": None}

    def key_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return key if isinstance(key, str) else key(*args, **kwargs)

    def decorate(func: F) -> F:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError("@leased holds the lease for a call; it cannot decorate a generator function")
        signature = inspect.signature(func)
        wants = [name for name in _INJECTED if name in signature.parameters]

        def inject(kwargs: dict[str, Any], lease: Any) -> dict[str, Any]:
            for name in wants:
                if name in kwargs:
                    raise TypeError(f"{func.__qualname__}() gets {name!r} from @leased; do not pass it")
                kwargs[name] = lease if name == "lease" else lease.fence
            return kwargs

        def skipped(exc: LeaseNotAcquiredError) -> None:
            log.info(
                "%s skipped: lease %r is held by %r (fence %s) until %s",
                func.__qualname__,
                exc.key,
                exc.holder,
                exc.fence,
                exc.expires_at.isoformat() if exc.expires_at else "unknown",
            )

        wrapper: Any
        if inspect.iscoroutinefunction(func):
            if not provider_is_async:
                raise TypeError(
                    f"{func.__qualname__} is async: give @leased an async provider (SqlLeaseProvider, "
                    f"InMemoryLeaseProvider), not {type(provider).__name__}"
                )
            from .holding.aio import hold as async_hold

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                lease_key = key_for(args, kwargs)
                async with contextlib.AsyncExitStack() as stack:
                    try:
                        # A fresh id: exclusive even against a call of the fixed owner.
                        lease = await stack.enter_async_context(
                            async_hold(provider, lease_key, None, ttl_ms, **claiming)
                        )
                        if owner is not None:
                            if not await lease.transfer_to(owner, ttl_ms, data=data) or lease.handoff is None:
                                raise LeaseNotAcquiredError(lease_key, None)  # expired meanwhile: TTL too short
                            # The tenure just handed on, not a second acquire (the owner's would succeed).
                            lease = await stack.enter_async_context(
                                async_hold(provider, lease_key, owner, ttl_ms, **handed_on).adopting(lease.handoff)
                            )
                    except LeaseNotAcquiredError as exc:
                        if on_conflict != "skip":
                            raise
                        skipped(exc)
                        return None
                    return await func(*args, **inject(kwargs, lease))

            wrapper = async_wrapper
        else:
            if provider_is_async:
                raise TypeError(
                    f"{func.__qualname__} is not async: give @leased a sync provider (SyncSqlLeaseProvider, "
                    f"SyncInMemoryLeaseProvider), not {type(provider).__name__}"
                )
            from .holding.threads import hold as sync_hold

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                lease_key = key_for(args, kwargs)
                with contextlib.ExitStack() as stack:
                    try:
                        # A fresh id: exclusive even against a call of the fixed owner.
                        lease = stack.enter_context(sync_hold(provider, lease_key, None, ttl_ms, **claiming))
                        if owner is not None:
                            if not lease.transfer_to(owner, ttl_ms, data=data) or lease.handoff is None:
                                raise LeaseNotAcquiredError(lease_key, None)  # expired meanwhile: TTL too short
                            # The tenure just handed on, not a second acquire (the owner's would succeed).
                            handed = sync_hold(provider, lease_key, owner, ttl_ms, **handed_on)
                            lease = stack.enter_context(handed.adopting(lease.handoff))
                    except LeaseNotAcquiredError as exc:
                        if on_conflict != "skip":
                            raise
                        skipped(exc)
                        return None
                    return func(*args, **inject(kwargs, lease))

            wrapper = sync_wrapper
        # The caller's view: without the parameters @leased fills in.
        wrapper.__signature__ = signature.replace(
            parameters=[p for p in signature.parameters.values() if p.name not in _INJECTED]
        )
        return wrapper  # type: ignore[no-any-return]

    return decorate
