"""The writer and checker children of the engine SIGKILL tests (tests/integration/
test_crash_engine.py, test_cache_chunks_crash.py), and the test process's side of a check.

Each test's child script starts with CHILD_PRELUDE and imports this module, so the writers
share one request loop and the checkers one way of reading the scan and of comparing each
adopted prompt's warm reply with its cold one; the script itself says only what differs
(the tiers, the storage, the prompts, what else it checks). In the test process,
`run_checker` runs a checker and `assert_restart_clean` asserts what every variant requires.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from crash_kills import REPO, child_env

# the first lines of a child script: make this folder importable (the child runs from REPO)
CHILD_PRELUDE = f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\nimport crash_checks as cc\n"


# --- run inside the children -------------------------------------------------------------

def load_small(model_path: str) -> str:
    """The children's model: the default model with 1024 tokens of context, 2 sequences, 1 thread."""
    import workbench as wb

    return wb.load_model(model_path=model_path, n_ctx=1024, n_seq_max=2, n_threads=1)


def write_forever(model_path: str, configure: Callable[[], object], prompts: Sequence[str], seed: int) -> None:
    """A writer's life until its SIGKILL: say `ready` first (so a kill may land in the start-up
    scan or the model load too), configure the cache, load the model, then run requests over
    `prompts` in an order drawn from `seed`, with 1 to 5 reply tokens each."""
    import workbench as wb

    print("ready", flush=True)
    configure()
    m = load_small(model_path)
    rng = random.Random(seed)
    while True:
        wb.complete(m, prompts[rng.randrange(len(prompts))], response_tokens=rng.randrange(1, 6))


def scan_facts(info: dict, roots: Sequence[str]) -> dict:
    """What configure_cache's start-up scan reported (rejections, orphans removed), the tmp
    files it left under the tier directories `roots`, and how many rows it adopted."""
    return {"scan_counters": {k: v for k, v in info["counters"].items() if k.startswith(("rejected", "orphans"))},
            "tmp_left": [n for r in roots for n in os.listdir(r) if ".tmp." in n],
            "rows": info["rows"]}


def bad_chunk_files(roots: Sequence[str]) -> int:
    """How many chunk files under `roots` fail to verify (header, key recomputed, payload checksum)."""
    from workbench.cache.chunk_format import CHUNK_SUFFIX, read_chunk
    from workbench.cache.format import CorruptRow

    bad = 0
    for root in roots:
        for path in Path(root).glob("*" + CHUNK_SUFFIX):
            try:
                read_chunk(path)
            except CorruptRow:
                bad += 1
    return bad


def restores(model_path: str, prompts: Sequence[str], stored: Callable[[int, int], bool],
             scan_counters: dict) -> dict:
    """Every prompt the cache holds (`stored(cached_prefix_len, n)`, n its tokens but the last)
    answered warm and cold, 5 greedy tokens each: how many were checked, how many replies
    differed, how many warm runs were not exact hits; then the restores llama.cpp refused and
    the rows rejected since the scan (`scan_counters`: what the scan itself rejected)."""
    import workbench as wb

    m = load_small(model_path)
    checked = mismatched = not_exact = 0
    for text in prompts:
        if not stored(wb.cached_prefix_len(m, text), len(wb.tokenize(m, text)) - 1):
            continue  # not stored (never saved, evicted, or its save was killed)
        warm = wb.complete(m, text, response_tokens=5)
        cold = wb.complete(m, text, response_tokens=5, cache=False)
        checked += 1
        not_exact += warm.stats.cache_hit_kind != "exact"
        mismatched += warm.tokens != cold.tokens
    c = wb.counters()
    return {"checked": checked, "mismatched": mismatched, "not_exact": not_exact,
            "restore_failed": c.get("cache_restore_failed", 0),
            "rejected_after_scan": c.get("cache_rejected_total", 0) - scan_counters.get("rejected_total", 0)}


# --- run in the test process -------------------------------------------------------------

def run_checker(script: str, *args: object) -> dict:
    """Run a checker child (`python -c script *args`) to its end; the JSON of its last line."""
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)],
                          env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the checker died with {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_restart_clean(out: dict) -> None:
    """What a user meets in a fresh process after the kills, in any storage."""
    assert out["scan_counters"].get("rejected_total", 0) == 0, out  # nothing torn was ever published
    assert out["tmp_left"] == [], out
    assert out["rejected_after_scan"] == 0 and out["restore_failed"] == 0, out
    assert out["not_exact"] == 0 and out["mismatched"] == 0, out    # warm == cold, token for token
