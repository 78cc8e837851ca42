"""Hypothesis strategies for everything a user or a file hands the workbench.

Every input family is drawn by default, the inputs of issue 10's items 1-11 and of this
fuzzer's own findings (NEW_FINDINGS) included: their fixes have landed. An input family
whose crash is found and not yet fixed goes into KEPT_OUT (item -> why) until its fix
lands; ``WORKBENCH_FUZZ_KNOWN=all`` (or a comma list such as ``1,N3``) draws it anyway.
``known(n)`` says whether item n's inputs are drawn.
"""

from __future__ import annotations

import json
import math
import os
import string

from hypothesis import strategies as st

from workbench.options import ChatOptions, LoadConfig, RequestOptions, ThinkingOptions, option_names

_KNOWN = os.environ.get("WORKBENCH_FUZZ_KNOWN", "").strip()

# Input families kept out of the default run because they still crash or hang (item -> why).
KEPT_OUT: dict[str, str] = {}


def known(item: int | str) -> bool:
    """True when the inputs of issue 10's item ``item`` (or of a finding ``"N<k>"`` of this
    fuzzer, see NEW_FINDINGS) are included in this run: always, unless KEPT_OUT lists it and
    WORKBENCH_FUZZ_KNOWN does not name it."""
    item = str(item)
    return item not in KEPT_OUT or _KNOWN == "all" or item in {s.strip() for s in _KNOWN.split(",")}


# What this fuzzer found beyond issue 10's list (all fixed and drawn by default):
NEW_FINDINGS = {
    "N5": "a negated token reference (root ::= . !<[2]> \"ab\") killed the model loop: sampling raised "
          "NativeError ('Unexpected empty grammar stack after accepting piece'), which escaped the loop "
          "thread; every later request on that model waited forever while phase() said idle",
    "N1": "tokenize(model, text, add_special={}) / detokenize(..., remove_special=[]): flags of the wrong "
          "type reached pybind and raised a bare TypeError (incompatible function arguments)",
    "N2": "load_adapter(model, 3): a path that is not a str / PathLike raised a bare TypeError from "
          "os.fspath in models/files.py check_model_file",
    "N3": "request_info([]) / request_info({}): an unhashable ref raised a bare TypeError (dict lookup in "
          "api.request_info) instead of InvalidOption",
    "N4": "set_adapter_scale(model, [], 1.0): an unhashable adapter id raised a bare TypeError (set lookup) "
          "instead of InvalidOption",
}


# --- scalars -----------------------------------------------------------------------------------

BOUNDARY_INTS = [0, 1, -1, 2, 7, 8, 15, 16, 17, 63, 64, 255, 256, 511, 512, 513, 1024, 2047, 2048, 4096,
                 8192, 2**15, 2**16, 2**31 - 1, -(2**31)]
HUGE_INTS = [2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]
WEIRD_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-300, 1e300, 0.5, 1.5, -0.5, 2.0, 100.0]

ints = st.one_of(st.sampled_from(BOUNDARY_INTS), st.integers(-10, 5000))
if known(11):  # ints past C's range reach pybind's casts (item 11: "Unable to cast")
    ints = st.one_of(ints, st.sampled_from(HUGE_INTS))
floats = st.one_of(st.sampled_from(WEIRD_FLOATS), st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(0, 2))

# text: any code point but lone surrogates (item 11: they reach pybind as a TypeError)
_chars = st.characters(codec="utf-8") if not known(11) else st.characters()
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<filename>",
            "<gh_stars>", "<issue_start>", "<jupyter_code>", "user", "assistant", "\n", " ", "\x00", "\ufffd",
            "é", "中文", "🙂", "\u200b", "\r\n", "\t"]
text = st.one_of(
    st.text(_chars, max_size=60),
    st.lists(st.one_of(st.sampled_from(SPECIALS), st.text(_chars, max_size=8)), max_size=12).map("".join),
)

weird = st.one_of(
    st.none(), st.booleans(), ints, floats, text, st.binary(max_size=8),
    st.just([]), st.just({}), st.just(()), st.lists(ints, max_size=3), st.dictionaries(text, ints, max_size=2),
)

# --- option maps --------------------------------------------------------------------------------


def _typo(names: tuple[str, ...]) -> st.SearchStrategy[str]:
    base = st.sampled_from(names)
    return st.one_of(
        base.map(str.upper), base.map(lambda s: s[:-1]), base.map(lambda s: s + "s"),
        base.map(lambda s: s.replace("_", "-")), st.text(string.ascii_lowercase + "_", min_size=1, max_size=12),
    ).filter(lambda k: k not in names)


