"""A third-party load generator drives the endpoint: guidellm (vLLM's project, 0.8.1), in a
venv of its own (build/guidellm-venv, made by `make test`; tests/server/guidellm says how).

guidellm sends streaming chat completions (max_completion_tokens, ignore_eos, its content as
a list of text parts) at a constant rate and reports what it measured. The test checks that
its run completes every request and that its token counts are the engine's: the prompt and
output tokens guidellm read from the responses equal those of the requests the engine served
(recorded by `wb.lab.record`), and the prompt tokens equal the chat template's rendering.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import workbench as wb
from workbench import lab

pytestmark = pytest.mark.model

HERE = Path(__file__).resolve().parent
STUB = HERE / "guidellm" / "torch_stub"
PROMPTS = ["Write one sentence about the sea.", "Name three colours.", "What is two plus two?",
           "Describe a cat in five words.", "Say hello in French.", "Give me a word that rhymes with moon."]
OUTPUT_TOKENS = 8


def _guidellm() -> str:
    exe = os.environ.get("WORKBENCH_GUIDELLM") or str(HERE.parents[1] / "build" / "guidellm-venv" / "bin" / "guidellm")
    if not Path(exe).is_file():
        if os.environ.get("WORKBENCH_GUIDELLM"):  # make test installed it: its absence is a failure
            pytest.fail(f"guidellm not found at {exe}")
        pytest.skip("guidellm is not installed (make build/guidellm-venv/.installed; make test does it)")
    return exe


def test_guidellm_completes_its_run_and_counts_the_tokens_the_engine_served(model, server, tmp_path):
    exe = _guidellm()
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "output_tokens_count": OUTPUT_TOKENS}) + "\n" for p in PROMPTS))
    out = tmp_path / "guidellm.json"
    env = {**os.environ, "PYTHONPATH": str(STUB), "USE_TORCH": "0", "GUIDELLM__MAX_WORKER_PROCESSES": "1",
           "HF_HUB_OFFLINE": "1"}
    cmd = [exe, "run", "--backend", f"kind=openai_http,target={server.url},model={model}",
           "--profile", "kind=constant,rate=4", "--constraint", f"kind=max_requests,count={len(PROMPTS)}",
           "--constraint", "kind=max_duration,seconds=240", "--data", f"kind=json_file,path={data}",
           "--output", f"kind=json,path={out}", "--disable-console"]
    with lab.record(model) as rec:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    bench = json.loads(out.read_text())["benchmarks"][0]
    totals = bench["metrics"]["request_totals"]
    assert totals["successful"] == len(PROMPTS) and totals["errored"] == 0, totals

    served = rec.requests
    served = served[served["finish_reason"] == "length"]
    assert len(served) == len(PROMPTS), rec.requests
    prompt_sum = round(bench["metrics"]["prompt_token_count"]["successful"]["total_sum"])  # floats: 217.99999999999997
    output_sum = round(bench["metrics"]["output_token_count"]["successful"]["total_sum"])
    assert prompt_sum == served["prompt_tokens"].sum()
    assert output_sum == served["generated_tokens"].sum() == OUTPUT_TOKENS * len(PROMPTS)
    rendered = [len(wb.render_chat_template(model, [{"role": "user", "content": p}]).tokens) for p in PROMPTS]
    assert prompt_sum == sum(rendered)
