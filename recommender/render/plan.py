"""Plan renderers: table (fitted to the terminal), JSON, YAML, CSV. Pure string producers on the typed plan."""

from __future__ import annotations

import csv
import io
from typing import Any, Callable, Sequence

import yaml

from recommender.plan import Plan, PlanRow, Pool, SearchMeta, dump_plan, plan_document
from recommender.plan.cost import job_of
from recommender.render.table import fit_table, wrap_text
from recommender.units import fmt_seconds

TABLE_HEADERS = ["rank", "deployment", "GPUs", "rent", "TP", "replicas", "weights/KV", "max seqs", "chunk",
                 "TTFT", "TPOT", "out tok/s", "util", "$/hour", "$/M out", "$/M tok", "P(SLO)", "binding", "note"]
#: Columns a narrow terminal loses first (first listed goes first); what stays at 80 columns is the compact set:
#: rank, deployment, GPUs, weights/KV, TTFT, TPOT, $/M tok. TP and replicas go first: the deployment cell
#: holds them (:func:`deployment_cell`).
DROP_ORDER = ["replicas", "TP", "note", "P(SLO)", "$/M out", "util", "max seqs", "chunk", "out tok/s", "$/hour", "rent", "binding",
              "weights/KV"]


def _pct_label(plan: Plan, metric: str) -> str:
    for s in plan.slos:
        if s.metric == metric:
            return s.percentile
    return plan.slos[0].percentile if plan.slos else "p90"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _sim_note(r: PlanRow, pct_ttft: str, pct_tpot: str) -> str:
    if not r.simulated:
        return ""
    if "ttft_s" not in r.simulated and r.simulated.get("job_finish_s") is not None:
        return f"(sim finish {fmt_seconds(r.simulated['job_finish_s'])})"
    sim_ttft = r.simulated.get("ttft_s", {}).get(pct_ttft)
    sim_tpot = r.simulated.get("tpot_s", {}).get(pct_tpot)
    return "(sim {} / {})".format(fmt_seconds(sim_ttft) if sim_ttft is not None else "-",
                                  fmt_seconds(sim_tpot) if sim_tpot is not None else "-")


def p_slo_cell(r: PlanRow) -> str:
    """'0.87 (16)': P(all SLOs met) and the rows behind its evidence class; '-' without bands."""
    b = r.bands or {}
    p = b.get("p_slo")
    return "-" if p is None else f"{p:.2f} ({b.get('class_rows', 0)})"


def latency_band_cells(b: Any) -> list[str]:
    """'TTFT 49.0 ms - 152 ms', 'TPOT ...', 'e2e ...' of a band record (seconds; 'saturated' where the slow end has
    no value: the pools saturate there); a metric without a band is left out."""
    cells = []
    for name, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("e2e", "e2e_s")):
        v = (b or {}).get(key)
        if isinstance(v, (list, tuple)) and len(v) == 2 and isinstance(v[0], (int, float)):
            hi = fmt_seconds(float(v[1])) if isinstance(v[1], (int, float)) else "saturated"
            cells.append(f"{name} {fmt_seconds(float(v[0]))} - {hi}")
    return cells


def band_text(b: Any, key: str) -> str:
    """'0.48-0.70' of a band record's [p10, p90] (seconds or req/s), '' without."""
    v = (b or {}).get(key)
    if not v or v[0] is None:
        return ""
    hi = "inf" if v[1] is None else f"{v[1]:.4g}"
    return f"{v[0]:.4g}-{hi}"


