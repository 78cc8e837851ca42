"""The engine over chunk storage (``configure_cache(storage='chunks')``), with the real default
model: warm == cold token for token from memory, from a directory and from RAM copies over
one; a multi-turn chat stores its shared prefix once; a restart re-adopts the chunks and a
new engine hits; a damaged chunk, or one that verifies but does not join, is refused and the
request runs cold with the cold reply; tenant scopes never share chunks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import workbench as wb
from workbench.cache.chunk_format import CHUNK_SUFFIX, encode_chunk, read_chunk
from workbench.notebook import views

pytestmark = pytest.mark.model

CHUNK = 64
SYSTEM = ("<|im_start|>system\nYou are a careful assistant. Answer in one short sentence and never "
          "invent facts.<|im_end|>\n")
PROMPT = (SYSTEM + "<|im_start|>user\nWhat is the boiling point of water at sea level? "
          + "Explain it step by step. " * 50 + "<|im_end|>\n<|im_start|>assistant\n")   # ~330 tokens


@pytest.fixture
def chunks(tmp_path):
    """Install a chunked cache of the given tiers for one test (directories under tmp_path),
    then the default cache again."""
    def install(*specs: dict, chunk_size: int = CHUNK) -> None:
        wb.configure_cache([dict(s, root=str(tmp_path / s["kind"])) if s["kind"] != "ram" else s for s in specs],
                           storage="chunks", chunk_size=chunk_size)
    yield install
    wb.configure_cache([{"kind": "ram"}])


def counter(name: str) -> int:
    return wb.counters().get(f"cache_{name}", 0)


def disk_chunk_files(tmp_path):
    return sorted((tmp_path / "disk").glob(f"*{CHUNK_SUFFIX}"))


@pytest.mark.parametrize("tiers", [("ram",), ("disk",), ("ram", "disk")])
def test_warm_is_token_exact_over_chunks(model, chunks, tiers):
    chunks(*({"kind": k, "budget_bytes": 512 * 2**20} for k in tiers))
    cold = wb.complete(model, PROMPT, response_tokens=24, cache=False)
    first = wb.complete(model, PROMPT, response_tokens=24)
    assert wb.wait_for_saves()
    assert first.stats.cache_hit_kind == "cold" and first.tokens == cold.tokens
    warm = wb.complete(model, PROMPT, response_tokens=24)
    assert warm.stats.cache_hit_kind == "exact" and warm.stats.prefilled_tokens == 1
    assert warm.tokens == cold.tokens
    longer = PROMPT + "Sure."
    part = wb.complete(model, longer, response_tokens=16)
    assert part.stats.cache_hit_kind == "partial"
    assert part.tokens == wb.complete(model, longer, response_tokens=16, cache=False).tokens
    rows = wb.cache_rows()
    assert len(rows) >= 2 and all(r["tier"] == tiers[0] for r in rows[:1])
    n = len(wb.tokenize(model, PROMPT))
    assert max(r["n_tokens"] for r in rows) >= n - 1
    table = views.cache_chunks(model)
    assert len(table) >= (n - 1) // CHUNK and table["refcount"].max() >= 2  # the prompt's chunks serve 2+ rows
    frame = views.cache_rows(model)
    assert len(frame) == len(rows) and set(frame["tier"]) <= set(tiers) and frame["rank"].min() == 1
    assert list(views.tiers(model).index) == list(tiers)


@pytest.mark.load(deterministic=True)   # the default mode stores no reply (finish rows)
def test_a_multi_turn_chat_stores_its_shared_prefix_once(fresh_model, chunks):
    model = fresh_model
    chunks({"kind": "ram", "budget_bytes": 2**30})
    messages = [{"role": "system", "content": "You are a travel guide. " * 20},
                {"role": "user", "content": "Name three rivers of Europe and one fact about each."}]
    for follow_up in ("Which of them is the longest?", "And which one flows through Vienna?",
                      "Which sea does it end in?"):
        r = wb.chat(model, messages, response_tokens=24)
        messages += [{"role": "assistant", "content": r.content}, {"role": "user", "content": follow_up}]
    last = wb.chat(model, messages, response_tokens=24)
    assert last.stats.cache_hit_kind in ("exact", "partial") and last.stats.prefilled_tokens < 40
    assert wb.wait_for_saves()
    rows = wb.cache_rows()
    assert len(rows) >= 6
    table = views.cache_chunks(model)
    full = table[table["n_tokens"] == CHUNK]
    per_token = full["size_bytes"].min() / CHUNK                 # the KV of one token, with chunk overheads
    distinct = max(r["n_tokens"] for r in rows)                  # every turn continues the one before
    stored = wb.list_tiers()[0]["used_bytes"]
    whole_rows = sum(r["bytes"] for r in rows)                   # what rows of whole states would take
    assert stored <= 1.1 * distinct * per_token, (stored, distinct * per_token)
    assert whole_rows > 3 * stored
    assert table["refcount"].max() >= len(rows) - 1               # the system prompt's chunks serve them all


def test_a_restart_readopts_the_chunks_and_a_new_engine_hits(model, model_path, chunks, tmp_path):
    chunks({"kind": "disk", "budget_bytes": 2**30})
    cold = wb.complete(model, PROMPT, response_tokens=16, cache=False)
    wb.complete(model, PROMPT, response_tokens=16)
    assert wb.wait_for_saves()
    before = {r["key"] for r in wb.cache_rows()}
    n_chunks = len(disk_chunk_files(tmp_path))
    chunks({"kind": "disk", "budget_bytes": 2**30})           # a new process's cache: it scans the directory
    assert {r["key"] for r in wb.cache_rows()} == before and len(wb.cache_chunks()) == n_chunks
    fresh = wb.load_model(model_path=str(model_path), model_id="chunked-restart", n_seq_max=1)
    try:
        warm = wb.complete(fresh, PROMPT, response_tokens=16)
        assert warm.stats.cache_hit_kind == "exact" and warm.tokens == cold.tokens
        assert counter("chunk_reads_file") >= n_chunks - 1
    finally:
        wb.unload(fresh)


def test_a_damaged_chunk_is_refused_and_the_request_runs_cold(model, chunks, tmp_path):
    chunks({"kind": "disk", "budget_bytes": 2**30})           # no RAM copies: every read is a file's
    cold = wb.complete(model, PROMPT, response_tokens=16, cache=False)
    wb.complete(model, PROMPT, response_tokens=16)
    assert wb.wait_for_saves()
    first = next(c for c in wb.cache_chunks() if c["parent"] is None)
    path = tmp_path / "disk" / f"{first['key']}{CHUNK_SUFFIX}"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x10                                          # one bit of the KV payload
    path.write_bytes(bytes(data))
    rejected = counter("rejected_payload_checksum")
    again = wb.complete(model, PROMPT, response_tokens=16)
    assert again.stats.cache_hit_kind == "cold" and again.tokens == cold.tokens
    assert counter("rejected_payload_checksum") == rejected + 1
    assert wb.wait_for_saves()                                  # the cold run stored the rows again
    warm = wb.complete(model, PROMPT, response_tokens=16)
    assert warm.stats.cache_hit_kind == "exact" and warm.tokens == cold.tokens


def test_a_chunk_that_verifies_but_does_not_join_runs_cold(model, chunks, tmp_path):
    """A chunk file whose checksums verify but whose KV is another chunk's (a writer's bug,
    a crafted file): the native join refuses it before llama.cpp sees it; the sequence is
    left empty, the chain is removed (rejected_bad_state) and the request runs cold."""
    chunks({"kind": "disk", "budget_bytes": 2**30})
    cold = wb.complete(model, PROMPT, response_tokens=16, cache=False)
    wb.complete(model, PROMPT, response_tokens=16)
    assert wb.wait_for_saves()
    table = {c["key"]: c for c in wb.cache_chunks()}
    first = next(k for k, c in table.items() if c["parent"] is None)
    second = next(k for k, c in table.items() if c["parent"] == first)
    root = tmp_path / "disk"
    meta, _, _ = read_chunk(root / f"{first}{CHUNK_SUFFIX}")
    _, foreign, _ = read_chunk(root / f"{second}{CHUNK_SUFFIX}")
    (root / f"{first}{CHUNK_SUFFIX}").write_bytes(encode_chunk(meta, foreign) + foreign)
    failed, bad_state = counter("restore_failed"), counter("rejected_bad_state")
    again = wb.complete(model, PROMPT, response_tokens=16)
    assert again.stats.cache_hit_kind == "cold" and again.tokens == cold.tokens
    engine = wb.counters()
    assert engine.get("cache_restore_failed", 0) == failed + 1 and engine.get("cache_seq_not_cleared", 0) == 0
    assert counter("rejected_bad_state") == bad_state + 1


def test_tenant_scopes_never_share_chunks(model, chunks):
    chunks({"kind": "ram", "budget_bytes": 2**30})
    cold = wb.complete(model, PROMPT, response_tokens=12, cache=False)
    a = wb.complete(model, PROMPT, response_tokens=12, cache_scope="tenant-a")
    assert wb.wait_for_saves()
    keys_a = {c["key"] for c in wb.cache_chunks()}
    assert wb.cached_prefix_len(model, PROMPT, cache_scope="tenant-a") > 0
    assert wb.cached_prefix_len(model, PROMPT, cache_scope="tenant-b") == 0
    b = wb.complete(model, PROMPT, response_tokens=12, cache_scope="tenant-b")
    assert wb.wait_for_saves()
    keys_b = {c["key"] for c in wb.cache_chunks()} - keys_a
    assert a.stats.cache_hit_kind == b.stats.cache_hit_kind == "cold"
    assert a.tokens == b.tokens == cold.tokens
    assert len(keys_b) == len(keys_a) and not keys_a & keys_b   # every chunk stored once per scope
    assert counter("chunks_shared") == 0 or all(c["refcount"] >= 1 for c in wb.cache_chunks())


def test_parent_key_agent_prefix_and_churn_over_chunks(model, chunks):
    """An agent loop resumes from each turn's finish_key at once (the row still in the
    writer pool: admission waits); a pinned agent prefix outlives evicting every other chunk.
    The resumed reply equals the one a whole-row restore gives (a cold run computes the
    prefix in other batches, and llama.cpp's CPU kernels are not batch-invariant)."""
    tools = SYSTEM + "Tools: search(query), calculator(expression), weather(city).\n" * 8
    n_prefix = len(wb.tokenize(model, tools))
    first = tools + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    wb.configure_cache([{"kind": "ram"}])                        # whole rows
    row = wb.prefill_only(model, tools, prefix_checkpoint_len=n_prefix, cache_scope="agents")
    by_rows = wb.complete(model, first, response_tokens=8, parent_key=row.finish_key, cache_scope="agents").tokens
    chunks({"kind": "disk", "budget_bytes": 2**30})
    warm = wb.prefill_only(model, tools, prefix_checkpoint_len=n_prefix, cache_scope="agents")
    rows = {r["key"]: r for r in wb.cache_rows()}
    assert rows[warm.finish_key]["reason"] == "agent_prefix" and rows[warm.finish_key]["pinned"]
    turn, parent = first, warm.finish_key
    for step in range(3):
        r = wb.complete(model, turn, response_tokens=8, parent_key=parent, cache_scope="agents")
        assert r.stats.cache_hit_kind == "exact"
        assert r.stats.cache_delta["read"] == r.stats.prompt_tokens - r.stats.prefilled_tokens > 0
        if step == 0:
            assert r.tokens == by_rows
        turn += r.reply + f"<|im_end|>\n<|im_start|>user\nStep {step}: go on.<|im_end|>\n<|im_start|>assistant\n"
        parent = r.finish_key
    assert wb.wait_for_saves()
    before = len(wb.cache_rows())
    ordinary = sum(c["size_bytes"] for c in wb.cache_chunks() if not c["protected"])
    assert ordinary > 0 and wb.evict_bytes(ordinary) >= ordinary
    left = {r["key"] for r in wb.cache_rows()}     # rows inside the pinned chunks stay (a manifest each)
    assert warm.finish_key in left and parent not in left and len(left) < before
    assert all(c["protected"] for c in wb.cache_chunks())
    # the pinned row: the prefix without its last token (decoded alone: not a prompt row)
    assert wb.cached_prefix_len(model, tools + "<|im_start|>user\nhi", cache_scope="agents") == n_prefix - 1


@pytest.mark.load(deterministic=True)   # the default mode stores no reply (finish rows)
def test_a_re_sent_reply_resumes_inside_a_chunk(fresh_model, chunks):
    """A raw-text chat re-sends the reply as text: the next turn is a partial hit that
    prefills only the new text plus a few tokens, not back to the chunk boundary."""
    model = fresh_model
    chunks({"kind": "ram", "budget_bytes": 2**30})
    turn1 = SYSTEM + "<|im_start|>user\nName a red fruit and say why it is red.<|im_end|>\n<|im_start|>assistant\n"
    r1 = wb.complete(model, turn1, response_tokens=40)
    assert wb.wait_for_saves()
    new_text = "<|im_end|>\n<|im_start|>user\nAnd a yellow one?<|im_end|>\n<|im_start|>assistant\n"
    turn2 = turn1 + r1.reply + new_text
    r2 = wb.complete(model, turn2, response_tokens=24)
    assert r2.stats.cache_hit_kind == "partial"
    assert r2.stats.prefilled_tokens <= len(wb.tokenize(model, new_text, add_special=False)) + 4
    assert r2.tokens == wb.complete(model, turn2, response_tokens=24, cache=False).tokens


def session_evicted_and_resumed(m: str) -> tuple[int, ...]:
    """A session's turn, ``evict``, the next turn: its reply (the row the turn restores, the
    session's own row in the default mode, must be live)."""
    r1 = wb.complete(m, PROMPT, session_id="s", response_tokens=12)
    assert wb.wait_for_saves()
    (held,) = [s["tokens"] for s in wb.sessions(m)]
    assert [r["n_tokens"] for r in wb.cache_rows() if r["live"]] == [held]
    assert wb.evict(m) == 1 and wb.model_info(m)["available_seqs"] == 2
    turn2 = list(r1.context_tokens) + wb.tokenize(
        m, "<|im_end|>\n<|im_start|>user\nIn Fahrenheit?<|im_end|>\n<|im_start|>assistant\n", add_special=False)
    r2 = wb.complete(m, turn2, session_id="s", response_tokens=12)
    assert r2.stats.cache_hit_kind == "sticky" and r2.stats.prompt_tokens - r2.stats.prefilled_tokens == held
    wb.end_session(m, "s")
    assert not any(r["live"] for r in wb.cache_rows())
    return r2.tokens


@pytest.mark.load(n_seq_max=2)
def test_evicted_sessions_come_back_warm_from_chunks(fresh_model, chunks):
    """The resumed turn's reply equals the one whole rows give (a session's own row holds KV
    that decodes computed: not compared with a cold run)."""
    wb.configure_cache([{"kind": "ram"}])
    by_rows = session_evicted_and_resumed(fresh_model)
    chunks({"kind": "ram", "budget_bytes": 2**30})
    assert session_evicted_and_resumed(fresh_model) == by_rows


CHILD = textwrap.dedent("""
    import json, sys
    import workbench as wb
    wb.configure_cache([{"kind": "disk", "root": sys.argv[1], "budget_bytes": 2**30}], storage="chunks",
                       chunk_size=64)
    m = wb.load_model(model_path=sys.argv[2], n_seq_max=1)
    r = wb.prefill_only(m, sys.argv[3]) if sys.argv[4] == "save" else wb.complete(m, sys.argv[3], response_tokens=16)
    print(json.dumps({"kind": r.stats.cache_hit_kind, "tokens": list(r.tokens), "chunks": len(wb.cache_chunks()),
                      "rejected": wb.counters().get("cache_rejected_total", 0)}))
""")


def child(root, model_path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(model_path), PROMPT, mode],
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_chunks_survive_a_process_restart(tmp_path, model_path, model):
    saved = child(tmp_path / "kv", model_path, "save")          # process 1 saves and exits
    files = sorted((tmp_path / "kv").glob(f"*{CHUNK_SUFFIX}"))
    assert saved["chunks"] == len(files) >= 5 and all(oct(f.stat().st_mode & 0o777) == "0o600" for f in files)
    warm = child(tmp_path / "kv", model_path, "complete")       # process 2 adopts the chunks
    assert warm["kind"] == "exact" and warm["rejected"] == 0
    assert warm["tokens"] == list(wb.complete(model, PROMPT, response_tokens=16, cache=False).tokens)
