"""Starting a cluster: Ray (local, or an existing one at ``address``) and the replica actors.

Everything the caller passes is checked here, before Ray or an actor sees it: the load
options against LoadConfig (the same rules as load_model), the cluster's own options with
the shared check_* rules. A replica that cannot load its model answers its first call
with the load's own error (ModelFileError, InvalidOption, ...), raised here; one that
does not come up in ``ready_timeout_s`` (e.g. the cluster has too few CPUs) is a
ReplicaDown naming it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ray

from ..errors import InvalidOption, ReplicaDown
from ..models import check_model_file
from ..options import LoadConfig, build, check_int, check_number
from .members import ACTOR_GONE, Member
from ..options.rules import one_of
from .replica import CACHE_OPTIONS, CACHE_SYNCS, Replica, check_cache_options
from .wire import unpack_error

WHERE = "cluster option"
# A local Ray's raylet exits when its agent has not registered within this; Ray's 30 s
# default was too short here on a loaded 2-core machine (load 12+: start failed)
AGENT_REGISTER_TIMEOUT_MS = 120_000
# A local Ray's workers (the replicas) run at this niceness. Ray's default, 15, gives them
# about 1/28 of a core's share beside any process at the default 0: with two busy processes
# on this 2-core machine a replica's 180-token prefill took 39-44 s (decode steps past a
# 30 s budget) where it takes 1.3 s alone. 0: the replicas compete as the notebook does.
WORKER_NICENESS = 0
# the address a local Ray's node advertises and its services listen on, unless the caller
# names another: loopback, so nothing beyond this machine reaches them
LOCAL_NODE_IP = "127.0.0.1"


class _ReplicaActor(Replica):
    """Replica, keeping its load error for the first call instead of dying in __init__
    (a crash there would be retried by Ray and reach the caller as an untyped error)."""

    def __init__(self, name: str, load: Mapping[str, Any], cache_tiers: Sequence[Mapping[str, Any]] | None,
                 cache_sync: str) -> None:
        self.init_error: Any = None
        try:
            super().__init__(name, load, cache_tiers, cache_sync)
        except Exception as e:
            from .wire import pack_error

            self.init_error = pack_error(e)

    def hello(self) -> dict[str, Any]:
        if self.init_error is not None:
            return {"error": self.init_error}
        return super().hello()


def check_options(replicas: Any, threads: Any, max_restarts: Any, num_cpus: Any, address: Any,
                  ready_timeout_s: Any, cache_tiers: Any, cache_sync: Any = "auto",
                  node_ip_address: Any = None) -> None:
    check_int("replicas", replicas, 1, 64, where=WHERE)
    check_int("threads", threads, 1, 512, where=WHERE)
    check_int("max_restarts", max_restarts, -1, 1000, where=WHERE)
    check_int("num_cpus", num_cpus, 1, 4096, none_ok=True, where=WHERE)
    check_number("ready_timeout_s", ready_timeout_s, 1.0, 3600.0, where=WHERE)
    if address is not None and (not isinstance(address, str) or not address):
        raise InvalidOption("address", address, "a Ray cluster address ('auto', 'ray://host:port', ...) or None",
                            WHERE)
    if cache_tiers is not None and (isinstance(cache_tiers, (str, bytes, Mapping))
                                    or not isinstance(cache_tiers, Sequence)
                                    or not all(isinstance(t, Mapping) for t in cache_tiers) or not cache_tiers):
        raise InvalidOption("cache_tiers", cache_tiers, "a non-empty list of tier dicts (as configure_cache takes)",
                            WHERE)
    one_of(*CACHE_SYNCS)("cache_sync", cache_sync, WHERE)
    check_node_ip_address(node_ip_address, address)


def check_node_ip_address(value: Any, address: Any) -> None:
    if value is None:
        return
    if address is not None:
        raise InvalidOption("node_ip_address", value, "None when address= is given (a running Ray keeps its own "
                            "addresses; node_ip_address is for the local Ray start starts)", WHERE)
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        ipaddress.ip_address(value)
    except ValueError:
        raise InvalidOption("node_ip_address", value, f"an IP address of this machine as a string: "
                            f"{LOCAL_NODE_IP!r} (the default, this machine only) or its network address",
                            WHERE) from None


def load_options(model: Any, threads: int, load: Mapping[str, Any], local: bool) -> dict[str, Any]:
    """The load_model options every replica gets (checked here as load_model checks them;
    on a local Ray the model file too), with the cache options ``storage`` and
    ``chunk_size`` (configure_cache's; each replica configures its cache with them)."""
    if "n_threads" in load or "model_path" in load:
        key = "n_threads" if "n_threads" in load else "model_path"
        raise InvalidOption(key, load[key], f"no {key} in a cluster's load options: pass "
                            + ("threads=" if key == "n_threads" else "model="), WHERE)
    opts = dict(load, model_path=model, n_threads=threads)
    check_cache_options(opts, WHERE)
    build(LoadConfig, {k: v for k, v in opts.items() if k not in CACHE_OPTIONS}, "config")
    if local and model is not None:
        opts["model_path"] = str(check_model_file(model))
    return opts


def init_ray(address: str | None, num_cpus: int, node_ip_address: str | None = None) -> bool:
    """Connect to Ray, or start a local one on ``node_ip_address`` (default loopback:
    its node advertises 127.0.0.1 and its services are not offered to the network);
    True when it was started here."""
    if ray.is_initialized():
        return False
    # Ray's own start-up lines (and warnings about its settings) stay out of the caller's
    # output; its errors still show
    if address is not None:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        return False
    node_ip = node_ip_address or LOCAL_NODE_IP
    with _loopback_allowed(node_ip):
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR, _node_ip_address=node_ip,
                 _system_config={"agent_register_timeout_ms": AGENT_REGISTER_TIMEOUT_MS,
                                 "worker_niceness": WORKER_NICENESS})
    got = ray.util.get_node_ip_address()
    if got != node_ip:  # never served on an address the caller did not ask for
        ray.shutdown()
        raise InvalidOption("node_ip_address", node_ip, f"an address Ray {ray.__version__} starts its node "
                            f"on ({node_ip!r} asked, {got!r} given: that Ray was stopped)", WHERE)
    return True


