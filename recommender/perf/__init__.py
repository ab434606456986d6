"""The analytic serving model: memory, step times, steady state. Pure functions, no I/O."""

from recommender.perf.step import Deployment, EngineLimits, StepCostModel, check_parallelism, default_limits

__all__ = ["Deployment", "EngineLimits", "StepCostModel", "check_parallelism", "default_limits"]
