"""A new chat's ids (its conversation's, its message's and its reply's), taken from their sequences in blocks.

On PostgreSQL a new chat's rows are inserted with ids taken ahead, so that they go with its usage row in the
metered start's last round trip (chat/actions/turns.py). Taken a block at a time, they cost a start no
statement of its own: one start in BLOCK reads the next block, with its other reads. Each id is used once
or never (a process that stops leaves its block's rest unused: a gap, as a rolled-back insert leaves).
"""

from __future__ import annotations

from collections import deque

from django.db import models

from chat.models.base import Read, ids_read

BLOCK = 32
# kinds (a model per row) -> sets of ids taken and not used yet, in the order taken
_free: dict[tuple[type[models.Model], ...], deque[tuple[int, ...]]] = {}


def take(*kinds: type[models.Model]) -> tuple[int, ...] | None:
    """A set of new ids for rows of `kinds` from this process's block, or None when it is used up (refill())."""
    try:
        return _free.get(kinds, deque()).popleft()  # atomic: no two threads get the same set, with no lock
    except IndexError:
        return None


def refill(*kinds: type[models.Model]) -> Read | None:
    """The statement that takes the next block; its make keeps it and gives one set, or None if a table has no
    sequence of its own (then the rows are inserted with ids of the database's choosing); None off PostgreSQL."""
    read = ids_read(*kinds, count=BLOCK)
    if read is None:
        return None

    def made(rows: list[tuple]) -> tuple[int, ...] | None:
        sets = read.make(rows)
        _free.setdefault(kinds, deque()).extend(sets[1:])
        return sets[0] if sets else None

    return Read(read.sql, read.params, make=made)
