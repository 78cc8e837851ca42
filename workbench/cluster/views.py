"""The cluster's views: replicas and routing decisions as DataFrames, and a plot of them.

    replicas_frame   one row per replica: state, restarts, load, requests routed, cache
                     bytes by tier (bytes_<tier>), hits by kind (hits_<kind>), misses,
                     the cache_sync mode and the rows adopted from peers (peer_rows)
    decisions_frame  one row per routed request: the chosen replica and why, each
                     replica's probed prefix and load (prefix[<name>], load[<name>]), and
                     what came of it (hit kind, tokens reused, TTFT)
    plot_routing     requests and reused prompt tokens per replica (matplotlib Figure)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import Cluster


def _facts(cluster: Cluster) -> dict[str, dict[str, Any]]:
    import ray

    from .members import ACTOR_GONE

    out: dict[str, dict[str, Any]] = {}
    ups = cluster.routing.up()
    refs = [m.actor.facts.remote() for m in ups]
    for m, ref in zip(ups, refs):
        try:
            out[m.name] = ray.get(ref)
        except ACTOR_GONE as e:
            m.mark_down(e)
    return out


def replicas_frame(cluster: Cluster) -> Any:
    import pandas as pd

    facts = _facts(cluster)
    rows = []
    for m in cluster.members:
        row = m.row()
        f = facts.get(m.name)
        if f is not None:
            row.update(queue_depth=f["queue_depth"], pending_len=f["pending_len"], cache_sync=f["cache_sync"],
                       peer_rows=f["peer_rows"])
            row.update({f"bytes_{t}": n for t, n in f["tiers"].items()})
            c = f["counters"]
            row.update({k.removeprefix("cache_"): v for k, v in c.items()
                        if k.startswith(("cache_hits_", "cache_misses_"))})
        rows.append(row)
    return _table(pd.DataFrame(rows).set_index("replica"))


def _table(df: Any) -> Any:
    """A frame marked to show with the notebook's display format (the figures keep their values)."""
    from workbench.notebook.display import table

    return table(df)


def decisions_frame(cluster: Cluster) -> Any:
    import pandas as pd

    rows = []
    names = [m.name for m in cluster.members]
    for rec in list(cluster.routing.log):
        row = {k: rec[k] for k in ("ref", "kind", "session", "router", "replica", "reason")}
        for name in names:
            prefix, load = rec["probed"].get(name, (None, None))
            row[f"prefix[{name}]"], row[f"load[{name}]"] = prefix, load
        out = rec["outcome"] or {}
        row.update(hit=out.get("hit"), prompt_tokens=out.get("prompt_tokens"),
                   reused_tokens=out.get("reused_tokens"), ttft_s=out.get("ttft_s"), error=out.get("error"))
        rows.append(row)
    columns = ["ref", "kind", "session", "router", "replica", "reason"]
    return _table(pd.DataFrame(rows, columns=None if rows else columns))


def plot_routing(cluster: Cluster) -> Any:
    """Requests routed and prompt tokens reused per replica, side by side (a Figure that
    shows itself in IPython, built without pyplot)."""
    from matplotlib.ticker import MaxNLocator

    from workbench.notebook.figure import Figure

    df = decisions_frame(cluster)
    names = [m.name for m in cluster.members]
    fig = Figure(figsize=(8, 3), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    counts = [int((df["replica"] == n).sum()) if len(df) else 0 for n in names]
    reused = [int(df.loc[df["replica"] == n, "reused_tokens"].fillna(0).sum()) if len(df) else 0 for n in names]
    ax1.bar(names, counts, color="#4c72b0")
    ax1.set_title("requests routed")
    ax1.set_ylabel("requests")
    ax2.bar(names, reused, color="#55a868")
    ax2.set_title("prompt tokens reused from cache")
    ax2.set_ylabel("prompt tokens")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelrotation=0)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("replica")
    fig.suptitle(f"router: {df['router'].iloc[-1] if len(df) else '-'}")
    return fig
