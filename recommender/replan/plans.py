"""Small helpers on the typed plan (:class:`recommender.plan.Plan`) for the re-planner: read, check, compare.

The re-planner treats a plan's rank-1 row (:attr:`Plan.top`) as "the deployment". Two rows have the same
*shape* when everything the deployment runs is equal except what follows from the replica counts; then a
change between them is a pure scale-out/in that can be capped per step (``recommender.plan.cost.with_replicas``
does the resizing) and applied by scaling the engine Deployments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from recommender.catalog import default_catalog
from recommender.errors import ConfigError, RecommenderError
from recommender.plan import Plan, PlanRow, Pool, layout_suffix, load_plan
from recommender.render.plan import deployment_cell
from recommender.workload import Workload


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


def select_rank(plan: Plan, rank: int, where: str) -> Plan:
    """``plan`` reduced to its row ``rank`` (``replan --rank``: the row that was deployed), renumbered rank 1 so
    that it is :attr:`Plan.top` and a plan the re-planner writes from it deploys at the default rank; ``plan``
    itself for rank 1. ConfigError (one line, the plan's ranks) when it has no such row."""
    row = plan.row(rank)
    if row is None:
        ranks = ", ".join(str(r.rank) for r in sorted(plan.rows, key=lambda r: r.rank))
        raise ConfigError(f"--rank {rank}: {where} has no plan of that rank (its ranks: {ranks}); pass the rank "
                          f"you deployed (`recommend deploy --rank N`)")
    if rank == 1:
        return plan
    why = f"rank {rank} of {where}, the row deployed (replan --rank {rank})"
    return check_plan(dataclasses.replace(plan, rows=(dataclasses.replace(row, rank=1),), why=why),
                      f"{where} rank {rank}")


def catalog_id(name: str) -> str:
    """The catalog id of a model name, Hugging Face repo or alias (any case); the name itself, lower-cased, where the
    catalog does not know it (a config.json model) or refuses it."""
    try:
        return default_catalog().model_id(name) or name.strip().lower()
    except RecommenderError:
        return name.strip().lower()


def plan_model_ids(plan: Plan) -> frozenset[str]:
    """The catalog ids the plan's model is known by: its ``workload.model`` and its ``hf_repo``, each resolved."""
    wl = plan.workload
    return frozenset(catalog_id(n) for n in (wl.model, wl.hf_repo) if n)


def check_same_model(plan: Plan, workload: Workload, where: str) -> Workload:
    """``workload`` when its model is the plan's (catalog ids compared, so a repo id matches its catalog id); else a
    one-line ConfigError: a re-plan for another model would propose a deployment of other weights."""
    if catalog_id(workload.model) in plan_model_ids(plan):
        return workload
    raise ConfigError(f"--workload {where}: its model {workload.model!r} is not the plan's ({plan.workload.model!r}); "
                      f"pass the workload the plan was made for, or plan the other model from scratch with `recommend`")


@dataclass(frozen=True)
class ServedModel:
    """The ``model_name`` label values of vLLM series that are the plan's model: the names it is served under
    (``workload.model``, ``hf_repo``, a pool's pre-quantized checkpoint) or any name the catalog resolves to its id."""

    names: frozenset[str]
    ids: frozenset[str]

    def matches(self, model_name: str) -> bool:
        """Whether a series labelled ``model_name`` is the plan's model."""
        return model_name in self.names or catalog_id(model_name) in self.ids

    def describe(self) -> str:
        """The names, sorted, comma-separated (for messages)."""
        return ", ".join(sorted(self.names))


def served_model(plan: Plan, extra: Iterable[str] = ()) -> ServedModel:
    """:class:`ServedModel` of ``plan`` (every row's checkpoints: a re-plan may deploy another row's), and the names
    in ``extra`` (``replan --served-model-name``: a name the user served the model under)."""
    wl = plan.workload
    names = {n for n in (wl.model, wl.hf_repo, *extra) if n}
    names |= {c for r in plan.rows for c in (r.checkpoint, *(p.checkpoint for p in r.pools)) if c}
    return ServedModel(frozenset(names), plan_model_ids(plan))


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


def _fmt(v: object) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)


