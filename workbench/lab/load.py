"""Open-loop load tests: a lab trace's requests sent at their arrival times (or Poisson at a
rate) to a loaded model or to any OpenAI-compatible endpoint, measured by the client.

    from workbench import lab
    result = lab.load_test(model, lab.traces.multi_turn_chats(200), rate=4, duration_s=60,
                           slo={"ttft_s": 1.0, "tpot_s": 0.1})
    result.summary          # throughput, latency percentiles, goodput
    result.requests         # one row per request (a DataFrame)

Open loop: a request is sent at its arrival time whether or not earlier ones have finished
(vLLM's `bench serve`, SGLang's bench_serving, guidellm's constant / poisson profiles), so a
slow server builds a queue instead of slowing the arrivals. ``max_concurrency`` caps the
requests in flight (a request due while the cap is reached waits, and its latency counts
from its scheduled arrival: the wait is the server's fault as much as a queue would be).

The clock is the client's (``time.perf_counter()``): TTFT is from the scheduled arrival to
the first token's text, TPOT the mean gap between later tokens, ITL every gap, E2E from the
arrival to the end. The same client measures every target: ``target`` is a model id (the
in-process engine, through ``wb.stream``) or the base URL of an OpenAI-compatible server
(``http://host:port``: this workbench's ``wb.serve``, llama-server, vLLM), driven by its
streaming ``/v1/completions`` with the prompt as token ids.

Ctrl-C (a notebook's Interrupt) stops sending, cancels what is in flight and returns the
partial result (``result.interrupted``).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidOption
from ..options import check_scope
from .traces import Trace

SLO_METRICS = ("ttft_s", "tpot_s", "e2e_s")
MAX_THREADS = 1024  # requests in flight the in-process client follows at once
WHERE = "lab.load_test"


@dataclass
class LoadResult:
    """What a load test measured: ``requests`` (a DataFrame, one row per request sent) and
    ``summary`` (a dict)."""

    requests: Any
    summary: dict[str, Any]
    interrupted: bool = False

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        s = self.summary
        p.text(f"<LoadResult {s['completed']} of {s['sent']} requests in {s['duration_s']:.1f} s; "
               f"{s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} tok/s; "
               f"p99 TTFT {s['ttft_s_p99']:.3f} s" + ("; interrupted" if self.interrupted else "") + ">")

    def plot(self, **kw: Any) -> Any:
        """Latency CDFs, TTFT by arrival, throughput and hit kinds over time, in one Figure
        (``workbench.notebook.load_plots``, whose single figures take this result too)."""
        from workbench.notebook.load_plots import load_panels

        return load_panels(self, **kw)


@dataclass
class _Sent:
    index: int
    arrival_s: float            # scheduled, from the start of the run
    prompt_tokens: int
    sent_s: float | None = None  # when it was sent (later than arrival_s while max_concurrency held it)
    ref: int | None = None       # the engine's request (in-process, or a workbench endpoint's)
    first_s: float | None = None
    end_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    generated_tokens: int = 0
    cached_tokens: int | None = None
    cache_hit_kind: str | None = None
    error: str | None = None


def load_test(target: str, workload: Trace, *, rate: float | None = None, duration_s: float | None = None,
              max_concurrency: int | None = None, slo: Mapping[str, float] | None = None, seed: int = 0,
              response_tokens: int | None = None, max_prompt_tokens: int | None = None,
              model: str | None = None, cache_scope: str | None = None, progress: bool = True) -> LoadResult:
    """Send ``workload``'s requests open-loop to ``target`` (see the module doc).

    ``rate``: Poisson arrivals at this many requests/s (seeded); None: the trace's own
    arrival times. ``duration_s``: stop sending after this long (requests in flight finish).
    ``response_tokens``: tokens each request generates (ignore_eos); None: the trace's reply
    length (at least 1). ``max_prompt_tokens``: cut each prompt to its first N tokens (shared
    prefixes stay shared), so a small model can serve production-length traces. ``model``:
    the model name to send to a URL target (None: the first of its /v1/models).
    ``cache_scope``: the in-process requests' tenant (their rows are shared with no other
    scope; ``lab.load_sweep`` gives each setting a fresh one, so none starts warm from the
    one before). Every request is greedy (temperature 0) and ignores end-of-sequence, on
    every target.
    """
    _check(target, workload, rate, duration_s, max_concurrency, slo, response_tokens, max_prompt_tokens)
    url = target.startswith(("http://", "https://"))
    if cache_scope is not None:
        check_scope("cache_scope", cache_scope, WHERE)
    if cache_scope is not None and url:
        raise InvalidOption("cache_scope", cache_scope, "None for a URL target (only in-process requests take "
                            "a scope; a workbench endpoint maps scopes from its scope_header)", WHERE)
    arrivals = _arrivals(workload, rate, seed, duration_s)
    jobs = [(i, at, _prompt(workload, i, max_prompt_tokens), _reply_len(workload, i, response_tokens))
            for i, at in arrivals]
    sender = _url_sender(target, model) if url else _engine_sender(target, cache_scope)
    sent: list[_Sent] = []
    interrupted = False
    start = time.perf_counter()
    try:
        asyncio.run(_run(jobs, sender, sent, max_concurrency, progress))
    except KeyboardInterrupt:
        interrupted = True
    return _result(sent, time.perf_counter() - start, slo or {}, interrupted)


# --- arguments -----------------------------------------------------------------------------------

def _check(target: Any, workload: Any, rate: Any, duration_s: Any, max_concurrency: Any, slo: Any,
           response_tokens: Any, max_prompt_tokens: Any) -> None:
    if not isinstance(target, str) or not target:
        raise InvalidOption("target", target, "a loaded model's id or an endpoint's URL (http://host:port)", WHERE)
    if not isinstance(workload, Trace) or len(workload) == 0:
        raise InvalidOption("workload", workload, "a non-empty lab Trace (workbench.lab.traces)", WHERE)
    for key, v, lo in (("rate", rate, 0.0), ("duration_s", duration_s, 0.0)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v <= lo):
            raise InvalidOption(key, v, "None or a finite number > 0", WHERE)
    for key, v in (("max_concurrency", max_concurrency), ("response_tokens", response_tokens),
                   ("max_prompt_tokens", max_prompt_tokens)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InvalidOption(key, v, "None or an integer >= 1", WHERE)
    if slo is not None and (not isinstance(slo, Mapping) or any(
            k not in SLO_METRICS or isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0
            for k, v in slo.items())):
        raise InvalidOption("slo", slo, "a dict of bounds in seconds over " + ", ".join(SLO_METRICS), WHERE)


def _arrivals(trace: Trace, rate: float | None, seed: int, duration_s: float | None) -> list[tuple[int, float]]:
    """(request index, arrival in seconds from the start), in order, within duration_s."""
    if rate is None:
        t0 = float(trace.arrival_s[0])
        times = [float(t) - t0 for t in trace.arrival_s]
    else:
        rng, t, times = random.Random(seed), 0.0, []
        for _ in range(len(trace)):
            times.append(t)
            t += rng.expovariate(rate)
    return [(i, t) for i, t in enumerate(times) if duration_s is None or t < duration_s]


def _prompt(trace: Trace, i: int, cap: int | None) -> list[int]:
    tokens = trace.prompt_token_ids(i)
    return tokens[:cap] if cap is not None else tokens


def _reply_len(trace: Trace, i: int, fixed: int | None) -> int:
    return fixed if fixed is not None else max(1, int(trace[i].reply_tokens))


# --- the run -------------------------------------------------------------------------------------

async def _run(jobs: list[tuple[int, float, list[int], int]], sender: Any, sent: list[_Sent],
               max_concurrency: int | None, progress: bool) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    # each in-process stream waits for its next event in the loop's executor: one thread per
    # request in flight (the default, cores + 4, would hold the rest back and skew the clock)
    workers = min(max_concurrency or len(jobs), MAX_THREADS) + 4
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wb-load")
    asyncio.get_running_loop().set_default_executor(executor)
    send, close = await sender()
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(jobs), desc="load test", unit="req", disable=not progress, leave=False)
    start = time.perf_counter()
    tasks = []
    try:
        for index, at, prompt, n_out in jobs:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = _Sent(index, at, len(prompt))
            sent.append(rec)
            tasks.append(asyncio.create_task(_one(send, rec, prompt, n_out, start, gate, bar)))
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await close()
        bar.close()
        executor.shutdown(wait=False, cancel_futures=True)


async def _one(send: Any, rec: _Sent, prompt: list[int], n_out: int, start: float,
               gate: asyncio.Semaphore | None, bar: Any) -> None:
    try:
        if gate is not None:
            async with gate:
                rec.sent_s = time.perf_counter() - start
                await send(rec, prompt, n_out, start)
        else:
            rec.sent_s = time.perf_counter() - start
            await send(rec, prompt, n_out, start)
    except asyncio.CancelledError:
        rec.error = rec.error or "cancelled"
        raise
    except Exception as e:  # noqa: BLE001 - a failed request is a measurement, not a crash
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.end_s = time.perf_counter() - start
        bar.update(1)


def _engine_sender(model: str, cache_scope: str | None) -> Any:
    import workbench as wb

    wb.model_info(model)  # NotLoaded names it before anything is sent
    scope: dict[str, Any] = {} if cache_scope is None else {"cache_scope": cache_scope}

    async def nothing() -> None:
        return None

    async def make() -> tuple[Any, Any]:
        return send, nothing

    async def send(rec: _Sent, prompt: list[int], n_out: int, start: float) -> None:
        s = wb.stream(model, prompt, response_tokens=n_out, ignore_eos=True, temperature=0.0, **scope)
        rec.ref = s.ref
        async for ev in s:
            if isinstance(ev, wb.Token) and ev.text:
                _token(rec, start)
            elif isinstance(ev, wb.Done):
                rec.generated_tokens = ev.stats.generated_tokens
                rec.cached_tokens = ev.stats.cache_delta["read"]
                rec.cache_hit_kind = ev.stats.cache_hit_kind
            elif isinstance(ev, wb.Error):
                raise ev.reason

    return make


def _url_sender(url: str, model: str | None) -> Any:
    import httpx

    base = url.rstrip("/")
    if model is None:
        with httpx.Client(timeout=30) as c:
            model = c.get(base + "/v1/models").raise_for_status().json()["data"][0]["id"]
    holder: dict[str, Any] = {}

    async def make() -> tuple[Any, Any]:
        holder["client"] = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30),
                                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return send, holder["client"].aclose

    async def send(rec: _Sent, prompt: list[int], n_out: int, start: float) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": n_out, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        async with holder["client"].stream("POST", base + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}")
            async for line in r.aiter_lines():
                _sse_line(rec, line, start)

    return make


def _sse_line(rec: _Sent, line: str, start: float) -> None:
    """One line of an SSE stream of completion chunks (`data: {...}`, `data: [DONE]`)."""
    if not line.startswith("data:"):
        return
    data = line[5:].strip()
    if data == "[DONE]":
        return
    chunk = json.loads(data)
    if "error" in chunk:
        raise RuntimeError(chunk["error"].get("message", "error"))
    for choice in chunk.get("choices") or ():
        if choice.get("text"):
            _token(rec, start)
    usage = chunk.get("usage")
    if usage:
        rec.generated_tokens = usage.get("completion_tokens", 0)
        rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        facts = (chunk.get("workbench") or {}).get("requests") or [{}]
        rec.cache_hit_kind = facts[0].get("cache_hit_kind")
        rec.ref = facts[0].get("ref")


def _token(rec: _Sent, start: float) -> None:
    now = time.perf_counter() - start
    if rec.first_s is None:
        rec.first_s = now
    rec.token_s.append(now)


# --- the result ----------------------------------------------------------------------------------

REQUEST_COLUMNS = ["request", "arrival_s", "sent_s", "end_s", "ref", "ttft_s", "tpot_s", "e2e_s", "itl_s",
                   "prompt_tokens", "generated_tokens", "cached_tokens", "cache_hit_kind", "error", "meets_slo"]


def _result(sent: Sequence[_Sent], duration: float, slo: Mapping[str, float], interrupted: bool) -> LoadResult:
    import numpy as np
    import pandas as pd

    rows = []
    for r in sent:
        gaps = np.diff(np.asarray(r.token_s, dtype=np.float64))
        ok = r.error is None and r.end_s is not None
        row: dict[str, Any] = {"request": r.index, "arrival_s": r.arrival_s, "sent_s": r.sent_s,
                               "end_s": r.end_s, "ref": r.ref,
               "ttft_s": (r.first_s - r.arrival_s) if ok and r.first_s is not None else math.nan,
               "tpot_s": float(gaps.mean()) if ok and len(gaps) else math.nan,
               "e2e_s": (r.end_s - r.arrival_s) if ok and r.end_s is not None else math.nan,
               "itl_s": gaps, "prompt_tokens": r.prompt_tokens, "generated_tokens": r.generated_tokens,
               "cached_tokens": r.cached_tokens, "cache_hit_kind": r.cache_hit_kind, "error": r.error}
        row["meets_slo"] = ok and all(not (row[k] > bound) and not math.isnan(row[k]) for k, bound in slo.items())
        rows.append(row)
    df = pd.DataFrame(rows, columns=REQUEST_COLUMNS).astype(
        {"request": "int64", "arrival_s": "float64", "sent_s": "float64", "end_s": "float64", "ref": "Int64",
         "ttft_s": "float64", "tpot_s": "float64", "e2e_s": "float64",
         "prompt_tokens": "int64", "generated_tokens": "int64", "cached_tokens": "Int64",
         "cache_hit_kind": "string", "error": "string", "meets_slo": "bool"}).set_index("request")
    return LoadResult(df, _summary(df, duration, slo), interrupted)


def _summary(df: Any, duration: float, slo: Mapping[str, float]) -> dict[str, Any]:
    import numpy as np

    done = df[df["error"].isna()]
    out: dict[str, Any] = {"sent": len(df), "completed": len(done), "failed": int(df["error"].notna().sum()),
                           "duration_s": duration,
                           "request_throughput": len(done) / duration if duration > 0 else 0.0,
                           "output_throughput": float(done["generated_tokens"].sum()) / duration if duration else 0.0,
                           "slo": dict(slo),
                           "goodput": float(done["meets_slo"].sum()) / duration if duration > 0 else 0.0}
    gaps = [a for a in done["itl_s"] if len(a)]
    series = {"ttft_s": done["ttft_s"].dropna().to_numpy(), "tpot_s": done["tpot_s"].dropna().to_numpy(),
              "itl_s": np.concatenate(gaps) if gaps else np.empty(0), "e2e_s": done["e2e_s"].dropna().to_numpy()}
    for name, values in series.items():
        for label, q in (("mean", None), ("p50", 50), ("p90", 90), ("p99", 99)):
            key = f"{name}_{label}"
            if len(values) == 0:
                out[key] = math.nan
            else:
                out[key] = float(values.mean()) if q is None else float(np.percentile(values, q))
    return out
