"""The KV prefix cache through the engine: warm restores are token-exact, per tier."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import workbench as wb

pytestmark = pytest.mark.model

SYSTEM = ("<|im_start|>system\nYou are a careful assistant. Answer in one short sentence and never "
          "invent facts.<|im_end|>\n")
PROMPT = SYSTEM + "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def cache_tiers(tmp_path):
    """Install a cache made of the given tiers for one test, then the default one again."""
    def install(*specs: dict) -> None:
        wb.configure_cache([dict(s, root=str(tmp_path / s["kind"])) if s["kind"] != "ram" else s
                            for s in specs])
    yield install
    wb.configure_cache([{"kind": "ram"}])


@pytest.mark.parametrize("kind", ["ram", "shm", "disk"])
def test_warm_restore_is_token_exact_per_tier(model, cache_tiers, kind):
    if kind == "shm" and not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    cache_tiers({"kind": kind, "budget_bytes": 512 * 2**20})
    long_prompt = PROMPT + "Explain it step by step. " * 60       # ~350 tokens
    cold = wb.complete(model, long_prompt, response_tokens=32, cache=False)
    first = wb.complete(model, long_prompt, response_tokens=32)    # cold, saves rows
    assert first.stats.cache_hit_kind == "cold" and first.tokens == cold.tokens
    warm = wb.complete(model, long_prompt, response_tokens=32)
    assert warm.stats.cache_hit_kind == "exact" and warm.stats.cache_delta["read"] == 1
    assert warm.stats.prefilled_tokens == 1
    assert warm.tokens == cold.tokens                                # the invariant that matters most
    tiers = {t["name"]: t for t in wb.list_tiers()}
    assert tiers[kind]["rows"] >= 2
    longer = wb.complete(model, long_prompt + "<|im_end|>", response_tokens=16)
    assert longer.stats.cache_hit_kind == "partial"
    assert longer.tokens == wb.complete(model, long_prompt + "<|im_end|>", response_tokens=16, cache=False).tokens


def test_scopes_never_share_rows(model):
    wb.complete(model, PROMPT, response_tokens=4, cache_scope="tenant-a")
    assert wb.complete(model, PROMPT, response_tokens=4, cache_scope="tenant-a").stats.cache_hit_kind == "exact"
    other = wb.complete(model, PROMPT + " ", response_tokens=4, cache_scope="tenant-b")
    assert other.stats.cache_hit_kind == "cold"
    assert wb.cached_prefix_len(model, PROMPT, cache_scope="tenant-c") == 0
    assert wb.cached_prefix_len(model, PROMPT, cache_scope="tenant-a") == len(wb.tokenize(model, PROMPT))


def test_multi_turn_text_chat_hits_at_least_the_previous_prompt(model):
    turn1 = SYSTEM + "<|im_start|>user\nName a red fruit.<|im_end|>\n<|im_start|>assistant\n"
    r1 = wb.complete(model, turn1, response_tokens=24)
    turn2 = turn1 + r1.reply + "<|im_end|>\n<|im_start|>user\nAnd a yellow one?<|im_end|>\n<|im_start|>assistant\n"
    r2 = wb.complete(model, turn2, response_tokens=24)
    assert r2.stats.cache_hit_kind == "partial"
    reused = r2.stats.prompt_tokens - r2.stats.prefilled_tokens
    assert reused >= len(wb.tokenize(model, turn1))
    assert r2.tokens == wb.complete(model, turn2, response_tokens=24, cache=False).tokens


def test_prefill_only_parent_key_and_agent_prefix(model):
    tools = SYSTEM + "Tools: search(query), calculator(expression), weather(city).\n" * 8
    n_prefix = len(wb.tokenize(model, tools))
    warm = wb.prefill_only(model, tools, prefix_checkpoint_len=n_prefix)
    assert warm.tokens == () and warm.finish_key is not None
    assert wb.cached_prefix_len(model, tools + "<|im_start|>user\nhi") == n_prefix
    rows = {r["key"]: r for r in wb.cache_rows()}
    assert rows[warm.finish_key]["reason"] == "agent_prefix" and rows[warm.finish_key]["pinned"]
    task = tools + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    r = wb.complete(model, task, response_tokens=8, parent_key=warm.finish_key)
    assert r.stats.cache_hit_kind == "exact" and r.stats.prefilled_tokens == r.stats.prompt_tokens - n_prefix
    # churn: evicting everything unpinned leaves the agent prefix
    wb.evict_bytes(2**40)
    assert warm.finish_key in {r["key"] for r in wb.cache_rows()} or wb.list_tiers()[0]["rows"] == 0


@pytest.mark.load(n_seq_max=2)
def test_evict_saves_sessions_and_they_come_back_warm(fresh_model):
    m = fresh_model
    r1 = wb.complete(m, PROMPT, session_id="s", response_tokens=12)
    assert wb.model_info(m)["pinned_idle_seqs"] == 1
    assert wb.evict(m) == 1
    assert wb.model_info(m)["pinned_idle_seqs"] == 0 and wb.model_info(m)["available_seqs"] == 2
    turn2 = PROMPT + r1.reply + "<|im_end|>\n<|im_start|>user\nIn Fahrenheit?<|im_end|>\n<|im_start|>assistant\n"
    r2 = wb.complete(m, turn2, session_id="s", response_tokens=12)
    assert r2.stats.cache_hit_kind == "partial"
    assert r2.tokens == wb.complete(m, turn2, response_tokens=12, cache=False).tokens


SCRIPT = textwrap.dedent("""
    import json, sys
    import workbench as wb
    wb.configure_cache([{"kind": "disk", "root": sys.argv[1], "budget_bytes": 2**30}])
    m = wb.load_model(model_path=sys.argv[2])
    r = wb.prefill_only(m, sys.argv[3]) if sys.argv[4] == "save" else wb.complete(m, sys.argv[3], response_tokens=16)
    print(json.dumps({"kind": r.stats.cache_hit_kind, "tokens": list(r.tokens),
                      "rejected": wb.counters().get("cache_rejected_total", 0)}))
""")


def _run(root: Path, model_path: Path, prompt: str, mode: str) -> dict:
    import json

    out = subprocess.run([sys.executable, "-c", SCRIPT, str(root), str(model_path), prompt, mode],
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_disk_rows_survive_a_restart_and_corrupt_ones_are_rejected(tmp_path, model_path, model):
    root = tmp_path / "kv"
    _run(root, model_path, PROMPT, "save")                      # process 1 saves and exits
    files = sorted(root.rglob("*.kv"))
    assert files and all(oct(f.stat().st_mode & 0o777) == "0o600" for f in files)
    warm = _run(root, model_path, PROMPT, "complete")           # process 2 adopts the row
    assert warm["kind"] == "exact" and warm["rejected"] == 0
    assert warm["tokens"] == list(wb.complete(model, PROMPT, response_tokens=16, cache=False).tokens)
    # flip one payload bit: the next start-up rejects, counts and removes the file
    data = bytearray(files[0].read_bytes())
    data[-100] ^= 0x01
    files[0].write_bytes(bytes(data))
    again = _run(root, model_path, PROMPT, "complete")
    assert again["rejected"] == 1 and again["kind"] == "cold"
    assert not files[0].exists() or files[0].read_bytes() != bytes(data)
    assert os.listdir(root) is not None
