"""The offline optimum of the eviction lab: Belady's rule, `policy='belady'` in `lab.replay`
(labelled "optimal"). Lab only: it reads the trace's future, which a real cache cannot know
(`workbench.cache.policies.get_policy` does not know the name).

    rank    among the units the cache may evict now (the chunk model: leaves, not held by
            the put making room; protected ones only when nothing else may go), the one
            never used again goes first, then the one whose next use is farthest; ties
            to the deeper chunk (the longer row), then to the one ranked longest ago
    unit    a chunk (the chunk model, `plan.chunks`) or a row (whole rows: chunk_size=None)

Next use. A unit is *used* by request j when j's lookup reads it in an unbounded replay of
the same plan (`run_plan` with a budget nothing exceeds, so nothing is ever evicted): the
cache's own lookup rules (chunksim.py, simcache.py), against everything the requests before
j saved. `FutureUses.of(plan)` records, per unit, the sorted requests that read it; the next
use after request i is the first of them > i (a bisection). So, for whole rows, a row is
used by the requests whose longest cached prefix it is (a shorter row under it is not used
by them, though it would serve them were the longer one gone); for chunks, by the requests
whose lookup reads it: every chunk of the prompt's stored chain and the chunk the lookup
resumes into (a finish row's tail the next turn's prompt extends, a covering chunk, the
sibling agreeing longest), but not a tail or a row a longer stored one supersedes. (The
prompt's chain alone would miss the reads outside it: 3.7% of them on 5,000 chats, about
one a request, the tail each next turn resumes into.) Lookups read a chain from its first
chunk, so a chunk's parent is read whenever it is: its next use is never later than its
children's, and with ties to the deeper chunk the farthest unit is a leaf.

The clock is the request index, told by run_plan's `on_request(i, now)` before request i's
lookup; evictions during request i (its saves, after its lookup) rank by the first use
after i, so a unit that request i saves and reads again is not kept for request i. A unit
is ranked again on its own insert and hit. Is a stored unit always read at its predicted
use, so that its rank stays right until its next event? For whole rows, yes: the predicted
row, when stored, is the longest stored prefix. For chunks, not always: a replay with a
finite budget is not the unbounded one, and where two stored chunks agree equally long with
the prompt (`ChunkSimCache._pick`) the tie goes to the one used last, which may be the
other one there; a tail the finite cache wrote again (its covering chunk evicted), which the
unbounded one absorbed long ago, may compete too. Such a unit's recorded next use would lie
in the past and rank it as needed at once. So the policy chooses its victims itself
(`victim`: the lab's 'victim' ranking mode, as S3-FIFO) from a lazy heap of its own and,
before choosing, ranks again every unit whose recorded next use is the current request or
earlier (the 'event' mode could not: the cache's heap is pushed only on a unit's own
events). Every rank is then the exact next use after the current request. (`reranked`
counts these: 0 on the lab's chats, agents and rag at every budget tried.)

Where it is not exactly optimal (it is the bound the tables measure against, not a proven
one): units differ in size (tails are short, rows whole) and in what a use saves, and
Belady's rule ignores both; the chunk model evicts only leaves, a row's chunks are held
while it is saved, and protected (pinned) units go last; what is saved, and when, is fixed
by the engine's rules, not chosen; a use is the unbounded replay's read, so a shorter row
or a partly agreeing chunk that would serve a request once the longer one is gone is not
planned for.

Cost (10,000 requests of `multi_turn_chats`): one unbounded replay per `lab.replay` call,
shared by its budgets (chunks: 14 s, against 4 s for one lru replay at 1 GiB, since every
chunk stays and lookups scan more siblings; 172 MB at its peak; whole rows: 3 s), then per
unit a sorted array of the requests that read it (chunks: 265,507 reads of 50,641 chunks
and every chunk's depth, 9 MB); ranking is O(log units) per insert, hit and eviction, and a
replay under it takes 1.3 to 1.8 times as long as under lru.
"""

from __future__ import annotations

import array
import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.cache.types import RowStats
from workbench.lab.plan import Plan, run_plan

__all__ = ["NAMES", "Belady", "FutureUses", "is_belady"]

NAMES = ("belady", "optimal")   # what `lab.replay` accepts for it
LABEL = "optimal"               # its name in the lab's tables and plots
UNBOUNDED = 1 << 62             # a budget nothing exceeds: the replay that defines "use"


def _never(key: str) -> bool:
    return False


@dataclass(slots=True)
class FutureUses:
    """Which requests read each unit (chunk or row key) in an unbounded replay of a plan."""

    requests: int                                      # the plan's number of requests
    uses: dict[str, array.array]                       # key -> the requests reading it, ascending
    depth: dict[str, int] = field(default_factory=dict)  # chunk key -> chunks before it (chunk model)

    @classmethod
    def of(cls, plan: Plan) -> FutureUses:
        """Replay `plan` with an unbounded budget and record every read."""
        rec = _Recorder()
        run_plan(plan, rec, UNBOUNDED, 1)
        uses = {k: array.array("i", v) for k, v in rec.uses.items()}
        depth: dict[str, int] = {}
        if plan.chunks is not None:
            parent = plan.chunks.parent
            for key in parent:
                path = []
                k: str | None = key
                while k is not None and k not in depth:
                    path.append(k)
                    k = parent[k]
                d = -1 if k is None else depth[k]
                for k2 in reversed(path):
                    d += 1
                    depth[k2] = d
        return cls(len(plan.prompts), uses, depth)

    def next_use(self, key: str, after: int) -> int:
        """The first request > `after` that reads `key`; `requests` when none does."""
        got = self.uses.get(key)
        if got is None:
            return self.requests
        k = bisect.bisect_right(got, after)
        return got[k] if k < len(got) else self.requests

    def reads(self) -> int:
        """Recorded (request, unit) reads in all."""
        return sum(len(v) for v in self.uses.values())


