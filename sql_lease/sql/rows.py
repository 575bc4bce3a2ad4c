"""Parameters and rows as the pyformat drivers take and give them (psycopg, PyMySQL, asyncmy), with
no I/O: both faces' executors share them."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["mysql_row", "named", "pyformat"]

Row = Sequence[Any]

_PLACEHOLDER = re.compile(r"\$(\d+)")


@functools.lru_cache(maxsize=256)
def pyformat(sql: str) -> str:
    """``$n`` placeholders as ``%(pn)s`` (the statements hold no other ``%``)."""
    return _PLACEHOLDER.sub(r"%(p\1)s", sql)


@functools.lru_cache(maxsize=64)
def _names(count: int) -> tuple[str, ...]:
    return tuple(f"p{number}" for number in range(1, count + 1))


def named(params: tuple[Any, ...]) -> dict[str, Any]:
    """Positional ``params`` by the names :func:`pyformat` gives their placeholders."""
    return dict(zip(_names(len(params)), params))  # noqa: B905 -- equal lengths; strict= costs a third more


def mysql_row(row: Sequence[Any]) -> Row:
    """A MySQL row with its ``VARBINARY`` values (keys, owners) as text."""
    return tuple([value.decode() if type(value) is bytes else value for value in row])