def option_map(names: tuple[str, ...], valid: dict[str, st.SearchStrategy], max_size: int = 5,
               unknown: bool = True) -> st.SearchStrategy[dict]:
    """Dicts over ``names``: mostly well-typed values (``valid``), some of any type, and now
    and then a key the call does not know."""
    def value(k: str) -> st.SearchStrategy:
        good = valid.get(k, weird)
        return st.one_of(good, good, good, weird)

    entries = st.sampled_from(names).flatmap(lambda k: st.tuples(st.just(k), value(k)))
    if unknown:
        entries = st.one_of(entries, entries, entries, entries, entries, entries, st.tuples(_typo(names), weird))
    return st.lists(entries, max_size=max_size).map(dict)


small_pos = st.one_of(st.integers(0, 64), st.sampled_from(BOUNDARY_INTS))
unit = st.one_of(st.floats(0, 1), st.sampled_from([0.0, 1.0, -0.1, 1.1, math.nan]))

gbnf_simple = st.sampled_from(['root ::= [a-z]+', 'root ::= "yes" | "no"', 'root ::= [0-9]{1,3}',
                               'root ::= ("a" | "b")* "."', "root ::= [^\\n]+"])
REQUEST_VALID: dict[str, st.SearchStrategy] = {
    "response_tokens": st.one_of(small_pos, st.sampled_from([0, 1, 511, 512, 10**9])),
    "temperature": st.one_of(st.floats(0, 3), st.sampled_from(WEIRD_FLOATS)),
    "top_k": st.one_of(small_pos, st.sampled_from([0, 1, 49152, 10**6])),
    "top_p": unit, "min_p": unit,
    "repetition_penalty": st.one_of(st.floats(0, 3), st.sampled_from(WEIRD_FLOATS)),
    "repeat_last_n": st.sampled_from([-1, 0, 1, 64, 512, 10**6]),
    "seed": st.one_of(st.none(), st.sampled_from([0, 1, 2**32 - 2, 2**32 - 1, -1]), st.integers(0, 2**32)),
    "stop_sequences": st.one_of(st.lists(text, max_size=3), text),
    "grammar": st.one_of(st.none(), gbnf_simple, text),
    "json_schema": st.one_of(st.none(), st.sampled_from([{"type": "integer"}, {"type": "string"}, True, "{}",
                                                         "not json", {"enum": ["a", "b"]}])),
    "ignore_eos": st.booleans(),
    "min_tokens": st.one_of(small_pos, st.sampled_from([10**6, -1])),
    "frequency_penalty": st.one_of(st.floats(-2, 2), st.sampled_from(WEIRD_FLOATS)),
    "presence_penalty": st.one_of(st.floats(-2, 2), st.sampled_from(WEIRD_FLOATS)),
    "logit_bias": st.one_of(st.none(), st.dictionaries(
        st.one_of(st.sampled_from([0, 1, 2, 49151, 49152, 10**6, -1]), st.sampled_from(SPECIALS), text),
        st.one_of(st.floats(-100, 100), st.sampled_from(WEIRD_FLOATS + [-100.0, 101.0])), max_size=4)),
    "logprobs": st.one_of(st.none(), st.integers(0, 20), st.sampled_from([21, -1, 10**6])),
    "grammar_root": st.sampled_from(["root", "item", "a-b", "", "no such", "\u00e9"]),
    "render_special": st.one_of(st.booleans(), st.lists(st.sampled_from(SPECIALS + ["<think>"]), max_size=3)),
    "reasoning_budget": st.one_of(st.none(), st.fixed_dictionaries(
        {"tokens": small_pos, "end": st.sampled_from(["</think>", "x", ""])},
        optional={"start": st.sampled_from(["", "<think>", "a"]), "message": text})),
    "session_id": st.one_of(st.none(), st.sampled_from(["s1", "s2", 0, 1, -1]), text),
    "on_full": st.sampled_from(["block", "error", "BLOCK", ""]),
    "cache": st.booleans(),
    "cache_scope": st.one_of(st.sampled_from(["default", "t1", "t2"]), text),
    "parent_key": st.one_of(st.none(), text, st.just("0" * 32)),
    "prefix_checkpoint_len": st.one_of(st.none(), small_pos),
    "add_special": st.booleans(), "parse_special": st.booleans(),
    "speculative": st.one_of(st.none(), st.fixed_dictionaries(
        {"ngram": st.sampled_from(["simple", "map_k", "map_k4v", "cache", "bad"])},
        optional={"n_max": small_pos, "n_min": small_pos, "size_n": small_pos, "size_m": small_pos,
                  "min_hits": small_pos, "adaptive": st.one_of(st.booleans(), st.just("yes")),
                  "p_min": st.one_of(st.floats(0, 1), st.sampled_from([-0.5, 2, "0.5"] + WEIRD_FLOATS))}),
        st.sampled_from([{}, {"draft": "no-such-model"}, {"ngram": "simple", "draft": "x"}, "simple", 3])),
    "timeout_s": st.one_of(st.none(), st.floats(1e-4, 5), st.sampled_from([0, -1, 1e308] + WEIRD_FLOATS)),
    "token_timeout_s": st.one_of(st.none(), st.floats(1e-4, 5), st.sampled_from([0, -1, 1e308] + WEIRD_FLOATS)),
    # stream() / complete() only (ThinkingOptions): elsewhere they are unknown options
    "thinking": st.one_of(st.booleans(), st.sampled_from(["enabled", "disabled", "on"])),
    "thinking_budget_tokens": st.one_of(st.none(), small_pos),
    "thinking_markers": st.one_of(st.none(), st.fixed_dictionaries({"start": text, "end": text}),
                                  st.sampled_from([{"start": "The", "end": "."}, {"end": "x"}, "<think>"])),
}
request_opts = option_map(option_names(RequestOptions) + option_names(ThinkingOptions), REQUEST_VALID)