class _Recorder:
    """A policy that only records which unit each request reads (the lab's 'event' mode;
    with an unbounded budget it never ranks anything)."""

    name = "recorder"
    time_invariant = True

    def __init__(self) -> None:
        self.i = -1
        self.uses: dict[str, list[int]] = {}

    def on_request(self, i: int, now: float) -> None:
        self.i = i

    def on_hit(self, row: RowStats) -> None:
        got = self.uses.setdefault(row.key, [])
        if not got or got[-1] != self.i:
            got.append(self.i)

    def priority(self, row: RowStats, now: float) -> float:
        return 0.0


class Belady:
    """Belady's rule over one replay of the plan `future` was made from (see the module
    doc). Give each replay its own instance: it keeps the replay's state."""

    name = LABEL

    def __init__(self, future: FutureUses | Plan) -> None:
        self.future = future if isinstance(future, FutureUses) else FutureUses.of(future)
        self.i = -1                                   # the current request
        self._next: dict[str, int] = {}               # tracked unit -> its next use after its ranking
        self._depth: dict[str, int] = {}
        self._ver: dict[str, int] = {}                # tracked unit -> its live heap entry
        self._heap: list[tuple[int, int, int, str]] = []   # (-next use, -depth, version, key)
        self._due: dict[int, list[str]] = {}          # request -> units whose next use it is
        self._due_from = 0                            # requests before this one are ranked again
        self._count = 0
        self.reranked = 0                             # units ranked again: a predicted read did not happen

    def __deepcopy__(self, memo: dict[int, object]) -> Belady:
        """A fresh policy over the same (read-only) future."""
        return Belady(self.future)

    # -- the lab's clock and the cache's hooks -----------------------------------------------
    def on_request(self, i: int, now: float) -> None:
        self.i = i

    def on_insert(self, row: RowStats) -> None:
        self._depth[row.key] = self.future.depth.get(row.key, row.n_tokens)
        self._rank(row.key)

    def on_hit(self, row: RowStats) -> None:
        if row.key in self._next:
            self._rank(row.key)

    def on_remove(self, row: RowStats) -> None:
        self._forget(row.key)

    def priority(self, row: RowStats, now: float) -> float:
        """-(next use) (never used again: -(requests)); for display: `victim` decides."""
        return -float(self._next.get(row.key, self.future.requests))

    def victim(self, is_blocked: Callable[[str], bool] = _never) -> str | None:
        """The unit with the farthest next use that `is_blocked` allows (it stops being
        tracked); None when every unit is blocked."""
        self._catch_up()
        heap, ver = self._heap, self._ver
        aside: list[tuple[int, int, int, str]] = []
        found = None
        while heap:
            entry = heapq.heappop(heap)
            key = entry[3]
            if ver.get(key) != entry[2]:
                continue   # stale: ranked again since
            if is_blocked(key):
                aside.append(entry)
                continue
            found = key
            break
        for entry in aside:   # pushed back one by one: a heapify of the whole heap costs O(units)
            heapq.heappush(heap, entry)
        if found is not None:
            self._forget(found)
        return found

    def __len__(self) -> int:
        return len(self._next)

    # -- ranking -------------------------------------------------------------------------------
    def _rank(self, key: str) -> None:
        nxt = self.future.next_use(key, self.i)
        self._next[key] = nxt
        self._count += 1
        self._ver[key] = self._count
        heapq.heappush(self._heap, (-nxt, -self._depth[key], self._count, key))
        if nxt < self.future.requests:
            self._due.setdefault(nxt, []).append(key)
        if len(self._heap) > 4 * len(self._next) + 1024:
            self._compact()

    def _catch_up(self) -> None:
        """Rank again every unit whose recorded next use is the current request or earlier
        (it was not read then, or it would have been ranked again on that hit)."""
        nxt = self._next
        while self._due_from <= self.i:
            j = self._due_from
            for key in self._due.pop(j, ()):
                if nxt.get(key) == j:
                    self.reranked += 1
                    self._rank(key)
            self._due_from += 1

    def _forget(self, key: str) -> None:
        self._next.pop(key, None)
        self._ver.pop(key, None)
        self._depth.pop(key, None)

    def _compact(self) -> None:
        ver = self._ver
        self._heap = [e for e in self._heap if ver.get(e[3]) == e[2]]
        heapq.heapify(self._heap)


def is_belady(spec: object) -> bool:
    """Does a `lab.replay` policy spec ask for the offline optimum ('belady', 'optimal', the
    class or an instance)?"""
    if isinstance(spec, str):
        return spec.lower() in NAMES
    return spec is Belady or isinstance(spec, Belady)
