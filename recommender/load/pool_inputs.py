"""The rate-independent half of the analytic pool model: a workload's arrays for one kind of pool.

``pool_inputs`` evaluates the prompt and output length distributions at the fixed quasi-random points
(``recommender.load.summaries.lengths``) once per (distributions, pool kind, prefix caching) and keeps
the moments the pool model needs (notation of ``recommender.load.pool``): ``P`` prompt tokens, ``O``
output tokens (1 in a prefill pool), ``h`` tokens already in KV (``prompt_tokens_in_kv``: the
prefix-cache hit, or ``P - 1`` in a decode pool), ``Pc = P - h`` tokens to prefill; a decoding
sequence's time-averaged context ``E[P] + E[O^2] / (2 E[O])`` and ``E[ctx^2] / E[ctx]^2``; the prompt
lengths at ``GRID`` quantile levels where a one-step prefill is timed exactly, with their mean
linear-interpolation weights; and the moments of ``min(O' - 1, n U)``, the steps another request's
decode overlaps a window of ``n`` decode steps (``U`` uniform).

Decode steps, not tokens: with MTP speculative decoding a step emits ``tau = sum_{i<=k} a^i`` tokens per
sequence on average (``recommender.load.summaries.speculation``), so a request's ``O - 1`` decode tokens take
``n = (O - 1) / tau`` steps; ``Om1``, ``E_steps``, ``E_Om1_2``, ``E_ov`` and ``E_ov2`` count steps (``tau = 1``
without it: ``n = O - 1``), while ``O``, ``E_O`` and the contexts stay in tokens (KV grows by a token per token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recommender.load.percentiles import IdentityCache
from recommender.load.protocols import LengthDistribution
from recommender.load.summaries import _basis, _mean, cost_summary, lengths
from recommender.load.topology import PoolKind, PoolSpec, Traffic, prompt_tokens_in_kv

GRID = 6  # prompt-length quantile levels at which a prefill step is timed exactly


@dataclass(frozen=True)
class PoolInputs:
    """Rate-independent arrays and moments of a workload for one pool kind (cached)."""

    P: np.ndarray
    O: np.ndarray
    Pc: np.ndarray
    basis: np.ndarray  # (6, N): [1, Pc, h, Pc^2, Pc h, h^2]
    E_basis: np.ndarray
    E_P: float
    E_Pc: float
    E_O: float
    mean_ctx: float  # time-averaged context of a decoding sequence
    ctx2_ratio: float  # E[ctx^2] / E[ctx]^2 over running decoders (time-weighted)
    min_pc: float
    i_min: int  # index of the point with the shortest prompt
    max_pc: float
    Om1: np.ndarray  # max(n, 1): decode steps of a request, n = (O - 1) / tau
    E_Om1_2: float  # E[n^2]
    E_ov: np.ndarray  # per point: E[min(O' - 1, n U)], steps another request's decode overlaps a window of n
    E_ov2: np.ndarray  # its second moment
    E_Pc2: float
    multi: np.ndarray  # O > 1
    grid_p: np.ndarray  # prompt lengths at GRID quantile levels (ascending), with their
    grid_pc: np.ndarray  # tokens to prefill
    grid_h: np.ndarray  # and prefix-cache hits
    grid_weights: np.ndarray  # mean over points of each grid value's linear-interpolation weight
    E_steps: float = 0.0  # E[n] = E[O - 1] / tau: decode steps per request
    tokens_per_step: float = 1.0  # tau
    # E[min(O - 1, O' - 1)] / E[O - 1] of two independent requests: how long two decodes overlap on average,
    # relative to one (1/2 for exponential lengths, 1 for constant ones); 1 without decodes
    overlap_ratio: float = 1.0


_inputs_cache = IdentityCache(64)


def pool_inputs(
    prompt: LengthDistribution, output: LengthDistribution, *, kind: PoolKind, shared_prefix_fraction: float,
    block_tokens: int, prefix_caching: bool, tokens_per_step: float = 1.0,
) -> PoolInputs:
    """Workload arrays for a ``kind`` pool: ``AGGREGATED``, ``PREFILL`` (O = 1) or ``DECODE`` (KV arrives,
    1 token computed); ``h`` per ``prompt_tokens_in_kv``; decode steps at ``tokens_per_step`` tokens each."""

    def make() -> PoolInputs:
        P = lengths(prompt, 0)
        O = np.ones_like(P) if kind is PoolKind.PREFILL else lengths(output, 1)
        hit = prompt_tokens_in_kv(P, kind=kind, shared_prefix_fraction=shared_prefix_fraction, block_tokens=block_tokens,
                                  prefix_caching=prefix_caching)
        Pc = P - hit
        basis = np.array(_basis(Pc, hit))
        E_P, E_O = float(_mean(P)), float(_mean(O))
        E_O2 = float(_mean(O * O))
        mean_ctx = E_P + E_O2 / (2.0 * E_O)
        E_ctx2 = (float(_mean(P * P)) * E_O + E_P * E_O2 + float(_mean(O**3)) / 3.0) / E_O
        tau = float(tokens_per_step)
        steps = (O - 1.0) / tau  # decode steps per request (tokens with tau = 1)
        E_steps = float(_mean(steps))
        nn, M = np.maximum(steps, 1.0), max(E_steps, 1e-9)
        short = nn <= M
        order = np.argsort(P, kind="stable")
        idx = np.unique(order[np.round(np.linspace(0, P.size - 1, GRID)).astype(int)])
        idx = idx[np.argsort(P[idx], kind="stable")]
        gp, keep = np.unique(P[idx], return_index=True)
        idx = idx[keep]
        dec = np.sort(O - 1.0)
        k = dec.size
        # E[min(X, X')] over the empirical distribution: the i-th smallest of k is the minimum of a pair with
        # probability (2 (k - i) - 1) / k^2 (i from 0)
        pair_min = float(dec @ (2.0 * (k - np.arange(k)) - 1.0)) / (k * k)
        overlap = pair_min / float(dec.mean()) if dec.mean() > 0.0 else 1.0
        return PoolInputs(
            P=P, O=O, Pc=Pc, basis=basis, E_basis=basis.mean(axis=1), E_P=E_P, E_Pc=float(_mean(Pc)), E_O=E_O,
            mean_ctx=mean_ctx, ctx2_ratio=E_ctx2 / (mean_ctx * mean_ctx), min_pc=float(Pc.min()),
            max_pc=float(Pc.max()), i_min=int(np.argmin(P)), Om1=nn, multi=O > 1.0,
            E_Om1_2=_mean(steps * steps), E_Pc2=_mean(Pc * Pc), E_steps=E_steps, tokens_per_step=tau,
            E_ov=np.where(short, nn / 2.0, M - M * M / (2.0 * nn)),
            E_ov2=np.where(short, nn * nn / 3.0, M * M - 2.0 * M**3 / (3.0 * nn)),
            grid_p=gp, grid_pc=Pc[idx], grid_h=hit[idx],
            grid_weights=np.array([_mean(np.interp(P, gp, np.eye(gp.size)[j])) for j in range(gp.size)]) if gp.size > 1
            else np.ones(1),
            overlap_ratio=overlap,
        )

    key = (prompt, output, kind, float(shared_prefix_fraction), int(block_tokens), bool(prefix_caching),
           float(tokens_per_step))
    return _inputs_cache.get(key, make)


def pool_inputs_of(pool: PoolSpec, traffic: Traffic, kind: PoolKind) -> PoolInputs:
    """``pool_inputs`` of ``traffic`` for ``pool`` serving as ``kind`` (decode steps of its speculation)."""
    return pool_inputs(traffic.prompt, traffic.output, kind=kind, shared_prefix_fraction=traffic.shared_prefix_fraction,
                       block_tokens=int(pool.cost.kv_block_tokens), prefix_caching=bool(pool.limits.enable_prefix_caching),
                       tokens_per_step=cost_summary(pool.cost).tokens_per_step)