def plan_table_rows(plan: Plan) -> list[list[Any]]:
    rows = []
    tp_ttft, tp_tpot = _pct_label(plan, "ttft"), _pct_label(plan, "tpot")
    for r in plan.rows:
        dep = deployment_cell(r.pools)
        if r.disaggregated:
            p, d = r.pools
            tp, reps = f"{p.tp}|{d.tp}", f"{p.replicas}|{d.replicas}"
        else:
            p = r.pools[0]
            tp, reps = str(p.tp), str(p.replicas)
        first = r.pools[0]
        chunk = str(first.max_num_batched_tokens) if first.chunked_prefill else "off"
        pd = ""
        if r.pd_saving_vs_aggregated is not None:
            pd = ("only P/D meets the SLOs" if r.pd_saving_vs_aggregated >= 1.0
                  else f"P/D {r.pd_saving_vs_aggregated:.0%} cheaper than best aggregated")
        unmeasured = ""
        if r.evidence is not None and not r.evidence.measured:
            unmeasured = f"unmeasured: {', '.join(r.evidence.unmeasured_families())}"
        kv = f"kv link: {r.kv_link.label}" if r.kv_link is not None else ""
        note = "; ".join(x for x in (pd, kv, unmeasured, r.quality_note, "" if r.pareto else "dominated",
                                     _sim_note(r, tp_ttft, tp_tpot)) if x)
        rows.append([
            r.rank, dep, r.gpus_total, rent_label(r.pools), tp, reps, " | ".join((f"{r.weight_dtype}/{r.kv_dtype}", *r.twin_dtypes)),
            r.main_pool.max_num_seqs, chunk,
            fmt_seconds(r.latency("ttft", tp_ttft)), fmt_seconds(r.latency("tpot", tp_tpot)),
            _num(r.output_tokens_per_s, ",.0f"), _num(r.load_utilisation, ".2f"), _num(r.usd_per_hour, ",.2f"),
            _num(r.usd_per_million_output_tokens, ".3f"), _num(r.usd_per_million_tokens, ".3f"), p_slo_cell(r),
            r.binding, note,
        ])
    return rows


def deployment_cell(pools: Sequence[Pool]) -> str:
    """The deployment cell, whole in itself (a narrow terminal hides the TP and replicas columns): replicas x TP
    (x PP, x DP with EP) per pool, so the factors multiply to the GPUs column, and MTP's draft tokens where set (the
    table has no other place for them). ``b200 2xTP2``; ``b200 4xTP1xDP8 EP`` (4 engines of 8 data-parallel ranks);
    ``h200 3xTP8 MTP2``; P/D ``h100-sxm P 4xTP2 + D 1xTP4``, or ``P b200 4xTP1 + D b300 2xTP2`` across GPU types."""
    if len(pools) == 1:
        return f"{pools[0].gpu} {_shape(pools[0])}"
    prefill, decode = pools[0], pools[-1]
    if prefill.gpu == decode.gpu:
        return f"{prefill.gpu} P {_shape(prefill)} + D {_shape(decode)}"
    return f"P {prefill.gpu} {_shape(prefill)} + D {decode.gpu} {_shape(decode)}"


def _shape(p: Pool) -> str:
    """One pool's replicas x TP [x PP] [x DP] [EP] [MTPk]."""
    return (f"{p.replicas}xTP{p.tp}" + (f"xPP{p.pp}" if p.pp > 1 else "")
            + (f"xDP{p.data_parallel_size}" if p.data_parallel_size > 1 else "")
            + (" EP" if p.enable_expert_parallel else "")
            + (f" MTP{p.num_speculative_tokens}" if p.num_speculative_tokens else ""))


def search_footer(m: SearchMeta) -> str:
    """Trials run / asked, why the search stopped, and whether rank 1 is proven the cheapest in the space. Under
    ``--confidence`` (``m.confidence``) the proof is of the cheapest plan that meets the SLOs as predicted, which
    rank 1 is not where it ranks for its P(all SLOs met): the cheapest evaluated plan that reaches it (the sensitivity
    line leaves out its price thresholds for the same reason)."""
    run = m.trials_run if m.trials_run is not None else m.trials
    asked = m.trials_asked
    conf = m.confidence
    who = "rank 1" if conf is None else "the cheapest plan"
    dropped = bool(m.verification and "the analytic rank 1 was" in m.verification)  # the simulator dropped it
    if m.stopped_by == "timeout":
        head = f"{run} of {asked} trials asked: cut by the {m.timeout_s} s timeout"
    elif m.stopped_by == "trials":
        head = f"{run} of {asked} trials asked (all used)"
    elif m.search_complete:
        head = f"{run} trials (search complete: every other configuration pruned by its bounds)"
    else:
        head = f"{run} trials (of up to {asked}; stopped once {who} was proven, Pareto front from these)"
    if m.trials is not None and m.trials != run:
        head += f"; {m.trials} trials in the study ranked"
    if conf is None:
        proof = "rank 1 proven cheapest in the space" if m.rank1_proven else "rank 1 NOT proven cheapest: raise --trials"
    else:
        proof = ("the cheapest plan by the point prediction " + (
                 "proven the optimum of the space" if m.rank1_proven else
                 "NOT proven (the simulator dropped the analytic rank 1)" if dropped else "NOT proven: raise --trials")
                 + (f"; rank 1 is the cheapest evaluated plan with P(all SLOs met) >= {conf:g}, not proven the cheapest"
                    " such plan" if m.confidence_met is not False
                    else f"; no evaluated plan reaches P(all SLOs met) >= {conf:g}: ranked by it"))
    if m.aggregated_rank1_proven is not None:  # a P/D rank 1: its saving note is against this aggregated plan
        proof += ("; the best aggregated plan (P/D notes) proven cheapest of its space" if m.aggregated_rank1_proven
                  else "; the best aggregated plan (P/D notes) NOT proven: raise --trials")
    if not m.rank1_proven and dropped and conf is None:
        proof = "rank 1 NOT proven cheapest (the simulator dropped the analytic optimum)"
    return f"{head}; {proof}; {m.seconds} s (seed {m.seed})"


