"""The old positional call form of ``analyze`` / ``analyze_disaggregated``, translated to the typed one.

Transitional: ``recommender/replan/predict.py`` still calls ``analyze(cost, limits, rate, prompt, output,
replicas=, shared_prefix_fraction=)`` and ``analyze_disaggregated(prefill_cost, prefill_limits,
prefill_replicas, decode_cost, decode_limits, decode_replicas, kv_transfer_s_per_token, rate, prompt,
output, shared_prefix_fraction=)``. Every other caller passes ``PoolSpec`` / ``Disaggregated`` and
``Traffic`` (``tests/test_load_front.py`` holds that line); delete this module when replan moves over.
"""

from __future__ import annotations

from recommender.load.link import KvLink
from recommender.load.protocols import LengthDistribution, Limits, StepCost
from recommender.load.topology import Disaggregated, PoolSpec, Traffic


def aggregated_from_positional(
    cost: StepCost, limits: Limits, arrival_rate_per_s: float, prompt: LengthDistribution,
    output: LengthDistribution, replicas: int = 1, shared_prefix_fraction: float = 0.0,
) -> tuple[PoolSpec, Traffic]:
    """``analyze``'s old arguments as (pool, traffic)."""
    return (PoolSpec(cost=cost, limits=limits, replicas=replicas),
            Traffic(rate_per_s=arrival_rate_per_s, prompt=prompt, output=output,
                    shared_prefix_fraction=shared_prefix_fraction))


def disaggregated_from_positional(
    prefill_cost: StepCost, prefill_limits: Limits, prefill_replicas: int, decode_cost: StepCost,
    decode_limits: Limits, decode_replicas: int, kv_transfer_s_per_token: float, arrival_rate_per_s: float,
    prompt: LengthDistribution, output: LengthDistribution, shared_prefix_fraction: float = 0.0, *,
    kv_link: KvLink | None = None,
) -> tuple[Disaggregated, Traffic]:
    """``analyze_disaggregated``'s old arguments as (topology, traffic). The traffic is validated
    first, as the old form did."""
    traffic = Traffic(rate_per_s=arrival_rate_per_s, prompt=prompt, output=output,
                      shared_prefix_fraction=shared_prefix_fraction)
    topology = Disaggregated(prefill=PoolSpec(cost=prefill_cost, limits=prefill_limits, replicas=prefill_replicas),
                             decode=PoolSpec(cost=decode_cost, limits=decode_limits, replicas=decode_replicas),
                             kv_transfer_s_per_token=kv_transfer_s_per_token, kv_link=kv_link)
    return topology, traffic
