"""A sequence's llama.cpp state cut into KV chunks and joined back (engine/kv_chunks.py over
csrc/kv_chunks.cpp), with the real default model: the join restores exactly what the cut
took (warm == cold, token for token, V transposed or not) and refuses chunks that are not the
chain a row needs, before llama.cpp sees them."""

from __future__ import annotations

import pytest

from workbench import _native
from workbench.cache.keys import chunk_keys
from workbench.engine import kv_chunks
from workbench.errors import KvChunksRefused

NS = bytes(range(32))
CHUNK = 128
TEXT = " ".join(f"Item {i}: the {w} of the river near town number {i * 7 % 13}."
                for i, w in enumerate(["colour", "sound", "depth", "speed", "name", "age"] * 8))


@pytest.fixture(scope="module")
def model(model_path):
    m = _native.Model(str(model_path), 0, True, False)
    yield m
    m.close()


def make_ctx(model, flash_attn: str):
    return _native.Context(model, {"n_ctx": 1024, "n_batch": 256, "n_ubatch": 256, "n_seq_max": 2,
                                   "n_threads": 2, "flash_attn": flash_attn})


def prefill(ctx, seqs: list[int], tokens: list[int]) -> None:
    """Prefill the same tokens into each of `seqs`, interleaved in one batch (so each
    sequence's cells are not contiguous when there are two)."""
    step = ctx.n_batch // len(seqs)
    for start in range(0, len(tokens), step):
        part = tokens[start:start + step]
        rows = [(t, start + i, s) for i, t in enumerate(part) for s in seqs]
        last = start + len(part) == len(tokens)
        logits = [1 if last and r[1] == len(tokens) - 1 else 0 for r in rows]
        assert ctx.decode([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], logits) == 0


def greedy(ctx, seq: int, n_past: int, first: int, n: int) -> list[int]:
    """n greedy tokens on `seq` (holding n_past positions), feeding `first` at n_past."""
    out, tok = [], first
    for i in range(n):
        assert ctx.decode([tok], [n_past + i], [seq], [1]) == 0
        tok = _native.top_logits(ctx, 0, 1)[0][0]
        out.append(tok)
    return out


@pytest.fixture(scope="module")
def tokens(model):
    toks = model.tokenize(TEXT, True, False)
    assert len(toks) > 3 * CHUNK + 10  # three full chunks and a tail
    return toks[:3 * CHUNK + 37]


