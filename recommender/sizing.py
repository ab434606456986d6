"""Sizing: turn one engine configuration into pools of replicas and a price (between load and search).

Pure (no Optuna, never imports ``recommender.search``): the search's evaluator, the exhaustive reference
and the tests call :meth:`Sizer.size`.

Replicas are derived, not searched: the fewest replicas ``R`` such that, at
``arrival_rate x (1 + headroom)``, the load model says the deployment is stable, its utilisation is at
most ``max_utilisation`` and every SLO percentile is met. Latency falls as ``R`` grows, so ``R`` is
found by doubling from a capacity lower bound and then bisecting. Reported latencies are at the
workload's own rate (not the headroom rate). Cost is what serving the workload costs::

    usd_per_hour               = sum over pools of instances x usd_per_instance_hour (recommender.offers:
                                 the cheapest offer of the pool's GPU, whole instances, TP groups inside one)
    usd_per_million_tokens     = usd_per_hour / (rate x (mean prompt + mean output) x 3600) x 1e6
    usd_per_million_output_tokens = usd_per_hour / (rate x mean output x 3600) x 1e6

An offline job (``offline: {requests, deadline}``) runs flat out and stops when done: it pays only for the
fraction of the deadline it runs, ``running = rate / saturation_rate``, where ``rate = requests / deadline``
and ``saturation_rate`` is the largest rate the sized pools sustain in the analytic model
(``recommender.load.capacity``: ``replicas x`` one replica's capacity when aggregated). Both $/M figures
are multiplied by ``running``; replicas are the fewest with ``running <= OFFLINE_MAX_UTILISATION``, so the job
ends with 2% of its deadline to spare, and the reported utilisation is ``running`` (finish = running x deadline).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from recommender.catalog import Gpu
from recommender.hf_config import ModelArch
from recommender.load import Disaggregated, PoolSpec, Traffic, analyze, analyze_disaggregated
from recommender.load.capacity import analytic_capacity_per_s, saturation_rate_per_s
from recommender.load.link import KV_HANDOFF_S, KvLink
from recommender.offers import (KvPath, Offer, Rental, cheapest_rental, multinode_offers, rent_colocated,
                               slowest_stage_nic_bytes_per_s_per_gpu, workload_offer)
from recommender.perf import memory as mem
from recommender.catalog import default_catalog
from recommender.estimator import build_deployment, default_acceptance
from recommender.perf.pipeline import why_not_pipelined
from recommender.units import fmt_seconds
from recommender.perf.speculative import SpecDecode
from recommender.perf.step import EngineLimits, StepCostModel
from recommender.profiles import EngineProfile
from recommender.workload import Workload

INFEASIBLE_OBJECTIVE = 1e9


@dataclass(frozen=True)
class Candidate:
    """One engine configuration. Aggregated: one pool on (gpu, tp). Disaggregated: prefill on (gpu, tp),
    decode on (decode_gpu, decode_tp); ``max_num_seqs`` bounds the decode pool, ``max_num_batched_tokens``
    is the (prefill) chunk budget; 0 means chunked prefill off."""

    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    disaggregated: bool = False
    decode_gpu: str = ""
    decode_tp: int = 0
    pp: int = 1  # pipeline stages of an aggregated replica, one instance (TP group) each (recommender.sizing.pipeline)
    dp: int = 1        # attention data-parallel ranks per engine (``--data-parallel-size``; aggregated MoE only)
    ep: bool = False   # ``--enable-expert-parallel`` (MoE only)
    mtp: int = 0       # MTP draft tokens k (``--speculative-config``; models with MTP heads, aggregated only)

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one engine on one instance (aggregated): ``tp x dp`` (a pipeline stage when ``pp > 1``)."""
        return self.tp * self.dp

    @property
    def replica_gpus(self) -> int:
        """GPUs one replica takes over all its instances: ``tp x pp x dp``, plus the decode pool's TP of a P/D pair."""
        return self.tp * self.pp * self.dp + self.decode_tp

    @property
    def key(self) -> str:
        chunk = f"b{self.max_num_batched_tokens}" if self.max_num_batched_tokens else "nochunk"
        layout = ((f"pp{self.pp}" if self.pp > 1 else "") + (f"-dp{self.dp}" if self.dp > 1 else "") + ("-ep" if self.ep else "")
                  + (f"-mtp{self.mtp}" if self.mtp else ""))
        base = f"{self.gpu}-tp{self.tp}{layout}-{self.weight_dtype}-kv{self.kv_dtype}-s{self.max_num_seqs}-{chunk}"
        return f"pd-{base}-d-{self.decode_gpu}-tp{self.decode_tp}" if self.disaggregated else base


@dataclass(frozen=True)
class SizingRules:
    """How pools are sized (from ``policies/search.yaml``)."""

    headroom: float = 0.2
    max_utilisation: float = 0.85
    gpu_memory_utilization: float = 0.92
    max_replicas: int = 256
    kv_transfer_bandwidth_bytes_per_s: float = 5e10
    kv_transfer_latency_s: float = 0.002
    kv_handoff_s: float = KV_HANDOFF_S
    # the smallest max_num_seqs of the search grid: a pool may run above what its KV cache holds only at it
    max_num_seqs_floor: int = 0


# offline jobs: no live headroom; the job ends by 98% of its deadline in the analytic model (2% for the model's
# error: analytic and simulated finish agree within 1% on examples/batch-summarization.yaml), and the simulator
# confirms the finish time
OFFLINE_MAX_UTILISATION = 0.98
BOTTLENECK_NAMES = {"prefill": "prefill lane", "max_num_seqs": "batch limit", "kv_cache": "KV capacity",
                    "decode": "decode steps", "kv_link": "KV link"}


def binding_of(slo_names: list[str], ratios: list[float], res: Any) -> str:
    """What limits the plan: the SLO with the least slack when it has under 20% left (``tpot@p90 (6%
    slack)``), else the resource its utilisation is highest on: prefill lane, batch limit
    (max_num_seqs), KV capacity, decode steps or KV link (P/D: with the pool it is in)."""
    if ratios:
        i = max(range(len(ratios)), key=lambda j: ratios[j])
        if ratios[i] > 0.8:
            return f"{slo_names[i]} ({max(0.0, 1.0 - ratios[i]):.0%} slack)"
    neck = str(getattr(res, "bottleneck", "") or "")
    pool, _, what = neck.rpartition(": ")
    name = BOTTLENECK_NAMES.get(what, what or "capacity")
    return f"{name} ({pool.split()[0]})" if pool else name


