"""``wb.cached_prefix``: what the prefix cache holds of a prompt, in tokens and in KV bytes,
with the tier a restore reads from and the hit kind a request would get, in both storages,
with the real default model; a probe (no counter moves); ``cached_prefix_len`` agrees."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.errors import InvalidOption

from .test_cache_chunked_engine import PROMPT, chunks  # noqa: F401 - chunks: the fixture

pytestmark = pytest.mark.model

# SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, K and V: per token 11,520 values
KV_VALUES_PER_TOKEN = 30 * 3 * 64 * 2
F16_BYTES, Q8_0_BYTES = 2, 34 / 32          # q8_0: blocks of 32 values in 34 bytes


def install(storage: str, tier: str, chunks, tmp_path) -> None:  # noqa: F811
    spec = {"kind": tier, "budget_bytes": 2**30}
    if tier != "ram":
        spec["root"] = str(tmp_path / tier)
    if storage == "rows":
        wb.configure_cache([spec], storage="rows")
    else:
        chunks({"kind": tier, "budget_bytes": 2**30})


def probe_counters() -> dict[str, int]:
    return {k: v for k, v in wb.counters().items() if k.startswith(("cache_hits", "cache_misses", "hits_"))}


@pytest.mark.parametrize("storage", ["rows", "chunks"])
@pytest.mark.parametrize("tier", ["ram", "disk"])
def test_cached_prefix_reports_tokens_bytes_tier_and_kind(model, chunks, tmp_path, storage, tier):  # noqa: F811
    install(storage, tier, chunks, tmp_path)
    nothing = wb.cached_prefix(model, PROMPT)
    assert (nothing.tokens, nothing.bytes, nothing.tier, nothing.kind, nothing.key) == (0, 0, None, "cold", None)
    r = wb.complete(model, PROMPT, response_tokens=8)
    assert wb.wait_for_saves()
    before = probe_counters()
    got = wb.cached_prefix(model, PROMPT)
    n = len(wb.tokenize(model, PROMPT))
    # the prompt row, all but the last token (decoded alone); no finish row: the reply's KV
    # came from one-row decodes (docs/architecture.md, "Warm equals cold")
    assert got.tokens == wb.cached_prefix_len(model, PROMPT) == n - 1
    assert got.bytes == got.tokens * KV_VALUES_PER_TOKEN * F16_BYTES
    assert got.kind == "exact" and got.tier == tier
    rows = {row["key"]: row for row in wb.cache_rows()}
    assert got.key == r.finish_key and rows[got.key]["n_tokens"] == n - 1 and rows[got.key]["tier"] == tier
    more = list(r.context_tokens) + wb.tokenize(model, " And more.", add_special=False)
    longer = wb.cached_prefix(model, more)
    assert longer.kind == "partial" and longer.key == r.finish_key and longer.tokens == n - 1
    assert longer.bytes == longer.tokens * KV_VALUES_PER_TOKEN * F16_BYTES
    elsewhere = wb.cached_prefix(model, PROMPT, cache_scope="tenant-b")
    assert (elsewhere.tokens, elsewhere.kind) == (0, "cold")
    assert probe_counters() == before                            # a probe: no hit or miss counted


@pytest.mark.load(type_k="q8_0", type_v="q8_0", n_seq_max=1)
def test_cached_prefix_bytes_follow_the_kv_type(fresh_model):
    wb.complete(fresh_model, PROMPT, response_tokens=4)
    assert wb.wait_for_saves()
    got = wb.cached_prefix(fresh_model, PROMPT)
    assert got.tokens > 0 and got.bytes == got.tokens * KV_VALUES_PER_TOKEN * Q8_0_BYTES


@pytest.mark.parametrize("bad", [None, "", 5])
def test_cached_prefix_names_a_bad_scope(model, bad):
    with pytest.raises(InvalidOption) as e:
        wb.cached_prefix(model, PROMPT, cache_scope=bad)
    assert e.value.key == "cache_scope" and repr(bad) in str(e.value)
