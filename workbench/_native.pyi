"""Type stub of workbench._native, the pybind11 core over the pinned llama.cpp.

Every long call releases the GIL. Bad arguments raise ValueError; failures inside
llama.cpp raise NativeError (a RuntimeError) carrying llama.cpp's last log lines.
"""

from collections.abc import Callable
from typing import Any

__version__: str
llama_commit: str
cuda: bool

class NativeError(RuntimeError): ...

def system_info() -> str: ...
def max_devices() -> int: ...
def supports_gpu_offload() -> bool: ...
def devices() -> list[dict[str, Any]]:
    """ggml's backend devices: name, description, kind ('cpu' | 'gpu' | 'igpu' | 'accel' | 'meta'),
    free and total bytes as the backend reports them."""
def memory_breakdown(ctx: Context) -> list[dict[str, Any]]:
    """Where a context's model weights and KV cache live, per buffer type: buffer, device (None:
    host), kind, host, model and context (KV cache) bytes (llama.cpp's memory breakdown). Safe
    while the context decodes: compute buffers, which a decode may reallocate, are left out."""
def gguf_context_length(path: str) -> int: ...
def gguf_check(path: str) -> str | None:
    """None if path is a structurally sound GGUF file, else what is wrong with it."""
def set_log_echo(on: bool) -> None:
    """Echo llama.cpp's log to stderr (off by default)."""
def recent_log() -> str: ...

class Model:
    """A loaded llama_model; read-only after load, so tokenize is safe from any thread."""
    path: str
    closed: bool
    n_vocab: int
    bos: int
    eos: int
    eot: int
    add_bos: bool
    add_eos: bool
    n_ctx_train: int  # as the file states, read at load (llama.cpp may rescale its own copy for YaRN)
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    size: int
    n_params: int
    desc: str
    quant_tag: str  # llama_ftype_name of the file, e.g. 'Q4_1'
    chat_template: str | None
    max_piece_bytes: int  # the longest token piece (specials included), in bytes
    def __init__(self, path: str, n_gpu_layers: int = 0, use_mmap: bool = True, vocab_only: bool = False,
                 options: dict[str, Any] = ...) -> None:
        """options: split_mode ('none' | 'layer' | 'row'), main_gpu, tensor_split (<= 16 floats),
        load_mode (llama_load_mode's names; wins over use_mmap); absent or None = llama.cpp's default."""
    def close(self) -> None: ...
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...
    def token_to_piece(self, token: int, special: bool = False) -> bytes: ...
    def detokenize(self, tokens: list[int], remove_special: bool = False, unparse_special: bool = False) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...
    def meta(self, key: str) -> str | None: ...
    def metadata(self) -> dict[str, str]: ...

