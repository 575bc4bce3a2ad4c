"""The lease table as the code declares it, and the names of the objects that go with it.

One row per held (or expired, not yet swept) lease::

    key         varchar(1024) primary key  the stored form of the key (``encode_key``, migration 0005;
                                         SQLite: declared varchar(512), a length it does not enforce)
    owner       varchar(512)  not null
    fence       bigint        not null   fencing token; see below
    expires_at  timestamptz   not null   PostgreSQL: by now() of the database
                bigint                   SQLite: Unix epoch milliseconds by SQLite's own clock
    has_waiters boolean       not null   set by a refused waiting acquire; releases, transfers
                                         and sweeps of such rows send NOTIFY (PostgreSQL)
    data        json          null       lease data, a JSON object (migration 0003; SQLite: text)
    acquired_at as expires_at null       start of the tenure by the database's clock (migration
                                         0003); NULL on rows written before it
    released    boolean       not null   released with a minimum hold and kept until expires_at
                                         (migration 0004)

Fences come from one counter per table, so they increase across keys, releases, sweeps and
restarts: on PostgreSQL the sequence ``<table>_fence_seq``; on SQLite the one-row table
``<table>_fence`` that triggers advance whenever a row gets a larger fence.

``<table>_fences`` (resource varchar(512) primary key, fence bigint, accepted_at as expires_at)
holds the highest fence ``accept_fence`` accepted per resource (migration 0002; creatable alone
in another database with ``sql-lease migrate --fences-only``).

``<table>_slots`` (migration 0006) holds the slots of keys held as semaphores (``limit`` >= 2): one
row per holder (key, owner, fence, acquired_at, expires_at, data, released; primary key (key,
owner), compared byte for byte as in the lease table). Such a key has a head row in the lease
table with owner ``''`` (never a valid owner): expires_at is the latest unexpired slot's expiry,
acquired_at the oldest holder's tenure start, fence the largest fence granted (docs/statements.md,
"Semaphores").

The Alembic migrations in ``migrations/`` build this; ``tests/test_migrations.py`` checks that
what they build equals :func:`lease_metadata`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

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
    Text,
    false,
)
from sqlalchemy.dialects.postgresql import JSON

from ..contract import MAX_KEY_LENGTH, MAX_OWNER_LENGTH

__all__ = [
    "DEFAULT_TABLE_NAME",
    "DEFAULT_VERSION_TABLE",
    "LeaseTableNames",
    "derived_version_table",
    "lease_metadata",
]

DEFAULT_TABLE_NAME = "sql_leases"
DEFAULT_VERSION_TABLE = "sql_lease_alembic_version"
VERSION_TABLE_SUFFIX = "_alembic_version"

# PostgreSQL truncates identifiers at 63 bytes (NAMEDATALEN - 1); every name derived from the
# table's name must fit, or two objects could end up with one truncated name. The longest are the
# index "ix_<table>_expires_at" (table + 14) and, for the version table, Alembic's primary key
# "<version_table>_pkc" (version table + 4). (SQLite's triggers and check constraint are longer,
# but SQLite has no limit.)
POSTGRES_MAX_NAME = 63

STORED_KEY_LENGTH = 2 * MAX_KEY_LENGTH
"""Longest stored form of a key, in characters (``encode_key``: at most two per character)."""
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_VERSION_TABLE_NAME = POSTGRES_MAX_NAME - len("_pkc")
MAX_TABLE_NAME = POSTGRES_MAX_NAME - len("ix__expires_at")
MAX_TABLE_NAME_WITH_DERIVED_VERSION_TABLE = MAX_VERSION_TABLE_NAME - len(VERSION_TABLE_SUFFIX)


def validate_identifier(value: object, what: str, max_length: int = POSTGRES_MAX_NAME) -> str:
    """Return ``value`` if it is a plain SQL identifier, else raise ``TypeError``/``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not _IDENTIFIER.match(value) or len(value) > max_length:
        raise ValueError(
            f"{what} {value!r} is not accepted: use 1 to {max_length} ASCII letters, digits and "
            "underscores, not starting with a digit"
            + (" (PostgreSQL allows 63 bytes for the names derived from it)" if max_length < POSTGRES_MAX_NAME else "")
        )
    return value


def derived_version_table(table: str) -> str:
    """The default Alembic version table of lease table ``table``: ``sql_lease_alembic_version``
    for the default table (as in every release so far), ``<table>_alembic_version`` for others,
    so that each lease table has a migration state of its own."""
    return DEFAULT_VERSION_TABLE if table == DEFAULT_TABLE_NAME else table + VERSION_TABLE_SUFFIX


