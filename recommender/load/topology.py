"""What the load model is asked about: the pools that serve, and the traffic they serve.

Both fronts take these types: the analytic model (``analyze`` / ``analyze_disaggregated``) and the
simulator (``simulate`` / ``simulate_disaggregated``). Constructing one validates it, so the two fronts
accept and refuse exactly the same inputs:

* ``PoolSpec(cost, limits, replicas)``: ``replicas`` identical replicas of one step-cost model under
  one set of engine limits, requests routed round-robin (an aggregated deployment, or one side of a
  prefill/decode split);
* ``Disaggregated(prefill, decode, kv_transfer_s_per_token, kv_link)``: vLLM P/D behind a proxy; a
  prompt's KV moves in ``kv_transfer_s_per_token x P`` seconds, or queues on ``kv_link``;
* ``Traffic(rate_per_s, prompt, output, shared_prefix_fraction)``: Poisson arrivals at
  ``rate_per_s`` requests/s with prompt / output token lengths drawn from the distributions;
* ``Replay(rows, shared_prefix_fraction)``: recorded ``(arrival_s, prompt_tokens, output_tokens)``
  rows (simulator only).

The rules both fronts share live here too: what each pool of a split computes (``PoolKind``) and
which prompt tokens are already in KV when a request is scheduled (``prompt_tokens_in_kv``: the
prefix-cache hit, or the KV a prefill pool pushed). The per-request fixed overhead is part of the
step-cost protocol (``StepCost.request_overhead_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

import numpy as np

from recommender.errors import ConfigError
from recommender.load.link import KvLink
from recommender.load.protocols import LengthDistribution, Limits, StepCost


class PoolKind(str, Enum):
    """What the replicas of a pool compute for a request.

    ``AGGREGATED``: prefill and every decode step; ``PREFILL``: the prompt only (one output token, as
    vLLM's P/D proxy sends ``max_tokens=1``); ``DECODE``: the KV arrives from a prefill replica, the
    first step computes one token (the last prompt token) and emits the first output token.
    """

    AGGREGATED = "both"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class PoolSpec:
    """``replicas`` identical replicas (each one TP group) with step costs ``cost`` and scheduler ``limits``."""

    cost: StepCost
    limits: Limits
    replicas: int = 1

    def __post_init__(self) -> None:
        if int(self.replicas) < 1:
            raise ConfigError(f"replicas must be at least 1, got {self.replicas!r}")

    def tokens_in_kv(self, prompt_tokens: np.ndarray, *, kind: PoolKind, shared_prefix_fraction: float) -> np.ndarray:
        """``prompt_tokens_in_kv`` with this pool's KV block size and prefix-caching switch."""
        return prompt_tokens_in_kv(prompt_tokens, kind=kind, shared_prefix_fraction=shared_prefix_fraction,
                                   block_tokens=int(self.cost.kv_block_tokens),
                                   prefix_caching=bool(self.limits.enable_prefix_caching))


@dataclass(frozen=True)
class Disaggregated:
    """vLLM prefill/decode disaggregation: a ``prefill`` pool, a ``decode`` pool, and the KV transfer
    between them: ``kv_transfer_s_per_token x P`` seconds per ``P``-token prompt, or, with ``kv_link``,
    a FIFO queue per prefill replica holding the link ``kv_link.transfer_s(P)`` seconds per transfer
    (``recommender.load.link``; ``kv_transfer_s_per_token`` is then unused)."""

    prefill: PoolSpec
    decode: PoolSpec
    kv_transfer_s_per_token: float = 0.0
    kv_link: KvLink | None = None

    def __post_init__(self) -> None:
        if not (self.kv_transfer_s_per_token >= 0.0):
            raise ConfigError(f"kv_transfer_s_per_token must be >= 0, got {self.kv_transfer_s_per_token!r}")


@dataclass(frozen=True)
class Traffic:
    """Poisson arrivals at ``rate_per_s`` requests/s; prompt and output lengths (tokens) drawn
    independently from ``prompt`` and ``output``; the first ``shared_prefix_fraction`` of every
    prompt is common to all requests (a system prompt, a RAG template), which a prefix cache can skip."""

    rate_per_s: float
    prompt: LengthDistribution
    output: LengthDistribution
    shared_prefix_fraction: float = 0.0

    def __post_init__(self) -> None:
        check_rate(self.rate_per_s)
        check_fraction(self.shared_prefix_fraction)


@dataclass(frozen=True)
class Replay:
    """Recorded requests: ``rows`` of ``(arrival_s, prompt_tokens, output_tokens)`` (any order; token
    counts below 1 count as 1), with the shared-prefix fraction of their prompts (simulator only)."""

    rows: Sequence[tuple[float, int, int]]
    shared_prefix_fraction: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(self.rows))  # frozen: a caller's list cannot change it later
        check_fraction(self.shared_prefix_fraction)


def check_rate(rate_per_s: float) -> None:
    """Refuse an arrival rate that is not a positive, finite number of requests per second."""
    if not (rate_per_s > 0.0) or not math.isfinite(rate_per_s):
        raise ConfigError(f"arrival rate must be a positive number of requests per second, got {rate_per_s!r}")


def check_fraction(shared_prefix_fraction: float) -> None:
    """Refuse a shared-prefix fraction outside ``[0, 1]``."""
    if not (0.0 <= shared_prefix_fraction <= 1.0):
        raise ConfigError(f"shared_prefix_fraction must be in [0, 1], got {shared_prefix_fraction!r}")


def prompt_tokens_in_kv(
    prompt_tokens: np.ndarray, *, kind: PoolKind, shared_prefix_fraction: float, block_tokens: int,
    prefix_caching: bool,
) -> np.ndarray:
    """Tokens of each prompt (``P`` tokens, float array) already in KV when a replica of a ``kind`` pool
    schedules it, so not computed again (both fronts use this one rule):

    * ``DECODE``: ``P - 1``, the KV the prefill pool pushed; the last prompt token is computed again
      and yields the first output token;
    * otherwise the prefix-cache hit ``h = min(floor(floor(f P) / block) x block, P - 1)``: whole KV
      blocks of the shared prefix ``f P``, never the whole prompt (vLLM recomputes at least the last
      token to get its logits); 0 without prefix caching or without a shared prefix.

    (A decode replica that preempts a request recomputes it as an ``AGGREGATED`` replica would.)"""
    p = np.asarray(prompt_tokens, dtype=float)
    if kind is PoolKind.DECODE:
        remote: np.ndarray = p - 1.0
        return remote
    if not prefix_caching or shared_prefix_fraction <= 0.0:
        return np.zeros_like(p)
    hits: np.ndarray = np.minimum(np.floor(shared_prefix_fraction * p) // block_tokens * block_tokens, p - 1.0)
    return hits