CHAT_VALID: dict[str, st.SearchStrategy] = {
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", None]),
                             st.fixed_dictionaries({"type": st.just("function"),
                                                    "function": st.fixed_dictionaries({"name": text})})),
    "parallel_tool_calls": st.booleans(), "tool_call_prefill": st.booleans(),
    "add_generation_prompt": st.booleans(), "continue_final_message": st.booleans(),
    "chat_template_kwargs": st.one_of(st.none(), st.dictionaries(text, st.one_of(text, ints, st.booleans()),
                                                                 max_size=3)),
    "thinking": st.sampled_from(["enabled", "disabled", "on"]),
    "thinking_budget_tokens": st.one_of(st.none(), small_pos),
}
# chat_template is left out: each new template is tried in a child process (~1 s)
chat_opts = option_map(tuple(n for n in option_names(ChatOptions) if n != "chat_template"), CHAT_VALID,
                       max_size=4)
chat_and_request_opts = st.tuples(chat_opts, option_map(
    ("response_tokens", "temperature", "top_k", "seed", "stop_sequences", "session_id", "cache_scope",
     "render_special", "ignore_eos"), REQUEST_VALID, max_size=3, unknown=False)).map(lambda t: {**t[1], **t[0]})


def _load_valid() -> dict[str, st.SearchStrategy]:
    return {
        "n_ctx": st.one_of(st.none(), st.sampled_from([16, 17, 64, 255, 256, 512, 1000, 2048, 8192, 8193, 2**15])),
        "n_batch": st.sampled_from([1, 2, 3, 4, 7, 8, 32, 64, 512, 2048, 4096]),
        "n_ubatch": st.sampled_from([1, 2, 3, 8, 64, 512, 2048, 9000]),
        "n_seq_max": st.sampled_from([1, 2, 3, 4, 5, 16, 17, 64, 255, 256, 257]),
        "n_threads": st.one_of(st.none(), st.sampled_from([1, 2, 512, 513])),
        "n_threads_batch": st.one_of(st.none(), st.sampled_from([1, 2, 512, 513])),
        "flash_attn": st.sampled_from(["auto", "on", "off", "yes"]),
        "type_k": st.sampled_from(["f32", "f16", "bf16", "q8_0", "q4_0", "q5_1", "iq4_nl", "q2_k"]),
        "type_v": st.sampled_from(["f32", "f16", "q8_0", "q4_0", "q5_1"]),
        "n_gpu_layers": st.sampled_from([-2, -1, 0, 1, 1000]),
        "use_mmap": st.booleans(),
        "use_mlock": st.booleans(),
        "load_mode": st.sampled_from([None, "auto", "none", "mmap", "mlock", "mmap+mlock", "dio", "fast"]),
        "split_mode": st.sampled_from(["none", "layer", "row", "tensor"]),
        "main_gpu": st.sampled_from([-2, -1, 0, 1, 15, 16]),
        "tensor_split": st.one_of(st.none(), st.lists(st.floats(0, 8), max_size=17),
                                  st.sampled_from([[0.0], [1.0, -1.0], [math.nan], [math.inf]])),
        "offload_kqv": st.booleans(),
        "swa_full": st.booleans(),
        "rope_scaling_type": st.sampled_from([None, "none", "linear", "yarn", "longrope", "cubic"]),
        "rope_freq_base": st.sampled_from([None, 1e-30, 1.0, 10000.0, 1e30, 0.0, -1.0, math.inf, math.nan]),
        "rope_freq_scale": st.sampled_from([None, 0.001, 0.25, 1.0, 4.0, 1000.0, 0.0, 1e-4, math.nan]),
        "yarn_ext_factor": st.sampled_from([None, 0.0, 0.5, 1.0, 1.5, -1.0]),
        "yarn_attn_factor": st.sampled_from([None, 1e-30, 1.0, 1e30, 0.0]),
        "yarn_beta_fast": st.sampled_from([None, 1e-30, 1.0, 32.0, 1e30, 0.0]),
        "yarn_beta_slow": st.sampled_from([None, 1e-30, 1.0, 32.0, 1e30, 0.0]),
        "yarn_orig_ctx": st.sampled_from([None, 0, 1, 2048, 2**21, 2**21 + 1]),
        "chat_template_cache": st.sampled_from([0, 1, 8, 1024, 1025]),
        "decode_budget_ms": st.sampled_from([0, 1, 100, 30000]),
        "max_queue": st.sampled_from([0, 1, 64]),
        "prefill_chunk_size": st.sampled_from([None, -2, -1, 0, 1, 64, 4096]),
        "cache": st.booleans(),
        "cache_min_tokens": st.sampled_from([0, 1, 16, 10**6]),
        "cold_checkpoint_interval": st.sampled_from([None, 63, 64, 100, 2048]),
        "cold_min_tokens": st.sampled_from([0, 1, 10**6]),
        "cold_max_tokens": st.sampled_from([None, 0, 1, 64]),
        "evict_save_timeout_ms": st.sampled_from([0, 1, 30000]),
        "thinking_markers": st.one_of(st.none(), st.fixed_dictionaries({"start": text, "end": text})),
        "thinking_signing_key": st.one_of(st.none(), st.binary(max_size=8), text),
        "embed_n_ctx": st.one_of(st.none(), st.sampled_from([7, 8, 64, 1000])),
        "embed_n_seq_max": st.sampled_from([0, 1, 16, 256, 257]),
        "model_id": st.one_of(st.none(), st.sampled_from(["fuzz", "fuzz-load", ""]), text),
        "model_path": st.sampled_from(["", ".", "/", "/dev/null", "/dev/zero", "missing.gguf", "README.md",
                                       "vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf"]),
    }


