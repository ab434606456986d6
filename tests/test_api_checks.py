"""The typed Python API checks its arguments as the CLI checks its flags: the same bounds, one ConfigError line,
before any work (``recommend(trials=0)`` had run the policy's 170 trials, ``seed=-5`` raised NumPy's ValueError,
``timeout_s=0`` an InfeasibleError, ``estimate(tp="2")`` a TypeError)."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

import recommender
from recommender import ConfigError, estimate, load_workload, recommend, simulate
from recommender.deploy import render_deploy
from recommender.load.toy import FixedLength, LinearStepCost, ToyLimits

CHAT = Path(__file__).resolve().parents[1] / "examples" / "chat.yaml"


@pytest.fixture(scope="module")
def workload() -> recommender.Workload:
    return load_workload(CHAT)


def _refused(call: object, *args: object, **kw: object) -> str:
    with pytest.raises(ConfigError) as e:
        call(*args, **kw)  # type: ignore[operator]
    text = str(e.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("kw, says", [
    ({"trials": 0}, "recommend(trials=0): give a positive number of trials"),
    ({"trials": -1}, "recommend(trials=-1): give a positive number of trials"),
    ({"trials": 1.5}, "recommend(trials=1.5): trials takes an int, not float"),
    ({"trials": True}, "recommend(trials=True): trials takes an int, not bool"),
    ({"trials": "40"}, "recommend(trials='40'): trials takes an int, not str"),
    ({"top": 0}, "recommend(top=0): give how many plans to return, at least 1"),
    ({"top": -3}, "recommend(top=-3): give how many plans to return, at least 1"),
    ({"verify": -1}, "recommend(verify=-1): give how many plans to verify, from 0 (off) to 1000"),
    ({"verify": 1001}, "recommend(verify=1001): give how many plans to verify, from 0 (off) to 1000"),
    ({"seed": -5}, "recommend(seed=-5): give an integer from 0 to 4294967295"),
    ({"seed": 2**32}, "recommend(seed=4294967296): give an integer from 0 to 4294967295"),
    ({"timeout_s": 0}, "recommend(timeout_s=0): give a positive number of seconds"),
    ({"timeout_s": -1.0}, "recommend(timeout_s=-1.0): give a positive number of seconds"),
    ({"timeout_s": float("inf")}, "recommend(timeout_s=inf): give a positive number of seconds"),
    ({"timeout_s": "5s"}, "recommend(timeout_s='5s'): timeout_s takes a number, not str"),
    ({"storage": ""}, "recommend(storage=''): give a file name or a database URL"),
    ({"storage": 5}, "recommend(storage=5): storage takes a str"),
    ({"profile": "vllm"}, "recommend(profile='vllm'): profile takes an EngineProfile, not str"),
    ({"warm_start": {}}, "recommend(warm_start={}): warm_start takes a Plan, not dict"),
])
def test_recommend_refuses_what_the_cli_refuses(workload: recommender.Workload, kw: dict[str, object], says: str) -> None:
    assert _refused(recommend, workload, **kw).startswith(says)


@pytest.mark.parametrize("storage", ["a" * 256, "sqlite:///" + "b" * 300 + ".db", "c/" * 2100 + "d"])
def test_recommend_refuses_a_storage_name_the_file_system_cannot_hold(workload: recommender.Workload,
                                                                      storage: str) -> None:
    # Linux: NAME_MAX 255 bytes a file name, PATH_MAX 4096 a path (SQLite had raised "file name too long" from
    # inside the search, after the trials)
    text = _refused(recommend, workload, storage=storage)
    assert text.startswith("recommend(storage='") and "the file name is too long (at most 255 bytes a name" in text
    assert len(text) < 300


def test_recommend_refuses_a_folder_as_storage_and_a_path_as_workload(workload: recommender.Workload,
                                                                      tmp_path: Path) -> None:
    assert "is not a regular file" in _refused(recommend, workload, storage=str(tmp_path))
    assert _refused(recommend, str(CHAT)).startswith("recommend(workload='") and "load_workload" in _refused(
        recommend, str(CHAT))


def test_recommend_takes_numpy_integers_and_runs_the_trials_asked(workload: recommender.Workload) -> None:
    plan = recommend(workload, seed=np.int64(3), trials=np.int32(20), top=np.int64(2), verify=0)
    assert plan.search.seed == 3 and len(plan.rows) <= 2 and [r.rank for r in plan.rows] == list(range(1, len(plan.rows) + 1))


@pytest.mark.parametrize("kw, says", [
    ({"tp": "2"}, "estimate(tp='2'): tp takes int, not str"),
    ({"tp": 2.0}, "estimate(tp=2.0): tp takes int, not float"),
    ({"batch": True}, "estimate(batch=True): batch takes int or None, not bool"),
    ({"cuda_graphs": 1}, "estimate(cuda_graphs=1): cuda_graphs takes bool, not int"),
    ({"model": 8}, "estimate(model=8): model takes str, not int"),
    ({"batchh": 32}, "estimate(batchh=...): unknown argument; did you mean 'batch'?"),
])
def test_estimate_refuses_wrong_types_and_unknown_arguments(kw: dict[str, object], says: str) -> None:
    args: dict[str, object] = {"model": "llama-3.1-8b", "gpu": "h100-sxm", **kw}
    assert _refused(estimate, **args) == says


def test_estimate_takes_numpy_integers_and_an_integer_concurrency_as_the_cli_reads_them() -> None:
    base = estimate(model="llama-3.1-8b", gpu="h100-sxm", tp=2, batch=32, context_tokens=2048)
    same = estimate(model="llama-3.1-8b", gpu="h100-sxm", tp=np.int64(2), batch=np.int32(32), context_tokens=2048)
    assert same.tpot_s == base.tpot_s
    closed = dict(model="llama-3.1-8b", gpu="h100-sxm", prompt_tokens=1000, output_tokens=100)
    assert estimate(**closed, concurrency=8).tpot_s == estimate(**closed, concurrency="8").tpot_s


@pytest.mark.parametrize("kw, says", [
    ({"n_requests": 0}, "simulate(n_requests=0): give between 1 and 2,000,000 requests"),
    ({"n_requests": 2_000_001}, "simulate(n_requests=2000001): give between 1 and 2,000,000 requests"),
    ({"n_requests": 10.0}, "simulate(n_requests=10.0): n_requests takes an int, not float"),
    ({"seed": -1}, "simulate(seed=-1): give an integer from 0 to 4294967295"),
    ({"arrival_rate_per_s": 0.0}, "simulate(arrival_rate_per_s=0.0): give a positive, finite number of requests"),
    ({"arrival_rate_per_s": float("nan")}, "simulate(arrival_rate_per_s=nan): give a positive, finite number"),
])
def test_simulate_refuses_what_the_cli_refuses(kw: dict[str, object], says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECOMMENDER_MAX_REQUESTS", raising=False)  # the default limit, 2,000,000
    args: dict[str, object] = {"arrival_rate_per_s": 1.0, "prompt": FixedLength(100), "output": FixedLength(10),
                               "n_requests": 10, **kw}
    assert _refused(simulate, LinearStepCost(), ToyLimits(), **args).startswith(says)


def test_simulate_replays_a_whole_trace_with_zero_requests() -> None:
    rows = [(0.0, 100, 10), (0.5, 100, 10), (1.0, 100, 10)]
    res = simulate(LinearStepCost(), ToyLimits(), arrival_rate_per_s=None, prompt=None, output=None, n_requests=0,
                   trace=rows)
    assert res.completed == 3


def test_signatures_are_as_docs_python_api_states() -> None:
    # docs/python-api.md: recommend(workload, *, ...), estimate(*, ...), simulate(cost, limits, *, ...), and
    # render_deploy(plan, *, rank=1, formats="all", checkpoint=None, ...)
    def kinds(fn: object) -> list[tuple[str, inspect._ParameterKind]]:
        return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    keyword = inspect.Parameter.KEYWORD_ONLY
    assert [k for _, k in kinds(recommend)] == [positional] + [keyword] * (len(kinds(recommend)) - 1)
    assert {k for _, k in kinds(estimate)} == {keyword}
    assert [k for _, k in kinds(simulate)] == [positional] * 2 + [keyword] * (len(kinds(simulate)) - 2)
    deploy = kinds(render_deploy)
    assert deploy[0] == ("plan", positional)
    assert deploy[1:4] == [("rank", keyword), ("formats", keyword), ("checkpoint", keyword)]
    assert {k for _, k in deploy[1:]} == {keyword}


def test_dump_plan_takes_a_plan_not_its_parsed_json() -> None:
    # a plan file's json.load() is a dict: plan_document had raised KeyError('rows')
    assert "dump_plan(plan): takes a Plan" in _refused(recommender.dump_plan, {})
    assert "not dict" in _refused(recommender.dump_plan, {"plans": []})
