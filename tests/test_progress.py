"""recommender/progress.py: a bar on stderr only when stderr is a terminal and not --quiet; stdout untouched."""

from __future__ import annotations

import io
import sys

import pytest

from recommender import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _reset():
    progress.configure(quiet=False)  # before too: a CLI test run earlier (`simulate -q`) may have left it quiet
    yield
    progress.configure(quiet=False)


def test_bar_draws_on_a_terminal_stderr_and_counts(monkeypatch) -> None:
    err, out = _Tty(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    with progress.bar("search", total=10, unit="trial") as b:
        for _ in range(10):
            b.update(1)
        assert b.n == 10
    assert "search" in err.getvalue() and "/10" in err.getvalue()
    assert out.getvalue() == ""


def test_silent_when_stderr_is_not_a_terminal(monkeypatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    with progress.bar("search", total=3) as b:
        b.update(3)
        assert b.n == 3
    assert err.getvalue() == ""


def test_quiet_turns_it_off_on_a_terminal(monkeypatch) -> None:
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    progress.configure(quiet=True)
    with progress.bar("simulate", total=5) as b:
        b.update(5)
    assert err.getvalue() == ""


def test_nothing_shows_before_the_delay(monkeypatch) -> None:
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    with progress.bar("search", total=100) as b:     # DELAY_S = 2 s; this finishes at once
        b.update(100)
    assert err.getvalue().strip() == ""


def test_the_search_advances_the_bar_once_per_trial(monkeypatch) -> None:
    seen: list[float] = []

    class Recorder(progress._Silent):
        def update(self, n: float = 1) -> None:
            seen.append(n)

    from contextlib import contextmanager

    @contextmanager
    def fake_bar(description, *, total=None, unit="it"):
        seen.clear()
        yield Recorder()

    monkeypatch.setattr(progress, "bar", fake_bar)
    from pathlib import Path

    from recommender.search import SearchSettings, recommend
    from recommender.workload import load_workload

    w = load_workload(Path(__file__).resolve().parents[1] / "examples" / "chat.yaml")
    recommend(w, settings=SearchSettings(trials=25, verify=0, seed=1))
    assert len(seen) == 25


def test_the_simulator_advances_the_bar_once_per_finished_request(monkeypatch) -> None:
    totals: list[float | None] = []
    count = [0]

    class Recorder(progress._Silent):
        def update(self, n: float = 1) -> None:
            count[0] += n

    from contextlib import contextmanager

    @contextmanager
    def fake_bar(description, *, total=None, unit="it"):
        totals.append(total)
        yield Recorder()

    monkeypatch.setattr(progress, "bar", fake_bar)
    from typer.testing import CliRunner

    from recommender.cli import app

    res = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "2",
                                   "--requests", "300", "--prompt-tokens", "500", "--output-tokens", "50", "--seed", "1"])
    assert res.exit_code == 0, res.output
    assert totals == [300] and count[0] == 300
