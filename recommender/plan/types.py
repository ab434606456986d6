"""Frozen plan types: what ``recommend`` returns and what a plan file holds.

A :class:`Plan` is data only: the search builds one from its evaluations (``recommender.search.planner``),
:func:`recommender.plan.load_plan` builds one from a file, and every consumer (table/JSON/YAML/CSV
renderers, deploy, replan, simulate) reads these types, never the JSON. Adding a field is one line here
(with a default, so older files still load); the file edge (``recommender.plan.io``) validates it from
the type annotation.

Units are in the names (``_s`` seconds, ``usd_per_hour``). Two utilisations exist and are kept apart:
``Pool.gpu_memory_utilization`` is the vLLM engine setting (fraction of GPU memory vLLM may use);
``PlanRow.load_utilisation`` is how busy the deployment is at the workload's rate (busiest resource,
0..1; above ~0.85 queues grow fast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from recommender.offers import OwnedGpus
from recommender.workload import Slo


class PoolRole(str, Enum):
    """What a pool of replicas serves: everything (aggregated), or one side of a prefill/decode split."""

    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class Offer:
    """The dated price list entry a pool rents (catalogs/gpus ``offers:``)."""

    sku: str = ""
    date: str = ""
    source: str = ""
    per_gpu_billing: bool = False  # the provider bills per GPU (a TP group may take part of an instance)


@dataclass(frozen=True)
class Rental:
    """Whole instances of one provider's offer that hold a pool's TP groups."""

    provider: str
    instances: int
    gpus_per_instance: int
    usd_per_instance_hour: float
    usd_per_hour: float  # instances x usd_per_instance_hour (per-GPU billing: GPUs x its per-GPU price)
    offer: Offer = field(default_factory=Offer)
    shared: bool = False  # P/D on one instance: both pools name it, each billed its share of the GPUs
    network: str = ""  # the offer's NIC (``efa 400 Gb/s per GPU``); "" = not in the catalog (10 Gb/s Ethernet assumed)
    rdma_resource: str = ""  # the Kubernetes device resource of the offer's RDMA NICs ("" = not known)
    rdma_per_gpu: float = 0.0  # those devices per GPU


@dataclass(frozen=True)
class KvLinkInfo:
    """P/D: where a prompt's KV moves from the prefill to the decode pool (``recommender.offers.KvPath``):
    ``kind`` an intra-instance fabric (nvlink4, xgmi, pcie5) when ``same_instance``, else the NIC kind
    (infiniband, roce, efa, ethernet); ``bytes_per_s_per_gpu`` one direction (a transfer runs on
    min(tp_p, tp_d) GPUs); ``known`` False when the NIC was assumed (not in the catalog)."""

    kind: str
    bytes_per_s_per_gpu: float
    same_instance: bool = False
    rdma: bool = False
    known: bool = True
    label: str = ""  # ``pcie5 64 GB/s (same instance)`` / ``efa 400 Gb/s``: what one transfer gets


@dataclass(frozen=True)
class PoolEvidence:
    """One pool's GPU, its family, and how many measured rows the efficiency profile has on that family."""

    gpu: str
    family: str
    measured_rows: int


@dataclass(frozen=True)
class Evidence:
    """What a plan's numbers rest on: the efficiency profile and, per pool, the measurements behind it."""

    profile: str
    engine: str
    measured: bool = False  # every pool's family has measured rows
    error_band: float = 0.0  # relative error band used when ranking unmeasured against measured plans
    pools: tuple[PoolEvidence, ...] = ()

    def unmeasured_families(self) -> list[str]:
        return sorted({p.family or p.gpu for p in self.pools if p.measured_rows == 0})