def table_headers(plan: Plan) -> list[str]:
    """TABLE_HEADERS with the percentile the latencies are shown at ("TTFT p90")."""
    hdr = list(TABLE_HEADERS)
    hdr[hdr.index("TTFT")] = f"TTFT {_pct_label(plan, 'ttft')}"
    hdr[hdr.index("TPOT")] = f"TPOT {_pct_label(plan, 'tpot')}"
    return hdr


def model_label(model: str, hf_repo: str | None) -> str:
    """The plan's catalog model, with the checkpoint it deploys where that is not the entry's own repo (a model named
    by an alias): 'deepseek-v3 (deepseek-ai/DeepSeek-R1)'; 'llama-3.1-8b'."""
    from recommender.catalog import default_catalog
    from recommender.errors import RecommenderError

    if not hf_repo:
        return model
    try:
        own = default_catalog().models.get(model)
    except RecommenderError:
        return model
    return model if own is None or own.hf_repo == hf_repo else f"{model} ({hf_repo})"


def render_table(plan: Plan, *, width: int | None = None) -> str:
    """The ranked table; with ``width`` (terminal columns) the least important columns are dropped to fit."""
    w = plan.workload
    rate = (f"{w.arrival_rate_per_s:g} req/s" if w.arrival_rate_per_s
            else f"offline {w.offline_requests or 0:,} requests in {fmt_seconds(w.deadline_s or 0)}")
    slos = ", ".join(str(s) for s in plan.slos) or "none (cost only)"
    lengths = ""
    if w.prompt_tokens is not None and w.output_tokens is not None:
        p99 = f" (p99 {w.prompt_tokens.p99:,})" if w.prompt_tokens.p99 is not None else ""
        lengths = f", prompt ~{w.prompt_tokens.mean:,.0f} tok{p99}, output ~{w.output_tokens.mean:,.0f} tok"
    head = f"{model_label(w.model, w.hf_repo)} | {w.name}: {rate}{lengths} | SLO {slos} | engine {plan.engine}"
    hdr = table_headers(plan)
    body, dropped = fit_table(hdr, plan_table_rows(plan), width=width, drop_order=DROP_ORDER)
    m = plan.search
    foot = f"{search_footer(m)}; replicas sized for +{m.headroom:.0%} headroom; latencies at the workload's rate."
    if m.pricing:
        foot += f"\nPrices: {m.pricing}."
    if dropped:
        need = max(map(len, body.splitlines()), default=0)
        fit = f"to fit {width} columns" if width is None or need <= width else f"(the rest need {need} of {width} columns)"
        foot += f"\n{len(dropped)} columns hidden {fit} ({', '.join(dropped)}); --wide shows all."
    lines = [wrap_text(head, width), "", body, "", wrap_text(plan.why, width), wrap_text(foot, width)]
    for extra in (job_line(plan), verified_line(plan), sensitivity_line(plan)):
        if extra:
            lines.append(wrap_text(extra, width))
    return "\n".join(lines)


