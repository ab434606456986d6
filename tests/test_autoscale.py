"""Autoscaling over a day (round-3 issue #25): the profile, the rule, the replay with the HPA in the loop.

Expected numbers are hand calculations from the formulas in the module docstrings (recommender/autoscale/).
The replay runs on the load model's linear toy step cost (recommender/load/toy.py), so it is fast and its
capacity is known.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from recommender.autoscale.profile import DAY_S, DiurnalProfile, poisson_day, tiled_trace_day
from recommender.autoscale.replay import controller, replay
from recommender.autoscale.rule import AutoscalePolicy, ScalingRule, derive_rule, startup_s
from recommender.errors import ConfigError
from recommender.load.topology import PoolSpec
from recommender.load.toy import LinearStepCost, ToyLimits
from recommender.workload import Slo


def test_three_to_one_profile_by_hand() -> None:
    p = DiurnalProfile(mean_rate_per_s=4.0, peak_to_trough=3.0, peak_hour=14.0)
    assert p.amplitude == pytest.approx(0.5)                 # (3 - 1) / (3 + 1)
    assert p.peak_rate_per_s == pytest.approx(6.0) and p.trough_rate_per_s == pytest.approx(2.0)
    assert float(p.rate_per_s(14 * 3600.0)) == pytest.approx(6.0)
    assert float(p.rate_per_s(2 * 3600.0)) == pytest.approx(2.0)   # 12 h after the peak
    assert float(p.cumulative(DAY_S)) == pytest.approx(4.0 * DAY_S)  # the mean over a whole day
    t = np.array([0.0, 1000.0, 50_000.0, 86_000.0])
    assert p.invert(p.cumulative(t)) == pytest.approx(t, abs=1e-6)
    # half a day apart, the rate can rise from the trough to the peak: 3x
    assert p.max_growth(DAY_S / 2) == pytest.approx(3.0)
    assert p.max_growth(0.0) == pytest.approx(1.0)


@pytest.mark.parametrize("kw", [{"peak_to_trough": 0.5}, {"peak_to_trough": math.inf}, {"peak_hour": 24.0},
                                {"mean_rate_per_s": -1.0}, {"mean_rate_per_s": math.nan}])
def test_bad_profiles_are_one_line_errors(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        DiurnalProfile(**{"mean_rate_per_s": 1.0, **kw})


def test_poisson_day_follows_the_profile() -> None:
    p = DiurnalProfile(mean_rate_per_s=2.0, peak_to_trough=3.0, peak_hour=14.0)
    day = poisson_day(p, np.array([100]), np.array([10]), seed=1)
    n = day.arrival_s.size
    assert abs(n - 2.0 * DAY_S) < 5 * math.sqrt(2.0 * DAY_S)   # Poisson count within 5 sigma
    assert np.all(np.diff(day.arrival_s) >= 0) and day.arrival_s[0] >= 0 and day.arrival_s[-1] <= DAY_S
    hours = np.histogram(day.arrival_s, bins=24, range=(0, DAY_S))[0]
    # the hour around the peak (13-14 h) against the hour around the trough (1-2 h): expected 5.98 / 2.02
    expected = float(p.cumulative(14 * 3600.0) - p.cumulative(13 * 3600.0)) / float(
        p.cumulative(2 * 3600.0) - p.cumulative(3600.0))
    assert hours[13] / hours[1] == pytest.approx(expected, rel=0.08)


def test_tiled_trace_keeps_its_lengths_and_reaches_the_days_count() -> None:
    p = DiurnalProfile(mean_rate_per_s=1.0, peak_to_trough=2.0)
    a = np.cumsum(np.full(600, 2.0)) - 2.0          # a 0.5 req/s trace of 600 requests
    day = tiled_trace_day(p, a, np.arange(600) + 1, np.full(600, 7), source="t")
    assert abs(day.arrival_s.size - DAY_S) <= 1       # Lambda(P) = 1 req/s x a day
    assert set(day.prompt_tokens[:600]) == set(range(1, 601)) and set(day.output_tokens) == {7}


def _rule(**kw: float) -> ScalingRule:
    base = dict(replica_capacity_per_s=10.0, profile=DiurnalProfile(mean_rate_per_s=20.0, peak_to_trough=1.0),
                startup=100.0, policy=AutoscalePolicy(), gpus_per_replica=2, model_name="m")
    base.update(kw)
    return derive_rule(capacity_per_s=base.pop("replica_capacity_per_s"), **base)  # type: ignore[arg-type]


def test_rule_for_a_constant_day_by_hand() -> None:
    r = _rule()
    assert r.growth_within_delay == pytest.approx(1.0)
    assert r.burst == 1.0                                               # no arrivals: B = 1
    assert r.target_per_replica_per_s == pytest.approx(10.0 / 1.1)   # c1 / ((1 + tolerance) max(B, g))
    assert r.min_replicas == r.max_replicas == 3                        # ceil(20 / 9.09)
    # cooldown = max(900, 3 x 100 s, 300 + 100 + 2 x 15) = 900 s: all of it the HPA's window, no query hold
    assert r.scale_down_stabilisation_s == pytest.approx(900.0) and r.metric_hold_s == 0.0
    assert r.metric == 'sum(rate(vllm:request_success_total{model_name="m"}[60s]))'
    assert r.desired(0.0) == 3 and r.desired(1000.0) == 3


def test_startup_by_hand() -> None:
    # 120 s pull + 70 GB at 1 GB/s + 60 s engine start
    assert startup_s(70e9, AutoscalePolicy()) == pytest.approx(250.0)


@pytest.mark.parametrize("startup", [0.0, -5.0, 3601.0, math.inf])
def test_startup_out_of_range_is_refused(startup: float) -> None:
    with pytest.raises(ConfigError, match="start-up"):
        _rule(startup=startup)


@pytest.mark.parametrize("k", [2.0, 3.0, 5.0])
def test_a_longer_startup_never_lowers_min_replicas_or_raises_the_target(k: float) -> None:
    prof = DiurnalProfile(mean_rate_per_s=30.0, peak_to_trough=k)
    rules = [_rule(profile=prof, startup=s) for s in (30.0, 120.0, 600.0, 1800.0, 3600.0)]
    for a, b in zip(rules, rules[1:]):
        assert b.target_per_replica_per_s <= a.target_per_replica_per_s
        assert b.min_replicas >= a.min_replicas and b.max_replicas >= a.max_replicas


@pytest.mark.parametrize("seed", range(5))
def test_constant_traffic_keeps_a_constant_replica_count(seed: int) -> None:
    """Poisson at a constant 20 req/s: the 60 s window's rate moves by ~3%, inside the HPA's 10% tolerance."""
    rule = dataclasses.replace(_rule(), min_replicas=1, max_replicas=20)
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / 20.0, size=int(20 * 7200)))
    reps, flaps, events = controller(rule, arr, 7200.0)
    assert flaps == 0 and events == 0 and len(reps) == 3


def test_replay_meets_the_slo_and_costs_between_ideal_and_static() -> None:
    """A 2-hour 3:1 'day' on the toy cost: the controller follows the rate, no window misses a loose SLO, and
    the GPU-hours sit between the ideal autoscaler's and the static plan's."""
    cost = LinearStepCost()
    pool = PoolSpec(cost=cost, limits=ToyLimits())
    prof = DiurnalProfile(mean_rate_per_s=6.0, peak_to_trough=3.0, peak_hour=1.0, period_s=7200.0)
    day = poisson_day(prof, np.array([500]), np.array([50]), seed=3)
    rule = derive_rule(capacity_per_s=2.0, profile=prof, startup=60.0,
                       policy=dataclasses.replace(AutoscalePolicy(), min_scale_down_stabilisation_s=300.0),
                       gpus_per_replica=1, model_name="m", arrival_s=day.arrival_s)
    static = rule.max_replicas
    cert = replay(pool, rule, day, prof, (Slo("ttft", 2.0), Slo("tpot", 0.1)), static_replicas=static,
                  slo_window_s=300.0)
    assert cert.windows == 24 and cert.attainment == 1.0 and cert.flaps == 0
    assert cert.max_replicas_seen > cert.min_replicas_seen                 # it did scale
    assert cert.ideal_gpu_hours <= cert.gpu_hours < cert.static_gpu_hours
    assert cert.static_gpu_hours == pytest.approx(static * 2.0)           # x replicas for 2 h


def test_a_replica_of_dp_ranks_serves_as_that_many_replicas_of_one_rank() -> None:
    """A data-parallel-attention engine is ``dp`` schedulers with their own batches and KV caches: one replica of two
    ranks deals its requests round-robin over them, so its SLO windows are exactly those of two one-rank replicas
    (the same round-robin partition), while it counts two ranks' GPUs as one replica's."""
    pool = PoolSpec(cost=LinearStepCost(), limits=ToyLimits())
    prof = DiurnalProfile(mean_rate_per_s=3.0, peak_to_trough=1.0, peak_hour=1.0, period_s=1800.0)
    day = poisson_day(prof, np.array([500]), np.array([50]), seed=1)
    policy = dataclasses.replace(AutoscalePolicy(), min_scale_down_stabilisation_s=300.0)
    slos = (Slo("ttft", 2.0), Slo("tpot", 0.1))

    def fixed(n: int, gpus: int) -> ScalingRule:
        rule = derive_rule(capacity_per_s=10.0, profile=prof, startup=60.0, policy=policy, gpus_per_replica=gpus,
                           model_name="m", arrival_s=day.arrival_s)
        return dataclasses.replace(rule, min_replicas=n, max_replicas=n)

    two_ranks = replay(pool, fixed(1, 2), day, prof, slos, static_replicas=1, slo_window_s=300.0, ranks_per_replica=2)
    two_replicas = replay(pool, fixed(2, 1), day, prof, slos, static_replicas=2, slo_window_s=300.0)
    assert two_ranks.worst_window == two_replicas.worst_window and two_ranks.windows_met == two_replicas.windows_met
    assert two_ranks.gpu_hours == pytest.approx(two_replicas.gpu_hours) == pytest.approx(2 * 0.5)  # 2 GPUs x 30 min
    one_rank = replay(pool, fixed(1, 2), day, prof, slos, static_replicas=1, slo_window_s=300.0)
    assert one_rank.worst_window["ttft_p90_s"] > two_ranks.worst_window["ttft_p90_s"]  # half the schedulers: slower


# -- the files: KEDA ScaledObject against KEDA's CRD schema, the HPA against Kubernetes' own ----------------
def _settings(**kw: object) -> object:
    from recommender.deploy.keda import AutoscalerSettings

    base = dict(min_replicas=2, max_replicas=7, target_per_replica_per_s=1.234, polling_s=15, metric_window_s=60,
                scale_down_stabilisation_s=900)
    base.update(kw)
    return AutoscalerSettings(**base)  # type: ignore[arg-type]


def test_autoscaler_files_validate_and_carry_the_rule() -> None:
    from pathlib import Path

    import kubernetes_validate
    import yaml

    from crd_schema import errors_of
    from recommender.deploy import build_spec
    from recommender.deploy.keda import render_autoscaler

    plan = Path(__file__).resolve().parents[1] / "examples" / "plans" / "chat.plan.json"
    spec = build_spec(str(plan), 1, plan_name="plan.json")
    files = render_autoscaler(spec, _settings())  # type: ignore[arg-type]
    (so,) = [d for d in yaml.safe_load_all(files["keda-scaledobject.yaml"]) if d]
    assert errors_of(so) == []
    s = so["spec"]
    assert (s["minReplicaCount"], s["maxReplicaCount"], s["pollingInterval"]) == (2, 7, 15)
    trig = s["triggers"][0]
    assert trig["metricType"] == "AverageValue" and trig["metadata"]["threshold"] == "1.234"
    assert trig["metadata"]["query"] == (f'sum(rate(vllm:request_success_total{{model_name="{spec.served_model_names[0]}"}}'
                                         f"[60s]))")
    assert s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 900
    (h,) = [d for d in yaml.safe_load_all(files["hpa.yaml"]) if d]
    kubernetes_validate.validate(h, kubernetes_validate.latest_version(), strict=True)
    assert h["spec"]["minReplicas"] == 2 and h["spec"]["maxReplicas"] == 7
    assert h["spec"]["scaleTargetRef"]["name"] == s["scaleTargetRef"]["name"]


@pytest.mark.parametrize("kw", [{"min_replicas": 0}, {"min_replicas": 8}, {"target_per_replica_per_s": 0.0},
                                {"prometheus_url": "file:///etc/passwd"}, {"prometheus_url": "http://p:9090\nkind: Secret"}])
def test_bad_autoscaler_settings_are_refused(kw: dict[str, object]) -> None:
    from recommender.errors import DeployError

    with pytest.raises(DeployError):
        _settings(**kw)


@pytest.mark.slow
def test_cli_plans_certifies_and_emits(tmp_path: object) -> None:
    """`recommend autoscale --emit`: the JSON carries min/max, the rule and the day's GPU-hours beside the static
    and ideal figures; the emitted KEDA object is the JSON's rule."""
    import json
    from pathlib import Path

    import yaml
    from typer.testing import CliRunner

    from recommender.cli import app

    d = Path(str(tmp_path))
    (d / "w.yaml").write_text(
        "name: tiny-day\nmodel: llama-3.1-8b\ntraffic: {arrival_rate: 0.3}\n"
        "prompt_tokens: {dist: constant, value: 500}\noutput_tokens: {dist: constant, value: 50}\n"
        "slo: [tpot=40ms]\ngpus: [l4]\nday: {peak_to_trough: 3, startup: 3min}\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["autoscale", "--workload", str(d / "w.yaml"), "--format", "json",
                                   "--emit", str(d / "out")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):res.stdout.rindex("}") + 1])
    pool = doc["pools"][0]
    assert 1 <= pool["min_replicas"] <= pool["max_replicas"]
    assert doc["rule"]["startup_s"] == 180.0
    day = doc["day"]
    assert day["ideal_gpu_hours"] <= day["gpu_hours"] <= day["static_gpu_hours"] + 1e-9
    so = yaml.safe_load((d / "out" / "keda-scaledobject.yaml").read_text(encoding="utf-8").split("---\n", 1)[1])
    assert so["spec"]["minReplicaCount"] == pool["min_replicas"]
    assert float(so["spec"]["triggers"][0]["metadata"]["threshold"]) == pytest.approx(
        doc["rule"]["target_per_replica_per_s"], rel=1e-3)
    assert so["spec"]["triggers"][0]["metadata"]["query"] == doc["rule"]["metric"]  # one rule, one query
    assert {"metric", "target_per_replica_per_s", "polling_s", "cooldown_s"} <= set(doc["rule"])
    # plan.json and k8s.yaml run the static peak plan the JSON names, not the search's count
    plan = json.loads((d / "out" / "plan.json").read_text(encoding="utf-8"))
    assert plan["plans"][0]["replicas"] == pool["static_replicas"] >= pool["search_replicas"]
    k8s = [o for o in yaml.safe_load_all((d / "out" / "k8s.yaml").read_text(encoding="utf-8"))
           if o and o.get("kind") == "Deployment"]
    assert [o["spec"]["replicas"] for o in k8s] == [pool["static_replicas"]]


