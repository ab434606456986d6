"""What the load model needs from the perf model, the engine limits and the workload.

These are structural types (``typing.Protocol``): the real ``recommender.perf.step.StepCostModel``,
``recommender.perf.EngineLimits`` and ``recommender.workload.LengthDist`` satisfy them without
importing this module, and so do the small reference implementations in ``recommender.load.toy``.
See docs/ARCHITECTURE.md, "Step cost contract".
"""

from __future__ import annotations

import random
from typing import Protocol, runtime_checkable


@runtime_checkable
class StepCost(Protocol):
    """Time of one engine iteration of ONE replica (a TP group).

    Costs add up: a step with decodes at contexts ``c_i`` and one prefill chunk takes
    ``step_s(len(c) + chunk, sum(kv_i) + kv_p, sum(fl_i) + fl_p)`` seconds. A request's TTFT and E2E
    also carry ``request_overhead_s`` once (both fronts add it to the same place).
    """

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache one replica holds (all sequences together)."""
        ...

    @property
    def kv_block_tokens(self) -> int:
        """Paged-attention block size in tokens (vLLM default 16)."""
        ...

    @property
    def request_overhead_s(self) -> float:
        """Fixed time (s) every request adds to its first token, and so to its end-to-end latency, outside
        the engine steps (API server, tokenisation, detokenising the first chunk); 0 for a bare engine."""
        ...

    def step_s(self, new_tokens: int, kv_read_bytes: float, attention_flops: float) -> float:
        """Wall time (s) of one iteration computing ``new_tokens`` tokens. For fixed ``new_tokens``,
        non-decreasing and convex along any ray on which both byte and FLOP counts grow (the simulator
        sums runs of decode-only steps by that; docs/ARCHITECTURE.md, "Step cost contract")."""
        ...

    def decode_seq_cost(self, context_tokens: int) -> tuple[float, float]:
        """(kv_read_bytes, attention_flops) one decoding sequence at this context adds to a step."""
        ...

    def prefill_chunk_cost(self, chunk_tokens: int, prefix_tokens: int) -> tuple[float, float]:
        """(kv_read_bytes, attention_flops) of a prefill chunk whose sequence already holds ``prefix_tokens``."""
        ...


@runtime_checkable
class SpeculativeStepCost(Protocol):
    """A ``StepCost`` whose decode steps are speculative verify steps (MTP, ``recommender.perf.speculative``):
    each decoding sequence puts ``query_tokens = k + 1`` tokens into a step (its token budget and GEMMs; its KV
    is read once, its attention FLOPs count ``k + 1`` times), the step also runs ``draft_s`` of draft passes, and
    emits ``tokens_per_step = sum_{i<=k} a^i`` tokens per sequence on average. ``query_tokens == 1`` is plain
    decoding. Both fronts read it through ``recommender.load.summaries.speculation``."""

    @property
    def query_tokens(self) -> int: ...

    @property
    def tokens_per_step(self) -> float: ...

    def draft_s(self, decodes: float, context_tokens: float) -> float:
        """Seconds of the draft passes of a step with ``decodes`` decoding sequences at ``context_tokens``."""
        ...


@runtime_checkable
class Limits(Protocol):
    """The vLLM scheduler limits of one replica (``recommender.perf.EngineLimits``)."""

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def max_num_batched_tokens(self) -> int: ...

    @property
    def chunked_prefill(self) -> bool: ...

    @property
    def enable_prefix_caching(self) -> bool: ...


@runtime_checkable
class LengthDistribution(Protocol):
    """A token-length distribution (``recommender.workload.LengthDist``); lengths are >= 1 tokens."""

    @property
    def mean(self) -> float: ...

    @property
    def max_tokens(self) -> int: ...

    def sample(self, rng: random.Random, n: int) -> list[int]: ...

    def quantile(self, q: float) -> float: ...
