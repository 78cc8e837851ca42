"""The load options that say where a model lives and how llama.cpp reads and runs it:
placement over GPUs (split_mode, main_gpu, tensor_split), the load mode (llama.cpp's
``llama_load_mode``, with ``use_mmap`` / ``use_mlock`` mapped onto it), and the context
overrides that change the KV layout (offload_kqv, swa_full, RoPE/YaRN). The field rules
here; the fields themselves are LoadConfig's (load.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InvalidOption
from .rules import check_number

MAX_DEVICES = 16  # llama_max_devices() at the pinned llama.cpp: tensor_split's size, main_gpu's bound
SPLIT_MODES = ("none", "layer", "row")
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")  # llama_load_mode_from_str's names
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
# context parameters that change the KV cache's bits when set (None: the model's value)
ROPE_KEYS = ("rope_scaling_type", "rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
             "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx")
CONTEXT_KEYS = ("offload_kqv", "swa_full", *ROPE_KEYS)
_MMAP = {"auto", "mmap", "mmap+mlock"}
_MLOCK = {"mlock", "mmap+mlock"}


def as_positive(hi: float | None = None) -> Callable[[str, Any, str], Any]:
    """A finite number > 0 (and <= hi), as a float; or None (the model's value)."""
    def check(key: str, v: Any, where: str) -> Any:
        what = "a finite number > 0" + (f" and <= {hi}" if hi is not None else "")
        f = check_number(key, v, none_ok=True, where=where, what=what)
        if f is not None and (f <= 0 or (hi is not None and f > hi)):
            raise InvalidOption(key, v, what + " or None", where)
        return f
    return check


def as_float_or_none(lo: float, hi: float) -> Callable[[str, Any, str], Any]:
    """A finite number in [lo, hi], as a float; or None (the model's value)."""
    return lambda key, v, where: check_number(key, v, lo, hi, none_ok=True, where=where)


def as_choice_or_none(*choices: str) -> Callable[[str, Any, str], Any]:
    def check(key: str, v: Any, where: str) -> Any:
        if v is None or (isinstance(v, str) and v in choices):
            return v
        raise InvalidOption(key, v, "None or one of " + ", ".join(repr(c) for c in choices), where)
    return check


def as_tensor_split(key: str, v: Any, where: str) -> Any:
    """None, or 1..16 non-negative finite numbers, not all zero, as a tuple of floats: the
    share of the model each GPU holds (llama.cpp normalises them)."""
    if v is None:
        return None
    expected = f"None or a list of 1 to {MAX_DEVICES} non-negative numbers, not all zero (a share per GPU)"
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)) or not 1 <= len(v) <= MAX_DEVICES:
        raise InvalidOption(key, v, expected, where)
    out = tuple(check_number(f"{key}[{i}]", x, 0.0, where=where) for i, x in enumerate(v))
    if not any(out):
        raise InvalidOption(key, v, expected, where)
    return out


def resolved_load_mode(cfg: Any) -> str:
    """llama.cpp's load mode for ``cfg``: ``load_mode`` when given, else from use_mmap /
    use_mlock (mmap alone stays 'auto': mapped where every device supports it, as before)."""
    if cfg.load_mode is not None:
        return str(cfg.load_mode)
    return {(True, False): "auto", (True, True): "mmap+mlock", (False, False): "none",
            (False, True): "mlock"}[(bool(cfg.use_mmap), bool(cfg.use_mlock))]


def check_load_mode(cfg: Any) -> None:
    """An explicit load_mode agrees with use_mmap=False / use_mlock=True when they are set."""
    mode = cfg.load_mode
    if mode is None:
        return
    if cfg.use_mlock and mode not in _MLOCK:
        raise InvalidOption("use_mlock", True, f"False with load_mode {mode!r} (or load_mode 'mlock' or "
                            "'mmap+mlock')", "config")
    if not cfg.use_mmap and mode in _MMAP:
        raise InvalidOption("use_mmap", False, f"True with load_mode {mode!r} (or load_mode 'none', 'mlock' "
                            "or 'dio')", "config")


def model_params(cfg: Any) -> dict[str, Any]:
    """What ``_native.Model`` takes as ``options`` for ``cfg`` (a LoadConfig, or an object
    with its fields: the model probe's child passes them unchecked)."""
    split = cfg.tensor_split
    return {"split_mode": cfg.split_mode, "main_gpu": cfg.main_gpu, "load_mode": resolved_load_mode(cfg),
            "tensor_split": None if split is None else list(split)}


def context_overrides(cfg: Any) -> dict[str, Any]:
    """offload_kqv, swa_full, and the RoPE/YaRN overrides that are set (None: not passed,
    so llama.cpp takes the model's value and the KV layout stays the default one)."""
    out = {"offload_kqv": cfg.offload_kqv, "swa_full": cfg.swa_full}
    out.update({k: getattr(cfg, k) for k in ROPE_KEYS if getattr(cfg, k) is not None})
    return out
