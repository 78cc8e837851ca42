"""Longest-prefix index over stored rows, keyed by chained block hashes.

A row covers tokens[0:n] for any n >= 1; rows are saved at arbitrary lengths (checkpoints,
finished replies), so n is usually not a multiple of the block size. Each row is anchored at
the node of its last full block (depth n // block_size; depth 0 is the namespace digest
itself), and each node keeps the rows anchored there, longest first. Every full-block node a
row passes through is reference-counted, so a lookup can stop hashing at the first block no
stored row continues into.

Lookup: hash the query's blocks from the root while the node exists (O(matched/block)
hashes), then walk the path back from the deepest node and return the first anchored row
that is really a prefix of the query: its namespace must be equal and its token bytes must
equal the query's first n tokens (one memcmp). The hashes only choose candidates; the
comparison decides, so a hash collision can cost time but never return a wrong row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from workbench.cache import keys
from workbench.cache.keys import Tokens
from workbench.cache.types import Match


class KeyConflict(ValueError):
    """A key is already indexed for other tokens or another namespace (a key collision)."""


@dataclass(slots=True)
class _IndexedRow:
    key: str
    namespace: bytes
    raw: bytes        # int32 little-endian token ids
    anchor: bytes     # node this row is listed under

    @property
    def n_tokens(self) -> int:
        return len(self.raw) // 4


class PrefixIndex:
    """Maps rows (namespace, tokens) to keys and finds the longest stored prefix.

    Not thread-safe on its own: its owner (the chunk catalog, the lab's row catalog) serialises calls.
    """

    def __init__(self, block_size: int = 16) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._rows: dict[str, _IndexedRow] = {}
        self._anchored: dict[bytes, list[_IndexedRow]] = {}
        self._refs: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def keys(self) -> Iterator[str]:
        return iter(list(self._rows))

    def token_bytes(self, key: str) -> bytes:
        """The stored row's token ids (int32 little-endian); KeyError if unknown."""
        return self._rows[key].raw

    def namespace(self, key: str) -> bytes:
        """The stored row's namespace digest; KeyError if unknown."""
        return self._rows[key].namespace

    def insert(self, namespace_digest: bytes, tokens: Tokens, key: str) -> bool:
        """Index a row; False if this exact row is already indexed.

        Raises KeyConflict if `key` is indexed for different tokens or namespace, and
        ValueError for an empty row.
        """
        raw = keys.token_bytes(tokens)
        if not raw:
            raise ValueError("a row must cover at least one token")
        old = self._rows.get(key)
        if old is not None:
            if old.raw == raw and old.namespace == namespace_digest:
                return False
            raise KeyConflict(f"key {key} is already indexed for other tokens")
        path = keys.chain_hashes(namespace_digest, raw, self.block_size)
        for node in path:
            self._refs[node] = self._refs.get(node, 0) + 1
        anchor = path[-1] if path else namespace_digest
        row = _IndexedRow(key, namespace_digest, raw, anchor)
        self._rows[key] = row
        bucket = self._anchored.setdefault(anchor, [])
        bucket.append(row)
        bucket.sort(key=lambda r: -r.n_tokens)
        return True

    def remove(self, key: str) -> bool:
        """Forget a row; False if it was not indexed."""
        row = self._rows.pop(key, None)
        if row is None:
            return False
        for node in keys.chain_hashes(row.namespace, row.raw, self.block_size):
            left = self._refs[node] - 1
            if left:
                self._refs[node] = left
            else:
                del self._refs[node]
        bucket = self._anchored[row.anchor]
        bucket.remove(row)
        if not bucket:
            del self._anchored[row.anchor]
        return True

    def longest_prefix(self, namespace_digest: bytes, tokens: Tokens) -> Match | None:
        """The longest indexed row of this namespace whose tokens are a prefix of `tokens`."""
        raw = keys.token_bytes(tokens)
        n_query = len(raw) // 4
        path = self._walk(namespace_digest, raw)
        for node in reversed(path):
            for row in self._anchored.get(node, ()):
                if (
                    row.n_tokens <= n_query
                    and row.namespace == namespace_digest
                    and raw.startswith(row.raw)
                ):
                    return Match(row.key, row.n_tokens)
        return None

    def cached_prefix_len(self, namespace_digest: bytes, tokens: Tokens) -> int:
        """Length of the longest cached prefix of `tokens`, 0 if none."""
        match = self.longest_prefix(namespace_digest, tokens)
        return 0 if match is None else match.n_tokens

    def _walk(self, namespace_digest: bytes, raw: bytes) -> list[bytes]:
        """Root plus every block node of the query that some stored row passes through."""
        step = 4 * self.block_size
        digest = keys.block_digest
        refs = self._refs
        path = [namespace_digest]
        h = namespace_digest
        for start in range(0, (len(raw) // step) * step, step):
            h = digest(h + raw[start:start + step])
            if h not in refs:
                break
            path.append(h)
        return path
