"""Small reference implementations of the load-model protocols.

They exist so that the load model can be tested, benchmarked and explained without the full perf
model: a linear step-cost model, a roofline step-cost model, engine limits, and a few token-length
distributions. Numbers in the defaults are illustrative (a 70B-class model with fp8 KV cache),
not calibrated.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class LinearStepCost:
    """``step_s = overhead_s + new_tokens * s_per_token + kv_read_bytes / kv_read_bytes_per_s
    + attention_flops / attention_flops_per_s``.

    A decoding sequence at context ``c`` reads ``c * kv_bytes_per_token`` bytes and does
    ``c * attention_flops_per_token_pair`` FLOPs; a prefill chunk of ``n`` tokens after ``p`` tokens
    reads the prefix (``p * kv_bytes_per_token``) and does ``n * (p + (n + 1) / 2)`` token pairs of
    causal attention.
    """

    overhead_s: float = 5e-3
    s_per_token: float = 20e-6
    kv_read_bytes_per_s: float = 2e12
    attention_flops_per_s: float = 4e14
    kv_bytes_per_token: float = 163_840.0  # 80 layers * 8 KV heads * 128 dims * (K, V) * 1 byte
    attention_flops_per_token_pair: float = 2.6e6  # 4 * 64 heads * 128 dims * 80 layers
    kv_capacity_tokens: int = 400_000
    kv_block_tokens: int = 16
    request_overhead_s: float = 0.0

    def step_s(self, new_tokens: int, kv_read_bytes: float, attention_flops: float) -> float:
        return (
            self.overhead_s
            + new_tokens * self.s_per_token
            + kv_read_bytes / self.kv_read_bytes_per_s
            + attention_flops / self.attention_flops_per_s
        )

    def decode_seq_cost(self, context_tokens: int) -> tuple[float, float]:
        return (context_tokens * self.kv_bytes_per_token, context_tokens * self.attention_flops_per_token_pair)

    def prefill_chunk_cost(self, chunk_tokens: int, prefix_tokens: int) -> tuple[float, float]:
        pairs = chunk_tokens * (prefix_tokens + (chunk_tokens + 1) / 2.0)
        return (prefix_tokens * self.kv_bytes_per_token, pairs * self.attention_flops_per_token_pair)


@dataclass(frozen=True)
class RooflineStepCost:
    """``step_s = overhead_s + max(compute_s, memory_s)`` with
    ``compute_s = (new_tokens * flops_per_token + attention_flops) / flops_per_s`` and
    ``memory_s = (weights_bytes + kv_read_bytes) / bytes_per_s``: small batches are memory bound,
    prefill chunks compute bound (the kink the analytic model must handle).
    """

    overhead_s: float = 2e-3
    weights_bytes: float = 70e9
    bytes_per_s: float = 2.4e12
    flops_per_token: float = 140e9
    flops_per_s: float = 1.0e15
    kv_bytes_per_token: float = 163_840.0
    attention_flops_per_token_pair: float = 2.6e6
    kv_capacity_tokens: int = 300_000
    kv_block_tokens: int = 16
    request_overhead_s: float = 0.0

    def step_s(self, new_tokens: int, kv_read_bytes: float, attention_flops: float) -> float:
        compute_s = (new_tokens * self.flops_per_token + attention_flops) / self.flops_per_s
        memory_s = (self.weights_bytes + kv_read_bytes) / self.bytes_per_s
        return self.overhead_s + max(compute_s, memory_s)

    def decode_seq_cost(self, context_tokens: int) -> tuple[float, float]:
        return (context_tokens * self.kv_bytes_per_token, context_tokens * self.attention_flops_per_token_pair)

    def prefill_chunk_cost(self, chunk_tokens: int, prefix_tokens: int) -> tuple[float, float]:
        pairs = chunk_tokens * (prefix_tokens + (chunk_tokens + 1) / 2.0)
        return (prefix_tokens * self.kv_bytes_per_token, pairs * self.attention_flops_per_token_pair)


@dataclass(frozen=True)
class ToyLimits:
    """Engine limits (same fields as ``recommender.perf.EngineLimits``)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    enable_prefix_caching: bool = False


@dataclass(frozen=True)
class FixedLength:
    """Every request has exactly ``tokens`` tokens."""

    tokens: int

    @property
    def mean(self) -> float:
        return float(self.tokens)

    @property
    def max_tokens(self) -> int:
        return self.tokens

    def sample(self, rng: random.Random, n: int) -> list[int]:
        return [self.tokens] * n

    def quantile(self, q: float) -> float:
        return float(self.tokens)


@dataclass(frozen=True)
class UniformLength:
    """Integers uniform on ``[low, high]`` (inclusive)."""

    low: int
    high: int

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2.0

    @property
    def max_tokens(self) -> int:
        return self.high

    def sample(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randint(self.low, self.high) for _ in range(n)]

    def quantile(self, q: float) -> float:
        return float(min(self.high, self.low + math.floor(q * (self.high - self.low + 1))))


@dataclass(frozen=True)
class LogNormalLength:
    """``round(exp(N(ln median, sigma)))`` clipped to ``[low, high]``."""

    median: float
    sigma: float
    low: int = 1
    high: int = 1 << 20

    def _clip(self, x: float) -> int:
        return int(min(self.high, max(self.low, round(x))))

    @cached_property
    def mean(self) -> float:  # numeric: mean of the clipped, rounded distribution
        k = 4000
        return sum(self.quantile((i + 0.5) / k) for i in range(k)) / k

    @property
    def max_tokens(self) -> int:
        return self.high

    def sample(self, rng: random.Random, n: int) -> list[int]:
        mu = math.log(self.median)
        return [self._clip(rng.lognormvariate(mu, self.sigma)) for _ in range(n)]

    def quantile(self, q: float) -> float:
        from statistics import NormalDist

        q = min(max(q, 1e-12), 1 - 1e-12)
        return float(self._clip(self.median * math.exp(self.sigma * NormalDist().inv_cdf(q))))


@dataclass(frozen=True)
class EmpiricalLength:
    """Resample the given lengths (e.g. a trace's ``ContextTokens`` column)."""

    values: tuple[int, ...] = field(repr=False)

    @cached_property
    def _sorted(self) -> tuple[int, ...]:
        return tuple(sorted(self.values))

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def max_tokens(self) -> int:
        return max(self.values)

    def sample(self, rng: random.Random, n: int) -> list[int]:
        return [self.values[rng.randrange(len(self.values))] for _ in range(n)]

    def quantile(self, q: float) -> float:
        s = self._sorted
        return float(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))])


