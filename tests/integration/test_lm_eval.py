"""lm-evaluation-harness drives the workbench as its model "workbench": a local
multiple-choice task (a YAML task over a JSONL file shipped here; no dataset hub), a
perplexity-style task (loglikelihood_rolling) and a generation task (generate_until), each
checked against the same questions scored directly with the workbench's calls."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import workbench as wb

pytestmark = pytest.mark.model
lm_eval = pytest.importorskip("lm_eval")

DATA = Path(__file__).parent / "lm_eval" / "capitals.jsonl"
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
{extra}
"""
MULTIPLE_CHOICE = """doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
target_delimiter: " "
metric_list:
  - metric: acc
"""
ROLLING = """doc_to_target: "{{question}}"
metric_list:
  - metric: word_perplexity
"""
GENERATE = """doc_to_target: "{{choices[answer]}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    import workbench.integrations.lm_eval  # noqa: F401 - registers model="workbench"
    from lm_eval.tasks import TaskManager

    root = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, output_type, extra in (("wb_capitals", "multiple_choice", MULTIPLE_CHOICE),
                                     ("wb_questions_rolling", "loglikelihood_rolling", ROLLING),
                                     ("wb_capitals_generate", "generate_until", GENERATE)):
        (root / f"{name}.yaml").write_text(TASK.format(name=name, data=DATA, output_type=output_type, extra=extra))
    return TaskManager(include_path=str(root))


def evaluate(model, tasks, name):
    out = lm_eval.simple_evaluate(model="workbench", model_args=f"model={model}", tasks=[name], task_manager=tasks)
    return out["results"][name]


def questions():
    return [json.loads(line) for line in DATA.read_text().splitlines()]


def test_multiple_choice_accuracy_is_the_workbenchs_own(model, tasks, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    acc = evaluate(model, tasks, "wb_capitals")["acc,none"]
    right = 0
    for q in questions():
        context = f"Question: {q['question']}\nAnswer:"
        scores = [lp for lp, _ in wb.loglikelihood(model, [(context, " " + c) for c in q["choices"]])]
        right += int(np.argmax(scores) == q["answer"])
    assert acc == pytest.approx(right / len(questions())) and acc > 0.5


def test_rolling_loglikelihood_is_the_score_of_each_text(model, tasks, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    got = evaluate(model, tasks, "wb_questions_rolling")["word_perplexity,none"]
    texts = [q["question"] for q in questions()]
    total = sum(wb.loglikelihood_rolling(model, texts))
    words = sum(len(t.split()) for t in texts)          # lm-eval's word count: whitespace-split
    assert got == pytest.approx(np.exp(-total / words), rel=1e-3)


def test_generation_answers_are_the_greedy_replies(model, tasks, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    em = evaluate(model, tasks, "wb_capitals_generate")["exact_match,none"]
    hits = 0
    for q in questions():
        reply = wb.complete(model, f"Question: {q['question']}\nAnswer:", response_tokens=8, temperature=0,
                            stop_sequences=["\n", "."]).reply
        hits += int(reply.strip() == q["choices"][q["answer"]])   # lm-eval's target follows " "
    assert em == pytest.approx(hits / len(questions()))
