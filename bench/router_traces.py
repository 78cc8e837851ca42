"""The router benchmark's traces, shared by bench_router.py (engines) and sim_router.py
(simulated caches), so both replay the same requests.

``mixed`` (workbench.lab.traces, seeded) merges multi-turn chats under a few shared system
prompts with agent loops sharing long system+tools prefixes; turn k+1's prompt is turn k's
prompt + its reply + the next message, as a stateless chat API sees it (no session ids: the
router decides every turn). ``documents`` is one where the approximate tree guesses wrong:
short system prompts before long messages, below its 30% match threshold.
"""

from __future__ import annotations

from workbench.lab import traces

TRACES = ("mixed", "documents")


def make_trace(n_requests: int, seed: int, kind: str = "mixed") -> traces.Trace:
    """``mixed``: chats (4 system prompts) and agents (3 prefixes), about half the requests
    each. ``documents``: see documents_trace. Both sized for n_ctx 2048."""
    if kind == "documents":
        return documents_trace(n_requests, seed)
    chats = traces.multi_turn_chats(n_requests // 2, seed=seed, concurrency=6, system_prompts=4,
                                    system_tokens=(150, 300), turns=(2, 5), user_tokens=(10, 40),
                                    reply_tokens=(10, 40), max_context=1400)
    agents = traces.agent_tasks(n_requests - n_requests // 2, seed=seed + 1, agents=3, prefix_tokens=(300, 500),
                                task_tokens=(20, 60), steps=(2, 4), action_tokens=(10, 30),
                                observation_tokens=(20, 80), concurrency=4, max_context=1400)
    return traces.merge(chats, agents, name="chats+agents")


def documents_trace(n_requests: int, seed: int) -> traces.Trace:
    """Chats under 12 short system prompts (100-160 tokens) whose messages are long pasted
    documents (300-450 tokens): a new chat's system prompt is 20-35% of its prompt, so the
    approximate tree, which needs a 30% match, mostly places it as if new (the smallest
    tree), while the exact probe sees the cached system prompt (min_match 10%). Each
    tenant then spreads over every replica, its system prompt cached (and evicted) on each."""
    return traces.multi_turn_chats(n_requests, seed=seed, concurrency=8, system_prompts=12,
                                   system_tokens=(100, 160), turns=(1, 2), user_tokens=(300, 450),
                                   reply_tokens=(10, 40), max_context=1400)


def first_segment(trace: traces.Trace, i: int) -> int | None:
    """The prefix_checkpoint_len bench_router gives request i: its first segment (the system
    prompt or agent prefix) when the prompt goes on past it, else None."""
    first = int(trace.seg_len[trace.prompt(i)[0]])
    return first if first < int(trace.prompt_tokens[i]) else None
