"""A chunk file whose checksums verify but whose llama.cpp state is malformed (one cell moved
to position INT32_MAX) must not poison the sequence it is restored into, nor the next
process; in chunk storage (the prompt's first chunk) and in whole rows (the row's one chunk).
The join refuses it before llama.cpp sees it.

Before: the state was restored, every later request on that sequence failed with
DecodeFailed until the model was unloaded, and the file stayed for the next process. Now
the restore is refused (by the native check, or by the position check after it), the
sequence is verified empty, the row leaves every tier (counted as rejected_bad_state) and
the request runs cold. The case runs in child processes: each configures the process-wide
cache on its own tier directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
PROMPT = ("<|im_start|>system\nYou are a careful assistant.<|im_end|>\n<|im_start|>user\n"
          "Name three rivers in Europe and say where each one ends.<|im_end|>\n<|im_start|>assistant\n")

# the start of each variant's child: its arguments
HEAD = textwrap.dedent(r'''
    import json, os, struct, sys
    from pathlib import Path
    import workbench as wb

    model_path, root, phase, PROMPT = sys.argv[1:5]
''')

# the end of each variant's child, after it has configured the cache and defined
# poison_stored() (poison the stored prompt's first file; its path), still_poisoned(path)
# and SETTLE_BEFORE_LATER (wait for the refused run's saves before the later requests)
SCENARIO = textwrap.dedent(r'''
    m = wb.load_model(model_path=model_path, n_seq_max=2)

    def run(**kw):
        r = wb.complete(m, PROMPT, response_tokens=12, **kw)
        return {"tokens": list(r.tokens), "kind": r.stats.cache_hit_kind}

    def first_process():
        out = {"cold": run(cache=False), "saving": run()}
        assert wb.wait_for_saves()
        path = poison_stored()
        # an idle session holds the other sequence's KV: a refused restore must not touch it
        wb.complete(m, "Hello there, how are", session_id="s", response_tokens=2)
        out["restore"] = run()          # meets the poisoned file
        out["session_after"] = wb.complete(m, "Hello there, how are you today?", session_id="s",
                                           response_tokens=2).stats.cache_hit_kind
        c = wb.counters()
        out["rejected_bad_state"] = c.get("cache_rejected_bad_state", 0)
        out["restore_failed"] = c.get("cache_restore_failed", 0)
        out["not_cleared"] = c.get("cache_seq_not_cleared", 0)
        if SETTLE_BEFORE_LATER:
            assert wb.wait_for_saves()
        out["later"] = [run(), run(cache=False), run()]
        assert wb.wait_for_saves()
        out["file_after"] = "absent" if not path.exists() else "poisoned" if still_poisoned(path) else "resaved"
        return out

    def next_process():
        return {"next_process": run(), "rejected": wb.counters().get("cache_rejected_total", 0)}

    print(json.dumps(first_process() if phase == "first" else next_process()))
''')

def child(script: str, model_path: Path, root: Path, phase: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script, str(model_path), str(root), phase, PROMPT],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, f"the child died with {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_refused_removed_and_ran_cold(first: dict) -> list[int]:
    """The first process's figures; its cold reply."""
    cold = first["cold"]["tokens"]
    assert first["saving"]["tokens"] == cold
    assert first["restore"] == {"tokens": cold, "kind": "cold"}  # refused, ran cold, same reply
    assert first["rejected_bad_state"] == 1 and first["restore_failed"] == 1
    assert first["not_cleared"] == 0                               # the sequence was verified empty
    assert first["session_after"] == "sticky"                      # the other sequence's KV was kept
    assert [r["tokens"] for r in first["later"]] == [cold] * 3     # no DecodeFailed afterwards
    assert first["file_after"] != "poisoned"                      # the bad file is gone
    return cold


def assert_next_process_restores_exact(second: dict, cold: list[int]) -> None:
    """The next process meets no poisoned file: a clean exact restore of what was saved again."""
    assert second["next_process"] == {"tokens": cold, "kind": "exact"} and second["rejected"] == 0


CHILD = HEAD + textwrap.dedent(r'''
    from workbench.cache.chunk_format import CHUNK_SUFFIX, encode_chunk, read_chunk

    STORAGE = {"chunks": {"storage": "chunks", "chunk_size": 16}, "rows": {"storage": "rows"}}[phase.split("-")[1]]
    phase = phase.split("-")[0]
    wb.configure_cache([{"kind": "disk", "root": root, "budget_bytes": 2**30}], **STORAGE)
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


@pytest.mark.parametrize("storage", ["chunks", "rows"])
def test_a_chunk_with_a_malformed_cell_is_refused_removed_and_the_request_runs_cold(model_path, tmp_path, storage):
    root = tmp_path / storage
    first = child(CHILD, model_path, root, f"first-{storage}")
    cold = assert_refused_removed_and_ran_cold(first)
    assert [r["kind"] for r in first["later"]] == ["exact", "cold", "exact"]
    assert_next_process_restores_exact(child(CHILD, model_path, root, f"second-{storage}"), cold)
