"""SIGKILL during real engine work: the default model saving rows to a shm and a disk tier.

A writer child loads the model with a small shm chunk tier over a disk tier (so chunks are
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

from crash_checks import CHILD_PRELUDE, assert_restart_clean, run_checker
from crash_kills import REPO, child_env, kill_at_random, tmp_files
from waiting import wait_for

from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX

pytestmark = pytest.mark.model

KILLS = int(os.environ.get("WORKBENCH_CRASH_KILLS", "25"))
CHECK_EVERY = 100
N_PROMPTS = 24

COMMON = CHILD_PRELUDE + textwrap.dedent(r'''
    import json
    import workbench as wb

    model_path, shm_root, disk_root = sys.argv[1], sys.argv[2], sys.argv[3]
    ROOTS = [shm_root, disk_root]
    TIERS = [{"kind": "shm", "root": shm_root, "budget_bytes": 6 << 20},
             {"kind": "disk", "root": disk_root, "budget_bytes": 48 << 20}]

    def prompt(i):
        return ("<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\n"
                f"Question {i}: what is {i} plus {i * 7 % 13}? Answer with one number." * (1 + i % 3)
                + "<|im_end|>\n<|im_start|>assistant\n")
''') + f"PROMPTS = [prompt(i) for i in range({N_PROMPTS})]\n"

@pytest.fixture
def tier_roots(tmp_path):
    """A shm root under /dev/shm (the real shared-memory file system) and a disk root."""
    if Path("/dev/shm").is_dir():
        shm = Path("/dev/shm") / f"workbench-{os.getuid()}" / f"crash-test-{uuid.uuid4().hex}"
    else:
        shm = tmp_path / "shm"
    yield shm, tmp_path / "disk"
    shutil.rmtree(shm, ignore_errors=True)


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


CHUNK_COMMON = COMMON + textwrap.dedent(r'''
    def configure():
        return wb.configure_cache(TIERS, storage="chunks", chunk_size=32)
''')

CHUNK_WRITER = CHUNK_COMMON + "cc.write_forever(model_path, configure, PROMPTS, seed=int(sys.argv[4]))\n"

CHUNK_CHECKER = CHUNK_COMMON + textwrap.dedent(r'''
    out = cc.scan_facts(configure(), ROOTS)
    out["chunks_by_tier"] = {t["name"]: t["chunks"] for t in wb.list_tiers()}
    out["bad_chunk_files"] = cc.bad_chunk_files(ROOTS)
    # a prompt counts when all its chunks are held (a finished turn is held whole: n + 1)
    out.update(cc.restores(model_path, PROMPTS, lambda cached, n: cached >= n, out["scan_counters"]))
    print(json.dumps(out))
''')


def check_chunks(model_path: Path, shm: Path, disk: Path) -> dict:
    out = run_checker(CHUNK_CHECKER, model_path, shm, disk)
    assert_restart_clean(out)
    assert out["bad_chunk_files"] == 0, out
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
    """Chunks written to the shm tier, demoted to the disk tier one at a time as shm fills,
    evicted from disk leaves first, manifests on disk; killed at random, then a fresh process
    re-adopts chains that span both tiers."""
    shm, disk = tier_roots
    run_until_both_tiers_hold_chunks(model_path, shm, disk)
    final = kill_and_check(CHUNK_WRITER, check_chunks, model_path, shm, disk, "20261202")
    assert final["chunks_by_tier"]["shm"] > 0 and final["chunks_by_tier"]["disk"] > 0, final  # chains span both
