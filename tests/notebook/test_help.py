"""`%wb help` (and bare `%wb`): a table of every subcommand with a line on what it does, the
cluster's actions one per line, the cell magics; all of it read from the registered commands."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from workbench.notebook import cluster_commands, commands, help as wb_help
from workbench.notebook.magics import WorkbenchMagics


def printed(ip: Any, capsys: pytest.CaptureFixture[str], line: str) -> str:
    result = ip.run_cell(line)
    assert result.success, result.error_in_exec
    return capsys.readouterr().out


def test_help_is_a_table_of_every_command(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = printed(ip, capsys, "%wb help")
    assert printed(ip, capsys, "%wb") == out  # bare %wb is the same table
    lines = out.splitlines()
    assert max(map(len, lines)) <= wb_help.WIDTH
    for name, fn in commands.SUBCOMMANDS.items():
        if name == "cluster":
            continue
        row = next(i for i, line in enumerate(lines) if line.startswith(f"  {name} ") or line == f"  {name}")
        # the description beside the usage, or below a long one, in the description column
        text = " ".join(line.strip() for line in lines[row:row + 3])
        assert wb_help.summary(fn) in " ".join(text.split()), name
        assert wb_help.summary(fn) and "::" not in wb_help.summary(fn)
    assert "  models [--all]            Loaded models (a DataFrame; --all for every column of model_info)" in lines
    assert "  unload ID                 Unload a model (its running requests end with an error)" in lines
    assert "  mode [auto|widget|text]   Show or set how %%generate shows a generation: widget, text, or auto" in lines
    # the flags every cache command takes are named once, not on each row
    assert sum("--cache VAR" in line for line in lines) == 1
    assert "  counters, cache, chunks, tiers, evict, pin, unpin also take [--model ID | --cache VAR]: the" in lines


def test_help_lists_each_cluster_action_on_its_own_line(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    lines = printed(ip, capsys, "%wb help").splitlines()
    cluster = [line for line in lines if line.startswith("  cluster ")]
    assert [line.split()[1] for line in cluster] == list(cluster_commands.ACTIONS)
    start = next(line for line in cluster if line.startswith("  cluster start"))
    assert start == "  cluster start [--replicas N] [--router NAME] [--threads N] [--n-ctx N] [--n-seq-max N]"
    assert not any("--last" in line and "--replicas" in line for line in lines)  # not run together any more
    assert "  cluster decisions [--last N]" in lines
    assert any(line.startswith("  cluster router NAME ") for line in lines)
    assert "  cluster stop              Stop the cluster's replicas" in lines
    out = printed(ip, capsys, "%wb help cluster")
    assert out.startswith("%wb cluster ACTION\n  cluster start [--replicas N]")
    assert "--last N              only the last N decisions (decisions)" in out  # the options in full
    assert not any("--last" in line and "--replicas" in line for line in out.splitlines())


def test_help_names_the_cell_magics(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    lines = printed(ip, capsys, "%wb help").splitlines()
    assert "  %%generate [OPTIONS]      Generate a completion of the cell's text, shown live" in lines
    assert "  %%chat [OPTIONS]          A chat turn: the cell is the user's message, the conversation is kept" in lines
    for line in ("%wb help generate", "%wb help %%generate"):
        out = printed(ip, capsys, line)
        assert out.startswith("  %%generate [--model ID]") and "--max-tokens N        most tokens" in out
    assert "--tool-result CALL_ID" in printed(ip, capsys, "%wb help chat")
    assert printed(ip, capsys, "%wb help unload").startswith("  %wb unload ID\n")
    for line, message in (("%wb help nope", "unknown %wb command 'nope'"),
                          ("%wb help %%nope", "no cell magic %%nope; the workbench's: %%generate, %%chat")):
        error = ip.run_cell(line).error_in_exec
        assert isinstance(error, UsageError) and message in str(error)


def test_help_follows_the_registered_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    @magic_arguments(name="wb frob")
    @argument("thing", metavar="THING")
    @argument("--hard", action="store_true")
    def _frob(m: Any, args: Any) -> None:
        """Frobnicate a thing.

        At length, which the table leaves out."""

    monkeypatch.setitem(commands.SUBCOMMANDS, "frob", _frob)
    assert "  frob THING [--hard]       Frobnicate a thing\n" in wb_help.overview()
    # every action the parser accepts has its line, and every flag noted for one exists
    fn = commands.SUBCOMMANDS["cluster"]
    choices = next(a.choices for a in fn.parser._actions if a.dest == "action")
    assert list(choices) == list(cluster_commands.ACTIONS)
    flags = {f for a in fn.parser._actions for f in a.option_strings}
    assert {f for fs in cluster_commands.FLAGS.values() for f in fs} == flags
    assert set(cluster_commands.VALUES) <= set(cluster_commands.ACTIONS)
    assert WorkbenchMagics.cell_names == ("generate", "chat")
