"""The native replay: a chunk-model plan as integer arrays, replayed by `workbench._native.lab`
for the built-in policies (lru, lfu, fifo, gdsf, frecency, s3fifo), about 50 times faster
than `chunksim.ChunkSimCache` and equal to it on every number (tests/unit/test_lab_native.py).

A policy takes this path when it says how (`policy.native_spec()` returns its name and
parameters: a fresh built-in policy, `policies.py`); any other policy (a user's class or
function, the optimum) replays through chunksim.py. The arrays, made once per plan and shared
by every (policy, budget) replay of it:

    chunks    ids in the order the chunk tree registered them (a parent before its
              children): parent id (-1 for a first chunk), token ids
    rows      every row the plan saves: its last chunk (the chain follows the parents), its tokens, the node of the
              virtual-token trie where it ends
    requests  prompt tokens, arrival, the trie nodes of its virtual prompt (the longest
              stored row that is a prefix of the prompt ends at the deepest of them holding
              a stored row: `PrefixIndex.longest_prefix` on the plan's virtual tokens), its
              own chunk chain (its last chunk), its saves (row, kind) and its finish row

Byte sizes come from `chunk_format` (one definition) at each replay, since they depend on
bytes_per_token.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from workbench.cache.chunk_format import chunk_file_size, manifest_size

_I32, _I64 = np.int32, np.int64


class NativePlan:
    """A plan's arrays, held by the native module (`plan`: a `plan.Plan` of the chunk
    model; not imported here, since plan.py's run_plan calls this module)."""

    def __init__(self, plan: Any) -> None:
        from workbench import _native

        tree, prompt_chunks = plan.chunks, plan.prompt_chunks
        if tree is None or prompt_chunks is None:
            raise ValueError("the native replay needs a chunk-model plan (chunk_size set)")
        ids = {key: i for i, key in enumerate(tree.parent)}
        parent = np.fromiter((-1 if p is None else ids[p] for p in tree.parent.values()), _I32, len(ids))
        raws = [tree.raw[key] for key in tree.parent]
        ntok = np.fromiter((len(r) // 4 for r in raws), _I64, len(raws))
        rows: dict[str, int] = {}
        save_row, save_kind, save_ptr, finish_row = [], [], [0], []
        for pre, fin in zip(plan.prefill, plan.finish):
            for key, _, _, kind in pre:
                save_row.append(rows.setdefault(key, len(rows)))
                save_kind.append(kind)
            save_ptr.append(len(save_row))
            finish_row.append(-1 if fin is None else rows.setdefault(fin[0], len(rows)))
        node_row, nodes, node_ptr, row_tokens = _trie(plan, rows)
        self.row_tokens = row_tokens
        self.chunk_tokens = ntok
        self.arrays = _native.lab.Plan(
            chunk_size=tree.chunk_size, parent=parent, tok_ptr=_offsets(ntok),
            toks=np.frombuffer(b"".join(raws), "<i4"),
            row_last=np.fromiter((ids[tree.last[key]] for key in rows), _I32, len(rows)),
            row_tokens=row_tokens, node_row=node_row, plen=np.asarray(plan.prompt_len, _I64),
            arrival=np.asarray(plan.arrival, np.float64), node_ptr=node_ptr, nodes=nodes,
            prompt_last=np.fromiter((ids[c[-1]] if c else -1 for c in prompt_chunks), _I32, len(prompt_chunks)),
            save_ptr=np.asarray(save_ptr, _I64), save_row=np.asarray(save_row, _I32),
            save_kind=np.asarray(save_kind, _I32), finish_row=np.asarray(finish_row, _I32))
        self.chain_len = self.arrays.row_chain_lengths()

    def replay(self, name: str, params: dict[str, Any], size_bytes: int, bytes_per_token: int, *,
               timeline_every: int = 0, record: bool = False) -> dict[str, Any]:
        """`run_plan`'s result for the built-in policy `name` (its `native_spec` parameters)."""
        from workbench import _native

        started = time.perf_counter()
        # the store's sizes, element-wise over the arrays (the functions are plain arithmetic)
        chunk_bytes = chunk_file_size(self.chunk_tokens, self.chunk_tokens * bytes_per_token)  # type: ignore[arg-type]
        manifest_bytes = manifest_size(self.row_tokens, self.chain_len)  # type: ignore[arg-type]
        out = _native.lab.replay(self.arrays, name, params, int(size_bytes), chunk_bytes, manifest_bytes,
                                 int(bytes_per_token), int(timeline_every), bool(record))
        return {**out, "seconds": time.perf_counter() - started}


def native_plan(plan: Any) -> NativePlan:
    """The plan's arrays, made on first use and kept on the plan (forked workers share them)."""
    if plan.native is None:
        plan.native = NativePlan(plan)
    return plan.native


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, _I64)
    np.cumsum(lengths, out=out[1:])
    return out


def _trie(plan: Any, rows: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The virtual-token trie of every prompt and row: the row ending at each node, each
    prompt's nodes, each row's real tokens. A request's rows and prompt are prefixes of one
    virtual sequence (its prompt, with its reply when it saves a finish row), walked once."""
    children: dict[tuple[int, int], int] = {}
    node_row = [-1]   # node 0: the root (no row ends there)
    nodes: list[int] = []
    node_ptr = [0]
    row_tokens = np.zeros(len(rows), _I64)
    for prompt, pre, fin in zip(plan.prompts, plan.prefill, plan.finish):
        saved = [(key, raw, n) for key, raw, n, _ in pre]
        if fin is not None:
            saved.append(fin)
        longest = max((raw for _, raw, _ in saved), key=len, default=prompt)
        if len(prompt) > len(longest):
            longest = prompt
        path, node = [], 0
        for vid in np.frombuffer(longest, "<i4").tolist():
            child = children.get((node, vid))
            if child is None:
                child = children[(node, vid)] = len(node_row)
                node_row.append(-1)
            node = child
            path.append(node)
        for key, raw, n in saved:
            depth = len(raw) // 4
            if raw != longest[:len(raw)] or depth == 0:
                raise ValueError("a saved row is not a prefix of its request's virtual tokens")
            r = rows[key]
            node_row[path[depth - 1]] = r
            row_tokens[r] = n
        if prompt != longest[:len(prompt)]:
            raise ValueError("a prompt is not a prefix of its request's virtual tokens")
        nodes.extend(path[:len(prompt) // 4])
        node_ptr.append(len(nodes))
    return (np.asarray(node_row, _I32), np.asarray(nodes, _I32), np.asarray(node_ptr, _I64), row_tokens)
