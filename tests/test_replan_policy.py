"""Policy file parsing and the change decision (hand-built plans; fake plan cost = replicas x tp x $2/h)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recommender.errors import ConfigError
from recommender.replan import plans
from recommender.replan.policy import PastRun, Policy, decide, load_policy, policy_from_dict
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


def run(kind: str, t: float, wanted: str = "", proposed: dict | None = None) -> PastRun:
    return PastRun(t, kind, wanted, proposed)


def test_same_deployment_is_unchanged():
    d = decide(Policy(), current=fake_plan(4, 4.8), proposed=fake_plan(4, 5.0), risks=[], past=[], now_s=NOW)
    assert not d.changed and d.wanted == "none" and "proposes the current deployment" in d.reason


def test_scale_up_waits_for_the_cooldown_unless_an_slo_is_at_risk():
    cur, up = fake_plan(4, 4.8), fake_plan(6, 6.0)
    recent = [run("changed", NOW - 600, "down")]  # 10 min ago; cooldown 30 min
    d = decide(Policy(), current=cur, proposed=up, risks=[], past=recent, now_s=NOW)
    assert not d.changed and d.wanted == "up" and "20 min left" in d.reason
    d = decide(Policy(), current=cur, proposed=up, risks=["observed ttft p99 2500 ms > 2000 ms SLO"], past=recent,
               now_s=NOW)
    assert d.changed and plans.top(d.plan)["replicas"] == 6 and d.reason.startswith("SLO risk: observed ttft")
    d = decide(Policy(), current=cur, proposed=up, risks=[], past=[run("changed", NOW - 1800, "down")], now_s=NOW)
    assert d.changed  # exactly one cooldown later


def test_scale_down_needs_agreeing_windows_saving_and_no_risk():
    cur, down = fake_plan(8, 9.6), fake_plan(4, 4.8)  # saves 50%
    pol = Policy()
    d = decide(pol, current=cur, proposed=down, risks=[], past=[], now_s=NOW)
    assert not d.changed and d.wanted == "down" and "1 of 3" in d.reason
    past = [run("unchanged", NOW - 300, "down", fake_plan(4, 4.8))]
    assert "2 of 3" in decide(pol, current=cur, proposed=down, risks=[], past=past, now_s=NOW).reason
    # an 'up' / 'none' run breaks the streak; error / insufficient-data runs ('' wanted) neither count nor break
    broken = [run("unchanged", NOW - 300, "down", down), run("unchanged", NOW - 600, "none", cur),
              run("unchanged", NOW - 900, "down", down)]
    assert "2 of 3" in decide(pol, current=cur, proposed=down, risks=[], past=broken, now_s=NOW).reason
    neutral = [run("unchanged", NOW - 300, "down", down), run("error", NOW - 600, ""),
               run("unchanged", NOW - 900, "down", down)]
    d = decide(pol, current=cur, proposed=down, risks=[], past=neutral, now_s=NOW)
    assert d.changed and plans.top(d.plan)["replicas"] == 4
    d = decide(pol, current=cur, proposed=down, risks=["forecast 9 req/s exceeds ..."], past=neutral, now_s=NOW)
    assert not d.changed and "not switching" in d.reason


def test_scale_down_adopts_the_largest_proposal_of_the_agreeing_windows():
    cur = fake_plan(8, 9.6)
    past = [run("unchanged", NOW - 300, "down", fake_plan(6, 6.0)), run("unchanged", NOW - 600, "down", fake_plan(5, 5.0))]
    d = decide(Policy(), current=cur, proposed=fake_plan(3, 3.0), risks=[], past=past, now_s=NOW)
    assert d.changed and plans.top(d.plan)["replicas"] == 6 and "largest plan of the last 3 windows" in d.reason
    # ... and not while the last change is within the cooldown
    past_cd = past + [run("changed", NOW - 900, "up")]
    d = decide(Policy(), current=cur, proposed=fake_plan(3, 3.0), risks=[], past=past_cd, now_s=NOW)
    assert not d.changed and "15 min of cooldown left" in d.reason


def test_small_saving_is_not_worth_a_switch():
    d = decide(Policy(), current=fake_plan(12, 12.0), proposed=fake_plan(11, 11.0), risks=[], past=[], now_s=NOW)
    assert not d.changed and d.wanted == "none" and "save 8.3%" in d.reason  # 1 of 12 replicas


def test_replica_step_cap_applies_to_same_shape_changes_only():
    d = decide(Policy(max_replica_change=4), current=fake_plan(2, 2.4), proposed=fake_plan(12, 12.0), risks=[],
               past=[], now_s=NOW)
    row = plans.top(d.plan)
    assert d.changed and row["replicas"] == 6 and row["gpus_total"] == 6 and row["pools"][0]["replicas"] == 6
    assert row["usd_per_hour"] == pytest.approx(6 * 2.0)  # scaled from 12 replicas' $24/h
    assert d.plan["workload"]["arrival_rate_per_s"] == pytest.approx(12.0 * 6 / 12)  # what 6 replicas serve
    assert row["id"].endswith("-r6") and "capped at 4" in row["quality_note"]
    other = fake_plan(3, 12.0, tp=4)  # a different shape (tp 4): a new deployment, not capped
    d = decide(Policy(max_replica_change=1), current=fake_plan(2, 2.4), proposed=other, risks=[], past=[], now_s=NOW)
    assert d.changed and plans.top(d.plan)["replicas"] == 3


def test_with_replicas_on_a_disaggregated_plan():
    doc = fake_plan(2, 4.0)
    row = doc["plans"][0]
    row.update(disaggregated=True, tp=2, replicas=2, gpus_total=2 * 4 + 2 * 2, usd_per_hour=24.0)
    row["pools"] = [dict(row["pools"][0], role="prefill", tp=4, replicas=2), dict(row["pools"][0], role="decode", tp=2, replicas=2)]
    out = plans.with_replicas(doc, (3, 1), "note")
    r = plans.top(out)
    # GPUs: prefill 4 x 3 + decode 2 x 1 = 14 of 12 before -> cost 24 x 14 / 12 = 28
    assert plans.replicas(r) == (3, 1) and r["replicas"] == 1 and r["gpus_total"] == 14
    assert r["usd_per_hour"] == pytest.approx(28.0)
