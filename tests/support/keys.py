"""Keys that only an injective, order-keeping stored form tells apart (issue 24)."""

from __future__ import annotations

from sql_lease.observe import LeaseObserver, OperationEvent

LOOK_ALIKE_SUFFIXES = (
    "\x00thread",
    "\x00",
    "\x01\x01thread",  # what a NUL is stored as, written out
    "\x01thread",
    "\x01\x02thread",  # what U+0001 is stored as, written out
    "\x01",
    "\x01\u0800thread",  # what U+D800 is stored as, written out
    "\ud800thread",
    "\udfff",
    "\ud83d\ude00",  # a surrogate pair as two code points is not the character it pairs to
    "\U0001f600",
    "\\x00thread",
    "thread",
)


def look_alike_keys(base: str) -> list[str]:
    """Keys that differ only in NUL, U+0001, lone surrogates and their escaped spellings."""
    return [base + suffix for suffix in LOOK_ALIKE_SUFFIXES]


def key_order(key: str) -> list[float]:
    """The documented key order: code points, lone surrogates between U+0001 and U+0002."""
    return [1 + (ord(c) - 0xD7FF) / 4096 if 0xD800 <= ord(c) <= 0xDFFF else ord(c) for c in key]


class KeysSeen(LeaseObserver):
    """The keys of the operations reported to observers, of those starting with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.seen: list[str] = []

    def on_operation(self, event: OperationEvent) -> None:
        if event.key is not None and event.key.startswith(self.prefix):
            self.seen.append(event.key)
