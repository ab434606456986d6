"""recommender: plan LLM serving deployments on vLLM from an analytic cost model.

The documented Python API (README, "Use it from Python")::

    from recommender import load_workload, recommend, dump_plan
    plan = recommend(load_workload("examples/rag.yaml"), seed=0)

Everything here is typed (``py.typed``); the plan types are frozen dataclasses.
"""

from recommender.api import estimate, recommend, simulate
from recommender.errors import (
    ConfigError, DeployError, DoesNotFitError, InfeasibleError, RecommenderError,
)
from recommender.plan import Plan, PlanRow, Pool, PoolRole, dump_plan, load_plan, with_replicas
from recommender.version import __version__
from recommender.workload import Slo, Workload, load_workload

__all__ = [
    "ConfigError", "DeployError", "DoesNotFitError", "InfeasibleError", "Plan", "PlanRow", "Pool", "PoolRole",
    "RecommenderError", "Slo", "Workload", "__version__", "dump_plan", "estimate", "load_plan", "load_workload",
    "recommend", "simulate", "with_replicas",
]
