"""The lease table as the code declares it, and the names of the objects that go with it.

One row per held (or expired, not yet swept) lease::

    key         varchar(512)  primary key
    owner       varchar(512)  not null
    fence       bigint        not null   fencing token; see below
    expires_at  timestamptz   not null   PostgreSQL: by now() of the database
                bigint                   SQLite: Unix epoch milliseconds by SQLite's own clock
    has_waiters boolean       not null   set by a refused waiting acquire; releases, transfers
                                         and sweeps of such rows send NOTIFY (PostgreSQL)

Fences come from one counter per table, so they increase across keys, releases, sweeps and
restarts: on PostgreSQL the sequence ``<table>_fence_seq``; on SQLite the one-row table
``<table>_fence`` that triggers advance whenever a row gets a larger fence.

The Alembic migrations in ``migrations/`` build this; ``tests/test_migrations.py`` checks that
what they build equals :func:`lease_metadata`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Sequence,
    String,
    Table,
    false,
)

from ..contract import MAX_KEY_LENGTH, MAX_OWNER_LENGTH

__all__ = ["DEFAULT_TABLE_NAME", "DEFAULT_VERSION_TABLE", "LeaseTableNames", "lease_metadata"]

DEFAULT_TABLE_NAME = "sql_leases"
DEFAULT_VERSION_TABLE = "sql_lease_alembic_version"

# Letters, digits and underscores, not starting with a digit. The longest suffix added to the
# table name is "_fence_seq" (10), and PostgreSQL truncates identifiers at 63 bytes.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MAX_TABLE_NAME = 63 - len("_fence_seq")


def validate_identifier(value: object, what: str, max_length: int = 63) -> str:
    """Return ``value`` if it is a plain SQL identifier, else raise ``TypeError``/``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not _IDENTIFIER.match(value) or len(value) > max_length:
        raise ValueError(
            f"{what} {value!r} is not accepted: use 1 to {max_length} ASCII letters, digits and "
            "underscores, not starting with a digit"
        )
    return value


@dataclass(frozen=True, slots=True)
class LeaseTableNames:
    """Names of the lease table, its schema and the objects that belong to it."""

    table: str = DEFAULT_TABLE_NAME
    schema: str | None = None
    version_table: str = DEFAULT_VERSION_TABLE

    def __post_init__(self) -> None:
        validate_identifier(self.table, "table_name", _MAX_TABLE_NAME)
        if self.schema is not None:
            validate_identifier(self.schema, "schema")
        validate_identifier(self.version_table, "version_table")

    @property
    def fence_sequence(self) -> str:
        """PostgreSQL sequence the fences come from."""
        return f"{self.table}_fence_seq"

    @property
    def fence_counter(self) -> str:
        """SQLite one-row table holding the last fence handed out."""
        return f"{self.table}_fence"

    @property
    def expires_at_index(self) -> str:
        return f"ix_{self.table}_expires_at"

    @property
    def advisory_lock_class(self) -> int:
        """First key of the PostgreSQL advisory locks that order fence draws on this table (the
        second is ``hashtext(key)``); a stable signed 32-bit number derived from the table name."""
        digest = hashlib.sha256(f"sql_lease:{self.schema}.{self.table}".encode()).digest()
        return int.from_bytes(digest[:4], "big", signed=True)

    @property
    def notify_channel(self) -> str:
        """PostgreSQL LISTEN/NOTIFY channel on which releases, transfers and sweeps of leases that
        have waiters are announced (payload: the key). At most 63 bytes, as PostgreSQL requires."""
        channel = f"sql_lease.{self.schema}.{self.table}" if self.schema else f"sql_lease.{self.table}"
        if len(channel) > 63:
            channel = "sql_lease." + hashlib.sha256(channel.encode()).hexdigest()[:40]
        return channel


def lease_metadata(names: LeaseTableNames, dialect_name: str) -> MetaData:
    """The tables of ``names`` as declared for ``dialect_name`` (``"postgresql"`` or ``"sqlite"``)."""
    metadata = MetaData(schema=names.schema)
    if dialect_name == "postgresql":
        expires_at_type: DateTime | BigInteger = DateTime(timezone=True)
        Sequence(names.fence_sequence, metadata=metadata)
    elif dialect_name == "sqlite":
        expires_at_type = BigInteger()
        Table(
            names.fence_counter,
            metadata,
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("last_fence", BigInteger, nullable=False),
        )
    else:
        raise ValueError(f"sql_lease supports postgresql and sqlite, not {dialect_name!r}")
    Table(
        names.table,
        metadata,
        Column("key", String(MAX_KEY_LENGTH), primary_key=True),
        Column("owner", String(MAX_OWNER_LENGTH), nullable=False),
        Column("fence", BigInteger, nullable=False),
        Column("expires_at", expires_at_type, nullable=False),
        Column("has_waiters", Boolean, nullable=False, server_default=false()),
        Index(names.expires_at_index, "expires_at"),
        sqlite_with_rowid=False,
    )
    return metadata
