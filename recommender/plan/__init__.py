"""The plan: frozen types (:class:`Plan`, :class:`PlanRow`, :class:`Pool`, ...) and their one file format.

``recommend`` builds a :class:`Plan`; :func:`dump_plan` writes it (JSON, version 2) and :func:`load_plan`
reads it back (versions 1 and 2), so every consumer -- renderers, deploy, replan, simulate -- works on
the same typed rows. :func:`with_replicas` holds the cost arithmetic for resizing a plan.
"""

from recommender.plan.cost import pools_usd_per_hour, with_replicas
from recommender.plan.io import PLAN_VERSION, dump_plan, load_plan, plan_document
from recommender.plan.types import Evidence, GpuPrice, KvLinkInfo, LengthSummary, Offer, Plan, PlanRow, Pool, PoolEvidence, PoolRole, Rental, SearchMeta, WorkloadEcho, layout_suffix

__all__ = ["PLAN_VERSION", "Evidence", "GpuPrice", "KvLinkInfo", "LengthSummary", "Offer", "Plan", "PlanRow", "Pool", "PoolEvidence", "PoolRole", "Rental", "SearchMeta", "WorkloadEcho", "layout_suffix",
           "dump_plan", "load_plan", "plan_document", "pools_usd_per_hour", "with_replicas"]
