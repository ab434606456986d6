"""The report's explanation of a prefill/decode (P/D) plan, one pool at a time, in the plan's own numbers.

A P/D plan is not two aggregated engines: the prefill pool runs every request's prompt and hands its KV cache
to the decode pool, which only decodes. So each pool is explained by what it does::

    prefill pool   prompts/s            = arrival rate (per replica: rate / replicas)
                   prompt tokens/s      = rate x mean prompt tokens
                   TTFT (the plan's)    = one prompt's prefill + KV transfer + handoff + waiting (the rest)
                   KV transfer          = KV bytes per token x mean prompt / (min(TP_p, TP_d) x link bandwidth)
                                          + link latency (the link the row was sized with)
                   handoff              = the link's fixed delay per request (recommender.load.link)
    decode pool    TPOT (the plan's)    = one decode step per output token
                   in flight / replica  = rate x mean output x mean TPOT / replicas        (Little's law)
                   KV use               = in flight x (mean prompt + mean output / 2) / KV capacity
    both           cost share           = pool USD/h / plan USD/h x the plan's $/M tokens (the shares add up)

TTFT, TPOT, USD/h, output tokens/s and $/M tokens are the plan row's; the prefill time of one prompt comes from
the perf model (``recommender.estimator``) on the pool's configuration.
"""

from __future__ import annotations

from recommender.errors import RecommenderError
from recommender.plan import Plan, PlanRow, Pool
from recommender.units import fmt_seconds as S


def _line(label: str, formula: str, value: str) -> str:
    return f"  {label:<18} {formula:<52} = {value}"


def _share(row: PlanRow, pool: Pool) -> str:
    if not row.usd_per_hour or pool.usd_per_hour is None or row.usd_per_million_tokens is None:
        return "-"
    part = pool.usd_per_hour / row.usd_per_hour
    return (f"${row.usd_per_million_tokens * part:.4f} of the plan's ${row.usd_per_million_tokens:.4f}/M tokens "
            f"({part:.0%})")


def _mean(row: PlanRow, metric: str, fallback: float | None) -> float:
    v = (row.latency_percentiles.get(metric) or {}).get("mean", fallback)
    return float(v) if v is not None else 0.0


def _prefill_alone_s(plan: Plan, row: PlanRow, pool: Pool, prompt: int) -> float | None:
    """One mean prompt prefilled alone on one replica of ``pool`` (the perf model), or None."""
    from recommender.estimator import estimate_request
    from recommender.render.pool_estimate import pool_request

    req = pool_request(plan, row, pool, prompt_tokens=prompt, output_tokens=1, batch=1, replicas=1)
    try:
        return float(estimate_request(req)[2].prefill_s)
    except RecommenderError:
        return None


def _transfer_s(plan: Plan, row: PlanRow, prefill: Pool, decode: Pool, prompt: int) -> tuple[float, float] | None:
    """(one mean prompt's KV transfer, the per-request handoff) in seconds over the link the row was sized with, as
    ``replan`` and ``simulate --plan`` rebuild it (``plan.rebuild.row_kv_link``), or None."""
    from recommender.catalog import default_catalog
    from recommender.plan.rebuild import row_kv_link
    from recommender.search.policy import SearchPolicy

    try:
        model = default_catalog().model(plan.workload.model)
    except RecommenderError:
        return None
    pol = SearchPolicy()
    link = row_kv_link(row, model, prefill, decode, default_bytes_per_s_per_gpu=pol.kv_transfer_bandwidth_bytes_per_s,
                       default_latency_s=pol.kv_transfer_latency_s)
    return float(link.transfer_s(prompt)), link.handoff_s


def pd_pool_text(plan: Plan, row: PlanRow, pool: Pool) -> str:
    """What ``pool`` of the P/D plan ``row`` does, in the plan's numbers (module docstring)."""
    w = plan.workload
    rate = w.arrival_rate_per_s or 0.0
    if not rate and w.offline_requests and w.deadline_s:
        rate = w.offline_requests / w.deadline_s
    prompt = w.prompt_tokens.mean if w.prompt_tokens else 0.0
    output = w.output_tokens.mean if w.output_tokens else 0.0
    pct = row.percentile
    cost = f"${pool.usd_per_hour:,.2f}/h of the plan's ${row.usd_per_hour or 0:,.2f}/h" if pool.usd_per_hour else ""
    out = [f"{pool.role.value.capitalize()} pool: {pool.replicas} x TP{pool.tp} {pool.gpu} ({pool.gpus} GPUs), {cost}"]
    if pool.role.value == "prefill":
        decode = row.pools[-1]
        out.append(_line("prompts/s", "every request's prompt, at the workload's rate",
                         f"{rate:.3g} prompts/s ({rate / pool.replicas:.3g} per replica)"))
        out.append(_line("prompt tokens/s", f"rate x mean prompt ({prompt:,.0f} tokens)", f"{rate * prompt:,.0f} tok/s"))
        alone = _prefill_alone_s(plan, row, pool, max(1, round(prompt)))
        link = _transfer_s(plan, row, pool, decode, max(1, round(prompt)))
        ttft = row.ttft_s
        out.append(_line(f"TTFT {pct}", "the plan's: waiting + prefill + KV transfer + handoff", S(ttft) if ttft else "-"))
        if ttft and alone is not None and link is not None:
            xfer, handoff = link
            out.append(_line("  prefill", "one mean prompt alone on one replica", f"{S(alone)} ({alone / ttft:.0%} of TTFT)"))
            out.append(_line("  KV transfer", "KV bytes x prompt / (min TP x link) + latency",
                             f"{S(xfer)} ({xfer / ttft:.0%} of TTFT)"))
            if handoff > 0.0:
                out.append(_line("  handoff", "prefill to decode beyond the transfer (measured)",
                                 f"{S(handoff)} ({handoff / ttft:.0%} of TTFT)"))
            rest = max(ttft - alone - xfer - handoff, 0.0)
            out.append(_line("  waiting", "queue and batching with other prompts (the rest)",
                             f"{S(rest)} ({rest / ttft:.0%} of TTFT)"))
    else:
        tpot = row.tpot_s
        mean_tpot = _mean(row, "tpot", tpot)
        in_flight = rate * output * mean_tpot / pool.replicas
        out.append(_line(f"TPOT {pct}", "the plan's: one decode step per output token", S(tpot) if tpot else "-"))
        out.append(_line("in flight", f"rate x {output:,.0f} output tokens x mean TPOT / replicas",
                         f"{in_flight:,.1f} sequences per replica (max_num_seqs {pool.max_num_seqs})"))
        if pool.kv_capacity_tokens:
            ctx = prompt + output / 2
            out.append(_line("KV cache", "tokens per replica (the plan's)",
                             f"{pool.kv_capacity_tokens:,} tokens = {pool.kv_capacity_tokens / ctx:,.0f} sequences "
                             f"at {ctx:,.0f} tokens"))
            out.append(_line("KV use", "in flight x mean context / KV capacity",
                             f"{in_flight * ctx / pool.kv_capacity_tokens:.0%}"))
        if row.output_tokens_per_s is not None:
            out.append(_line("output tokens/s", "the plan's, all decode replicas", f"{row.output_tokens_per_s:,.0f} tok/s"))
    out.append(_line("cost share", "pool $/h / plan $/h x the plan's $/M tokens", _share(row, pool)))
    return "\n".join(out)
