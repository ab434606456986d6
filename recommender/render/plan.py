"""Plan renderers: table (tabulate), JSON, YAML, CSV. Pure string producers."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import yaml

from recommender.plan import Plan
from recommender.render.table import fit_table, wrap_text
from recommender.units import fmt_seconds

TABLE_HEADERS = ["rank", "deployment", "GPUs", "rent", "TP", "replicas", "weights/KV", "max seqs", "chunk",
                 "TTFT", "TPOT", "out tok/s", "util", "$/hour", "$/M out", "$/M tok", "binding", "note"]
#: Columns a narrow terminal loses first (first listed goes first); what stays at 80 columns is the compact set:
#: rank, deployment, GPUs, TP, replicas, weights/KV, TTFT, TPOT, $/M tok, binding.
DROP_ORDER = ["note", "$/M out", "util", "max seqs", "chunk", "out tok/s", "$/hour", "rent", "binding", "replicas", "TP"]


def _pct_label(plan: Plan, metric: str) -> str:
    for s in plan.workload.slos:
        if s.metric == metric:
            return s.percentile
    return plan.workload.slos[0].percentile if plan.workload.slos else "p90"


def plan_table_rows(plan: Plan) -> list[list[Any]]:
    rows = []
    tp_ttft, tp_tpot = _pct_label(plan, "ttft"), _pct_label(plan, "tpot")
    for r in plan.rows:
        ev, c = r.evaluation, r.candidate
        if c.disaggregated:
            p, d = ev.pools
            dep = f"P/D: {p.gpu} | {d.gpu}"
            tp = f"{p.tp}|{d.tp}"
            reps = f"{p.replicas}|{d.replicas}"
        else:
            p = ev.pools[0]
            dep, tp, reps = p.gpu, str(p.tp), str(p.replicas)
        chunk = str(ev.pools[0].limits.max_num_batched_tokens) if ev.pools[0].limits.chunked_prefill else "off"
        ttft = ev.latency("ttft", tp_ttft)
        tpot = ev.latency("tpot", tp_tpot)
        sim = ""
        if r.simulated:
            sim_ttft = r.simulated.get("ttft_s", {}).get(tp_ttft)
            sim_tpot = r.simulated.get("tpot_s", {}).get(tp_tpot)
            sim = " (sim {} / {})".format(fmt_seconds(sim_ttft) if sim_ttft is not None else "-",
                                          fmt_seconds(sim_tpot) if sim_tpot is not None else "-")
        pd = ""
        if r.pd_saving is not None:
            pd = "only P/D meets the SLOs" if r.pd_saving >= 1.0 else f"P/D {r.pd_saving:.0%} cheaper than best aggregated"
        unmeasured = ""
        if r.evidence is not None and not r.evidence.measured:
            unmeasured = f"unmeasured: {', '.join(r.evidence.unmeasured_families())}"
        note = "; ".join(x for x in (pd, unmeasured, r.quality_note, "" if r.pareto else "dominated", sim.strip()) if x)
        rows.append([
            r.rank, dep + ("" if r.pareto else ""), ev.gpus_total, rent_label(ev.pools), tp, reps,
            f"{c.weight_dtype}/{c.kv_dtype}", ev.pools[-1].limits.max_num_seqs, chunk,
            fmt_seconds(ttft), fmt_seconds(tpot), f"{ev.output_tokens_per_s:,.0f}", f"{ev.utilisation:.2f}",
            f"{ev.usd_per_hour:,.2f}", f"{ev.usd_per_million_output_tokens:.3f}", f"{ev.usd_per_million_tokens:.3f}",
            ev.binding, note,
        ])
    return rows


def search_footer(m: dict) -> str:
    """Trials run / asked, why the search stopped, and whether rank 1 is proven the cheapest in the space."""
    run, asked = m.get("trials_run", m.get("trials")), m.get("trials_asked")
    if m.get("stopped_by") == "timeout":
        head = f"{run} of {asked} trials asked: cut by the {m.get('timeout_s')} s timeout"
    elif m.get("stopped_by") == "trials":
        head = f"{run} of {asked} trials asked (all used)"
    elif m.get("search_complete"):
        head = f"{run} trials (search complete: every other configuration pruned by its bounds)"
    else:
        head = f"{run} trials (of up to {asked}; stopped once rank 1 was proven, Pareto front from these)"
    if m.get("trials", run) != run:
        head += f"; {m.get('trials')} trials in the study ranked"
    proof = "rank 1 proven cheapest in the space" if m.get("rank1_proven") else "rank 1 NOT proven cheapest: raise --trials"
    return f"{head}; {proof}; {m.get('seconds')} s (seed {m.get('seed')})"


def table_headers(plan: Plan) -> list[str]:
    """TABLE_HEADERS with the percentile the latencies are shown at ("TTFT p90")."""
    hdr = list(TABLE_HEADERS)
    hdr[hdr.index("TTFT")] = f"TTFT {_pct_label(plan, 'ttft')}"
    hdr[hdr.index("TPOT")] = f"TPOT {_pct_label(plan, 'tpot')}"
    return hdr


def render_table(plan: Plan, *, width: int | None = None) -> str:
    """The ranked table; with ``width`` (terminal columns) the least important columns are dropped to fit."""
    w = plan.workload
    rate = f"{w.arrival_rate_per_s:g} req/s" if w.arrival_rate_per_s else f"offline {w.offline_requests:,} requests in {fmt_seconds(w.deadline_s or 0)}"
    slos = ", ".join(str(s) for s in w.slos) or "none (cost only)"
    head = (f"{plan.model.id} | {w.name}: {rate}, prompt ~{w.prompt_tokens.mean:,.0f} tok "
            f"(p99 {w.prompt_tokens.quantile(0.99):,}), output ~{w.output_tokens.mean:,.0f} tok | SLO {slos} | "
            f"engine {plan.engine}")
    hdr = table_headers(plan)
    body, dropped = fit_table(hdr, plan_table_rows(plan), width=width, drop_order=DROP_ORDER)
    m = plan.meta
    foot = (f"{search_footer(m)}; replicas sized for +{m.get('headroom', 0):.0%} headroom; latencies at the workload's rate.")
    pricing = m.get("pricing")
    if pricing:
        foot += f"\nPrices: {pricing}."
    if dropped:
        foot += f"\n{len(dropped)} columns hidden to fit {width} columns ({', '.join(dropped)}); --wide shows all."
    lines = [wrap_text(head, width), "", body, "", wrap_text(plan.why, width), wrap_text(foot, width)]
    for extra in (job_line(plan), verified_line(plan)):
        if extra:
            lines.append(wrap_text(extra, width))
    return "\n".join(lines)


def job_line(plan: Plan) -> str:
    """Offline job: rank 1's finish time (utilisation x deadline: it runs at capacity), margin and cost."""
    w = plan.workload
    if not (w.offline_requests and w.deadline_s and plan.rows):
        return ""
    r = plan.rows[0]
    ev = r.evaluation
    finish = min(ev.utilisation, 1.0) * w.deadline_s
    sim = (r.simulated or {}).get("job_finish_s")
    usd = ev.usd_per_hour * finish / 3600.0
    return (f"Job (rank 1): {w.offline_requests:,} requests finish in {fmt_seconds(finish)}"
            + (f" (simulated {fmt_seconds(sim)})" if sim else "")
            + f", deadline {fmt_seconds(w.deadline_s)}, margin {fmt_seconds(w.deadline_s - finish)}; "
            f"job cost ${usd:,.0f} ({ev.gpus_total} GPUs at ${ev.usd_per_hour:,.2f}/h while running).")


