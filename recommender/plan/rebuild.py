"""A plan row as the perf model sees it again: the one rebuild behind ``recommend replan`` and ``simulate --plan``.

A plan file records each pool's engine settings (GPU, TP, pipeline stages, dtypes, limits, MoE layout, MTP) and,
where the search priced a link, the link it priced: the KV path of a P/D row (``kv_link_model``) and the NIC
behind a pipeline's stage hops (``Pool.stage_nic_bytes_per_s_per_gpu``). :func:`pool_models` turns them back into
the step-cost models the search sized the row with (``recommender.estimator.build_deployment``, pipeline stages
included: ``recommender.perf.pipeline``), so the re-planner's prediction at the plan's own rate
is the plan's.

:func:`pool_models` predicts a row whatever checkpoint its pools were deployed with (the step costs do not depend
on it; ``deploy --checkpoint`` may have replaced the plan's). Whether the row *as written* loads is
:func:`check_row_blocks`'s to say: a pool whose layout splits the blocks of the block-quantized checkpoint it names
(``recommender.perf.blocks``) is refused by ``simulate --plan``, as ``estimate --plan`` and ``deploy`` refuse it, and
not by the re-planner, which predicts a plan already running.
"""

from __future__ import annotations

from dataclasses import dataclass

from recommender.catalog import Catalog, Gpu
from recommender.errors import ConfigError, RecommenderError
from recommender.estimator import build_deployment, mtp_spec
from recommender.hf_config import ModelArch
from recommender.load.link import KvLink
from recommender.offers import slowest_stage_nic_bytes_per_s_per_gpu
from recommender.perf import memory as mem
from recommender.perf.blocks import block_split_error
from recommender.perf.pipeline import why_not_pipelined
from recommender.perf.step import Deployment, EngineLimits, StepCostModel
from recommender.plan.types import Pool, PlanRow
from recommender.profiles import EngineProfile

__all__ = ["PoolModel", "check_row_blocks", "engine_limits", "pool_block_split_error", "pool_models", "row_kv_link",
           "stage_nic_bytes_per_s_per_gpu"]


@dataclass(frozen=True)
class PoolModel:
    """One pool of a plan row under the perf model: its engine's step costs, the limits vLLM was given, and the
    deployment of one replica."""

    pool: Pool
    deployment: Deployment
    cost: StepCostModel
    limits: EngineLimits

    @property
    def ranks(self) -> int:
        """Schedulers the load model runs: one per attention rank, ``replicas x data_parallel_size``."""
        return self.pool.replicas * self.pool.data_parallel_size


def engine_limits(pool: Pool, max_model_len: int) -> EngineLimits:
    """The limits vLLM was given for ``pool``; without chunked prefill (or without a budget) a step must hold a
    whole prompt, so the token budget is at least max(``max_model_len``, 2048), as the search set it."""
    budget = pool.max_num_batched_tokens
    if not pool.chunked_prefill or budget <= 0:
        budget = max(budget, max_model_len, 2048)
    return EngineLimits(max_num_seqs=pool.max_num_seqs, max_num_batched_tokens=budget,
                        chunked_prefill=pool.chunked_prefill, enable_prefix_caching=pool.enable_prefix_caching)


def stage_nic_bytes_per_s_per_gpu(pool: Pool, gpu: Gpu) -> float:
    """The NIC per GPU (bytes/s) behind ``pool``'s stage hops: the one its plan recorded, else (a plan written
    before it was recorded) the slowest of the catalog's offers of ``gpu`` that hold a stage and name a NIC, as
    the search chose it (``recommender.sizing.Sizer.stage_nic_bytes_per_s_per_gpu``)."""
    if pool.stage_nic_bytes_per_s_per_gpu is not None:
        return pool.stage_nic_bytes_per_s_per_gpu
    nic = slowest_stage_nic_bytes_per_s_per_gpu(gpu.offers, pool.tp)
    if nic is None:
        raise RecommenderError(f"the plan's {gpu.id} TP{pool.tp} x PP{pool.pp} pool records no NIC for its stage hops "
                               f"and no {gpu.id} offer in the catalog names one; re-plan from the workload file")
    return nic


