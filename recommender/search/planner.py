"""``recommend(workload) -> Plan``: the main job, pure (no printing, no files except Optuna storage)."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

from recommender.catalog import Catalog, default_catalog
from recommender.dtypes import WEIGHT_DTYPES, loads_without_checkpoint
from recommender.estimator import default_acceptance
from recommender.hf_config import ModelArch
from recommender.errors import ConfigError, DoesNotFitError, InfeasibleError
from recommender.perf.step import EngineLimits
from recommender.plan import Plan, PlanRow
from recommender.profiles import EngineProfile, engine_profile
from recommender.search.evaluate import Evaluation, SearchContext, evaluate, headroom, rules_of
from recommender.search.recommend_rows import RankedRow, rank_rows
from recommender.search.policy import SearchPolicy, StudySettings, load_search_policy
from recommender.search.space import (
    Candidate,
    SpaceChoices,
    allowed_gpus,
    inventory_shortfall,
    inventory_space,
    moe_layouts,
    mtp_choices,
    node_size,
    offers_for,
    resolve_dtype,
)
from recommender.search.to_plan import build_plan
from recommender.sizing import OFFLINE_MAX_UTILISATION
from recommender.units import fmt_seconds
from recommender.workload import Workload


@dataclass(frozen=True)
class SearchSettings(StudySettings):
    """Study settings plus what the plan shows (``top``) and verifies (``verify``)."""

    top: int = 5
    verify: int | None = None
    provider: str | None = None  # price with this provider's offers only (default: the cheapest offer per GPU)
    confidence: float = 0.5  # rank only plans with P(all SLOs met) >= this (0.5: the point prediction meets them)
    unlimited_inventory: bool = False  # owned GPUs without their count (sizes what a shortfall needs)


def build_context(workload: Workload, policy: SearchPolicy, profile: EngineProfile, catalog: Catalog,
                  provider: str | None = None, unlimited_inventory: bool = False) -> SearchContext:
    """Everything one search shares; each GPU is priced by its offers (of ``provider`` when given),
    or by the workload's ``prices:`` override; with an inventory, only the owned GPUs, as owned offers."""
    model = catalog.model(workload.model)
    check_context(workload, model)
    overrides = dict(workload.usd_per_gpu_hour_overrides)
    if workload.inventory:
        gpus, offers = inventory_space(catalog, workload.inventory, workload.gpus, limited=not unlimited_inventory)
    else:
        gpus = allowed_gpus(catalog, workload.gpus, overrides, provider)
        offers = {g.id: offers_for(g, overrides, provider) for g in gpus}
    prices = {gid: min(o.usd_per_gpu_hour for o in offs) for gid, offs in offers.items()}
    meta = catalog.model_meta.get(model.id, {})
    ckpts = {str(k).lower(): str(v) for k, v in (meta.get("quantized_checkpoints") or {}).items()}
    native = resolve_dtype("native", model)
    blocks = {d: b for d in WEIGHT_DTYPES if (b := catalog.weight_block_for(
        model, d, None if d == native else workload.checkpoints.get(d) or ckpts.get(d) or "")) is not None}
    return SearchContext(workload=workload, model=model, gpus={g.id: g for g in gpus},
                         prices={k: float(v) for k, v in prices.items() if v is not None}, profile=profile,
                         rules=rules_of(policy), policy=policy, checkpoints=ckpts, offers=offers, weight_blocks=blocks,
                         acceptance=default_acceptance(catalog, model) if model.mtp_layers else None)


def check_context(workload: Workload, model: ModelArch) -> None:
    """Refuse, before any search, a workload whose longest prompt + output exceeds the model's context
    (``max_position_embeddings``): vLLM would refuse ``--max-model-len`` above it."""
    context = model.max_position_embeddings
    if workload.max_model_len > context:
        raise ConfigError(
            f"prompt + output up to {workload.max_model_len:,} tokens ({workload.prompt_tokens.max_tokens:,} + "
            f"{workload.output_tokens.max_tokens:,}) exceed {model.id}'s context of {context:,} tokens; shorten the "
            "prompts or outputs (--prompt-tokens/--output-tokens or the workload's max), or pick a longer-context model")


