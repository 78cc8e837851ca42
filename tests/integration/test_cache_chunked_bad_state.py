"""test_cache_bad_state.py's poisoned cell in chunk storage: a chunk file whose checksums verify
but whose llama.cpp cells are malformed (one cell moved to position INT32_MAX) is refused by
the join before llama.cpp sees it; the chain is removed (rejected_bad_state), the sequence is
verified empty, an idle session on the other sequence keeps its KV, the request runs cold
with the cold reply, later requests are fine and the next process meets no poisoned chunk.
In child processes, each with the process-wide cache on its own chunk directory."""

from __future__ import annotations

import textwrap

import pytest

from .test_cache_bad_state import (
    HEAD,
    SCENARIO,
    assert_next_process_restores_exact,
    assert_refused_removed_and_ran_cold,
    child,
)

pytestmark = pytest.mark.model

CHILD = HEAD + textwrap.dedent(r'''
    from workbench.cache.chunk_format import CHUNK_SUFFIX, encode_chunk, read_chunk

    wb.configure_cache([{"kind": "disk", "root": root, "budget_bytes": 2**30}], storage="chunks", chunk_size=16)
    SETTLE_BEFORE_LATER = True      # the refused run's cold prefill stores the prompt's chunks again
    KV_HEADER = struct.Struct("<8sHHIII16s")   # a KV chunk's header (docs/cache.md, "Chunked state")

    def cells(kv):
        """(offset, position) of each cell record of a KV chunk (no cell ext: pos, n_seq, seq id)."""
        magic, _v, flags, p0, n, layout, _key = KV_HEADER.unpack_from(kv, 0)
        assert magic == b"WBKVCHK\0" and not flags & 1, (magic, flags)
        base = KV_HEADER.size + layout
        return [(base + 12 * j, struct.unpack_from("<iI", kv, base + 12 * j)) for j in range(n)], p0

    def poison_stored():
        """Move the prompt's first chunk's last cell to INT32_MAX; the file's checksums are made anew."""
        (first,) = [c["key"] for c in wb.cache_chunks() if c["parent"] is None]
        path = Path(root) / f"{first}{CHUNK_SUFFIX}"
        meta, kv, _ = read_chunk(path)
        kv = bytearray(kv)
        found, p0 = cells(kv)
        assert [c for _, c in found] == [(p0 + j, 1) for j in range(len(found))], found[:4]
        struct.pack_into("<i", kv, found[-1][0], 2**31 - 1)
        os.unlink(path)
        path.write_bytes(encode_chunk(meta, bytes(kv)) + bytes(kv))
        read_chunk(path)                  # it verifies: only the join can tell
        return path

    def still_poisoned(path):
        return max(p for _, (p, _n) in cells(read_chunk(path)[1])[0]) >= 2**31 - 1
''') + SCENARIO


def test_a_chunk_with_a_malformed_cell_is_refused_removed_and_the_request_runs_cold(model_path, tmp_path):
    root = tmp_path / "chunks"
    first = child(CHILD, model_path, root, "first")
    cold = assert_refused_removed_and_ran_cold(first)
    assert [r["kind"] for r in first["later"]] == ["exact", "cold", "exact"]
    assert_next_process_restores_exact(child(CHILD, model_path, root, "second"), cold)
