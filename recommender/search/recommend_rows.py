"""Ranking evaluations into plan rows (shared by the search and the simulator verification)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from recommender.catalog import default_catalog
from recommender.plan import Evidence, PoolEvidence, layout_suffix
from recommender.profiles import EngineProfile, gpu_family
from recommender.search.evaluate import Evaluation, SearchContext
from recommender.search.evidence_table import class_rows, evidence_table
from recommender.search.pareto import non_dominated
from recommender.search.policy import SearchPolicy
from recommender.search.space import Candidate

@dataclass(frozen=True)
class RankedRow:
    """One ranked evaluation inside the search (``recommender.search.to_plan`` turns these into plan rows)."""

    rank: int
    evaluation: Evaluation
    pareto: bool
    quality_note: str = ""
    simulated: dict[str, Any] | None = None
    checkpoint: str = ""
    pd_saving: float | None = None  # P/D rows: fraction cheaper per token than the best aggregated plan
    evidence: Evidence | None = None
    load_utilisation: float | None = None  # rate / capacity (Sizer.capacity_utilisation); None: ev.utilisation
    twin_dtypes: tuple[str, ...] = ()  # "int8/fp8": dtype twins with identical predicted numbers, collapsed here
    kv_link: dict[str, float] | None = None  # P/D: the KV link's fields (recommender.load.link.KvLink)
    bands: dict[str, Any] | None = None  # recommender.search.bands.bands_of

    @property
    def candidate(self) -> Candidate:
        return self.evaluation.candidate

    def label(self) -> str:
        ev = self.evaluation
        if self.candidate.disaggregated:
            p, d = ev.pools
            return f"P {p.replicas}x{p.gpu} TP{p.tp} + D {d.replicas}x{d.gpu} TP{d.tp}"
        p = ev.pools[0]
        return f"{p.gpu} TP{p.tp}{layout_suffix(pp=p.pp, dp=p.dp, ep=p.ep, mtp=p.mtp)} x{p.replicas}"


#: Tie-break between equally priced, equally fast plans: the dtype that loses less accuracy first.
QUALITY_RANK = {"bf16": 0, "fp16": 0, "fp8": 1, "mxfp4": 1, "int8": 2, "int4": 3, "fp4": 3}


def quality_note(ev: Evaluation, policy: SearchPolicy) -> str:
    wd = ev.candidate.weight_dtype
    if wd in policy.quality_risk_dtypes:
        return f"{wd} weights: small accuracy loss likely; validate on your eval set"
    return ""


def kv_note(ev: Evaluation, ctx: SearchContext) -> str:
    """A pool whose max_num_seqs (the grid's smallest) is above what its KV cache holds at the mean context."""
    for p in ev.pools:
        if p.role == "prefill" or not p.kv_capacity_tokens:
            continue
        held = ctx.kv_sequences(p.kv_capacity_tokens)
        if p.limits.max_num_seqs > held:
            return (f"max_num_seqs {p.limits.max_num_seqs} (the grid's smallest) is above the ~{held} sequences "
                    "the KV cache holds at the mean context: the KV cache limits the batch")
    return ""


def pd_saving(ev: Evaluation, best_aggregated_usd_per_million: float | None) -> float | None:
    """For a P/D evaluation: 1 - its $/M tokens / the best aggregated plan's (1.0 when no aggregated plan
    is feasible); None for aggregated ones. P/D rows below ``policy.pd_min_saving`` are not listed."""
    if not ev.candidate.disaggregated:
        return None
    if best_aggregated_usd_per_million is None or best_aggregated_usd_per_million <= 0:
        return 1.0
    return 1.0 - ev.usd_per_million_tokens / best_aggregated_usd_per_million


def measured_rows(profile: EngineProfile, gpu_id: str, *, moe: bool = False, model_id: str = "",
                  dtype: str = "") -> tuple[str, int]:
    """(family, measured rows behind the profile on that family): where the family holds an override for ``model_id``
    (``recommend calibrate`` on one configuration of that model: :class:`~recommender.profiles.ModelFit`), the
    rows of that override, the measurements of this very model; else the rows the README's per-profile table
    (``benchmarks/profile_evidence.py``) lists: for a MoE model the family's InferenceX rows
    (``families.<f>.held_out_inferencex.rows``), for a dense one the engine fit's rows on the family
    (``fit.held_out_by_config.by_family.<f>.rows``); where the profile records neither, for a MoE model the rows of
    that model a ``recommend calibrate`` fit covers on the family, else the MoE rows of the engine's error-band class
    at the pool's weight ``dtype`` (``catalogs/evidence.yaml``: what the P(SLO) column counts, e.g. vLLM's gpt-oss-20b
    rows for an mxfp4 MoE plan on Hopper; :func:`_moe_rows`), else 0: the dense rows behind a family fit say nothing
    of the routed experts, nor do terms borrowed from another engine; for a dense one the
    family fit's rows (``families:`` in the profile), or the rows the fit records for the family
    (``fit.coverage.families``, written by ``recommend calibrate``), else (older profiles) the engine fit's rows on
    GPUs of the same family (the fit's held-out report ``by: gpu``, ``per_group.<gpu>.start.n``). Family = the GPU's
    catalog architecture."""
    fit = profile.family_fit(gpu_id)
    own = fit.model_fit(model_id) if fit is not None else None
    if fit is not None and own is not None:
        return fit.family, own.rows
    recorded = dict(fit.held_out_inferencex).get("rows") if moe and fit is not None else None
    if recorded is None and moe:
        return _moe_rows(profile, gpu_id, model_id, dtype)
    if recorded is None and not moe:
        dense = profile.held_out_evidence(gpu_id)
        recorded = float(dense.rows) if dense is not None and dense.rows > 0 else None
    if recorded is not None:
        return (fit.family if fit is not None else gpu_family(gpu_id)), int(recorded)
    family, rows = profile.evidence(gpu_id)
    gpus = default_catalog().gpus
    family = family or (gpus[gpu_id].arch if gpu_id in gpus else "")
    covered = ((profile.fit or {}).get("coverage") or {}).get("families") or {}  # written by recommend calibrate
    if isinstance(covered, dict) and isinstance(covered.get(family), int):
        return family, max(rows, int(covered[family]))
    for report in (profile.fit or {}).get("held_out") or ():
        if not isinstance(report, dict) or report.get("by") != "gpu":
            continue
        for g, stats in (report.get("per_group") or {}).items():
            n = ((stats or {}).get("start") or {}).get("n") if isinstance(stats, dict) else None
            if isinstance(n, int) and g in gpus and family and gpus[g].arch == family:
                rows += n
        break
    return family, rows


def _moe_rows(profile: EngineProfile, gpu_id: str, model_id: str, dtype: str) -> tuple[str, int]:
    """(family, rows of ``model_id`` a ``recommend calibrate`` fit covers on the GPU's family: the smaller of the
    fit's rows on the family and of the model, ``fit.coverage``), else the rows of the engine's ``moe`` class on the
    family at ``dtype`` in the evidence table, else 0."""
    family = gpu_family(gpu_id)
    cov = (profile.fit or {}).get("coverage")
    fams = cov.get("families") if isinstance(cov, Mapping) else None
    models = cov.get("models") if isinstance(cov, Mapping) else None
    on_family = fams.get(family) if isinstance(fams, Mapping) and family else None
    of_model = models.get(model_id) if isinstance(models, Mapping) and model_id else None
    if isinstance(on_family, int) and isinstance(of_model, int):
        return family, min(on_family, of_model)
    return family, class_rows(evidence_table(), profile.engine, family, dtype, "moe") if dtype and family else 0


def evidence_of(ctx: SearchContext, ev: Evaluation) -> Evidence:
    """The efficiency profile behind a plan and, per pool GPU, its family and the measured rows behind it. A
    calibration written for another model or GPU family (the fit's ``scope``) is named as not this plan's."""
    model = getattr(ctx, "model", None)
    moe = getattr(model, "moe", None) is not None  # a MoE model: its InferenceX rows
    mid = str(getattr(model, "id", "") or "")
    pools = tuple(PoolEvidence(p.gpu, *measured_rows(ctx.profile, p.gpu, moe=moe, model_id=mid,
                                                     dtype=p.weight_dtype if moe else "")) for p in ev.pools)
    families = {p.family for p in pools}
    label = ctx.profile.source or ctx.profile.engine
    elsewhere = calibrated_elsewhere(ctx.profile, mid, families)
    if elsewhere:
        label += f" ({elsewhere}: this plan predicts with the start profile's values)"
    lent = sorted({note for p in ev.pools if (note := ctx.profile.borrowed_note(p.gpu, mid))})
    if lent:
        label += f" ({mid}'s terms borrowed from {', '.join(lent)}; none of {ctx.profile.engine}'s own)"
    return Evidence(profile=label, engine=ctx.profile.engine,
                    measured=bool(pools) and all(p.measured_rows > 0 for p in pools),
                    error_band=evidence_band(ctx, families), pools=pools)


def calibrated_elsewhere(profile: EngineProfile, model_id: str, families: set[str]) -> str:
    """Where a ``recommend calibrate`` fit was written when that is not this plan ('calibrated for llama-3.1-8b on
    hopper only'), else ''. Rows of one configuration are that model's override on its family; rows of one family are
    that family's block (``fit.scope``, written by ``recommender.calibrate.api.calibrate``)."""
    scope = (profile.fit or {}).get("scope")
    if not isinstance(scope, dict):
        return ""
    fam, model = str(scope.get("family") or ""), str(scope.get("model") or "")
    if (model and model != model_id) or (fam and families and families != {fam}):
        return f"calibrated for {model + ' on ' if model else ''}{fam or 'its family'} only"
    return ""


def evidence_band(ctx: SearchContext, families: set[str] | None = None) -> float:
    """The profile's relative error band: its fit's residual scale (log-space sd) if stated and the fit covers this
    model (and ``families``, where given), else the policy's."""
    scale = (ctx.profile.fit or {}).get("residual_scale")
    mid = str(getattr(getattr(ctx, "model", None), "id", "") or "")
    if calibrated_elsewhere(ctx.profile, mid, families or set()):
        return ctx.policy.evidence_band
    return float(scale) if isinstance(scale, (int, float)) and scale > 0 else ctx.policy.evidence_band


def prefer_measured(ctx: SearchContext, feas: Sequence[Evaluation], order: list[int]) -> list[int]:
    """Move each plan on a GPU family without measurements just below the best-ranked measured plan whose
    $/M tokens is within the error band above it (cost_measured <= cost_unmeasured x (1 + band))."""
    band = evidence_band(ctx)
    measured = {i: evidence_of(ctx, feas[i]).measured for i in order}
    out = list(order)
    for u in [i for i in order if not measured[i]]:
        limit = feas[u].usd_per_million_tokens * (1 + band)
        alts = [j for j in out if measured[j] and feas[j].usd_per_million_tokens <= limit]
        if not alts:
            continue
        first = min(out.index(j) for j in alts)
        if out.index(u) < first:
            out.remove(u)
            out.insert(first, u)  # the alternative moved up one place; u now sits right after it
    return out


def rank_rows(ctx: SearchContext, evaluations: Sequence[Evaluation], top: int) -> list[RankedRow]:
    """Feasible evaluations -> Pareto rows first (by cost), then dominated ones; one row per
    configuration family (GPU, TP, dtypes, pools) so the table shows real alternatives."""
    feas = [e for e in evaluations if e.feasible]
    uniq: dict[str, Evaluation] = {}
    for e in feas:
        uniq.setdefault(e.candidate.key, e)
    feas = list(uniq.values())
    if not feas:
        return []
    best_agg = min((e.usd_per_million_tokens for e in feas if not e.candidate.disaggregated), default=None)
    feas = [e for e in feas if (saving := pd_saving(e, best_agg)) is None or saving >= ctx.policy.pd_min_saving]
    if not feas:
        return []
    front = set(non_dominated([e.objectives for e in feas]))
    order = sorted(range(len(feas)), key=lambda i: (i not in front, feas[i].usd_per_million_tokens, feas[i].objectives[1:],
                                                    QUALITY_RANK.get(feas[i].candidate.weight_dtype, 9),
                                                    feas[i].candidate.kv_dtype != "bf16"))
    if ctx.policy.prefer_measured:
        order = prefer_measured(ctx, feas, order)
    seen: set[tuple[object, ...]] = set()
    rows: list[RankedRow] = []
    twins: dict[tuple[object, ...], int] = {}  # twin_key -> index in rows
    for i in order:
        e = feas[i]
        c = e.candidate
        fam = (c.gpu, c.tp, c.weight_dtype, c.kv_dtype, c.disaggregated, c.decode_gpu, c.decode_tp)
        if fam in seen:
            continue
        seen.add(fam)
        tk = twin_key(e)
        if tk in twins:  # same shape and numbers, another dtype (e.g. int8 beside fp8 on H100): one row names both
            k = twins[tk]
            rows[k] = replace(rows[k], twin_dtypes=rows[k].twin_dtypes + (f"{c.weight_dtype}/{c.kv_dtype}",))
            continue
        twins[tk] = len(rows)
        ckpt = ctx.workload.checkpoints.get(c.weight_dtype) or ctx.checkpoints.get(c.weight_dtype, "")
        native = ctx.model.checkpoint_dtype
        online = ""
        if c.weight_dtype == "fp8" and c.weight_dtype != native and not ckpt:
            online = f"fp8 quantized online at load from the {native} checkpoint (no pre-quantized fp8 checkpoint known)"
        notes = "; ".join(x for x in (quality_note(e, ctx.policy), kv_note(e, ctx), online) if x)
        rows.append(RankedRow(rank=len(rows) + 1, evaluation=e, pareto=i in front, quality_note=notes,
                            checkpoint=ckpt if c.weight_dtype != native else "", pd_saving=pd_saving(e, best_agg),
                            evidence=evidence_of(ctx, e), load_utilisation=ctx.capacity_utilisation(e),
                            kv_link={k: float(v) for k, v in asdict(e.kv_link or ctx.kv_link(c)).items()} if c.disaggregated else None))
        if len(rows) >= top:
            break
    return rows


def twin_key(e: Evaluation) -> tuple[object, ...]:
    """What a row shows apart from its dtypes: the pools' GPUs, TP, replicas and engine limits, the cost and
    every predicted latency percentile. Two evaluations with equal keys differ only in a dtype whose numbers the
    models do not tell apart (int8 and fp8 weights: one byte per parameter, the same peak on most GPUs)."""
    c = e.candidate
    pools = tuple((p.role, p.gpu, p.tp, p.replicas, p.limits, p.kv_capacity_tokens) for p in e.pools)
    lat = tuple(sorted((m, tuple(sorted(v.items()))) for m, v in e.latencies.items()))
    return (c.disaggregated, pools, e.usd_per_hour, e.usd_per_million_tokens, e.output_tokens_per_s, lat)


def more_rows(ctx: SearchContext, evaluations: Sequence[Evaluation], rows: Sequence[RankedRow], extra: int) -> list[RankedRow]:
    """The next ``extra`` ranked rows after ``rows`` (same ordering as :func:`rank_rows`)."""
    allrows = rank_rows(ctx, evaluations, len(rows) + extra)
    return allrows[len(rows):]
