"""`%wb cluster ...`: start, look at and stop a cluster of replicas (workbench.cluster).

    %wb cluster start [--replicas N] [--router NAME] [--threads N] [--n-ctx N] [--n-seq-max N]
    %wb cluster status | decisions [--last N] | plot | router NAME | sync [auto|manual] | stop

``sync`` alone makes every replica adopt the rows the others published to the shared
tiers now; ``sync auto`` / ``sync manual`` sets the cluster's cache_sync (docs/cluster.md).

The commands work on the cluster started last in this kernel (``wb.cluster.current()``);
requests go through its Python handle (``c = wb.cluster.current(); c.complete(...)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

if TYPE_CHECKING:
    from workbench.notebook.magics import WorkbenchMagics

ACTIONS = ("start", "status", "decisions", "plot", "router", "sync", "stop")


@magic_arguments(name="wb cluster")
@argument("action", choices=ACTIONS, help="what to do")
@argument("value", nargs="?", metavar="NAME", help="the router, for 'router'; auto or manual, for 'sync'")
@argument("--replicas", type=int, default=2, metavar="N", help="replicas to start (start)")
@argument("--router", default="cache_affinity", metavar="NAME", help="router (start)")
@argument("--threads", type=int, default=1, metavar="N", help="threads per replica (start)")
@argument("--n-ctx", type=int, metavar="N", help="context tokens per replica (start)")
@argument("--n-seq-max", type=int, metavar="N", help="sequences per replica (start)")
@argument("--last", type=int, metavar="N", help="only the last N decisions (decisions)")
def cluster_command(m: WorkbenchMagics, args: Any) -> Any:
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
