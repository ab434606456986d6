"""Issue 27 item 3: one cost vocabulary across commands.

``estimate --rate R`` on rank 1's configuration prices at R: usd_per_hour / (R x 3600 x (prompt + output)) x 1e6,
which is how the plan prices a row at the workload's rate, so the two agree within 1%. The report explains
a P/D plan pool by pool in the plan's own numbers (``recommender.render.pools``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recommender.cli import app
from recommender.plan import load_plan
from recommender.render.pools import pd_pool_text
from recommender.units import fmt_seconds

PLANS = Path(__file__).resolve().parent.parent / "examples" / "plans"


@pytest.mark.parametrize("name", ["chat", "code-completion", "rag"])
def test_estimate_at_the_plans_rate_gives_the_plans_cost_per_token(name: str) -> None:
    plan = load_plan(PLANS / f"{name}.plan.json")
    row, w = plan.rows[0], plan.workload
    assert not row.disaggregated and w.arrival_rate_per_s and w.prompt_tokens and w.output_tokens
    p = row.pools[0]
    prompt, output = round(w.prompt_tokens.mean), round(w.output_tokens.mean)
    res = CliRunner().invoke(app, [
        "estimate", "-m", w.model, "-g", p.gpu, "--tp", str(p.tp), "--replicas", str(p.replicas),
        "--weight-dtype", p.weight_dtype, "--kv-dtype", p.kv_dtype, "--max-num-seqs", str(p.max_num_seqs),
        "--max-num-batched-tokens", str(p.max_num_batched_tokens), "--prompt-tokens", str(prompt),
        "--output-tokens", str(output), "--price", str(p.usd_per_gpu_hour), "--rate", str(w.arrival_rate_per_s),
        "--format", "json"])
    assert res.exit_code == 0, res.output
    est = json.loads(res.stdout)
    # by hand: the plan's $/h over the tokens the rate brings
    usd = p.usd_per_gpu_hour * p.gpus
    assert est["usd_per_hour"] == pytest.approx(usd, rel=1e-9)
    assert est["usd_per_million_tokens"] == pytest.approx(
        usd / (w.arrival_rate_per_s * 3600 * (prompt + output)) * 1e6, rel=1e-9)
    assert est["usd_per_million_tokens"] == pytest.approx(row.usd_per_million_tokens, rel=0.01)
    assert est["usd_per_million_output_tokens"] == pytest.approx(row.usd_per_million_output_tokens, rel=0.01)


def test_the_report_explains_each_pd_pool_as_that_pool() -> None:
    from recommender.render.report import render_report

    # a P/D plan from the search (no example's rank 1 is P/D since KV links are priced by their path, #23)
    plan = load_plan(Path(__file__).parent / "data" / "plans" / "pd-rag-tpot30.plan.json")
    row = plan.rows[0]
    prefill, decode = row.pools
    assert row.disaggregated and prefill.role.value == "prefill"
    ptext, dtext = pd_pool_text(plan, row, prefill), pd_pool_text(plan, row, decode)
    rate, prompt = plan.workload.arrival_rate_per_s, plan.workload.prompt_tokens.mean  # type: ignore[union-attr]
    assert f"= {rate:.3g} prompts/s ({rate / prefill.replicas:.3g} per replica)" in ptext
    assert f"= {rate * prompt:,.0f} tok/s" in ptext
    assert f"TTFT {row.percentile}" in ptext and f"= {fmt_seconds(row.ttft_s)}" in ptext  # type: ignore[arg-type]
    shares = [float(x) for x in re.findall(r"= \$([0-9.]+) of the plan's", ptext + dtext)]
    assert sum(shares) == pytest.approx(row.usd_per_million_tokens, abs=1e-4)  # the two pools pay the whole plan
    # the prefill share of TTFT: its parts add up to the plan's TTFT
    parts = re.findall(r"= ([0-9.]+ (?:ms|s|µs)) \((\d+)% of TTFT\)", ptext)
    assert len(parts) == 3 and 98 <= sum(int(pc) for _, pc in parts) <= 102
    assert f"TPOT {row.percentile}" in dtext and f"= {fmt_seconds(row.tpot_s)}" in dtext  # type: ignore[arg-type]
    assert f"{decode.kv_capacity_tokens:,} tokens" in dtext and f"{row.output_tokens_per_s:,.0f} tok/s" in dtext
    html = render_report(plan)
    assert (f"Prefill pool: {prefill.replicas} x TP{prefill.tp} {prefill.gpu}" in html
            and f"Decode pool: {decode.replicas} x TP{decode.tp} {decode.gpu}" in html)
    # not the aggregated-engine walkthrough of each pool (its TTFT/TPOT/$ were not the plan's)
    assert "Decode step at batch" not in html.split('id="plan-1"')[1].split("</details>")[0]


def test_the_pd_walkthrough_shows_the_rows_own_link_and_its_handoff() -> None:
    # the KV transfer over the link the row was sized with (kv_link_model: 163,840 B/token of llama-3.1-70b fp8 KV,
    # PCIe5 64 GB/s, min(TP 1, TP 2) = 1 GPU, 2 ms), by hand for the mean prompt of 5,982.8 -> 5,983 tokens:
    # 5,983 x 163,840 / 64e9 + 0.002 = 17.32 ms; a plan sized with a handoff (handoff_s) shows it as its own part
    doc = json.loads((Path(__file__).parent / "data" / "plans" / "pd-rag-tpot30.plan.json").read_text())
    doc["plans"][0]["kv_link_model"]["handoff_s"] = 0.06
    plan = load_plan(doc)
    row = plan.rows[0]
    ptext = pd_pool_text(plan, row, row.pools[0])
    xfer = 5983 * 163840 / 64e9 + 0.002
    assert xfer == pytest.approx(0.01732, abs=1e-5)
    assert f"= {fmt_seconds(xfer)} (" in ptext and "KV transfer" in ptext
    assert f"= {fmt_seconds(0.06)} ({0.06 / row.ttft_s:.0%} of TTFT)" in ptext  # type: ignore[operator]
    parts = re.findall(r"= ([0-9.]+ (?:ms|s|µs)) \((\d+)% of TTFT\)", ptext)
    assert len(parts) == 4 and 97 <= sum(int(pc) for _, pc in parts) <= 103
