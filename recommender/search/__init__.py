"""Search: Optuna over the deployment space (``study``), a pure evaluator (``evaluate``), the exhaustive
reference (``exhaustive``) and the main entry point :func:`recommend` (``planner``), which returns a
:class:`recommender.plan.Plan` (``to_plan``)."""

from recommender.search.planner import SearchSettings, recommend

__all__ = ["SearchSettings", "recommend"]
