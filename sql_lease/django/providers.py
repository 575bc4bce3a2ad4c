"""``provider(using)``: a ``SyncSqlLeaseProvider`` for a Django database alias, bound at first use."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from ..errors import ProviderClosedError
from ..sql.setup import SyncProviderOptions, checked_sync_options
from ..sql.sync_provider import SyncSqlLeaseProvider

if TYPE_CHECKING:
    from typing import Unpack

__all__ = ["DjangoSqlLeaseProvider", "provider"]


# -- a provider bound to a database alias, at first use ------------------------------------------


def _is_memory_name(name: object) -> bool:
    """True for the names Django's SQLite backend opens in memory (``:memory:``, ``file:...mode=memory``)."""
    return not isinstance(name, PurePath) and (name == ":memory:" or "mode=memory" in str(name))


def _current_name(using: str) -> Any:
    """``NAME`` of the alias now, or None when Django's settings are not ready or lack the alias."""
    try:
        from django.db import connections  # type: ignore[import-not-found,import-untyped,unused-ignore]

        return connections[using].settings_dict.get("NAME") if using in connections else None
    except Exception:  # settings not configured yet: the first use decides alone
        return None


class DjangoSqlLeaseProvider(SyncSqlLeaseProvider):
    """A :class:`~sql_lease.SyncSqlLeaseProvider` for ``DATABASES[using]``, bound at first use: made
    by :func:`provider`. See there."""

    def __init__(self, using: str = "default", **options: Unpack[SyncProviderOptions]) -> None:
        if not isinstance(using, str):
            raise TypeError(f"using must be a database alias (str), not {type(using).__name__}")
        # Checked now, before any SQL; the rest waits for the first use.
        self.names, checked = checked_sync_options(options)
        self.operation_timeout_s = checked.operation_timeout_s
        self.using = using
        self.safe_url = f"DATABASES[{using!r}]"  # until bound
        self._bind_lock = threading.RLock()
        self._bound = False
        self._binding = False
        self._unbound_closed = False
        self._own_engine: Any = None
        self._configured_name = _current_name(using)  # a later other NAME: the test runner's database
        self._options: dict[str, Any] = dict(options)

    if not TYPE_CHECKING:  # to a type checker the attributes are SyncSqlLeaseProvider's, not Any

        def __getattr__(self, name: str) -> Any:
            # Called only for attributes not set yet: those SyncSqlLeaseProvider.__init__ sets.
            if name.startswith("__") or self.__dict__.get("_binding", True):
                raise AttributeError(name)
            if self.__dict__.get("_unbound_closed"):
                raise ProviderClosedError(f"the provider for {self.safe_url} is closed")
            self._bind()
            return object.__getattribute__(self, name)

    def _bind(self) -> None:
        """Read ``DATABASES[using]`` now (the test database under ``manage.py test``) and set up."""
        with self._bind_lock:
            if self._bound:
                return
            self._binding = True
            try:
                target = self._target()
                SyncSqlLeaseProvider.__init__(self, target, **self._options)
                if self._own_engine is not None:
                    self.safe_url = f"the test database of DATABASES[{self.using!r}]"
                self._bound = True
            except BaseException:
                if self._own_engine is not None:
                    self._own_engine.dispose()
                    self._own_engine = None
                raise
            finally:
                self._binding = False

    def _target(self) -> Any:
        """The URL of the alias's database, or for Django's in-memory test database an ``Engine``
        whose connections open that same shared-cache database."""
        from django.db import connections  # type: ignore[import-not-found,import-untyped,unused-ignore]

        if self.using not in connections:
            raise KeyError(f"settings.DATABASES has no alias {self.using!r}")
        db: Mapping[str, Any] = connections[self.using].settings_dict  # the dict the test runner renames
        name = db.get("NAME")
        from . import _POSTGRES_ENGINES, _SQLITE_ENGINES, _url_from_settings_dict

        if str(db.get("ENGINE", "")) in _SQLITE_ENGINES and _is_memory_name(name):
            text = str(name)
            if not (text.startswith("file:") and "cache=shared" in text):
                raise ValueError(
                    f"DATABASES[{self.using!r}] is a private in-memory SQLite database (each connection "
                    "sees its own); give a file, or use SyncInMemoryLeaseProvider"
                )
            import sqlalchemy as sa

            timeout_s = self.operation_timeout_s

            def connect() -> sqlite3.Connection:
                return sqlite3.connect(text, uri=True, check_same_thread=False, timeout=timeout_s)

            pool_size = self._options.get("pool_size") or 10
            self._own_engine = sa.create_engine(
                "sqlite+pysqlite://", creator=connect, poolclass=sa.pool.QueuePool, pool_size=pool_size, max_overflow=0
            )
            self._options = {**self._options, "pool_size": pool_size}
            return self._own_engine
        if str(db.get("ENGINE", "")) in _POSTGRES_ENGINES and self._on_test_database(db):
            return self._test_database_engine()
        return _url_from_settings_dict(db, self.using)

    def _on_test_database(self, db: Mapping[str, Any]) -> bool:
        """True when the test runner has switched the alias to its test database, it is named as
        the alias's ``TEST["NAME"]``, or Django's test environment is set up (``mail.outbox``, set by
        ``manage.py test`` and pytest-django: a provider first made there sees only the test name)."""
        from django.core import mail  # type: ignore[import-not-found,import-untyped,unused-ignore]

        name = db.get("NAME")
        test_name = (db.get("TEST") or {}).get("NAME")
        return (
            (self._configured_name is not None and name != self._configured_name)
            or (test_name is not None and name == test_name)
            or hasattr(mail, "outbox")
        )

    def _test_database_engine(self) -> Any:
        """PostgreSQL under the test runner: a connection per operation, none kept idle, so the
        runner can drop the test database at the end (it refuses while sessions remain)."""
        import sqlalchemy as sa

        from ..sql.sync_executors import psycopg_conninfo
        from . import _url_from_settings_dict

        using = self.using

        def connect() -> Any:
            import psycopg
            from django.db import connections  # type: ignore[import-not-found,import-untyped,unused-ignore]

            url = sa.make_url(_url_from_settings_dict(connections[using].settings_dict, using))
            return psycopg.connect(psycopg_conninfo(url))

        self._own_engine = sa.create_engine("postgresql+psycopg://", creator=connect, poolclass=sa.pool.NullPool)
        # waiters poll: a LISTEN connection would stay open to the test database
        self._options = {**self._options, "pool_size": self._options.get("pool_size") or 10, "listen_notify": False}
        return self._own_engine

    @property
    def bound(self) -> bool:
        """True once the provider has read ``DATABASES[using]`` (at its first use)."""
        return self._bound

    @property
    def closed(self) -> bool:
        return self._unbound_closed if not self._bound else SyncSqlLeaseProvider.closed.fget(self)  # type: ignore[attr-defined]

    def close(self) -> None:
        """As :meth:`SyncSqlLeaseProvider.close`; a provider never used reads no settings to close."""
        with self._bind_lock:
            if not self._bound:
                self._unbound_closed = True
                self._closed = True
                return
        SyncSqlLeaseProvider.close(self)
        if self._own_engine is not None:
            self._own_engine.dispose()

    def __repr__(self) -> str:
        return f"DjangoSqlLeaseProvider(using={self.using!r}, {self.safe_url!r}, table_name={self.names.table!r})"

    def __del__(self) -> None:
        if self.__dict__.get("_bound"):
            SyncSqlLeaseProvider.__del__(self)