def job_line(plan: Plan) -> str:
    """Offline job: rank 1's finish time (utilisation x deadline: it runs at capacity), margin and cost."""
    w = plan.workload
    job = job_of(plan.rows[0], w) if plan.rows else None
    if job is None or w.deadline_s is None:
        return ""
    r = plan.rows[0]
    sim = (r.simulated or {}).get("job_finish_s")
    return (f"Job (rank 1): {w.offline_requests:,} requests finish in {fmt_seconds(job.finish_s)}"
            + (f" (simulated {fmt_seconds(sim)})" if sim else "")
            + f", deadline {fmt_seconds(w.deadline_s)}, margin {fmt_seconds(job.margin_s)}; "
            f"job cost ${job.usd:,.0f} ({r.gpus_total} GPUs at ${r.usd_per_hour or 0.0:,.2f}/h while running).")


def verified_line(plan: Plan) -> str:
    """How long each verified row ran in the simulator (empty when none was verified)."""
    runs = [(r.rank, r.simulated) for r in plan.rows if r.simulated is not None and r.simulated.get("requests")
            and "job_finish_s" not in r.simulated]
    if not runs:
        return ""
    each = ", ".join(f"rank {rank} {sim['requests']:,}" for rank, sim in runs)
    # rounded, not truncated: verify_run_length's int(n x 0.2) warm-up of 4,029 requests is 805, 19.98%, not "19%"
    warm = max(round(int(sim.get("warmup_requests") or 0) * 100 / max(int(sim["requests"]), 1)) for _, sim in runs)
    line = (f"Verified in the simulator (requests per plan): {each}; first {warm}% discarded as warm-up; "
            "each served >= 98% of its offered load over the second half.")
    return f"{line} {plan.search.verification}" if plan.search.verification else line


def sensitivity_line(plan: Plan) -> str:
    """How far rank 1 holds (price, rate, output length; ``search.sensitivity``), or ''."""
    s = plan.search.sensitivity
    return str(s.get("text") or "") if s else ""


def rent_label(pools: Sequence[Pool]) -> str:
    """``2 x lambda 8-GPU`` per pool (``+`` between P/D pools); per-GPU billing reads ``workload $/GPU-h``."""
    parts = []
    for p in pools:
        r = p.rental
        if r is None:
            continue
        if r.shared:  # P and D on one instance: named once
            part = f"{r.instances} x {r.provider} {r.gpus_per_instance}-GPU (P+D)"
            if part not in parts:
                parts.append(part)
            continue
        if r.provider == "owned":  # the user's nodes (--inventory), billed per GPU in use
            parts.append(f"{r.instances} owned {r.gpus_per_instance}-GPU node{'s' if r.instances > 1 else ''}")
        else:
            parts.append(f"{r.provider} $/GPU-h" if r.offer.per_gpu_billing else
                         f"{r.instances} x {r.provider} {r.gpus_per_instance}-GPU")
    return " + ".join(parts) or "-"


def _pool_instances(p: Pool) -> int | str:
    """A CSV pool's whole instances: '' without a rental or billed per GPU at the workload's own prices (no
    instance is rented; the rental counts TP groups there), else the rental's (a shared P/D instance on both lines)."""
    r = p.rental
    if r is None or (r.offer.per_gpu_billing and r.provider != "owned"):
        return ""
    return r.instances


def render_json(plan: Plan) -> str:
    return dump_plan(plan).rstrip("\n")


def render_yaml(plan: Plan) -> str:
    return str(yaml.safe_dump(plan_document(plan), sort_keys=False))


#: CSV columns: one line per pool (a P/D plan has a prefill and a decode line with the same rank and id)
CSV_COLUMNS = ["rank", "id", "gpu", "role", "tp", "replicas", "pool_gpus", "pp", "data_parallel_size",
               "enable_expert_parallel", "num_speculative_tokens", "weight_dtype", "kv_dtype", "max_num_seqs",
               "max_num_batched_tokens", "chunked_prefill", "enable_prefix_caching", "gpu_memory_utilization",
               "usd_per_gpu_hour", "provider", "instances", "gpus_total", "ttft_s", "tpot_s", "e2e_s", "percentile", "output_tokens_per_s",
               "load_utilisation", "usd_per_hour", "usd_per_million_output_tokens", "usd_per_million_tokens", "pareto",
               "binding", "quality_note", "job_finish_s", "job_usd"]