def checkpoint_for(ctx: SearchContext, dtype: str) -> str | None:
    """Pre-quantized checkpoint for ``dtype``: the workload's, else the model catalog's, else None."""
    if dtype in ctx.workload.checkpoints:
        return ctx.workload.checkpoints[dtype]
    return ctx.checkpoints.get(dtype)


def space_choices(ctx: SearchContext) -> SpaceChoices:
    pol = ctx.policy
    wds = []
    native = resolve_dtype("native", ctx.model)
    for d in pol.weight_dtypes:
        r = resolve_dtype(d, ctx.model)
        if r in wds:
            continue
        if loads_without_checkpoint(native, r) or checkpoint_for(ctx, r):
            wds.append(r)
    return SpaceChoices(gpus=tuple(ctx.gpus), tps=tuple(pol.tensor_parallel), weight_dtypes=tuple(wds),
                        kv_dtypes=tuple(pol.kv_dtypes), max_num_seqs=tuple(pol.max_num_seqs),
                        budgets=tuple(pol.max_num_batched_tokens), disaggregation=pol.disaggregation,
                        pd_heterogeneous=pol.pd_heterogeneous_gpus,
                        layouts=moe_layouts(ctx.model, tuple(pol.tensor_parallel)), mtp=mtp_choices(ctx.model, tuple(pol.mtp_draft_tokens)))


def seed_candidates(ctx: SearchContext, ch: SpaceChoices) -> list[Candidate]:
    """Sensible starting points enqueued before the sampler takes over: per GPU, the smallest TP that
    fits at each dtype with vLLM-like defaults (256 sequences, 8192-token chunks)."""
    out: list[Candidate] = []
    seqs = 256 if 256 in ch.max_num_seqs else ch.max_num_seqs[len(ch.max_num_seqs) // 2]
    budget = 8192 if 8192 in ch.budgets else max(ch.budgets)
    for g in ch.gpus:
        for wd in ch.weight_dtypes:
            for tp in ch.tps:
                c = Candidate(g, tp, wd, "fp8" if "fp8" in ch.kv_dtypes else ch.kv_dtypes[0], seqs, budget)
                cost, _ = ctx.cost_model(c.gpu, c.tp, c.weight_dtype, c.kv_dtype,
                                         EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=budget))
                if cost is not None:
                    out.append(c)
                    break
    return out


def candidate_from_plan_row(row: PlanRow) -> Candidate:
    """A row of a previous plan as a Candidate (for warm starts)."""
    first, last = row.pools[0], row.main_pool
    dis = row.disaggregated
    budget = first.max_num_batched_tokens if first.chunked_prefill else 0
    return Candidate(gpu=first.gpu, tp=first.tp, weight_dtype=row.weight_dtype, kv_dtype=row.kv_dtype,
                     max_num_seqs=last.max_num_seqs, max_num_batched_tokens=budget, disaggregated=dis,
                     decode_gpu=last.gpu if dis else "", decode_tp=last.tp if dis else 0,
                     dp=first.data_parallel_size, ep=first.enable_expert_parallel,
                     mtp=first.num_speculative_tokens if not dis else 0)


