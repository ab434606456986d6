"""Policy file parsing and the change decision (hand-built plans; fake plan cost = replicas x tp x $2/h)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recommender.errors import ConfigError
from recommender.plan import Plan
from recommender.replan.policy import PastRun, Policy, decide, load_policy, overlaps, policy_from_dict
from test_replan_support import fake_plan

POLICY_FILE = Path(__file__).parent.parent / "policies" / "replan.yaml"
NOW = 100_000.0


def test_shipped_policy_file_is_valid_and_matches_the_documented_defaults():
    p = load_policy(POLICY_FILE)
    assert p == Policy()
    assert (p.headroom, p.min_saving, p.cooldown_s, p.scale_down_windows) == (0.2, 0.10, 30 * 60, 3)
    assert (p.window_s, p.subwindow_s, p.lookback_s, p.min_scrape_interval_s) == (900, 60, 3600, 30)


def test_policy_durations_and_errors_name_the_field(tmp_path):
    p = policy_from_dict({"cooldown": "1h", "window": 600, "metrics": {"min_scrape_interval": "200ms"}})
    assert p.cooldown_s == 3600 and p.window_s == 600 and p.min_scrape_interval_s == pytest.approx(0.2)
    with pytest.raises(ConfigError, match=r"field 'forecast.method'"):
        policy_from_dict({"forecast": {"method": "median"}})
    with pytest.raises(ConfigError, match=r"field 'cooldwn'"):
        policy_from_dict({"cooldwn": "5m"})
    with pytest.raises(ConfigError, match="cooldown"):
        policy_from_dict({"cooldown": "five minutes"})
    with pytest.raises(ConfigError, match="subwindow must not exceed window"):
        policy_from_dict({"window": "1m", "forecast": {"subwindow": "5m"}})
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy(tmp_path / "nope.yaml")


def run(kind: str, t: float, wanted: str = "", proposed: Plan | None = None,
        window: tuple[float, float] | None = None) -> PastRun:
    """An earlier run over the 5 minutes before ``t`` (its own, new data) unless ``window`` says otherwise."""
    return PastRun(t, kind, wanted, proposed, window if window is not None else (t - 300.0, t))


HERE = (NOW - 300.0, NOW)  # this run's window


def test_same_deployment_is_unchanged():
    d = decide(Policy(), current=fake_plan(4, 4.8), proposed=fake_plan(4, 5.0), risks=[], past=[], now_s=NOW)
    assert not d.changed and d.wanted == "none" and "proposes the current deployment" in d.reason


def test_at_risk_acts_now_in_any_direction_and_not_at_risk_never_scales_up():
    cur, up = fake_plan(4, 4.8), fake_plan(6, 6.0)
    recent = [run("changed", NOW - 600, "down")]  # 10 min ago; cooldown 30 min
    d = decide(Policy(), current=cur, proposed=up, risks=[], past=recent, now_s=NOW, window=HERE)
    assert not d.changed and "meets the forecast under the model; not switching to the dearer" in d.reason
    risk = ["predicted tpot p90 41.87 ms > 30.00 ms SLO at 10.50 req/s"]
    d = decide(Policy(), current=cur, proposed=up, risks=risk, past=recent, now_s=NOW, window=HERE,
               proposal_meets="tpot p90 25.00 ms, utilisation 0.61")
    assert d.changed and d.wanted == "up" and d.plan.top.replicas == 6
    assert d.reason.startswith("SLO at risk: predicted tpot p90 41.87 ms > 30.00 ms SLO at 10.50 req/s; acting now")
    assert "(predicted at the forecast: tpot p90 25.00 ms, utilisation 0.61)" in d.reason
    # the case: at risk, the proposal costs the same or less -> taken at once (no windows, no cooldown)
    for other in (fake_plan(2, 2.0, tp=2), fake_plan(1, 2.0, tp=2)):
        d = decide(Policy(), current=cur, proposed=other, risks=risk, past=recent, now_s=NOW, window=HERE)
        assert d.changed and d.plan.top.tp == 2
    # ... unless the model says the proposal misses too
    d = decide(Policy(), current=cur, proposed=up, risks=risk, past=[], now_s=NOW, window=HERE, proposal_meets=None)
    assert not d.changed and "misses the forecast too" in d.reason
    # at risk, a same-shape scale-up is not capped (a capped plan would still miss)
    d = decide(Policy(max_replica_change=1), current=cur, proposed=fake_plan(9, 9.0), risks=risk, past=[], now_s=NOW)
    assert d.changed and d.plan.top.replicas == 9


def test_scale_down_needs_agreeing_windows_of_new_data_saving_and_no_risk():
    cur, down = fake_plan(8, 9.6), fake_plan(4, 4.8)  # saves 50%
    pol = Policy()
    d = decide(pol, current=cur, proposed=down, risks=[], past=[], now_s=NOW, window=HERE)
    assert not d.changed and d.wanted == "down" and "1 of 3" in d.reason
    past = [run("unchanged", NOW - 300, "down", fake_plan(4, 4.8))]
    assert "2 of 3" in decide(pol, current=cur, proposed=down, risks=[], past=past, now_s=NOW, window=HERE).reason
    # an 'up' / 'none' run breaks the streak; error / insufficient-data runs ('' wanted) neither count nor break
    broken = [run("unchanged", NOW - 300, "down", down), run("unchanged", NOW - 600, "none", cur),
              run("unchanged", NOW - 900, "down", down)]
    assert "2 of 3" in decide(pol, current=cur, proposed=down, risks=[], past=broken, now_s=NOW, window=HERE).reason
    neutral = [run("unchanged", NOW - 300, "down", down), run("error", NOW - 600, ""),
               run("unchanged", NOW - 900, "down", down)]
    d = decide(pol, current=cur, proposed=down, risks=[], past=neutral, now_s=NOW, window=HERE)
    assert d.changed and d.plan.top.replicas == 4
    # NOW = 100,000 s = 1970-01-02 03:46:40 UTC; the runs at NOW - 900 and NOW - 300 saw the 5 min before them
    assert "3 windows of new data agree (1970-01-02 03:26:40-03:31:40, 1970-01-02 03:36:40-03:41:40, " \
           "1970-01-02 03:41:40-03:46:40 UTC)" in d.reason
    d = decide(pol, current=cur, proposed=down, risks=["predicted ttft p99 ..."], past=neutral, now_s=NOW, window=HERE)
    assert d.changed and "SLO at risk" in d.reason  # at risk, a cheaper plan that meets the forecast is taken


def test_the_same_data_seen_again_is_not_a_new_window():
    cur, down = fake_plan(8, 9.6), fake_plan(4, 4.8)
    pol = Policy()
    same = [run("unchanged", NOW - 10, "down", down, window=HERE), run("unchanged", NOW - 20, "down", down, window=HERE)]
    d = decide(pol, current=cur, proposed=down, risks=[], past=same, now_s=NOW, window=HERE)
    assert not d.changed and "1 of 3" in d.reason and "2 earlier run(s) over the same data not counted" in d.reason
    # 15-min windows every 5 min overlap by 10 min: only every third one is new data
    sliding = [run("unchanged", NOW - 300 * k, "down", down, window=(NOW - 300 * k - 900, NOW - 300 * k))
               for k in range(1, 6)]
    d = decide(pol, current=cur, proposed=down, risks=[], past=sliding, now_s=NOW, window=(NOW - 900, NOW))
    assert not d.changed and "2 of 3" in d.reason
    d = decide(pol, current=cur, proposed=down, risks=[], past=sliding + [run("unchanged", NOW - 1800, "down", down,
               window=(NOW - 2700, NOW - 1800))], now_s=NOW, window=(NOW - 900, NOW))
    assert d.changed
    # a run whose window is unknown (an older history row) is not evidence either
    unknown = [PastRun(NOW - 300 * k, "unchanged", "down", down, None) for k in (1, 2)]
    assert "1 of 3" in decide(pol, current=cur, proposed=down, risks=[], past=unknown, now_s=NOW, window=HERE).reason
    # touching windows are not overlapping; 2% of a window is tolerated, more is not
    assert not overlaps((0, 900), (900, 1800)) and not overlaps((0, 900), (882, 1800))
    assert overlaps((0, 900), (880, 1800)) and overlaps((0, 900), (0, 900))


def test_scale_down_adopts_the_largest_proposal_of_the_agreeing_windows():
    cur = fake_plan(8, 9.6)
    past = [run("unchanged", NOW - 300, "down", fake_plan(6, 6.0)), run("unchanged", NOW - 600, "down", fake_plan(5, 5.0))]
    d = decide(Policy(), current=cur, proposed=fake_plan(3, 3.0), risks=[], past=past, now_s=NOW, window=HERE)
    assert d.changed and d.plan.top.replicas == 6 and "largest plan of the last 3 windows" in d.reason
    # ... and not while the last change is within the cooldown
    past_cd = past + [run("changed", NOW - 900, "up")]
    d = decide(Policy(), current=cur, proposed=fake_plan(3, 3.0), risks=[], past=past_cd, now_s=NOW, window=HERE)
    assert not d.changed and "15 min of cooldown left" in d.reason


def test_small_saving_is_not_worth_a_switch():
    d = decide(Policy(), current=fake_plan(12, 12.0), proposed=fake_plan(11, 11.0), risks=[], past=[], now_s=NOW)
    assert not d.changed and d.wanted == "none" and "save 8.3%" in d.reason  # 1 of 12 replicas


def test_replica_step_cap_applies_to_same_shape_changes_only():
    agree = [run("unchanged", NOW - 300, "down", fake_plan(2, 2.0)), run("unchanged", NOW - 600, "down", fake_plan(2, 2.0))]
    d = decide(Policy(max_replica_change=4), current=fake_plan(12, 12.0), proposed=fake_plan(2, 2.4), risks=[],
               past=agree, now_s=NOW, window=HERE)
    row = d.plan.top
    assert d.changed and row.replicas == 8 and row.gpus_total == 8 and row.pools[0].replicas == 8
    assert row.usd_per_hour == pytest.approx(8 * 2.0)  # scaled from 2 replicas' $4/h
    assert d.plan.workload.arrival_rate_per_s == pytest.approx(2.4 * 8 / 2)  # what 8 replicas serve
    assert row.id.endswith("-r8") and "capped at 4" in row.quality_note
    other = fake_plan(1, 2.0, tp=4)  # a different shape (tp 4): a new deployment, not capped
    d = decide(Policy(max_replica_change=1), current=fake_plan(12, 12.0), proposed=other, risks=[], past=agree,
               now_s=NOW, window=HERE)
    assert d.changed and d.plan.top.replicas == 1


def test_a_capped_step_re_rents_whole_instances():
    """Pools rented as 2-GPU instances at $5/instance-hour: 12 TP1 replicas = 6 instances ($30/h); the planner
    asks for 2 replicas (1 instance, $5/h); the cap of 3 replicas per step keeps 9 replicas = ceil(9 / 2) = 5
    instances = $25/h (scaling the proposal's $5/h by GPUs, 5 x 9 / 2 = $22.50/h, would price half an instance)."""
    rented = dict(gpus_per_instance=2, usd_per_instance_hour=5.0)
    cur = fake_plan(12, 12.0, **rented)
    agree = [run("unchanged", NOW - 300, "down", fake_plan(2, 2.0, **rented)),
             run("unchanged", NOW - 600, "down", fake_plan(2, 2.0, **rented))]
    d = decide(Policy(max_replica_change=3), current=cur, proposed=fake_plan(2, 2.4, **rented), risks=[], past=agree,
               now_s=NOW, window=HERE)
    row = d.plan.top
    assert d.changed and row.replicas == 9 and row.instances == 5
    assert row.usd_per_hour == pytest.approx(5 * 5.0)
    assert "$30.00/h) -> h100-sxm tp1 bf16/bf16 x9 replicas ($25.00/h) saves 16.7%" in d.reason  # 1 - 25 / 30
