"""Search: Optuna over the deployment space (``study``), a pure evaluator (``evaluate``), the exhaustive
reference (``exhaustive``) and the main entry point :func:`recommend`."""

from recommender.search.recommend import SearchSettings, recommend

__all__ = ["SearchSettings", "recommend"]