def why_rank_one(ctx: SearchContext, rows: Sequence[RankedRow]) -> str:
    """One or two lines: why rank 1 beats rank 2."""
    if not rows:
        return ""
    a = rows[0]
    ea = a.evaluation
    if len(rows) == 1:
        return (f"Only {a.label()} meets every constraint: ${ea.usd_per_million_tokens:.3f}/M tokens on "
                f"{ea.gpus_total} GPUs; binding: {ea.binding}.")
    b = rows[1]
    eb = b.evaluation
    saving = 1 - ea.usd_per_million_tokens / eb.usd_per_million_tokens if eb.usd_per_million_tokens else 0.0
    if abs(saving) < 0.005:
        shown = [(sl.metric, sl.percentile) for sl in ctx.workload.slos] or [("ttft", "p90"), ("tpot", "p90")]
        lat = [f"{m} {fmt_seconds(ea.latency(m, pct))} vs {fmt_seconds(eb.latency(m, pct))}" for m, pct in shown]
        return (f"Rank 1 ({a.label()}, {a.candidate.weight_dtype}/{a.candidate.kv_dtype} KV) and rank 2 ({b.label()}, "
                f"{b.candidate.weight_dtype}/{b.candidate.kv_dtype} KV) cost the same, ${ea.usd_per_million_tokens:.3f}/M tokens "
                f"on {ea.gpus_total} vs {eb.gpus_total} GPUs ({', '.join(lat) or 'same latencies'}); rank 1 is listed first for "
                f"{'its latencies' if ea.objectives[1:] < eb.objectives[1:] else 'its weight/KV dtypes, which lose less accuracy'}."
                f" Binding constraint for rank 1: {ea.binding}.")
    if saving < 0:  # rank 1 is dearer: it is measured, rank 2 rests on a GPU family without measurements
        return (f"Rank 1 ({a.label()}, {a.candidate.weight_dtype}/{a.candidate.kv_dtype} KV) costs "
                f"${ea.usd_per_million_tokens:.3f}/M tokens, {-saving:.0%} more than rank 2 ({b.label()}), which rests on "
                f"a GPU family without measured rows: within the profile's error band the measured plan ranks first. "
                f"Binding constraint for rank 1: {ea.binding}.")
    reasons = []
    if ea.gpus_total < eb.gpus_total:
        reasons.append(f"{ea.gpus_total} GPUs instead of {eb.gpus_total}")
    pa = ea.usd_per_hour / max(ea.gpus_total, 1)
    pb = eb.usd_per_hour / max(eb.gpus_total, 1)
    if pa < pb * 0.98:
        reasons.append(f"cheaper GPU-hours (${pa:.2f} vs ${pb:.2f})")
    if a.candidate.weight_dtype != b.candidate.weight_dtype:
        reasons.append(f"{a.candidate.weight_dtype} weights vs {b.candidate.weight_dtype}")
    line = (f"Rank 1 ({a.label()}, {a.candidate.weight_dtype}/{a.candidate.kv_dtype} KV) costs "
            f"${ea.usd_per_million_tokens:.3f}/M tokens, {saving:.0%} less than rank 2 ({b.label()})"
            + (f": {', '.join(reasons)}." if reasons else "."))
    faster = [f"{s.metric} {fmt_seconds(eb.latency(s.metric, s.percentile))} vs {fmt_seconds(ea.latency(s.metric, s.percentile))}"
              for s in ctx.workload.slos if eb.latency(s.metric, s.percentile) < ea.latency(s.metric, s.percentile) * 0.97]
    if faster:
        line += f" Rank 2 is faster ({', '.join(faster)}) if latency matters more than cost."
    else:
        line += f" Binding constraint for rank 1: {ea.binding}."
    return line


