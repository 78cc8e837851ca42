"""The KV prefix cache through the engine: warm restores are token-exact, per tier."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import workbench as wb
from workbench.errors import InvalidOption

pytestmark = pytest.mark.model

SYSTEM = ("<|im_start|>system\nYou are a careful assistant. Answer in one short sentence and never "
          "invent facts.<|im_end|>\n")
PROMPT = (SYSTEM + "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n"
          "<|im_start|>assistant\n")


def chunked() -> bool:
    return wb.cache_info().get("storage") == "chunks"


def unprotected_bytes() -> int:
    """What evicting every row that is neither pinned nor live frees: their bytes with whole
    rows; in chunk storage the unprotected chunks' (a row's bytes count shared chunks again)."""
    if chunked():
        return sum(c["size_bytes"] for c in wb.cache_chunks() if not c["protected"])
    return sum(r["bytes"] for r in wb.cache_rows() if not r["pinned"] and not r["live"])


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
    assert wb.wait_for_saves()                                      # written off the decode path
    assert first.stats.cache_hit_kind == "cold" and first.tokens == cold.tokens
    warm = wb.complete(model, long_prompt, response_tokens=32)
    assert warm.stats.cache_hit_kind == "exact" and warm.stats.prefilled_tokens == 1
    assert warm.stats.cache_delta["read"] == warm.stats.prompt_tokens - 1  # tokens restored
    assert warm.tokens == cold.tokens                                # the invariant that matters most
    tiers = {t["name"]: t for t in wb.list_tiers()}
    assert tiers[kind]["rows"] >= 1
    # no finish row: the reply's KV (and the prompt's last token) came from one-row decodes,
    # not what a cold prefill computes (docs/architecture.md, "Warm equals cold"), so the
    # prompt row (one token short of the old prompt) serves a longer prompt: partial
    assert first.finish_key == warm.finish_key
    assert max(r["n_tokens"] for r in wb.cache_rows()) == first.stats.prompt_tokens - 1
    longer = wb.complete(model, long_prompt + "<|im_end|>", response_tokens=16)
    assert longer.stats.cache_hit_kind == "partial" and longer.stats.prefilled_tokens == 2
    assert longer.tokens == wb.complete(model, long_prompt + "<|im_end|>", response_tokens=16, cache=False).tokens


TOPICS = ("the water cycle", "how a bicycle gear works", "why the sky is blue")


@pytest.mark.parametrize("topic", TOPICS)
def test_warm_restore_is_token_exact_for_a_multi_chunk_prompt(model, topic):
    """~1,000 tokens: the cold prefill runs in several 512-token chunks. Cold and warm both
    decode the last prompt token alone (llama.cpp's CPU kernels are not batch-invariant, so
    computing it inside a chunk in one run and alone in the other can change the reply)."""
    facts = " ".join(f"Fact {i}: {topic} matters in case {i * 7 % 13}." for i in range(70))
    prompt = (SYSTEM + f"<|im_start|>user\n{facts}\nSummarise {topic} in two sentences.<|im_end|>\n"
              "<|im_start|>assistant\n")
    n = len(wb.tokenize(model, prompt))
    assert 900 < n < 1500
    scope = f"multi-chunk-{topic}"
    cold = wb.complete(model, prompt, response_tokens=24, cache=False)
    first = wb.complete(model, prompt, response_tokens=24, cache_scope=scope)
    assert wb.wait_for_saves()
    assert first.stats.cache_hit_kind == "cold" and first.tokens == cold.tokens
    assert wb.cached_prefix_len(model, prompt, cache_scope=scope) >= n - 1
    warm = wb.complete(model, prompt, response_tokens=24, cache_scope=scope)
    assert warm.stats.cache_hit_kind == "exact" and warm.stats.prefilled_tokens == 1
    assert warm.tokens == cold.tokens


def test_parent_key_right_after_the_turn_is_exact(model, cache_tiers):
    """An agent loop resumes from the previous turn's finish_key at once (in the default
    mode the row of its prompt); that row may still be in the writer pool (a disk tier:
    fsync), so admission waits for it, briefly."""
    cache_tiers({"kind": "disk", "budget_bytes": 512 * 2**20})
    turn = PROMPT
    for step in range(3):
        r = wb.complete(model, turn, response_tokens=8, cache_scope="agent-loop")
        turn = turn + r.reply + f"<|im_end|>\n<|im_start|>user\nStep {step}: go on.<|im_end|>\n<|im_start|>assistant\n"
        nxt = wb.complete(model, turn, response_tokens=1, parent_key=r.finish_key, cache_scope="agent-loop")
        assert nxt.stats.cache_hit_kind == "exact"
        assert nxt.stats.cache_delta["read"] == nxt.stats.prompt_tokens - nxt.stats.prefilled_tokens > 0


@pytest.mark.load(cold_checkpoint_interval=128, cold_min_tokens=200, cold_max_tokens=400)
def test_cold_checkpoints_stay_inside_the_band(fresh_model):
    facts = " ".join(f"Fact {i}: tides follow the moon in case {i}." for i in range(45))
    prompt = SYSTEM + f"<|im_start|>user\n{facts}<|im_end|>\n<|im_start|>assistant\n"
    n = len(wb.tokenize(fresh_model, prompt))
    assert n > 520
    before = {r["key"] for r in wb.cache_rows()}
    wb.prefill_only(fresh_model, prompt, cache_scope="band")
    saved = sorted((r["n_tokens"], r["reason"]) for r in wb.cache_rows() if r["key"] not in before)
    # checkpoints every 128 tokens, but only at 200..400; then the prompt without its last token
    assert saved == [(256, "cold"), (384, "cold"), (n - 1, "cold")]


def test_scopes_never_share_rows(model):
    wb.complete(model, PROMPT, response_tokens=4, cache_scope="tenant-a")
    assert wb.wait_for_saves()                     # rows are written off the decode path
    assert wb.complete(model, PROMPT, response_tokens=4, cache_scope="tenant-a").stats.cache_hit_kind == "exact"
    other = wb.complete(model, PROMPT + " ", response_tokens=4, cache_scope="tenant-b")
    assert other.stats.cache_hit_kind == "cold"
    assert wb.cached_prefix_len(model, PROMPT, cache_scope="tenant-c") == 0
    # the prompt row stops before the last prompt token (decoded alone, cold and warm alike)
    n = len(wb.tokenize(model, PROMPT))
    assert wb.cached_prefix_len(model, PROMPT, cache_scope="tenant-a") == n - 1


@pytest.mark.load(deterministic=True)
def test_multi_turn_text_chat_hits_at_least_the_previous_prompt(fresh_model):
    """The second turn restores the first turn's finish row, generated tokens included. Their
    KV was computed by one-row decodes, which a cold prefill of the same text computes as
    prompt rows on another attention kernel: the reply equals the cold one for certain only
    in deterministic mode (docs/architecture.md, "Warm equals cold")."""
    model = fresh_model
    turn1 = SYSTEM + "<|im_start|>user\nName a red fruit.<|im_end|>\n<|im_start|>assistant\n"
    r1 = wb.complete(model, turn1, response_tokens=24)
    assert wb.wait_for_saves()
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
    # a prefix that is the whole prompt is pinned without its last token, decoded alone (by
    # the row kernel, where a task's prefill computes it as a prompt row): docs/cache.md
    stored = n_prefix - 1
    assert wb.cached_prefix_len(model, tools + "<|im_start|>user\nhi") == stored
    rows = {r["key"]: r for r in wb.cache_rows()}
    assert rows[warm.finish_key]["reason"] == "agent_prefix" and rows[warm.finish_key]["pinned"]
    assert rows[warm.finish_key]["n_tokens"] == stored
    task = tools + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    r = wb.complete(model, task, response_tokens=8, parent_key=warm.finish_key)
    assert r.stats.cache_hit_kind == "exact" and r.stats.prefilled_tokens == r.stats.prompt_tokens - stored
    assert r.tokens == wb.complete(model, task, response_tokens=8, cache=False).tokens
    # churn: evicting every byte of the unprotected rows leaves the pinned agent prefix
    assert wb.wait_for_saves()                     # the task's finish row is written off the decode path
    ordinary = unprotected_bytes()
    assert ordinary > 0 and wb.evict_bytes(ordinary) >= ordinary
    left = {r["key"]: r for r in wb.cache_rows()}
    assert warm.finish_key in left
    if chunked():   # rows inside the pinned chain (the prefix's own prompt row) stay with it
        assert all(c["protected"] for c in wb.cache_chunks())
    else:
        assert all(r["pinned"] or r["live"] for r in left.values())


@pytest.mark.load(n_seq_max=2, deterministic=True)   # the partial hit restores generated tokens' KV
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


@pytest.mark.load(n_seq_max=2)
def test_a_session_keeps_its_kv_in_an_own_row_no_other_request_finds(fresh_model):
    """In the default mode a session's KV past its first prompt came from decodes (its
    replies, and the turns prefilled over them): no shared row holds it, but each turn saves
    it as the session's own row, which only that session restores. After ``evict`` its next
    turn continues its KV (sticky, nothing prefilled but the new message); another request
    with the same text finds only the shared rows (docs/architecture.md, "Warm equals cold")."""
    m, scope = fresh_model, "session-own-row"
    before = wb.counters()["cache_saves_not_cold"]
    r1 = wb.complete(m, PROMPT, session_id="s", response_tokens=12, cache_scope=scope)
    turn2 = PROMPT + r1.reply + "<|im_end|>\n<|im_start|>user\nIn Fahrenheit?<|im_end|>\n<|im_start|>assistant\n"
    r2 = wb.complete(m, turn2, session_id="s", response_tokens=12, cache_scope=scope)
    assert r2.stats.cache_hit_kind == "sticky" and r2.finish_key is None   # no shared row holds this turn
    assert wb.wait_for_saves()
    rows = {r["n_tokens"]: r for r in wb.cache_rows()}
    (held,) = [s["tokens"] for s in wb.sessions(m, cache_scope=scope)]   # the session's KV
    # the first prompt's shared row, and the session's newest own row, live (the first gone)
    assert sorted(rows) == [r1.stats.prompt_tokens - 1, held] and rows[held]["live"]
    assert not rows[r1.stats.prompt_tokens - 1]["live"]
    assert wb.counters()["cache_saves_not_cold"] - before == 2      # two finish rows not shared
    # another request with the session's very text: only the KV of the first prompt serves it,
    # copied from the idle session's live KV (engine/live_share.py) as far as the shared row
    # holds it, no further
    turn3 = list(r2.context_tokens) + wb.tokenize(
        m, "<|im_end|>\n<|im_start|>user\nAnd in Kelvin?<|im_end|>\n<|im_start|>assistant\n", add_special=False)
    other = wb.complete(m, turn3, response_tokens=12, cache_scope=scope)
    assert other.stats.cache_hit_kind == "shared"
    assert other.stats.prompt_tokens - other.stats.prefilled_tokens == r1.stats.prompt_tokens - 1
    assert other.tokens == wb.complete(m, turn3, response_tokens=12, cache=False).tokens
    assert wb.evict(m) == 1 and wb.model_info(m)["available_seqs"] == 2
    r3 = wb.complete(m, turn3, session_id="s", response_tokens=12, cache_scope=scope)
    assert r3.stats.cache_hit_kind == "sticky"
    assert r3.stats.prompt_tokens - r3.stats.prefilled_tokens == held
    wb.end_session(m, "s", cache_scope=scope)
    assert wb.wait_for_saves() and not any(r["live"] for r in wb.cache_rows())
    assert held not in {r["n_tokens"] for r in wb.cache_rows()}       # its own rows went with it


@pytest.mark.load(n_seq_max=2, deterministic=True)   # the default mode keeps no row past the first prompt
def test_a_sessions_newest_row_is_live_until_the_session_ends(fresh_model, cache_tiers):
    cache_tiers({"kind": "ram", "budget_bytes": 512 * 2**20})
    m = fresh_model
    r1 = wb.complete(m, PROMPT, session_id="s", response_tokens=12)
    assert wb.wait_for_saves()
    live = lambda: {r["key"] for r in wb.cache_rows() if r["live"]}  # noqa: E731
    assert live() == {r1.finish_key}
    turn2 = PROMPT + r1.reply + "<|im_end|>\n<|im_start|>user\nIn Fahrenheit?<|im_end|>\n<|im_start|>assistant\n"
    r2 = wb.complete(m, turn2, session_id="s", response_tokens=12)
    other = wb.complete(m, SYSTEM + "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n",
                        response_tokens=8)
    assert wb.wait_for_saves()
    assert live() == {r2.finish_key} != {r1.finish_key}      # only the newest row of the session
    # churn: freeing every byte of the ordinary rows leaves the live one
    assert other.finish_key in {r["key"] for r in wb.cache_rows()}
    wb.evict_bytes(unprotected_bytes())
    left = {r["key"] for r in wb.cache_rows()}
    assert r2.finish_key in left and other.finish_key not in left
    wb.end_session(m, "s")
    assert live() == set()
    with pytest.raises(InvalidOption):
        wb.wait_for_saves(-1)


SCRIPT = textwrap.dedent("""
    import json, sys
    import workbench as wb
    wb.configure_cache([{"kind": "disk", "root": sys.argv[1], "budget_bytes": 2**30}], storage="rows")  # a chunk a row
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
    files = sorted(root.rglob("*.kvc"))                         # the row's chunk
    assert len(files) == 1 and all(oct(f.stat().st_mode & 0o777) == "0o600" for f in root.iterdir())
    warm = _run(root, model_path, PROMPT, "complete")           # process 2 adopts the row
    assert warm["kind"] == "exact" and warm["rejected"] == 0
    assert warm["tokens"] == list(wb.complete(model, PROMPT, response_tokens=16, cache=False).tokens)
    # flip one payload bit of the chunk: its first read rejects, counts and removes it (a
    # start-up reads no payload), and the request runs cold
    corrupted = {}
    for f in files:
        data = bytearray(f.read_bytes())
        data[-100] ^= 0x01
        f.write_bytes(bytes(data))
        corrupted[f] = bytes(data)
    again = _run(root, model_path, PROMPT, "complete")
    assert again["rejected"] == len(files) and again["kind"] == "cold"
    # each rejected file was removed; the cold run may have saved the same rows anew
    assert not any(f.exists() and f.read_bytes() == corrupted[f] for f in files)