def _pool_model(pool: Pool, *, model: ModelArch, gpu: Gpu, profile: EngineProfile, catalog: Catalog,
                max_model_len: int) -> PoolModel:
    limits = engine_limits(pool, max_model_len)
    what = f"the plan's {gpu.id} TP{pool.tp}{f' x PP{pool.pp}' if pool.pp > 1 else ''} {pool.weight_dtype} pool"
    why = why_not_pipelined(model, pool.pp)
    if why:
        raise RecommenderError(f"{what} is no longer modelled ({why}); re-plan from the workload file")
    dep = build_deployment(model=model, gpu=gpu, tp=pool.tp, weight_dtype=pool.weight_dtype, kv_dtype=pool.kv_dtype,
                           profile=profile, limits=limits, gpu_memory_utilization=pool.gpu_memory_utilization,
                           cuda_graphs=pool.cuda_graphs, max_model_len=max_model_len, dp=pool.data_parallel_size,
                           ep=pool.enable_expert_parallel, spec=mtp_spec(model, pool.num_speculative_tokens, catalog),
                           pp=pool.pp, stage_nic_bytes_per_s_per_gpu=(stage_nic_bytes_per_s_per_gpu(pool, gpu)
                                                                      if pool.pp > 1 else 0.0))
    if not dep.memory().fits:
        raise RecommenderError(f"{what} no longer fits in memory under this profile; re-plan from the workload file")
    return PoolModel(pool, dep, StepCostModel.build(dep), limits)


def pool_models(row: PlanRow, *, model: ModelArch, profile: EngineProfile, catalog: Catalog,
                max_model_len: int) -> tuple[PoolModel, ...]:
    """Per pool of ``row`` (prefill first, as the plan lists them): its :class:`PoolModel` under ``profile``
    (specialised to each GPU's family by ``build_deployment``). Raises RecommenderError, naming the pool, when
    one no longer fits or is no longer modelled (a changed profile or catalog)."""
    return tuple(_pool_model(p, model=model, gpu=catalog.gpu(p.gpu), profile=profile, catalog=catalog,
                             max_model_len=max_model_len) for p in row.pools)


def pool_block_split_error(pool: Pool, *, model: ModelArch, catalog: Catalog, checkpoint: str) -> str | None:
    """:func:`recommender.perf.blocks.block_split_error`'s line where ``pool``'s layout (TP, DP, EP) splits the blocks
    of the checkpoint it loads, ``checkpoint`` ("" = the model's own repo, at its own dtype or quantized at load), as
    :meth:`Catalog.weight_block_for` resolves it at the pool's weight dtype; None where it loads (or the checkpoint
    is not block-quantized, or unknown)."""
    found = catalog.weight_block_for(model, pool.weight_dtype, checkpoint)
    if found is None:
        return None
    return block_split_error(model, found[1], tp=pool.tp, dp=pool.data_parallel_size, ep=pool.enable_expert_parallel,
                             checkpoint=found[0])


def check_row_blocks(row: PlanRow, *, model: ModelArch, catalog: Catalog, checkpoint: str | None = None) -> None:
    """Refuse (ConfigError, :func:`pool_block_split_error`'s one line, as ``estimate`` words it) a row with a pool vLLM
    would refuse to load: its layout splits the blocks of the checkpoint it loads, ``checkpoint`` where given
    (``--checkpoint``: every pool's; "" = the model's own repo), else the pool's, else the row's (as ``estimate --plan``
    and ``deploy`` read a plan's pools)."""
    for pool in row.pools:
        why = pool_block_split_error(pool, model=model, catalog=catalog,
                                     checkpoint=checkpoint if checkpoint is not None else pool.checkpoint or row.checkpoint)
        if why:
            raise ConfigError(why)


def row_kv_link(row: PlanRow, model: ModelArch, prefill: Pool, decode: Pool, *,
                default_bytes_per_s_per_gpu: float, default_latency_s: float) -> KvLink:
    """The KV link of a P/D row: the one the search sized it with (``kv_link_model``: bytes per token, NIC per
    GPU, both TPs, latency, handoff), else (older plans) its path's bandwidth (``kv_link``) or the default, at the
    default latency, for the prefill pool's KV dtype. A plan written before the P/D handoff was priced (no
    ``handoff_s``) is rebuilt as it was sized, without one."""
    kl = row.kv_link_model
    if kl:
        return KvLink(bytes_per_token=float(kl["bytes_per_token"]), nic_bytes_per_s=float(kl["nic_bytes_per_s"]),
                      prefill_tp=int(kl.get("prefill_tp", prefill.tp)),
                      decode_tp=int(kl.get("decode_tp", decode.tp)), latency_s=float(kl.get("latency_s", 0.0)),
                      handoff_s=float(kl.get("handoff_s", 0.0)))
    nic = row.kv_link.bytes_per_s_per_gpu if row.kv_link is not None else default_bytes_per_s_per_gpu
    return KvLink(bytes_per_token=mem.kv_cache_bytes_per_token(model, prefill.kv_dtype, 1), nic_bytes_per_s=nic,
                  prefill_tp=prefill.tp, decode_tp=decode.tp, latency_s=default_latency_s)
