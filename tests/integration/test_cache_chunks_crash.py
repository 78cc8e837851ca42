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

import os
import random
import signal
import textwrap
from pathlib import Path

import pytest
from crash_checks import CHILD_PRELUDE, assert_restart_clean, run_checker
from crash_kills import kill_at_random, tmp_files

pytestmark = pytest.mark.model

KILLS = int(os.environ.get("WORKBENCH_CHUNK_CRASH_KILLS", "8"))
N_PROMPTS = 16

COMMON = CHILD_PRELUDE + textwrap.dedent(r'''
    import json
    import workbench as wb

    model_path, root = sys.argv[1], sys.argv[2]
    TIERS = [{"kind": "ram", "budget_bytes": 4 << 20}, {"kind": "disk", "root": root, "budget_bytes": 16 << 20}]

    def configure():
        return wb.configure_cache(TIERS, storage="chunks", chunk_size=32)

    def prompt(i):
        return ("<|im_start|>system\nYou are a terse assistant. Answer with one number only.<|im_end|>\n"
                "<|im_start|>user\n" + f"Question {i}: what is {i} plus {i * 7 % 13}? " * (1 + i % 4)
                + "<|im_end|>\n<|im_start|>assistant\n")
''') + f"PROMPTS = [prompt(i) for i in range({N_PROMPTS})]\n"

WRITER = COMMON + "cc.write_forever(model_path, configure, PROMPTS, seed=int(sys.argv[3]))\n"

CHECKER = COMMON + textwrap.dedent(r'''
    out = cc.scan_facts(configure(), [root])
    out["chunks"] = len(wb.cache_chunks())
    out["bad_chunk_files"] = cc.bad_chunk_files([root])
    # a prompt counts when all its chunks are held (a finished turn is held whole: n + 1)
    out.update(cc.restores(model_path, PROMPTS, lambda cached, n: cached >= n, out["scan_counters"]))
    print(json.dumps(out))
''')


def check(model_path: Path, root: Path) -> dict:
    out = run_checker(CHECKER, model_path, root)
    assert_restart_clean(out)  # no torn chunk, no manifest without chunks, warm == cold
    assert out["bad_chunk_files"] == 0, out
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