@dataclass(frozen=True)
class Pool:
    """One homogeneous pool of replicas (``role`` is both, prefill or decode)."""

    role: str
    gpu: str
    tp: int
    replicas: int
    weight_dtype: str
    kv_dtype: str
    limits: EngineLimits
    usd_per_gpu_hour: float
    kv_capacity_tokens: int = 0
    rental: Rental | None = None  # the whole instances the pool rents (None: priced per GPU)
    pp: int = 1  # pipeline stages per replica (each a TP group on its own instance)
    dp: int = 1        # attention ranks per replica (engine); a replica runs tp x dp GPUs
    ep: bool = False   # expert parallel
    mtp: int = 0       # MTP draft tokens (0: off)
    stage_nic_bytes_per_s_per_gpu: float = 0.0  # pp > 1: the NIC the stage hops were priced at (pipeline_cost_model)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.replicas

    @property
    def ranks(self) -> int:
        """Replicas the load model runs: one per attention rank, ``replicas x dp``."""
        return self.replicas * self.dp

    @property
    def usd_per_hour(self) -> float:
        return self.rental.usd_per_hour if self.rental is not None else self.gpus * self.usd_per_gpu_hour


@dataclass(frozen=True)
class Evaluation:
    """Everything the search and the plan need to know about one sized candidate.

    ``objectives`` = (usd_per_million_tokens, one latency per SLO); ``constraints`` = (memory,
    capacity, one per SLO: latency / limit - 1); values <= 0 are satisfied (Optuna's convention).
    """

    candidate: Candidate
    feasible: bool
    fits: bool
    constraints: tuple[float, ...]
    objectives: tuple[float, ...]
    pools: tuple[Pool, ...] = ()
    gpus_total: int = 0
    usd_per_hour: float = math.inf
    usd_per_million_tokens: float = math.inf
    usd_per_million_output_tokens: float = math.inf
    output_tokens_per_s: float = 0.0
    utilisation: float = math.inf
    latencies: dict[str, dict[str, float]] = field(default_factory=dict)
    binding: str = ""
    reason: str = ""
    load: Any = field(default=None, compare=False, repr=False)
    kv_path: KvPath | None = None  # P/D: where the KV moves (same instance or the offers' NIC)
    kv_link: KvLink | None = field(default=None, compare=False, repr=False)  # P/D: the link it was sized with

    def latency(self, metric: str, percentile: str) -> float:
        return self.latencies.get(metric, {}).get(percentile, math.inf)


def slo_names(w: Workload) -> list[str]:
    return [f"{s.metric}@{s.percentile}" for s in w.slos]


def limits_of(c: Candidate, max_model_len: int, prefix: bool) -> EngineLimits:
    """Aggregated engine limits; budget 0 = chunked prefill off (budget = max(max_model_len, 2048))."""
    chunked = c.max_num_batched_tokens > 0
    budget = c.max_num_batched_tokens if chunked else max(max_model_len, 2048)
    return EngineLimits(max_num_seqs=c.max_num_seqs, max_num_batched_tokens=budget, chunked_prefill=chunked,
                        enable_prefix_caching=prefix)


def pd_limits(c: Candidate, max_model_len: int, prefix: bool) -> tuple[EngineLimits, EngineLimits]:
    """(prefill, decode) limits of a P/D candidate: prefill batches 8-64 prompts of the chunk budget;
    decode runs ``max_num_seqs`` sequences with a budget of max(2048, max_num_seqs)."""
    budget = c.max_num_batched_tokens or max(max_model_len, 2048)
    p = EngineLimits(max_num_seqs=max(8, min(64, c.max_num_seqs)), max_num_batched_tokens=budget,
                     chunked_prefill=c.max_num_batched_tokens > 0, enable_prefix_caching=prefix)
    d = EngineLimits(max_num_seqs=c.max_num_seqs, max_num_batched_tokens=max(2048, c.max_num_seqs),
                     chunked_prefill=True, enable_prefix_caching=False)
    return p, d


def _finite_or_inf(v: float) -> float:
    return v if v == v else math.inf  # NaN (a degenerate load-model result) counts as unbounded


def min_replicas(ok: Callable[[int], bool], lower: int, cap: int) -> int | None:
    """Fewest R in [lower, cap] with ok(R), assuming ok is monotone in R; None if even cap fails. ``lower`` is
    usually the answer or one short of it (a bound), so ``lower + 1`` is tried before the cap."""
    lower = max(1, min(lower, cap))
    if ok(lower):
        return lower
    if lower < cap and ok(lower + 1):
        return lower + 1
    if lower + 1 >= cap or not ok(cap):  # monotone: failing at the cap fails everywhere (one call, not a doubling)
        return None
    lower += 1
    lo, hi = lower, lower
    while True:
        hi = min(cap, hi * 2)
        if ok(hi):
            break
        if hi >= cap:
            return None
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _latencies(res: Any) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for metric in ("ttft", "tpot", "e2e"):
        p = getattr(res, f"{metric}_s")
        out[metric] = {k: (_finite_or_inf(p.at(k)) if res.stable else math.inf) for k in ("mean", "p50", "p90", "p95", "p99")}
    return out


def pipeline_cost_model(*, model: ModelArch, gpu: Gpu, tp: int, weight_dtype: str, kv_dtype: str,
                        profile: EngineProfile, limits: EngineLimits, gpu_memory_utilization: float,
                        max_model_len: int, pp: int, stage_nic_bytes_per_s_per_gpu: float,
                        cuda_graphs: bool = True) -> tuple[StepCostModel | None, str]:
    """(StepCostModel, "") of a replica of ``pp`` pipeline stages of ``tp`` GPUs over a NIC of
    ``stage_nic_bytes_per_s_per_gpu`` (bytes/s), else (None, why not: the stage does not fit, or the model is not
    pipelined); the physics is ``perf.pipeline``'s, carried by ``Deployment(pp=...)``, which the estimate and the
    plan rebuild (``plan.rebuild``) build the same way."""
    why = why_not_pipelined(model, pp)
    if why:
        return None, why
    dep = build_deployment(model=model, gpu=gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                           profile=profile, limits=limits, gpu_memory_utilization=gpu_memory_utilization,
                           max_model_len=max_model_len, cuda_graphs=cuda_graphs, pp=pp,
                           stage_nic_bytes_per_s_per_gpu=stage_nic_bytes_per_s_per_gpu)
    m = dep.memory()
    if not m.fits:
        return None, f"does not fit: a PP{pp} stage is short by {m.shortfall_bytes_per_gpu / 1e9:.1f} GB per GPU"
    return StepCostModel.build(dep), ""