class Context:
    """A llama_context: n_seq_max sequences sharing one (unified) KV cache, or each in a stream
    of its own (kv_unified=False: deterministic mode)."""
    n_ctx: int    # the context one sequence can hold (all cells with a unified KV)
    n_cells: int  # the KV cells of all sequences
    kv_streams: int  # 1: a unified KV; n_seq_max: a stream per sequence (deterministic mode)
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_threads: int
    reference_kernels: bool
    abort_reason: str
    def __init__(self, model: Model, params: dict[str, Any]) -> None:
        """params: n_ctx, n_batch, n_ubatch, n_seq_max, n_threads, n_threads_batch, flash_attn, type_k,
        type_v, embeddings, kv_unified, reference_kernels; offload_kqv, swa_full and the RoPE/YaRN overrides
        (rope_scaling_type, rope_freq_base, rope_freq_scale, yarn_*: absent or None = the model's)."""
    def close(self) -> None: ...
    def set_reference_kernels(self, on: bool) -> int:
        """ggml's CPU reference kernels on or off (a row's result then does not depend on
        the rows sharing its ubatch); returns how many CPU backends were set."""
    def decode(self, tokens: list[int], pos: list[int], seq: list[int], logits: list[int],
               budget_ms: float = 0.0) -> int:
        """One llama_decode over rows of several sequences. 0 ok, 1 no KV slot, 2 aborted
        (abort_reason: 'cancelled' or 'timeout'), -1 invalid batch, < -1 fatal."""
    def request_abort(self) -> None: ...
    def clear_abort(self) -> None: ...
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool: ...
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_keep(self, seq: int) -> None: ...
    def seq_pos_max(self, seq: int) -> int: ...
    def seq_pos_min(self, seq: int) -> int: ...
    def memory_clear(self) -> None: ...
    def state_seq_get(self, seq: int) -> bytes: ...
    def state_seq_set(self, seq: int, data: bytes) -> int:
        """Bytes read; 0 when llama.cpp refused the state. ValueError ('state_seq_set: refused a
        malformed sequence state (<reason>)'), nothing restored, when it does not fit this context."""
    def state_cut(self, state: bytes, keys: list[bytes], chunk_size: int, first: int = 0,
                  ends: list[int] = ...) -> list[bytes]:
        """The state cut into chunks of chunk_size positions, or ending at ``ends`` (increasing,
        the last the state's cell count; chunk i tagged keys[i], 16 bytes), chunks first..
        (docs/cache.md, "Chunked state"). ValueError ('state_cut: <reason>') when
        it is not one sequence holding positions 0 .. n-1 or len(keys) is not the chunk count."""
    def state_join(self, pieces: list[bytes], keys: list[bytes], n_tokens: int = 0) -> bytes:
        """One sequence state from chunks that carry keys[0..] in order, positions following
        from 0, one KV layout and exact sizes (n_tokens > 0: only the first n_tokens positions,
        ending inside the last chunk); ValueError ('state_join: <reason>') otherwise."""
    def state_seq_get_chunks(self, seq: int, keys: list[bytes], chunk_size: int, first: int = 0,
                             scratch: bytearray | None = None, ends: list[int] = ...) -> list[bytes]:
        """state_cut(state_seq_get(seq), ...), the state copied out of llama.cpp into
        ``scratch`` (grown when shorter; kept between calls, its pages stay mapped)."""
    def state_seq_set_chunks(self, seq: int, pieces: list[bytes], keys: list[bytes], n_tokens: int = 0,
                             scratch: bytearray | None = None) -> int:
        """state_seq_set(seq, state_join(pieces, keys)), joined into ``scratch`` (grown when
        shorter); nothing restored when the join refuses. TypeError: scratch not a bytearray;
        BufferError: a scratch too short that another view holds."""

class Sampler:
    """A per-request llama.cpp sampler chain: shaping (reasoning budget, grammar, logit_bias,
    penalties) then picking (greedy, or top-k/p, min-p, temperature, dist).

    params: temperature, top_k, top_p, min_p, repetition_penalty, repeat_last_n (-1 = the
    model's trained context), frequency_penalty, presence_penalty, seed, grammar /
    grammar_root or grammar_proto, reasoning_budget, ignore_eos, min_tokens (no
    end-of-generation token before this many samples), logit_bias ([(id, bias)], -inf bans),
    logprobs (alternatives per token; None = off, up to n_vocab)."""
    def __init__(self, model: Model, params: dict[str, Any]) -> None: ...
    def sample(self, ctx: Context, idx: int) -> int:
        """Sample (and accept) a token from output row idx of the last decode. ValueError
        "<part>: ..." when no token can be picked: "logit_bias" (it bans every token the rest
        of the shaping leaves), "grammar" (the grammar allows none here) or "sampler" (every
        candidate ruled out otherwise, or the shaped logits are not finite)."""
    def last_logprobs(self) -> tuple[float, list[tuple[int, float]]] | None:
        """The last sampled token's logprob and the top `logprobs` tokens [(id, logprob)],
        most likely first, from the log-softmax of the shaped logits (before temperature and
        truncation; tokens of probability 0 left out). None without logprobs."""
    def accept(self, token: int) -> None: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...

