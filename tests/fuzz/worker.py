"""The fuzz worker: one long-lived child process that runs fuzz cases sent over a pipe.

Started by ``harness.Worker`` as ``python tests/fuzz/worker.py``. It loads the default model
once (small context, 2 sequences), tells the parent it is ready, then reads cases from
stdin and answers each on the protocol descriptor (the original stdout; fd 1 is pointed
at stderr so that nothing llama.cpp or a library prints can corrupt the protocol).

Frames both ways: a 4-byte little-endian length, then a pickle. A case is
``{"kind": str, ...}``; the answer ``{"outcome": "ok" | "error", "error_type": name,
"workbench": bool, "message": str, "facts": {...}, "health": {...}}``. A case that kills
or hangs this process gets no answer: the parent notices (exit signal, timeout) and
restarts it. Everything here runs the public API as a user would.
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path

PROTO_OUT = os.dup(1)
os.dup2(2, 1)  # stray prints go to the log, not into the protocol
sys.stdout = sys.stderr

import workbench as wb  # noqa: E402
from workbench.cache import chunk_format  # noqa: E402
from workbench.errors import WorkbenchError  # noqa: E402

N_SEQ = 2
N_CTX = 512
TOKEN_CAP = 8  # generation cases stop (cancel) after this many tokens
RAM_BUDGET = 64 << 20
BASELINE_PROMPT = "The capital of France is"
# stop-sequence cases pick substrings of these prompts' greedy replies
STOP_PROMPTS = ("The capital of France is", "Once upon a time,", "def fibonacci(n):", "1, 2, 3, 4,")
STOP_TOKENS = 16
ROW_PROMPT = ("A row for the fuzzer: the quick brown fox jumps over the lazy dog, "
              "then the lazy dog sleeps in the warm afternoon sun.")


def send(obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    frame = struct.pack("<I", len(data)) + data
    view = memoryview(frame)
    while view:
        n = os.write(PROTO_OUT, view)
        view = view[n:]


def recv() -> object | None:
    head = sys.stdin.buffer.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack("<I", head)
    return pickle.loads(sys.stdin.buffer.read(n))


def describe(e: BaseException) -> dict:
    return {"outcome": "error", "error_type": type(e).__name__, "workbench": isinstance(e, WorkbenchError),
            "message": f"{e}"[-600:], "where": "".join(traceback.format_tb(e.__traceback__)[-3:])[-1500:]}


class Worker:
    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="wb-fuzz-"))
        self.model_path = str(wb.fetch_default_model(quiet=True))
        wb.configure_cache([{"kind": "ram", "budget_bytes": RAM_BUDGET}])
        self.m = wb.load_model(model_path=self.model_path, model_id="fuzz", n_ctx=N_CTX, n_seq_max=N_SEQ,
                                n_threads=1)  # no spinning thread pool on a shared 2-core machine
        self.baseline = self.greedy(BASELINE_PROMPT, 4)
        # each stop prompt's greedy reply as the text each token released (no stop sequences)
        self.stop_pieces = {p: self.greedy_pieces(p, STOP_TOKENS) for p in STOP_PROMPTS}
        self.stop_replies = {p: "".join(pieces) for p, pieces in self.stop_pieces.items()}
        self.row_bytes, self.row_key, self.manifest, self.row_reply = self.make_row()
        self.cases = 0

    def greedy(self, prompt: str, n: int) -> str:
        return wb.complete(self.m, prompt, response_tokens=n, cache=False).reply

    def greedy_pieces(self, prompt: str, n: int) -> list[str]:
        return [ev.text for ev in wb.stream(self.m, prompt, response_tokens=n, cache=False)
                if isinstance(ev, wb.Token)]

    # -- a real row's chunk file to mutate ------------------------------------------------------
    def make_row(self) -> tuple[bytes, str, tuple[str, bytes], str]:
        """The prompt row a request leaves in whole rows (``storage='rows'``): its one chunk
        file (bytes, key) to mutate, its manifest (name, bytes) kept as it is, and the reply."""
        root = self.tmp / "pristine"
        reply = self.greedy(ROW_PROMPT, TOKEN_CAP)
        wb.configure_cache([{"kind": "disk", "root": str(root)}], storage="rows")
        wb.complete(self.m, ROW_PROMPT, response_tokens=TOKEN_CAP)
        wb.wait_for_saves(30)
        chunks = sorted(root.glob("*" + chunk_format.CHUNK_SUFFIX))
        manifests = sorted(root.glob("*" + chunk_format.MANIFEST_SUFFIX))
        wb.configure_cache([{"kind": "ram", "budget_bytes": RAM_BUDGET}])
        if len(chunks) != 1 or len(manifests) != 1:   # the prompt row alone (no finish row by default)
            raise RuntimeError(f"expected one prompt row under {root}: {sorted(p.name for p in root.iterdir())}")
        chunk, manifest = chunks[0], manifests[0]
        return (chunk.read_bytes(), chunk.name[: -len(chunk_format.CHUNK_SUFFIX)],
                (manifest.name, manifest.read_bytes()), reply)

    # -- cases ------------------------------------------------------------------------------
    def run(self, case: dict) -> dict:
        kind = case["kind"]
        facts: dict = {}
        try:
            getattr(self, "case_" + kind)(case, facts)
            out = {"outcome": "ok"}
        except Exception as e:  # the point: anything raised comes back typed
            out = describe(e)
        out["facts"] = facts
        out["health"] = self.health(check_reply=case.get("check_reply", False))
        self.cases += 1
        return out

    def health(self, check_reply: bool) -> dict:
        """Sequences all free again once the case's sessions are ended (no leak), nothing
        queued; optionally the baseline reply."""
        deadline = time.monotonic() + 30.0  # a cancelled request ends at its next token
        while True:
            for sess in wb.sessions(self.m):  # sessions pin sequences on purpose: end them
                try:
                    wb.end_session(self.m, sess["session_id"], sess.get("cache_scope", "default"))
                except WorkbenchError:
                    pass  # SessionBusy: its cancelled request is still finishing
            info = wb.model_info(self.m)
            leaked = N_SEQ - info["available_seqs"]
            busy = info["queue_depth"] + info["pending_len"]
            if (leaked == 0 and busy == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        out = {"leaked_seqs": leaked, "busy": busy, "phase": info["phase"]}
        if check_reply:
            out["baseline_ok"] = self.greedy(BASELINE_PROMPT, 4) == self.baseline
        return out

    def _stream(self, prompt, opts: dict, facts: dict) -> None:
        self._consume(wb.stream(self.m, prompt, **opts), facts)

    @staticmethod
    def _consume(s, facts: dict) -> None:
        """Read a (chat) stream up to TOKEN_CAP tokens; an Error event is raised, closed after."""
        n = 0
        try:
            for ev in s:
                if isinstance(ev, wb.TokenId):
                    n += 1
                    if n >= TOKEN_CAP:
                        break
                elif isinstance(ev, wb.Error):
                    facts["error_event"] = type(ev.reason).__name__
                    raise ev.reason
                elif isinstance(ev, wb.Done):
                    facts["finish_reason"] = ev.finish_reason
        finally:
            s.close()
        facts["tokens"] = n

    def case_complete(self, case: dict, facts: dict) -> None:
        self._stream(case["prompt"], case.get("opts", {}), facts)

    def case_load(self, case: dict, facts: dict) -> None:
        config, kwargs = case.get("config"), case.get("kwargs", {})
        mid = wb.load_model(config, **kwargs) if config is not None else wb.load_model(**kwargs)
        try:
            facts["n_ctx"] = wb.model_info(mid)["n_ctx"]
            if case.get("generate"):
                facts["reply"] = wb.complete(mid, "Hi", response_tokens=2).reply
        finally:
            wb.unload(mid)

    def case_tokenize(self, case: dict, facts: dict) -> None:
        toks = wb.tokenize(self.m, case["text"], *case.get("args", ()))
        facts["n"] = len(toks)
        if case.get("roundtrip"):
            facts["text"] = wb.detokenize(self.m, toks, remove_special=True)

    def case_detokenize(self, case: dict, facts: dict) -> None:
        facts["text"] = wb.detokenize(self.m, case["tokens"], *case.get("args", ()))

    def case_stop(self, case: dict, facts: dict) -> None:
        prompt = case["prompt"]
        full = self.stop_replies[prompt]
        stops = []
        for s in case["stops"]:
            if isinstance(s, tuple):  # ("reply", start, length): a piece of the reply
                start = s[1] % max(1, len(full))
                s = full[start:start + s[2]]
            stops.append(s)
        facts["stops"] = stops
        facts["full"] = full
        facts["pieces"] = self.stop_pieces[prompt]
        r = wb.complete(self.m, prompt, response_tokens=STOP_TOKENS, stop_sequences=stops,
                        cache=case.get("cache", True))
        facts["reply"], facts["finish_reason"], facts["stop_sequence"] = r.reply, r.finish_reason, r.stop_sequence

    def case_chat(self, case: dict, facts: dict) -> None:
        opts = dict(case.get("opts", {}))
        args = (self.m, case["messages"], case.get("tools"))
        if case.get("mode") == "render":
            r = wb.render_chat_template(*args, **opts)
            facts["prompt_len"] = len(r.prompt)
            return
        opts.setdefault("tool_choice", case.get("tool_choice"))
        self._consume(wb.chat_stream(*args, **opts), facts)

    def case_embed(self, case: dict, facts: dict) -> None:
        if case.get("batch"):
            out = wb.embed_batch(self.m, case["inputs"], *case.get("args", ()))
        else:
            out = wb.embed(self.m, case["inputs"], *case.get("args", ()))
        facts["n"] = len(out)

    def case_api(self, case: dict, facts: dict) -> None:
        fn = getattr(wb, case["call"])
        args = [self.m if a == "<model>" else a for a in case.get("args", ())]
        res = fn(*args, **case.get("kwargs", {}))
        facts["result_type"] = type(res).__name__

    def case_row(self, case: dict, facts: dict) -> None:
        """Put a (mutated) copy of a real prompt row's chunk file, with its manifest, into a
        fresh disk tier, start the cache over it (the start-up scan), then run the row's
        prompt: a damaged file must be rejected with a counted reason and never served; the
        reply must be the cold one."""
        root = self.tmp / f"rows-{self.cases}"
        root.mkdir(mode=0o700)
        try:
            (root / self.manifest[0]).write_bytes(self.manifest[1])
            data, name = self.mutate_row(case["mutation"], root)
            facts["identical"] = (data == self.row_bytes and name == self.row_key + chunk_format.CHUNK_SUFFIX
                                  and case["mutation"][0] not in ("symlink", "directory", "fifo", "sparse"))
            before = wb.counters()
            try:
                wb.configure_cache([{"kind": "ram", "budget_bytes": RAM_BUDGET}, {"kind": "disk", "root": str(root)}],
                                   storage="rows")
                facts["adopted"] = len(wb.cache_rows())
                r = wb.complete(self.m, ROW_PROMPT, response_tokens=TOKEN_CAP)
                facts["hit"] = r.stats.cache_hit_kind
                facts["reply_ok"] = r.reply == self.row_reply
                after = wb.counters()
                facts["rejected"] = {k[len("cache_rejected_"):]: v for k, v in after.items()
                                     if k.startswith("cache_rejected_") and v}
                facts["rows_read"] = r.stats.cache_delta.get("read", 0)
                del before
            finally:
                wb.configure_cache([{"kind": "ram", "budget_bytes": RAM_BUDGET}])
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def mutate_row(self, mutation: tuple, root: Path) -> tuple[bytes, str]:
        data = bytearray(self.row_bytes)
        name = self.row_key + chunk_format.CHUNK_SUFFIX
        op = mutation[0]
        if op == "none":
            pass
        elif op == "set":  # ("set", [(offset, byte), ...])
            for off, b in mutation[1]:
                data[off % len(data)] = b
        elif op == "flip":
            for off, bit in mutation[1]:
                data[off % len(data)] ^= 1 << (bit % 8)
        elif op == "truncate":
            data = data[: mutation[1] % len(data)]
        elif op == "extend":
            data += mutation[1]
        elif op == "splice":  # replace data[a:a+n] with bytes
            a = mutation[1] % len(data)
            data[a:a + mutation[2]] = mutation[3]
        elif op == "rename":  # a valid file under another key's name
            name = mutation[1] + chunk_format.CHUNK_SUFFIX
        elif op == "field":  # rewrite one header field and re-seal the header checksum
            data = bytearray(self.reseal_header(data, mutation[1], mutation[2]))
        elif op == "payload_resealed":  # damage the KV payload and fix both checksums
            data = bytearray(self.reseal_payload(data, mutation[1]))
        elif op == "symlink":
            target = root / "elsewhere"
            target.write_bytes(bytes(data))
            os.symlink(target, root / name)
            return bytes(data), name
        elif op == "directory":
            (root / name).mkdir()
            return b"", name
        elif op == "fifo":
            os.mkfifo(root / name)
            return b"", name
        elif op == "sparse":
            with open(root / name, "wb") as f:
                f.write(bytes(data[: chunk_format.HEADER_SIZE]))
                f.truncate(mutation[1])
            return b"", name
        else:
            raise AssertionError(f"unknown mutation {op}")
        (root / name).write_bytes(bytes(data))
        return bytes(data), name

    @staticmethod
    def _fields(data: bytes) -> list:
        return list(chunk_format.CHUNK_HEADER.unpack(bytes(data[: chunk_format.HEADER_SIZE])))

    def reseal_header(self, data: bytearray, field: int, value: object) -> bytes:
        """``chunk_format.CHUNK_HEADER`` field ``field`` set to ``value``, the header checksum
        (bytes 0..151 and the token ids) made anew."""
        import xxhash

        size = chunk_format.HEADER_SIZE
        vals = self._fields(data)
        n_tokens = vals[4]
        vals[field] = value
        try:
            head = chunk_format.CHUNK_HEADER.pack(*vals)
        except struct.error:
            return bytes(data)
        tokens = bytes(data[size: size + 4 * n_tokens])
        check = xxhash.xxh3_64_intdigest(head[:152] + tokens)
        return head[:152] + struct.pack("<Q", check) + bytes(data[size:])

    def reseal_payload(self, data: bytearray, edits: list) -> bytes:
        """The payload edited, its checksum and the header's made anew: a chunk whose checks
        all pass, holding a llama.cpp state no saver wrote."""
        import xxhash

        vals = self._fields(data)
        start = chunk_format.HEADER_SIZE + 4 * vals[4]
        payload = bytearray(data[start:])
        for off, b in edits:
            payload[off % len(payload)] = b
        vals[11] = xxhash.xxh3_128_digest(bytes(payload))
        data = bytearray(chunk_format.CHUNK_HEADER.pack(*vals)) + data[chunk_format.HEADER_SIZE:start] + payload
        return self.reseal_header(data, 11, vals[11])

    def case_selftest(self, case: dict, facts: dict) -> None:
        """Cases that prove the harness notices a death, a hang and a wrong type."""
        what = case["what"]
        if what == "abort":
            os.abort()
        elif what == "segv":
            import ctypes

            ctypes.string_at(0)
        elif what == "hang":
            time.sleep(3600)
        elif what == "memory":
            hog = []
            while True:
                hog.append(bytearray(64 << 20))
                time.sleep(0.01)
        elif what == "type_error":
            raise TypeError("a bare TypeError")
        elif what == "ok":
            facts["pid"] = os.getpid()


def main() -> None:
    try:
        w = Worker()
    except BaseException as e:  # the parent shows why the worker could not start
        send({"ready": False, "error": "".join(traceback.format_exception(e))[-3000:]})
        raise
    send({"ready": True, "pid": os.getpid(), "baseline": w.baseline, "row_key": w.row_key,
          "model_path": w.model_path})
    try:
        while True:
            case = recv()
            if case is None:
                break
            send(w.run(case))
    finally:
        shutil.rmtree(w.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
