"""The options every command takes (--quiet/-q, --debug, --wide) go on either side of the subcommand's name; the
main command's other options before a subcommand are refused in one line saying where they go."""

from __future__ import annotations

import pytest
import typer.main
from typer.testing import CliRunner

from recommender import progress
from recommender.cli import app
from recommender.cli import options
from recommender.cli.app import GLOBAL_OPTIONS, debug_enabled, set_debug

SUBCOMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _reset():
    yield
    progress.configure(quiet=False)
    set_debug(False)
    options.set_wide(False)


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_every_subcommand_takes_the_global_options_after_its_name():
    """`recommend replan -q` was refused ('No such option: -q') while `recommend --quiet replan` worked."""
    root = typer.main.get_command(app)
    wanted = {o for p in root.params if p.name in GLOBAL_OPTIONS for o in p.opts}
    assert wanted == {"-q", "--quiet", "--debug", "--wide"}
    for name in SUBCOMMANDS:
        cmd = root.commands[name]  # type: ignore[attr-defined]
        opts = {o for p in cmd.params for o in p.opts}
        assert wanted <= opts, f"recommend {name} lacks {sorted(wanted - opts)}"


@pytest.mark.parametrize("flag", ["-q", "--quiet"])
def test_quiet_after_the_subcommand_silences_the_bar(flag):
    res = run("gpus", flag, "-f", "json")
    assert res.exit_code == 0, res.output
    assert progress._quiet is True
    progress.configure(quiet=False)
    res = run("replan", flag)  # parsed as an option: the error is the missing --current, not '-q'
    assert res.exit_code == 2 and "No such option" not in res.stderr and "--current" in res.stderr


def test_debug_and_wide_after_the_subcommand_set_their_switches():
    assert run("models", "--debug", "-f", "json").exit_code == 0 and debug_enabled()
    set_debug(False)
    res = run("autoscale", "--wide")  # autoscale had no --wide: now what is missing is its --workload
    assert res.exit_code == 2 and "No such option" not in res.stderr and "--workload" in res.stderr
    assert options.fitted_width() is None


def test_the_same_option_before_the_subcommand_still_works():
    res = run("-q", "--wide", "gpus", "-f", "json")
    assert res.exit_code == 0 and progress._quiet is True


def test_a_main_option_before_a_subcommand_is_refused_saying_where_it_goes():
    """`recommend --format json replan ...` printed replan's table: the main command's --format was dropped."""
    res = run("--format", "json", "gpus")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1
    assert "--format before the subcommand" in res.stderr and "recommend gpus ... --format json" in res.stderr
    res = run("--top", "3", "models")
    assert res.exit_code == 2 and "recommend models has no --top" in res.stderr
