"""Parent side of the fuzzer: a long-lived worker child, restarted when a case kills it.

One process per example would cost a Python start-up and a model load each (~1 s): too slow
for thousands of cases on 2 cores. Instead one worker (tests/fuzz/worker.py) loads the
default model once and runs cases sent over a pipe. For each case the parent waits for the
answer while watching the child:

- the child exits (a signal: SIGABRT from a GGML_ASSERT, SIGSEGV from a stack overflow) ->
  ``Verdict('crash')`` with the signal, the case and the tail of the child's stderr;
- no answer within the case's timeout -> the child is killed, ``Verdict('hang')``;
- its RSS grows past ``WORKBENCH_FUZZ_RSS_MB`` (default 3072) -> killed, ``Verdict('memory')``
  (runaway loops in llama.cpp allocate hundreds of MB a second);
- an answer: ``ok``, a ``WorkbenchError`` subclass, or ``wrong_type`` (any other exception),
  plus the worker's health facts (sequences leaked, baseline reply).

The next case starts a fresh worker. Every verdict is tallied per family for the summary
that `make fuzz` prints (and tests/fuzz/conftest.py writes to build/fuzz-report.json).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

WORKER = Path(__file__).with_name("worker.py")
REPO = Path(__file__).resolve().parents[2]
RSS_LIMIT = int(os.environ.get("WORKBENCH_FUZZ_RSS_MB", "3072")) << 20
START_TIMEOUT_S = 180.0


@dataclass
class Verdict:
    kind: str  # ok | workbench | wrong_type | crash | hang | memory
    case: dict
    answer: dict = field(default_factory=dict)
    signal: str = ""
    log: str = ""
    seconds: float = 0.0
    family: str = ""

    @property
    def error_type(self) -> str:
        return self.answer.get("error_type", "")

    @property
    def facts(self) -> dict:
        return self.answer.get("facts", {})

    @property
    def health(self) -> dict:
        return self.answer.get("health", {})

    def explain(self) -> str:
        case = _short(repr(self.case), 3000)
        if self.kind == "crash":
            return f"the worker died ({self.signal}) on case {case}\n--- its stderr ---\n{self.log}"
        if self.kind in ("hang", "memory"):
            return f"the worker {self.kind} ({self.signal}) on case {case}\n--- its stderr ---\n{self.log}"
        if self.kind == "wrong_type":
            return (f"{self.error_type} (not a WorkbenchError) on case {case}: {self.answer.get('message')}\n"
                    f"{self.answer.get('where', '')}")
        return f"{self.kind} on case {case}: {self.answer}"

    def assert_survived(self) -> None:
        """The standard: the process lives, answers in time, and raises only WorkbenchErrors."""
        assert self.kind in ("ok", "workbench"), self.explain()
        h = self.health
        assert h.get("leaked_seqs", 0) == 0 and h.get("busy", 0) == 0, f"sequences leaked after {self.explain()}"
        assert h.get("baseline_ok", True), f"the baseline reply changed after {self.explain()}"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n // 2] + f" ...[{len(text) - n} chars]... " + text[-n // 2:]


def _signal_name(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


class Worker:
    """The worker child and the tallies of every case it ran."""

    def __init__(self, rss_limit: int = RSS_LIMIT) -> None:
        self.rss_limit = rss_limit
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="wb-fuzz-worker-", suffix=".log")[1])
        self.starts = 0
        self.tally: dict[str, Counter] = defaultdict(Counter)
        self.errors: dict[str, Counter] = defaultdict(Counter)
        self.seconds: Counter = Counter()
        self.cpu: Counter = Counter()  # the worker's CPU seconds per family (robust to a busy machine)
        self.findings: list[Verdict] = []
        self.info: dict = {}

    # -- process ----------------------------------------------------------------------------
    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "PYTHONFAULTHANDLER": "1"}
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env, cwd=REPO)
        self.starts += 1
        ready = self._read(START_TIMEOUT_S)
        if not isinstance(ready, dict) or not ready.get("ready"):
            rc = self.stop()
            raise RuntimeError(f"the fuzz worker did not start ({_signal_name(rc)}): "
                               f"{ready.get('error') if isinstance(ready, dict) else ready}\n{self.log_tail(0)}")
        self.info = ready

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        return self._reap()

    def _kill(self) -> int | None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        return self._reap()

    def _reap(self) -> int | None:
        """The ended worker's exit status; its pipes and log closed."""
        assert self.proc is not None
        rc = self.proc.returncode
        self.proc.stdout.close()
        self._log.close()
        self.proc = None
        return rc

    def log_tail(self, since: int, n: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text[-n:]

    # -- frames -----------------------------------------------------------------------------
    def _read_exact(self, n: int, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        buf = b""
        ps = psutil.Process(self.proc.pid)
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(left, 0.1))
            if not ready:
                try:
                    if ps.memory_info().rss > self.rss_limit:
                        raise MemoryError
                except psutil.NoSuchProcess:
                    pass
                continue
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def _read(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        head = self._read_exact(4, deadline)
        if head is None:
            return None
        body = self._read_exact(struct.unpack("<I", head)[0], deadline)
        return None if body is None else pickle.loads(body)

    # -- cases ------------------------------------------------------------------------------
    def run(self, family: str, case: dict, timeout: float = 30.0) -> Verdict:
        if not self.alive():
            if self.proc is not None:
                self.stop()
            self.start()
        since = self.log_path.stat().st_size
        try:
            ps = psutil.Process(self.proc.pid)
            cpu0 = sum(ps.cpu_times()[:2])
        except psutil.Error:
            ps, cpu0 = None, 0.0
        data = pickle.dumps(case, protocol=pickle.HIGHEST_PROTOCOL)
        t0 = time.monotonic()
        try:
            self.proc.stdin.write(struct.pack("<I", len(data)) + data)
            self.proc.stdin.flush()
            answer = self._read(timeout)
        except BrokenPipeError:
            answer = None
        except TimeoutError:
            rc = self._kill()
            v = Verdict("hang", case, signal=f"no answer in {timeout:.0f} s, then {_signal_name(rc)}",
                        log=self.log_tail(since))
            return self._record(family, v, t0)
        except MemoryError:
            rc = self._kill()
            v = Verdict("memory", case, signal=f"RSS past {self.rss_limit >> 20} MiB, then {_signal_name(rc)}",
                        log=self.log_tail(since))
            return self._record(family, v, t0)
        if answer is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            rc = self.proc.poll()
            self.stop()
            v = Verdict("crash", case, signal=_signal_name(rc), log=self.log_tail(since))
            return self._record(family, v, t0)
        if answer["outcome"] == "ok":
            kind = "ok"
        else:
            kind = "workbench" if answer["workbench"] else "wrong_type"
        try:
            self.cpu[family] += sum(ps.cpu_times()[:2]) - cpu0 if ps is not None else 0.0
        except psutil.Error:
            pass
        return self._record(family, Verdict(kind, case, answer), t0)

    def _record(self, family: str, v: Verdict, t0: float) -> Verdict:
        v.seconds = time.monotonic() - t0
        v.family = family
        self.tally[family][v.kind] += 1
        self.seconds[family] += v.seconds
        if v.kind == "workbench":
            self.errors[family][v.error_type] += 1
        if v.kind not in ("ok", "workbench"):
            self.findings.append(v)
        return v

    def summary(self) -> dict:
        fams = {f: {"cases": sum(c.values()), **dict(c), "seconds": round(self.seconds[f], 1),
                    "cpu_seconds": round(self.cpu[f], 1),
                    "errors": dict(self.errors[f].most_common())} for f, c in sorted(self.tally.items())}
        total = Counter()
        for c in self.tally.values():
            total.update(c)
        return {"cases": sum(total.values()), "outcomes": dict(total), "worker_starts": self.starts,
                "families": fams,
                "findings": [{"family": v.family, "kind": v.kind, "signal": v.signal, "error_type": v.error_type,
                              "case": _short(repr(v.case), 400)} for v in self.findings]}
