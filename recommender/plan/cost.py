"""Cost arithmetic on plan rows, in one place.

A plan's cost is what its GPUs cost to run::

    usd_per_hour = sum over pools of usd_per_gpu_hour x tp x replicas

Resizing a row (:func:`with_replicas`, for capping a scale step) keeps the shape and scales the figures that
follow from the GPU count by ``scale = new GPUs / old GPUs``: ``usd_per_hour`` (exactly from the pool prices when
the plan carries them -- a rented pool rents ceil(GPUs / GPUs per instance) instances -- else scaled), throughput x scale,
load utilisation / scale, the workload's arrival rate x scale (what the new replicas serve). $/M tokens is
$/h over the tokens of that rate, so it changes by ``(new $/h / old $/h) / scale``: unchanged when the cost
follows the GPU count, dearer when whole instances hold fewer GPUs than they have (3 TP1 replicas on 2-GPU
instances rent 2 instances: $/h x 2, rate x 1.5, $/M x 4/3). Latency figures stay the planner's for its own
replica count, which the ``note`` says.
"""

from __future__ import annotations

import dataclasses
import math

from recommender.plan.types import Plan, PlanRow, Pool, WorkloadEcho


def pools_usd_per_hour(pools: tuple[Pool, ...]) -> float | None:
    """sum(usd_per_gpu_hour x tp x data_parallel_size x replicas); None when a pool carries no price."""
    costs = [p.usd_per_hour for p in pools]
    return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)


def _resized(pool: Pool, replicas: int) -> Pool:
    """``pool`` at ``replicas``; a rented pool rents ceil(GPUs / GPUs per instance) instances (per-GPU billing:
    GPUs x the per-GPU price)."""
    rental = pool.rental
    if rental is not None:
        gpus = pool.gpus_per_replica * replicas
        if rental.offer.per_gpu_billing:
            per_gpu = rental.usd_per_instance_hour / max(rental.gpus_per_instance, 1)
            rental = dataclasses.replace(rental, usd_per_hour=gpus * per_gpu)
        else:
            n = -(-gpus // max(rental.gpus_per_instance, 1))
            rental = dataclasses.replace(rental, instances=n, usd_per_hour=n * rental.usd_per_instance_hour)
    return dataclasses.replace(pool, replicas=replicas, rental=rental)


def _per_token_factor(old_usd: float | None, new_usd: float | None, scale: float) -> float:
    """What $/M tokens is multiplied by: (new $/h / old $/h) / scale; exactly 1 when the cost ratio is the GPU
    ratio to 1e-6 (the $/h figures are rounded to 4 decimals)."""
    if old_usd is None or new_usd is None or old_usd <= 0 or scale <= 0:
        return 1.0
    f = new_usd / old_usd / scale
    return 1.0 if math.isclose(f, 1.0, rel_tol=1e-6) else f


def _resized_id(row_id: str, new: tuple[int, ...]) -> str:
    base = row_id.rsplit("-r", 1)[0] if "-r" in row_id else row_id
    return f"{base}-r{'+'.join(str(x) for x in new)}"


def with_replicas(plan: Plan, new: tuple[int, ...], note: str, *, same_rate: bool = False) -> Plan:
    """Copy of ``plan`` whose rank-1 row runs ``new`` replicas per pool (only that row is kept).

    By default the traffic scales with the GPUs (``scale = new / old GPUs``): the arrival rate and output tokens/s
    x ``scale``, $/M tokens x (new $/h / old $/h) / ``scale``. ``same_rate``: the same traffic on more (or fewer)
    replicas (``recommend autoscale``'s static peak plan): the rate and output tokens/s stay, $/M tokens follows
    $/h (x new $/h / old $/h). Either way ``load_utilisation`` (rate / capacity) is divided by ``scale``."""
    row = plan.top
    if len(new) != len(row.pools):
        raise ValueError(f"{len(new)} replica counts for {len(row.pools)} pools")
    pools = tuple(_resized(p, r) for p, r in zip(row.pools, new))
    old_gpus, new_gpus = row.gpus_total, sum(p.gpus for p in pools)
    scale = new_gpus / old_gpus if old_gpus else 1.0
    rate_scale = 1.0 if same_rate else scale
    exact = pools_usd_per_hour(pools)
    usd = exact if exact is not None else (row.usd_per_hour * scale if row.usd_per_hour is not None else None)
    per_m = _per_token_factor(row.usd_per_hour, usd, rate_scale)
    out = dataclasses.replace(
        row, rank=1, id=_resized_id(row.id, new), pools=pools,
        usd_per_hour=None if usd is None else round(usd, 4),
        usd_per_million_tokens=None if row.usd_per_million_tokens is None else row.usd_per_million_tokens * per_m,
        usd_per_million_output_tokens=(None if row.usd_per_million_output_tokens is None
                                       else row.usd_per_million_output_tokens * per_m),
        output_tokens_per_s=(None if row.output_tokens_per_s is None
                             else row.output_tokens_per_s if same_rate else round(row.output_tokens_per_s * scale, 3)),
        load_utilisation=(None if row.load_utilisation is None or scale <= 0 else round(row.load_utilisation / scale, 4)),
        quality_note="; ".join(x for x in (row.quality_note, note) if x),
    )
    wl = plan.workload
    if wl.arrival_rate_per_s is not None and not same_rate:
        wl = dataclasses.replace(wl, arrival_rate_per_s=round(wl.arrival_rate_per_s * scale, 6))
    return dataclasses.replace(plan, rows=(out,), workload=wl, evaluations=())


@dataclasses.dataclass(frozen=True)
class Job:
    """An offline job on one plan row: it runs flat out, ``finish_s = max(min(load_utilisation, 1) x deadline_s,
    e2e_s)`` (``load_utilisation`` = rate / capacity; no job ends before one of its requests does), and pays
    ``usd = usd_per_hour x finish_s / 3600``."""

    finish_s: float
    margin_s: float
    usd: float


def job_of(row: PlanRow, workload: WorkloadEcho) -> Job | None:
    """The job figures of ``row`` for an offline workload (None for online traffic)."""
    if not (workload.offline_requests and workload.deadline_s):
        return None
    util = row.load_utilisation if row.load_utilisation is not None else 1.0
    # flat out at capacity, but never before one request's latency (a job of few requests is bound by it)
    finish = max(min(util, 1.0) * workload.deadline_s, row.e2e_s or 0.0)
    return Job(finish_s=finish, margin_s=workload.deadline_s - finish, usd=(row.usd_per_hour or 0.0) * finish / 3600.0)