def verified_line(plan: Plan) -> str:
    """How long each verified row ran in the simulator (empty when none was verified)."""
    runs = [(r.rank, r.simulated) for r in plan.rows if r.simulated and r.simulated.get("requests")
            and "job_finish_s" not in r.simulated]
    if not runs:
        return ""
    each = ", ".join(f"rank {rank} {sim['requests']:,}" for rank, sim in runs)
    warm = max(int(sim.get("warmup_requests") or 0) * 100 // max(int(sim["requests"]), 1) for _, sim in runs)
    return (f"Verified in the simulator (requests per plan): {each}; first {warm}% discarded as warm-up; "
            "each served >= 98% of its offered load over the second half.")


def rent_label(pools: Any) -> str:
    """``2 x lambda 8-GPU`` per pool (``+`` between P/D pools); per-GPU billing reads ``workload $/GPU-h``."""
    parts = []
    for p in pools:
        r = getattr(p, "rental", None)
        if r is None:
            continue
        o = r.offer
        parts.append(f"{o.provider} $/GPU-h" if o.per_tp_group else f"{r.instances} x {o.provider} {o.gpus_per_instance}-GPU")
    return " + ".join(parts) or "-"


def render_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2)


def render_yaml(plan: Plan) -> str:
    return yaml.safe_dump(plan.to_dict(), sort_keys=False)


def render_csv(plan: Plan) -> str:
    """One row per pool (a P/D plan has a prefill and a decode row with the same rank and id): the pool's
    role, GPU, TP, replicas and engine limits, then the plan's latencies, cost and ranking fields."""
    buf = io.StringIO()
    keys = ["rank", "id", "gpu", "role", "tp", "replicas", "pool_gpus", "gpus_total", "weight_dtype", "kv_dtype",
            "max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "disaggregated", "ttft_s", "tpot_s", "e2e_s",
            "output_tokens_per_s", "utilisation", "usd_per_hour", "usd_per_million_output_tokens",
            "usd_per_million_tokens", "pareto", "binding", "quality_note"]
    wr = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    wr.writeheader()
    for row in plan.to_dict()["plans"]:
        for pool in row["pools"]:
            wr.writerow({**row, **{k: pool[k] for k in ("gpu", "role", "tp", "replicas", "max_num_seqs",
                                                        "max_num_batched_tokens", "chunked_prefill") if k in pool},
                         "pool_gpus": pool["tp"] * pool["replicas"]})
    return buf.getvalue()


RENDERERS = {"table": render_table, "json": render_json, "yaml": render_yaml, "csv": render_csv}