@dataclass
class Sizer:
    """Sizes candidates for one workload (builds and caches one step-cost model per replica configuration)."""

    workload: Workload
    model: ModelArch
    gpus: dict[str, Gpu]
    prices: dict[str, float]  # USD per GPU-hour of each GPU's cheapest offer (bounds and messages)
    profile: EngineProfile
    rules: SizingRules = field(default_factory=SizingRules)
    offers: dict[str, tuple[Offer, ...]] = field(default_factory=dict)  # per GPU; none: per-GPU prices
    _costs: dict[tuple[Any, ...], tuple[StepCostModel | None, str]] = field(default_factory=dict, repr=False)
    _capacities: dict[tuple[Any, ...], float] = field(default_factory=dict, repr=False)
    _shape_capacity: dict[tuple[Any, ...], float] = field(default_factory=dict, repr=False)  # the latest per shape
    # MTP acceptance (per-position rate, its source): the model catalog's (``estimator.default_acceptance``)
    acceptance: tuple[float, str] | None = None

    @property
    def slo_names(self) -> list[str]:
        return slo_names(self.workload)

    @property
    def constraint_names(self) -> list[str]:
        return ["memory", "capacity", *self.slo_names]

    @property
    def objective_names(self) -> list[str]:
        return ["usd_per_million_tokens", *(self.slo_names or ["tpot@p90"])]

    # -- step-cost models -------------------------------------------------------------------------

    def cost_model(self, gpu_id: str, tp: int, wd: str, kd: str, limits: EngineLimits, dp: int = 1,
                   ep: bool = False, pp: int = 1, mtp: int = 0) -> tuple[StepCostModel | None, str]:
        """Cached (StepCostModel, "") or (None, why not: it does not fit) for one replica configuration
        (``pp`` > 1: pipeline stages across instances, :meth:`_pipeline_cost`).

        With ``dp > 1`` or ``ep`` (a MoE model) the model is ONE attention rank of an engine of ``tp x dp`` GPUs
        (``perf.moe``): the load model runs ``dp`` of them per engine, each with its own requests and KV.
        ``mtp`` > 0: MTP speculative decoding with ``mtp`` draft tokens at the model catalog's acceptance rate
        (:meth:`speculation`; ``perf.speculative``)."""
        key: tuple[Any, ...] = (gpu_id, tp, wd, kd, limits) if dp == 1 and not ep else (gpu_id, tp, wd, kd, limits, dp, ep)
        if pp > 1:
            key = (*key, "pp", pp)
        if mtp:
            key = (*key, "mtp", mtp)
        hit = self._costs.get(key)
        if hit is None:
            if pp > 1:
                hit = self._pipeline_cost(gpu_id, tp, wd, kd, limits, pp)
                self._costs[key] = hit
                return hit
            dep = build_deployment(model=self.model, gpu=self.gpus[gpu_id], tp=tp, weight_dtype=wd, kv_dtype=kd,
                                   profile=self.profile, limits=limits,
                                   gpu_memory_utilization=self.rules.gpu_memory_utilization,
                                   max_model_len=self.workload.max_model_len, dp=dp, ep=ep,
                                   spec=self.speculation(mtp) if mtp else None)
            m = dep.memory()
            if not m.fits:
                hit = (None, f"does not fit: short by {m.shortfall_bytes_per_gpu / 1e9:.1f} GB per GPU")
            else:
                hit = (StepCostModel.build(dep), "")
            self._costs[key] = hit
        return hit

    def multinode_offers(self, gpu: str, tp: int) -> tuple[Offer, ...]:
        """Offers a pipeline-parallel replica of ``gpu`` may span (``offers.multinode_offers``)."""
        return multinode_offers(self.offers_of(gpu), tp)

    def stage_nic_bytes_per_s_per_gpu(self, gpu_id: str, tp: int) -> float | None:
        """The NIC per GPU a pipeline's stage hops are priced at: the slowest of the offers a ``tp``-GPU stage
        may rent (``offers.slowest_stage_nic_bytes_per_s_per_gpu``), bytes/s; None when no offer names one."""
        return slowest_stage_nic_bytes_per_s_per_gpu(self.offers_of(gpu_id), tp)

    def _pipeline_cost(self, gpu_id: str, tp: int, wd: str, kd: str, limits: EngineLimits,
                       pp: int) -> tuple[StepCostModel | None, str]:
        """:func:`pipeline_cost_model` of ``pp`` stages over the slowest NIC of the offers it may rent
        (:meth:`stage_nic_bytes_per_s_per_gpu`)."""
        nic = self.stage_nic_bytes_per_s_per_gpu(gpu_id, tp)
        if nic is None:
            return None, f"no {gpu_id} offer with a NIC in the catalog holds a TP{tp} stage (multi-node needs one)"
        return pipeline_cost_model(model=self.model, gpu=self.gpus[gpu_id], tp=tp, weight_dtype=wd, kv_dtype=kd,
                                   profile=self.profile, limits=limits,
                                   gpu_memory_utilization=self.rules.gpu_memory_utilization,
                                   max_model_len=self.workload.max_model_len, pp=pp, stage_nic_bytes_per_s_per_gpu=nic)

    def pool_cost(self, p: Pool) -> tuple[StepCostModel | None, str]:
        """:meth:`cost_model` of a sized pool (its GPU, TP, dtypes, limits, pipeline stages, MoE layout, MTP)."""
        return self.cost_model(p.gpu, p.tp, p.weight_dtype, p.kv_dtype, p.limits, p.dp, p.ep, p.pp, p.mtp)

    def speculation(self, k: int) -> SpecDecode:
        """MTP with ``k`` draft tokens at the acceptance rate of the model catalog's ``speculative:`` entry
        (``recommender.estimator.default_acceptance``: fitted on InferenceX for DeepSeek-V3/R1), else the fallback."""
        if self.acceptance is None:
            self.acceptance = default_acceptance(default_catalog(), self.model)
        a, source = self.acceptance
        return SpecDecode(num_speculative_tokens=k, acceptance_rate=a, acceptance_source=source)

    def held_tokens_per_sequence(self) -> float:
        """Mean KV tokens one running sequence holds: its prompt, less the shared prefix (one copy for
        all sequences), and half its output: ``P x (1 - shared_prefix_fraction) + O / 2``."""
        w = self.workload
        return max(1.0, w.prompt_tokens.mean * (1.0 - w.shared_prefix_fraction) + w.output_tokens.mean / 2.0)

    def kv_sequences(self, kv_capacity_tokens: int) -> int:
        """Sequences a replica's KV cache of ``kv_capacity_tokens`` holds at the workload's mean context."""
        return max(1, int(kv_capacity_tokens // self.held_tokens_per_sequence()))

    def seqs_above_kv(self, cost: StepCostModel, limits: EngineLimits) -> str:
        """Why ``max_num_seqs`` is refused ("" if not): above the sequences the KV cache holds at the mean
        context, unless it is the grid's smallest value (then the plan says so:
        ``recommender.search.recommend_rows.kv_note``)."""
        held = self.kv_sequences(cost.kv_capacity_tokens)
        if limits.max_num_seqs <= held or limits.max_num_seqs <= self.rules.max_num_seqs_floor:
            return ""
        return (f"max_num_seqs {limits.max_num_seqs} is above the {held} sequences its KV cache holds at the "
                f"mean context ({self.held_tokens_per_sequence():,.0f} tokens): a smaller value serves the same load")

    def replica_capacity_per_s(self, c: Candidate, cost: StepCostModel, limits: EngineLimits,
                               guess_per_s: float = 1.0) -> float:
        """Cached analytic capacity (requests/s) of one aggregated replica of ``c`` at ``limits``
        (``recommender.load.capacity.analytic_capacity_per_s``, 0.5% tolerance, from below); with ``c.dp > 1``,
        of one attention rank (an engine holds ``dp`` of them)."""
        key: tuple[Any, ...] = (c.gpu, c.tp, c.weight_dtype, c.kv_dtype, c.pp, limits)
        if c.dp > 1 or c.ep or c.mtp:
            key = (c.gpu, c.tp, c.weight_dtype, c.kv_dtype, c.pp, limits, c.dp, c.ep, c.mtp)
        if key not in self._capacities:
            w = self.workload
            # another limits of the same shape is the better guess: capacities differ by tens of percent
            sibling = self._shape_capacity.get(key[:5])
            self._capacities[key] = cap = analytic_capacity_per_s(
                cost=cost, limits=limits, prompt=w.prompt_tokens, output=w.output_tokens,
                shared_prefix_fraction=w.shared_prefix_fraction, rel_tol=5e-3,
                start_per_s=sibling if sibling else guess_per_s, step=1.25 if sibling else 4.0)
            if math.isfinite(cap) and cap > 0:
                self._shape_capacity[key[:5]] = cap
        return self._capacities[key]

    def capacity_utilisation(self, ev: Evaluation) -> float:
        """Fraction of the sized pools' capacity the workload's rate uses: ``rate / saturation rate``, the
        saturation rate being the largest rate at which the pools are stable in the analytic model
        (aggregated: ``replicas x`` one replica's capacity; P/D: both pools and the KV link together).
        This is the plan's ``load_utilisation``; ``ev.utilisation`` (the busiest resource at the rate,
        which the sizing caps) grows faster than linearly near saturation. Infeasible or unpriced: that."""
        w = self.workload
        rate = w.effective_rate_per_s
        if not ev.pools or not ev.feasible or rate <= 0:
            return ev.utilisation
        c = ev.candidate
        maybe = [self.pool_cost(p)[0] for p in ev.pools]
        costs = [cost for cost in maybe if cost is not None]
        if len(costs) != len(maybe):
            return ev.utilisation
        if not c.disaggregated:
            p = ev.pools[0]
            sat = p.ranks * self.replica_capacity_per_s(c, costs[0], p.limits, rate / p.ranks)
        else:
            pp, dp = ev.pools
            sat = saturation_rate_per_s(
                lambda x: self.analyze_pd(c, PoolSpec(cost=costs[0], limits=pp.limits, replicas=pp.replicas),
                                          PoolSpec(cost=costs[1], limits=dp.limits, replicas=dp.replicas), x,
                                          ev.kv_link),
                rel_tol=5e-3, start_per_s=rate, step=1.25)
        return rate / sat if sat > 0 else math.inf

    def analyze_pd(self, c: Candidate, prefill: PoolSpec, decode: PoolSpec, rate_per_s: float,
                   link: KvLink | None = None) -> Any:
        """The analytic model of a P/D pair at ``rate_per_s`` with the workload's lengths and the pair's
        KV link (``link``, default :meth:`kv_link` on the fastest path)."""
        w = self.workload
        return analyze_disaggregated(
            Disaggregated(prefill=prefill, decode=decode, kv_link=link or self.kv_link(c)),
            Traffic(rate_per_s=rate_per_s, prompt=w.prompt_tokens, output=w.output_tokens,
                    shared_prefix_fraction=w.shared_prefix_fraction))

    @property
    def headroom(self) -> float:
        """Capacity headroom: the rules' for live traffic, none for an offline job (sized for its deadline)."""
        return 0.0 if self.workload.is_offline else self.rules.headroom

    @property
    def max_utilisation(self) -> float:
        """Utilisation cap: the rules' for live traffic; ``OFFLINE_MAX_UTILISATION`` for an offline job."""
        return OFFLINE_MAX_UTILISATION if self.workload.is_offline else self.rules.max_utilisation

    def offers_of(self, gpu: str) -> tuple[Offer, ...]:
        """The offers a pool of ``gpu`` may rent (none given, a hand-built context: one per-GPU offer)."""
        offers = self.offers.get(gpu)
        return offers if offers is not None else (workload_offer(gpu, self.prices[gpu]),)

    def fabric_path(self, offer: Offer) -> KvPath:
        """The KV path between a prefill and a decode engine on one instance of ``offer``. Each engine is its own
        process seeing only its own GPUs (CUDA_VISIBLE_DEVICES, or the device plugin in Kubernetes), so NVLink
        peer access between them is not available (NVIDIA Dynamo's disaggregation communication guide: "NVLink
        cannot be used between Kubernetes pods"); the KV is staged through host memory, bounded by the GPU's
        host link (``interconnect.host_link``, PCIe Gen5 x16 = 64 GB/s one direction on H100). An offer's
        ``fabric:`` overrides this where a deployment is known to do better."""
        ic = self.gpus[offer.gpu].interconnect
        return KvPath(kind=offer.fabric_kind or ic.host_kind,
                      bytes_per_s_per_gpu=offer.fabric_bytes_per_s or ic.host_bandwidth_bytes_per_s,
                      same_instance=True, provider=offer.provider)

    @staticmethod
    def nic_path(prefill: Offer, decode: Offer) -> KvPath:
        """The KV path between instances of two offers of one provider: the slower NIC per GPU."""
        slow = prefill if prefill.nic_bytes_per_s_per_gpu <= decode.nic_bytes_per_s_per_gpu else decode
        return KvPath(kind=slow.network.kind, bytes_per_s_per_gpu=slow.nic_bytes_per_s_per_gpu,
                      known=prefill.network.known and decode.network.known, provider=prefill.provider)

    def kv_paths(self, c: Candidate) -> list[KvPath]:
        """Every KV path a P/D candidate can get, fastest first (a same-instance path before a NIC of equal
        bandwidth): the fabric of each offer one instance of which holds a TP group of each pool, and for
        each provider renting both GPUs, the slower NIC of each pair of its offers (``recommender.offers``)."""
        out: dict[tuple[str, float, bool, bool], KvPath] = {}
        p_offers, d_offers = self.offers_of(c.gpu), self.offers_of(c.decode_gpu)
        if c.gpu == c.decode_gpu:
            for o in p_offers:
                if rent_colocated(o, [(c.tp, 1), (c.decode_tp, 1)]) is not None:
                    f = self.fabric_path(o)
                    out.setdefault((f.kind, f.bytes_per_s_per_gpu, True, True), dataclasses.replace(f, provider=""))
        for op in p_offers:
            for od in d_offers:
                if op.provider != od.provider:
                    continue
                path = self.nic_path(op, od)
                out.setdefault((path.kind, path.bytes_per_s_per_gpu, False, path.known),
                               dataclasses.replace(path, provider=""))
        return sorted(out.values(), key=lambda p: (-p.bytes_per_s_per_gpu, not p.same_instance, not p.known))

    def _pd_replicas(self, run: Callable[[int, int, float], Any], lower: tuple[int, int], caps: tuple[int, int],
                     target: float) -> tuple[int | None, int | None]:
        """Fewest (prefill, decode) replicas meeting the SLOs at ``target`` on one link: decode first with ample
        prefill (its TPOT), then prefill with that decode pool; None for a pool that misses at its cap."""
        cap_p, cap_d = caps
        rd = min_replicas(lambda k: self.ok(run(cap_p, k, target), ("tpot",)), lower[1], cap_d)
        if rd is None:
            return None, None
        decode_replicas: int = rd
        return min_replicas(lambda k: self.ok(run(k, decode_replicas, target)), lower[0], cap_p), rd

    def rent_pd(self, c: Candidate, path: KvPath, rp: int, rd: int) -> tuple[Rental, Rental] | str:
        """The cheapest rentals of ``rp`` prefill and ``rd`` decode TP groups whose KV moves over ``path``, or
        why none. Same instance: one instance of an offer with that path holds both pools,
        billed to each by its share of the GPUs; GPUs left over run more prefill replicas. Across instances:
        both pools at one provider, on offers whose NIC per GPU is at least the path's."""
        if path.same_instance:
            best: tuple[float, Offer, int, int] | None = None
            for o in self.offers_of(c.gpu):
                f = self.fabric_path(o)
                if (f.kind, f.bytes_per_s_per_gpu) != (path.kind, path.bytes_per_s_per_gpu):
                    continue
                got = rent_colocated(o, [(c.tp, rp), (c.decode_tp, rd)])
                if got is not None and (best is None or got[0] * o.usd_per_instance_hour < best[0]):
                    best = (got[0] * o.usd_per_instance_hour, o, got[0], got[1])
            if best is None:
                return f"no single {c.gpu} instance holds {rp} x TP{c.tp} + {rd} x TP{c.decode_tp}"
            _, o, inst, gpus = best
            rp_held = rp + (gpus - rp * c.tp - rd * c.decode_tp) // c.tp
            p_gpus, d_gpus = rp_held * c.tp, rd * c.decode_tp
            share_p = p_gpus / (p_gpus + d_gpus)
            return (Rental(o, c.tp, inst, rp_held, share=share_p), Rental(o, c.decode_tp, inst, rd, share=1.0 - share_p))
        for gpu, tp in ((c.gpu, c.tp), (c.decode_gpu, c.decode_tp)):
            rental, why = self.rent_pool(gpu, tp, 1)
            if rental is None:
                return why  # no offer holds a TP group of this pool at all
        choice: tuple[float, Rental, Rental] | None = None
        for provider in sorted({o.provider for o in self.offers_of(c.gpu)} & {o.provider for o in self.offers_of(c.decode_gpu)}):
            able_p, able_d = ([o for o in self.offers_of(gpu) if o.provider == provider
                               and o.nic_bytes_per_s_per_gpu >= path.bytes_per_s_per_gpu * (1 - 1e-9)]
                              for gpu in (c.gpu, c.decode_gpu))
            r_p, r_d = cheapest_rental(able_p, c.tp, rp), cheapest_rental(able_d, c.decode_tp, rd)
            if r_p is None or r_d is None:
                continue
            usd = r_p.usd_per_hour + r_d.usd_per_hour
            if choice is None or round(usd, 9) < round(choice[0], 9):
                choice = (usd, r_p, r_d)
        if choice is None:
            return f"no provider rents both pools over {path.label()}"
        cap = self.workload.max_gpus
        if cap and choice[1].replicas * c.tp + choice[2].replicas * c.decode_tp > cap:
            return f"the pools' instances exceed max_gpus {cap}"
        return choice[1], choice[2]

    def kv_link(self, c: Candidate, path: KvPath | None = None) -> KvLink:
        """The P/D KV-transfer link over ``path`` (default: the fastest of :meth:`kv_paths`): KV bytes per
        token, the path's bandwidth per GPU, both TP sizes, the fixed ``kv_transfer_latency_s`` per transfer and the
        ``kv_handoff_s`` delay per request (``recommender.load.link``)."""
        if path is None:
            paths = self.kv_paths(c)
            path = paths[0] if paths else KvPath("ethernet", self.rules.kv_transfer_bandwidth_bytes_per_s, known=False)
        return KvLink(bytes_per_token=mem.kv_cache_bytes_per_token(self.model, c.kv_dtype, 1),
                      nic_bytes_per_s=path.bytes_per_s_per_gpu, prefill_tp=c.tp, decode_tp=c.decode_tp,
                      latency_s=self.rules.kv_transfer_latency_s, handoff_s=self.rules.kv_handoff_s)

    def kv_transfer_s_per_token(self, c: Candidate) -> float:
        """Seconds to move one token's KV from a prefill replica to a decode replica at least: over the
        fastest path the candidate can get, ``kv_bytes_per_token / (min(tp_p, tp_d) x bandwidth)``."""
        return mem.kv_cache_bytes_per_token(self.model, c.kv_dtype, 1) / self.kv_link(c).bytes_per_s

    def rent_pool(self, gpu: str, tp: int, replicas: int, pp: int = 1) -> tuple[Rental | None, str]:
        """Whole instances of the cheapest offer for ``replicas`` TP groups (filled: the instances run every
        TP group they hold), or (None, why) when no offer holds a TP group or rounding exceeds max_gpus.
        ``pp`` > 1: ``replicas x pp`` stage groups on offers that name their NIC (:meth:`multinode_offers`);
        the rental's ``replicas`` then counts whole pipelines."""
        if pp > 1:
            stages = cheapest_rental(self.multinode_offers(gpu, tp), tp, replicas * pp)
            if stages is None:
                return None, f"no {gpu} offer with a NIC in the catalog holds a TP{tp} stage"
            rental: Rental | None = dataclasses.replace(stages, replicas=stages.replicas // pp, stages=pp)
            cap = self.workload.max_gpus
            if cap and stages.replicas * tp > cap:
                return None, f"{stages.instances} x {stages.offer.gpus_per_instance}-GPU instances exceed max_gpus {cap}"
            return rental, ""
        offers = self.offers.get(gpu)
        if offers is None:  # no offers given (a hand-built context): per-GPU price, no rounding
            offers = (workload_offer(gpu, self.prices[gpu]),)
        rental = cheapest_rental(offers, tp, replicas)
        owned = next((o for o in offers if o.owned and o.owned_nodes and tp <= o.gpus_per_instance), None)
        if rental is None and owned is not None:
            nodes = -(-replicas // (owned.gpus_per_instance // tp))
            return None, (f"{replicas} TP{tp} groups need {nodes} {owned.gpus_per_instance}-GPU nodes of {gpu}; "
                          f"the inventory has {owned.owned_nodes}")
        if rental is None:
            sizes = sorted({o.gpus_per_instance for o in offers})
            return None, f"no offer for {gpu} holds a TP{tp} group (instances of {sizes} GPUs)"
        cap = self.workload.max_gpus
        if cap and rental.replicas * tp > cap:
            return None, f"{rental.instances} x {rental.offer.gpus_per_instance}-GPU instances exceed max_gpus {cap}"
        return rental, ""

    def replica_cap(self, tp: int, pp: int = 1) -> int:
        cap = self.rules.max_replicas
        if self.workload.max_gpus:
            cap = min(cap, self.workload.max_gpus // (tp * pp))
        return cap

    # -- SLO checks -------------------------------------------------------------------------------

    def slo_ratios(self, res: Any) -> list[float]:
        out = []
        for s in self.workload.slos:
            v = _finite_or_inf(getattr(res, f"{s.metric}_s").at(s.percentile)) if res.stable else math.inf
            out.append(v / s.limit_s)
        return out

    def ok(self, res: Any, metrics: tuple[str, ...] | None = None) -> bool:
        """Stable, utilisation and KV peak utilisation <= max_utilisation and every SLO (of ``metrics``,
        default all) met."""
        u = self.max_utilisation
        if not res.stable or res.utilisation > u or res.kv_peak_utilisation > u:
            return False
        if not self._within_deadline(res):
            return False
        for s in self.workload.slos:
            if (metrics is None or s.metric in metrics) and not (
                    _finite_or_inf(getattr(res, f"{s.metric}_s").at(s.percentile)) <= s.limit_s):
                return False
        return True

    def why_not_ok(self, res: Any, where: str) -> str:
        """Which check of :meth:`ok` ``res`` fails, as the reason an evaluation carries: '<where> saturates', 'its
        KV cache peaks at 97% of capacity', or the SLOs it misses, each followed by ``where`` ('with 256 replicas')."""
        u = self.max_utilisation
        if not res.stable or res.utilisation > u:
            util = f"{res.utilisation:.2f}" if math.isfinite(res.utilisation) else "unbounded"
            return f"saturates {where} (utilisation {util} > {u:g})"
        if res.kv_peak_utilisation > u:
            return (f"its KV cache peaks at {res.kv_peak_utilisation:.0%} of capacity (> {u:.0%}) {where}: a replica "
                    "holds too few of these sequences (a larger TP, fp8 KV or shorter requests give it room)")
        if not self._within_deadline(res):
            return (f"its requests take {fmt_seconds(_finite_or_inf(res.e2e_s.at('p99')))} each (e2e p99) {where}, "
                    f"past the job's {fmt_seconds(self.workload.deadline_s or 0.0)} deadline")
        missed = [str(s) for s in self.workload.slos
                  if not _finite_or_inf(getattr(res, f"{s.metric}_s").at(s.percentile)) <= s.limit_s]
        return f"misses {', '.join(missed) or 'its SLOs'} {where}"

    def _within_deadline(self, res: Any) -> bool:
        """An offline job's requests end before its deadline: e2e p99 <= deadline (a job of few requests is bound
        by one request's latency, not by throughput); always True for live traffic."""
        w = self.workload
        if not w.is_offline or not w.deadline_s:
            return True
        return _finite_or_inf(res.e2e_s.at("p99")) <= w.deadline_s

    # -- sizing -----------------------------------------------------------------------------------

    def infeasible(self, c: Candidate, reason: str, fits: bool, binding: str) -> Evaluation:
        n = len(self.constraint_names)
        cons = [0.0] * n
        cons[0 if not fits else 1] = 1.0
        return Evaluation(candidate=c, feasible=False, fits=fits, constraints=tuple(cons),
                          objectives=tuple([INFEASIBLE_OBJECTIVE] * len(self.objective_names)), reason=reason, binding=binding)

    def size(self, c: Candidate, lower: tuple[int, ...] = ()) -> Evaluation:
        """Derive replicas for ``c`` (uncached; see the module docstring). ``lower``: known lower bounds on
        the replicas of each pool (prefill, decode for P/D), where the search starts; they change only the
        number of load-model calls, never the result."""
        return self._size_disagg(c, lower) if c.disaggregated else self._size_agg(c, lower)

    def price(self, c: Candidate, pools: tuple[Pool, ...], res: Any, ok: bool, reason: str = "",
              saturation_rate_per_s: float | None = None) -> Evaluation:
        """Cost, latencies, constraints and binding SLO of sized pools (formulas: module docstring).
        ``saturation_rate_per_s``: the pools' analytic capacity, which sets an offline job's running time."""
        w = self.workload
        rate = w.effective_rate_per_s
        usd_h = sum(p.usd_per_hour for p in pools)
        out_tps = rate * w.output_tokens.mean if res.stable else 0.0
        tot_tps = rate * (w.output_tokens.mean + w.prompt_tokens.mean) if res.stable else 0.0
        # an offline job runs flat out and stops when done: it pays for running x deadline, not the deadline
        running = 1.0
        if w.is_offline:
            running = min(rate / saturation_rate_per_s, 1.0) if saturation_rate_per_s else min(
                _finite_or_inf(res.utilisation), 1.0)
        usd_m = usd_h * running / (tot_tps * 3600) * 1e6 if tot_tps else math.inf
        usd_m_out = usd_h * running / (out_tps * 3600) * 1e6 if out_tps else math.inf
        lat = _latencies(res)
        ratios = self.slo_ratios(res)
        util = _finite_or_inf(res.utilisation)
        util_excess = util - self.max_utilisation if res.stable else 1.0
        cap_violation = min(1e6, max(0.0, util_excess)) if not ok else 0.0
        if not ok and cap_violation <= 0 and all(r <= 1.0 for r in ratios):
            cap_violation = 1.0  # e.g. the pools exceed max_gpus although the latencies would be met
        cons = (0.0, cap_violation, *[min(1e6, r - 1.0) for r in ratios])
        lat_obj = [min(lat[s.metric][s.percentile], INFEASIBLE_OBJECTIVE) for s in w.slos] or [
            min(lat["tpot"]["p90"], INFEASIBLE_OBJECTIVE)]
        objectives = (usd_m if math.isfinite(usd_m) else INFEASIBLE_OBJECTIVE, *lat_obj)
        binding = binding_of(self.slo_names, ratios, res)
        return Evaluation(
            candidate=c, feasible=ok, fits=True, constraints=tuple(cons), objectives=tuple(objectives), pools=pools,
            gpus_total=sum(p.gpus for p in pools), usd_per_hour=usd_h, usd_per_million_tokens=usd_m,
            usd_per_million_output_tokens=usd_m_out, output_tokens_per_s=out_tps,
            utilisation=running if w.is_offline and saturation_rate_per_s else res.utilisation,
            latencies=lat, binding=binding, reason=reason, load=res,
        )

    def _size_agg(self, c: Candidate, hint: tuple[int, ...] = ()) -> Evaluation:
        """Replicas of an aggregated candidate. With data-parallel attention (``c.dp > 1``) a replica is one
        engine of ``tp x dp`` GPUs running ``dp`` attention ranks: the load model sees ``replicas x dp`` ranks
        (each its own scheduler, requests and KV cache, as vLLM's DP ranks are), and the rental holds groups
        of ``tp x dp`` GPUs."""
        w = self.workload
        dp = c.dp
        g = c.gpus_per_replica
        limits = limits_of(c, w.max_model_len, w.prefix_caching)
        cost, why = self.cost_model(c.gpu, c.tp, c.weight_dtype, c.kv_dtype, limits, dp, c.ep, c.pp, c.mtp)
        if cost is None:
            return self.infeasible(c, why, fits=False, binding="memory")
        above = self.seqs_above_kv(cost, limits)
        if above:
            return self.infeasible(c, above, True, "KV capacity")
        rate = w.effective_rate_per_s
        target = rate * (1 + self.headroom)
        cap = self.replica_cap(g, c.pp)
        if cap < 1:
            return self.infeasible(c, f"TP {c.tp} x DP {dp} exceeds max_gpus {w.max_gpus}" if dp > 1 else
                                   f"TP {c.tp} exceeds max_gpus {w.max_gpus}", True, "capacity")

        def run(r: int, at: float) -> Any:
            return analyze(PoolSpec(cost=cost, limits=limits, replicas=r * dp),
                           Traffic(rate_per_s=at, prompt=w.prompt_tokens, output=w.output_tokens,
                                   shared_prefix_fraction=w.shared_prefix_fraction))

        # capacity lower bound: decode throughput of one replica at its largest batch
        seq = int(w.prompt_tokens.mean + w.output_tokens.mean)
        kv_seqs = max(1, cost.kv_capacity_tokens // max(seq, 1))
        b = max(1, min(limits.max_num_seqs, kv_seqs))
        step = cost.decode_step_s(b, int(w.prompt_tokens.mean + w.output_tokens.mean / 2))
        per_rank_req_s = b / step / max(w.output_tokens.mean, 1.0)
        per_replica_req_s = per_rank_req_s * dp
        lower = max([1, math.ceil(target / per_replica_req_s), *hint[:1]])
        per_replica_cap = dp * self.replica_capacity_per_s(c, cost, limits, per_rank_req_s) if w.is_offline else math.inf
        if w.is_offline and per_replica_cap > 0:  # the job ends by OFFLINE_MAX_UTILISATION x its deadline
            lower = max(lower, math.ceil(rate / (OFFLINE_MAX_UTILISATION * per_replica_cap) - 1e-9))
        r = min_replicas(lambda k: self.ok(run(k, target)), lower, cap)
        nic = (self.stage_nic_bytes_per_s_per_gpu(c.gpu, c.tp) or 0.0) if c.pp > 1 else 0.0
        if r is None:
            pools = (Pool("both", c.gpu, c.tp, cap, c.weight_dtype, c.kv_dtype, limits, self.prices[c.gpu],
                          cost.kv_capacity_tokens, pp=c.pp, dp=dp, ep=c.ep, mtp=c.mtp,
                          stage_nic_bytes_per_s_per_gpu=nic),)
            return self.price(c, pools, run(cap, rate), ok=False,
                              reason=self.why_not_ok(run(cap, target), f"even with {cap} replicas"),
                              saturation_rate_per_s=cap * per_replica_cap if w.is_offline else None)
        rental, why = self.rent_pool(c.gpu, g, r, c.pp)
        if rental is None:
            return self.infeasible(c, why, True, "capacity")
        pools = (Pool("both", c.gpu, c.tp, rental.replicas, c.weight_dtype, c.kv_dtype, limits, rental.offer.usd_per_gpu_hour,
                      cost.kv_capacity_tokens, rental, pp=c.pp, dp=dp, ep=c.ep, mtp=c.mtp,
                      stage_nic_bytes_per_s_per_gpu=nic),)
        return self.price(c, pools, run(rental.replicas, rate), ok=True,
                          saturation_rate_per_s=rental.replicas * per_replica_cap if w.is_offline else None)

    def _size_disagg(self, c: Candidate, hint: tuple[int, ...] = ()) -> Evaluation:
        """P/D: size the pools for each KV path the offers allow (:meth:`kv_paths`, fastest first: one instance
        over its fabric, then the NICs of one provider's offers), rent them, keep the cheapest (ties: the
        faster path). A slower path needs at least the replicas of a faster one, so sizing resumes from them."""
        w = self.workload
        p_limits, d_limits = pd_limits(c, w.max_model_len, w.prefix_caching)
        p_cost, why_p = self.cost_model(c.gpu, c.tp, c.weight_dtype, c.kv_dtype, p_limits)
        d_cost, why_d = self.cost_model(c.decode_gpu, c.decode_tp, c.weight_dtype, c.kv_dtype, d_limits)
        if p_cost is None or d_cost is None:
            why = why_p or why_d
            return self.infeasible(c, ("prefill pool: " if why_p else "decode pool: ") + why, False, "memory")
        above = self.seqs_above_kv(d_cost, d_limits)
        if above:
            return self.infeasible(c, "decode pool: " + above, True, "KV capacity")
        rate = w.effective_rate_per_s
        target = rate * (1 + self.headroom)
        cap_p, cap_d = self.replica_cap(c.tp), self.replica_cap(c.decode_tp)
        if cap_p < 1 or cap_d < 1:
            return self.infeasible(c, "pools exceed max_gpus", True, "capacity")
        paths = self.kv_paths(c)
        if not paths:
            return self.infeasible(c, f"no provider rents both {c.gpu} and {c.decode_gpu} (a P/D pair needs one "
                                      "network between its pools)", True, "capacity")

        def runner(link: KvLink) -> Callable[[int, int, float], Any]:
            def run(rp: int, rd: int, at: float) -> Any:
                return self.analyze_pd(c, PoolSpec(cost=p_cost, limits=p_limits, replicas=rp),
                                       PoolSpec(cost=d_cost, limits=d_limits, replicas=rd), at, link)
            return run

        def pools_of(rp: int, rd: int, rent_p: Rental | None = None, rent_d: Rental | None = None) -> tuple[Pool, ...]:
            return (Pool("prefill", c.gpu, c.tp, rp, c.weight_dtype, c.kv_dtype, p_limits,
                         rent_p.usd_per_hour / (rp * c.tp) if rent_p else self.prices[c.gpu], p_cost.kv_capacity_tokens, rent_p),
                    Pool("decode", c.decode_gpu, c.decode_tp, rd, c.weight_dtype, c.kv_dtype, d_limits,
                         rent_d.usd_per_hour / (rd * c.decode_tp) if rent_d else self.prices[c.decode_gpu],
                         d_cost.kv_capacity_tokens, rent_d))

        sized: tuple[int, int] | None = None
        best: tuple[float, int, KvPath, Rental, Rental] | None = None
        failure: Evaluation | None = None
        whys: list[str] = []
        for order, path in enumerate(paths):
            if best is not None and sized is not None:
                # a slower path needs at least these replicas and renting more never costs less: a bound
                floor = self.rent_pd(c, path, *sized)
                if isinstance(floor, str) or round(floor[0].usd_per_hour + floor[1].usd_per_hour, 9) >= round(best[0], 9):
                    continue
            link = self.kv_link(c, path)
            run = runner(link)
            if sized is None or not self.ok(run(sized[0], sized[1], target)):
                lo_p, lo_d = sized if sized is not None else (max([1, *hint[:1]]), max([1, *hint[1:2]]))
                got_p, got_d = self._pd_replicas(run, (lo_p, lo_d), (cap_p, cap_d), target)
                if got_p is None or got_d is None:  # slower paths need more: stop here
                    rd_f = got_d or cap_d
                    why = ("decode pool: " + self.why_not_ok(run(cap_p, cap_d, target), f"at its cap of {cap_d} replicas")
                           if got_d is None else "prefill pool: " + self.why_not_ok(run(cap_p, rd_f, target),
                                                                                   f"at its cap of {cap_p} replicas"))
                    failure = failure or self.price(c, pools_of(cap_p, rd_f), run(cap_p, rd_f, rate), ok=False, reason=why)
                    break
                sized = (got_p, got_d)
            rented = self.rent_pd(c, path, *sized)
            if isinstance(rented, str):
                whys.append(rented)
                continue
            rent_p, rent_d = rented
            usd = rent_p.usd_per_hour + rent_d.usd_per_hour
            if best is None or round(usd, 9) < round(best[0], 9):
                best = (usd, order, path, rent_p, rent_d)
        if best is None:
            if failure is not None:
                return failure
            return self.infeasible(c, whys[0] if whys else "no rental holds the pools", True, "capacity")
        _, _, path, rent_p, rent_d = best
        if not path.same_instance:  # the offers rented may have faster NICs than the path sized for
            path = self.nic_path(rent_p.offer, rent_d.offer)
        link = self.kv_link(c, path)
        run = runner(link)
        rp, rd = rent_p.replicas, rent_d.replicas
        ok, reason = True, ""
        if c.gpu == c.decode_gpu and rent_p.offer.owned_nodes and not rent_p.shared:
            if rent_p.instances + rent_d.instances > rent_p.offer.owned_nodes:  # both pools share the owned nodes
                ok, reason = False, f"the two pools need more than the inventory's {rent_p.offer.owned_nodes} nodes"
        if w.max_gpus and rp * c.tp + rd * c.decode_tp > w.max_gpus:
            ok, reason = False, f"the pools' instances exceed max_gpus {w.max_gpus}"
        sat = None
        if w.is_offline:  # sized for the rate: the saturation rate is near it
            sat = saturation_rate_per_s(lambda x: run(rp, rd, x), rel_tol=1e-2, start_per_s=rate, step=1.25)
            if ok and rate > OFFLINE_MAX_UTILISATION * sat:
                ok, reason = False, f"the job would end after {OFFLINE_MAX_UTILISATION:.0%} of its deadline"
        ev = self.price(c, pools_of(rp, rd, rent_p, rent_d), run(rp, rd, rate), ok=ok, reason=reason,
                        saturation_rate_per_s=sat)
        return dataclasses.replace(ev, kv_path=path, kv_link=link)