@pytest.mark.parametrize("flash_attn", ["on", "off"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_cut_and_join_restore_warm_equal_to_cold(model, tokens, flash_attn, interleaved):
    ctx = make_ctx(model, flash_attn)
    try:
        prompt, last = tokens[:-1], tokens[-1]
        prefill(ctx, [0, 1] if interleaved else [0], prompt)
        keys = chunk_keys(NS, prompt, CHUNK)
        state = ctx.state_seq_get(0)
        pieces = kv_chunks.cut(ctx, 0, keys, CHUNK)
        assert len(pieces) == 4 and len(pieces[-1]) < len(pieces[0])
        # the chunks hold the whole state once: pieces share headers and layouts only
        assert sum(map(len, pieces)) < len(state) * 1.02
        assert kv_chunks.join(ctx, pieces, keys) == state  # cells come back in position order
        assert kv_chunks.cut(ctx, 0, keys, CHUNK, first=3) == pieces[3:]
        cold = greedy(ctx, 0, len(prompt), last, 12)
        ctx.seq_rm(1, -1, -1)
        assert ctx.seq_pos_max(1) == -1
        assert kv_chunks.load(ctx, 1, pieces, keys) == len(state)
        assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, len(prompt) - 1)
        assert greedy(ctx, 1, len(prompt), last, 12) == cold
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def cut_pair(model, tokens):
    """Chunks of two prompts sharing their first chunk, from one context (flash off: V
    transposed), and the chunks of the first from a flash-on context."""
    off, on = make_ctx(model, "off"), make_ctx(model, "on")
    a = tokens[:2 * CHUNK + 20]
    b = tokens[:CHUNK] + list(reversed(tokens[CHUNK:2 * CHUNK + 20]))
    prefill(off, [0], a)
    ka = chunk_keys(NS, a, CHUNK)
    pa = kv_chunks.cut(off, 0, ka, CHUNK)
    off.seq_rm(0, -1, -1)
    prefill(off, [0], b)
    kb = chunk_keys(NS, b, CHUNK)
    pb = kv_chunks.cut(off, 0, kb, CHUNK)
    off.seq_rm(0, -1, -1)
    prefill(on, [0], a)
    pa_on = kv_chunks.cut(on, 0, ka, CHUNK)
    on.close()
    yield off, (a, ka, pa), (b, kb, pb), pa_on
    off.close()


def refused(ctx, pieces, keys, match: str) -> None:
    with pytest.raises(KvChunksRefused, match=match):
        kv_chunks.join(ctx, pieces, keys)
    with pytest.raises(KvChunksRefused, match=match):
        kv_chunks.load(ctx, 1, pieces, keys)
    assert ctx.seq_pos_max(1) == -1  # nothing reached llama.cpp


def test_shared_prefix_chunks_are_identical(cut_pair):
    _, (_, ka, pa), (_, kb, pb), _ = cut_pair
    assert ka[0] == kb[0] and pa[0] == pb[0]
    assert ka[1] != kb[1] and pa[1] != pb[1]


def test_join_refuses_chunks_of_another_prefix(cut_pair):
    ctx, (_, ka, pa), (_, kb, pb), _ = cut_pair
    refused(ctx, [pa[0], pb[1], pa[2]], ka, "another prefix")
    refused(ctx, pa, kb, "another prefix")
    # b's own chunks verify against b's keys, whatever a's are
    assert kv_chunks.join(ctx, [pa[0], pb[1], pb[2]], kb) == kv_chunks.join(ctx, pb, kb)


def test_join_refuses_gaps_order_layout_and_sizes(cut_pair):
    ctx, (_, ka, pa), _, pa_on = cut_pair
    refused(ctx, [pa[0], pa[2]], [ka[0], ka[2]], "starts at position 256, expected 128")
    refused(ctx, [pa[1], pa[0], pa[2]], [ka[1], ka[0], ka[2]], "starts at position 128, expected 0")
    refused(ctx, [pa[0], pa_on[1], pa[2]], ka, "another KV layout")
    refused(ctx, [pa[0], pa[1], pa[2][:-1]], ka, "bytes of KV")
    refused(ctx, [pa[0], pa[1], pa[2] + b"\0"], ka, "bytes of KV")
    refused(ctx, [pa[0], pa[1]], ka, "2 chunks for 3 keys")
    refused(ctx, [b"WBKVCHK\0" + bytes(8)] + pa[1:], ka, "not a KV chunk")
    refused(ctx, [], [], "no chunks")
    bad_version = pa[0][:8] + b"\x02\x00" + pa[0][10:]
    refused(ctx, [bad_version, *pa[1:]], ka, "chunk format version")
    refused(ctx, pa, [k[:8] for k in ka], "not 16")


def test_join_refuses_a_cell_at_the_wrong_position(cut_pair):
    ctx, (_, ka, pa), _, _ = cut_pair
    first = pa[1]
    body = 40 + int.from_bytes(first[20:24], "little")
    moved = first[:body] + (10_000).to_bytes(4, "little") + first[body + 4:]
    refused(ctx, [pa[0], moved, pa[2]], ka, "not at position 128")


def test_cut_refuses_wrong_keys_and_foreign_bytes(cut_pair):
    ctx, (a, ka, _), _, _ = cut_pair
    prefill(ctx, [0], a)
    try:
        with pytest.raises(KvChunksRefused, match="expected 3"):
            kv_chunks.cut(ctx, 0, ka[:2], CHUNK)
        with pytest.raises(KvChunksRefused, match="chunk_size"):
            kv_chunks.cut(ctx, 0, ka, 0)
        with pytest.raises(KvChunksRefused, match="not a sequence state"):
            kv_chunks.cut_state(ctx, b"\0" * 64, ka, CHUNK)
        with pytest.raises(KvChunksRefused, match="0 streams hold cells"):
            kv_chunks.cut(ctx, 1, [], CHUNK)  # an empty sequence
    finally:
        ctx.seq_rm(0, -1, -1)


def test_engine_rows_of_a_chat_stored_as_chunks_share_their_prefix(model, model_path, tmp_path):
    """The rows a real two-turn chat leaves in whole rows on a disk tier, cut into chunks of
    64: every row reads back and joins to exactly its row's state, and the chunks take less
    than the rows' states stored each in full, because the turns share their prefix."""
    import workbench as wb
    from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore

    wb.configure_cache([{"kind": "disk", "root": str(tmp_path / "rows"), "budget_bytes": 2**30}], storage="rows")
    mid = wb.load_model(model_path=str(model_path), n_ctx=2048, n_seq_max=1, n_threads=2)
    try:
        messages = [{"role": "user", "content": "Name three rivers of Europe and one fact about each. " * 8}]
        for follow_up in ("Which of them is the longest?", "And which one flows through Vienna?"):
            r = wb.chat(mid, messages, response_tokens=24)
            messages += [{"role": "assistant", "content": r.content}, {"role": "user", "content": follow_up}]
        assert wb.wait_for_saves()
        whole = ChunkStore(tmp_path / "rows", chunk_size=WHOLE_ROWS)
        assert whole.scan() == {}
        rows = list(whole.rows.values())
        assert len(rows) >= 2       # both turns' prompt rows (the default mode stores no finish row)
        ctx = make_ctx(model, "auto")
        states = {}
        for m in rows:
            _, served_by, pieces = whole.read_row(m.key)
            states[m.key] = kv_chunks.join(ctx, pieces, served_by, m.n_tokens)
        store = ChunkStore(tmp_path / "chunks", chunk_size=64)
        for m in rows:
            ks = chunk_keys(m.namespace, m.tokens, 64)
            first = store.missing(m.namespace, m.tokens)
            pieces = kv_chunks.cut_state(ctx, states[m.key], ks, 64, first)
            store.put_row(m.namespace, m.fingerprint, m.tokens, pieces, m.reason)
        for m in rows:
            back_m, served_by, back = store.read_row(m.key)
            assert kv_chunks.join(ctx, back, served_by, back_m.n_tokens) == states[m.key]
        assert store.counters.get("chunks_shared") > 0
        assert store.used < 0.8 * sum(len(state) for state in states.values())
        ctx.close()
    finally:
        wb.unload(mid)
        wb.configure_cache([{"kind": "ram"}])


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_a_join_can_end_inside_its_last_chunk(model, tokens, flash_attn):
    """The first n positions of a chain (a shorter row served by a longer row's chunk, a
    prompt that leaves the chain inside a chunk): the same state as the full one trimmed."""
    ctx = make_ctx(model, flash_attn)
    try:
        prefill(ctx, [0], tokens)
        keys = chunk_keys(NS, tokens, CHUNK)
        pieces = kv_chunks.cut(ctx, 0, keys, CHUNK)
        ctx.seq_rm(0, 300, -1)
        assert kv_chunks.join(ctx, pieces[:3], keys[:3], n_tokens=300) == ctx.state_seq_get(0)
        assert kv_chunks.load(ctx, 1, pieces[:3], keys[:3], n_tokens=300) > 0
        assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, 299)
        assert greedy(ctx, 1, 300, tokens[300], 8) == greedy(ctx, 0, 300, tokens[300], 8)
        ctx.seq_rm(1, -1, -1)
        for n in (256, 385, 10_000):  # not inside the last chunk [256, 384)
            with pytest.raises(KvChunksRefused, match="positions asked"):
                kv_chunks.load(ctx, 1, pieces[:3], keys[:3], n_tokens=n)
        assert ctx.seq_pos_max(1) == -1
    finally:
        ctx.close()


