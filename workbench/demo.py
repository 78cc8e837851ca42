"""``python -m workbench.demo`` (``make demo``): a short scripted session on the default model.

A cold completion, a streamed completion printed as it arrives, a request cancelled
mid-stream, a long prompt answered cold and then from the KV prefix cache (same reply), four
streams batched together, and a chat turn through the model's template, each with what
happened and how fast. Exits non-zero if a warm reply differs from the cold one.
"""

from __future__ import annotations

import sys
import threading
import time

import workbench as wb

CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


def _stats(r: wb.CompletionResult) -> str:
    s = r.stats
    ttft = f"{s.ttft_s * 1000:.0f} ms" if s.ttft_s is not None else "-"
    rate = f"{s.decode_tps:.0f} tok/s" if s.decode_tps else "-"
    return (f"finish={r.finish_reason} prompt={s.prompt_tokens} generated={s.generated_tokens} "
            f"ttft={ttft} prefill={s.prefill_tps or 0:.0f} tok/s decode={rate}")


def main() -> int:
    t0 = time.perf_counter()
    model = wb.load_model()
    info = wb.model_info(model)
    print(f"loaded {model}: {info['desc']}, n_ctx={info['n_ctx']}, {info['n_seq_max']} sequences, "
          f"{info['n_threads']} threads ({time.perf_counter() - t0:.1f} s)\n")

    print("1. a cold completion")
    r = wb.complete(model, CHAT.format(q="What is the capital of France?"), response_tokens=48)
    print(f"   reply: {r.reply.strip()!r}\n   {_stats(r)}\n")

    print("2. a streamed completion, printed as the tokens arrive")
    print("   ", end="", flush=True)
    stream = wb.stream(model, CHAT.format(q="Write a haiku about the sea."), response_tokens=64)
    for ev in stream:
        if isinstance(ev, wb.Token):
            print(ev.text.replace("\n", "\n   "), end="", flush=True)
    print(f"\n   {_stats(stream.result())}\n")

    print("3. a request cancelled after 5 tokens")
    stream = wb.stream(model, CHAT.format(q="Tell me a long story about a dragon."), response_tokens=256)
    n = 0
    for ev in stream:
        if isinstance(ev, wb.TokenId):
            n += 1
            if n == 5:
                wb.cancel(stream)
    r = stream.result()
    print(f"   reply so far: {r.reply!r}\n   {_stats(r)}\n")

    ok = _cache_demo(model)
    _batching_demo(model)

    print("6. a chat turn through the model's chat template")
    r = wb.chat(model, [{"role": "system", "content": "You answer in one short sentence."},
                        {"role": "user", "content": "Why do leaves change colour in autumn?"}], response_tokens=48)
    print(f"   message: {r.message}\n   {_stats(r)}\n")

    wb.unload(model)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1


def _cache_demo(model: str) -> bool:
    print("4. a long prompt, cold and then from the KV prefix cache")
    facts = " ".join(f"Note {i}: the lighthouse keeper logged wind force {i % 9} at dawn." for i in range(60))
    prompt = CHAT.format(q=f"{facts}\nWhat do these notes record? One sentence.")
    scope = f"demo-{time.time_ns()}"             # a fresh scope: the first run is really cold
    cold = wb.complete(model, prompt, response_tokens=24, cache_scope=scope)
    warm = wb.complete(model, prompt, response_tokens=24, cache_scope=scope)
    same = warm.tokens == cold.tokens
    cold_s, warm_s = cold.stats.ttft_s or 0.0, warm.stats.ttft_s or 0.0   # None: no token generated
    speedup = f"{cold_s / warm_s:.0f}x faster" if warm_s > 0 else "no token"
    print(f"   cold: {cold.stats.cache_hit_kind:5} ttft={cold_s * 1000:6.0f} ms  "
          f"prefilled {cold.stats.prefilled_tokens} of {cold.stats.prompt_tokens} tokens")
    print(f"   warm: {warm.stats.cache_hit_kind:5} ttft={warm_s * 1000:6.0f} ms  "
          f"prefilled {warm.stats.prefilled_tokens} ({speedup})")
    print(f"   same reply token for token: {same}  ({warm.reply.strip()[:60]!r}...)\n")
    return same


def _batching_demo(model: str) -> None:
    print("5. four streams at once (continuous batching)")
    questions = ["Name a planet.", "Name a river.", "Name a metal.", "Name a bird."]
    one = wb.complete(model, CHAT.format(q=questions[0]), response_tokens=32, ignore_eos=True)
    results: list[wb.CompletionResult] = [None] * 4  # type: ignore[list-item]

    def run(i: int) -> None:
        results[i] = wb.complete(model, CHAT.format(q=questions[i]), response_tokens=32, ignore_eos=True)

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    tokens = sum(r.stats.generated_tokens for r in results)
    print(f"   one stream: {one.stats.decode_tps:.0f} tok/s; four together: {tokens / wall:.0f} tok/s "
          f"({tokens} tokens in {wall:.1f} s, one decode per tick for all of them)\n")


if __name__ == "__main__":
    sys.exit(main())
