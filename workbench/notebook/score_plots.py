"""The figure of a scored text (``wb.score``): each token's surprise, in bits, along the text.
Like `plots`, it returns a `Figure` and takes ``ax=``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from workbench.notebook.plots import figure_and_axes

LABELLED = 48   # at most this many tokens get their text as a tick label


def surprise(result: Any, *, ax: Any = None) -> Any:
    """-log2 p of each token given the ones before it (bars; the model's argmax tokens in
    green), with the mean as a line; short texts labelled with their tokens' text."""
    bits = -np.asarray(result.logprobs, dtype=np.float64) / math.log(2)
    ranks = np.asarray(result.ranks)
    n = len(bits)
    fig, ax = figure_and_axes(ax, (max(7.0, min(14.0, 0.25 * n)), 3.5))
    x = np.arange(n)
    scored = ranks > 0
    colours = np.where(ranks == 1, "#198754", "#6c757d")
    ax.bar(x[scored], bits[scored], color=colours[scored], width=0.8)
    if scored.any():
        mean = float(np.mean(bits[scored]))
        ax.axhline(mean, color="#fd7e14", linewidth=1, label=f"mean {mean:.2f} bits")
        ax.legend(loc="upper right", fontsize="small")
    if n <= LABELLED:
        ax.set_xticks(x, [repr(p)[1:-1] for p in result.pieces], rotation=90, fontsize="small")
    ax.set_xlabel("token" if n <= LABELLED else "position")
    ax.set_ylabel("surprise (bits)")
    ax.set_title("surprise along the text (green: the model's top choice)")
    return fig
