"""`%wb cluster ...`: start, look at and stop a cluster of replicas (workbench.cluster).

    %wb cluster start [--replicas N] [--router NAME] [--threads N] [--n-ctx N] [--n-seq-max N]
    %wb cluster status | decisions [--last N] | plot | router NAME | sync [auto|manual] | stop

``sync`` alone makes every replica adopt the rows the others published to the shared
tiers now; ``sync auto`` / ``sync manual`` sets the cluster's cache_sync (docs/cluster.md).

The commands work on the cluster started last in this kernel (``wb.cluster.current()``);
requests go through its Python handle (``c = wb.cluster.current(); c.complete(...)``).
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from workbench.notebook.host import MagicsHost

# each action and what it does (`%wb help` shows one line each, in this order)
ACTIONS: dict[str, str] = {
    "start": "Start replicas of the default model as Ray actors behind a router",
    "status": "The replicas: state, load, requests, cache bytes, hits (a DataFrame)",
    "decisions": "The router's decisions: the replica, why, and the outcome (a DataFrame)",
    "plot": "Requests routed and prompt tokens reused per replica",
    "router": "Route with another router from now on",
    "sync": "Adopt the peers' rows from shared tiers now; auto|manual: set cache_sync",
    "stop": "Stop the cluster's replicas",
}
VALUES = {"router": "NAME", "sync": "[auto|manual]"}  # the value an action takes
FLAGS: dict[str, list[str]] = {}  # action -> the flags that belong to it (filled by _for)


def _for(action: str, flag: str, **kwargs: Any) -> Any:
    """A flag of one action: recorded in FLAGS, its help saying which action it serves."""
    FLAGS.setdefault(action, []).append(flag)
    return argument(flag, help=f"{kwargs.pop('help')} ({action})", **kwargs)


@magic_arguments(name="wb cluster")
@argument("action", choices=list(ACTIONS), help="what to do")
@argument("value", nargs="?", metavar="NAME", help="the router, for 'router'; auto or manual, for 'sync'")
@_for("start", "--replicas", type=int, default=2, metavar="N", help="replicas to start")
@_for("start", "--router", default="cache_affinity", metavar="NAME", help="router")
@_for("start", "--threads", type=int, default=1, metavar="N", help="threads per replica")
@_for("start", "--n-ctx", type=int, metavar="N", help="context tokens per replica")
@_for("start", "--n-seq-max", type=int, metavar="N", help="sequences per replica")
@_for("decisions", "--last", type=int, metavar="N", help="only the last N decisions")
def cluster_command(m: MagicsHost, args: Any) -> Any:
    """Replicas of a model as Ray actors behind a router (docs/cluster.md)."""
    from workbench import cluster as wc
    from workbench.notebook.commands import usage_errors  # commands.py registers this one

    if args.action == "start":
        return _start(wc, args)
    c = wc.current()
    if c is None:
        raise UsageError("no cluster is running: start one with %wb cluster start")
    if args.action == "status":
        return c.replicas()
    if args.action == "decisions":
        df = c.decisions()
        return df if args.last is None else df.tail(max(0, args.last))
    if args.action == "plot":
        return c.plot()
    if args.action == "router":
        if args.value is None:
            raise UsageError("%wb cluster router NAME: one of " + ", ".join(wc.ROUTERS))
        with usage_errors():
            c.set_router(args.value)
        print(f"routing with {args.value!r}")
        return None
    if args.action == "sync":
        if args.value is None:
            return c.sync_cache()
        with usage_errors():
            c.set_cache_sync(args.value)
        print(f"cache_sync {args.value!r}")
        return None
    c.shutdown()
    print("cluster stopped")
    return None


def _start(wc: Any, args: Any) -> None:
    from workbench.notebook.commands import usage_errors

    if wc.current() is not None:
        raise UsageError("a cluster is already running: %wb cluster stop first")
    load = {k: getattr(args, k) for k in ("n_ctx", "n_seq_max") if getattr(args, k) is not None}
    with usage_errors():
        c = wc.start(replicas=args.replicas, router=args.router, threads=args.threads, **load)
    print(f"started {len(c.members)} replicas ({', '.join(m.name for m in c.members)}), router {args.router!r}")
