"""A row file whose checksums verify but whose llama.cpp state is malformed (one cell moved to
position INT32_MAX) must not poison the sequence it is restored into, nor the next process.

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

CHILD = HEAD + textwrap.dedent(r'''
    from workbench.cache import store
    from workbench.cache.format import read_row

    wb.configure_cache([{"kind": "disk", "root": root, "budget_bytes": None}], storage="rows")
    SETTLE_BEFORE_LATER = False

    def cells(state):
        """(offset, position) of every cell of a one-stream llama.cpp sequence state."""
        magic, _seq, n_stream, n_cells = struct.unpack_from("<IiII", state, 0)
        assert (magic, n_stream) == (0xaf143cd8, 1), (magic, n_stream)
        off, out = 16, []
        for _ in range(n_cells):
            pos, n_seq = struct.unpack_from("<iI", state, off)
            out.append((off, pos))
            off += 8 + 4 * n_seq
        return out

    def poison_stored():
        """Move the last cell of the prompt's row to INT32_MAX and re-checksum the row file."""
        n = len(wb.tokenize(m, PROMPT)) - 1
        rows = [r for r in wb.cache_rows() if r["n_tokens"] == n]
        assert len(rows) == 1, wb.cache_rows()
        path = store.row_path(Path(root), rows[0]["key"])
        row = read_row(path)
        state = bytearray(row.payload)
        found = cells(state)
        assert [p for _, p in found] == list(range(row.meta.n_tokens)), found[:4]
        struct.pack_into("<i", state, found[-1][0], 2**31 - 1)
        os.unlink(path)
        store.publish_row(path.parent, row.meta, bytes(state))  # valid header and payload checksums
        return path

    def still_poisoned(path):
        return max(p for _, p in cells(read_row(path).payload)) >= 2**31 - 1
''') + SCENARIO


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


def test_a_row_with_a_malformed_state_is_refused_removed_and_the_request_runs_cold(model_path, tmp_path):
    root = tmp_path / "disk"
    cold = assert_refused_removed_and_ran_cold(child(CHILD, model_path, root, "first"))
    assert_next_process_restores_exact(child(CHILD, model_path, root, "second"), cold)
