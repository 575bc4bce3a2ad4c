"""Fork safety: a provider used before ``os.fork()`` (Celery's prefork pool, gunicorn ``--preload``,
multiprocessing's 'fork' start method) must not share its connections with the child.

Objects that hold connections, threads or locks register a reset with :func:`on_fork_in_child`; it
runs in the child right after the fork (``os.register_at_fork``), before anything else runs there,
and makes the object start afresh: new locks, no threads, no connections (new ones are opened on
first use). What belonged to the parent is handed to :func:`abandon`: kept referenced for the
child's whole life, never used and never closed, because closing a connection in the child would
end the parent's session (a PostgreSQL Terminate message on the shared socket) or drop the file
locks a SQLite connection relies on. Registrations are weak: they do not keep their objects alive.

Both faces can use it: the synchronous executors, watchdog and LISTEN listener register here;
:data:`generation` (incremented in every child) lets code check lazily instead.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["abandon", "generation", "on_fork_in_child"]

Owner = TypeVar("Owner")
log = logging.getLogger("sql_lease")

generation = 0  # how many forks lie between the first process and this one
_lock = threading.Lock()
_resets: weakref.WeakKeyDictionary[Any, list[Callable[[Any], None]]] = weakref.WeakKeyDictionary()
_abandoned: list[object] = []  # the parent's connections and pools, in a child: never closed there


def on_fork_in_child(owner: Owner, reset: Callable[[Owner], None]) -> None:
    """Call ``reset(owner)`` in every child forked from now on while ``owner`` is alive (weakly
    held: ``reset`` must not refer to ``owner`` itself; pass an unbound method)."""
    with _lock:
        _resets.setdefault(owner, []).append(reset)


def abandon(*objects: object) -> None:
    """Keep ``objects`` (the parent's connections, pools, threads' state) referenced for the life of
    this child process, so that they are neither used nor closed nor garbage-collected here."""
    _abandoned.extend(obj for obj in objects if obj is not None)


def _after_fork_in_child() -> None:
    global generation, _lock
    generation += 1
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork
    for owner, resets in list(_resets.items()):
        for reset in resets:
            try:
                reset(owner)
            except Exception:  # one broken reset must not stop the others, nor the child
                log.warning("resetting %r after a fork failed", type(owner).__name__, exc_info=True)


os.register_at_fork(after_in_child=_after_fork_in_child)