def _load_safe(kw: dict) -> bool:
    """Settings issue 10 item 3 lists as aborting in llama.cpp (n_outputs_max, n_batch vs
    sequences, ggml_can_mul_mat at the first embed) stay out of the default run."""
    if known(3):
        return True
    n_seq = kw.get("n_seq_max", 4)
    n_batch, n_ubatch = kw.get("n_batch", 2048), kw.get("n_ubatch", 512)
    n_ctx = kw.get("n_ctx") or 8192
    ok_ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (n_seq, n_batch, n_ubatch, n_ctx))
    if not ok_ints:
        return True  # refused by validation before llama.cpp sees it
    return n_batch >= max(2, n_seq) and n_ubatch >= 2 and n_ctx >= 16 * max(1, n_seq)


load_kwargs = option_map(option_names(LoadConfig), _load_valid(), max_size=4).filter(_load_safe)

# --- prompts and tokens -------------------------------------------------------------------------

N_VOCAB = 49152
token_ids = st.one_of(st.integers(0, N_VOCAB - 1), st.sampled_from([0, 1, 2, N_VOCAB - 1]),
                      st.sampled_from([N_VOCAB, -1, 2**31 - 1, -(2**31)] + (HUGE_INTS if known(11) else [])),
                      st.sampled_from([True, 1.0, "1", None]))