@contextlib.contextmanager
def _loopback_allowed(node_ip: str) -> Iterator[None]:
    """On Linux Ray replaces a loopback node address by the machine's network address
    (``services.resolve_ip_for_localhost``) unless clusters are off, its mode on macOS and
    Windows (``ray_constants.ENABLE_RAY_CLUSTER``, read from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
    when ray is imported, too early to set here): off while ``ray.init`` runs. Its
    processes then advertise and listen on loopback only."""
    from ray._private import ray_constants

    if not ipaddress.ip_address(node_ip).is_loopback or not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def start_members(replicas: int, threads: int, max_restarts: int, load: dict[str, Any],
                  cache_tiers: Sequence[Mapping[str, Any]] | None, ready_timeout_s: float,
                  cache_sync: str = "auto") -> list[Member]:
    remote: Any = ray.remote(_ReplicaActor).options(num_cpus=threads, max_restarts=max_restarts, max_task_retries=0,
                                               max_concurrency=64)
    base = load.get("model_id") or "replica"
    names = [f"{base}-{i}" for i in range(replicas)]
    actors: list[Any] = [remote.remote(name, dict(load, model_id=name), cache_tiers, cache_sync) for name in names]
    hellos = [a.hello.remote() for a in actors]
    ready, _ = ray.wait(hellos, num_returns=len(hellos), timeout=ready_timeout_s)
    try:
        members = [_member(i, names[i], actors[i], hellos[i], hellos[i] in ready, ready_timeout_s)
                   for i in range(replicas)]
    except BaseException:
        for a in actors:
            ray.kill(a, no_restart=True)
        raise
    return members


def _member(i: int, name: str, actor: Any, hello_ref: Any, ready: bool, timeout: float) -> Member:
    if not ready:
        cpus = ray.cluster_resources().get("CPU", 0)
        raise ReplicaDown(name, f"did not start within {timeout:.0f} s (the Ray cluster has {cpus:g} CPUs)")
    try:
        hello = ray.get(hello_ref)
    except ACTOR_GONE as e:
        raise ReplicaDown(name, f"died while starting ({type(e).__name__}: {e})") from None
    if "error" in hello:
        raise unpack_error(hello["error"])
    return Member(i, name, actor, hello)
