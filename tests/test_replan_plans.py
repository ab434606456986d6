"""The re-planner's typed plan helpers: shape comparison, description, checks, and plans stored as JSON
(history rows written by older versions still read through ``recommender.plan.load_plan``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from recommender.errors import ConfigError
from recommender.plan import load_plan, with_replicas
from recommender.replan import plans
from recommender.replan.history import History, runs
from recommender.replan.policy import Policy, decide
from test_replan_support import fake_plan, fake_plan_doc

DISAGG = Path(__file__).parent / "data" / "plans" / "disagg-llama70b-h200.json"  # P 2 x h200 TP2 + D 1 x TP4, $50.40/h
NOW = 100_000.0


def test_shape_ignores_what_follows_from_the_replica_count():
    four, nine = fake_plan(4, 4.8).top, fake_plan(9, 9.0).top
    assert plans.same_shape(four, nine) and not plans.same_deployment(four, nine)
    assert plans.same_deployment(four, fake_plan(4, 5.0).top)  # another sized rate, the same deployment
    assert not plans.same_shape(four, fake_plan(4, 4.8, tp=2).top)
    assert not plans.same_shape(four, fake_plan(4, 4.8, gpu="h200").top)
    longer = dataclasses.replace(four, max_model_len=32768)  # follows the observed lengths: rides along
    assert plans.same_shape(four, longer)
    fewer_seqs = dataclasses.replace(four, pools=(dataclasses.replace(four.pools[0], max_num_seqs=64),))
    assert not plans.same_shape(four, fewer_seqs)
    # rented pools: 3 TP1 replicas on 2-GPU instances rent 2, 6 rent 3; the instances follow the replicas
    rented = dict(gpus_per_instance=2, usd_per_instance_hour=5.0)
    three, six = fake_plan(3, 3.0, **rented).top, fake_plan(6, 6.0, **rented).top
    assert (three.instances, six.instances) == (2, 3) and plans.same_shape(three, six)
    dearer = fake_plan(3, 3.0, gpus_per_instance=2, usd_per_instance_hour=6.0).top
    assert not plans.same_shape(three, dearer)  # another offer is another deployment
    assert not plans.same_shape(three, four)  # rented vs not


def test_describe_and_cost_of_a_disaggregated_plan():
    plan = load_plan(DISAGG)
    assert plans.describe(plan) == "h200 P 2xTP2 + D 1xTP4 bf16/fp8 disaggregated ($50.40/h)"
    assert plans.usd_per_hour(plan) == 50.4
    # P 3 x TP2 + D 2 x TP4 = 14 GPUs of 8; no pool prices, so 50.40 x 14 / 8 = $88.20/h
    assert plans.describe(with_replicas(plan, (3, 2), "")) == "h200 P 3xTP2 + D 2xTP4 bf16/fp8 disaggregated ($88.20/h)"


def test_a_change_of_engine_settings_alone_names_them():
    """A re-plan onto the same GPUs with other engine limits read 'X -> X' (DeepSeek-R1 TP8 x PP2 on H100 at three
    times its rate: max_num_seqs 16 -> 128 and chunked prefill on, the same $98.48/h)."""
    four = fake_plan(4, 4.8)
    more = dataclasses.replace(four.top, pools=(dataclasses.replace(four.top.pools[0], max_num_seqs=128,
                                                                    chunked_prefill=False),))
    proposed = dataclasses.replace(four, rows=(more,))
    cur = plans.describe(four)
    assert plans.describe_change(four, proposed) == (f"{cur} -> {cur} (max_num_seqs {four.top.pools[0].max_num_seqs} "
                                                     f"-> 128, chunked prefill on -> off)")
    assert plans.describe_change(four, fake_plan(9, 9.0)) == f"{cur} -> {plans.describe(fake_plan(9, 9.0))}"
    piped = dataclasses.replace(four, rows=(dataclasses.replace(four.top, pools=(
        dataclasses.replace(four.top.pools[0], pp=2, num_speculative_tokens=1),)),))
    assert plans.describe(piped) == "h100-sxm tp1 pp2 mtp1 bf16/bf16 x4 replicas ($8.00/h)"  # PP and MTP named


def test_check_plan_names_what_is_missing(tmp_path):
    plan = fake_plan(2, 2.4)
    assert plans.check_plan(plan, "x") is plan
    with pytest.raises(ConfigError, match="x: not a plan"):
        plans.check_plan({"plans": []}, "x")
    unpriced = dataclasses.replace(plan, rows=(dataclasses.replace(plan.top, usd_per_hour=None),))
    with pytest.raises(ConfigError, match=r"x: plan '.*' \(rank 1\) has no usd_per_hour"):
        plans.check_plan(unpriced, "x")
    with pytest.raises(ConfigError, match="does not exist"):
        plans.load_current(tmp_path / "nope.json")


def _insert(h: History, t: float, proposed: object) -> None:
    """A history row as an older re-planner wrote it (its own plan JSON in the proposed column)."""
    with h.engine.begin() as conn:
        conn.execute(runs.insert().values(time_s=t, deployment="chat/llama-3.1-8b", decision="unchanged", wanted="down",
                                          reason="old", proposed=proposed, run_id=f"old{t:.0f}",
                                          window_start_s=t - 300.0, window_end_s=t))


def test_old_history_rows_with_dict_plan_json_are_read_through_load_plan(tmp_path):
    h = History(str(tmp_path / "h.db"))
    _insert(h, NOW - 600, fake_plan_doc(6, 6.0))  # a version-1 document, as the dict re-planner stored it
    _insert(h, NOW - 300, fake_plan_doc(5, 5.0))
    _insert(h, NOW - 900, {"plans": "not rows", "workload": {}})  # no longer a plan: no proposal
    past = [r.past() for r in h.list()]
    assert [p.proposed.top.replicas if p.proposed else None for p in past] == [5, 6, None]
    assert past[0].proposed == fake_plan(5, 5.0)
    # the policy uses them: 3 agreeing windows, the largest proposal of them (6 replicas, $12/h) is adopted
    d = decide(Policy(), current=fake_plan(8, 9.6), proposed=fake_plan(3, 3.0), risks=[], past=past, now_s=NOW,
               window=(NOW - 300.0, NOW))
    assert d.changed and d.plan.top.replicas == 6 and "saves 25.0%" in d.reason  # 1 - 12 / 16


def _with_pool(plan, **changes):
    """``plan`` with its rank-1 row's pools changed (every pool, by ``changes``), built by hand."""
    row = plan.top
    return dataclasses.replace(plan, rows=(dataclasses.replace(
        row, pools=tuple(dataclasses.replace(p, **changes) for p in row.pools)),))