token_lists = st.one_of(
    st.lists(st.integers(0, N_VOCAB - 1), min_size=0, max_size=40),
    st.lists(token_ids, max_size=20),
    st.lists(st.integers(0, N_VOCAB - 1), min_size=500, max_size=600),  # past n_ctx = 512
    st.tuples(st.integers(0, N_VOCAB - 1)).map(tuple),
)
prompts = st.one_of(text, text, token_lists, st.binary(max_size=20), st.none(), ints, st.just(bytearray(b"hi")),
                    st.lists(text, max_size=3))

# --- GBNF, built from GBNF's own grammar ----------------------------------------------------------
# grammar  ::= rule+            rule ::= name "::=" alts
# alts     ::= seq ("|" seq)*   seq  ::= (term quant?)*
# term     ::= literal | class | name | "(" alts ")" | "." | token
# quant    ::= "*" | "+" | "?" | "{" m "}" | "{" m ",}" | "{" m "," n "}"
# Characters come from an alphabet every vocabulary token set can produce; code points no
# token can produce (NUL, unassigned planes) make a grammar unsatisfiable: issue 10 item 1.

SAFE_CHARS = [chr(c) for c in range(0x20, 0x7F)] + ["\n", "\t", "é", "ß", "ñ", "中", "文", "é", "€", "🙂"]
UNSAFE_CHARS = ["\x00", "\x01", "\x1f", "\U00073465", "\U0010ffff", "\ufffe", "\ud7ff"]
gchar = st.sampled_from(SAFE_CHARS + (UNSAFE_CHARS if known(1) else []))


def _escape(c: str, style: int, in_class: bool = False) -> str:
    o = ord(c)
    if style == 1 and o < 0x100:
        return f"\\x{o:02x}"
    if style == 2 and o < 0x10000:
        return f"\\u{o:04x}"
    if style == 3:
        return f"\\U{o:08x}"
    table = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
    table.update({"]": "\\]", "[": "\\[", "-": "\\-"} if in_class else {'"': '\\"'})
    return table.get(c, c)


lit_char = st.tuples(gchar, st.integers(0, 4)).map(lambda t: _escape(*t))
literal = st.lists(lit_char, min_size=1, max_size=6).map(lambda cs: '"' + "".join(cs) + '"')  # "" takes no quantifier


def _class_item(t: tuple[str, str, bool, int]) -> str:
    a, b, is_range, style = t
    if is_range:
        lo, hi = sorted((a, b))
        return _escape(lo, style, True) + "-" + _escape(hi, style, True)
    return _escape(a, style, True)


char_class = st.tuples(st.booleans(), st.lists(st.tuples(gchar, gchar, st.booleans(), st.integers(0, 4))
                                               .map(_class_item), min_size=1, max_size=4)).map(
    lambda t: "[" + ("^" if t[0] else "") + "".join(t[1]) + "]")


def _quant(t: tuple[int, int, int]) -> str:
    form, m, n = t
    if not known(2) and form == 5:  # {m,n} with m <= n only: item 2 (m > n loops forever)
        m, n = min(m, n), max(m, n)
    if form == 4:  # X{0} leaves nothing for an enclosing quantifier: refused
        m = max(m, 1)
    if form == 5 and n == 0:
        n = max(m, 1)
    return ["", "*", "+", "?", f"{{{m}}}", f"{{{m},{n}}}", f"{{{m},}}"][form]


quant = st.tuples(st.integers(0, 6), st.integers(0, 4), st.integers(0, 5)).map(_quant)
token_ref = st.one_of(st.sampled_from(["<[1]>", "<[2]>", "<[100]>", "<[49151]>", "<|im_end|>", "<|im_start|>"]
                                      + (["!<[2]>", "!<|im_end|>"] if known("N5") else [])),
                      st.integers(0, 2**32 + 5).map(lambda i: f"<[{i}]>"))


def _alts(refs: list[str], depth: int) -> st.SearchStrategy[str]:
    leaves = [literal, literal, char_class, st.just(".")]
    if refs:
        leaves.append(st.sampled_from(refs))
    term = st.one_of(*leaves)
    if depth > 0:
        term = st.one_of(term, term, _alts(refs, depth - 1).map(lambda s: "(" + s + ")"))
    seq = st.lists(st.tuples(term, quant).map("".join), min_size=1, max_size=4).map(" ".join)
    return st.lists(seq, min_size=1, max_size=3).map(" | ".join)


