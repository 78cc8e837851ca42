"""test_cache_bad_state.py's poisoned cell in chunk storage: a chunk file whose checksums verify
but whose llama.cpp cells are malformed (one cell moved to position INT32_MAX) is refused by
the join before llama.cpp sees it; the chain is removed (rejected_bad_state), the sequence is
verified empty, an idle session on the other sequence keeps its KV, the request runs cold
with the cold reply, later requests are fine and the next process meets no poisoned chunk.
In child processes, each with the process-wide cache on its own chunk directory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .test_cache_bad_state import PROMPT, REPO

pytestmark = pytest.mark.model

CHILD = textwrap.dedent(r'''
    import json, os, struct, sys
    from pathlib import Path
    import workbench as wb
    from workbench.cache.chunk_format import CHUNK_SUFFIX, encode_chunk, read_chunk

    model_path, root, phase, PROMPT = sys.argv[1:5]
    wb.configure_cache([{"kind": "disk", "root": root, "budget_bytes": 2**30}], storage="chunks", chunk_size=16)
    m = wb.load_model(model_path=model_path, n_seq_max=2)
    out = {}
    KV_HEADER = struct.Struct("<8sHHIII16s")   # a KV chunk's header (docs/cache.md, "Chunked state")

    def run(**kw):
        r = wb.complete(m, PROMPT, response_tokens=12, **kw)
        return {"tokens": list(r.tokens), "kind": r.stats.cache_hit_kind}

    def cells(kv):
        """(offset, position) of each cell record of a KV chunk (no cell ext: pos, n_seq, seq id)."""
        magic, _v, flags, p0, n, layout, _key = KV_HEADER.unpack_from(kv, 0)
        assert magic == b"WBKVCHK\0" and not flags & 1, (magic, flags)
        base = KV_HEADER.size + layout
        return [(base + 12 * j, struct.unpack_from("<iI", kv, base + 12 * j)) for j in range(n)], p0

    def poison(path):
        """Move the chunk's last cell to INT32_MAX; the file's checksums are made anew."""
        meta, kv, _ = read_chunk(path)
        kv = bytearray(kv)
        found, p0 = cells(kv)
        assert [c for _, c in found] == [(p0 + j, 1) for j in range(len(found))], found[:4]
        struct.pack_into("<i", kv, found[-1][0], 2**31 - 1)
        os.unlink(path)
        path.write_bytes(encode_chunk(meta, bytes(kv)) + bytes(kv))
        read_chunk(path)                  # it verifies: only the join can tell

    if phase == "first":
        out["cold"] = run(cache=False)
        out["saving"] = run()
        assert wb.wait_for_saves()
        (first,) = [c["key"] for c in wb.cache_chunks() if c["parent"] is None]
        path = Path(root) / f"{first}{CHUNK_SUFFIX}"
        poison(path)
        # an idle session holds the other sequence's KV: a refused restore must not touch it
        wb.complete(m, "Hello there, how are", session_id="s", response_tokens=2)
        out["restore"] = run()          # meets the poisoned chunk
        out["session_after"] = wb.complete(m, "Hello there, how are you today?", session_id="s",
                                           response_tokens=2).stats.cache_hit_kind
        c = wb.counters()
        out["rejected_bad_state"] = c.get("cache_rejected_bad_state", 0)
        out["restore_failed"] = c.get("cache_restore_failed", 0)
        out["not_cleared"] = c.get("cache_seq_not_cleared", 0)
        assert wb.wait_for_saves()      # the cold run stored the prompt's chunks again
        out["later"] = [run(), run(cache=False), run()]
        assert wb.wait_for_saves()
        out["file_after"] = "absent" if not path.exists() else (
            "poisoned" if max(p for _, (p, _n) in cells(read_chunk(path)[1])[0]) >= 2**31 - 1 else "resaved")
    else:
        out["next_process"] = run()
        out["rejected"] = wb.counters().get("cache_rejected_total", 0)
    print(json.dumps(out))
''')


def child(model_path: Path, root: Path, phase: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(model_path), str(root), phase, PROMPT],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, f"the child died with {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_chunk_with_a_malformed_cell_is_refused_removed_and_the_request_runs_cold(model_path, tmp_path):
    root = tmp_path / "chunks"
    first = child(model_path, root, "first")
    cold = first["cold"]["tokens"]
    assert first["saving"]["tokens"] == cold
    assert first["restore"] == {"tokens": cold, "kind": "cold"}  # refused, ran cold, same reply
    assert first["rejected_bad_state"] == 1 and first["restore_failed"] == 1
    assert first["not_cleared"] == 0                               # the sequence was verified empty
    assert first["session_after"] == "sticky"                      # the other sequence's KV was kept
    assert [r["tokens"] for r in first["later"]] == [cold] * 3     # no DecodeFailed afterwards
    assert [r["kind"] for r in first["later"]] == ["exact", "cold", "exact"]
    assert first["file_after"] != "poisoned"                      # the bad chunk is gone
    second = child(model_path, root, "second")
    assert second["next_process"] == {"tokens": cold, "kind": "exact"} and second["rejected"] == 0
