"""SIGKILL during real engine work over chunk storage: the default model saving rows as
chunks and manifests to a directory with a small RAM copy budget and a small directory
budget (so chunks are written, shared, absorbed, promoted, demoted and evicted).

A writer child runs requests over a family of prompts that share a system prompt and is
killed with SIGKILL at a random moment (start-up scan, model load, prefill, a save between
its chunks and its manifest, an eviction). WORKBENCH_CHUNK_CRASH_KILLS kills (default 8).
Then a fresh process configures the same storage and checks what a user would meet:

* the scan rejects nothing (a kill leaves at worst a tmp file, a chunk no manifest names
  yet, or a parent whose children went: never a torn chunk or a manifest without chunks)
  and leaves no tmp file behind;
* every chunk file left verifies, payload included;
* every prompt whose row was adopted restores exactly and reproduces the cold greedy reply,
  and no restore is refused.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from crash_kills import REPO, child_env, kill_at_random, tmp_files

pytestmark = pytest.mark.model

KILLS = int(os.environ.get("WORKBENCH_CHUNK_CRASH_KILLS", "8"))
N_PROMPTS = 16

COMMON = textwrap.dedent(r'''
    import json, sys
    import workbench as wb

    model_path, root = sys.argv[1], sys.argv[2]
    TIERS = [{"kind": "ram", "budget_bytes": 4 << 20}, {"kind": "disk", "root": root, "budget_bytes": 16 << 20}]

    def prompt(i):
        return ("<|im_start|>system\nYou are a terse assistant. Answer with one number only.<|im_end|>\n"
                "<|im_start|>user\n" + f"Question {i}: what is {i} plus {i * 7 % 13}? " * (1 + i % 4)
                + "<|im_end|>\n<|im_start|>assistant\n")
''')

WRITER = COMMON + textwrap.dedent(r'''
    import random
    seed = int(sys.argv[3])
    print("ready", flush=True)  # a kill may land in the start-up scan or the model load too
    wb.configure_cache(TIERS, storage="chunks", chunk_size=32)
    m = wb.load_model(model_path=model_path, n_ctx=1024, n_seq_max=2, n_threads=1)
    rng = random.Random(seed)
    while True:
        wb.complete(m, prompt(rng.randrange(N_PROMPTS)), response_tokens=rng.randrange(1, 6))
''').replace("N_PROMPTS", str(N_PROMPTS))

CHECKER = COMMON + textwrap.dedent(r'''
    import os
    from pathlib import Path
    from workbench.cache.chunk_format import CHUNK_SUFFIX, read_chunk
    from workbench.cache.format import CorruptRow
    info = wb.configure_cache(TIERS, storage="chunks", chunk_size=32)
    out = {"scan_counters": {k: v for k, v in info["counters"].items() if k.startswith(("rejected", "orphans"))},
           "tmp_left": [n for n in os.listdir(root) if ".tmp." in n], "rows": info["rows"],
           "chunks": len(wb.cache_chunks())}
    bad = 0
    for path in Path(root).glob("*" + CHUNK_SUFFIX):
        try:
            read_chunk(path)
        except CorruptRow:
            bad += 1
    out["bad_chunk_files"] = bad
    m = wb.load_model(model_path=model_path, n_ctx=1024, n_seq_max=2, n_threads=1)
    checked = mismatched = not_exact = 0
    for i in range(N_PROMPTS):
        n = len(wb.tokenize(m, prompt(i))) - 1
        if wb.cached_prefix_len(m, prompt(i)) < n:
            continue  # not stored (never saved, evicted, or its save was killed)
        warm = wb.complete(m, prompt(i), response_tokens=5)
        cold = wb.complete(m, prompt(i), response_tokens=5, cache=False)
        checked += 1
        not_exact += warm.stats.cache_hit_kind != "exact"
        mismatched += warm.tokens != cold.tokens
    c = wb.counters()
    out.update(checked=checked, mismatched=mismatched, not_exact=not_exact,
               restore_failed=c.get("cache_restore_failed", 0),
               rejected_after_scan=c.get("cache_rejected_total", 0) - out["scan_counters"].get("rejected_total", 0))
    print(json.dumps(out))
''').replace("N_PROMPTS", str(N_PROMPTS))


def check(model_path: Path, root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHECKER, str(model_path), str(root)],
                          env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the checker died with {done.returncode}: {done.stderr[-3000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["scan_counters"].get("rejected_total", 0) == 0, out  # no torn chunk, no manifest without chunks
    assert out["tmp_left"] == [] and out["bad_chunk_files"] == 0, out
    assert out["rejected_after_scan"] == 0 and out["restore_failed"] == 0, out
    assert out["not_exact"] == 0 and out["mismatched"] == 0, out    # warm == cold, token for token
    return out


def test_sigkill_while_the_engine_saves_chunks(model_path, tmp_path):
    root = tmp_path / "chunks"
    rng = random.Random(int(os.environ.get("WORKBENCH_CRASH_SEED", "20261201")))
    for i in range(KILLS):
        early = i % 4 == 0  # mostly mid-work; some during start-up (the scan, the model load)
        status = kill_at_random(WRITER, [str(model_path), str(root), str(i)], rng,
                                min_delay_s=0.0 if early else 0.8, max_delay_s=0.8 if early else 2.5)
        assert status == -signal.SIGKILL, f"the writer died on its own with status {status}"
    left_by_kills = len(tmp_files(root))
    final = check(model_path, root)
    assert final["rows"] > 0 and final["checked"] > 0, final
    print(f"{KILLS} kills, {left_by_kills} tmp files left by the last kill; check: {final}")
