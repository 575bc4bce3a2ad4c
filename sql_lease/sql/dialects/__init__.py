"""The SQL text of every statement, one module per dialect: :mod:`.postgresql`, :mod:`.sqlite` and
:mod:`.mysql` (MySQL and MariaDB).

Each module holds its statements as constants, written out whole, each under a one-line comment
naming its parameters in order; ``PLACEHOLDERS`` names the only substitutions (the quoted table
names, filled once per provider); ``texts(durable_session=, durable_release=)`` says which constant
each operation sends in that variant. Every dialect answers every name of :data:`STATEMENT_NAMES`
in every variant (None where the dialect has no such statement), so a new operation or variant
cannot be added to one dialect only (tests/test_statement_texts.py).
"""

from __future__ import annotations

from itertools import product
from types import ModuleType

__all__ = ["STATEMENT_NAMES", "VARIANTS", "dialect_module"]

STATEMENT_NAMES = (
    "acquire",
    "acquire_waiting",
    "holder",
    "owner",
    "list_leases",
    "list_all",
    "notify_channel",
    "release",
    "release_keeping",
    "renew",
    "renew_many",
    "transfer",
    "break_lease",
    "sweep",
    "check_held",
    "accept_fence",
    "accepted",
    "acquire_keys",
    "holders",
    "release_keys",
)
"""The names every dialect's ``texts()`` answers (lease statements, then fenced-write ones)."""

VARIANTS = tuple(
    {"durable_session": session, "durable_release": release} for session, release in product((False, True), repeat=2)
)
"""Every combination of the variant flags ``texts()`` takes."""


def dialect_module(dialect_name: str) -> ModuleType:
    """The statements module of ``"postgresql"``, ``"sqlite"`` or ``"mysql"`` (also ``"mariadb"``);
    ``ValueError`` for another database."""
    if dialect_name == "postgresql":
        from . import postgresql

        return postgresql
    if dialect_name == "sqlite":
        from . import sqlite

        return sqlite
    if dialect_name in ("mysql", "mariadb"):
        from . import mysql

        return mysql
    raise ValueError(f"sql_lease supports postgresql, sqlite and mysql, not {dialect_name!r}")