def test_a_workload_without_a_day_block_is_one_line() -> None:
    from typer.testing import CliRunner

    from recommender.cli import app

    res = CliRunner().invoke(app, ["autoscale", "--workload", "examples/chat.yaml"])
    assert res.exit_code == 2 and "day:" in res.output and len(res.output.strip().splitlines()) == 1


# -- the burst factor, the hold, flaps on a bursty tiled trace (rule.py docstring) -----------------------------
def _steady_with_burst(period_s: float = 7200.0) -> np.ndarray:
    """1 req/s (at k + 0.5 s, off the poll instants) except the SLO window [3600, 3900) at 2 req/s."""
    base = np.arange(period_s) + 0.5
    base = base[(base < 3600.0) | (base >= 3900.0)]
    burst = 3600.25 + 0.5 * np.arange(600)
    return np.sort(np.concatenate([base, burst]))


def test_burst_factor_by_hand() -> None:
    """The window [3600, 3900) brings 2 req/s; its replicas were scaled on readings in
    [3600 + 300 - 900, 3600 - 15 - 100] = [3000, 3485], all 60 / 60 s = 1 req/s: ratio 2. Every other
    window's rate is 1 req/s against a held reading of at least 1: B = max = 2 (quantile 1)."""
    from recommender.autoscale.rule import burst_factor

    a = _steady_with_burst()
    kw = dict(period_s=7200.0, slo_window_s=300.0, polling_s=15.0, metric_window_s=60.0, hold_s=900.0, startup_s=100.0)
    assert burst_factor(a, **kw) == pytest.approx(2.0)  # type: ignore[arg-type]
    # a steady day has nothing to cover: B = 1
    assert burst_factor(np.arange(7200.0) + 0.5, **kw) == pytest.approx(1.0)  # type: ignore[arg-type]
    # the median window is a steady one
    assert burst_factor(a, **kw, quantile=0.5) == pytest.approx(1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(2))
