"""The machine as llama.cpp sees it: its GPU devices and their memory (``vram_info``), the
GPU bytes a loaded model takes, and the placement options checked against the GPUs there are.

GPU devices are ggml's backend devices of kind 'gpu' or 'igpu' (what llama.cpp offloads
to); the CPU and 'accel' devices (BLAS, AMX: host memory) never count, so a CPU-only build
raises NoGPU instead of reporting system memory as VRAM.
"""

from __future__ import annotations

from typing import Any

from . import _native
from .errors import InvalidOption, NoGPU

GPU_KINDS = ("gpu", "igpu")


def gpu_devices() -> list[dict[str, Any]]:
    """ggml's GPU devices, in llama.cpp's order (the order main_gpu and tensor_split index)."""
    return [d for d in _native.devices() if d["kind"] in GPU_KINDS]


def vram_info() -> dict[str, Any]:
    """Total, free and used bytes summed over the GPU devices, and each device's own; NoGPU
    when there is none."""
    gpus = gpu_devices()
    if not gpus:
        raise NoGPU([f"{d['name']} ({d['kind']})" for d in _native.devices()])
    devices = [{"name": d["name"], "description": d["description"], "kind": d["kind"], "total_bytes": d["total"],
                "free_bytes": d["free"], "used_bytes": max(0, d["total"] - d["free"])} for d in gpus]
    return {key: sum(d[key] for d in devices) for key in ("total_bytes", "free_bytes", "used_bytes")} | {
        "devices": devices}


def vram_estimate_b(ctx: Any) -> int:
    """Bytes a context's model weights and KV cache hold on GPU devices (llama.cpp's memory
    breakdown; compute buffers, which a decode may reallocate, are not read); 0 on a CPU build."""
    return sum(b["model"] + b["context"] for b in _native.memory_breakdown(ctx)
               if b["kind"] in GPU_KINDS and not b["host"])


def check_placement(cfg: Any) -> None:
    """main_gpu and tensor_split name GPUs this machine has (InvalidOption). With no GPU
    device they are ignored, as n_gpu_layers is."""
    n = len(gpu_devices())
    if n == 0:
        return
    if cfg.split_mode == "none" and cfg.main_gpu >= n:
        raise InvalidOption("main_gpu", cfg.main_gpu, f"-1 or a GPU index in [0, {n - 1}] (this machine has {n})",
                            "config")
    split = cfg.tensor_split
    if split is not None and any(split[n:]):
        raise InvalidOption("tensor_split", list(split), f"no share past the {n} GPU(s) this machine has", "config")
