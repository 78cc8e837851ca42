"""The %wb subcommands' helpers without a model: flag hints on a misspelled option."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from workbench.notebook import commands
from workbench.notebook.magics import WorkbenchMagics


def usage(line: str, fn: object = WorkbenchMagics.generate) -> str:
    with pytest.raises(UsageError) as e:
        commands.parse_arguments(fn, line)
    return str(e.value)


@pytest.mark.parametrize("line,hint", [
    ("--max_tokens 5", "--max_tokens: did you mean --max-tokens?"),      # "_" for "-"
    ("--response-tokens 5", "--response-tokens: did you mean --max-tokens?"),  # the API's name
    ("--temprature 0.5", "--temprature: did you mean --temperature?"),
    ("--sed=3", "--sed: did you mean --seed?"),
])
def test_a_misspelled_flag_says_what_was_meant(line: str, hint: str) -> None:
    msg = usage(line)
    assert msg.startswith("unrecognized arguments: ") and f"({hint})" in msg


def test_hints_for_each_unknown_flag_and_none_for_nonsense() -> None:
    msg = usage("--max_tokens 5 --top_k 3 --frobnicate")
    assert "--max_tokens: did you mean --max-tokens?; --top_k: did you mean --top-k?)" in msg
    assert "frobnicate:" not in msg
    assert usage("--zzzzzz") == "unrecognized arguments: --zzzzzz"
    assert usage("--temperature warm") == "argument --temperature: invalid float value: 'warm'"  # untouched


def test_subcommand_parsers_get_hints_too() -> None:
    assert "did you mean --tier?" in usage("1MiB --teir ram", commands.SUBCOMMANDS["evict"])
    args = commands.parse_arguments(WorkbenchMagics.generate, "--max-tokens 5 --seed 3")
    assert args.max_tokens == 5 and args.seed == 3

