"""lm-evaluation-harness's model ``workbench``: importing this module registers it.

    import lm_eval
    import workbench.integrations.lm_eval   # registers model="workbench"
    results = lm_eval.simple_evaluate(model="workbench", model_args="model=default", tasks=[...])

``model_args``: ``model=ID`` (a loaded model's id; ``default`` loads the default model
unless it is loaded), or ``model_path=FILE`` plus any ``wb.load_model`` option (loaded for
the run, kept loaded after). Requests are answered by the workbench's calls, batched by the
engine's scheduler: ``loglikelihood`` by ``wb.loglikelihood`` (a question's context computed
once), ``loglikelihood_rolling`` by ``wb.score`` over the text after the prefix token (in
windows past the context), ``generate_until`` by ``wb.complete`` (greedy unless the task
samples; its ``until`` strings are stop sequences). lm-eval's ``batch_size`` and ``device``
are accepted and ignored: the scheduler batches, the model's load options place it.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

import workbench as wb

DEFAULT_GEN_TOKENS = 256   # lm-eval's default max_gen_toks


@register_model("workbench")
class WorkbenchLM(LM):
    def __init__(self, model: str | None = None, model_path: str | None = None, batch_size: Any = None,
                 max_batch_size: Any = None, device: Any = None, **load_options: Any) -> None:
        super().__init__()
        self.model = _model(model, model_path, load_options)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return wb.loglikelihood(self.model, [tuple(r.args) for r in requests])

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        return wb.loglikelihood_rolling(self.model, [r.args[0] for r in requests])

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = []
        for r in requests:
            context, gen = r.args
            out.append(wb.complete(self.model, context, **_generation(gen)).reply)
        return out


def _model(model: str | None, model_path: str | None, load_options: dict[str, Any]) -> str:
    """A loaded model's id: the one named, else one loaded from ``model_path`` (default: the
    default model's file) with these options, else that file loaded now."""
    if model is not None and model != "default" and model_path is None:
        wb.model_info(model)               # NotLoaded names it
        return model
    path = str(wb.fetch_default_model()) if model_path is None else model_path
    if not load_options:
        for m in wb.list_models():
            if m["path"] == path:
                return str(m["model_id"])
    return wb.load_model(model_path=path, **load_options)


def _generation(gen: dict[str, Any]) -> dict[str, Any]:
    until = gen.get("until") or []
    opts: dict[str, Any] = {"response_tokens": int(gen.get("max_gen_toks", DEFAULT_GEN_TOKENS)),
                            "stop_sequences": [until] if isinstance(until, str) else list(until)}
    if gen.get("do_sample"):
        opts["temperature"] = float(gen.get("temperature", 1.0))
    else:
        opts["temperature"] = 0.0
    return opts
