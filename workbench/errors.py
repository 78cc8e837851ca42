"""One exception hierarchy for the whole workbench.

Every error names what was wrong: the option and the value, the model id, the path. They
are the Python form of erllama's ``{error, Reason}`` tuples (see docs/api.md for the map).
Each class also derives from the matching built-in (ValueError, LookupError, ...) so
generic ``except ValueError`` code keeps working.
"""

from __future__ import annotations

import difflib
from typing import Any


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""


# --- configuration and options -----------------------------------------------------------

class OptionError(WorkbenchError, ValueError):
    """Base of the option/config validation errors."""

    key: str


# names users bring from the OpenAI API, llama.cpp or Ollama, and ours for the same thing
OPTION_ALIASES = {
    "max_tokens": "response_tokens", "max_new_tokens": "response_tokens", "max_completion_tokens": "response_tokens",
    "n_predict": "response_tokens", "num_predict": "response_tokens", "stop": "stop_sequences",
    "repeat_penalty": "repetition_penalty", "ctx_size": "n_ctx", "num_ctx": "n_ctx", "threads": "n_threads",
    "model": "model_path", "response_format": "json_schema",
}


def close_matches(word: str, known: list[str] | tuple[str, ...], aliases: dict[str, str] | None = None) -> list[str]:
    """The known names `word` was probably meant to be: its alias when that is known, else
    the name spelled the same but for "_" / "-", else up to three names difflib finds
    close. Leading dashes are ignored, so "--max_tokens" is compared as "max_tokens"."""
    def bare(name: str) -> str:
        return name.replace("-", "_").lstrip("_")

    by_bare = {bare(k): k for k in known}
    alias = (aliases or {}).get(bare(word))
    if alias in by_bare:
        return [by_bare[alias]]
    if bare(word) in by_bare:
        return [by_bare[bare(word)]]
    return [by_bare[c] for c in difflib.get_close_matches(bare(word), list(by_bare), n=3, cutoff=0.6)]


class UnknownOption(OptionError):
    """An option or config key that the call does not know."""

    def __init__(self, key: str, allowed: list[str] | tuple[str, ...], where: str = "option") -> None:
        self.key, self.allowed, self.where = key, tuple(allowed), where
        close = close_matches(str(key), self.allowed, OPTION_ALIASES)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        super().__init__(f"unknown {where} {key!r}{hint}; known: {', '.join(sorted(self.allowed))}")


class InvalidOption(OptionError):
    """A known option whose value has the wrong type or is out of range."""

    def __init__(self, key: str, value: Any, expected: str, where: str = "option") -> None:
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"{where} {key!r}: got {value!r} ({type(value).__name__}), expected {expected}")


class MissingConfig(OptionError):
    """A required config key is absent."""

    def __init__(self, key: str, why: str = "") -> None:
        self.key = key
        super().__init__(f"missing config {key!r}" + (f": {why}" if why else ""))


# --- models ------------------------------------------------------------------------------

class ModelFileError(WorkbenchError, ValueError):
    """model_path does not name a loadable GGUF file (missing, a directory, not GGUF, truncated)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"model_path {path!r}: {reason}")


class LoadError(WorkbenchError, RuntimeError):
    """llama.cpp refused a file that passed our own checks, or a context could not be made."""


class NoGPU(WorkbenchError, RuntimeError):
    """A GPU fact was asked for (``vram_info``) on a machine or build with no GPU device."""

    def __init__(self, devices: list[str] | tuple[str, ...]) -> None:
        self.devices = tuple(devices)
        super().__init__("no GPU: llama.cpp sees only " + (", ".join(self.devices) or "no devices")
                         + " (a CPU-only build or no GPU on this machine; GPU builds: "
                         "CMAKE_ARGS=\"-DWORKBENCH_CUDA=ON\" make build)")


class ModelFetchError(WorkbenchError, RuntimeError):
    """The default model could not be fetched or did not verify."""


class NotLoaded(WorkbenchError, LookupError):
    """A per-model call named a model id that is not loaded."""

    def __init__(self, model: Any) -> None:
        self.model = model
        super().__init__(f"model {model!r} is not loaded")

    def __str__(self) -> str:  # LookupError would quote the whole message
        return self.args[0]


class AlreadyLoaded(WorkbenchError, ValueError):
    """load_model was given a model_id that is already in use."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        super().__init__(f"model id {model_id!r} is already loaded; unload it first or pick another id")


# --- requests ----------------------------------------------------------------------------

class EmptyPrompt(WorkbenchError, ValueError):
    """The prompt has no tokens."""

    def __init__(self) -> None:
        super().__init__("the prompt is empty: give at least one token or a non-empty string")


class ContextOverflow(WorkbenchError, ValueError):
    """The prompt (plus what must be generated) does not fit the model's context."""

    def __init__(self, n_prompt: int, n_ctx: int, detail: str = "") -> None:
        self.n_prompt, self.n_ctx = n_prompt, n_ctx
        super().__init__(f"the prompt has {n_prompt} tokens but the context holds {n_ctx}"
                         + (f" ({detail})" if detail else ""))


class QueueFull(WorkbenchError, RuntimeError):
    """Every sequence is busy and max_queue requests are already waiting."""

    def __init__(self, model_id: str, max_queue: int) -> None:
        self.model_id, self.max_queue = model_id, max_queue
        super().__init__(f"model {model_id!r}: all sequences busy and the queue holds max_queue="
                         f"{max_queue} requests; retry later or raise max_queue")


