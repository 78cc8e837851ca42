"""The approximate router's memory: a prefix tree of the prompts sent to one replica.

Like the SGLang router's per-worker radix tree (and Ray Serve's character tree), it stores
what was routed, not what the replica caches: a prompt's match is the longest prefix it
shares with any prompt inserted before. Elements are characters of a text prompt or ids
of a token prompt. ``size`` counts nodes (elements stored); past ``max_size`` the least
recently used leaves are dropped, as the anchors' periodic eviction does.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence


class _Node:
    __slots__ = ("children", "parent", "key", "used")

    def __init__(self, parent: _Node | None, key: Hashable, used: int) -> None:
        self.children: dict[Hashable, _Node] = {}
        self.parent, self.key, self.used = parent, key, used


class PrefixTree:
    def __init__(self, max_size: int = 1 << 20) -> None:
        self.max_size = max_size
        self.size = 0
        self._clock = itertools.count(1)
        self._root = _Node(None, None, 0)

    def match(self, prompt: Sequence[Hashable]) -> int:
        """Elements of ``prompt``'s longest prefix already in the tree."""
        node, n = self._root, 0
        for el in prompt:
            nxt = node.children.get(el)
            if nxt is None:
                break
            node, n = nxt, n + 1
        return n

    def insert(self, prompt: Sequence[Hashable]) -> None:
        now = next(self._clock)
        node = self._root
        for el in prompt:
            nxt = node.children.get(el)
            if nxt is None:
                nxt = node.children[el] = _Node(node, el, now)
                self.size += 1
            nxt.used = now
            node = nxt
        if self.size > self.max_size:
            self._evict(self.max_size * 9 // 10)

    def _evict(self, target: int) -> None:
        """Drop least recently used leaves until ``size <= target``."""
        while self.size > target:
            leaves = sorted(self._leaves(), key=lambda n: n.used)
            if not leaves:
                return
            for leaf in leaves:
                if self.size <= target:
                    return
                node: _Node | None = leaf
                while node is not None and node is not self._root and not node.children:
                    parent = node.parent
                    assert parent is not None
                    del parent.children[node.key]
                    self.size -= 1
                    node = parent if parent.used <= leaf.used else None

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self._root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self._root:
                out.append(node)
            stack.extend(node.children.values())
        return out
