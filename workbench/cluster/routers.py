"""Routers: small strategies that pick the replica for one request.

A router sees a :class:`RouteRequest` (the prompt, its scope) and one :class:`ReplicaFacts`
per replica that is up, and returns a :class:`Decision` (the replica's index and a reason
the decisions view shows). ``probe = True`` asks the cluster to fill in every replica's
exact ``cached_prefix_len`` (and its engine's queue) first, in parallel.

    round_robin      the next replica in turn
    power_of_two     two replicas drawn at random (seeded), the less loaded one
    least_loaded     the least loaded; ties go to the one routed fewer requests
    cache_affinity   exact probes: the replica holding the longest cached prefix, scored
                     against load and its recent share of requests (CacheAffinity's doc);
                     once the load is imbalanced (busiest > idlest + ``balance_abs`` and
                     > ``balance_rel`` x idlest), least loaded
    prefix_tree      the approximate baseline (SGLang's cache_aware, prefixtree.py):
                     guesses from the prompts it routed before

Load is the requests the cluster has in flight on a replica (running or queued there).
Sessions never reach a router: a session's turns go to the replica that holds it.
A user's router is any object with ``choose(request, replicas) -> Decision`` (``probe``
and ``name`` optional); a plain function works too.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import InvalidOption
from ..options import check_int, check_number
from .prefixtree import PrefixTree


@dataclass(slots=True, frozen=True)
class RouteRequest:
    """What a router sees of a request: its prompt (text or token ids) and cache scope."""

    prompt: str | tuple[int, ...]
    cache_scope: str = "default"

    @property
    def length(self) -> int:
        return len(self.prompt)


@dataclass(slots=True, frozen=True)
class ReplicaFacts:
    """One replica that is up, as a router sees it. The probed fields are None unless the
    router asked for probes."""

    index: int
    name: str
    in_flight: int
    routed: int
    cached_prefix_len: int | None = None
    queue_depth: int | None = None
    pending_len: int | None = None

    @property
    def load(self) -> int:
        return self.in_flight


@dataclass(slots=True, frozen=True)
class Decision:
    replica: int
    reason: str


class Router(Protocol):
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaFacts]) -> Decision: ...


def least_loaded_of(replicas: Sequence[ReplicaFacts]) -> ReplicaFacts:
    """The least loaded replica; ties go to the one routed fewer requests, then the first."""
    return min(replicas, key=lambda r: (r.load, r.routed, r.index))


class RoundRobin:
    name = "round_robin"
    probe = False

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaFacts]) -> Decision:
        ups = sorted(replicas, key=lambda r: r.index)
        pick = next((r for r in ups if r.index >= self._next), ups[0])
        self._next = pick.index + 1
        return Decision(pick.index, "next in turn")


class PowerOfTwo:
    """Two replicas drawn at random, the less loaded wins (Ray Serve's default)."""

    name = "power_of_two"
    probe = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(check_int("seed", seed, 0, None, where="router option"))

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaFacts]) -> Decision:
        pair = self._rng.sample(list(replicas), 2) if len(replicas) > 1 else list(replicas)
        pick = least_loaded_of(pair)
        return Decision(pick.index, f"less loaded of {', '.join(r.name for r in pair)}")


class LeastLoaded:
    name = "least_loaded"
    probe = False

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaFacts]) -> Decision:
        pick = least_loaded_of(replicas)
        return Decision(pick.index, f"least loaded ({pick.load} in flight)")


def imbalanced(replicas: Sequence[ReplicaFacts], balance_abs: int, balance_rel: float) -> bool:
    """The anchors' guard: the busiest has more than ``balance_abs`` requests over the
    idlest and more than ``balance_rel`` times its load."""
    loads = [r.load for r in replicas]
    return max(loads) - min(loads) > balance_abs and max(loads) > balance_rel * min(loads)


