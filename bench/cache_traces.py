"""Issue 14's storage traces through the engine, whole rows and chunk storage side by side.

Each trace runs once per storage configuration (whole rows on a disk tier; chunk storage on
one directory per chunk size) with greedy replies, so every configuration sees the same
conversations and saves rows at the same points. What is measured is what a user's disk
holds: the sizes of the files the engine left (chunk files ``*.kvc`` and manifests ``*.kvm``,
in both: whole rows are whole-row chunks), against the raw f16 KV of the distinct tokens of
the rows it saved (the positions of the trie of all rows: each distinct prefix once).

* ``chats``: ``n_chats`` chats of ``turns`` turns sharing one system prompt, each on its own
  topic (the chats' common prefix: 250 tokens of the default model).
* ``fleet``: agents in two groups, each group sharing a system prompt that lists its tools
  (common prefixes of 284 and 257 tokens: this model's template does not render a ``tools``
  argument, so the tool list is part of the system prompt, as in a prompt-engineered agent),
  each agent on its own task, two turns.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import workbench as wb

KV_BYTES_PER_TOKEN = 23_040     # SmolLM2-135M, f16 K and V: 30 layers x 3 KV heads x 64 x 2 x 2 bytes

SYSTEM_CHAT = (
    "You are the concierge of a small travel agency in Turin. You answer customers in plain, "
    "friendly English, in short paragraphs. You always check three things before you suggest "
    "a plan: the season, the customer's budget, and whether the customer travels by train, car "
    "or plane. You never invent prices; when you are not sure, you give a range and say so. You "
    "prefer regional trains and buses to rental cars, small family hotels to chains, and local "
    "markets to tourist restaurants. When a customer asks for a plan, you give it day by day, "
    "with one main visit and one walk per day, and you end with a short list of what to book in "
    "advance. When a customer asks about food, you name the dish, the town it comes from and "
    "the season when it is best. When a customer asks about the weather, you give the usual "
    "range of temperatures for the month and what to pack. You keep every answer under two "
    "hundred words unless the customer asks for more detail, and you ask one question back when "
    "the request is unclear. You do not discuss politics, health or legal matters; you suggest "
    "the customer asks a professional instead."
)
CHAT_TOPICS = [
    "a weekend in Genoa in March", "five days of hiking in the Dolomites in July", "a food trip to Bologna",
    "Lake Maggiore with two children", "the wine villages of the Langhe in October", "Venice on a small budget",
    "a train trip from Milan to Naples", "the Cinque Terre without crowds", "a winter week in Aosta",
    "Florence for an art student", "Sicily by bus in May", "a cycling holiday around Lake Garda",
    "Rome with a grandmother who walks slowly", "the islands of the Venetian lagoon", "Puglia in September",
    "a ski weekend near Turin", "Sardinia's west coast by train", "Trieste and the Karst for three days",
    "the Amalfi coast in November", "Umbria's hill towns without a car",
]
CHAT_FOLLOW_UPS = ["Which of these would you book first, and why?",
                   "What should I pack, and how much should I plan to spend per day?",
                   "If it rains for two days, what would you change?"]

TOOL_GROUPS = {
    "travel": [("search_flights", "Search flights between two airports on a date", ("origin", "destination", "date")),
               ("book_hotel", "Book a hotel room in a city for a range of nights", ("city", "check_in", "check_out")),
               ("train_times", "Train departures between two stations on a date", ("origin", "destination", "date")),
               ("weather", "The forecast for a city on a date", ("city", "date")),
               ("convert_currency", "Convert an amount between two currencies", ("amount", "source", "target"))],
    "office": [("send_email", "Send an email to a colleague", ("to", "subject", "body")),
               ("calendar_find", "Find free slots in a colleague's calendar", ("person", "day")),
               ("calendar_book", "Book a meeting with attendees", ("title", "start", "attendees")),
               ("file_search", "Search the shared drive for documents", ("query", "owner")),
               ("translate", "Translate a sentence into a language", ("text", "language"))],
}
FLEET_TASKS = {
    "travel": ["Find me a flight from Milan to Vienna on May 3.", "What will the weather be in Como on May 5?",
               "Convert 250 euros to Swiss francs.", "Book a hotel in Verona from May 7 to May 9.",
               "Which trains go from Turin to Genoa on Saturday morning?",
               "Find a flight from Venice to Paris on May 14."],
    "office": ["Find a free hour with Marta on Thursday.", "Email Paolo that the report is late.",
               "Book a project review on Monday at ten with Anna and Luca.",
               "Find the budget spreadsheet Marco shared last week.",
               "Translate 'the meeting moved to Friday' into German.",
               "Send the team the agenda for tomorrow."],
}


def tool_system_prompt(group: str) -> str:
    tools = [{"name": n, "description": d, "parameters": {p: "string" for p in ps}} for n, d, ps in TOOL_GROUPS[group]]
    return ("You are an assistant that completes tasks with tools. To call a tool, answer with one JSON object "
            '{"tool": <name>, "arguments": {...}} and nothing else; after the result of the tool, answer the user in '
            "one or two sentences. Available tools:\n" + "\n".join(json.dumps(t) for t in tools))


def chats(model: str, n_chats: int, turns: int, reply_tokens: int) -> None:
    for topic in CHAT_TOPICS[:n_chats]:
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM_CHAT},
                                          {"role": "user", "content": f"I would like a plan for {topic}."}]
        for turn in range(turns):
            r = wb.chat(model, messages, response_tokens=reply_tokens, temperature=0.0)
            if turn + 1 < turns:
                messages += [{"role": "assistant", "content": r.content or ""},
                             {"role": "user", "content": CHAT_FOLLOW_UPS[turn % len(CHAT_FOLLOW_UPS)]}]


def fleet(model: str, agents_per_group: int, reply_tokens: int) -> None:
    for group, tasks in FLEET_TASKS.items():
        system = {"role": "system", "content": tool_system_prompt(group)}
        for task in tasks[:agents_per_group]:
            messages = [system, {"role": "user", "content": task}]
            r = wb.chat(model, messages, response_tokens=reply_tokens, temperature=0.0)
            messages += [{"role": "assistant", "content": r.content or "(a tool call)"},
                         {"role": "user", "content": "Thanks. Anything else I should know?"}]
            wb.chat(model, messages, response_tokens=reply_tokens, temperature=0.0)


def distinct_tokens(rows: list[list[int]]) -> int:
    """Positions of the trie of all rows: the tokens whose KV is distinct."""
    trie: dict = {}
    n = 0
    for toks in rows:
        node = trie
        for t in toks:
            if t not in node:
                node[t] = {}
                n += 1
            node = node[t]
    return n


def stored_rows(root: Path) -> tuple[list[list[int]], int]:
    """The token lists of the rows under ``root`` and the bytes of every cache file there."""
    from workbench.cache.chunk_format import read_manifest
    from workbench.cache.keys import tokens_from_bytes

    rows = [tokens_from_bytes(read_manifest(f).tokens) for f in sorted(root.rglob("*.kvm"))]
    files = [f for pat in ("*.kvc", "*.kvm") for f in root.rglob(pat)]
    return rows, sum(f.stat().st_size for f in files)


def run_trace(converse: Callable[[str], None], storage: str, chunk_size: int, threads: int,
              flash_attn: str) -> dict[str, Any]:
    """One configuration: a fresh cache on a fresh directory, the trace through the engine."""
    root = Path(tempfile.mkdtemp(prefix="wb-bench-trace-"))
    tier = {"kind": "disk", "root": str(root / "cache"), "budget_bytes": 8 * 2**30}
    extra = {"storage": "chunks", "chunk_size": chunk_size} if storage == "chunks" else {"storage": "rows"}
    wb.configure_cache([tier], **extra)
    model = wb.load_model(n_threads=threads, n_ctx=8192, n_seq_max=1, flash_attn=flash_attn, decode_budget_ms=0)
    try:
        converse(model)
        wb.wait_for_saves()
        rows, stored = stored_rows(root / "cache")
    finally:
        wb.unload(model)
        wb.configure_cache([{"kind": "ram"}])
        shutil.rmtree(root, ignore_errors=True)
    distinct = distinct_tokens(rows)
    raw = distinct * KV_BYTES_PER_TOKEN
    return {"storage": storage, "chunk_size": chunk_size if storage == "chunks" else None, "rows": len(rows),
            "row_tokens": sorted(len(r) for r in rows), "distinct_tokens": distinct, "raw_kv_bytes": raw,
            "stored_bytes": stored, "x": stored / raw if raw else None}


def storage_table(name: str, converse: Callable[[str], None], chunk_sizes: list[int], threads: int,
                  flash_attn: str, storage: str = "both") -> list[dict[str, Any]]:
    """Whole rows, then chunk storage at each chunk size, on the same trace (``storage``:
    'rows', 'chunks' or 'both'); printed."""
    out = [run_trace(converse, "rows", 0, threads, flash_attn)] if storage in ("rows", "both") else []
    if storage in ("chunks", "both"):
        out += [run_trace(converse, "chunks", cs, threads, flash_attn) for cs in chunk_sizes]
    first = out[0]
    print(f"\n{name}: {first['rows']} rows of {min(first['row_tokens'], default=0)}-"
          f"{max(first['row_tokens'], default=0)} tokens, {first['distinct_tokens']} distinct tokens, "
          f"raw KV {first['raw_kv_bytes'] / 1e6:.1f} MB")
    print(f"{'storage':>14}{'rows':>6}{'distinct':>10}{'stored MB':>11}{'x raw':>8}")
    for r in out:
        label = "whole rows" if r["storage"] == "rows" else f"chunks of {r['chunk_size']}"
        print(f"{label:>14}{r['rows']:>6}{r['distinct_tokens']:>10}{r['stored_bytes'] / 1e6:>11.1f}{r['x']:>8.3f}")
    return out