class SeqCapacity(WorkbenchError, RuntimeError):
    """on_full='error' and every sequence is in use (none free, no idle pin to reclaim)."""

    def __init__(self, model_id: str, n_seq_max: int) -> None:
        self.model_id, self.n_seq_max = model_id, n_seq_max
        super().__init__(f"model {model_id!r}: all {n_seq_max} sequences are busy (on_full='error')")


class SessionBusy(WorkbenchError, RuntimeError):
    """A session already has a request in flight."""

    def __init__(self, session_id: object, ref: int | None = None) -> None:
        self.session_id, self.ref = session_id, ref
        super().__init__(f"session {session_id!r} already has a request in flight"
                         + (f" (ref {ref})" if ref is not None else ""))


class NoSession(WorkbenchError, LookupError):
    """continue_session / end_session named a session the model does not hold."""

    def __init__(self, session_id: object) -> None:
        self.session_id = session_id
        super().__init__(f"no session {session_id!r} on this model")

    def __str__(self) -> str:
        return self.args[0]


class TranscriptMismatch(WorkbenchError, ValueError):
    """expect_committed differs from the session's stored tokens; the session is untouched."""

    def __init__(self, stored_len: int, expected_len: int, diverge_at: int) -> None:
        self.stored_len, self.expected_len, self.diverge_at = stored_len, expected_len, diverge_at
        super().__init__(f"expect_committed does not match the session: stored {stored_len} tokens, "
                         f"expected {expected_len}, first difference at index {diverge_at}")


class SessionReset(WorkbenchError, RuntimeError):
    """reset_session dropped the session this request was running on."""


class UnknownRequest(WorkbenchError, LookupError):
    """request_info / cancel got a reference that was never issued."""

    def __str__(self) -> str:
        return self.args[0]


class DecodeTimeout(WorkbenchError, TimeoutError):
    """One native decode step ran past decode_budget_ms and was aborted."""


class RequestTimeout(WorkbenchError, TimeoutError):
    """A request ran past its ``timeout_s`` (queued + whole request) or ``token_timeout_s``
    (between tokens); the engine cancelled it and freed its sequence. ``option`` names which
    limit, ``phase`` where the request was (queued, prefilling, generating)."""

    def __init__(self, ref: int, option: str, limit_s: float, elapsed_s: float, phase: str,
                 generated_tokens: int) -> None:
        self.ref, self.option, self.limit_s, self.elapsed_s = ref, option, limit_s, elapsed_s
        self.phase, self.generated_tokens = phase, generated_tokens
        what = ("since it was submitted" if option != "token_timeout_s" else
                "since its last token" if generated_tokens else "since it was admitted")
        super().__init__(f"request {ref} ran past {option}={limit_s:g} s ({elapsed_s:.3f} s {what}, "
                         f"while {phase}, {generated_tokens} tokens generated); it was cancelled")


class DecodeFailed(WorkbenchError, RuntimeError):
    """llama_decode returned an error code (rc is llama.cpp's)."""

    def __init__(self, rc: int, detail: str = "") -> None:
        self.rc = rc
        super().__init__(f"llama_decode failed with code {rc}" + (f": {detail}" if detail else ""))


class EngineStopped(WorkbenchError, RuntimeError):
    """The model was unloaded while the request was queued or running, or its loop stopped
    on an error it could not recover from (the message says which)."""


class SamplingFailed(WorkbenchError, RuntimeError):
    """llama.cpp's sampler chain failed for this request (the request ends; the model and
    its other requests go on)."""


class ScoringFailed(WorkbenchError, RuntimeError):
    """Reading a scoring request's logprobs from the decode's logits failed (the request
    ends; the model and its other requests go on)."""


class InvalidBatchPlan(WorkbenchError, RuntimeError):
    """The model's batch strategy returned a plan the engine cannot run (or raised); the
    requests it was planned for fail with this, the loop goes on."""

    def __init__(self, strategy: str, problem: str) -> None:
        self.strategy = strategy
        self.problem = problem
        super().__init__(f"batch strategy {strategy!r}: {problem}")


# --- chat --------------------------------------------------------------------------------

class NoChatTemplate(WorkbenchError, ValueError):
    """The model's GGUF carries no chat template (``tokenizer.chat_template``)."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        super().__init__(f"model {model_id!r} has no chat template in its GGUF metadata; pass "
                         "chat_template='<jinja template>' or build the prompt yourself and use complete()")


# --- cluster (workbench.cluster) ----------------------------------------------------------

class ReplicaDown(WorkbenchError, RuntimeError):
    """A cluster replica (a Ray actor owning one engine) died, is restarting, or every
    replica is down; ``replica`` names it ('' when none is up)."""

    def __init__(self, replica: str, detail: str) -> None:
        self.replica, self.detail = replica, detail
        super().__init__(f"replica {replica!r}: {detail}" if replica else detail)


class SessionLost(NoSession):
    """The replica that held this session died (or restarted): its live KV went with it.
    A NoSession, so code that handles a missing session handles this too."""

    def __init__(self, session_id: object, replica: str) -> None:
        self.session_id, self.replica = session_id, replica
        LookupError.__init__(self, f"session {session_id!r} was lost with replica {replica!r} (it died or "
                                   "restarted); start the conversation again with its whole prompt")


# --- the KV cache's chunked state ----------------------------------------------------------

class KvChunksRefused(WorkbenchError, ValueError):
    """A sequence state could not be cut into KV chunks, or chunks did not verify as the chain
    a row needs (another prefix's key, a gap in positions, another KV layout, a wrong size);
    nothing was handed to llama.cpp."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation, self.reason = operation, reason
        super().__init__(f"{operation}: refused ({reason})")
