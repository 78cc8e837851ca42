"""The middleware chain around the facade's public calls, on the real default model:
seeing, rewriting, answering and refusing calls, the order of the chain, an exception
after a stream was made (the request is cancelled), and the timing view."""

from __future__ import annotations

import time

import pytest

import workbench as wb
from workbench.errors import InvalidOption, NotLoaded
from workbench.notebook import views
from waiting import wait_for

pytestmark = pytest.mark.model


@pytest.fixture(autouse=True)
def no_middleware_left():
    wb.middleware.clear()
    wb.middleware.clear_calls()
    yield
    wb.middleware.clear()
    wb.middleware.clear_calls()


class Refused(Exception):
    pass


def test_a_middleware_sees_each_call_its_arguments_and_its_result(model):
    seen = []

    def log(name, arguments, next):
        out = next(arguments)
        seen.append((name, arguments, out))
        return out

    assert wb.middleware.add(log) is log and wb.middleware.registered() == [log]
    ids = wb.tokenize(model, "Hello")
    r = wb.complete(model, "Hello", response_tokens=3, temperature=0.0)
    assert seen[0] == ("tokenize", {"model": model, "text": "Hello"}, ids)
    name, arguments, out = seen[1]
    assert name == "complete" and out is r       # options flattened in, defaults not filled in
    assert arguments == {"model": model, "prompt": "Hello", "response_tokens": 3, "temperature": 0.0}
    wb.middleware.remove(log)
    wb.complete(model, "Hello", response_tokens=1)
    assert len(seen) == 2


def test_a_middleware_rewrites_options_for_every_call_or_for_one(model):
    def cap(name, arguments, next):
        if name in ("complete", "stream"):
            arguments["response_tokens"] = min(arguments.get("response_tokens", 64), 2)
        return next(arguments)

    opts = dict(response_tokens=8, ignore_eos=True)
    assert len(wb.complete(model, "Once upon a time", middleware=[cap], **opts).tokens) == 2
    assert len(wb.complete(model, "Once upon a time", **opts).tokens) == 8      # that call only
    wb.middleware.add(cap)
    assert len(wb.complete(model, "Once upon a time", **opts).tokens) == 2
    assert len(wb.stream(model, "Once upon a time", **opts).result().tokens) == 2


def test_the_chain_runs_registered_middleware_in_order_then_the_calls_own(model):
    order = []

    def tag(label):
        def mw(name, arguments, next):
            order.append(f"{label}>")
            try:
                return next(arguments)
            finally:
                order.append(f"<{label}")
        return mw

    wb.middleware.add(tag("a"))
    wb.middleware.add(tag("b"))
    wb.model_info(model, middleware=[tag("c")])
    assert order == ["a>", "b>", "c>", "<c", "<b", "<a"]


def test_a_refusal_reaches_the_caller_as_itself_and_nothing_runs(model):
    err = Refused("no completions today")

    def refuse(name, arguments, next):
        if name == "complete":
            raise err
        return next(arguments)

    wb.middleware.add(refuse)
    before = wb.counters()["decode_calls"]
    with pytest.raises(Refused) as e:
        wb.complete(model, "Hello", response_tokens=4)
    assert e.value is err and wb.counters()["decode_calls"] == before
    assert wb.tokenize(model, "Hi") == wb.tokenize(model, "Hi", middleware=[])   # other calls pass


def test_a_middleware_may_answer_a_call_itself(model):
    answers = {}

    def memo(name, arguments, next):
        key = (name, repr(sorted(arguments.items())))
        if key not in answers:
            answers[key] = next(arguments)
        return answers[key]

    wb.middleware.add(memo)
    first = wb.complete(model, "The capital of France is", response_tokens=6)
    before = wb.counters()["decode_calls"]
    assert wb.complete(model, "The capital of France is", response_tokens=6) is first
    assert wb.counters()["decode_calls"] == before                       # no request ran


