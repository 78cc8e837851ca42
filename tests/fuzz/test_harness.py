"""The fuzz harness notices what it is there to notice: a worker killed by SIGABRT or
SIGSEGV, a hang, runaway memory and a non-WorkbenchError, and it carries on with a fresh
worker after each (a detector that cannot fail would make every fuzz test vacuous)."""

from __future__ import annotations

import pytest

from .harness import Worker

pytestmark = [pytest.mark.fuzz, pytest.mark.model]


def test_harness_detects_death_hang_memory_and_wrong_type():
    w = Worker()
    try:
        first = w.run("selftest", {"kind": "selftest", "what": "ok"})
        assert first.kind == "ok" and first.health["leaked_seqs"] == 0
        pid = first.facts["pid"]

        abort = w.run("selftest", {"kind": "selftest", "what": "abort"})
        assert abort.kind == "crash" and "SIGABRT" in abort.signal, abort.explain()
        segv = w.run("selftest", {"kind": "selftest", "what": "segv"})
        assert segv.kind == "crash" and "SIGSEGV" in segv.signal, segv.explain()
        assert "Fatal Python error" in segv.log  # the child's last words come back with the verdict

        hang = w.run("selftest", {"kind": "selftest", "what": "hang"}, timeout=3)
        assert hang.kind == "hang", hang.explain()

        w.rss_limit = 1200 << 20
        hog = w.run("selftest", {"kind": "selftest", "what": "memory"}, timeout=60)
        assert hog.kind == "memory", hog.explain()

        wrong = w.run("selftest", {"kind": "selftest", "what": "type_error"})
        assert wrong.kind == "wrong_type" and wrong.error_type == "TypeError"
        with pytest.raises(AssertionError, match="not a WorkbenchError"):
            wrong.assert_survived()

        last = w.run("selftest", {"kind": "selftest", "what": "ok"})
        assert last.kind == "ok" and last.facts["pid"] != pid
        assert w.starts == 5  # one start, then one after each of the four deaths
        assert w.summary()["outcomes"] == {"ok": 2, "crash": 2, "hang": 1, "memory": 1, "wrong_type": 1}
    finally:
        w.stop()