@dataclass(frozen=True, slots=True, init=False)
class LeaseTableNames:
    """Names of the lease table, its schema and the objects that belong to it.

    ``version_table`` defaults to :func:`derived_version_table` of the table. Raises
    ``TypeError``/``ValueError`` for a name that is not a plain identifier, or that would make a
    derived name longer than PostgreSQL's 63 bytes: table names have at most 49 characters, and
    at most 43 unless ``version_table`` is given (version tables: at most 59).
    """

    table: str
    schema: str | None
    version_table: str

    def __init__(
        self, table: str = DEFAULT_TABLE_NAME, schema: str | None = None, version_table: str | None = None
    ) -> None:
        validate_identifier(table, "table_name", MAX_TABLE_NAME)
        if schema is not None:
            validate_identifier(schema, "schema")
        if version_table is None:
            if len(table) > MAX_TABLE_NAME_WITH_DERIVED_VERSION_TABLE:
                raise ValueError(
                    f"table_name {table!r} ({len(table)} characters) leaves no room for its version table "
                    f"{table}{VERSION_TABLE_SUFFIX} within PostgreSQL's 63-byte names: use at most "
                    f"{MAX_TABLE_NAME_WITH_DERIVED_VERSION_TABLE} characters, or give version_table "
                    f"(--version-table) of at most {MAX_VERSION_TABLE_NAME}"
                )
            version_table = derived_version_table(table)
        validate_identifier(version_table, "version_table", MAX_VERSION_TABLE_NAME)
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "version_table", version_table)

    @property
    def fence_sequence(self) -> str:
        """PostgreSQL sequence the fences come from."""
        return f"{self.table}_fence_seq"

    @property
    def fence_counter(self) -> str:
        """SQLite one-row table holding the last fence handed out."""
        return f"{self.table}_fence"

    @property
    def fence_table(self) -> str:
        """Table of the highest fence accepted per resource (``accept_fence``)."""
        return f"{self.table}_fences"

    @property
    def slot_table(self) -> str:
        """Table of the slots of keys held as semaphores (migration 0006)."""
        return f"{self.table}_slots"

    @property
    def slot_expires_at_index(self) -> str:
        """Index of the slot table's expiry (the sweep's order; within 63 bytes as the others)."""
        return f"ix_{self.table}_slots_exp"

    @property
    def slot_live_index(self) -> str:
        """SQLite index of the slot table on (key, expires_at) (migration 0007): the live slots of a key,
        named by the one-statement slot operations (``INDEXED BY``), so a table older fails them."""
        return f"ix_{self.table}_slots_live"

    def slot_triggers(self) -> tuple[str, str, str]:
        """SQLite triggers of migration 0007 on the slot table that keep each semaphore's head exact
        after a slot is inserted, its expiry updated, or a live one deleted."""
        return (f"{self.table}_slots_granted", f"{self.table}_slots_renewed", f"{self.table}_slots_freed")

    @property
    def slot_acquire_function(self) -> str:
        """PostgreSQL function of the slot acquire transaction (migration 0006)."""
        return f"{self.table}_slot_acquire"

    @property
    def slot_release_function(self) -> str:
        """PostgreSQL function of the slot release transaction (migration 0006)."""
        return f"{self.table}_slot_release"

    @property
    def expires_at_index(self) -> str:
        return f"ix_{self.table}_expires_at"


def lease_metadata(names: LeaseTableNames, dialect_name: str) -> MetaData:
    """The tables of ``names`` as declared for ``dialect_name`` (``"postgresql"``, ``"sqlite"`` or
    ``"mysql"``)."""
    metadata = MetaData(schema=names.schema)
    text_type: Any = String(MAX_KEY_LENGTH)
    key_type: Any = String(STORED_KEY_LENGTH if dialect_name == "postgresql" else MAX_KEY_LENGTH)
    expires_at_type: Any
    data_type: Any
    if dialect_name in ("mysql", "mariadb"):
        from sqlalchemy.dialects import mysql

        text_type = key_type = mysql.VARBINARY(4 * MAX_KEY_LENGTH)  # stored keys too: at most 4 bytes per character
        expires_at_type, data_type = mysql.DATETIME(fsp=6), mysql.LONGTEXT()
        Table(names.fence_counter, metadata, Column("id", BigInteger, primary_key=True, autoincrement=True))
    elif dialect_name == "postgresql":
        expires_at_type = DateTime(timezone=True)
        data_type = JSON()
        Sequence(names.fence_sequence, metadata=metadata)
    elif dialect_name == "sqlite":
        expires_at_type, data_type = BigInteger(), Text()
        Table(
            names.fence_counter,
            metadata,
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("last_fence", BigInteger, nullable=False),
        )
    else:
        raise ValueError(f"sql_lease supports postgresql, sqlite and mysql, not {dialect_name!r}")
    Table(
        names.table,
        metadata,
        Column("key", key_type, primary_key=True),
        Column(
            "owner", text_type if dialect_name in ("mysql", "mariadb") else String(MAX_OWNER_LENGTH), nullable=False
        ),
        Column("fence", BigInteger, nullable=False),
        Column("expires_at", expires_at_type, nullable=False),
        Column("has_waiters", Boolean, nullable=False, server_default=false()),
        Column("data", data_type, nullable=True),
        Column("acquired_at", expires_at_type, nullable=True),
        Column("released", Boolean, nullable=False, server_default=false()),
        Index(names.expires_at_index, "expires_at"),
        sqlite_with_rowid=False,
    )
    Table(
        names.slot_table,
        metadata,
        Column("key", key_type, primary_key=True),
        Column(
            "owner",
            text_type if dialect_name in ("mysql", "mariadb") else String(MAX_OWNER_LENGTH),
            primary_key=True,
        ),
        Column("fence", BigInteger, nullable=False),
        Column("acquired_at", expires_at_type, nullable=False),
        Column("expires_at", expires_at_type, nullable=False),
        Column("data", data_type, nullable=True),
        Column("released", Boolean, nullable=False, server_default=false()),
        Index(names.slot_expires_at_index, "expires_at"),
        *([Index(names.slot_live_index, "key", "expires_at")] if dialect_name == "sqlite" else []),
        sqlite_with_rowid=False,
    )
    Table(
        names.fence_table,
        metadata,
        Column("resource", text_type if dialect_name in ("mysql", "mariadb") else String(512), primary_key=True),
        Column("fence", BigInteger, nullable=False),
        Column("accepted_at", expires_at_type, nullable=False),
    )
    return metadata