def _offer(pool: Pool) -> str:
    """Where the pool's GPUs come from: 'provider sku', 'provider', or 'priced per GPU' (no rental)."""
    r = pool.rental
    return "priced per GPU" if r is None else " ".join(x for x in (r.provider, r.offer.sku) if x)


def setting_differences(a: PlanRow, b: PlanRow) -> list[tuple[str, str, str]]:
    """(setting, its value in ``a``, in ``b``) for every deployed setting that differs between ``a`` and ``b`` and
    that :func:`describe` does not show: per pool the engine settings (``max_num_seqs``, ``max_num_batched_tokens``,
    chunked prefill, prefix caching, ``gpu_memory_utilization``, CUDA graphs), the checkpoint and the offer rented;
    a P/D prefill pool's dtypes (the description names the decode pool's); the row's ``max_model_len``. P/D settings
    are prefixed with the pool ('P ', 'D '). Rows whose pools do not pair up (aggregated against P/D) are compared
    on ``max_model_len`` alone: their descriptions differ in the deployment itself. GPU, TP, PP, DP, EP, MTP,
    dtypes (aggregated, and the decode pool's) and replicas are in :func:`describe`."""
    out: list[tuple[str, str, str]] = []
    if tuple(p.role for p in a.pools) == tuple(p.role for p in b.pools):
        pd = len(a.pools) > 1
        for pa, pb in zip(a.pools, b.pools):
            role = f"{pa.role.value[0].upper()} " if pd else ""
            pairs = [(label, getattr(pa, k), getattr(pb, k)) for k, label in _SETTINGS]
            if pd and pa is not a.main_pool:  # the description names the decode pool's dtypes only
                pairs += [("weight dtype", pa.weight_dtype, pb.weight_dtype), ("KV dtype", pa.kv_dtype, pb.kv_dtype)]
            pairs += [("checkpoint", pa.checkpoint or a.checkpoint or "the model's",
                       pb.checkpoint or b.checkpoint or "the model's"),
                      ("offer", _offer(pa), _offer(pb))]
            out += [(f"{role}{label}", _fmt(va), _fmt(vb)) for label, va, vb in pairs if va != vb]
    if a.max_model_len != b.max_model_len:
        out.append(("max_model_len", _fmt(a.max_model_len), _fmt(b.max_model_len)))
    return out


def settings_change(a: PlanRow, b: PlanRow) -> str:
    """The settings :func:`describe` does not show that differ between ``a`` and ``b`` (:func:`setting_differences`):
    'max_num_seqs 16 -> 128, chunked prefill on -> off' (P/D: prefixed with the pool), "" when none do."""
    return ", ".join(f"{label} {va} -> {vb}" for label, va, vb in setting_differences(a, b))


def describe_pair(current: Plan, proposed: Plan) -> tuple[str, str]:
    """The current and proposed plans' lines: :func:`describe`, then, where they differ in settings the
    description does not show (:func:`setting_differences`), each plan's own values of them
    ('h100-sxm tp1 bf16/bf16 x4 replicas ($8.00/h); max_num_seqs 256'), so every setting that differs is on
    the two lines."""
    diff = setting_differences(current.top, proposed.top)

    def line(plan: Plan, i: int) -> str:
        return describe(plan) + ("; " + ", ".join(f"{d[0]} {d[1 + i]}" for d in diff) if diff else "")

    return line(current, 0), line(proposed, 1)


def describe_change(current: Plan, proposed: Plan) -> str:
    """'CURRENT -> PROPOSED' (:func:`describe`), and the settings the descriptions do not show that change
    (:func:`settings_change`), so a change of engine settings never reads 'X -> X' nor hides beside a replica
    change."""
    diff = settings_change(current.top, proposed.top)
    return f"{describe(current)} -> {describe(proposed)}" + (f" ({diff})" if diff else "")