class CacheAffinity:
    """Exact prefix probes scored against load and recent share (see the module doc).

    score = prefix/prompt (0 below ``min_match``) - load_weight x in-flight
            - share_weight x (its picks - the fewest picks of a replica) / ``window``
    (picks counted over this router's last ``window`` decisions)

    The share term keeps the spread of requests even when they come one at a time (then
    every in-flight count is 0): a request whose best replica holds little more of it
    than another (a new conversation under a system prompt both hold) goes where fewer
    requests went lately, while a conversation's next turn (most of its prompt cached on
    one replica) stays. It cannot move a popular tenant's new chats off the one replica
    caching its system prompt (they find 85% there, nothing elsewhere), so the spread
    guard: a replica past ``balance_rel`` x its fair share of the window's picks is
    skipped while another is below it (the anchors' 1.5x, on recent picks rather than
    in-flight requests). Once in-flight loads are imbalanced (the anchors' guard), least
    loaded. When no replica caches enough of the prompt (a new prefix, or one evicted
    everywhere), the request costs the same prefill wherever it goes, so that is where
    balance is free: the prompts it routed before (a prefix tree per replica, as the
    approximate router keeps, matched above ``history_threshold``) count only for a
    replica within its fair share (this router's placements there <= their mean over the
    replicas eligible); past it, balance decides.
    """

    name = "cache_affinity"
    probe = True

    def __init__(self, min_match: float = 0.1, load_weight: float = 0.1, share_weight: float = 1.0,
                 window: int = 32, balance_abs: int = 4, balance_rel: float = 1.5, history_threshold: float = 0.3,
                 max_tree_size: int = 1 << 20) -> None:
        where = "router option"
        self.min_match = check_number("min_match", min_match, 0.0, 1.0, where=where)
        self.load_weight = check_number("load_weight", load_weight, 0.0, None, where=where)
        self.share_weight = check_number("share_weight", share_weight, 0.0, None, where=where)
        self.window = check_int("window", window, 1, None, where=where)
        self.balance_abs = check_int("balance_abs", balance_abs, 0, None, where=where)
        self.balance_rel = check_number("balance_rel", balance_rel, 1.0, None, where=where)
        self.history_threshold = check_number("history_threshold", history_threshold, 0.0, 1.0, where=where)
        self.max_tree_size = check_int("max_tree_size", max_tree_size, 1, None, where=where)
        self._recent: collections.deque[int] = collections.deque(maxlen=self.window)
        self._placed: collections.Counter[int] = collections.Counter()  # every pick, per replica
        self._trees: dict[tuple[int, str], PrefixTree] = {}

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaFacts]) -> Decision:
        if imbalanced(replicas, self.balance_abs, self.balance_rel):
            pick = least_loaded_of(replicas)
            return self._chose(pick.index, "load imbalanced: least loaded")
        n = max(1, request.length)
        recent = collections.Counter(self._recent)
        fewest = min(recent[r.index] for r in replicas)

        def match(r: ReplicaFacts) -> float:
            m = (r.cached_prefix_len or 0) / n
            return m if m >= self.min_match else 0.0

        def score(r: ReplicaFacts) -> float:
            excess = (recent[r.index] - fewest) / self.window
            return match(r) - self.load_weight * r.load - self.share_weight * excess

        eligible = self._within_cap(replicas, recent)
        best = max(eligible, key=lambda r: (score(r), -r.load, -recent[r.index], -r.index))
        if match(best) == 0.0:
            index, reason = self._unmatched(request, eligible, score)
        else:
            index, reason = best.index, f"{best.cached_prefix_len} of {request.length} tokens cached"
            top = max(replicas, key=match)
            if match(top) > match(best):
                reason += f" (balance over {top.cached_prefix_len} on {top.name})"
        if len(eligible) < len(replicas):
            skipped = ", ".join(r.name for r in replicas if r not in eligible)
            reason += f"; skipped {skipped}: past {self.balance_rel:g}x a fair share of the last {len(self._recent)}"
        return self._chose(index, reason, request)

    def _within_cap(self, replicas: Sequence[ReplicaFacts], recent: collections.Counter[int]) -> list[ReplicaFacts]:
        """The spread guard: once the window holds 2 picks per replica, one past
        ``balance_rel`` x the mean of its picks takes no request while another is below it."""
        mean = len(self._recent) / len(replicas)
        ok = [r for r in replicas if recent[r.index] < self.balance_rel * mean]
        return ok if mean >= 2 and ok else list(replicas)

    def _unmatched(self, request: RouteRequest, replicas: Sequence[ReplicaFacts],
                   score: Callable[[ReplicaFacts], float]) -> tuple[int, str]:
        """Nothing worth reusing is cached anywhere (new, or evicted): go where this prefix
        was sent before, if it was and that replica is within its fair share (the history
        keeps a tenant's prompts on one replica, so a cache under pressure is not split
        between tenants; a replica past its share would keep every tenant it ever held),
        else balance."""
        n = max(1, request.length)
        fair = sum(self._placed[r.index] for r in replicas) / len(replicas)
        seen = {r.index: self._history(r.index, request).match(request.prompt) / n for r in replicas}
        held = {i for i, m in seen.items() if m > self.history_threshold}
        within = {r.index for r in replicas if r.index in held and self._placed[r.index] <= fair}

        def history_score(r: ReplicaFacts) -> float:
            return (seen[r.index] if r.index in within else 0.0) + score(r)

        best = max(replicas, key=lambda r: (history_score(r), -r.load, -r.index))
        if best.index in within:
            return best.index, f"nothing cached; sent here before ({seen[best.index]:.0%})"
        if held - within:
            names = ", ".join(r.name for r in replicas if r.index in held - within)
            return best.index, f"nothing cached; sent before to {names}, past its share: balance"
        return best.index, f"no prefix >= {self.min_match:.0%} cached: balance"

    def _history(self, index: int, request: RouteRequest) -> PrefixTree:
        return self._trees.setdefault((index, request.cache_scope), PrefixTree(self.max_tree_size))

    def _chose(self, index: int, reason: str, request: RouteRequest | None = None) -> Decision:
        self._recent.append(index)
        self._placed[index] += 1
        if request is not None:
            self._history(index, request).insert(request.prompt)
        return Decision(index, reason)


