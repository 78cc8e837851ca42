"""workbench._native.Speculative: llama.cpp's common_speculative drafters, real default model."""

from __future__ import annotations

import pytest

from workbench import _native
from workbench.options import LoadConfig, build

pytestmark = pytest.mark.model

# a history whose last 12 tokens repeat earlier: every n-gram drafter can continue it
CYCLE = list(range(100, 112))
HISTORY = CYCLE * 3 + CYCLE[:2]


@pytest.fixture(scope="module")
def native_model(model_path):
    m = _native.Model(str(model_path), 0, True, False)
    yield m
    m.close()


@pytest.mark.parametrize("kind", ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache"])
def test_ngram_drafters_continue_a_repeated_history(native_model, kind):
    spec = _native.Speculative(native_model, {"type": kind, "size_n": 3, "size_m": 8})
    spec.begin(0, HISTORY[:10])
    draft = spec.draft(0, HISTORY, CYCLE[2], len(HISTORY), 5)
    assert draft == CYCLE[3:8]          # what followed the same tokens before, at most n_max
    spec.accept(0, 3)
    spec.accept(0, 2)                   # a second accept without a draft is ignored, not an abort
    assert spec.draft(0, [1, 2], 3, 2, 4) == []   # a shorter history restarts, drafts nothing
    spec.close()


def test_bad_arguments_are_value_errors(native_model):
    with pytest.raises(ValueError, match="ngram-mod"):
        _native.Speculative(native_model, {"type": "ngram-mod"})
    with pytest.raises(ValueError, match="size_n"):
        _native.Speculative(native_model, {"type": "ngram-simple", "size_n": 0})
    with pytest.raises(ValueError, match="needs the target and draft"):
        _native.Speculative(native_model, {"type": "draft-simple"})
    spec = _native.Speculative(native_model, {"type": "ngram-simple"})
    with pytest.raises(ValueError, match="sequence 1"):
        spec.draft(1, [1], 2, 1, 4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        spec.draft(0, [10**8], 2, 1, 4)
    with pytest.raises(ValueError, match="n_max"):
        spec.draft(0, [1], 2, 1, 0)
    spec.close()
    with pytest.raises(_native.NativeError, match="closed"):
        spec.draft(0, [1], 2, 1, 4)


def test_draft_simple_runs_llamas_vocabulary_check(native_model):
    params = build(LoadConfig, {"n_ctx": 256, "n_seq_max": 1}).context_params(native_model.n_ctx_train)
    target, draft = _native.Context(native_model, params), _native.Context(native_model, params)
    spec = _native.Speculative(native_model, {"type": "draft-simple", "n_max": 4}, 1, target, draft)
    assert spec.type == "draft-simple" and spec.n_max == 4    # same vocabulary: accepted
    spec.close()
    with pytest.raises(ValueError, match="sequences"):         # llama.cpp's own n_seq check
        _native.Speculative(native_model, {"type": "draft-simple"}, 2, target, draft)
    target.close()
    draft.close()