def infeasible_message(ctx: SearchContext, evaluations: Sequence[Evaluation]) -> str:
    w = ctx.workload
    fit = [e for e in evaluations if e.fits and e.latencies
           and all(math.isfinite(e.latency(s.metric, s.percentile)) for s in w.slos)]
    slos = ", ".join(str(s) for s in w.slos) or "the capacity limits"
    if not any(e.fits for e in evaluations):
        raise DoesNotFitError(_no_fit_message(ctx, evaluations))
    unrentable = [e for e in evaluations if e.fits and e.reason.startswith("no offer for")]
    if not fit and unrentable and len(unrentable) == sum(1 for e in evaluations if e.fits):
        first = min(unrentable, key=lambda e: e.candidate.replica_gpus)  # the smallest group no offer holds
        gpu = first.candidate.gpu
        return (f"no plan can be rented: {first.reason}; allow other GPU types, price {gpu} per GPU-hour "
                f"(--price {gpu}=$X/h, or prices: {{{gpu}: \"$X/h\"}} in the workload), plan onto GPUs you own (--inventory {gpu}=N), "
                "or add an offer with larger instances (offers: in catalogs/gpus/*.yaml)")
    if not fit:
        cap = f"max_gpus={w.max_gpus}" if w.max_gpus else f"max_replicas={ctx.policy.max_replicas}"
        return (f"no configuration carries {w.effective_rate_per_s:.3g} req/s (+{ctx.policy.headroom:.0%} headroom) "
                f"stably within {cap}: every candidate saturates; raise max_gpus, allow larger GPUs, or lower the rate")
    if not w.slos:
        best = min(fit, key=lambda e: e.utilisation)
        cap = f"max_gpus={w.max_gpus}" if w.max_gpus else f"max_replicas={ctx.policy.max_replicas}"
        fix = "raise max_gpus" if w.max_gpus else "allow larger GPUs or more GPU types"
        cap_u = OFFLINE_MAX_UTILISATION if w.is_offline else ctx.policy.max_utilisation
        return (f"no plan carries {w.effective_rate_per_s:.3g} req/s within {cap} and utilisation <= {cap_u:g}: the "
                f"closest, {best.candidate.key}, {best.reason or 'exceeds a limit'}; "
                f"{fix}{', or extend the deadline' if w.is_offline else ', or lower the rate'}")
    def worst(e: Evaluation) -> float:
        return max(e.latency(s.metric, s.percentile) / s.limit_s for s in w.slos)

    closest = min(fit, key=worst)
    parts = []
    for s in w.slos:
        best = min(fit, key=lambda e: e.latency(s.metric, s.percentile))
        v = best.latency(s.metric, s.percentile)
        if v > s.limit_s:
            c = best.candidate
            parts.append(f"the fastest {s.metric} reaches {fmt_seconds(v)} on {c.gpu} TP{c.tp} {c.weight_dtype}; "
                         f"relax to >= {fmt_seconds(v * 1.05)}")
    if not parts:
        c = closest.candidate
        lat = ", ".join(f"{s.metric} {fmt_seconds(closest.latency(s.metric, s.percentile))}" for s in w.slos)
        if worst(closest) <= 1.0 and w.max_gpus and closest.gpus_total > w.max_gpus:
            parts.append(f"the closest plan, {c.key}, meets them ({lat}) on {closest.gpus_total} GPUs, "
                         f"above max_gpus {w.max_gpus}")
        elif worst(closest) <= 1.0:
            parts.append(f"the closest plan, {c.key}, meets them at the workload's rate ({lat}) but "
                         f"{closest.reason or 'exceeds a capacity limit'}")
        else:
            parts.append(f"each SLO is reachable alone but not together; the closest plan is {c.key} ({lat})")
    others = ""
    if w.gpus:
        others = f"; or allow more GPU types than {', '.join(w.gpus)}"
    cap = f" or raise max_gpus ({w.max_gpus})" if w.max_gpus else ""
    return f"no plan meets {slos}: " + "; ".join(parts) + others + cap


def _no_fit_message(ctx: SearchContext, evaluations: Sequence[Evaluation]) -> str:
    """Why no GPU set holds the model, and the way out (:func:`_why_no_fit`), with the inventory's NIC hint."""
    return _why_no_fit(ctx) + _owned_nic_hint(ctx)


def _owned_nic_hint(ctx: SearchContext) -> str:
    """'; or run it in pipeline stages over your 2 nodes of h100-sxm: ...' when owned GPUs span several nodes whose
    NIC the inventory does not state (a pipeline's stages talk over it every step, so none is assumed)."""
    for o in ctx.workload.inventory:
        node = o.gpus_per_node or (ctx.gpus[o.gpu].interconnect.gpus_per_domain if o.gpu in ctx.gpus else 0)
        if node and o.count >= 2 * node and not o.network.known:
            return (f"; to run it in pipeline stages over your {o.count // node} nodes of {o.gpu}, state the NIC "
                    f"between them (--inventory-network infiniband=400, or network: in its inventory entry)")
    return ""


