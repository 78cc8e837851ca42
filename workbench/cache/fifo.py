"""A FIFO queue of keys with byte accounting: the building block of S3-FIFO.

S3-FIFO is three of these (small, main, ghost), as in libCacheSim where S3FIFO composes
FIFO caches through the common cache interface. The queue itself never decides anything;
`admit` gives the ghost queue its "FIFO cache" behaviour (insert, pushing out the oldest
keys until the new one fits).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class FifoQueue:
    """Keys in insertion order with their sizes; O(1) push, pop-head, remove, move-to-tail."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.bytes = 0
        self._items: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def keys(self) -> list[str]:
        """Keys from head (oldest) to tail (newest)."""
        return list(self._items)

    def head(self) -> str | None:
        """The oldest key, or None when empty."""
        return next(iter(self._items), None)

    def size_of(self, key: str) -> int:
        return self._items[key]

    def push(self, key: str, size: int) -> None:
        """Append at the tail; the key must not be queued already."""
        if key in self._items:
            raise KeyError(f"{key} is already queued")
        self._items[key] = size
        self.bytes += size

    def pop_head(self) -> tuple[str, int]:
        """Remove and return the oldest (key, size); IndexError when empty."""
        if not self._items:
            raise IndexError("pop from an empty FifoQueue")
        key, size = self._items.popitem(last=False)
        self.bytes -= size
        return key, size

    def remove(self, key: str) -> bool:
        """Remove a key anywhere in the queue; False if absent."""
        size = self._items.pop(key, None)
        if size is None:
            return False
        self.bytes -= size
        return True

    def move_to_tail(self, key: str) -> None:
        """Reinsert a queued key at the tail (a FIFO "second chance")."""
        self._items.move_to_end(key)

    def rotate_while(self, pred: Callable[[str], bool], limit: int) -> int:
        """Move head keys for which `pred` holds to the tail, one by one, and return how many
        held: stops at the first key for which it does not (left at the head), or when the
        `limit`-th key holds (counted, left at the head). S3-FIFO's pass over protected
        keys, without a method call per key."""
        items = self._items
        move = items.move_to_end
        held = 0
        while items:
            key = next(iter(items))
            if not pred(key):
                return held
            held += 1
            if held >= limit:
                return held
            move(key)
        return held

    def admit(self, key: str, size: int) -> bool:
        """FIFO-cache access: True if present (no reordering); else insert, evicting from the
        head until it fits within `capacity`. A key larger than the capacity is not kept."""
        if key in self._items:
            return True
        if self.capacity is not None:
            if size > self.capacity:
                return False
            while self.bytes + size > self.capacity:
                self.pop_head()
        self.push(key, size)
        return False
