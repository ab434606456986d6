"""Latency under load: an analytic queueing model and a discrete-event vLLM-like simulator.

``analyze`` / ``analyze_disaggregated`` (fast, for the search) and ``simulate`` /
``simulate_disaggregated`` (slow, for verification) take the same topology (``PoolSpec``: a step-cost
model ``StepCost``, engine limits ``Limits`` and a replica count; ``Disaggregated``: two pools and the KV
transfer) and traffic (``Traffic``: a rate and the workload's ``LengthDistribution``s; the simulator
also replays a ``Replay``); see ``recommender.load.topology`` and ``recommender.load.protocols``.
"""

from recommender.load.analytic import LoadResult, analyze, analyze_disaggregated
from recommender.load.percentiles import PERCENTILE_NAMES, Percentiles
from recommender.load.protocols import LengthDistribution, Limits, StepCost
from recommender.load.simulator import SimResult, TimeSeries, simulate, simulate_disaggregated
from recommender.load.topology import Disaggregated, PoolKind, PoolSpec, Replay, Traffic
from recommender.load.trace import read_trace

__all__ = [
    "PERCENTILE_NAMES",
    "Disaggregated",
    "LengthDistribution",
    "Limits",
    "LoadResult",
    "Percentiles",
    "PoolKind",
    "PoolSpec",
    "Replay",
    "SimResult",
    "StepCost",
    "TimeSeries",
    "Traffic",
    "analyze",
    "analyze_disaggregated",
    "read_trace",
    "simulate",
    "simulate_disaggregated",
]
