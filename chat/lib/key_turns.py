"""Turns one at a time per key (a person, a typed login): a key's flood queues behind itself, not before others."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class KeyTurns:
    """An asyncio lock per key, made when first wanted and forgotten once no one holds or waits for it."""

    def __init__(self) -> None:
        self._keys: dict[Hashable, list] = {}  # key -> [lock, holders and waiters]

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        entry = self._keys.setdefault(key, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._keys[key]

    def __len__(self) -> int:
        """How many keys someone holds or waits for."""
        return len(self._keys)