def provider(using: str = "default", **options: Unpack[SyncProviderOptions]) -> DjangoSqlLeaseProvider:
    """A :class:`~sql_lease.SyncSqlLeaseProvider` for ``settings.DATABASES[using]`` that reads the
    alias's connection settings at its first operation, not when made: create it at module level.

    Under ``manage.py test`` (and pytest-django) the test runner has renamed the alias's database
    to the test database by then, so the leases of your tests live there, and nothing is written
    to the real database (use the provider only once the test database exists). Django's default
    SQLite test database is in memory (``file:memorydb_<alias>?mode=memory&cache=shared``): the
    provider opens connections of its own to that same in-memory database (SQLite's shared cache;
    it lives while Django's connection is open).

    The provider's connections are its own (psycopg 3 in autocommit on PostgreSQL, ``sqlite3`` on
    SQLite): every lease statement commits on its own, outside the request's transaction
    (``ATOMIC_REQUESTS``, ``transaction.atomic``). So a lease stays acquired when the request rolls
    back. The price on SQLite, which has one writer at a time: while a transaction of Django's has
    written (a ``TestCase`` that created rows, a view under ``ATOMIC_REQUESTS``), a lease statement
    waits for it (``LeaseBackendError`` after ``operation_timeout_s``; at once on the in-memory
    test database, whose shared cache does not wait and also locks a table another transaction
    has read). There, test code that mixes ORM writes with leases belongs in a
    ``TransactionTestCase``. PostgreSQL has no such limit; on its test database the provider keeps
    no idle connection (one per operation, and waiters poll instead of listening for NOTIFY), so the
    test runner can drop the database at the end.

    The keyword arguments are :class:`~sql_lease.SyncSqlLeaseProvider`'s (``table_name``,
    ``schema``, ``version_table``, ``operation_timeout_s``, ``pool_size``, ``sqlite_busy_timeout_ms``,
    ``sqlite_synchronous``, ``listen_notify``, ``pgbouncer``; typed by
    :class:`~sql_lease.sql.setup.SyncProviderOptions`), checked now: ``TypeError``/``ValueError``. At first
    use: ``KeyError`` for an alias ``DATABASES`` lacks, ``ValueError`` for another engine than
    PostgreSQL or SQLite, or a private ``:memory:`` database.
    """
    return DjangoSqlLeaseProvider(using, **options)