def test_a_longer_startup_never_raises_the_target_with_the_days_arrivals(seed: int) -> None:
    """With arrivals, B's interval shrinks as start-up grows (every window's ratio grows), g grows: the
    target never rises, min replicas never fall."""
    prof = DiurnalProfile(mean_rate_per_s=2.0, peak_to_trough=3.0)
    a = tiled_trace_day(prof, np.cumsum(np.random.default_rng(seed).exponential(1.0, 3000)), np.ones(3000, int),
                        np.ones(3000, int), source="t").arrival_s
    rules = [derive_rule(capacity_per_s=1.5, profile=prof, startup=s, policy=AutoscalePolicy(), gpus_per_replica=1,
                         model_name="m", arrival_s=a) for s in (30.0, 120.0, 300.0, 500.0)]
    for x, y in zip(rules, rules[1:]):
        assert y.burst >= x.burst and y.target_per_replica_per_s <= x.target_per_replica_per_s
        assert y.min_replicas >= x.min_replicas


def _bursty_tile(n: int = 3600) -> np.ndarray:
    """A one-hour trace at 1 req/s whose minutes 20-35 run at 1.6x (times from 0, gaps 1 s / 1.6 s^-1)."""
    gaps = np.where((np.arange(n) > 1200) & (np.arange(n) < 1200 + 15 * 60 * 1.6), 1 / 1.6, 1.0)
    return np.cumsum(gaps) - gaps[0]