@dataclass(frozen=True)
class Pool:
    """One pool of identical vLLM replicas (a TP group each) and the engine settings they run."""

    role: PoolRole
    gpu: str
    tp: int
    replicas: int
    weight_dtype: str
    kv_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    cuda_graphs: bool = True
    gpu_memory_utilization: float = 0.92
    usd_per_gpu_hour: float | None = None
    kv_capacity_tokens: int | None = None
    checkpoint: str = ""  # pre-quantized checkpoint repo for this pool ("" = the plan's, else the model's)
    weights_bytes: float | None = None  # modelled weight bytes (only for models outside the catalog)
    rental: Rental | None = None  # the instances the pool rents (None: priced per GPU, or no price)
    pp: int = 1  # pipeline stages per replica, each a TP group on its own instance (multi-node: --pipeline-parallel-size)
    # MoE engine layout (vLLM flags; defaults = plain TP, left out of the file): attention ranks per replica
    # (--data-parallel-size; a replica runs tp x dp GPUs), --enable-expert-parallel, MTP draft tokens
    # (--speculative-config '{"method": "mtp", "num_speculative_tokens": k}'; 0 = off)
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    num_speculative_tokens: int = 0
    # pp > 1: the NIC per GPU (bytes/s) the search priced the stage hops at, so the re-planner and `simulate --plan`
    # rebuild the same pipeline (recommender.plan.rebuild); None: plain TP, or a plan written before
    stage_nic_bytes_per_s_per_gpu: float | None = None

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one replica (one vLLM engine): tp x pp x data_parallel_size."""
        return self.tp * self.pp * self.data_parallel_size

    @property
    def gpus(self) -> int:
        """GPUs the pool runs: tp x pp x data_parallel_size x replicas."""
        return self.gpus_per_replica * self.replicas

    @property
    def usd_per_hour(self) -> float | None:
        """The rental's USD per hour, else usd_per_gpu_hour x GPUs (None when the plan carries no price)."""
        if self.rental is not None:
            return self.rental.usd_per_hour
        return None if self.usd_per_gpu_hour is None else self.usd_per_gpu_hour * self.gpus


