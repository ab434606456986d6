"""Workload and trace files at their edges: token lengths of at least 1, errors that name the file, line and field,
``model:`` paths relative to the workload file, and traces whose header or time span gives nothing to read."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from recommender.autoscale.profile import DiurnalProfile, tiled_trace_day
from recommender.catalog import default_catalog
from recommender.cli import app
from recommender.errors import ConfigError, RecommenderError
from recommender.load.trace import parse_requests, read_trace
from recommender.workload import load_workload

QWEN3_8B = Path(__file__).parent / "data" / "hf_configs" / "Qwen3-8B" / "config.json"
HEAD = "model: llama-3.1-8b\ntraffic: {arrival_rate: 5}\nslo: [tpot=50ms]\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _one_line_refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        load_workload(path)
    text = str(e.value)
    assert "\n" not in text and text.startswith(str(path)), text
    return text


# ------------------------------------------------------------------------------------------ token lengths >= 1


@pytest.mark.parametrize("edges, counts", [([0.5], [1]), ([0.5, 1.5, 1000], [1, 1, 1]), ([0.0001, 10], [1, 1])])
def test_a_histogram_edge_below_one_token_is_refused_naming_file_line_and_field(tmp_path: Path, edges: list[float],
                                                                                counts: list[int]) -> None:
    # an edge of 0.5 had become 0-token prompts ("prompt ~0 tok") and a plan file the tool's own reader refused
    w = _write(tmp_path / "w.yaml", HEAD + f"prompt_tokens: {{dist: histogram, edges: {edges}, counts: {counts}}}\n"
                                          "output_tokens: 100\n")
    text = _one_line_refusal(w)
    # line 4 holds prompt_tokens; 'edges' is the 17th character of '{dist: histogram, edges: ...' after 'prompt_tokens: '
    assert text.startswith(f"{w} line 4, column 34: field 'prompt_tokens.edges'"), text
    assert "from 1 to" in text and f"got {edges[0]:g}" in text


def test_a_histogram_whose_first_edge_is_one_token_gives_one_token_prompts(tmp_path: Path) -> None:
    # the smallest bucket that holds a length: (0, 1] is every prompt 1 token long
    w = _write(tmp_path / "w.yaml", HEAD + "prompt_tokens: {dist: histogram, edges: [1], counts: [5]}\noutput_tokens: 100\n")
    dist = load_workload(w).prompt_tokens
    assert (dist.min_tokens, dist.max_tokens, dist.quantile(0.01), dist.quantile(0.99)) == (1, 1, 1, 1)
    assert dist.samples == (1,)


def test_an_empirical_sample_of_zero_tokens_is_refused_at_the_sample(tmp_path: Path) -> None:
    w = _write(tmp_path / "w.yaml", HEAD + "prompt_tokens: {dist: empirical, samples: [10, 0]}\noutput_tokens: 100\n")
    text = _one_line_refusal(w)
    assert text.startswith(f"{w} line 4, column 34: field 'prompt_tokens.samples'") and "got 0" in text, text


@pytest.mark.parametrize("spec, field", [
    ("{dist: empirical, samples: []}", "prompt_tokens.samples"),
    ("{dist: histogram, edges: [], counts: []}", "prompt_tokens.edges"),
])
def test_an_empty_length_list_names_the_file_line_and_field(tmp_path: Path, spec: str, field: str) -> None:
    # was "empirical length distribution needs at least one sample", without the file
    w = _write(tmp_path / "w.yaml", HEAD + f"prompt_tokens: {spec}\noutput_tokens: 100\n")
    text = _one_line_refusal(w)
    assert text.startswith(f"{w} line 4, column 34: field '{field}'") and "at least one value" in text, text


# ------------------------------------------------------------------------------------------ offline deadline


@pytest.mark.parametrize("deadline, why", [("5d", "unknown time unit 'd'"), ("0", "positive duration"),
                                           ("'-5s'", "positive duration"), ("xyz", "cannot read")])
def test_an_offline_deadline_error_names_the_file_line_and_field(tmp_path: Path, deadline: str, why: str) -> None:
    # "5d" was "offline.deadline: unknown time unit 'd' in '5d' (use ms, s, min or h)", without the file
    w = _write(tmp_path / "w.yaml", "model: llama-3.1-8b\nprompt_tokens: 1000\noutput_tokens: 100\n"
                                    f"traffic: {{offline: {{requests: 100, deadline: {deadline}}}}}\n")
    text = _one_line_refusal(w)
    # line 4 is the traffic line; 'deadline' starts at column 36 of 'traffic: {offline: {requests: 100, deadline: ...'
    assert text.startswith(f"{w} line 4, column 36: field 'traffic.offline.deadline'") and why in text, text


@pytest.mark.parametrize("deadline, seconds", [("2min", 120.0), ("1.5h", 5400.0), ("90", 90.0), ("500ms", 0.5)])
def test_offline_deadlines_read_as_before(tmp_path: Path, deadline: str, seconds: float) -> None:
    w = _write(tmp_path / "w.yaml", "model: llama-3.1-8b\nprompt_tokens: 1000\noutput_tokens: 100\n"
                                    f"traffic: {{offline: {{requests: 10, deadline: {deadline}}}}}\n")
    wl = load_workload(w)
    assert wl.deadline_s == pytest.approx(seconds) and wl.effective_rate_per_s == pytest.approx(10 / seconds)


def test_an_offline_rate_above_the_limit_names_the_field(tmp_path: Path) -> None:
    w = _write(tmp_path / "w.yaml", "model: llama-3.1-8b\nprompt_tokens: 1000\noutput_tokens: 100\n"
                                    "traffic: {offline: {requests: 1e12, deadline: 1s}}\n")
    text = _one_line_refusal(w)
    assert "field 'traffic.offline'" in text and "requests / deadline exceeds 1e+06" in text, text


# ------------------------------------------------------------------------------------------ model: paths


def _config_beside(folder: Path, name: str = "cfg") -> Path:
    (folder / name).mkdir(parents=True)
    shutil.copy(QWEN3_8B, folder / name / "config.json")
    return folder / name / "config.json"


@pytest.mark.parametrize("model", ["cfg/config.json", "cfg", "./cfg/config.json"])
def test_a_relative_model_path_is_read_beside_the_workload_from_any_folder(tmp_path: Path, model: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _config_beside(tmp_path / "work")
    w = _write(tmp_path / "work" / "w.yaml", f"model: {model}\ntraffic: {{arrival_rate: 2}}\nprompt_tokens: 1000\n"
                                             "output_tokens: 100\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the config is not reachable from here by the relative path
    assert not Path(model).exists()
    for path in (w, Path("..") / "work" / "w.yaml"):  # the workload named absolutely and relatively
        arch = default_catalog().model(load_workload(path).model)
        assert (arch.num_layers, arch.hidden_size) == (36, 4096)  # Qwen3-8B's config.json


def test_a_missing_relative_config_names_the_path_beside_the_workload(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    w = _write(tmp_path / "work" / "w.yaml", "model: nope/config.json\ntraffic: {arrival_rate: 2}\n"
                                             "prompt_tokens: 1000\noutput_tokens: 100\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecommenderError, match="work/nope/config.json"):
        default_catalog().model(load_workload(w).model)


@pytest.mark.parametrize("model, catalog_id", [("llama-3.1-8b", "llama-3.1-8b"),
                                               ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b")])
def test_catalog_ids_and_repo_ids_stay_names_even_beside_a_folder_of_that_name(tmp_path: Path, model: str,
                                                                               catalog_id: str) -> None:
    _config_beside(tmp_path, model)  # a folder spelled like the catalog name, holding another model's config
    w = _write(tmp_path / "w.yaml", f"model: {model}\ntraffic: {{arrival_rate: 2}}\nprompt_tokens: 1000\n"
                                    "output_tokens: 100\n")
    wl = load_workload(w)
    assert wl.model == model and default_catalog().model(wl.model).id == catalog_id


def test_a_model_name_too_long_for_a_path_is_left_to_the_catalog(tmp_path: Path) -> None:
    # looking for it beside the workload raises ENAMETOOLONG; the name is kept for the catalog's refusal
    name = "a" * 4000
    w = _write(tmp_path / "w.yaml", f"model: {name}\ntraffic: {{arrival_rate: 2}}\nprompt_tokens: 10\noutput_tokens: 10\n")
    assert load_workload(w).model == name


# ------------------------------------------------------------------------------------------ traces


@pytest.mark.parametrize("header, found", [("a,b,c", "found a, b, c"), ("when,ContextTokens,GeneratedTokens",
                                                                         "found when, ContextTokens, GeneratedTokens")])
def test_a_trace_without_a_time_column_names_its_columns(tmp_path: Path, header: str, found: str) -> None:
    # the CSV message listed the columns' indexes ("found 0, 1, 2")
    trace = _write(tmp_path / "t.csv", f"{header}\n1,2,3\n4,5,6\n")
    with pytest.raises(ConfigError) as e:
        read_trace(trace)
    assert str(e.value).startswith(f"{trace}:1: no timestamp column") and str(e.value).endswith(f"{found})")


def test_a_wide_or_odd_header_is_listed_short() -> None:
    header = ",".join(f"c{i}" for i in range(30)) + ",\x1b[31mred," + "x" * 500
    with pytest.raises(ConfigError) as e:
        parse_requests(header + "\n" + ",".join("1" * 32) + "\n", "t.csv")
    text = str(e.value)
    assert "found c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11 and 20 more)" in text and len(text) < 400


def test_a_trace_with_one_instant_is_refused_for_the_day_naming_the_file() -> None:
    # every request at one timestamp: its rate (requests / span) was a division by zero
    profile = DiurnalProfile(mean_rate_per_s=2.0, peak_to_trough=3.0)
    with pytest.raises(ConfigError, match=r"^day\.csv: its 3 requests all share one timestamp, a time span of 0 s"):
        tiled_trace_day(profile, np.zeros(3), np.full(3, 100), np.full(3, 10), source="day.csv")


def test_a_trace_over_a_short_span_still_tiles_the_day() -> None:
    # two requests 1 s apart: the trace's rate is 2 / 2 s (the span plus one mean gap) = 1 req/s; the day's mean
    # rate 2 req/s over 86,400 s is about 172,800 requests
    profile = DiurnalProfile(mean_rate_per_s=2.0, peak_to_trough=1.0)
    day = tiled_trace_day(profile, np.array([0.0, 1.0]), np.array([100, 200]), np.array([10, 20]), source="t.csv")
    assert day.tile_requests == 2 and len(day.arrival_s) == pytest.approx(172_800, rel=1e-3)


def test_autoscale_with_a_one_instant_day_trace_is_one_line_naming_the_trace(tmp_path: Path) -> None:
    trace = _write(tmp_path / "tr" / "same.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                 "2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:46.68,374,44\n")
    w = _write(tmp_path / "day.yaml", "name: day\nmodel: llama-3.1-8b\ntraffic: {arrival_rate: 2}\nprompt_tokens: 1000\n"
                                      "output_tokens: 200\nslo: [tpot=50ms]\ngpus: [a100-80gb]\n"
                                      "day: {peak_to_trough: 3, peak_hour: 14, trace: tr/same.csv}\n")
    res = CliRunner().invoke(app, ["autoscale", "--workload", str(w)])
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [f"error: {trace}: its 2 requests all share one timestamp, a time span of 0 s; a "
                                       "trace needs requests over a time span (its rate is requests / span): give a "
                                       "longer request log"]


def test_simulate_with_a_headerless_trace_names_the_columns(tmp_path: Path) -> None:
    trace = _write(tmp_path / "t.csv", "a,b,c\n1,2,3\n")
    res = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--prompt-tokens", "100",
                                   "--output-tokens", "10", "--trace", str(trace)])
    assert res.exit_code == 2, res.output
    assert len(res.stderr.splitlines()) == 1 and res.stderr.rstrip().endswith("found a, b, c)"), res.stderr


def test_simulate_with_a_one_instant_trace_and_no_rate_names_the_trace(tmp_path: Path) -> None:
    """Two requests at one timestamp (or one request) give no arrival rate: simulate said 'give --rate R ..., or a
    --trace' although a trace was given."""
    from typer.testing import CliRunner

    from recommender.cli import app

    for rows in ("0,100,10\n0,100,10\n", "0,100,10\n"):
        trace = tmp_path / "same.csv"
        trace.write_text("timestamp,prompt_tokens,output_tokens\n" + rows)
        args = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt-tokens", "100", "--output-tokens",
                "10", "--trace", str(trace), "-q"]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and res.stdout == ""
        assert res.stderr.startswith(f"error: --trace {trace}: its {rows.count(chr(10))} request(s) arrive at one instant")
        assert CliRunner().invoke(app, [*args, "--rate", "5"]).exit_code == 0   # a rate replays them
