"""The live widget's controls in a real Jupyter kernel (ipykernel, driven over its own
protocol with jupyter_client, as a frontend would): a Cancel click while a foreground
%%generate cell runs cancels the request at once; the kernel's Interrupt ends the cell
with one line, not a traceback; the finished widget hides its Cancel button."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

pytestmark = pytest.mark.model
jupyter_client = pytest.importorskip("jupyter_client")

LONG_CELL = "%%generate --max-tokens 2000 --ignore-eos --as fg\nCount from one to one thousand:"
CANCEL_BOUND_S = 5.0  # 2000 tokens would take half a minute here


class Kernel:
    """A kernel and its client; every iopub message is kept, in order."""

    def __init__(self) -> None:
        self.km, self.kc = jupyter_client.manager.start_new_kernel(kernel_name="python3")
        self.messages: list[dict[str, Any]] = []

    def pump(self, timeout: float = 0.05) -> None:
        try:
            while True:
                self.messages.append(self.kc.get_iopub_msg(timeout=timeout))
                timeout = 0.0
        except Exception:  # queue.Empty: nothing more for now
            return

    def start(self, code: str) -> str:
        return self.kc.execute(code)

    def wait(self, msg_id: str, timeout: float = 120.0) -> list[dict[str, Any]]:
        """The iopub messages of one execution, once the kernel is idle after it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.1)
            mine = [m for m in self.messages if m["parent_header"].get("msg_id") == msg_id]
            if any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in mine):
                return mine
        raise AssertionError(f"the cell did not finish in {timeout} s")

    def run(self, code: str) -> list[dict[str, Any]]:
        return self.wait(self.start(code))

    def value(self, expr: str) -> str:
        out = self.run(f"print({expr})")
        return "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream").strip()

    def widget_states(self) -> dict[str, dict[str, Any]]:
        """comm_id -> the widget state the kernel last sent (comm_open, then updates)."""
        states: dict[str, dict[str, Any]] = {}
        for m in self.messages:
            c = m["content"]
            if m["msg_type"] == "comm_open":
                states[c["comm_id"]] = dict(c["data"].get("state", {}))
            elif m["msg_type"] == "comm_msg" and c["data"].get("method") == "update":
                states.setdefault(c["comm_id"], {}).update(c["data"].get("state", {}))
        return states

    def click(self, comm_id: str) -> None:
        content = {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}}
        self.kc.session.send(self.kc.shell_channel.socket, self.kc.session.msg("comm_msg", content))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def kernel(model_path: Path) -> Iterator[Kernel]:
    k = Kernel()
    try:
        for code in ("%load_ext workbench", "%wb mode widget",
                     f"%wb load {model_path} --id nbtest-controls --n-ctx 4096 --n-seq-max 2"):
            errors = [m for m in k.run(code) if m["msg_type"] == "error"]
            assert not errors, errors
        yield k
    finally:
        k.close()


def cancel_buttons(k: Kernel) -> list[str]:
    return [cid for cid, st in k.widget_states().items()
            if st.get("_model_name") == "ButtonModel" and st.get("icon") == "stop"]


def streaming(k: Kernel) -> bool:
    """Some widget's live line reads 'N of 2000 tokens' with N >= 1."""
    return any(re.search(r"\b[1-9]\d* of 2000 tokens", str(st.get("value", "")))
               for st in k.widget_states().values())


def test_cancel_click_acts_while_a_foreground_cell_runs(kernel: Kernel) -> None:
    before = set(cancel_buttons(kernel))
    msg_id = kernel.start(LONG_CELL)
    assert wait_for(lambda: (kernel.pump(), set(cancel_buttons(kernel)) - before)[1], 60)
    (button,) = set(cancel_buttons(kernel)) - before
    assert kernel.widget_states()[button].get("disabled") is False  # live, not a dead control
    # let it stream a while: until the live line counts generated tokens
    assert wait_for(lambda: (kernel.pump(), streaming(kernel))[1], 60), "no token was generated"
    clicked = time.monotonic()
    kernel.click(button)
    out = kernel.wait(msg_id, timeout=60)
    took = time.monotonic() - clicked
    assert not [m for m in out if m["msg_type"] == "error"], "a Cancel click is no error"
    assert kernel.value("fg.finish_reason") == "cancelled"
    assert took < CANCEL_BOUND_S, f"the cell ran {took:.1f} s after the click"
    n = int(kernel.value("fg.stats.generated_tokens"))
    assert 0 < n < 2000
    state = kernel.widget_states()[button]
    assert state.get("layout") is not None
    # a finished widget shows no Cancel button: its layout is hidden
    layouts = kernel.widget_states()
    layout_id = state["layout"].removeprefix("IPY_MODEL_")
    assert layouts[layout_id].get("display") == "none"


def test_interrupt_ends_the_cell_with_one_line(kernel: Kernel) -> None:
    msg_id = kernel.start(LONG_CELL)
    time.sleep(2.0)
    kernel.km.interrupt_kernel()
    out = kernel.wait(msg_id, timeout=60)
    errors = [m["content"] for m in out if m["msg_type"] == "error"]
    assert len(errors) == 1, out
    (err,) = errors
    assert err["ename"] == "GenerationInterrupted"
    assert len(err["traceback"]) == 1, err["traceback"]
    line = err["traceback"][0]
    assert "generation cancelled after" in line and "the partial result is in `fg`" in line
    assert kernel.value("fg.finish_reason") == "cancelled"