def _why_no_fit(ctx: SearchContext) -> str:
    from recommender.perf import memory as mem

    m = ctx.model
    by_size = mem.bytes_per_weight
    searched = space_choices(ctx).weight_dtypes  # the policy's dtypes that load: a narrower one needs its checkpoint
    smallest = min(searched, key=by_size)
    need = mem.weight_bytes(m, smallest)
    biggest = max(ctx.gpus.values(), key=lambda g: g.memory_bytes * g.interconnect.gpus_per_domain)
    n = min(biggest.interconnect.gpus_per_domain, max(ctx.policy.tensor_parallel), ctx.workload.max_gpus or 10**9)
    group = n * biggest.memory_bytes
    head = (f"{m.id} does not fit any allowed GPU set: its weights alone are {need / 1e9:,.0f} GB at {smallest}, "
            f"the largest allowed TP group is {n} x {biggest.id} = {group / 1e9:,.0f} GB")
    if need <= group:  # the weights fit the group: its engine's reserves and one sequence's KV cache do not
        head = (f"{m.id} does not fit any allowed GPU set: at {smallest} its {need / 1e9:,.0f} GB of weights, the "
                f"engine's reserves and one max-length sequence's KV cache exceed {n} x {biggest.id} "
                f"({group / 1e9:,.0f} GB at gpu-memory-utilization {ctx.policy.gpu_memory_utilization})")
    owned = bool(ctx.workload.inventory)  # GPUs the user owns: "allow larger GPUs" is no way out
    larger = "allow larger GPUs (h200, b200, mi325x)"
    narrower = sorted({resolve_dtype(d, m) for d in ctx.policy.weight_dtypes} - set(searched), key=by_size)
    if narrower and by_size(narrower[0]) < by_size(smallest):
        d = narrower[0]
        at = mem.weight_bytes(m, d)
        if at <= group:  # a checkpoint the search could not load without would be the way out
            return (f"{head}; at {d} they would be {at / 1e9:,.0f} GB: name a pre-quantized {d} checkpoint "
                    f"(checkpoints: {{{d}: ORG/REPO}} in the workload)" + ("" if owned else f", or {larger}"))
        return f"{head} (at {d} still {at / 1e9:,.0f} GB)" + ("" if owned else f"; {larger}")
    return f"{head}; try a smaller weight dtype" if owned else f"{head}; {larger} or a smaller weight dtype"


