"""The plan: ranked rows built from evaluations, and its JSON form (the contract in docs/ARCHITECTURE.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from recommender.hf_config import ModelArch
from recommender.sizing import Evaluation, Pool
from recommender.workload import Workload

PLAN_VERSION = 1


@dataclass(frozen=True)
class Evidence:
    """What a plan's numbers rest on: the efficiency profile and, per pool, (gpu, family, measured rows)."""

    profile: str
    engine: str
    pools: tuple[tuple[str, str, int], ...] = ()
    band: float = 0.0  # relative error band used when ranking unmeasured against measured plans

    @property
    def measured(self) -> bool:
        return bool(self.pools) and all(rows > 0 for _, _, rows in self.pools)

    def unmeasured_families(self) -> list[str]:
        return sorted({fam or gpu for gpu, fam, rows in self.pools if rows == 0})

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "engine": self.engine, "measured": self.measured, "error_band": self.band,
                "pools": [{"gpu": g, "family": f, "measured_rows": n} for g, f, n in self.pools]}


@dataclass(frozen=True)
class PlanRow:
    """One ranked deployment."""

    rank: int
    evaluation: Evaluation
    pareto: bool
    quality_note: str = ""
    simulated: dict[str, Any] | None = None
    checkpoint: str = ""
    pd_saving: float | None = None  # P/D rows: fraction cheaper per token than the best aggregated plan
    evidence: Evidence | None = None

    @property
    def candidate(self):
        return self.evaluation.candidate

    @property
    def decode_pool(self) -> Pool:
        return self.evaluation.pools[-1]

    def label(self) -> str:
        ev = self.evaluation
        if self.candidate.disaggregated:
            p, d = ev.pools
            return f"P {p.replicas}x{p.gpu} TP{p.tp} + D {d.replicas}x{d.gpu} TP{d.tp}"
        p = ev.pools[0]
        return f"{p.gpu} TP{p.tp} x{p.replicas}"


@dataclass(frozen=True)
class Plan:
    """What ``recommend`` returns: ranked rows, the reason rank 1 wins, and how the search ran."""

    workload: Workload
    model: ModelArch
    rows: tuple[PlanRow, ...]
    why: str
    engine: str = "vllm"
    profile_source: str = ""
    gpu_memory_utilization: float = 0.92
    meta: dict[str, Any] = field(default_factory=dict)
    evaluations: tuple[Evaluation, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        wd = w.to_dict()
        wd.update(model=self.model.id, hf_repo=self.model.hf_repo or self.model.id, checkpoint_dtype=self.model.checkpoint_dtype)
        return _clean({
            "version": PLAN_VERSION,
            "workload": wd,
            "slo": [{"metric": s.metric, "limit_s": s.limit_s, "percentile": s.percentile} for s in w.slos],
            "engine": self.engine,
            "profile": self.profile_source or self.engine,
            "why": self.why,
            "search": self.meta,
            "plans": [row_dict(r, w, self.gpu_memory_utilization) for r in self.rows],
        })


def _pool_dict(p: Pool, gmu: float) -> dict[str, Any]:
    return {"role": p.role, "gpu": p.gpu, "tp": p.tp, "replicas": p.replicas, "weight_dtype": p.weight_dtype,
            "kv_dtype": p.kv_dtype, "max_num_seqs": p.limits.max_num_seqs,
            "max_num_batched_tokens": p.limits.max_num_batched_tokens, "chunked_prefill": p.limits.chunked_prefill,
            "enable_prefix_caching": p.limits.enable_prefix_caching, "gpu_memory_utilization": gmu,
            "usd_per_gpu_hour": p.usd_per_hour / max(p.gpus, 1), "kv_capacity_tokens": p.kv_capacity_tokens,
            **_rental_dict(p)}


def _rental_dict(p: Pool) -> dict[str, Any]:
    """The offer a pool rents and how many whole instances (docs/ARCHITECTURE.md, plan JSON)."""
    r = p.rental
    if r is None:
        return {}
    o = r.offer
    return {"provider": o.provider, "instances": r.instances, "gpus_per_instance": o.gpus_per_instance,
            "usd_per_instance_hour": o.usd_per_instance_hour, "usd_per_hour": r.usd_per_hour,
            "offer": {"sku": o.sku, "date": o.date, "source": o.source, "per_gpu_billing": o.per_tp_group}}


def row_dict(r: PlanRow, w: Workload, gmu: float) -> dict[str, Any]:
    ev, c = r.evaluation, r.candidate
    main = ev.pools[-1]  # decode pool for P/D, the only pool otherwise
    pct = w.slos[0].percentile if w.slos else "p90"
    lat = ev.latencies
    d: dict[str, Any] = {
        "rank": r.rank, "id": c.key, "gpu": main.gpu, "gpus_total": ev.gpus_total, "tp": main.tp,
        "replicas": main.replicas, "weight_dtype": c.weight_dtype, "kv_dtype": c.kv_dtype,
        "max_num_seqs": main.limits.max_num_seqs, "max_num_batched_tokens": ev.pools[0].limits.max_num_batched_tokens,
        "chunked_prefill": ev.pools[0].limits.chunked_prefill,
        "enable_prefix_caching": any(p.limits.enable_prefix_caching for p in ev.pools), "cuda_graphs": True,
        "gpu_memory_utilization": gmu, "max_model_len": w.max_model_len, "disaggregated": c.disaggregated,
        "pools": [_pool_dict(p, gmu) for p in ev.pools],
        "providers": sorted({p.rental.offer.provider for p in ev.pools if p.rental is not None}),
        "instances": sum(p.rental.instances for p in ev.pools if p.rental is not None),
        "percentile": pct,
        "ttft_s": lat.get("ttft", {}).get(_pct_for(w, "ttft", pct)), "tpot_s": lat.get("tpot", {}).get(_pct_for(w, "tpot", pct)),
        "e2e_s": lat.get("e2e", {}).get(_pct_for(w, "e2e", pct)),
        "latency_percentiles": lat,
        "output_tokens_per_s": ev.output_tokens_per_s, "utilisation": ev.utilisation,
        "usd_per_hour": ev.usd_per_hour, "usd_per_million_output_tokens": ev.usd_per_million_output_tokens,
        "usd_per_million_tokens": ev.usd_per_million_tokens, "pareto": r.pareto, "binding": ev.binding,
        "quality_note": r.quality_note,
    }
    if r.checkpoint:
        d["checkpoint"] = r.checkpoint
    if r.pd_saving is not None:
        d["pd_saving_vs_aggregated"] = r.pd_saving
    if r.evidence is not None:
        d["evidence"] = r.evidence.to_dict()
    if r.simulated is not None:
        d["simulated"] = r.simulated
    return d


def _pct_for(w: Workload, metric: str, default: str) -> str:
    for s in w.slos:
        if s.metric == metric:
            return s.percentile
    return default


def _clean(x: Any) -> Any:
    """JSON-safe: inf/nan -> None, tuples -> lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x
