"""``benchmarks/readme_figures.py`` renders each recomputed figure as the README writes it and finds it there.

The full run takes about 15 minutes (``benchmarks/results/readme-figures.md``); these tests check the rendering and
the check on hand-made figures.
"""
from __future__ import annotations

import pytest
from bench_module import benchmark


@pytest.fixture(scope="module")
def rf():  # type: ignore[no-untyped-def]
    return benchmark("readme_figures")


def _tally(bx, n: int, ttft: list[float], tpot: list[float], tput: list[float]):  # type: ignore[no-untyped-def]
    t = bx.Tally()
    t.n = n
    t.errs["ttft"], t.errs["tpot"], t.errs["tput"] = ttft, tpot, tput
    return t


def test_a_gpu_line_lists_several_gpus_cell_by_cell_and_the_held_out_cell_metric_by_metric(rf) -> None:  # type: ignore[no-untyped-def]
    bx = benchmark("bench_inferencex")
    ins = {"mi300x": _tally(bx, 2, [10.0, 20.0], [5.0, 7.0], [1.0, 3.0]), "mi325x": _tally(bx, 1, [4.0], [2.0], [8.0])}
    held = {"mi300x": _tally(bx, 2, [30.0, 40.0], [9.0, 11.0], [3.0, 5.0]), "mi325x": _tally(bx, 1, [6.0], [3.0], [9.0])}
    line = rf.gpu_line("MI300X / MI325X", ("mi300x", "mi325x"), ins, held)
    # means by hand: TTFT 15 and 4, TPOT 6 and 2, tok/s 2 and 8; held out TTFT 35 / 6, TPOT 10 / 3, tok/s 4 / 9
    assert line == ("| MI300X / MI325X | 2 / 1 | 15.0 / 4.0 | 6.0 / 2.0 | 2.0 / 8.0 | 35.0 / 6.0, 10.0 / 3.0, 4.0 / 9.0 "
                    "| - |")
    one = rf.gpu_line("MI300X", ("mi300x",), ins, held)
    assert one == "| MI300X | 2 | 15.0 | 6.0 | 2.0 | 35.0 / 10.0 / 4.0 | - |"


def test_aiconfigurators_cells_are_weighted_by_their_points(rf) -> None:  # type: ignore[no-untyped-def]
    bx = benchmark("bench_inferencex")
    rows = [r for r in bx.peer_rows() if r["gpu"] == "h200"]
    n = sum(int(r["aic_points"]) for r in rows)
    ttft = sum(int(r["aic_points"]) * float(r["aic_ttft_mape_pct"]) for r in rows) / n
    assert rows and rf._peer(["h200"]).startswith(f"{ttft:.1f} / ")
    assert rf._peer(["mi300x"]) == "-"          # aiconfigurator has no AMD cell


def test_the_check_ignores_line_breaks_and_catches_a_changed_digit(rf) -> None:  # type: ignore[no-untyped-def]
    readme = "it is 25.0 / 11.8 /\n13.0%. Every\nplan row"
    same = rf.Figure("loco", "x", "it is 25.0 / 11.8 / 13.0%.")
    other = rf.Figure("loco", "x", "it is 25.0 / 11.9 / 13.0%.")
    assert [ok for _, ok in rf.check([same, other], readme)] == [True, False]
    report = rf.report(rf.check([same, other], readme), 1.0, ["--quick"])
    assert "1 of 2 figures" in report and "| loco | `x` | it is 25.0 / 11.9 / 13.0%. | **no** |" in report


def test_the_profile_table_renders_figures_given_to_it() -> None:
    pe = benchmark("profile_evidence")
    dense = {"lmdeploy": {"ampere": {"rows": 180, "configurations": 3, "median_ape_pct": 9.75}}}
    moe = {"atom": {"cdna4": {"rows": 43, "configurations": 8, "ttft_mape_pct": 25.44, "tpot_mape_pct": 11.5,
                              "output_tput_mape_pct": 12.6}}}
    lines = pe.table(dense=dense, moe=moe)[2:]
    assert lines == ["| atom | cdna4 | - | - | 43 (8) | 25.4 / 11.5 / 12.6 |", "| lmdeploy | ampere | 180 (3) | 9.8 | - | - |"]


@pytest.mark.slow  # about 3 minutes on 2 cores: the InferenceX held-out run and the dense pipeline's 5 folds
def test_the_readme_states_every_figure_the_quick_run_reproduces(rf, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "figures.md"
    rc = rf.main(["--quick", "--out", str(out)])
    text = out.read_text()
    assert "**no**" not in text, text
    assert rc == 0 and "| InferenceX all |" in text and "| dense rows held out by configuration |" in text