@st.composite
def gbnf(draw, tokens: bool = False) -> str:
    """A syntactically valid GBNF grammar: rules r1..rk referenced only by earlier rules
    (no left recursion, every reference defined), optional comments."""
    k = draw(st.integers(0, 3))
    rules = []
    for i in range(k, -1, -1):
        name = "root" if i == 0 else f"r{i}"
        refs = [f"r{j}" for j in range(i + 1, k + 1)]
        body = draw(_alts(refs, 2))
        if tokens and draw(st.booleans()):
            body = draw(token_ref) + " " + body
        comment = draw(st.sampled_from(["", "", " # a comment"]))
        rules.append(f"{name} ::= {body}{comment}")
    draw(st.randoms()).shuffle(rules)
    return "\n".join(rules) + draw(st.sampled_from(["", "\n", "\n\n"]))


GBNF_META = list('"[]()|*+?{},:=\\-^#.<>!') + ["::=", "\n", " ", "x", "0", "\\u", "\\x", "{9999}", "{0,}", "{,3}",
                                               "(((", ")))", "root"]


@st.composite
def nearly_gbnf(draw) -> str:
    """A valid grammar with one to three edits: a deleted, inserted or swapped piece."""
    g = draw(gbnf(tokens=True))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(g)))
        op = draw(st.integers(0, 2))
        if op == 0 and g:
            j = min(len(g), i + draw(st.integers(1, 3)))
            g = g[:i] + g[j:]
        elif op == 1:
            g = g[:i] + draw(st.sampled_from(GBNF_META)) + g[i:]
        else:
            g = g[:i] + g[i:i + 4][::-1] + g[i + 4:]
    # repetition bounds with min > max may appear after an edit: item 2
    if not known(2) and _has_inverted_bounds(g):
        return 'root ::= "x"'
    if not known("N5") and "!<" in g:
        return 'root ::= "z"'  # an edit may put a "!" before a token reference: N5
    if not known(1) and any(u in g for u in ("\\x0", "\\x1", "\\u00", "\\U")):
        return 'root ::= "y"'  # an edit may turn an escape into an unproducible code point
    return g


def _has_inverted_bounds(g: str) -> bool:
    import re

    return any(int(a) > int(b) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", g))


# --- JSON schemas, built from JSON Schema's grammar ------------------------------------------------

REGEX_CHARS = [c for c in string.ascii_letters + string.digits + " _-@"]


@st.composite
def regex(draw, depth: int = 2) -> str:
    """Patterns of the subset llama.cpp's converter handles: literals, ., classes, groups,
    alternation, quantifiers *, +, ?, {m}, {m,n}; optionally anchored."""
    def atom(d: int) -> str:
        kind = draw(st.integers(0, 4 if d > 0 else 3))
        if kind == 0:
            return draw(st.sampled_from(REGEX_CHARS))
        if kind == 1:
            return "."
        if kind == 2:
            items = draw(st.lists(st.sampled_from(["a-z", "0-9", "A-F", "_", "x", "\\d", "\\w"]), min_size=1,
                                  max_size=3))
            return "[" + ("^" if draw(st.booleans()) else "") + "".join(items) + "]"
        if kind == 3:
            return draw(st.sampled_from(["\\d", "\\w", "\\s", "\\.", "\\-"]))
        return "(" + "|".join(seq(d - 1) for _ in range(draw(st.integers(1, 3)))) + ")"

    def q() -> str:
        form = draw(st.integers(0, 6))
        m, n = draw(st.integers(0, 3)), draw(st.integers(0, 4))
        if not known(2):
            m, n = min(m, n), max(m, n)
        return ["", "", "*", "+", "?", f"{{{m}}}", f"{{{m},{n}}}"][form]

    def seq(d: int) -> str:
        return "".join(atom(d) + q() for _ in range(draw(st.integers(1, 3))))

    body = seq(depth)
    return ("^" if draw(st.booleans()) else "") + body + ("$" if draw(st.booleans()) else "")


def _bounds(lo_key: str, hi_key: str, values: st.SearchStrategy) -> st.SearchStrategy[dict]:
    def fix(t: tuple) -> dict:
        lo, hi, which = t
        if not known(2) and not known(1) and lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo  # min > max: item 2 (lengths) / item 1 (no value satisfies)
        out = {}
        if which in (0, 2) and lo is not None:
            out[lo_key] = lo
        if which in (1, 2) and hi is not None:
            out[hi_key] = hi
        return out
    return st.tuples(values, values, st.integers(0, 3)).map(fix)


length = st.integers(0, 12)
number = st.one_of(st.integers(-1000, 1000), st.sampled_from([0, -1, 1, 2**31, -(2**31), 2**53]),
                   st.floats(-1e6, 1e6, allow_nan=False))
safe_string = st.text(st.sampled_from(REGEX_CHARS), max_size=6)
FORMATS = ["date", "time", "date-time", "uuid", "email", "uri", "bogus"]


def _leaf() -> st.SearchStrategy[dict]:
    string_schema = st.tuples(_bounds("minLength", "maxLength", length),
                              st.one_of(st.just({}), regex().map(lambda p: {"pattern": p}),
                                        st.sampled_from(FORMATS).map(lambda f: {"format": f}))
                              ).map(lambda t: {"type": "string", **t[0], **t[1]})
    int_schema = _bounds("minimum", "maximum", st.integers(-1000, 1000)).map(lambda b: {"type": "integer", **b})
    num_schema = st.tuples(_bounds("minimum", "maximum", number),
                           st.one_of(st.just({}), st.fixed_dictionaries({"exclusiveMinimum": number}))
                           ).map(lambda t: {"type": "number", **t[0], **t[1]})
    return st.one_of(
        string_schema, int_schema, num_schema,
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {}, {"type": ["string", "null"]}]),
        st.lists(st.one_of(safe_string, st.integers(-5, 5), st.booleans(), st.none()), min_size=1, max_size=4,
                 unique_by=lambda v: json.dumps(v)).map(lambda e: {"enum": e}),
        st.one_of(safe_string, st.integers(-5, 5)).map(lambda c: {"const": c}),
    )