@pytest.mark.load(n_seq_max=1)
def test_an_exception_after_a_stream_was_made_cancels_its_request(fresh_model):
    m = fresh_model
    baseline = wb.complete(m, "Once upon a time", response_tokens=8)
    made = []

    def broken_after(name, arguments, next):
        made.append(next(arguments))
        raise Refused("the logger failed")

    with pytest.raises(Refused):
        wb.stream(m, "Once upon a time", response_tokens=4000, ignore_eos=True, middleware=[broken_after])
    assert made and made[0].ended                              # the chain closed the stream it made
    assert wait_for(lambda: not [q for q in wb.requests() if q["model"] == m])
    assert wb.model_info(m)["available_seqs"] == 1
    r = wb.complete(m, "Once upon a time", response_tokens=8)   # the model serves on, unchanged
    assert r.tokens == baseline.tokens and r.stats.queued_s < 1.0


def test_calls_made_inside_the_chain_are_not_wrapped_again(model):
    names = []

    def enrich(name, arguments, next):
        names.append(name)
        arguments.pop("note", None)
        wb.model_info(model)                   # a facade call from a middleware: no recursion
        return next(arguments)

    wb.middleware.add(enrich)
    assert wb.phase(model) in ("idle", "prefilling", "generating")
    assert names == ["phase"]


def test_timing_feeds_views_calls(model):
    wb.middleware.add(wb.middleware.timing)
    r = wb.complete(model, "Hello", response_tokens=4)
    s = wb.stream(model, "Hello", response_tokens=4)
    with pytest.raises(NotLoaded):
        wb.complete("no-such-model", "Hello")
    s.result()
    df = views.calls()
    assert list(df.columns) == ["call", "model", "duration_ms", "ok", "error", "ref", "started_at"]
    assert list(df["call"]) == ["complete", "stream", "complete"]
    done, made, failed = (df.iloc[i] for i in range(3))
    assert done["model"] == model and done["ok"] and done["ref"] == r.ref and done["duration_ms"] > 0
    assert made["ref"] == s.ref and made["ok"]              # a stream's row times its creation
    assert not failed["ok"] and failed["error"] == "NotLoaded" and failed["model"] == "no-such-model"
    assert df["started_at"].is_monotonic_increasing
    assert str(df["duration_ms"].dtype) == "float64" and str(df["ok"].dtype) == "bool"
    wb.middleware.clear_calls()
    assert views.calls().empty and list(views.calls().columns) == list(df.columns)


@pytest.mark.parametrize("bad", [42, "log", [print, 3], {"a": 1}])
def test_a_middleware_that_is_not_callable_is_refused(model, bad):
    with pytest.raises(InvalidOption) as e:
        wb.complete(model, "Hello", response_tokens=1, middleware=bad)
    assert e.value.key == "middleware"
    if not isinstance(bad, list):
        with pytest.raises(InvalidOption):
            wb.middleware.add(bad)
    assert wb.middleware.registered() == []


def test_next_refuses_arguments_that_are_not_a_dict(model):
    wb.middleware.add(lambda name, arguments, next: next(None))
    with pytest.raises(InvalidOption) as e:
        wb.model_info(model)
    assert e.value.key == "arguments"


def test_wrapped_calls_keep_their_signature_docs_and_pickle_by_reference(model):
    """Workers (Ray, multiprocessing) get wb's functions by reference; help() shows the real ones."""
    import inspect
    import pickle

    from workbench import generation

    assert pickle.loads(pickle.dumps(wb.complete)) is wb.complete
    assert inspect.signature(wb.complete) == inspect.signature(generation.complete)
    assert wb.complete.__doc__ == generation.complete.__doc__ and wb.complete.__wrapped__ is generation.complete


