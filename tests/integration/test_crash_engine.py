"""SIGKILL during real engine work: the default model saving rows to a shm and a disk tier.

A writer child loads the model with a small shm tier over a disk tier (so rows are
demoted, promoted and evicted as well as published), runs requests over a family of
prompts, and is killed with SIGKILL at a random moment: during its start-up scan, a
prefill, a save, a demotion. WORKBENCH_CRASH_KILLS kills (default 25; `make crash-test`
runs 500). Then, and every 100 kills, a fresh process configures the same tiers and
checks what a user would meet:

* the start-up scan rejects nothing (a kill leaves at worst a tmp file, never a torn row)
  and leaves no tmp file behind;
* every adopted row's payload verifies when it is read (0 corrupt rows served);
* every adopted prompt row restores exactly and reproduces the cold greedy reply, and no
  restore is refused by llama.cpp.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from crash_kills import REPO, child_env, kill_at_random, tmp_files
from waiting import wait_for

from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX

pytestmark = pytest.mark.model

KILLS = int(os.environ.get("WORKBENCH_CRASH_KILLS", "25"))
CHECK_EVERY = 100
N_PROMPTS = 24

COMMON = textwrap.dedent(r'''
    import json, sys
    import workbench as wb

    model_path, shm_root, disk_root = sys.argv[1], sys.argv[2], sys.argv[3]
    TIERS = [{"kind": "shm", "root": shm_root, "budget_bytes": 6 << 20},
             {"kind": "disk", "root": disk_root, "budget_bytes": 48 << 20}]

    def prompt(i):
        return ("<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\n"
                f"Question {i}: what is {i} plus {i * 7 % 13}? Answer with one number." * (1 + i % 3)
                + "<|im_end|>\n<|im_start|>assistant\n")
''')

WRITER = COMMON + textwrap.dedent(r'''
    import random
    seed = int(sys.argv[4])
    print("ready", flush=True)  # a kill may land in the start-up scan or the model load too
    wb.configure_cache(TIERS, storage="rows")
    m = wb.load_model(model_path=model_path, n_ctx=1024, n_seq_max=2, n_threads=1)
    rng = random.Random(seed)
    while True:
        wb.complete(m, prompt(rng.randrange(N_PROMPTS)), response_tokens=rng.randrange(1, 6))
''').replace("N_PROMPTS", str(N_PROMPTS))

CHECKER = COMMON + textwrap.dedent(r'''
    import os
    from workbench.cache.shared import shared_cache
    info = wb.configure_cache(TIERS, storage="rows")
    out = {"scan_counters": {k: v for k, v in info["counters"].items() if k.startswith(("rejected", "orphans"))},
           "tmp_left": [n for r in (shm_root, disk_root) for n in os.listdir(r) if ".tmp." in n],
           "rows": info["rows"]}
    cache = shared_cache()
    out["unreadable"] = sum(cache.get(key, promote=False) is None for key in cache.keys())
    m = wb.load_model(model_path=model_path, n_ctx=1024, n_seq_max=2, n_threads=1)
    by_len = {}
    for r in wb.cache_rows():
        by_len.setdefault(r["n_tokens"], []).append(r["key"])
    checked = mismatched = not_exact = 0
    for i in range(N_PROMPTS):
        n = len(wb.tokenize(m, prompt(i))) - 1
        if wb.cached_prefix_len(m, prompt(i)) != n:
            continue  # no row for this prompt (never saved, evicted, or its save was killed)
        warm = wb.complete(m, prompt(i), response_tokens=5)
        cold = wb.complete(m, prompt(i), response_tokens=5, cache=False)
        checked += 1
        not_exact += warm.stats.cache_hit_kind != "exact"
        mismatched += warm.tokens != cold.tokens
    c = wb.counters()
    out.update(checked=checked, mismatched=mismatched, not_exact=not_exact,
               restore_failed=c.get("cache_restore_failed", 0),
               rejected_at_read=c.get("cache_rejected_total", 0) - sum(
                   v for k, v in out["scan_counters"].items() if k == "rejected_total"))
    print(json.dumps(out))
''').replace("N_PROMPTS", str(N_PROMPTS))


@pytest.fixture
def tier_roots(tmp_path):
    """A shm root under /dev/shm (the real shared-memory file system) and a disk root."""
    if Path("/dev/shm").is_dir():
        shm = Path("/dev/shm") / f"workbench-{os.getuid()}" / f"crash-test-{uuid.uuid4().hex}"
    else:
        shm = tmp_path / "shm"
    yield shm, tmp_path / "disk"
    shutil.rmtree(shm, ignore_errors=True)


def check(model_path: Path, shm: Path, disk: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHECKER, str(model_path), str(shm), str(disk)],
                          env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the checker died with {done.returncode}: {done.stderr[-3000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["scan_counters"].get("rejected_total", 0) == 0, out  # no torn row was ever published
    assert out["tmp_left"] == [], out
    assert out["unreadable"] == 0, out                              # every adopted payload verifies
    assert out["rejected_at_read"] == 0 and out["restore_failed"] == 0, out
    assert out["not_exact"] == 0 and out["mismatched"] == 0, out    # warm == cold, token for token
    return out


def kill_and_check(writer: str, check_fn, model_path, shm, disk, default_seed: str) -> dict:
    """KILLS SIGKILLs of `writer` at random moments (one in five during start-up: the scan,
    the model load; the rest mid-work), `check_fn` every CHECK_EVERY kills and at the end;
    the last check's figures."""
    rng = random.Random(int(os.environ.get("WORKBENCH_CRASH_SEED", default_seed)))
    start = time.monotonic()
    results = []
    tmp_seen = 0  # tmp files present right after a kill (each removed by the next scan)
    for i in range(KILLS):
        early = i % 5 == 0
        status = kill_at_random(writer, [str(model_path), str(shm), str(disk), str(i)], rng,
                                min_delay_s=0.0 if early else 0.6, max_delay_s=0.6 if early else 2.2)
        assert status == -signal.SIGKILL, f"the writer died on its own with status {status}"
        tmp_seen += len(tmp_files(shm, disk))
        if (i + 1) % CHECK_EVERY == 0 and i + 1 < KILLS:
            results.append(check_fn(model_path, shm, disk))
    results.append(check_fn(model_path, shm, disk))
    final = results[-1]
    assert final["rows"] > 0 and final["checked"] > 0, final
    print(f"{KILLS} kills in {time.monotonic() - start:.0f} s, {tmp_seen} tmp files left by kills; "
          f"last check: {final}")
    return final


