"""Re-planning as traffic changes: observe a vLLM fleet (``/metrics``, Prometheus, request logs),
forecast the load, ask the planner for a plan and change the deployment only when the policy says
the change is worth it (headroom, minimum saving, SLO risk, cooldown, per-step replica cap,
N agreeing windows before a scale-down). Every run is recorded in a SQL history database.

Modules: ``observation`` (data types, Prometheus histogram quantiles), ``metrics`` / ``promapi`` /
``logs`` (sources), ``sources`` (choosing one), ``observe`` (forecast, Workload, SLO risk), ``policy``
(policies/replan.yaml and the decision), ``plans`` (reading, checking and comparing typed plans), ``history`` (SQLAlchemy),
``runner`` (one step, the watch loop).
"""

from recommender.replan.history import History
from recommender.replan.observation import InsufficientDataError, Observation
from recommender.replan.policy import Policy, load_policy
from recommender.replan.runner import EXIT_CHANGED, EXIT_INSUFFICIENT_DATA, EXIT_UNCHANGED, ReplanResult, replan_once

__all__ = ["EXIT_CHANGED", "EXIT_INSUFFICIENT_DATA", "EXIT_UNCHANGED", "History", "InsufficientDataError",
           "Observation", "Policy", "ReplanResult", "load_policy", "replan_once"]