def test_damaged_chunks_are_refused_or_join_never_crash(model, tokens):
    """Bytes flipped anywhere in a chunk's header, layout or cells, and chunks cut short at
    every length: the join refuses them (KvChunksRefused) or builds a state that the
    pre-restore check then judges; nothing kills the process."""
    import random

    ctx = make_ctx(model, "off")
    try:
        prefill(ctx, [0], tokens[:40])
        keys = chunk_keys(NS, tokens[:40], 16)
        pieces = kv_chunks.cut(ctx, 0, keys, 16)
        rng = random.Random(5)
        head = 40 + int.from_bytes(pieces[1][20:24], "little") + 16 * 20  # header, layout, cells
        outcomes = {"refused": 0, "joined": 0}
        for _ in range(400):
            bad = bytearray(pieces[1])
            at = rng.randrange(head)
            bad[at] ^= 1 << rng.randrange(8)
            try:
                kv_chunks.join(ctx, [pieces[0], bytes(bad), pieces[2]], keys)
                outcomes["joined"] += 1
            except KvChunksRefused:
                outcomes["refused"] += 1
        for cut_at in range(0, len(pieces[2]), max(1, len(pieces[2]) // 97)):
            with pytest.raises(KvChunksRefused):
                kv_chunks.join(ctx, [pieces[0], pieces[1], pieces[2][:cut_at]], keys)
        assert outcomes["refused"] > 300  # a flip in a checked field is refused
        ctx.seq_rm(1, -1, -1)
        for _ in range(20):  # and a flip that joins is judged before llama.cpp restores it
            bad = bytearray(pieces[1])
            bad[rng.randrange(head)] ^= 0xFF
            try:
                kv_chunks.load(ctx, 1, [pieces[0], bytes(bad), pieces[2]], keys)
            except KvChunksRefused:
                pass
            ctx.seq_rm(1, -1, -1)
    finally:
        ctx.close()


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_a_reused_join_buffer_restores_a_shorter_state_exactly(model, tokens, flash_attn):
    """A context's cuts and joins go through one buffer as large as the largest state it held
    (kv_chunks.ScratchBuffers): a shorter state cut or joined after a longer one comes back
    byte for byte, and warm == cold."""
    ctx = make_ctx(model, flash_attn)
    try:
        prefill(ctx, [0], tokens)
        keys = chunk_keys(NS, tokens, CHUNK)
        pieces = kv_chunks.cut(ctx, 0, keys, CHUNK)  # the longest state: the buffer grows to it
        assert kv_chunks.load(ctx, 1, pieces, keys) == len(ctx.state_seq_get(0))
        short = tokens[:CHUNK + 40]
        ctx.seq_rm(0, len(short), -1)
        state = ctx.state_seq_get(0)
        short_keys = chunk_keys(NS, short, CHUNK)
        short_pieces = kv_chunks.cut(ctx, 0, short_keys, CHUNK)
        assert short_pieces == kv_chunks.cut_state(ctx, state, short_keys, CHUNK)
        assert short_pieces[0] == pieces[0]
        assert kv_chunks.join(ctx, short_pieces, short_keys) == state
        assert kv_chunks.load(ctx, 1, short_pieces, short_keys) == len(state)
        n = len(short)
        assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, n - 1)
        warm = greedy(ctx, 1, n, tokens[n], 8)
    finally:
        ctx.close()
    cold_ctx = make_ctx(model, flash_attn)  # seq 0, trimmed among seq 1's cells, may differ by a near-tie
    try:
        prefill(cold_ctx, [0], short)
        assert warm == greedy(cold_ctx, 0, n, tokens[n], 8)
    finally:
        cold_ctx.close()


def test_a_bad_scratch_buffer_is_refused_before_llama_cpp(cut_pair):
    """The native calls take a bytearray scratch (or None): anything else is a TypeError, a
    bytearray too small to grow (another view holds it) a BufferError, nothing restored."""
    ctx, (a, ka, pa), _, _ = cut_pair
    with pytest.raises(TypeError, match="scratch must be a bytearray"):
        ctx.state_seq_set_chunks(1, pa, ka, 0, b"not a bytearray")
    held = bytearray(16)
    view = memoryview(held)
    with pytest.raises(BufferError):
        ctx.state_seq_set_chunks(1, pa, ka, 0, held)
    assert ctx.seq_pos_max(1) == -1
    view.release()
    assert ctx.state_seq_set_chunks(1, pa, ka, 0, held) > 0
    assert len(held) >= len(kv_chunks.join(ctx, pa, ka))
    assert (ctx.seq_pos_min(1), ctx.seq_pos_max(1)) == (0, len(a) - 1)
    ctx.seq_rm(1, -1, -1)


def test_scratch_buffers_are_lent_to_one_call_at_a_time(model):
    """Two calls on one context at once never share a buffer; the context's buffer is reused
    by the next call and goes with the context."""
    import gc

    buffers = kv_chunks.ScratchBuffers()
    ctx = make_ctx(model, "off")
    with buffers.lend(ctx) as a:
        a.extend(b"x" * 10)
        with buffers.lend(ctx) as b:
            assert b is not a and len(b) == 0
    with buffers.lend(ctx) as again:
        assert again is a and len(buffers) == 0
    assert len(buffers) == 1
    ctx.close()
    del ctx
    gc.collect()
    assert len(buffers) == 0