def band_columns(r: PlanRow) -> dict[str, Any]:
    """The CSV's band columns: P(SLO met), the evidence class and its rows, p10/p90 of TTFT, TPOT, e2e, capacity."""
    b = r.bands or {}
    out: dict[str, Any] = {"p_slo": b.get("p_slo", ""), "evidence_class": b.get("class", ""),
                           "evidence_rows": b.get("class_rows", "")}
    for k, (c10, c90) in {"ttft_s": ("ttft_p10_s", "ttft_p90_s"), "tpot_s": ("tpot_p10_s", "tpot_p90_s"),
                          "e2e_s": ("e2e_p10_s", "e2e_p90_s"),
                          "capacity_per_s": ("capacity_per_s_p10", "capacity_per_s_p90")}.items():
        lo, hi = (b.get(k) or [None, None])
        out[c10], out[c90] = ("" if lo is None else lo), ("" if hi is None else hi)
    return out


BAND_CSV_COLUMNS = ["p_slo", "evidence_class", "evidence_rows", "ttft_p10_s", "ttft_p90_s", "tpot_p10_s", "tpot_p90_s",
                    "e2e_p10_s", "e2e_p90_s", "capacity_per_s_p10", "capacity_per_s_p90"]


def render_csv(plan: Plan) -> str:
    """One row per pool (a P/D plan has a prefill and a decode row with the same rank and id): the pool's
    role, GPU, TP, replicas, GPUs and layout (pipeline stages, data-parallel ranks, EP, MTP draft tokens: pool_gpus =
    tp x pp x data_parallel_size x replicas) and engine limits, then the plan's latencies, cost and ranking fields."""
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=[*CSV_COLUMNS, *BAND_CSV_COLUMNS], lineterminator="\n")
    wr.writeheader()
    for r in plan.rows:
        job = job_of(r, plan.workload)  # offline jobs only: when it ends and what it costs
        for p in r.pools:
            wr.writerow(_csv_cells({
                "rank": r.rank, "id": r.id, "gpu": p.gpu, "role": p.role.value, "tp": p.tp, "replicas": p.replicas,
                "pool_gpus": p.gpus, "pp": p.pp, "data_parallel_size": p.data_parallel_size,
                "enable_expert_parallel": p.enable_expert_parallel, "num_speculative_tokens": p.num_speculative_tokens,
                "weight_dtype": p.weight_dtype, "kv_dtype": p.kv_dtype, "max_num_seqs": p.max_num_seqs,
                "max_num_batched_tokens": p.max_num_batched_tokens, "chunked_prefill": p.chunked_prefill,
                "enable_prefix_caching": p.enable_prefix_caching, "gpu_memory_utilization": p.gpu_memory_utilization,
                "usd_per_gpu_hour": p.usd_per_gpu_hour, "provider": p.rental.provider if p.rental else "",
                "instances": _pool_instances(p), "gpus_total": r.gpus_total, "ttft_s": r.ttft_s,
                "tpot_s": r.tpot_s, "e2e_s": r.e2e_s, "percentile": r.percentile,
                "output_tokens_per_s": r.output_tokens_per_s, "load_utilisation": r.load_utilisation,
                "usd_per_hour": r.usd_per_hour, "usd_per_million_output_tokens": r.usd_per_million_output_tokens,
                "usd_per_million_tokens": r.usd_per_million_tokens, "pareto": r.pareto, "binding": r.binding,
                "quality_note": r.quality_note, "job_finish_s": job.finish_s if job else "", "job_usd": job.usd if job else "",
                **band_columns(r),
            }))
    return buf.getvalue()


def _csv_cells(row: dict[str, object]) -> dict[str, object]:
    """Booleans as ``true``/``false`` (what CSV readers and spreadsheets parse), not Python's ``True``."""
    return {k: ("true" if v else "false") if isinstance(v, bool) else v for k, v in row.items()}


RENDERERS: dict[str, Callable[[Plan], str]] = {"table": render_table, "json": render_json, "yaml": render_yaml,
                                               "csv": render_csv}
