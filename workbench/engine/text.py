"""Turning generated token pieces into reply text.

Two concerns, both on the decode path so kept small: pieces are bytes that may split a
UTF-8 character (an incremental decoder holds the partial bytes back), and stop sequences
may span token boundaries (text that could still be the start of a stop string is held
back until it either completes one or cannot).
"""

from __future__ import annotations

import codecs


class ReplyText:
    """Accumulates the reply; ``push`` returns the text that is safe to show now."""

    __slots__ = ("_decoder", "_stops", "_held", "_longest", "reply", "stop_hit")

    def __init__(self, stop_sequences: tuple[str, ...]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = stop_sequences
        self._longest = max((len(s) for s in stop_sequences), default=0)
        self._held = ""
        self.reply = ""
        self.stop_hit: str | None = None

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return newly releasable text ('' if none)."""
        text = self._decoder.decode(piece)
        if not self._stops:
            self.reply += text
            return text
        self._held += text
        # earliest complete stop string wins; everything before it is released, it and after are dropped
        first: tuple[int, str] | None = None
        for stop in self._stops:
            at = self._held.find(stop)
            if at >= 0 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            out = self._held[: first[0]]
            self._held = ""
            self.stop_hit = first[1]
            self.reply += out
            return out
        keep = self._partial_suffix()
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep:]
        self.reply += out
        return out

    def flush(self) -> str:
        """End of generation: release what was held back (no stop string completed)."""
        text = self._decoder.decode(b"", final=True)
        out = "" if self.stop_hit is not None else self._held + text
        self._held = ""
        self.reply += out
        return out

    def _partial_suffix(self) -> int:
        """Length of the longest tail of the held text that starts some stop string."""
        held = self._held
        for n in range(min(len(held), self._longest - 1), 0, -1):
            tail = held[-n:]
            if any(stop.startswith(tail) for stop in self._stops):
                return n
        return 0