def _compound(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    names = st.text(st.sampled_from(string.ascii_lowercase + "_ -"), min_size=1, max_size=6)

    @st.composite
    def obj(draw) -> dict:
        props = draw(st.dictionaries(names, children, max_size=3))
        out: dict = {"type": "object", "properties": props}
        if props and draw(st.booleans()):
            out["required"] = draw(st.lists(st.sampled_from(sorted(props)), unique=True))
        extra = draw(st.sampled_from([None, False, True, "schema"]))
        if extra == "schema":
            out["additionalProperties"] = draw(children)
        elif extra is not None:
            out["additionalProperties"] = extra
        return out

    array = st.tuples(children, _bounds("minItems", "maxItems", st.integers(0, 4))).map(
        lambda t: {"type": "array", "items": t[0], **t[1]})
    tuple_array = st.lists(children, min_size=1, max_size=3).map(lambda p: {"type": "array", "prefixItems": p})
    combos = st.tuples(st.sampled_from(["anyOf", "oneOf", "allOf"]), st.lists(children, min_size=1, max_size=3)
                       ).map(lambda t: {t[0]: t[1]})
    ref = children.map(lambda c: {"$defs": {"d": c}, "$ref": "#/$defs/d"})
    return st.one_of(obj(), array, tuple_array, combos, ref)


json_schema = st.recursive(_leaf(), _compound, max_leaves=8)


@st.composite
def nearly_json_schema(draw) -> object:
    """Valid schemas with a wrong keyword value, an unknown type, a dangling $ref, or as
    JSON text with an edit."""
    s = draw(json_schema)
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return {**s, draw(st.sampled_from(["type", "minLength", "maximum", "items", "properties", "required",
                                           "enum", "pattern", "$ref"])): draw(weird)}
    if kind == 1:
        return {"type": draw(st.sampled_from(["strin", "int", "", "object "]))}
    if kind == 2:
        return {"$ref": draw(st.sampled_from(["#/$defs/missing", "#", "#/", "http://example.com/s.json", "x"]))}
    raw = json.dumps(s)
    i = draw(st.integers(0, len(raw)))
    return raw[:i] + draw(st.sampled_from(["{", "}", "[", "]", ",", ":", '"', "x", ""])) + raw[i + 1:]


# --- chat messages, tools -----------------------------------------------------------------------

ROLES = ["system", "user", "assistant", "tool"]
content = st.one_of(text, text, st.none(), st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "txt"])}),
    weird), max_size=3), weird)
arguments = st.one_of(st.dictionaries(text, st.one_of(text, ints, st.booleans(), st.none()), max_size=3),
                      text, st.just('{"a": 1}'), weird)
