"""Latency under load: an analytic queueing model and a discrete-event vLLM-like simulator.

``analyze`` / ``analyze_disaggregated`` (fast, for the search) and ``simulate`` /
``simulate_disaggregated`` (slow, for verification) take a step-cost model (``StepCost``), engine
limits (``Limits``) and the workload's length distributions (``LengthDistribution``); see
``recommender.load.protocols`` for exactly what they use.
"""

from recommender.load.analytic import LoadResult, analyze, analyze_disaggregated
from recommender.load.percentiles import PERCENTILE_NAMES, Percentiles
from recommender.load.protocols import LengthDistribution, Limits, StepCost
from recommender.load.simulator import SimResult, TimeSeries, simulate, simulate_disaggregated
from recommender.load.trace import read_trace

__all__ = [
    "PERCENTILE_NAMES",
    "LengthDistribution",
    "Limits",
    "LoadResult",
    "Percentiles",
    "SimResult",
    "StepCost",
    "TimeSeries",
    "analyze",
    "analyze_disaggregated",
    "read_trace",
    "simulate",
    "simulate_disaggregated",
]
