"""What load_model accepts: `LoadConfig`, and the llama.cpp context parameters it resolves
to, with the relations between settings that llama.cpp asserts on checked first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidOption
from .placement import (LOAD_MODES, MAX_DEVICES, ROPE_SCALING_TYPES, SPLIT_MODES, as_choice_or_none,
                        as_float_or_none, as_positive, as_tensor_split, check_load_mode, context_overrides)
from .rules import MAX_THREADS, as_bool, as_int, as_marker_pair, as_str, default_threads, one_of, opt

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

BATCH_STRATEGIES = ("decode_first", "prefill_first", "round_robin")

CHAT_TEMPLATE_CACHE = 8  # parsed chat templates kept per model (chat.render.TemplateCache)


def _batch_strategy(key: str, v: Any, where: str) -> Any:
    """A built-in strategy's name, or an object with a callable ``plan(active, budget)``
    (workbench.engine.scheduler.BatchStrategy)."""
    if isinstance(v, str) and v in BATCH_STRATEGIES:
        return v
    try:
        plan = None if isinstance(v, str) else getattr(v, "plan", None)
    except Exception:  # a user's object whose attribute lookup raises
        plan = None
    if not callable(plan):
        raise InvalidOption(key, v, "one of " + ", ".join(repr(c) for c in BATCH_STRATEGIES)
                            + ", or an object with a plan(active, budget) method", where)
    return v


def _signing_key(key: str, v: Any, where: str) -> Any:
    if v is None:
        return None
    if isinstance(v, str):
        v = v.encode("utf-8")
    if not isinstance(v, (bytes, bytearray)) or not v:
        raise InvalidOption(key, "<hidden>", "non-empty bytes or str, or None", where)
    return bytes(v)


@dataclass(slots=True, frozen=True)
class LoadConfig:
    """What ``load_model`` accepts. Context options change the KV layout and are fixed per load."""

    model_path: str | None = opt(None, as_str(), "GGUF file; None loads the default model")
    model_id: str | None = opt(None, as_str(), "id to register the model under; derived from the file name")
    n_ctx: int | None = opt(None, as_int(16, none_ok=True), "context tokens; None = min(n_ctx_train, 8192)")
    n_batch: int = opt(2048, as_int(1), "most tokens one decode may carry (all sequences together)")
    n_ubatch: int = opt(512, as_int(1), "physical micro-batch")
    n_seq_max: int = opt(4, as_int(1, 256), "concurrent sequences")
    n_threads: int | None = opt(None, as_int(1, MAX_THREADS, none_ok=True),
                                "threads (ggml's limit: 512); None = $WORKBENCH_N_THREADS, else the cores "
                                "this process may use")
    n_threads_batch: int | None = opt(None, as_int(1, MAX_THREADS, none_ok=True),
                                      "prefill threads; None = n_threads")
    flash_attn: str = opt("auto", one_of("auto", "on", "off"))
    deterministic: bool = opt(False, as_bool, "batch-invariant kernels: greedy output independent of the cache "
                                              "and of what shares the batch, at a prefill cost (needs flash_attn)")
    type_k: str = opt("f16", one_of(*KV_CACHE_TYPES), "K cache type")
    type_v: str = opt("f16", one_of(*KV_CACHE_TYPES), "V cache type (quantised needs flash_attn)")
    n_gpu_layers: int = opt(-1, as_int(-1), "layers to offload on a GPU build (-1 = all); ignored on CPU")
    split_mode: str = opt("layer", one_of(*SPLIT_MODES), "GPU build: 'none' (main_gpu holds the model), 'layer' "
                                                         "(layers and KV spread over GPUs), 'row' (rows too)")
    main_gpu: int = opt(0, as_int(-1, MAX_DEVICES - 1), "split_mode 'none': the GPU of the model (-1 = none)")
    tensor_split: tuple[float, ...] | None = opt(None, as_tensor_split,
                                                 "share of the model per GPU, e.g. [3, 1]; None = by free memory")
    use_mmap: bool = opt(True, as_bool, "memory-map the file (load_mode 'auto'; False: 'none')")
    use_mlock: bool = opt(False, as_bool, "lock the weights in RAM (load_mode 'mmap+mlock', or 'mlock' without mmap)")
    load_mode: str | None = opt(None, as_choice_or_none(*LOAD_MODES),
                                "llama.cpp's llama_load_mode; None = from use_mmap / use_mlock")
    offload_kqv: bool = opt(True, as_bool, "GPU build: the KV cache and attention on the GPU")
    swa_full: bool = opt(True, as_bool, "a full-size KV cache for sliding-window attention layers")
    rope_scaling_type: str | None = opt(None, as_choice_or_none(*ROPE_SCALING_TYPES), "None = the model's")
    rope_freq_base: float | None = opt(None, as_positive(), "RoPE base frequency; None = the model's")
    rope_freq_scale: float | None = opt(None, as_float_or_none(0.001, 1000.0),
                                        "RoPE frequency scale (1 / context extension); None = the model's")
    yarn_ext_factor: float | None = opt(None, as_float_or_none(0.0, 1.0),
                                        "YaRN extrapolation mix; None = 1 with yarn scaling, else 0")
    yarn_attn_factor: float | None = opt(None, as_positive(), "YaRN magnitude scale; None = the model's")
    yarn_beta_fast: float | None = opt(None, as_positive(), "YaRN low correction dim; None = the model's (32)")
    yarn_beta_slow: float | None = opt(None, as_positive(), "YaRN high correction dim; None = the model's (1)")
    yarn_orig_ctx: int | None = opt(None, as_int(1, 2**21, none_ok=True),
                                    "YaRN original context; None = the model's (its n_ctx_train)")
    decode_budget_ms: int = opt(30000, as_int(0), "wall-clock bound of one native step; 0 = off")
    max_queue: int = opt(64, as_int(0), "requests waiting for a sequence before QueueFull")
    history_size: int = opt(4096, as_int(0, 1_000_000), "finished requests kept for wb.history() (0 = none)")
    prefill_chunk_size: int | None = opt(-1, as_int(-1, none_ok=True),
                                         "one prompt's share of a tick; -1 = max(64, n_batch/4), None = off")
    cache: bool = opt(True, as_bool, "use the shared KV prefix cache (restore at admission, save rows)")
    cache_min_tokens: int = opt(16, as_int(1), "shortest prefix worth a row (or worth sharing live)")
    share_prefixes: bool = opt(True, as_bool, "start a request from the KV another live sequence of its cache "
                               "scope holds (copied) when that is its longest prefix")
    share_wait_ms: int = opt(30000, as_int(0), "longest a queued request waits for a prefill of its prefix "
                             "under way, to copy it; 0 = never waits")
    cold_checkpoint_interval: int | None = opt(2048, as_int(64, none_ok=True),
                                               "checkpoint a long cold prefill every N tokens; None = off")
    cold_min_tokens: int = opt(0, as_int(0), "no cold checkpoint before this position")
    cold_max_tokens: int | None = opt(None, as_int(1, none_ok=True),
                                      "no cold checkpoint past this position; None = no bound")
    evict_save_timeout_ms: int = opt(30000, as_int(0), "bound on evict()/shutdown() saves")
    batch_strategy: Any = field(default="decode_first", compare=False, metadata={
        "check": _batch_strategy, "doc": "which rows each decode carries: 'decode_first', 'prefill_first', "
                                        "'round_robin', or an object with plan(active, budget)"})

    thinking_markers: dict[str, str] | None = opt(None, as_marker_pair,
                                                  "{'start', 'end'} of reasoning blocks; None = the template's")
    thinking_signing_key: bytes | None = field(default=None, repr=False, metadata={
        "check": _signing_key, "doc": "HMAC-SHA256 key signing thinking blocks; None = unsigned ('')"})
    embed_n_ctx: int | None = opt(None, as_int(8, none_ok=True),
                                  "tokens one embedding decode holds; None = min(n_ctx_train, 2048)")
    embed_n_seq_max: int = opt(16, as_int(1, 256), "sequences packed into one embedding decode")
    chat_template_cache: int = opt(CHAT_TEMPLATE_CACHE, as_int(1, 1024),
                                   "parsed chat templates kept per model (by source)")

    def __post_init__(self) -> None:
        check_load_mode(self)
        if self.cold_max_tokens is not None and self.cold_max_tokens < self.cold_min_tokens:
            raise InvalidOption("cold_max_tokens", self.cold_max_tokens,
                                f"None or >= cold_min_tokens ({self.cold_min_tokens})", "config")
        _check_batch(self.n_ctx, self.n_batch, self.n_seq_max)
        if self.deterministic and self.flash_attn == "off":
            raise InvalidOption("flash_attn", self.flash_attn, "'on' or 'auto' with deterministic=True (the only "
                                "batch-invariant attention kernel on CPU is flash attention's row kernel)", "config")
        if self.embed_n_ctx is not None:
            _check_embed(self.embed_n_ctx, self.embed_n_seq_max)

    def context_params(self, n_ctx_train: int) -> dict[str, Any]:
        """The generation context's parameters for a model trained on ``n_ctx_train`` tokens,
        relations checked with the resolved n_ctx (InvalidOption)."""
        params = context_params(self, n_ctx_train)
        _check_batch(params["n_ctx"], self.n_batch, self.n_seq_max, "" if self.n_ctx else "the model's default")
        return params

    def embed_params(self, n_ctx_train: int) -> tuple[int, int]:
        """(n_ctx, n_seq_max) of an embedding context, relation checked (InvalidOption)."""
        n_ctx, n_seq = embed_params(self, n_ctx_train)
        _check_embed(n_ctx, n_seq)
        return n_ctx, n_seq


DEFAULT_N_CTX = 8192
DEFAULT_EMBED_N_CTX = 2048


def context_params(cfg: Any, n_ctx_train: int) -> dict[str, Any]:
    """What ``_native.Context`` gets for ``cfg`` (a LoadConfig, or an object with its context
    fields: the model probe's child passes them unchecked), defaults resolved."""
    n_threads = cfg.n_threads or default_threads()
    deterministic = bool(getattr(cfg, "deterministic", False))   # the probe's child passes no such field
    n_ctx = cfg.n_ctx or min(n_ctx_train or DEFAULT_N_CTX, DEFAULT_N_CTX)
    return {"n_ctx": n_ctx, "n_batch": cfg.n_batch,
            "n_ubatch": min(cfg.n_ubatch, cfg.n_batch), "n_seq_max": cfg.n_seq_max, "n_threads": n_threads,
            "n_threads_batch": cfg.n_threads_batch or n_threads,
            "flash_attn": "on" if deterministic else cfg.flash_attn,
            "type_k": cfg.type_k, "type_v": cfg.type_v, **context_overrides(cfg),
            **(deterministic_kv(n_ctx, cfg.n_seq_max) if deterministic else {})}


def deterministic_kv(n_ctx: int, n_seq_max: int) -> dict[str, Any]:
    """Deterministic mode's KV: ggml's reference kernels, and a KV stream of its own for each
    sequence, of ``n_ctx`` cells (so n_seq_max times the memory of a unified KV). In one
    unified KV a sequence's cells are summed in cell order, and cells another sequence freed
    below its own take its next tokens: its reply then depended on when others ended
    (docs/architecture.md, "Warm equals cold"). A stream holds one sequence's cells in
    position order."""
    return {"reference_kernels": True, "kv_unified": False, "n_ctx": n_ctx * n_seq_max}


def embed_params(cfg: Any, n_ctx_train: int) -> tuple[int, int]:
    """(n_ctx, n_seq_max) of ``cfg``'s embedding contexts, defaults resolved."""
    return cfg.embed_n_ctx or min(n_ctx_train or DEFAULT_EMBED_N_CTX, DEFAULT_EMBED_N_CTX), cfg.embed_n_seq_max


def _check_batch(n_ctx: int | None, n_batch: int, n_seq_max: int, n_ctx_is: str = "") -> None:
    """llama.cpp reserves one output row per sequence in a batch of min(n_ctx, n_batch) rows
    (llama_context: n_batch = min(n_ctx, n_batch) for causal models, n_outputs_max = n_batch,
    then output_reserve(n_seq_max) asserts n_seq_max <= n_outputs_max: the process aborts)."""
    if n_seq_max > n_batch:
        raise InvalidOption("n_batch", n_batch, f"at least n_seq_max ({n_seq_max}): llama.cpp needs a batch row "
                            "per sequence", "config")
    if n_ctx is not None and n_seq_max > n_ctx:
        raise InvalidOption("n_ctx", n_ctx, f"at least n_seq_max ({n_seq_max}): llama.cpp needs a batch row "
                            "per sequence, and a batch holds at most n_ctx rows"
                            + (f" ({n_ctx_is})" if n_ctx_is else ""), "config")


def _check_embed(n_ctx: int, n_seq_max: int) -> None:
    """An embedding context is one micro-batch of n_ctx tokens over n_seq_max sequences;
    llama.cpp's graph reserve rounds the micro-batch up to a multiple of n_seq_max while the
    output rows stay n_ctx, and mean pooling then fails ggml_can_mul_mat (an abort)."""
    if n_ctx % n_seq_max:
        up = -(-n_ctx // n_seq_max) * n_seq_max
        raise InvalidOption("embed_n_ctx", n_ctx, f"a multiple of embed_n_seq_max ({n_seq_max}), e.g. {up}: "
                            "llama.cpp splits the embedding batch evenly across its sequences", "config")