class Speculative:
    """llama.cpp's common_speculative (common/speculative.h) for one drafter over n_seq sequences.

    params: ``type`` (one of :func:`speculative_types`, llama.cpp's names), ``n_max``,
    ``n_min``, ``p_min`` (draft-simple), ``size_n``, ``size_m``, ``min_hits`` (n-gram
    lookup and draft lengths). draft-simple needs the target and draft contexts and runs
    llama.cpp's vocabulary check (ValueError when the vocabularies differ).
    """
    type: str
    n_max: int
    n_seq: int
    def __init__(self, model: Model, params: dict[str, Any], n_seq: int = 1, target: Context | None = None,
                 draft: Context | None = None) -> None: ...
    def begin(self, seq: int, prompt: list[int]) -> None: ...
    def draft(self, seq: int, history: list[int], id_last: int, pos0: int, n_max: int) -> list[int]:
        """Up to n_max tokens to follow history (the sequence's KV) + id_last (at pos0)."""
    def accept(self, seq: int, n_accepted: int) -> None: ...
    def close(self) -> None: ...

def speculative_types() -> list[str]: ...
def top_logits(ctx: Context, idx: int, n: int = 2) -> list[tuple[int, float]]:
    """The n largest logits at output row idx of the last decode, largest first."""

def json_schema_to_grammar(schema_json: str) -> str:
    """GBNF for a JSON schema (JSON text), by llama.cpp common's converter."""

class ChatParser:
    """The parser one rendering produced (format, generation prompt, PEG arena); immutable."""
    format: str
    generation_prompt: str
    def parse(self, text: str, is_partial: bool = False) -> dict[str, Any]:
        """dict(role, content, reasoning_content, tool_calls=[{name, arguments (JSON text), id}]);
        ValueError when a complete reply does not match the format."""

class ChatTemplates:
    """A model's chat templates (llama.cpp common), parsed once; ``template`` overrides the GGUF's."""
    has_template: bool
    def __init__(self, model: Model, template: str = "") -> None: ...
    def source(self, variant: str = "") -> str: ...
    def caps(self) -> dict[str, bool]: ...
    def apply(self, messages_json: str, tools_json: str = "", tool_choice: str = "auto",
              parallel_tool_calls: bool = False, add_generation_prompt: bool = True,
              enable_thinking: bool = True, kwargs_json: str = "", json_schema: str = "",
              continue_final_message: bool = False) -> dict[str, Any]:
        """dict(prompt, grammar, grammar_lazy, grammar_triggers, preserved_tokens, additional_stops,
        generation_prompt, supports_thinking, thinking_start_tag, thinking_end_tags, format, parser).
        ValueError for anything common refuses (bad role or content, bad tools, a template error)."""

class Grammar:
    """A GBNF grammar parsed once into a prototype sampler; each request clones it."""
    text: str
    def __init__(self, model: Model, text: str, root: str = "root") -> None: ...

def grammar_prefill(grammar: Grammar, text: str) -> None:
    """Advance a grammar prototype past text the prompt holds (a template's generation prompt);
    idempotent for the same text, ValueError if the grammar refuses it (the prototype unchanged)."""
def grammar_make_lazy(grammar: Grammar, triggers: list[dict[str, Any]], preserved_tokens: list[str]) -> None:
    """Make a grammar prototype lazy on a chat template's triggers, as llama.cpp's server does."""

class Embedder:
    """An embedding context (embeddings on, one pooling type) of its own; not re-entrant."""
    pooling: str
    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_embd: int
    closed: bool
    def __init__(self, model: Model, pooling: str = "mean", n_ctx: int = 2048, n_seq_max: int = 16,
                 n_threads: int = 4) -> None: ...
    def embed(self, inputs: list[list[int]], normalize: bool = True) -> list[Any]:
        """One vector per input (pooled) or one list of token vectors per input ('none');
        inputs are packed into as few llama_decode calls as fit (GIL released)."""
    def close(self) -> None: ...