def test_holding_one_burst_period_leaves_no_flap_and_a_short_window_flaps() -> None:
    """A bursty hour tiled over a 3:1 day around 2 req/s: a tile lasts 3,600 requests / 1 req/s = 1 h at the
    trough. Held for that burst period (the rule's cooldown) the controller follows the diurnal trend only;
    held 900 s (the policy minimum, the burst period ignored) it follows the bursts up and down. Both rules
    come from the same arrivals; only the hold differs."""
    prof = DiurnalProfile(mean_rate_per_s=2.0, peak_to_trough=3.0)
    tile = _bursty_tile()
    day = tiled_trace_day(prof, tile, np.ones(tile.size, int), np.ones(tile.size, int), source="t")
    assert day.burst_period_s(prof) == pytest.approx(3600.0)  # tile requests / trough rate 1 req/s
    kw = dict(capacity_per_s=0.5, profile=prof, startup=120.0, policy=AutoscalePolicy(), gpus_per_replica=1,
              model_name="m", arrival_s=day.arrival_s)
    held = derive_rule(**kw, burst_period_s=day.burst_period_s(prof))  # type: ignore[arg-type]
    short = derive_rule(**kw)  # type: ignore[arg-type]
    assert held.cooldown_s == pytest.approx(3600.0) and short.cooldown_s == pytest.approx(900.0)
    _, flaps_held, _ = controller(held, day.arrival_s, DAY_S)
    _, flaps_short, _ = controller(short, day.arrival_s, DAY_S)
    assert flaps_held == 0 and flaps_short > 0