def test_the_current_and_proposed_lines_show_every_setting_that_differs():
    """A re-plan that changed only max_num_seqs printed 'CHANGED (+0.00 USD/h)' above two identical lines: the
    lines must carry each plan's own value of every setting that differs, and the reason the change."""
    from recommender.cli.replan import render_result
    from recommender.replan.runner import EXIT_CHANGED, ReplanResult

    cur = fake_plan(4, 4.8)  # h100-sxm TP1 x4, max_num_seqs 256, max_num_batched_tokens 8192, bf16/bf16, $8.00/h
    seqs = _with_pool(cur, max_num_seqs=128)
    now, then = plans.describe_pair(cur, seqs)
    assert now == "h100-sxm tp1 bf16/bf16 x4 replicas ($8.00/h); max_num_seqs 256"
    assert then == "h100-sxm tp1 bf16/bf16 x4 replicas ($8.00/h); max_num_seqs 128"
    text = render_result(ReplanResult("changed", plans.describe_change(cur, seqs), cur, seqs, None, EXIT_CHANGED))
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith(("current", "proposed"))}
    assert "max_num_seqs 256" in lines["current"] and "max_num_seqs 128" in lines["proposed"]
    assert "CHANGED (+0.00 USD/h)" in text and "max_num_seqs 256 -> 128" in text

    # several at once, beside a change the description shows (replicas): each on its own plan's line
    many = _with_pool(fake_plan(6, 7.2), max_num_seqs=64, max_num_batched_tokens=16384, chunked_prefill=False,
                      gpu_memory_utilization=0.9, cuda_graphs=False)
    now, then = plans.describe_pair(cur, many)
    assert now.endswith("x4 replicas ($8.00/h); max_num_seqs 256, max_num_batched_tokens 8192, chunked prefill on, "
                        "gpu_memory_utilization 0.92, CUDA graphs on")
    assert then.endswith("x6 replicas ($12.00/h); max_num_seqs 64, max_num_batched_tokens 16384, chunked prefill off, "
                         "gpu_memory_utilization 0.9, CUDA graphs off")
    assert plans.describe_change(cur, many).endswith("(max_num_seqs 256 -> 64, max_num_batched_tokens 8192 -> 16384, "
                                                     "chunked prefill on -> off, gpu_memory_utilization 0.92 -> 0.9, "
                                                     "CUDA graphs on -> off)")

    # what the description shows (KV and weight dtype, TP, GPU) is in it, not repeated after it
    kv = _with_pool(cur, kv_dtype="fp8")
    assert plans.describe_pair(cur, kv) == ("h100-sxm tp1 bf16/bf16 x4 replicas ($8.00/h)",
                                            "h100-sxm tp1 bf16/fp8 x4 replicas ($8.00/h)")
    wt = _with_pool(cur, weight_dtype="fp8")
    assert plans.describe_pair(cur, wt)[1] == "h100-sxm tp1 fp8/bf16 x4 replicas ($8.00/h)"
    # TP2 x 4 = 8 GPUs at $2/GPU-hour = $16.00/h; another GPU
    assert plans.describe_pair(cur, fake_plan(4, 4.8, tp=2))[1] == "h100-sxm tp2 bf16/bf16 x4 replicas ($16.00/h)"
    assert plans.describe_pair(cur, fake_plan(4, 4.8, gpu="h200"))[1].startswith("h200 tp1 bf16/bf16 x4 replicas")
    # the same deployment: nothing after the description
    assert plans.describe_pair(cur, fake_plan(4, 5.0)) == (plans.describe(cur), plans.describe(cur))


def test_a_disaggregated_pair_names_the_pool_of_each_differing_setting():
    plan = load_plan(DISAGG)  # P 2 x h200 TP2 + D 1 x TP4, bf16/fp8, $50.40/h
    pre, dec = plan.top.pools
    other = dataclasses.replace(plan, rows=(dataclasses.replace(plan.top, pools=(
        dataclasses.replace(pre, kv_dtype="bf16" if pre.kv_dtype != "bf16" else "fp8"),
        dataclasses.replace(dec, max_num_seqs=dec.max_num_seqs * 2))),))
    now, then = plans.describe_pair(plan, other)
    assert now.startswith("h200 P 2xTP2 + D 1xTP4 bf16/fp8 disaggregated ($50.40/h); ")
    assert f"P KV dtype {pre.kv_dtype}" in now and f"D max_num_seqs {dec.max_num_seqs}" in now
    assert f"D max_num_seqs {dec.max_num_seqs * 2}" in then