def test_sigkill_while_the_engine_saves_to_shm_and_disk(model_path, tier_roots):
    shm, disk = tier_roots
    kill_and_check(WRITER, check, model_path, shm, disk, "20240610")


# --- the same over chunk storage: shm and disk chunk tiers ---------------------------------

CHUNK_COMMON = COMMON + textwrap.dedent(r'''
    def configure():
        return wb.configure_cache(TIERS, storage="chunks", chunk_size=32)
''')

CHUNK_WRITER = CHUNK_COMMON + textwrap.dedent(r'''
    import random
    seed = int(sys.argv[4])
    print("ready", flush=True)  # a kill may land in the start-up scan or the model load too
    configure()
    m = wb.load_model(model_path=model_path, n_ctx=1024, n_seq_max=2, n_threads=1)
    rng = random.Random(seed)
    while True:
        wb.complete(m, prompt(rng.randrange(N_PROMPTS)), response_tokens=rng.randrange(1, 6))
''').replace("N_PROMPTS", str(N_PROMPTS))

CHUNK_CHECKER = CHUNK_COMMON + textwrap.dedent(r'''
    import os
    from pathlib import Path
    from workbench.cache.chunk_format import CHUNK_SUFFIX, read_chunk
    from workbench.cache.format import CorruptRow
    info = configure()
    out = {"scan_counters": {k: v for k, v in info["counters"].items() if k.startswith(("rejected", "orphans"))},
           "tmp_left": [n for r in (shm_root, disk_root) for n in os.listdir(r) if ".tmp." in n],
           "rows": info["rows"], "chunks_by_tier": {t["name"]: t["chunks"] for t in wb.list_tiers()}}
    bad = 0
    for root in (shm_root, disk_root):
        for path in Path(root).glob("*" + CHUNK_SUFFIX):
            try:
                read_chunk(path)      # header, key recomputed, payload checksum
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
               rejected_at_read=c.get("cache_rejected_total", 0) - out["scan_counters"].get("rejected_total", 0))
    print(json.dumps(out))
''').replace("N_PROMPTS", str(N_PROMPTS))


def check_chunks(model_path: Path, shm: Path, disk: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHUNK_CHECKER, str(model_path), str(shm), str(disk)],
                          env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the checker died with {done.returncode}: {done.stderr[-3000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["scan_counters"].get("rejected_total", 0) == 0, out  # no torn chunk, no manifest without chunks
    assert out["tmp_left"] == [] and out["bad_chunk_files"] == 0, out
    assert out["rejected_at_read"] == 0 and out["restore_failed"] == 0, out
    assert out["not_exact"] == 0 and out["mismatched"] == 0, out    # warm == cold, token for token
    return out


def run_until_both_tiers_hold_chunks(model_path: Path, shm: Path, disk: Path) -> None:
    """A first writer, killed only once it has stored rows and shm has demoted chunks to disk
    (on a loaded machine every random kill could land before the first save)."""
    child = subprocess.Popen([sys.executable, "-c", CHUNK_WRITER, str(model_path), str(shm), str(disk), "-1"],
                             env=child_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        stored = wait_for(lambda: any(disk.glob(f"*{CHUNK_SUFFIX}")) and any(disk.glob(f"*{MANIFEST_SUFFIX}"))
                          and any(shm.glob(f"*{CHUNK_SUFFIX}")), timeout=300, interval=0.2)
        assert stored and child.poll() is None, "the first writer stored nothing in both tiers"
    finally:
        child.kill()
        child.wait()


def test_sigkill_while_the_engine_saves_chunks_to_shm_and_disk(model_path, tier_roots):
    """As the row variant, in chunk storage: chunks written to the shm tier, demoted to the
    disk tier one at a time as shm fills, evicted from disk leaves first, manifests on disk;
    killed at random, then a fresh process re-adopts chains that span both tiers."""
    shm, disk = tier_roots
    run_until_both_tiers_hold_chunks(model_path, shm, disk)
    final = kill_and_check(CHUNK_WRITER, check_chunks, model_path, shm, disk, "20261202")
    assert final["chunks_by_tier"]["shm"] > 0 and final["chunks_by_tier"]["disk"] > 0, final  # chains span both