@dataclass(frozen=True)
class PlanRow:
    """One ranked deployment: its pools, modelled latencies at the workload's rate, and its cost.

    ``latency_percentiles`` maps metric (ttft | tpot | e2e) -> percentile (mean, p50, p90, p95, p99) ->
    seconds; ``ttft_s`` / ``tpot_s`` / ``e2e_s`` are the headline values at ``percentile``.
    """

    rank: int
    id: str
    pools: tuple[Pool, ...]
    max_model_len: int
    percentile: str = "p90"
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    latency_percentiles: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    output_tokens_per_s: float | None = None
    load_utilisation: float | None = None
    usd_per_hour: float | None = None
    usd_per_million_output_tokens: float | None = None
    usd_per_million_tokens: float | None = None
    pareto: bool = True
    binding: str = ""
    quality_note: str = ""
    checkpoint: str = ""
    weights_bytes: float | None = None
    simulated: Mapping[str, Any] | None = None  # simulator check: {"ttft_s": {pct: s}, ..., "completed", "preempted"}
    pd_saving_vs_aggregated: float | None = None  # P/D rows: fraction cheaper per token than the best aggregated plan
    evidence: Evidence | None = None
    # "int8/fp8": weight/KV dtypes of twins that predict exactly this row's numbers, collapsed into it (#31)
    twin_dtypes: tuple[str, ...] = ()
    kv_link: KvLinkInfo | None = None  # P/D rows: the path the KV moves over (what the search sized with)
    # P/D: that link's load-model fields (``recommender.load.link.KvLink``: bytes per token, NIC bytes/s, TPs,
    # latency), so ``simulate --plan`` replays the transfer the row was sized with
    kv_link_model: Mapping[str, float] | None = None
    bands: Mapping[str, Any] | None = None  # p10-p90 bands and P(SLO met) from the evidence class (search/bands.py)

    @property
    def disaggregated(self) -> bool:
        return any(p.role is not PoolRole.BOTH for p in self.pools)

    @property
    def main_pool(self) -> Pool:
        """The decode pool of a P/D plan, the only pool otherwise (what ``gpu``/``tp``/``replicas`` describe)."""
        return self.pools[-1]

    @property
    def gpu(self) -> str:
        return self.main_pool.gpu

    @property
    def tp(self) -> int:
        return self.main_pool.tp

    @property
    def replicas(self) -> int:
        return self.main_pool.replicas

    @property
    def weight_dtype(self) -> str:
        return self.main_pool.weight_dtype

    @property
    def kv_dtype(self) -> str:
        return self.main_pool.kv_dtype

    @property
    def gpus_total(self) -> int:
        """GPUs of all pools: sum of tp x data_parallel_size x replicas."""
        return sum(p.gpus for p in self.pools)

    @property
    def providers(self) -> tuple[str, ...]:
        """The providers the pools rent from (sorted, unique)."""
        return tuple(sorted({p.rental.provider for p in self.pools if p.rental is not None}))

    @property
    def instances(self) -> int:
        """Whole instances rented over all pools: a P/D instance both pools share counts once, and GPUs billed per
        GPU at the workload's own prices (``--price``) count none (no instance is rented; owned nodes count)."""
        shared = sum(1 for p in self.pools if p.rental is not None and p.rental.shared)
        return sum(p.rental.instances for p in self.pools if p.rental is not None and not p.rental.shared
                   and (p.rental.provider == "owned" or not p.rental.offer.per_gpu_billing)) + (
            max((p.rental.instances for p in self.pools if p.rental is not None and p.rental.shared), default=0)
            if shared else 0)

    @property
    def pool_replicas(self) -> tuple[int, ...]:
        """Replica count per pool, in pool order (prefill first for P/D)."""
        return tuple(p.replicas for p in self.pools)

    def latency(self, metric: str, percentile: str) -> float:
        """Modelled ``metric`` at ``percentile`` in seconds (inf when the plan does not say)."""
        v = self.latency_percentiles.get(metric, {}).get(percentile)
        if v is None and percentile == self.percentile:
            v = {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2e": self.e2e_s}.get(metric)
        return math.inf if v is None else float(v)

    def label(self) -> str:
        """'h100-sxm TP4 x2', 'b200 TP2 DP4 EP MTP2 x1' or 'P 2xh200 TP2 + D 1xh200 TP4': the search's row label
        (``RankedRow.label``) for the same row."""
        if self.disaggregated:
            p, d = self.pools
            return f"P {p.replicas}x{p.gpu} TP{p.tp} + D {d.replicas}x{d.gpu} TP{d.tp}"
        p = self.pools[0]
        suffix = layout_suffix(pp=p.pp, dp=p.data_parallel_size, ep=p.enable_expert_parallel, mtp=p.num_speculative_tokens)
        return f"{p.gpu} TP{p.tp}{suffix} x{p.replicas}"


def layout_suffix(*, pp: int = 1, dp: int = 1, ep: bool = False, mtp: int = 0) -> str:
    """An engine's layout beyond TP, each part only where set: ``' PP2 DP8 EP MTP2'`` (the plan's and the search's
    row labels; the re-planner's description lower-cases it)."""
    return ((f" PP{pp}" if pp > 1 else "") + (f" DP{dp}" if dp > 1 else "") + (" EP" if ep else "")
            + (f" MTP{mtp}" if mtp else ""))


@dataclass(frozen=True)
class LengthSummary:
    """A token-length distribution as the plan echoes it (the workload file keeps the full form)."""

    dist: str
    mean: float
    p50: int | None = None
    p90: int | None = None
    p99: int | None = None
    min: int | None = None
    max: int | None = None
    # the distribution's own parameters (``recommender.workload.LengthDist``), so that ``simulate --plan`` draws
    # the lengths the plan was made for; absent in plans written before #31 (the source file is read instead)
    mean_param: float | None = None
    std_param: float | None = None
    samples: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()


@dataclass(frozen=True)
class GpuPrice:
    """A price the user gave for a GPU (``--price GPU=$X/h``, ``prices:``), USD per GPU-hour."""

    gpu: str
    usd_per_gpu_hour: float


@dataclass(frozen=True)
class WorkloadEcho:
    """The workload the plan was made for, as far as consumers of the plan need it."""

    model: str
    hf_repo: str | None = None  # None: take the model catalog's
    checkpoint_dtype: str | None = None
    name: str = "workload"
    arrival_rate_per_s: float | None = None
    offline_requests: int | None = None
    deadline_s: float | None = None
    prompt_tokens: LengthSummary | None = None
    output_tokens: LengthSummary | None = None
    max_model_len: int | None = None
    shared_prefix_fraction: float = 0.0
    source: str = ""
    params: float | None = None  # parameter count, only for models outside the catalog
    gpus: tuple[str, ...] | None = None  # the GPU types the workload allowed (None: every priced catalog GPU)
    inventory: tuple[OwnedGpus, ...] = ()  # GPUs the user owns (--inventory): re-planning stays on them
    prices: tuple[GpuPrice, ...] = ()  # the workload's own prices (--price / prices:): re-planning keeps them


@dataclass(frozen=True)
class SearchMeta:
    """How the search ran (the plan's ``search`` block); every field optional for hand-written plans."""

    seed: int | None = None
    trials: int | None = None
    evaluations: int | None = None
    seconds: float | None = None
    study_name: str | None = None
    storage: str | None = None
    objectives: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    evaluations_per_s: float | None = None
    headroom: float = 0.0
    verified: int | None = None
    pricing: str | None = None  # how pools were priced (offers, providers considered)
    trials_run: int | None = None  # trials this run evaluated (``trials``: all ranked, with a stored study)
    trials_asked: int | None = None
    timeout_s: float | None = None
    stopped_by: str | None = None  # "timeout" | "trials" | None (rank 1 proven / search complete)
    search_complete: bool | None = None
    aggregated_rank1_proven: bool | None = None  # a P/D rank 1's aggregated rival was proven cheapest (P/D note)
    rank1_proven: bool | None = None
    rank1_proven_after: int | None = None
    shapes: int | None = None
    pruned: int | None = None
    workers: int | None = None
    rate_basis: str | None = None  # what the workload's arrival_rate_per_s is ("mean"; None: plans made before)
    sized_rate_per_s: float | None = None  # the rate replicas were sized for: arrival_rate_per_s x (1 + headroom)
    verification: str | None = None  # what the simulator's verification changed (None: every checked plan passed)
    sensitivity: Mapping[str, Any] | None = None  # how far rank 1 holds (recommender.search.sensitivity)
    confidence: float | None = None  # --confidence asked (above 0.5): rows ranked only with P(all SLOs met) >= this
    confidence_met: bool | None = None  # False: no evaluated plan reached it, rows ranked by P instead (the why says so)


@dataclass(frozen=True)
class Plan:
    """Ranked rows, the reason rank 1 wins, the workload and SLOs they were made for, and how the search ran.

    ``evaluations`` holds the search's own evaluation objects when the plan comes straight from
    :func:`recommender.search.recommend` (for the Pareto chart); it is never written to a file.
    """

    workload: WorkloadEcho
    rows: tuple[PlanRow, ...]
    slos: tuple[Slo, ...] = ()
    why: str = ""
    engine: str = "vllm"
    profile: str = "vllm"
    search: SearchMeta = field(default_factory=SearchMeta)
    replan: Mapping[str, Any] | None = None  # the re-planner's stamp on a plan it wrote (run id, deployment, time)
    evaluations: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    @property
    def top(self) -> PlanRow:
        """The rank-1 row (lowest rank)."""
        return min(self.rows, key=lambda r: r.rank)

    def row(self, rank: int) -> PlanRow | None:
        return next((r for r in self.rows if r.rank == rank), None)

    def sized_rate_per_s(self) -> float | None:
        """Arrival rate (req/s) the plan was sized for: the workload's rate x (1 + the search's headroom);
        None for offline plans."""
        if self.search.sized_rate_per_s is not None:
            return self.search.sized_rate_per_s
        r = self.workload.arrival_rate_per_s
        return None if r is None else r * (1.0 + self.search.headroom)
