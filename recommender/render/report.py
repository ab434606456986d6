"""``--report FILE.html``: one self-contained page about a plan (no network: plotly's JS is inlined).

Sections: the question (workload, SLOs), the Pareto chart (:mod:`recommender.render.figure`), the ranked
table, why rank 1 wins, then per plan its ``recommend estimate`` walkthrough (per pool) and its simulated
against analytic percentiles, and the workload's length distributions.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from recommender.errors import RecommenderError
from recommender.offers import OWNED_PROVIDER
from recommender.plan import Plan, PlanRow, Pool
from recommender.profiles import EngineProfile
from recommender.render.figure import pareto_figure
from recommender.render.plan import (
    job_line,
    latency_band_cells,
    plan_table_rows,
    render_table,
    search_footer,
    sensitivity_line,
    table_headers,
    verified_line,
)
from recommender.units import fmt_seconds

CHART_ID = "pareto"
_PCTS = ("mean", "p50", "p90", "p95", "p99")
_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1280px;padding:0 16px;color:#1f2328}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.lede{color:#57606a;margin:0 0 12px} table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:right;white-space:nowrap} th{background:#f6f8fa}
td:nth-child(2),th:nth-child(2){text-align:left} pre{background:#f6f8fa;padding:10px;overflow-x:auto;font-size:12px}
details{margin:8px 0;border:1px solid #d0d7de;border-radius:6px;padding:6px 10px} summary{cursor:pointer;font-weight:600}
.scroll{overflow-x:auto} .note{color:#57606a;font-size:13px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _table(headers: list[str], rows: list[list[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _percentile_table(row: PlanRow) -> str:
    """Analytic (the search's load model) against simulated (discrete-event) percentiles, per metric."""
    lat = row.latency_percentiles
    sim = row.simulated or {}
    rows = []
    for metric in ("ttft", "tpot", "e2e"):
        a = lat.get(metric, {})
        s = sim.get(f"{metric}_s", {})
        rows.append([metric.upper(), "analytic", *(fmt_seconds(a[p]) if p in a else "-" for p in _PCTS)])
        if s:
            rows.append([metric.upper(), "simulated", *(fmt_seconds(s[p]) if p in s else "-" for p in _PCTS)])
    out = _table(["metric", "model", *_PCTS], rows)
    if not sim:
        out += '<p class="note">Not simulated (verification off for this row).</p>'
    else:
        out += (f'<p class="note">Simulated: {sim.get("completed", "?")} requests through the scheduler simulator, '
                f'{sim.get("preempted", 0)} preemptions.</p>')
    return out


def _walkthrough(plan: Plan, row: PlanRow, profile: EngineProfile | None) -> str:
    """The ``recommend estimate`` walkthrough of each pool at the workload's mean lengths, KV-capacity load."""
    from recommender.estimator import Pricing, conditions_of, estimate_request
    from recommender.render.estimate import render_walkthrough
    from recommender.render.pool_estimate import estimate_command, pool_request

    w = plan.workload
    prompt = max(1, round(w.prompt_tokens.mean)) if w.prompt_tokens else 1
    output = max(1, round(w.output_tokens.mean)) if w.output_tokens else 1
    parts = []
    if row.disaggregated:  # each pool as that pool, in the plan's numbers (not as two aggregated engines)
        from recommender.render.pools import pd_pool_text

        for pool in row.pools:
            parts.append(f"<pre>{_e(pd_pool_text(plan, row, pool))}</pre>")
        return "".join(parts)
    for pool in row.pools:
        role = pool.role.value
        # the pool's own cost (whole instances of its rented offer), per GPU it runs
        price = (pool.usd_per_hour or 0.0) / pool.gpus
        out_tokens = 1 if role == "prefill" else output
        req = pool_request(plan, row, pool, prompt_tokens=prompt, output_tokens=out_tokens, usd_per_gpu_hour=price)
        cmd = estimate_command(req)
        try:
            dep, load, est = estimate_request(req, profile=profile)
            basis, source = _pool_price_basis(pool, price)
            pricing = Pricing(usd_per_hour=est.usd_per_hour, gpus=pool.gpus, source=source, basis=basis)
            text = render_walkthrough(dep, load, est, pool.replicas, pricing, conditions_of(dep).lines())
        except RecommenderError as e:
            text = f"(no walkthrough: {e})"
        title = {"both": "", "prefill": "Prefill pool: ", "decode": "Decode pool: "}.get(role, role)
        parts.append(f"<p><b>{_e(title)}</b><code>{_e(cmd)}</code></p><pre>{_e(text)}</pre>")
    return "".join(parts)


def _pool_price_basis(pool: Pool, usd_per_gpu_hour: float) -> tuple[str, str]:
    """(basis, source) of a pool's hourly price for its walkthrough's Cost section, as the plan bills it: whole
    instances of its rented offer, or per GPU in use (owned nodes, ``--inventory``; an offer billed per GPU), where
    the rental's instance price is not what the pool pays."""
    r = pool.rental
    if r is None:
        return f"${usd_per_gpu_hour:g}/GPU-hour x {pool.gpus} GPUs", "the plan's price per GPU-hour"
    nodes = f"{r.instances} {r.provider} {r.gpus_per_instance}-GPU node{'s' if r.instances > 1 else ''}"
    if r.provider == OWNED_PROVIDER:
        return (f"${usd_per_gpu_hour:,.2f}/GPU-hour x {pool.gpus} GPUs in use (of {nodes})",
                "owned GPUs" + (f": {r.offer.source}" if r.offer.source else ""))
    facts = ", ".join(x for x in (repr(r.offer.sku) if r.offer.sku else "", f"{r.gpus_per_instance}-GPU instances",
                                   r.offer.date, r.offer.source) if x)
    source = f"the plan's rented offer: {r.provider} {facts}"
    if r.offer.per_gpu_billing:
        return f"${usd_per_gpu_hour:,.2f}/GPU-hour x {pool.gpus} GPUs (billed per GPU)", source
    return (f"{r.instances} x {r.provider} {r.gpus_per_instance}-GPU instance{'s' if r.instances > 1 else ''} "
            f"at ${r.usd_per_instance_hour:,.2f}/h"), source


def _bands_section(row: PlanRow) -> str:
    """The row's p10-p90 bands and P(SLO met) (docs/bands.md), or '' without bands."""
    b = row.bands
    if not b:
        return ""
    cells = latency_band_cells(b)
    cap = b.get("capacity_per_s")
    if cap:
        cells.append(f"capacity {cap[0]:.3g} - {cap[1]:.3g} req/s")
    each = ", ".join(f"{k} {v:.2f}" for k, v in (b.get("p_slo_each") or {}).items())
    p = b.get("p_slo")
    # TTFT's own error (sigma_ttft) sets its band apart from the step-time error, as estimate's 'Expected error' says
    ttft = f", TTFT {b['sigma_ttft']}" if b.get("sigma_ttft") is not None else ""
    return (f"<h3>Error band (p10-p90) and P(SLO met)</h3><p>Evidence class {_e(str(b.get('class')))} "
            f"({b.get('class_rows', 0)} rows, log-sd {b.get('sigma')}{ttft}): {_e('; '.join(cells))}. "
            f"P(all SLOs met) {'-' if p is None else f'{p:.2f}'}{_e(f' ({each})' if each else '')}.</p>")


def _plan_details(plan: Plan, row: PlanRow, profile: EngineProfile | None) -> str:
    head = (f"#{row.rank} {row.label()}, {row.weight_dtype}/{row.kv_dtype}: "
            f"${row.usd_per_million_tokens or math.inf:.3f}/M tokens, ${row.usd_per_hour or math.inf:,.2f}/h, "
            f"binding {row.binding}")
    return (f'<details{" open" if row.rank == 1 else ""} id="plan-{row.rank}"><summary>{_e(head)}</summary>'
            f"<h3>Percentiles at the workload's rate</h3>{_percentile_table(row)}{_bands_section(row)}"
            f"<h3>Estimate walkthrough</h3><p class='note'>`recommend estimate` of each pool at the workload's mean "
            f"lengths and as many requests in flight as KV capacity and max_num_seqs allow (its capacity); the "
            f"percentiles above are at the workload's rate.</p>{_walkthrough(plan, row, profile)}</details>")


def _workload_section(plan: Plan) -> str:
    w = plan.workload
    rows = []
    for name, d in (("prompt tokens", w.prompt_tokens), ("output tokens", w.output_tokens)):
        if d is not None:
            rows.append([name, d.dist, f"{d.mean:,.0f}",
                         *("-" if v is None else f"{v:,}" for v in (d.p50, d.p90, d.p99, d.min, d.max))])
    traffic = (f"{w.arrival_rate_per_s:g} requests/s" if w.arrival_rate_per_s
               else f"offline: {w.offline_requests:,} requests within {fmt_seconds(w.deadline_s or math.nan)}")
    facts = [["model", f"{w.model} ({w.hf_repo or 'local config'})"], ["traffic", traffic],
             ["SLOs", ", ".join(str(s) for s in plan.slos) or "none (cost only)"],
             ["shared prefix", f"{w.shared_prefix_fraction:.0%}"],
             ["max model length", f"{w.max_model_len:,} tokens" if w.max_model_len else "-"],
             ["GPUs allowed", ", ".join(w.gpus) if w.gpus else "every priced catalog GPU"],
             ["source", w.source or "-"]]
    return (_table(["", ""], facts) +
            _table(["lengths", "distribution", "mean", "p50", "p90", "p99", "min", "max"], rows))


def render_report(plan: Plan, *, profile: EngineProfile | None = None) -> str:
    """The whole page as one string (plotly's JS inlined once in the head)."""
    from plotly.offline import get_plotlyjs

    fig = pareto_figure(plan)
    chart = fig.to_html(full_html=False, include_plotlyjs=False, div_id=CHART_ID,
                        config={"displaylogo": False, "responsive": True})
    summary = render_table(plan).split("\n\n", 1)[0]
    ranked = _table(table_headers(plan), plan_table_rows(plan), "ranked")
    m = plan.search
    # the text table's own account of the search (trials asked, whether rank 1 is proven the cheapest), not a
    # shorter one: a report read alone must carry 'rank 1 NOT proven cheapest: raise --trials' as the table does
    foot = (f"{search_footer(m)}; {m.evaluations} configurations evaluated; replicas sized for +{m.headroom:.0%} "
            f"headroom; latencies at the workload's rate. Check a plan on your cluster: "
            f"recommend deploy PLAN.json --rank N --format bench writes the vllm bench serve runs and the "
            f"recommend calibrate command that feeds the results back.")
    # what the text table's footer says beside it: where the prices come from (owned GPUs without a price count
    # GPU-hours as dollars), the offline job, what verification changed, how far rank 1 holds
    more = [f"Prices: {m.pricing}." if m.pricing else "", job_line(plan), verified_line(plan), sensitivity_line(plan)]
    foot += "".join(f" {x}" for x in more if x)
    details = "".join(_plan_details(plan, r, profile) for r in plan.rows)
    title = f"{plan.workload.model} / {plan.workload.name}: deployment plan"
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
        f"<meta name='viewport' content='width=device-width,initial-scale=1'><style>{_CSS}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>{_e(title)}</h1><p class='lede'>{_e(summary)}</p>"
        f"<h2>Cost against each SLO metric</h2>"
        f"<p class='note'>Grey: every feasible configuration the search evaluated; line: the Pareto front; blue: "
        f"the ranked plans (star = rank 1). Hover a point for its details; drag to zoom, double-click to reset.</p>"
        f"{chart}<h2>Ranked plans</h2>{ranked}<p>{_e(plan.why)}</p><p class='note'>{_e(foot)}</p>"
        f"<h2>Each plan</h2>{details}<h2>Workload</h2>{_workload_section(plan)}</body></html>"
    )


def write_report(path: str, plan: Plan, *, profile: EngineProfile | None = None) -> None:
    """Write :func:`render_report` to ``path`` atomically."""
    from recommender.atomic import atomic_write_text

    atomic_write_text(Path(path), render_report(plan, profile=profile))