tool_call = st.one_of(
    st.fixed_dictionaries({"id": text, "type": st.just("function"),
                           "function": st.fixed_dictionaries({"name": text, "arguments": arguments})}),
    st.fixed_dictionaries({"id": text, "name": text, "arguments": arguments}),
    st.fixed_dictionaries({}, optional={"id": weird, "function": weird, "name": weird}),
    weird,
)
message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(ROLES), st.sampled_from(ROLES), text, weird)},
    optional={"content": content, "name": st.one_of(text, weird), "tool_call_id": st.one_of(text, weird),
              "reasoning_content": st.one_of(text, st.none(), weird),
              "tool_calls": st.one_of(st.lists(tool_call, max_size=2), weird),
              "extra": weird},
)
well_formed = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": text}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": text}), min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(st.none(), text),
                           "tool_calls": st.lists(tool_call.filter(lambda c: isinstance(c, dict) and "id" in c),
                                                  min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": text, "tool_call_id": text}),
)
messages = st.one_of(
    st.lists(well_formed, min_size=1, max_size=4),
    st.lists(well_formed, min_size=1, max_size=4),
    st.lists(well_formed, min_size=1, max_size=4),
    st.lists(well_formed, min_size=1, max_size=4),
    st.lists(st.one_of(well_formed, well_formed, message), min_size=1, max_size=4),
    st.lists(message, max_size=3),
    weird,
)
tool = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.one_of(st.sampled_from(["get_weather", "f", "a-b"]), text)},
        optional={"description": text, "parameters": st.one_of(json_schema, weird)})}),
    weird,
)
tools = st.one_of(st.none(), st.lists(tool, max_size=2), weird)

# --- a cache row's chunk file -----------------------------------------------------------------------------
# offsets / sizes are reduced modulo the real file's length in the worker

HEADER_FIELDS = {  # index in chunk_format.CHUNK_HEADER (a whole row's chunk) -> values a re-sealed header may carry
    1: st.sampled_from([0, 2, 4, 0xFFFF]), 2: st.sampled_from([0, 2, 0xFFFF]), 3: st.sampled_from([1, 7, 2**31]),
    4: st.sampled_from([0, 1, 2**31, 2**32 - 1]), 5: st.sampled_from([1, 2**32 - 1]),
    6: st.sampled_from([0, 1, 2**40, 2**64 - 1]), 7: st.binary(min_size=16, max_size=16),
    8: st.binary(min_size=16, max_size=16), 9: st.binary(min_size=32, max_size=32),
    10: st.binary(min_size=32, max_size=32), 11: st.binary(min_size=16, max_size=16),
    12: st.sampled_from([0.0, -1.0, math.nan, math.inf, 1e300]),
}
offset = st.one_of(st.integers(0, 200), st.integers(0, 2**22))
row_mutation = st.one_of(
    st.just(("none",)),
    st.tuples(st.just("set"), st.lists(st.tuples(offset, st.integers(0, 255)), min_size=1, max_size=4)),
    st.tuples(st.just("flip"), st.lists(st.tuples(offset, st.integers(0, 7)), min_size=1, max_size=4)),
    st.tuples(st.just("truncate"), st.one_of(st.integers(0, 200), st.integers(0, 2**22))),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("splice"), offset, st.integers(0, 64), st.binary(max_size=64)),
    st.tuples(st.just("rename"), st.sampled_from(["0" * 32, "f" * 32, "nothex", "a" * 31])),
    st.sampled_from(sorted(HEADER_FIELDS)).flatmap(lambda i: st.tuples(st.just("field"), st.just(i),
                                                                       HEADER_FIELDS[i])),
    st.sampled_from([("symlink",), ("directory",)]),
)
if known(8):  # a valid-checksum row whose llama.cpp state is malformed
    row_mutation = st.one_of(row_mutation, st.tuples(st.just("payload_resealed"),
                                                     st.lists(st.tuples(offset, st.integers(0, 255)),
                                                              min_size=1, max_size=8)))
if known(5):
    row_mutation = st.one_of(row_mutation, st.just(("fifo",)))
if known(6):
    row_mutation = st.one_of(row_mutation, st.just(("sparse", 40 << 30)))

# values of any type that can be dict keys (N3: unhashable refs)
hashable = st.one_of(st.none(), st.booleans(), ints, floats, text, st.binary(max_size=8), st.just(()))

# chat: mostly conversations a template can render, then junk (one_of alone draws junk too often)
valid_tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["get_weather", "f", "search_web"])},
    optional={"description": text, "parameters": json_schema})})
conversation = st.integers(0, 9).flatmap(lambda i: st.tuples(
    st.lists(well_formed, min_size=1, max_size=4) if i < 7 else messages,
    st.one_of(st.none(), st.lists(valid_tool, min_size=1, max_size=2)) if i < 8 else tools))