def shortfall_message(workload: Workload, why: str, *, settings: SearchSettings, profile: EngineProfile,
                      catalog: Catalog, policy: SearchPolicy) -> str:
    """The inventory cannot carry the workload: why, and how many more GPUs the cheapest plan on the owned GPU
    types needs (a second search with as many nodes as it takes)."""
    import dataclasses

    listed = ", ".join(o.label() for o in workload.inventory)
    head = f"the inventory ({listed}) cannot carry {workload.effective_rate_per_s:.3g} req/s"
    head += f" within {', '.join(str(s) for s in workload.slos)}" if workload.slos else ""
    try:
        more = recommend(workload, settings=dataclasses.replace(settings, unlimited_inventory=True, verify=0, top=1,
                                                                storage=None, workers=1),
                         profile=profile, catalog=catalog, policy=policy)
    except (InfeasibleError, DoesNotFitError) as e:
        return f"{head}: {why}; no number of these GPUs would ({e})"
    top = more.rows[0]
    short = inventory_shortfall(workload.inventory, [(p.gpu, p.gpus) for p in top.pools])
    need = ", ".join(f"{n} more {g}" for g, n in short.items()) or "no more GPUs"
    uses = " + ".join(f"{p.replicas} x TP{p.tp} {p.gpu}" for p in top.pools)
    owned = {o.gpu: o for o in workload.inventory}
    whole = []
    for g, n in short.items():  # what to own instead, in whole nodes
        node = node_size(catalog.gpu(g), owned[g]) if g in owned else 1
        total = -(-(n + (owned[g].count if g in owned else 0)) // node) * node
        whole.append(f"{g}={total}")
    return (f"{head}: the cheapest plan on these GPU types needs {top.gpus_total} GPUs ({uses}, {top.id}): "
            f"{need} ({sum(short.values())} GPUs short; in whole nodes: --inventory {','.join(whole)})")


def pricing_note(ctx: SearchContext, provider: str | None) -> str:
    """One line on where the prices came from (the plan footer and JSON ``search.pricing``)."""
    if ctx.workload.inventory:
        priced = [o for o in ctx.workload.inventory if o.usd_per_gpu_hour is not None]
        what = ("amortised $/GPU-hour as given" if len(priced) == len(ctx.workload.inventory) else
                "no price given for " + ", ".join(o.gpu for o in ctx.workload.inventory if o.usd_per_gpu_hour is None)
                + ": cost counts its GPU-hours ($1 = 1 GPU-hour)")
        return (f"owned GPUs only (--inventory {', '.join(o.label() for o in ctx.workload.inventory)}): whole nodes "
                f"as they are, a TP group inside one node, billed per GPU in use; {what}")
    overrides = ctx.workload.usd_per_gpu_hour_overrides
    given = ", ".join(f"{g} ${usd:,.2f}/GPU-hour" for g, usd in sorted(overrides.items()))
    over = f"; the workload's own prices (--price / prices:, billed per GPU): {given}" if overrides else ""
    providers = sorted({o.provider for offs in ctx.offers.values() for o in offs} - {"workload"})
    if provider:
        return f"{provider} offers only (--provider){over}"
    if not providers:  # every GPU priced by the workload
        return f"the workload's own prices only (--price / prices:, billed per GPU): {given}"
    return (f"cheapest whole-instance offer per GPU and pool among {len(providers)} providers "
            f"({', '.join(providers)}; catalogs/gpus, dated); --provider NAME restricts{over}")


DEFAULT_CONFIDENCE = 0.5


def sizing_record(workload: Workload, headroom_fraction: float, basis: str) -> dict[str, Any]:
    """What the plan was sized for (the plan's ``search.rate_basis`` / ``sized_rate_per_s``, read back by
    ``recommend replan``): the workload's rate on the policy's basis x (1 + headroom); none for offline jobs."""
    if workload.is_offline or workload.arrival_rate_per_s is None:
        return {}
    return {"rate_basis": basis, "sized_rate_per_s": round(workload.arrival_rate_per_s * (1.0 + headroom_fraction), 6)}


def _budget(settings: StudySettings, policy: SearchPolicy) -> tuple[int, float | None]:
    """(trials asked, timeout): ``--trials`` wins over the policy's timeout unless ``--timeout`` is given too."""
    trials = settings.trials or policy.trials
    if settings.timeout_s is not None:
        return trials, settings.timeout_s
    return trials, (None if settings.trials else policy.timeout_s)


def _check_storage(settings: StudySettings) -> None:
    if settings.workers <= 1:
        return
    url = settings.storage or ""
    if not url:
        raise ConfigError("--workers > 1 needs --storage to share trials: a journal file (study.log) on this machine, "
                          "or postgresql://... across machines")
    if url.startswith("sqlite") or ("://" not in url and not url.endswith(".log")):
        raise ConfigError(f"--storage {url}: SQLite takes one writer at a time, so --workers {settings.workers} would "
                          "fail on a locked database; use a journal file (--storage study.log) or postgresql://...")


def _shape_worker(workload: Workload, policy: SearchPolicy, profile: EngineProfile, catalog: Catalog,
                  settings: StudySettings, shard: tuple[int, int], trials: int, timeout: float | None) -> None:
    """One ``--workers`` process: the shape search on every n-th shape, recorded in the shared study."""
    from recommender.search.shapes import shape_search
    from recommender.search.study import make_study, record

    ctx = build_context(workload, policy, profile, catalog, getattr(settings, "provider", None))
    ch = space_choices(ctx)
    res = shape_search(ctx, ch, max_evaluations=trials, timeout_s=timeout, shard=shard,
                       min_evaluations=None if settings.trials else policy.front_trials)
    record(make_study(ctx, settings, len(ctx.objective_names)), ctx, ch, res.evaluations)


def aggregated_front(ctx: SearchContext, ch: SpaceChoices, budget: int, timeout_s: float | None) -> tuple[bool | None, int]:
    """When the cheapest plan found is P/D, search the aggregated space on until its own rank 1 is proven, so
    the "P/D N% cheaper than best aggregated" note compares against the cheapest aggregated plan there is, not
    the cheapest one the P/D-led search happened to evaluate. (True: proven, False: the ``budget`` of
    evaluations or the timeout ran out first, None: not needed (no P/D plan leads, or disaggregation is off);
    the evaluations it made)."""
    from recommender.search.shapes import shape_search

    feas = [e for e in ctx.evaluator if e.feasible]
    if not ctx.policy.pd_saving_proof and feas and ch.disaggregation:
        best = min(feas, key=lambda e: e.usd_per_million_tokens)
        return (False if best.candidate.disaggregated else None), 0
    if not ch.disaggregation or not feas or not min(feas, key=lambda e: e.usd_per_million_tokens).candidate.disaggregated:
        return None, 0
    sub = shape_search(ctx, dataclasses.replace(ch, disaggregation=False), timeout_s=timeout_s, min_evaluations=0,
                       max_evaluations=max(1, budget), reuse_cached=True,
                       first=[e.candidate for e in feas if not e.candidate.disaggregated])
    return bool(sub.rank1_proven), len(sub.evaluations)


def recommend(workload: Workload, *, settings: SearchSettings | None = None, profile: EngineProfile | None = None,
              catalog: Catalog | None = None, policy: SearchPolicy | None = None,
              warm_start: Plan | Sequence[Plan] | None = None) -> Plan:
    """Search the deployment space for ``workload`` and return the ranked Pareto plan.

    The shape search (``recommender.search.shapes``) evaluates candidates; each is recorded as a
    completed trial of the Optuna study (``settings.storage`` keeps it). With a storage that already
    holds trials of the study, every completed trial is ranked, not only this run's.

    Raises :class:`InfeasibleError` (no plan meets the SLOs; names the binding constraint and the
    closest plan) or :class:`DoesNotFitError` (the model fits no allowed GPU set).
    """
    from recommender.search.shapes import shape_search
    from recommender.search.study import completed_candidates, make_study, record

    settings = settings or SearchSettings()
    policy = policy or load_search_policy()
    profile = profile or engine_profile("vllm")
    catalog = catalog or default_catalog()
    _check_storage(settings)
    t0 = time.perf_counter()
    ctx = build_context(workload, policy, profile, catalog, settings.provider, settings.unlimited_inventory)
    ch = space_choices(ctx)
    first: list[Candidate] = []
    warm = [warm_start] if isinstance(warm_start, Plan) else list(warm_start or [])
    for prior in warm:  # earlier plans' rank-1 rows are evaluated first, in the order given
        if prior.rows:
            first.append(candidate_from_plan_row(prior.top))
    if not settings.study_name:
        settings = SearchSettings(**{**settings.__dict__, "study_name": f"recommend-{workload.name}"})
    trials, timeout = _budget(settings, policy)
    study = make_study(ctx, settings, len(ctx.objective_names))
    n = max(1, settings.workers)
    procs = _start_workers(workload, policy, profile, catalog, settings, trials, timeout)
    # --trials asks for that many trials; by default stop once rank 1 is proven and the front has front_trials
    from recommender import progress

    with progress.bar("search", total=max(1, trials // n), unit="trial") as bar:
        res = shape_search(ctx, ch, max_evaluations=max(1, trials // n), timeout_s=timeout, first=first, shard=(0, n),
                           min_evaluations=None if settings.trials else max(1, policy.front_trials // n),
                           on_evaluation=lambda _ev: bar.update(1))
        bar.total = bar.n  # the search stops once rank 1 is proven: the bar ends full, not at a fraction of the cap
        bar.refresh()
    record(study, ctx, ch, res.evaluations)
    for pr in procs:
        pr.join()
    agg_proven, agg_runs = aggregated_front(ctx, ch, trials - len(res.evaluations), timeout)
    verify = policy.verify if settings.verify is None else settings.verify
    stored = 0
    if settings.storage is not None:  # other workers' and earlier runs' trials that can rank
        stored_cands, stored = completed_candidates(study, keep=3 * settings.top + 3 * verify + 10)
        for c in stored_cands:
            if c.gpu in ctx.gpus and (not c.disaggregated or c.decode_gpu in ctx.gpus):
                evaluate(ctx, c)
    all_evals = list(ctx.evaluator)
    rows = rank_rows(ctx, all_evals, settings.top)
    if not rows and workload.inventory and not settings.unlimited_inventory:
        raise InfeasibleError(shortfall_message(workload, infeasible_message(ctx, all_evals), settings=settings,
                                                profile=profile, catalog=catalog, policy=policy))
    if not rows:
        raise InfeasibleError(infeasible_message(ctx, all_evals))
    from recommender.search.bands import p_slo, with_bands

    asked = confident = settings.confidence > DEFAULT_CONFIDENCE
    conf_note = ""
    if confident:
        rows, confident, conf_note = _confident_rows(ctx, all_evals, settings, policy)
    verification, lost_first = "", False
    if verify:
        from recommender.search.verify import verify as verify_plans

        rows, verification, lost_first = verify_plans(ctx, rows, all_evals, verify, settings.seed, settings.top)
        if not rows:
            raise InfeasibleError(infeasible_message(ctx, all_evals) + " (the simulator rejected every analytic plan)")
    rows = with_bands(ctx, rows)
    if confident and any(p_slo(r) >= settings.confidence for r in rows):  # verification's replacements too
        rows = [dataclasses.replace(r, rank=i + 1) for i, r in enumerate(
            r for r in rows if p_slo(r) >= settings.confidence)]
    from recommender.search.sensitivity import sensitivity

    sens = sensitivity(ctx, rows[0].evaluation, complete=res.complete, prices=not asked)
    elapsed = time.perf_counter() - t0
    meta = {"seed": settings.seed, "trials": max(stored, len(all_evals)), "trials_run": len(res.evaluations) + agg_runs, "trials_asked": trials,
            "timeout_s": timeout, "stopped_by": res.stopped_by, "search_complete": res.complete, "rank1_proven": res.rank1_proven and not lost_first,
            "rank1_proven_after": res.rank1_proven_after,
            "shapes": res.shapes, "pruned": res.pruned, "workers": n, "evaluations": ctx.evaluations,
            "seconds": round(elapsed, 3), "study_name": study.study_name, "storage": settings.storage,
            "objectives": ctx.objective_names, "constraints": ctx.constraint_names,
            "evaluations_per_s": round(ctx.evaluations / elapsed, 1) if elapsed else None,
            "headroom": headroom(ctx), "verified": verify, **sizing_record(workload, headroom(ctx), policy.rate_basis),
            **({"verification": verification} if verification else {}), "sensitivity": sens.to_dict(),
            **({"confidence": settings.confidence, "confidence_met": confident} if asked else {}), "pricing": pricing_note(ctx, settings.provider),
            "aggregated_rank1_proven": agg_proven}
    return build_plan(workload=workload, model=ctx.model, rows=rows, why=conf_note + why_rank_one(ctx, rows), engine=profile.engine,
                      profile=profile.source, gpu_memory_utilization=policy.gpu_memory_utilization, meta=meta,
                      evaluations=all_evals)


def _start_workers(workload: Workload, policy: SearchPolicy, profile: EngineProfile, catalog: Catalog,
                   settings: SearchSettings, trials: int, timeout: float | None) -> list[Any]:
    """``settings.workers - 1`` spawned processes, each searching its shard of the shapes into the shared storage
    (this process searches shard 0); none for one worker."""
    n = max(1, settings.workers)
    if n == 1:
        return []
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    procs = [spawn.Process(target=_shape_worker, args=(workload, policy, profile, catalog, settings, (i, n),
                                                       max(1, trials // n), timeout)) for i in range(1, n)]
    for pr in procs:
        pr.start()
    return procs


def _confident_rows(ctx: SearchContext, all_evals: Sequence[Evaluation], settings: SearchSettings,
                    policy: SearchPolicy) -> tuple[list[RankedRow], bool, str]:
    """Chance-constrained ranking (``--confidence`` above the default): the cheapest plans whose P(all SLOs met)
    reaches the confidence; where none does, the most likely first (a higher confidence never ranks a cheaper, less
    sure plan first) and a note saying so. Returns (rows, whether the confidence held, the note)."""
    from recommender.search.bands import p_slo, with_bands

    pool = with_bands(ctx, rank_rows(ctx, all_evals, 4 * settings.top + 3 * (policy.verify or 0)))
    sure = [r for r in pool if p_slo(r) >= settings.confidence]
    if sure:
        return [dataclasses.replace(r, rank=i + 1) for i, r in enumerate(sure[:settings.top])], True, ""
    ranked = sorted(pool, key=lambda r: (-p_slo(r), r.evaluation.usd_per_million_tokens))
    rows = [dataclasses.replace(r, rank=i + 1) for i, r in enumerate(ranked[:settings.top])]
    return rows, False, (f"No plan evaluated reaches P(all SLOs met) >= {settings.confidence:g}; ranked by it, the "
                         f"most likely first ({rows[0].label()}: {p_slo(rows[0]):.3f}). ")
