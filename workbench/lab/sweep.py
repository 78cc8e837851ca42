"""The same open-loop load against several engine settings, or several systems, in one call.

    from workbench import lab
    sweep = lab.load_sweep({"decode first": {"batch_strategy": "decode_first"},
                            "prefill first": {"batch_strategy": "prefill_first"},
                            "no cache": {"cache": False}},
                           lab.traces.multi_turn_chats(100), rate=3, duration_s=60,
                           slo={"ttft_s": 1.0, "tpot_s": 0.1})
    sweep.summary      # one row per setting: its options, throughput, percentiles, goodput
    sweep.requests     # every request of every setting (a `setting` column)
    sweep.plot()       # latency CDFs, TTFT by arrival, throughput over time, a line per setting

Each setting is a dict of ``wb.load_model`` options (over ``base``): the model is loaded,
driven by ``lab.load_test`` and unloaded before the next, so the settings never share the
machine. A setting may carry ``configure_cache`` (keyword arguments of
``wb.configure_cache``, e.g. another eviction policy or budget), applied before its load:
it replaces the process's cache and stays after the sweep. Each in-process setting sends
its requests under a fresh cache scope, so none starts warm from rows an earlier setting
saved. A setting may also be a target as ``load_test`` takes it (a loaded model's id, or
the URL of an OpenAI-compatible server such as llama-server), measured as it is: the same
client, workload and arrivals for every system.

Ctrl-C stops the setting running (its partial result is kept, ``interrupted``) and the
settings after it are not run.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidOption
from .load import LoadResult, load_test
from .traces import Trace

WHERE = "lab.load_sweep"
CACHE_KEY = "configure_cache"


@dataclass
class SweepResult:
    """``summary`` (one row per setting run), ``requests`` (every request, with its
    ``setting``), ``results`` (label -> LoadResult) and ``interrupted``."""

    summary: Any
    requests: Any
    results: dict[str, LoadResult]
    interrupted: bool = False

    def plot(self, **kw: Any) -> Any:
        """The load test figures with a line (or colour) per setting."""
        from workbench.notebook.load_plots import load_panels

        return load_panels(self.results, **kw)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(f"<SweepResult {len(self.results)} settings"
               + ("; interrupted" if self.interrupted else "") + ">\n")
        p.text(self.summary.to_string())


def load_sweep(settings: Mapping[str, str | Mapping[str, Any]], workload: Trace, *,
               base: Mapping[str, Any] | None = None, **options: Any) -> SweepResult:
    """Run ``lab.load_test(target, workload, **options)`` for each setting in turn (see the
    module doc); ``options`` are load_test's (rate, duration_s, slo, seed, ...)."""
    _check(settings, base, options)
    results: dict[str, LoadResult] = {}
    rows = []
    for label, setting in settings.items():
        result = _run_one(setting, dict(base or {}), workload, options)
        results[label] = result
        rows.append(_row(label, setting, base or {}, result))
        if result.interrupted:
            break
    return SweepResult(_summary(rows), _requests(results), results,
                       any(r.interrupted for r in results.values()))


def _check(settings: Any, base: Any, options: dict[str, Any]) -> None:
    if not isinstance(settings, Mapping) or not settings:
        raise InvalidOption("settings", settings, "a non-empty dict of label -> load options (a dict) or a "
                            "target (a model id or URL)", WHERE)
    for label, setting in settings.items():
        if not isinstance(label, str) or not label:
            raise InvalidOption("settings", label, "labels that are non-empty strings", WHERE)
        if isinstance(setting, str):
            continue
        if not isinstance(setting, Mapping):
            raise InvalidOption(f"settings[{label!r}]", setting, "a dict of wb.load_model options or a target "
                                "(a model id or URL)", WHERE)
        cache = setting.get(CACHE_KEY)
        if cache is not None and not isinstance(cache, Mapping):
            raise InvalidOption(f"settings[{label!r}].{CACHE_KEY}", cache,
                                "a dict of wb.configure_cache arguments", WHERE)
    if base is not None and not isinstance(base, Mapping):
        raise InvalidOption("base", base, "None or a dict of wb.load_model options", WHERE)
    for key in ("cache_scope", "target", "workload"):
        if key in options:
            raise InvalidOption(key, options[key], "not given: load_sweep sets it for each setting", WHERE)


def _run_one(setting: str | Mapping[str, Any], base: dict[str, Any], workload: Trace,
             options: dict[str, Any]) -> LoadResult:
    import workbench as wb

    if isinstance(setting, str):
        url = setting.startswith(("http://", "https://"))
        scope = None if url else _fresh_scope()
        return load_test(setting, workload, cache_scope=scope, **options)
    load = {**base, **{k: v for k, v in setting.items() if k != CACHE_KEY}}
    if setting.get(CACHE_KEY) is not None:
        wb.configure_cache(**setting[CACHE_KEY])
    load.setdefault("model_id", "load-sweep-" + uuid.uuid4().hex[:8])
    model = wb.load_model(**load)
    try:
        return load_test(model, workload, cache_scope=_fresh_scope(), **options)
    finally:
        wb.unload(model)


def _fresh_scope() -> str:
    return "load-sweep-" + uuid.uuid4().hex


def _row(label: str, setting: Any, base: Mapping[str, Any], result: LoadResult) -> dict[str, Any]:
    opts = {"target": setting} if isinstance(setting, str) else {**base, **setting}
    figures = {k: v for k, v in result.summary.items() if k != "slo"}
    return {"setting": label, **{k: v for k, v in opts.items()}, **figures, "interrupted": result.interrupted}


def _summary(rows: list[dict[str, Any]]) -> Any:
    import pandas as pd

    df = pd.DataFrame(rows).set_index("setting")
    for col in df.columns:   # option columns mix types across settings (dicts, strings, None)
        if df[col].dtype == object:
            df[col] = df[col].map(lambda v: v if v is None or isinstance(v, (str, int, float, bool)) else repr(v))
    return df


def _requests(results: Mapping[str, LoadResult]) -> Any:
    import pandas as pd

    parts = [r.requests.reset_index().assign(setting=label) for label, r in results.items()]
    df = pd.concat(parts, ignore_index=True)
    return df.set_index(["setting", "request"])