def test_calls_on_other_threads_run_their_own_chain(model):
    """The 'already inside a chain' guard is per thread: a call on another thread while one
    runs here is wrapped (and timed) as well."""
    import threading

    wb.middleware.add(wb.middleware.timing)
    entered = threading.Event()

    def slow(name, arguments, next):
        if name == "complete":
            entered.set()
            time.sleep(0.3)          # the other thread's call runs while this chain is open
        return next(arguments)

    t = threading.Thread(target=lambda: wb.complete(model, "Hello", response_tokens=2, middleware=[slow]))
    t.start()
    assert entered.wait(5)
    wb.tokenize(model, "Hi")
    t.join()
    assert sorted(views.calls()["call"]) == ["complete", "tokenize"]


def takes_two(arguments, next):
    return next(arguments)


def takes_four(name, arguments, next, extra):
    return next(arguments)


def next_by_keyword(name, arguments, *, next):
    return next(arguments)


@pytest.mark.parametrize("bad", [takes_two, takes_four, next_by_keyword])
def test_a_middleware_with_the_wrong_signature_is_refused_when_given(model, bad):
    """Not a TypeError from inside the call it wraps: an InvalidOption naming the option,
    the function and the signature expected; the call never runs."""
    before = wb.counters()["decode_calls"]
    with pytest.raises(InvalidOption) as e:
        wb.complete(model, "Hello", response_tokens=2, middleware=[bad])
    assert e.value.key == "middleware" and e.value.value is bad
    assert "fn(name, arguments, next)" in str(e.value) and bad.__name__ in str(e.value)
    assert wb.counters()["decode_calls"] == before
    with pytest.raises(InvalidOption) as e:
        wb.middleware.add(bad)
    assert e.value.key == "fn" and e.value.value is bad and "fn(name, arguments, next)" in str(e.value)
    assert wb.middleware.registered() == []


def drop_prompt(name, arguments, next):
    arguments.pop("prompt", None)
    return next(arguments)


def drop_model(name, arguments, next):
    arguments.pop("model", None)
    return next(arguments)


def empty_dict(name, arguments, next):
    return next({})


def no_arguments(name, arguments, next):
    return next()


def by_keywords(name, arguments, next):
    return next(**arguments)


@pytest.mark.parametrize("bad, says", [
    (drop_prompt, "missing a required argument: 'prompt'"), (drop_model, "missing a required argument: 'model'"),
    (empty_dict, "missing a required argument: 'model'"), (no_arguments, "next(arguments)"),
    (by_keywords, "next(arguments)"),
])
def test_next_without_the_model_or_the_prompt_is_refused_naming_the_middleware(model, bad, says):
    before = wb.counters()["decode_calls"]
    with pytest.raises(InvalidOption) as e:
        wb.complete(model, "Hello", response_tokens=2, middleware=[bad])
    assert e.value.key == "arguments" and says in str(e.value)
    assert repr(bad.__name__) in str(e.value) and "complete(model, prompt, n=..., best_of=..., **opts)" in str(e.value)
    assert wb.counters()["decode_calls"] == before
    wb.middleware.add(bad)                                         # registered: the same answer
    with pytest.raises(InvalidOption) as e:
        wb.complete(model, "Hello", response_tokens=2)
    assert e.value.key == "arguments" and says in str(e.value)


def test_next_with_a_name_the_call_does_not_take_is_refused(model):
    def add_note(name, arguments, next):
        return next(dict(arguments, note="hi"))

    with pytest.raises(InvalidOption) as e:
        wb.tokenize(model, "Hi", middleware=[add_note])
    assert e.value.key == "arguments" and e.value.value == {"model": model, "text": "Hi", "note": "hi"}
    assert "unexpected keyword argument 'note'" in str(e.value) and "'add_note'" in str(e.value)


def test_a_type_error_a_middleware_raises_itself_still_reaches_the_caller_as_itself(model):
    err = TypeError("the logger's own bug")

    def buggy(name, arguments, next):
        raise err

    with pytest.raises(TypeError) as e:
        wb.model_info(model, middleware=[buggy])
    assert e.value is err