class Adapter:
    """A LoRA adapter file loaded for one model (llama_adapter_lora)."""
    path: str
    def __init__(self, model: Model, path: str) -> None: ...
    def close(self) -> None: ...
    def meta(self, key: str) -> str | None: ...
def set_adapters(ctx: Context, adapters: list[Adapter], scales: list[float]) -> None:
    """Apply these adapters at these scales to every sequence of the context ([] clears)."""
def score_rows(ctx: Context, rows: list[int], targets: list[int], top: int = 0) -> tuple[Any, Any, Any, Any]:
    """Log-probability (float64 array: the raw logits' log-softmax) of targets[i] at output
    row rows[i] of the context's last decode, its rank (int32, 1 = argmax) and the ``top``
    most likely ids (int32, (n, top)) and their logprobs (float32, (n, top))."""

class _S3Fifo:
    """S3-FIFO over small integer keys (csrc/eviction.h); workbench.cache.s3fifo wraps it."""

    def __init__(self, small_ratio: float, ghost_ratio: float, move_to_main_threshold: int) -> None: ...
    def set_capacity(self, capacity_bytes: int) -> None:
        """-1: unbounded."""
    def on_admit(self, key: int) -> None: ...
    def on_insert(self, key: int, size: int) -> None: ...
    def on_hit(self, key: int) -> None: ...
    def on_remove(self, key: int) -> None: ...
    def alive(self, key: int) -> bool:
        """Queued, in the ghost, or admitted after a ghost hit."""
    def victim(self, is_protected: Callable[[int], bool]) -> int:
        """The key to evict (no longer tracked), -1 when every key is protected."""
    def small_keys(self) -> list[int]: ...
    def main_keys(self) -> list[int]: ...
    @property
    def has_evicted(self) -> bool: ...
    @property
    def main_capacity(self) -> int: ...
    @property
    def empty(self) -> bool: ...

class _Evict:
    """The submodule workbench._native.evict: the built-in policies' rankings (csrc/eviction.h)."""

    S3Fifo = _S3Fifo
    @staticmethod
    def frecency_priority(last_used: float, hits: int, now: float, credit_s: float, half_life_s: float) -> float: ...
    @staticmethod
    def gdsf_value(inflation: float, hits: int, n_tokens: int, size_bytes: int) -> float: ...

evict: _Evict

class _LabPlan:
    """A chunk-model plan as arrays (workbench/lab/native.py builds it); ValueError if inconsistent."""

    def __init__(self, *, chunk_size: int, parent: Any, tok_ptr: Any, toks: Any, row_last: Any, row_tokens: Any,
                 node_row: Any, plen: Any, arrival: Any, node_ptr: Any, nodes: Any, prompt_last: Any,
                 save_ptr: Any, save_row: Any, save_kind: Any, finish_row: Any) -> None: ...
    def row_chain_lengths(self) -> Any: ...
    @property
    def n_chunks(self) -> int: ...
    @property
    def n_rows(self) -> int: ...
    @property
    def n_requests(self) -> int: ...

class _Lab:
    """The submodule workbench._native.lab: the eviction lab's native replay (csrc/lab_replay.cpp)."""

    Plan = _LabPlan
    @staticmethod
    def replay(plan: _LabPlan, policy: str, params: dict[str, Any], budget: int, chunk_bytes: Any,
               manifest_bytes: Any, bytes_per_token: int, timeline_every: int, record: bool) -> dict[str, Any]:
        """run_plan's loop for a built-in policy (lru, lfu, fifo, gdsf, frecency, s3fifo): counters,
        the timeline and, with record, each request's hit kind code and prefill saved."""

lab: _Lab
