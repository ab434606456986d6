"""Search: Optuna over the deployment space (``study``), a pure evaluator (``evaluate``), the exhaustive
reference (``exhaustive``) and the main entry point :func:`recommend` (imported lazily so that
``recommender.plan`` can use the evaluator's types without an import cycle)."""

from typing import Any

__all__ = ["SearchSettings", "recommend"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        return getattr(importlib.import_module("recommender.search.planner"), name)
    raise AttributeError(name)
