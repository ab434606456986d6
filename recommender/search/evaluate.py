"""The search's evaluator: validity of a candidate in the space, then sizing (``recommender.sizing``), cached.

:class:`SearchContext` is the :class:`~recommender.sizing.Sizer` of one search plus the policy and an
:class:`Evaluator` (the cache of every candidate evaluated). The Optuna study, the shape search, the
exhaustive reference and the tests all call :func:`evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from recommender.search.policy import SearchPolicy
from recommender.search.space import layout_valid, parallelism_valid, pd_pair_valid, weight_dtype_valid
from recommender.load.link import KvLink
from recommender.offers import Rental
from recommender.sizing import (
    BOTTLENECK_NAMES,
    INFEASIBLE_OBJECTIVE,
    OFFLINE_MAX_UTILISATION,
    Candidate,
    Evaluation,
    Pool,
    Sizer,
    SizingRules,
    binding_of,
)

__all__ = ["INFEASIBLE_OBJECTIVE", "Evaluation", "Evaluator", "Pool", "SearchContext", "evaluate",
           "headroom", "kv_link", "kv_transfer_s_per_token", "max_utilisation", "rent_pool", "rules_of",
           "binding_of", "BOTTLENECK_NAMES", "OFFLINE_MAX_UTILISATION"]


def rules_of(policy: SearchPolicy) -> SizingRules:
    return SizingRules(headroom=policy.headroom, max_utilisation=policy.max_utilisation,
                       gpu_memory_utilization=policy.gpu_memory_utilization, max_replicas=policy.max_replicas,
                       kv_transfer_bandwidth_bytes_per_s=policy.kv_transfer_bandwidth_bytes_per_s,
                       kv_transfer_latency_s=policy.kv_transfer_latency_s, kv_handoff_s=policy.kv_handoff_s,
                       max_num_seqs_floor=min(policy.max_num_seqs, default=0))


class Evaluator:
    """Evaluates candidates once each (keyed by :attr:`Candidate.key`) and counts the fresh ones."""

    def __init__(self, ctx: "SearchContext") -> None:
        self._ctx = ctx
        self._cache: dict[str, Evaluation] = {}
        self.fresh = 0

    def __call__(self, c: Candidate, lower: tuple[int, ...] = ()) -> Evaluation:
        """The evaluation of ``c``; ``lower``: lower bounds on its replicas (see ``Sizer.size``)."""
        hit = self._cache.get(c.key)
        if hit is None:
            self.fresh += 1
            hit = self._cache[c.key] = self._evaluate(c, lower)
        return hit

    def cached(self, c: Candidate) -> bool:
        return c.key in self._cache

    def __len__(self) -> int:
        return len(self._cache)

    def __iter__(self) -> Iterator[Evaluation]:
        return iter(list(self._cache.values()))

    def _evaluate(self, c: Candidate, lower: tuple[int, ...]) -> Evaluation:
        ctx = self._ctx
        if c.disaggregated:
            why_pair = pd_pair_valid(ctx.gpus[c.gpu], ctx.gpus[c.decode_gpu], c.tp, c.decode_tp,
                                     ctx.policy.pd_heterogeneous_gpus)
            if why_pair:
                return ctx.infeasible(c, why_pair, fits=False, binding="invalid")
        for gpu_id, tp in ((c.gpu, c.tp), (c.decode_gpu, c.decode_tp)) if c.disaggregated else ((c.gpu, c.tp),):
            gpu = ctx.gpus[gpu_id]
            why = (parallelism_valid(ctx.model, gpu, tp) or weight_dtype_valid(ctx.model, gpu, c.weight_dtype, c.kv_dtype)
                   or (ctx.layout_why(gpu_id, tp, 1, False, c.weight_dtype) if c.disaggregated else None))
            if why:
                role = ("prefill pool: " if gpu_id == c.gpu and tp == c.tp else "decode pool: ") if c.disaggregated else ""
                return ctx.infeasible(c, role + why, fits=False, binding="invalid")
        if c.dp > 1 or c.ep or not c.disaggregated:
            why = "data-parallel attention and expert parallelism are searched for aggregated pools only" \
                if c.disaggregated else ctx.layout_why(c.gpu, c.tp, c.dp, c.ep, c.weight_dtype)
            if why:
                return ctx.infeasible(c, why, fits=False, binding="invalid")
        if c.mtp:
            why = ("MTP speculative decoding is searched for aggregated single-instance pools only"
                   if c.disaggregated or c.pp > 1 else
                   f"{ctx.model.id} has no MTP heads (config num_nextn_predict_layers is 0)" if ctx.model.mtp_layers <= 0
                   else "")
            if why:
                return ctx.infeasible(c, why, fits=False, binding="invalid")
        return ctx.size(c, lower)


@dataclass
class SearchContext(Sizer):
    """What every evaluation of one search shares: the sizer, the policy, the checkpoints and the cache."""

    policy: SearchPolicy = field(default_factory=SearchPolicy)
    checkpoints: dict[str, str] = field(default_factory=dict)
    #: weight dtype -> (the block-quantized checkpoint the plan would load, its (block_n, block_k)):
    #: ``Catalog.weight_block_for``; a layout that splits a block is invalid (``recommender.perf.blocks``)
    weight_blocks: dict[str, tuple[str, tuple[int, int]]] = field(default_factory=dict)
    evaluator: Evaluator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.evaluator = Evaluator(self)

    def layout_why(self, gpu: str, tp: int, dp: int, ep: bool, weight_dtype: str) -> str | None:
        """``layout_valid`` of one engine at ``weight_dtype``, with the block size of the checkpoint it would load."""
        ckpt, block = self.weight_blocks.get(weight_dtype, ("", None))
        return layout_valid(self.model, self.gpus[gpu], tp, dp, ep, weight_block=block, checkpoint=ckpt)

    @property
    def evaluations(self) -> int:
        """Candidates evaluated so far (each once)."""
        return self.evaluator.fresh


def evaluate(ctx: SearchContext, c: Candidate, lower: tuple[int, ...] = ()) -> Evaluation:
    """Validity, replicas, latencies and price of ``c`` (cached per context)."""
    return ctx.evaluator(c, lower)


def headroom(ctx: SearchContext) -> float:
    """See :attr:`recommender.sizing.Sizer.headroom`."""
    return ctx.headroom


def max_utilisation(ctx: SearchContext) -> float:
    """See :attr:`recommender.sizing.Sizer.max_utilisation`."""
    return ctx.max_utilisation


def kv_link(ctx: SearchContext, c: Candidate) -> KvLink:
    """See :meth:`recommender.sizing.Sizer.kv_link`."""
    return ctx.kv_link(c)


def kv_transfer_s_per_token(ctx: SearchContext, c: Candidate) -> float:
    """See :meth:`recommender.sizing.Sizer.kv_transfer_s_per_token`."""
    return ctx.kv_transfer_s_per_token(c)


def rent_pool(ctx: SearchContext, gpu: str, tp: int, replicas: int) -> tuple[Rental | None, str]:
    """See :meth:`recommender.sizing.Sizer.rent_pool`."""
    return ctx.rent_pool(gpu, tp, replicas)
