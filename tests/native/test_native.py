"""workbench._native directly: bad input raises Python errors instead of crashing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workbench import _native

ROOT = Path(__file__).resolve().parents[2]
VOCABS = ROOT / "vendor" / "llama.cpp" / "models"


def vocab_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's own tokenizer fixtures (tests/test-tokenizer-0 reads the same files)."""
    raw = (VOCABS / f"{name}.gguf.inp").read_text(encoding="utf-8")
    outs = (VOCABS / f"{name}.gguf.out").read_text(encoding="utf-8").splitlines()
    inputs = raw.split("\n__ggml_vocab_test__\n")
    if inputs and inputs[-1] == "":
        inputs.pop()
    assert len(inputs) == len(outs), "fixture files out of step"
    return [(i, [int(t) for t in o.split()]) for i, o in zip(inputs, outs)]


@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm", "ggml-vocab-llama-bpe", "ggml-vocab-gpt-2"])
def test_tokenize_matches_llama_cpp_fixtures(name):
    m = _native.Model(str(VOCABS / f"{name}.gguf"), 0, True, True)
    cases = vocab_cases(name)
    assert len(cases) > 10
    for text, expected in cases:
        assert m.tokenize(text, False, False) == expected, text


def test_gguf_check_reports_random_bytes_and_truncation(tmp_path, model_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + os.urandom(4096))
    assert (_native.gguf_check(str(junk)) or "").startswith("not a valid GGUF file")
    cut = tmp_path / "cut.gguf"
    with open(model_path, "rb") as src:
        cut.write_bytes(src.read(20_000_000))
    problem = _native.gguf_check(str(cut))
    assert problem is not None and "truncated" in problem
    assert _native.gguf_check(str(model_path)) is None


