"""Ranked evaluations -> the frozen :class:`~recommender.plan.Plan` (search depends on plan, never the reverse)."""

from __future__ import annotations

from typing import Any, Sequence

from recommender.hf_config import ModelArch
from recommender.plan import GpuPrice, KvLinkInfo, LengthSummary, Offer, Plan, PlanRow, Pool, PoolRole, Rental, SearchMeta, WorkloadEcho
from recommender.search.evaluate import Evaluation
from recommender.search.evaluate import Pool as EvalPool
from recommender.search.recommend_rows import RankedRow
from recommender.workload import LengthDist, Workload


def _pct_for(w: Workload, metric: str, default: str) -> str:
    return next((s.percentile for s in w.slos if s.metric == metric), default)


def _rental(p: EvalPool) -> Rental | None:
    r = p.rental
    if r is None:
        return None
    o = r.offer
    n = o.network
    net = "" if not n.known else (f"{n.kind} {n.gbps_per_gpu:g} Gb/s per GPU" if n.gbps_per_gpu
                                   else f"{n.kind} {n.gbps_per_instance:g} Gb/s per instance")
    return Rental(provider=o.provider, instances=r.instances, gpus_per_instance=o.gpus_per_instance,
                  usd_per_instance_hour=o.usd_per_instance_hour, usd_per_hour=r.usd_per_hour,
                  offer=Offer(sku=o.sku, date=o.date, source=o.source, per_gpu_billing=o.per_tp_group or o.owned),
                  shared=r.shared, network=net, rdma_resource=n.k8s_resource, rdma_per_gpu=n.k8s_per_gpu)


def kv_link_info(ev: Evaluation) -> KvLinkInfo | None:
    """The P/D row's KV path as plan data (None for aggregated rows)."""
    path = ev.kv_path
    if path is None or not ev.candidate.disaggregated:
        return None
    gpus = min(ev.candidate.tp, ev.candidate.decode_tp)
    return KvLinkInfo(kind=path.kind, bytes_per_s_per_gpu=path.bytes_per_s_per_gpu, same_instance=path.same_instance,
                      rdma=path.rdma, known=path.known, label=path.label(gpus))


def _pool(p: EvalPool, gmu: float, checkpoint: str) -> Pool:
    return Pool(role=PoolRole(p.role), gpu=p.gpu, tp=p.tp, replicas=p.replicas, weight_dtype=p.weight_dtype,
                kv_dtype=p.kv_dtype, max_num_seqs=p.limits.max_num_seqs,
                max_num_batched_tokens=p.limits.max_num_batched_tokens, chunked_prefill=p.limits.chunked_prefill,
                enable_prefix_caching=p.limits.enable_prefix_caching, cuda_graphs=True, gpu_memory_utilization=gmu,
                usd_per_gpu_hour=p.usd_per_hour / max(p.gpus, 1), kv_capacity_tokens=p.kv_capacity_tokens,
                checkpoint=checkpoint, rental=_rental(p), pp=p.pp, data_parallel_size=p.dp, enable_expert_parallel=p.ep,
                num_speculative_tokens=p.mtp,
                stage_nic_bytes_per_s_per_gpu=p.stage_nic_bytes_per_s_per_gpu if p.pp > 1 else None)


def _finite(x: float | None) -> float | None:
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else x


def plan_row(r: RankedRow, w: Workload, gmu: float) -> PlanRow:
    """One ranked evaluation as a plan row; headline latencies at the first SLO's percentile (p90 without SLOs)."""
    ev = r.evaluation
    pct = w.slos[0].percentile if w.slos else "p90"
    lat = ev.latencies
    return PlanRow(
        rank=r.rank, id=ev.candidate.key, pools=tuple(_pool(p, gmu, "") for p in ev.pools),
        max_model_len=w.max_model_len, percentile=pct,
        ttft_s=_finite(lat.get("ttft", {}).get(_pct_for(w, "ttft", pct))),
        tpot_s=_finite(lat.get("tpot", {}).get(_pct_for(w, "tpot", pct))),
        e2e_s=_finite(lat.get("e2e", {}).get(_pct_for(w, "e2e", pct))),
        latency_percentiles=lat, output_tokens_per_s=ev.output_tokens_per_s,
        load_utilisation=_finite(ev.utilisation if r.load_utilisation is None else r.load_utilisation), usd_per_hour=_finite(ev.usd_per_hour),
        usd_per_million_output_tokens=_finite(ev.usd_per_million_output_tokens),
        usd_per_million_tokens=_finite(ev.usd_per_million_tokens), pareto=r.pareto, binding=ev.binding,
        quality_note=r.quality_note, checkpoint=r.checkpoint, simulated=r.simulated,
        pd_saving_vs_aggregated=r.pd_saving, evidence=r.evidence, twin_dtypes=r.twin_dtypes, bands=r.bands,
        kv_link=kv_link_info(ev), kv_link_model=dict(r.kv_link) if r.kv_link else None,
    )


#: at most this many empirical samples / histogram buckets are echoed in full (a bigger trace stays in its file)
ECHO_SAMPLES = 4096


def _lengths(d: LengthDist) -> LengthSummary:
    full = len(d.samples) <= ECHO_SAMPLES and len(d.weights) <= ECHO_SAMPLES
    return LengthSummary(dist=d.kind, mean=round(d.mean, 1), p50=d.quantile(0.5), p90=d.quantile(0.9),
                         p99=d.quantile(0.99), min=d.min_tokens, max=d.max_tokens,
                         mean_param=float(d.mean_param) if full else None, std_param=float(d.std_param) if full else None,
                         samples=tuple(d.samples) if full else (), weights=tuple(d.weights) if full else ())


def workload_echo(w: Workload, model: ModelArch) -> WorkloadEcho:
    return WorkloadEcho(model=model.id, hf_repo=model.hf_repo or model.id, checkpoint_dtype=model.checkpoint_dtype,
                        name=w.name, arrival_rate_per_s=w.arrival_rate_per_s, offline_requests=w.offline_requests,
                        deadline_s=w.deadline_s, prompt_tokens=_lengths(w.prompt_tokens),
                        output_tokens=_lengths(w.output_tokens), max_model_len=w.max_model_len,
                        shared_prefix_fraction=w.shared_prefix_fraction, source=w.source, gpus=w.gpus,
                        inventory=w.inventory,
                        prices=tuple(GpuPrice(g, float(v)) for g, v in sorted(w.usd_per_gpu_hour_overrides.items())))


def build_plan(*, workload: Workload, model: ModelArch, rows: Sequence[RankedRow], why: str, engine: str,
               profile: str, gpu_memory_utilization: float, meta: dict[str, Any],
               evaluations: Sequence[Evaluation]) -> Plan:
    """The plan ``recommend`` returns (``meta``: the keyword arguments of :class:`SearchMeta`)."""
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in meta.items()}
    return Plan(workload=workload_echo(workload, model),
                rows=tuple(plan_row(r, workload, gpu_memory_utilization) for r in rows), slos=workload.slos,
                why=why, engine=engine, profile=profile or engine, search=SearchMeta(**fields),
                evaluations=tuple(evaluations))