class PrefixTreeRouter:
    """The approximate baseline: a prefix tree per replica of the prompts routed there
    (SGLang's cache_aware policy; Ray Serve's PrefixCacheAffinityRouter is alike). Above
    ``cache_threshold`` matched, the replica with the longest match; else the one with the
    smallest tree (the most room); least loaded once imbalanced. It cannot see evictions,
    restarts, or rows shared through a tier, which the exact probes can."""

    name = "prefix_tree"
    probe = False

    def __init__(self, cache_threshold: float = 0.3, balance_abs: int = 4, balance_rel: float = 1.5,
                 max_tree_size: int = 1 << 20) -> None:
        where = "router option"
        self.cache_threshold = check_number("cache_threshold", cache_threshold, 0.0, 1.0, where=where)
        self.balance_abs = check_int("balance_abs", balance_abs, 0, None, where=where)
        self.balance_rel = check_number("balance_rel", balance_rel, 1.0, None, where=where)
        self.max_tree_size = check_int("max_tree_size", max_tree_size, 1, None, where=where)
        self._trees: dict[tuple[int, str], PrefixTree] = {}

    def _tree(self, index: int, scope: str) -> PrefixTree:
        return self._trees.setdefault((index, scope), PrefixTree(self.max_tree_size))

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaFacts]) -> Decision:
        if imbalanced(replicas, self.balance_abs, self.balance_rel):
            pick, reason = least_loaded_of(replicas), "load imbalanced: least loaded"
        else:
            matches = {r.index: self._tree(r.index, request.cache_scope).match(request.prompt) for r in replicas}
            best = max(replicas, key=lambda r: (matches[r.index], -r.load, -r.index))
            rate = matches[best.index] / max(1, request.length)
            if rate > self.cache_threshold:
                pick, reason = best, f"tree match {rate:.0%}"
            else:
                pick = min(replicas, key=lambda r: (self._tree(r.index, request.cache_scope).size, r.load, r.index))
                reason = f"tree match {rate:.0%} <= {self.cache_threshold:.0%}: smallest tree"
        self._tree(pick.index, request.cache_scope).insert(request.prompt)
        return Decision(pick.index, reason)


class FunctionRouter:
    """A plain function ``f(request, replicas) -> Decision | int`` as a router."""

    probe = True

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = function_name(fn)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaFacts]) -> Decision:
        out = self.fn(request, replicas)
        return out if isinstance(out, Decision) else Decision(out, f"chosen by {self.name}")


def function_name(fn: Callable[..., Any]) -> str:
    """What the decisions call a function router: its name; for a lambda, its source
    ("lambda request, replicas: 0") where Python can find it, else "lambda"; for another
    callable, its class's name."""
    name = getattr(fn, "__name__", None)
    if name is None:
        return type(fn).__name__
    if name != "<lambda>":
        return str(name)
    return _lambda_source(fn) or "lambda"


def _lambda_source(fn: Callable[..., Any]) -> str | None:
    """The text of the one lambda expression on the lines that define ``fn`` (a cell's
    lines too: IPython keeps them for inspect), or None."""
    import ast
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    tree = None
    for end in range(len(source), 0, -1):  # a lambda inside a longer statement: its first lines may parse
        try:
            tree = ast.parse(source[:end])
            break
        except SyntaxError:
            if end < len(source) - 400:
                return None
    if tree is None:
        return None
    code = getattr(fn, "__code__", None)
    argnames = list(code.co_varnames[:code.co_argcount]) if code is not None else None
    found = [node for node in ast.walk(tree) if isinstance(node, ast.Lambda)
             and (argnames is None or [a.arg for a in node.args.args] == argnames)]
    outer = [n for n in found if not any(n is not o and n in ast.walk(o) for o in found)]
    if len(outer) != 1:
        return None
    text = ast.get_source_segment(source, outer[0])
    return " ".join(text.split()) if text else None


ROUTERS: dict[str, Callable[..., Any]] = {
    "round_robin": RoundRobin, "power_of_two": PowerOfTwo, "least_loaded": LeastLoaded,
    "cache_affinity": CacheAffinity, "prefix_tree": PrefixTreeRouter,
}


def make_router(router: Any, options: dict[str, Any] | None = None) -> Any:
    """A router from a name (with ``options``, its parameters), a router object, or a function."""
    if isinstance(router, str):
        if router not in ROUTERS:
            raise InvalidOption("router", router, "one of " + ", ".join(map(repr, ROUTERS))
                                + ", an object with choose(request, replicas), or a function")
        try:
            return ROUTERS[router](**(options or {}))
        except TypeError as e:
            raise InvalidOption("router_options", options, f"the parameters of {router!r} ({e})") from None
    if options:
        raise InvalidOption("router_options", options, "no options for a router object (configure it yourself)")
    choose = getattr(router, "choose", None) if not isinstance(router, type) else None
    if callable(choose):
        return router
    if callable(router) and not isinstance(router, type):
        return FunctionRouter(router)
    raise InvalidOption("router", router, "a router name, an object with choose(request, replicas), or a function")


def router_name(router: Any) -> str:
    return str(getattr(router, "name", type(router).__name__))