def test_native_load_failure_is_an_exception(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(_native.NativeError, match="could not load"):
        _native.Model(str(bad), 0, True, False)


@pytest.fixture(scope="module")
def native_ctx(model_path):
    m = _native.Model(str(model_path), 0, True, False)
    ctx = _native.Context(m, {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_seq_max": 2, "n_threads": 2})
    yield m, ctx
    ctx.close()
    m.close()


def test_context_rejects_bad_parameters(native_ctx):
    m, _ = native_ctx
    with pytest.raises(ValueError, match="n_seq_max"):
        _native.Context(m, {"n_seq_max": 100000})
    with pytest.raises(ValueError, match="type_k"):
        _native.Context(m, {"type_k": "f17"})
    with pytest.raises(ValueError, match="flash_attn"):
        _native.Context(m, {"flash_attn": "maybe"})


def test_decode_validates_rows_before_llama_cpp(native_ctx):
    m, ctx = native_ctx
    with pytest.raises(ValueError, match="vocabulary"):
        ctx.decode([m.n_vocab + 5], [0], [0], [1])
    with pytest.raises(ValueError, match="sequence id"):
        ctx.decode([1], [0], [7], [1])
    with pytest.raises(ValueError, match="exceed n_batch"):
        ctx.decode([1] * 65, list(range(65)), [0] * 65, [0] * 65)
    with pytest.raises(ValueError, match="same length"):
        ctx.decode([1, 2], [0], [0], [1])
    with pytest.raises(ValueError, match="position"):
        ctx.decode([1], [10_000], [0], [1])
    with pytest.raises(ValueError, match="sequence id"):
        ctx.seq_pos_max(-3)
    with pytest.raises(ValueError, match="vocabulary"):
        m.token_to_piece(-1)


def test_two_sequences_in_one_decode_and_state_round_trip(native_ctx):
    m, ctx = native_ctx
    a = m.tokenize("The capital of France is", True, True)
    b = m.tokenize("One, two, three,", True, True)
    ctx.memory_clear()
    rc = ctx.decode(a + b, list(range(len(a))) + list(range(len(b))), [0] * len(a) + [1] * len(b),
                    [0] * (len(a) - 1) + [1] + [0] * (len(b) - 1) + [1])
    assert rc == 0
    assert ctx.seq_pos_max(0) == len(a) - 1 and ctx.seq_pos_max(1) == len(b) - 1
    greedy = _native.Sampler(m, {"temperature": 0.0})
    first_a = greedy.sample(ctx, len(a) - 1)
    state = ctx.state_seq_get(0)
    assert len(state) > 23_040 * len(a) * 0.9       # f16 KV: 23,040 bytes per token for this model
    ctx.seq_rm(1, -1, -1)
    assert ctx.seq_pos_max(1) == -1
    assert ctx.state_seq_set(1, state) == len(state)  # restore seq 0's KV into seq 1
    assert ctx.seq_pos_max(1) == len(a) - 1
    # the restored sequence continues exactly like the original
    rc = ctx.decode([first_a, first_a], [len(a), len(a)], [0, 1], [1, 1])
    assert rc == 0
    assert greedy.sample(ctx, 0) == _native.Sampler(m, {"temperature": 0.0}).sample(ctx, 1)
    with pytest.raises(ValueError, match="magic"):     # refused before llama.cpp reads it
        ctx.state_seq_set(1, b"garbage")


STATE_HEADER = 4 + 4 + 4 + 4  # magic, sequence id, stream count, cell count
CELL = 4 + 4 + 4              # position, sequence count, sequence id (no cell ext in this model)


def _state_of(m, ctx, text: str) -> tuple[list[int], bytes]:
    ids = m.tokenize(text, True, True)
    ctx.memory_clear()
    assert ctx.decode(ids, list(range(len(ids))), [0] * len(ids), [0] * len(ids)) == 0
    return ids, ctx.state_seq_get(0)


def _poke_i32(state: bytes, offset: int, value: int) -> bytes:
    return state[:offset] + int(value).to_bytes(4, "little", signed=True) + state[offset + 4:]


def test_state_layout_is_what_the_check_reads(native_ctx):
    """The offsets the corruption tests poke: cell i's position at HEADER + i * CELL."""
    m, ctx = native_ctx
    ids, state = _state_of(m, ctx, "The capital of France is")
    assert int.from_bytes(state[12:16], "little") == len(ids)          # cell count
    for i in range(len(ids)):
        assert int.from_bytes(state[STATE_HEADER + i * CELL:][:4], "little") == i


@pytest.mark.parametrize("position", [2**31 - 1, 256, -1])
def test_state_with_a_cell_outside_the_context_is_refused(native_ctx, position):
    m, ctx = native_ctx
    ids, state = _state_of(m, ctx, "The capital of France is")
    bad = _poke_i32(state, STATE_HEADER + 2 * CELL, position)
    ctx.seq_rm(1, -1, -1)
    with pytest.raises(ValueError, match=f"cell 2 is at position {position}, outside the context"):
        ctx.state_seq_set(1, bad)
    assert ctx.seq_pos_max(1) == -1                        # nothing was restored
    assert ctx.state_seq_set(1, state) == len(state)       # the sound state still round-trips
    assert ctx.seq_pos_max(1) == len(ids) - 1
    assert ctx.decode([ids[-1]], [len(ids)], [1], [1]) == 0


@pytest.mark.parametrize("damage,reason", [
    (lambda s: s + b"\0", "1 bytes after the state's end"),
    (lambda s: s[:-1], "run past the end"),
    (lambda s: _poke_i32(s, 12, 100_000), "100000 cells; the context holds 256"),
    (lambda s: _poke_i32(s, 12, 2), "refused a malformed sequence state"),
    (lambda s: _poke_i32(s, STATE_HEADER + 4, 2), "cell 0 names 2 sequences"),
    (lambda s: _poke_i32(s, 8, 7), "7 KV streams"),
])
def test_state_whose_sizes_disagree_is_refused(native_ctx, damage, reason):
    m, ctx = native_ctx
    _, state = _state_of(m, ctx, "One, two, three,")
    with pytest.raises(ValueError, match=reason):
        ctx.state_seq_set(1, damage(state))
    assert ctx.seq_pos_max(1) == -1


def test_bad_grammar_is_a_value_error(native_ctx):
    m, _ = native_ctx
    with pytest.raises(ValueError, match="grammar"):
        _native.Sampler(m, {"grammar": "root ::= (("})


def test_reasoning_budget_sampler_states_and_forcing(native_ctx):
    m, ctx = native_ctx
    end = m.tokenize(" ZZQ", False, True)
    rb = {"budget": 1, "start": m.tokenize("The", False, True), "end": end, "forced": end}
    assert _native.Sampler(m, {"temperature": 0.0}).budget_state is None
    assert _native.Sampler(m, {"reasoning_budget": rb}).budget_state == "idle"
    s = _native.Sampler(m, {"reasoning_budget": dict(rb, inside=True)})
    assert s.budget_state == "counting"
    a = m.tokenize("The capital of France is", True, True)
    ctx.memory_clear()
    assert ctx.decode(a, list(range(len(a))), [0] * len(a), [0] * (len(a) - 1) + [1]) == 0
    s.sample(ctx, len(a) - 1)                          # the one budget token
    assert s.budget_state == "forcing"
    assert s.sample(ctx, len(a) - 1) == end[0]         # whatever the logits say
    for bad in (dict(rb, end=[], forced=[]), dict(rb, budget=-1), dict(rb, forced=[10**9])):
        with pytest.raises(ValueError):
            _native.Sampler(m, {"reasoning_budget": bad})
