"""The IPython extension driven through InteractiveShell.run_cell, as a notebook would:
usage errors, plain-text output, results under --as, the kernel's Interrupt."""

from __future__ import annotations

import html
import itertools
import time
from typing import Any

import pytest
from IPython.core.error import UsageError

import workbench as wb
from .conftest import magics_of
from workbench import samples
from workbench.notebook import views
from workbench.cache import CacheNamespace
from workbench.engine.events import Token
from workbench.engine.stream import Stream
from workbench.notebook.magics import interpolate
from workbench.notebook.views import history as views_history

from .caches import put, row_bytes, whole_rows


def usage_error(result: Any) -> str:
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    return str(result.error_in_exec)


# --- without a model ------------------------------------------------------------------------

def test_load_ext_registers_and_unload_removes(ip: Any) -> None:
    assert "wb" in ip.magics_manager.magics["line"]
    assert {"generate", "chat"} <= set(ip.magics_manager.magics["cell"])
    ip.run_cell("%unload_ext workbench")
    assert "wb" not in ip.magics_manager.magics["line"]
    assert ip.run_cell("%load_ext workbench.notebook").success
    assert "generate" in ip.magics_manager.magics["cell"]


def test_help_and_unknown_commands(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_cell("%wb help")
    out = capsys.readouterr().out
    for usage in ("  load [PATH|default] [--id ID] [--n-ctx N] [--n-seq-max N]\n", "  evict BYTES [--tier T] ",
                  "  pin KEY "):
        assert usage in out  # tests/notebook/test_help.py: the table itself
    assert "unknown %wb command 'frobnicate'" in usage_error(ip.run_cell("%wb frobnicate"))
    assert "invalid int value: 'many'" in usage_error(ip.run_cell("%wb load default --n-ctx many"))
    assert "unrecognized arguments: --bogus" in usage_error(ip.run_cell("%wb models --bogus"))
    assert "(did you mean models or mode?)" in usage_error(ip.run_cell("%wb modles"))
    err = usage_error(ip.run_cell("%%generate --max_tokens 5\nHi"))
    assert "did you mean --max-tokens?" in err            # the magic's flags, as the user typed them
    assert "did you mean --max-tokens?" in usage_error(ip.run_cell("%%chat --max_tokens 5\nHi"))


def test_load_errors_name_the_reason(ip: Any) -> None:
    msg = usage_error(ip.run_cell("%wb load /no/such/model.gguf"))
    assert "/no/such/model.gguf" in msg
    msg = usage_error(ip.run_cell("%wb load default --n-seq-max 0"))
    assert "n_seq_max" in msg and "0" in msg
    assert "is not loaded" in usage_error(ip.run_cell("%wb unload nbtest-missing"))


def test_cache_commands_on_a_cache_variable(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    tick = itertools.count()
    cache = whole_rows(2000, "lru", lambda: float(next(tick)))
    ns = CacheNamespace("ab" * 32)
    k1 = put(cache, ns, [1, 2, 3], b"x" * 300)
    k2 = put(cache, ns, [4, 5], b"y" * 200)
    ip.user_ns["nbtest_cache"] = cache
    rows = ip.run_cell("%wb cache --cache nbtest_cache").result
    assert list(rows.index) == [k1, k2]
    used = row_bytes(3, 300) + row_bytes(2, 200)   # chunk files and manifests
    assert ip.run_cell("%wb tiers --cache nbtest_cache").result.loc["ram", "used_bytes"] == used
    ip.run_cell(f"%wb pin {k1[:10]} --cache nbtest_cache")
    assert f"pinned {k1[:10]}" in capsys.readouterr().out
    assert cache.rows()[0]["pinned"]
    ip.run_cell("%wb evict 100 --cache nbtest_cache")
    assert f"freed {row_bytes(2, 200)} B" in capsys.readouterr().out  # the unpinned row went, the pinned one stayed
    assert list(cache.keys()) == [k1]
    assert "not a byte size" in usage_error(ip.run_cell("%wb evict lots --cache nbtest_cache"))
    assert "no cached row 'ffff'" in usage_error(ip.run_cell("%wb pin ffff --cache nbtest_cache"))
    assert "not a variable holding" in usage_error(ip.run_cell("%wb cache --cache nbtest_nothing"))
    counters = ip.run_cell("%wb counters --cache nbtest_cache").result
    assert counters.loc[("cache", "evictions_ram"), "value"] == 1


def test_generate_without_a_model(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wb, "list_models", lambda: [])
    assert "no model is loaded" in usage_error(ip.run_cell("%%generate\nHello"))
    assert "no model is loaded" in usage_error(ip.run_cell("%wb cache"))


def test_interpolation() -> None:
    ns = {"topic": "the moon", "n": 3, "d": {"k": [10, 20]}, "x": 0.5}
    assert interpolate("About {topic}, {n!r} times, {d[k]}, {x:.2f}", ns) == "About the moon, 3 times, [10, 20], 0.50"
    assert interpolate('JSON stays: {"a": {"b": 1}} and {{topic}}', ns) == 'JSON stays: {"a": {"b": 1}} and {topic}'
    with pytest.raises(UsageError, match=r"\{nope\}"):
        interpolate("Hi {nope}", ns)


# --- with the model -----------------------------------------------------------------------------

@pytest.fixture
def shell(ip: Any, model: str) -> Any:
    magics_of(ip).current_model = model
    return ip


@pytest.mark.model
def test_generate_prints_text_and_stores_the_result(shell: Any, model: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    shell.user_ns["nbtest_city"] = "Paris"
    # --ignore-eos: a plain prompt may draw end-of-turn first (an empty reply prints nothing)
    r = shell.run_cell("%%generate --max-tokens 12 --seed 3 --ignore-eos --as nbtest_r\n"
                       "The capital of France is {nbtest_city}? Answer:")
    assert r.success, r.error_in_exec
    res = shell.user_ns["nbtest_r"]
    out = capsys.readouterr().out
    assert res.reply and res.reply in out
    assert f"[{res.cache_hit_kind}] ttft" in out
    assert out.splitlines()[-1].endswith("· max tokens reached" if res.finish_reason == "length" else "· end of turn")
    assert res.stats.prompt_tokens > 8 and res.model == model
    # same greedy prompt as complete() gives the same reply
    direct = wb.complete(model, "The capital of France is Paris? Answer:", response_tokens=12, ignore_eos=True)
    assert direct.reply == res.reply
    # %wb history is the engine's: the magic's request and the API call's, in order
    assert list(shell.run_cell("%wb history").result["ref"].iloc[-2:]) == [res.ref, direct.ref]


@pytest.mark.model
def test_an_empty_reply_says_why(shell: Any, model: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A chat model given a plain question (no chat template) samples its end-of-generation
    token first: the reply is empty, and the view and the Result say why and what to try."""
    r = shell.run_cell("%%generate --temperature 0 --max-tokens 8 --as nbtest_e\nWhat is the capital of France?")
    assert r.success, r.error_in_exec
    res = shell.user_ns["nbtest_e"]
    assert res.reply == "" and res.stats.generated_tokens == 0 and res.finish_reason == "stop"
    why = ("the model ended its turn at once (its first token was end-of-generation); a chat model usually "
           "needs its chat template: try %%chat (or workbench.chat)")
    out = capsys.readouterr().out
    last = out.splitlines()[-1]
    assert "+ 0 generated · " in last and last.endswith(f" · {why}")
    assert "end of turn" not in out
    assert res.as_text().endswith(why) and html.escape(why) in res._repr_html_()


@pytest.mark.model
def test_a_hit_on_a_row_another_model_id_saved_names_that_model(shell: Any, model: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Two model ids loaded from one file with the same KV settings share cache rows (same
    weights, same namespace): the second id's first request is a hit, and what shows the hit
    (the view's line, the Result, the history) names the model whose save it restored. The
    model's own rows add nothing to the line."""
    prompt = ("Name three rivers of Europe and the countries each one flows through, one river per line, "
              "in the order of their length, the longest first (nbtest saved-by):")
    wb.complete(model, prompt, response_tokens=4, ignore_eos=True)
    assert wb.wait_for_saves()
    assert shell.run_cell("%wb load default --id nbtest-second --n-ctx 1024 --n-seq-max 1").success
    try:
        capsys.readouterr()
        r = shell.run_cell(f"%%generate --max-tokens 4 --ignore-eos --as nbtest_s\n{prompt}")
        assert r.success, r.error_in_exec
        res = shell.user_ns["nbtest_s"]
        assert res.model == "nbtest-second" and res.cache_hit_kind == "exact"
        assert res.stats.cache_saved_by == model
        said = f"cache: {res.stats.cache_delta['read']:,} tokens read (saved by model {model!r})"
        assert said in capsys.readouterr().out.splitlines()[-1] and said in res.summary()
        assert views_history("nbtest-second").iloc[-1]["cache_saved_by"] == model
        own = wb.complete(model, prompt, response_tokens=4, ignore_eos=True)
        assert own.stats.cache_hit_kind == "exact" and own.stats.cache_saved_by == model
        cold = wb.complete(model, "A prompt no row holds, nbtest saved-by 7:", response_tokens=2, cache=False)
        assert cold.stats.cache_saved_by is None
    finally:
        assert shell.run_cell("%wb unload nbtest-second").success
    from workbench.notebook.results import Result
    assert "saved by" not in Result.of(own).summary()


@pytest.mark.model
def test_wb_history_covers_every_request_in_milliseconds(shell: Any, model: str) -> None:
    a = wb.complete(model, "One two three", response_tokens=3, ignore_eos=True)
    b = wb.complete(model, "Four five six", response_tokens=3, ignore_eos=True)
    hist = views_history(model)
    df = shell.run_cell(f"%wb history --model {model} --last 2").result
    assert list(df["ref"]) == [a.ref, b.ref] and set(df["model"]) == {model}
    for row in df.itertuples():
        assert row.ttft_ms == pytest.approx(hist.loc[row.ref, "ttft_s"] * 1000)
        assert row.e2e_ms == pytest.approx(hist.loc[row.ref, "e2e_s"] * 1000)
        assert row.generated_tokens == 3
    lat = shell.run_cell(f"%wb history --model {model} --last 2 --latency").result
    assert lat.loc["e2e_s", "count"] == 2                        # a count, not scaled
    assert lat.loc["e2e_s", "p50_ms"] == pytest.approx(df["e2e_ms"].median())
    assert "--by nope" in usage_error(shell.run_cell("%wb history --latency --by nope"))
    assert "--last 0" in usage_error(shell.run_cell("%wb history --last 0"))


@pytest.mark.model
def test_generate_default_var_stop_and_no_stream(shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert shell.run_cell("%%generate --max-tokens 40 --stop , \\n\nList three fruits:").success
    res = shell.user_ns["_wb"]
    assert "," not in res.reply and res.finish_reason in ("stop", "length")
    capsys.readouterr()
    assert shell.run_cell("%%generate --no-stream --max-tokens 5 --as nbtest_q\nOne, two,").success
    q = shell.user_ns["nbtest_q"]
    assert q.stats.generated_tokens <= 5 and q.reply in capsys.readouterr().out


@pytest.mark.model
def test_generate_usage_errors(shell: Any) -> None:
    assert "temperature" in usage_error(shell.run_cell("%%generate --temperature -1\nHi"))
    assert "invalid int value: 'x'" in usage_error(shell.run_cell("%%generate --max-tokens x\nHi"))
    assert "the cell is empty" in usage_error(shell.run_cell("%%generate\n   "))
    assert "{nbtest_undefined}" in usage_error(shell.run_cell("%%generate\nHi {nbtest_undefined}"))
    assert "not a valid variable name" in usage_error(shell.run_cell("%%generate --as 1x\nHi"))
    assert "neither a variable" in usage_error(shell.run_cell("%%generate --grammar nbtest_nogrammar\nHi"))
    assert "is not loaded" in usage_error(shell.run_cell("%%generate --model nbtest-none\nHi"))
    shell.user_ns["nbtest_schema"] = 42
    assert "json_schema" in usage_error(shell.run_cell("%%generate --json-schema nbtest_schema\nHi"))


@pytest.mark.model
def test_generate_with_grammar_variable(shell: Any) -> None:
    shell.user_ns["nbtest_yesno"] = 'root ::= "yes" | "no"'
    assert shell.run_cell("%%generate --grammar nbtest_yesno --max-tokens 4 --as nbtest_g\nIs water wet?").success
    assert shell.user_ns["nbtest_g"].reply in ("yes", "no")


@pytest.mark.model
def test_interrupt_cancels_the_request(shell: Any, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A KeyboardInterrupt while the stream is consumed (the kernel's Interrupt after two
    tokens): the request is cancelled, the output says so, the partial Result is stored."""
    real_poll = Stream.poll
    seen = {"tokens": 0, "raised": False}

    def interrupted_poll(self: Stream, timeout: float | None = 0.0) -> Any:
        ev = real_poll(self, timeout)
        if isinstance(ev, Token):
            seen["tokens"] += 1
            if seen["tokens"] == 2 and not seen["raised"]:
                seen["raised"] = True
                raise KeyboardInterrupt
        return ev

    monkeypatch.setattr(Stream, "poll", interrupted_poll)
    cancelled_before = wb.counters()["finished_cancelled"]
    r = shell.run_cell("%%generate --max-tokens 300 --ignore-eos --as nbtest_i\nCount from one to one thousand:")
    assert isinstance(r.error_in_exec, KeyboardInterrupt)
    res = shell.user_ns["nbtest_i"]
    assert res.finish_reason == "cancelled" and res.cancelled
    assert 2 <= res.stats.generated_tokens < 300
    assert wb.counters()["finished_cancelled"] == cancelled_before + 1
    captured = capsys.readouterr()
    assert "[cancelled" in captured.out and "· cancelled" in captured.out
    shown = (captured.out + captured.err).strip().splitlines()
    assert shown[-1] == (f"GenerationInterrupted: generation cancelled after {res.stats.generated_tokens} "
                         "tokens; the partial result is in `nbtest_i`")  # one line, no traceback
    assert "Traceback" not in captured.out + captured.err
    assert wb.requests() == [] or all(q["ref"] != res.ref for q in wb.requests())


@pytest.mark.model
def test_background_generation(shell: Any) -> None:
    """While it runs, the variable shows that it runs (not None); once done, the Result."""
    assert shell.run_cell("%%generate --background --max-tokens 100 --ignore-eos --as nbtest_bg\n"
                          "Write a long story about a dragon:").success
    handle = shell.user_ns["nbtest_bg"]
    assert handle.running and handle.result is None
    assert "running in the background · " in handle.as_text() and handle.as_text() in repr(handle)
    res = handle.wait(600)
    assert res is not None and res.ok and res.stats.generated_tokens == 100
    assert handle.as_text() == res.as_text() and not handle.running
    deadline = time.monotonic() + 10  # on_done stores the Result just after the handle has it
    while shell.user_ns["nbtest_bg"] is handle and time.monotonic() < deadline:
        time.sleep(0.01)
    assert shell.user_ns["nbtest_bg"] is res


@pytest.mark.model
def test_sessions_make_the_second_turn_sticky(shell: Any, model: str) -> None:
    cell = "%%generate --session nbtest-s --max-tokens 4 --as nbtest_t{n}\nTell me a story about a cat{tail}"
    assert shell.run_cell(cell.format(n=1, tail="")).success
    first = shell.user_ns["nbtest_t1"]
    turn2 = "Tell me a story about a cat" + first.reply + " and a dog"
    assert shell.run_cell(f"%%generate --session nbtest-s --max-tokens 4 --as nbtest_t2\n{turn2}").success
    second = shell.user_ns["nbtest_t2"]
    assert second.cache_hit_kind == "sticky"
    assert second.stats.prefilled_tokens < second.stats.prompt_tokens
    wb.end_session(model, "nbtest-s")


@pytest.mark.model
def test_wb_commands_with_the_model(shell: Any, model: str, capsys: pytest.CaptureFixture[str]) -> None:
    models = shell.run_cell("%wb models").result
    assert model in models.index
    counters = shell.run_cell("%wb counters").result
    assert ("engine", "decode_calls") in counters.index
    cache = shell.run_cell("%wb cache")
    assert cache.error_in_exec is None and cache.result.index.name == "key"
    shell.run_cell("%wb mode")
    assert "display mode: text" in capsys.readouterr().out


@pytest.mark.model
def test_load_and_unload_through_the_magic(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_cell("%wb load default --id nbtest-load --n-ctx 512 --n-seq-max 2").success
    assert "loaded 'nbtest-load'" in capsys.readouterr().out
    try:
        info = wb.model_info("nbtest-load")
        assert info["n_seq_max"] == 2 and info["n_ctx"] == 512
        assert magics_of(ip).current_model == "nbtest-load"
        assert "already" in usage_error(ip.run_cell("%wb load default --id nbtest-load")).lower()
    finally:
        assert ip.run_cell("%wb unload nbtest-load").success
    assert magics_of(ip).current_model is None


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.model
def test_chat_magic(shell: Any) -> None:
    r = shell.run_cell("%%chat --max-tokens 12 --session nbtest-s --new --as nbtest_c\nSay hello.")
    assert r.success, r.error_in_exec
    res = shell.user_ns["nbtest_c"]
    assert res.ok and res.reply and res.stats.generated_tokens <= 12
    conv = magics_of(shell).chats[f"{magics_of(shell).current_model}/nbtest-s"]
    # the parsed assistant message joins the history
    assert [m["role"] for m in conv] == ["user", "assistant"] and conv[1]["content"] == res.reply
    assert conv[1]["tool_calls"] == []
    r = shell.run_cell("%%chat --max-tokens 8 --session nbtest-s --as nbtest_c2\nAnd goodbye?")
    assert r.success and len(conv) == 4
    assert shell.user_ns["nbtest_c2"].cache_hit_kind == "sticky"
    # options that the default model's template cannot honour are usage errors, named
    shell.user_ns["nbtest_tools"] = [WEATHER_TOOL]
    err = usage_error(shell.run_cell("%%chat --tools nbtest_tools --tool-choice required\nWeather in Oslo?"))
    assert "tool_choice" in err and "no tool-call format" in err
    assert "--tools nope" in usage_error(shell.run_cell("%%chat --tools nope\nhi"))
    assert len(conv) == 4                              # a failed turn leaves the history alone


@pytest.mark.model
def test_generate_samples_side_by_side(shell: Any) -> None:
    """--n: the samples of one prefill, as a table of one row each; --as holds the list.
    --best-of: the best by mean logprob per token (the same seeds: one of the --n samples)."""
    cell = "--max-tokens 6 --temperature 1.0 --seed 11 --ignore-eos --logprobs 0"
    prompt = "Name three animals of the forest and say what each eats in winter:"
    r = shell.run_cell(f"%%generate --n 3 {cell} --as nbtest_s\n{prompt}")
    assert r.success, r.error_in_exec
    res = shell.user_ns["nbtest_s"]
    assert len(res) == 3 and all(x.stats.generated_tokens == 6 for x in res)
    assert [x.stats.seed for x in res] == [11, 12, 13]
    table = views.samples(res)
    assert list(table.index) == [0, 1, 2] and list(table["reply"]) == [x.reply for x in res]
    assert list(table["mean_logprob"]) == [samples.score(x) for x in res]
    r = shell.run_cell(f"%%generate --best-of 3 {cell} --as nbtest_b\n{prompt}")
    assert r.success, r.error_in_exec
    (best,) = shell.user_ns["nbtest_b"]
    assert best.tokens == max(res, key=samples.score).tokens


@pytest.mark.model
def test_chat_thinking_on_a_template_without_it_says_so_once(shell: Any,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    model = magics_of(shell).current_model
    magics_of(shell).thinking_warned.discard(model)
    capsys.readouterr()
    assert shell.run_cell("%%chat --thinking --max-tokens 4 --new\nHi").success
    first = capsys.readouterr().out
    assert f"note: {model}'s chat template has no thinking block" in first
    lines = first[first.index("note: "):].splitlines()
    note = lines[:next(i for i, line in enumerate(lines) if line.endswith("to split one out)")) + 1]
    assert len(note) > 1 and all(len(line) <= 88 for line in note)  # wrapped between words, by us
    assert " ".join(note).endswith("load the model with thinking_markers={'start': ..., 'end': ...} to split one out)")
    assert shell.run_cell("%%chat --thinking --max-tokens 4 --new\nHi again").success
    assert "thinking block" not in capsys.readouterr().out  # once per model


@pytest.mark.heavy
def test_chat_magic_tool_loop_with_qwen_coder(ip: Any) -> None:
    """A whole tool round trip from magics: the call, the tool's result, the answer."""
    from tests.integration.heavy_models import fetch_chunked

    mid = wb.load_model(model_path=str(fetch_chunked()), model_id="nbtest-qwen", n_ctx=4096, n_seq_max=1)
    try:
        magics_of(ip).current_model = mid
        ip.user_ns["nbtest_tools"] = [WEATHER_TOOL]
        r = ip.run_cell("%%chat --tools nbtest_tools --tool-choice required --max-tokens 64 --as nbtest_call\n"
                        "What is the weather like in Paris right now?")
        assert r.success, r.error_in_exec
        call = ip.user_ns["nbtest_call"].raw.tool_calls[0]
        assert call["name"] == "get_weather" and call["arguments"]["city"].lower() == "paris"
        r = ip.run_cell(f"%%chat --tools nbtest_tools --tool-result {call['id']} --max-tokens 48 --as nbtest_ans\n"
                        "sunny, 21 C")
        assert r.success, r.error_in_exec
        conv = magics_of(ip).chats[f"{mid}/"]
        assert [m["role"] for m in conv] == ["user", "assistant", "tool", "assistant"]
        assert conv[1]["tool_calls"][0]["id"] == call["id"] and conv[2]["tool_call_id"] == call["id"]
        assert ip.user_ns["nbtest_ans"].stats.cache_hit_kind != "cold"   # the call's turn was cached
    finally:
        wb.unload(mid)


@pytest.mark.model
def test_ngram_flag_speculates_with_the_same_greedy_reply(shell: Any) -> None:
    from tests.integration.test_speculative import COPY  # a reply that copies code from its prompt

    shell.user_ns["nbtest_copy"] = COPY
    assert shell.run_cell("%%generate --max-tokens 64 --as nbtest_plain\n{nbtest_copy}").success
    assert shell.run_cell("%%generate --max-tokens 64 --ngram cache --spec-n-max 4 --as nbtest_spec\n"
                          "{nbtest_copy}").success
    plain, spec = shell.user_ns["nbtest_plain"], shell.user_ns["nbtest_spec"]
    assert spec.reply == plain.reply
    assert spec.stats.speculative is not None and spec.stats.speculative["kind"] == "ngram-cache"
    assert plain.stats.speculative is None
    assert "choose one way" in usage_error(shell.run_cell("%%generate --draft x --ngram simple\nHi"))
    assert "needs --draft" in usage_error(shell.run_cell("%%generate --spec-n-max 3\nHi"))
    assert "is not loaded" in usage_error(shell.run_cell("%%generate --draft nbtest-nodraft\nHi"))


def test_cache_commands_on_a_chunked_cache_variable(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The same commands over chunk storage (the default), plus %wb chunks."""
    from workbench.cache import keys
    from workbench.cache.chunk_store import ChunkStore
    from workbench.cache.chunked import ChunkedCache

    cache = ChunkedCache(ChunkStore(None, 10_000, chunk_size=16))
    ns = CacheNamespace("ab" * 32)
    saved = []
    for tokens in (list(range(40)), list(range(40)) + [7] * 9):
        chunk_keys = keys.chunk_keys(ns.digest(), tokens, 16)
        saved.append(cache.put(ns, tokens, [k * 20 for k in chunk_keys][cache.missing(ns, tokens):]))
    ip.user_ns["nbtest_chunks"] = cache
    assert set(ip.run_cell("%wb cache --cache nbtest_chunks").result.index) == set(saved)
    chunks = ip.run_cell("%wb chunks --cache nbtest_chunks").result
    assert len(chunks) == len(cache.chunk_rows()) == 4 and chunks["leaf"].iloc[0]  # leaves first
    assert ip.run_cell("%wb tiers --cache nbtest_chunks").result.loc["ram", "chunks"] == 4
    ip.run_cell(f"%wb pin {saved[0][:10]} --cache nbtest_chunks")
    assert f"pinned {saved[0][:10]}" in capsys.readouterr().out
    ip.run_cell(f"%wb unpin {saved[0][:10]} --cache nbtest_chunks")
    assert f"unpinned {saved[0][:10]}" in capsys.readouterr().out
    ip.run_cell("%wb evict 1 --cache nbtest_chunks")
    assert "freed" in capsys.readouterr().out and len(cache.chunk_rows()) == 3   # one leaf went
    assert "no chunk tier named 'nope'" in usage_error(ip.run_cell("%wb evict 1 --tier nope --cache nbtest_chunks"))
    ip.user_ns["nbtest_rows"] = rows = whole_rows(10_000)
    put(rows, ns, list(range(40)), b"kv" * 20)
    assert len(ip.run_cell("%wb chunks --cache nbtest_rows").result) == 1   # whole rows: one chunk a row
