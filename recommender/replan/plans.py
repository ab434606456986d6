"""Small helpers on the typed plan (:class:`recommender.plan.Plan`) for the re-planner: read, check, compare.

The re-planner treats a plan's rank-1 row (:attr:`Plan.top`) as "the deployment". Two rows have the same
*shape* when everything the deployment runs is equal except what follows from the replica counts; then a
change between them is a pure scale-out/in that can be capped per step (``recommender.plan.cost.with_replicas``
does the resizing) and applied by scaling the engine Deployments.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from recommender.errors import ConfigError, RecommenderError
from recommender.plan import Plan, PlanRow, Pool, layout_suffix, load_plan
from recommender.render.plan import deployment_cell


def check_plan(plan: Any, where: str) -> Plan:
    """``plan`` when it is a :class:`Plan` whose rank-1 row carries a cost (``usd_per_hour``) and non-negative
    replica counts; otherwise ConfigError naming what is missing."""
    if not isinstance(plan, Plan) or not plan.rows:
        raise ConfigError(f"{where}: not a plan (needs at least one ranked row; see `recommend --format json`)")
    row = plan.top
    if row.usd_per_hour is None:
        raise ConfigError(f"{where}: plan {row.id!r} (rank {row.rank}) has no usd_per_hour; re-plan with prices")
    if any(p.replicas < 0 for p in row.pools):
        raise ConfigError(f"{where}: plan {row.id!r} has a negative replica count {row.pool_replicas}")
    return plan


def load_current(path: str | Path) -> Plan:
    """Read a plan file through the one reader (:func:`recommender.plan.load_plan`: versions 1 and 2, checked
    field by field) and :func:`check_plan` it."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"current plan {p} does not exist; create it with `recommend WORKLOAD --format json > {p}`")
    return check_plan(load_plan(p), str(p))


def stored_plan(doc: Mapping[str, Any] | None, where: str = "stored plan") -> Plan | None:
    """A plan kept as JSON (a history row: version 2, or version 1 / dict documents written by older
    re-planners) read through :func:`recommender.plan.load_plan` and checked; None when absent or unreadable."""
    if not doc:
        return None
    try:
        return check_plan(load_plan(doc), where)
    except RecommenderError:
        return None


def usd_per_hour(plan: Plan) -> float:
    """USD per hour of the rank-1 row (a checked plan always has one)."""
    usd = plan.top.usd_per_hour
    if usd is None:
        raise ConfigError(f"plan {plan.top.id!r} has no usd_per_hour")
    return usd


def _pool_shape(pool: Pool) -> Pool:
    """``pool`` without what follows from its replica count: replicas, KV capacity, rented instances and $/h."""
    rental = None if pool.rental is None else dataclasses.replace(pool.rental, instances=0, usd_per_hour=0.0)
    return dataclasses.replace(pool, replicas=0, kv_capacity_tokens=None, rental=rental)


def shape(row: PlanRow) -> tuple[tuple[Pool, ...], str, float | None]:
    """What the deployment runs, replica-derived fields excluded: per pool its role, GPU, TP, dtypes, engine
    settings, price and offer (:func:`_pool_shape`), and the row's checkpoint and weight bytes. Modelled
    figures (latencies, throughput, costs, ``max_model_len``, which follows the observed lengths) are not part
    of it."""
    return tuple(_pool_shape(p) for p in row.pools), row.checkpoint, row.weights_bytes


def same_shape(a: PlanRow, b: PlanRow) -> bool:
    return shape(a) == shape(b)


def same_deployment(a: PlanRow, b: PlanRow) -> bool:
    """Same shape and the same replica counts: nothing to roll out."""
    return same_shape(a, b) and a.pool_replicas == b.pool_replicas


def describe(plan: Plan) -> str:
    """'h100-sxm tp4 fp8/fp8 x2 replicas ($31.90/h)', 'b200 tp1 dp8 ep fp8/fp8 x4 replicas ($192.00/h)'; P/D: 'h200 P 2xTP2 + D 1xTP4 bf16/fp8 disaggregated ($50.40/h)'
    (each pool's replicas x TP, as the plan table's deployment cell: one TP for both pools misread a prefill pool
    of TP2 replicas as TP4)."""
    r = plan.top
    usd = "-" if r.usd_per_hour is None else f"{r.usd_per_hour:.2f}"
    if r.disaggregated:
        return f"{deployment_cell(r.pools)} {r.weight_dtype}/{r.kv_dtype} disaggregated (${usd}/h)"
    pool = r.pools[0]
    layout = layout_suffix(pp=pool.pp, dp=pool.data_parallel_size, ep=pool.enable_expert_parallel,
                           mtp=pool.num_speculative_tokens).lower()
    return f"{r.gpu} tp{r.tp}{layout} {r.weight_dtype}/{r.kv_dtype} x{r.replicas} replicas (${usd}/h)"


#: engine settings a re-plan may change on the same GPUs, with how a change of each reads
_SETTINGS: tuple[tuple[str, str], ...] = (
    ("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "max_num_batched_tokens"),
    ("chunked_prefill", "chunked prefill"), ("enable_prefix_caching", "prefix caching"),
    ("gpu_memory_utilization", "gpu_memory_utilization"), ("cuda_graphs", "CUDA graphs"))


def settings_change(a: PlanRow, b: PlanRow) -> str:
    """The engine settings that differ between pools in the same place of ``a`` and ``b`` ('max_num_seqs 16 ->
    128, chunked prefill off -> on'; P/D: prefixed with the pool's role), "" when none do."""
    def fmt(v: object) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)

    out = []
    for pa, pb in zip(a.pools, b.pools):
        role = f"{pa.role.value} " if len(a.pools) > 1 else ""
        out += [f"{role}{label} {fmt(getattr(pa, k))} -> {fmt(getattr(pb, k))}"
                for k, label in _SETTINGS if getattr(pa, k) != getattr(pb, k)]
    return ", ".join(out)


def describe_change(current: Plan, proposed: Plan) -> str:
    """'CURRENT -> PROPOSED' (:func:`describe`), and the engine settings that change when both read the same, so
    a change of engine settings alone never reads 'X -> X'."""
    a, b = describe(current), describe(proposed)
    diff = settings_change(current.top, proposed.top) if a.rsplit(" (", 1)[0] == b.rsplit(" (", 1)[0] else ""
    return f"{a} -> {b}" + (f" ({diff})" if diff else "")
