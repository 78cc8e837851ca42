"""``python -m workbench.demo`` (``make demo``): a short scripted session on the default model.

A cold completion, a streamed completion printed as it arrives, and a request cancelled
mid-stream, each with what happened and how fast.
"""

from __future__ import annotations

import sys
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

    wb.unload(model)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