def test_a_cooldown_beyond_an_hour_is_held_in_the_query() -> None:
    """cooldown = max(900, burst period 2 h, ...) = 7200 s: 3600 s the HPA's window, 3600 s the query's hold."""
    r = _rule(burst_period_s=7200.0)
    assert (r.scale_down_stabilisation_s, r.metric_hold_s, r.cooldown_s) == (3600.0, 3600.0, 7200.0)
    assert r.metric == 'max_over_time(sum(rate(vllm:request_success_total{model_name="m"}[60s]))[3600s:15s])'


@pytest.mark.parametrize("seed", range(3))
def test_the_days_gpu_hours_never_fall_below_the_ideal_bound(seed: int) -> None:
    """A 2-hour 3:1 'day' on the toy cost, from a warm pool: autoscaled GPU-hours >= the ideal autoscaler's
    (ceil(lambda / c1) each minute, no start-up) and <= the static plan's."""
    prof = DiurnalProfile(mean_rate_per_s=4.0, peak_to_trough=3.0, peak_hour=float(seed * 8), period_s=7200.0)
    day = poisson_day(prof, np.array([400]), np.array([40]), seed=seed)
    rule = derive_rule(capacity_per_s=2.0, profile=prof, startup=60.0, policy=AutoscalePolicy(), gpus_per_replica=2,
                       model_name="m", arrival_s=day.arrival_s)
    cert = replay(PoolSpec(cost=LinearStepCost(), limits=ToyLimits()), rule, day, prof, (Slo("ttft", 5.0),),
                  static_replicas=rule.max_replicas)
    assert cert.ideal_gpu_hours <= cert.gpu_hours <= cert.static_gpu_hours + 1e-9


def test_stabilisation_above_the_hpa_limit_is_refused() -> None:
    from recommender.errors import DeployError

    with pytest.raises(DeployError, match="3600"):
        from recommender.deploy import build_spec
        from recommender.deploy.keda import rate_autoscaler

        rate_autoscaler(build_spec("examples/plans/chat.plan.json", 1), _settings(scale_down_stabilisation_s=3601))  # type: ignore[arg-type]


def test_a_held_rule_renders_one_query_in_both_files() -> None:
    """The hold goes into the ScaledObject's query and the adapter's metricsQuery; both validate."""
    from pathlib import Path

    import kubernetes_validate
    import yaml

    from crd_schema import errors_of
    from recommender.deploy import build_spec
    from recommender.deploy.keda import render_autoscaler

    spec = build_spec(str(Path(__file__).resolve().parents[1] / "examples" / "plans" / "chat.plan.json"), 1)
    files = render_autoscaler(spec, _settings(metric_hold_s=3405, scale_down_stabilisation_s=3600))  # type: ignore[arg-type]
    (so,) = [d for d in yaml.safe_load_all(files["keda-scaledobject.yaml"]) if d]
    assert errors_of(so) == []
    q = so["spec"]["triggers"][0]["metadata"]["query"]
    assert q.startswith("max_over_time(sum(rate(vllm:request_success_total{") and q.endswith("[60s]))[3405s:15s])")
    assert "max_over_time(sum(rate(<<.Series>>" in files["hpa.yaml"] and "[3405s:15s])" in files["hpa.yaml"]
    (h,) = [d for d in yaml.safe_load_all(files["hpa.yaml"]) if d]
    kubernetes_validate.validate(h, kubernetes_validate.latest_version(), strict=True)
    assert h["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 3600


@pytest.mark.parametrize(("day", "needle"), [("{startup: 0s}", "start-up"), ("{startup: 2h}", "start-up"),
                                              ("{peak_to_trough: -3}", "peak_to_trough"),
                                              ("{peak_hour: .nan}", "peak_hour")])
def test_a_bad_day_block_is_one_line(tmp_path: object, day: str, needle: str) -> None:
    from pathlib import Path

    from typer.testing import CliRunner

    from recommender.cli import app

    f = Path(str(tmp_path)) / "w.yaml"
    f.write_text("name: d\nmodel: llama-3.1-8b\ntraffic: {arrival_rate: 1}\nprompt_tokens: {dist: constant, value: 100}\n"
                 f"output_tokens: {{dist: constant, value: 10}}\nslo: [tpot=40ms]\ngpus: [l4]\nday: {day}\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["autoscale", "--workload", str(f)])
    assert res.exit_code != 0 and needle in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_the_example_days_plan_carries_the_rule_and_the_days_figures() -> None:
    """examples/autoscale/chat-day.autoscale.json (`recommend autoscale --workload examples/chat-day.yaml --format
    json --compare-static`): min/max per pool, the rule's metric / threshold / polling / cooldown, and the day's
    GPU-hours beside the static peak plan's and the ideal bound, consistent with each other."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "examples" / "autoscale" / "chat-day.autoscale.json")
                     .read_text(encoding="utf-8"))
    (pool,) = doc["pools"]
    assert 1 <= pool["min_replicas"] <= pool["max_replicas"] and pool["static_replicas"] >= pool["search_replicas"]
    r, day = doc["rule"], doc["day"]
    assert r["metric"].startswith("max_over_time(sum(rate(vllm:request_success_total{")
    assert r["cooldown_s"] == pytest.approx(r["metric_hold_s"] + r["scale_down_stabilisation_s"])
    assert r["scale_down_stabilisation_s"] <= 3600                         # the HPA's API limit
    # burst target = c1 / ((1 + tolerance) max(B, g)), from the file's own numbers; the target is at least that,
    # at most c1, and covers slo_window_goal = 0.99 (policies/autoscale.yaml) of the SLO windows
    assert r["burst_target_per_replica_per_s"] == pytest.approx(
        r["replica_capacity_per_s"] / ((1 + r["tolerance"]) * max(r["burst"], r["growth_within_delay"])), rel=1e-3)
    assert r["burst_target_per_replica_per_s"] <= r["target_per_replica_per_s"] <= r["replica_capacity_per_s"]
    assert r["window_coverage"] >= 0.99
    # min, max = ceil(trough / target), ceil(max(peak, highest reading) / target) >= ceil(peak / target)
    prof = doc["profile"]
    assert pool["min_replicas"] == max(1, math.ceil(prof["trough_rate_per_s"] / r["target_per_replica_per_s"]))
    assert pool["max_replicas"] >= math.ceil(prof["peak_rate_per_s"] / r["target_per_replica_per_s"])
    tp = doc["tp"]
    assert day["static_gpu_hours"] == pytest.approx(pool["static_replicas"] * tp * 24)   # x replicas x TP x 24 h
    assert day["ideal_gpu_hours"] <= day["gpu_hours"] <= day["static_gpu_hours"]
    assert day["vs_static"] == pytest.approx(day["gpu_hours"] / day["static_gpu_hours"], abs=1e-4)
