"""Precomputed, cached views of a step-cost model and of length distributions for the analytic model.

The search evaluates the analytic model thousands of times, so everything that does not depend on
the arrival rate is computed once per cost model / distribution object and cached by identity:

* ``cost_summary``: decode cost as affine in the context, ``decode_seq_cost(c) = (kv0 + kv1*c,
  fl0 + fl1*c)`` for ``c >= decode_affine_from_tokens`` (probes at powers of two agree to 1e-6; 1 for
  dense attention, the window for sliding-window attention), and prefill-chunk cost fitted as a quadratic in (chunk n, prefix p) on the basis
  ``[1, n, p, n^2, n*p, p^2]`` by least squares over a 3x3 probe grid (exact for causal attention,
  whose chunk cost is ``n*(p + (n+1)/2)`` token pairs).
* ``lengths``: the distribution evaluated at fixed quasi-random levels (scrambled Sobol points,
  one column per random input), so that analytic percentiles are deterministic functions of the
  inputs (common random numbers: smooth in the arrival rate, no Monte-Carlo noise between calls).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recommender.load.percentiles import IdentityCache
from recommender.load.protocols import LengthDistribution, SpeculativeStepCost, StepCost

N_POINTS = 1024  # quasi-random points behind analytic percentiles (p99 rests on ~10 of them)
_DIMS = 7  # prompt, output, queue wait, step residual, batch noise, second pool wait, interference

_qmc_cache: list[np.ndarray] = []
SOBOL_FILE = "qmc-sobol-1024x7.npy"


def sobol_points_fresh() -> np.ndarray:
    """The points computed with scipy (slow to import: ~0.5 s); the shipped file holds exactly these."""
    from scipy.stats import qmc

    pts: np.ndarray = qmc.Sobol(d=_DIMS, scramble=True, seed=20240611).random_base2(int(np.log2(N_POINTS)))
    return pts


def _sobol_points() -> np.ndarray:
    """Load the precomputed points (``recommender/data/qmc-sobol-1024x7.npy``, written by
    ``sobol_points_fresh()``; a test checks they agree) or compute them if the file is missing."""
    from importlib import resources

    try:
        with resources.files("recommender").joinpath("data", SOBOL_FILE).open("rb") as f:
            pts: np.ndarray = np.load(f)
        if pts.shape == (N_POINTS, _DIMS):
            return pts
    except (FileNotFoundError, OSError, ValueError):
        pass
    return sobol_points_fresh()


def qmc_points() -> np.ndarray:
    """``N_POINTS x 7`` scrambled-Sobol uniforms in (0, 1), fixed seed (deterministic)."""
    if not _qmc_cache:
        _qmc_cache.append(np.clip(_sobol_points(), 1e-9, 1 - 1e-9))
    return _qmc_cache[0]


_exp_cache: list[np.ndarray] = []


def qmc_exponentials() -> np.ndarray:
    """``-ln(1 - u)`` of ``qmc_points()``: unit-exponential quasi-random points (for waiting times)."""
    if not _exp_cache:
        _exp_cache.append(-np.log1p(-qmc_points()))
    return _exp_cache[0]


_PROBE_N = (256.0, 2048.0, 8192.0)
_PROBE_P = (0.0, 4096.0, 16384.0)


def _basis(n: np.ndarray | float, p: np.ndarray | float) -> list[np.ndarray | float]:
    """The prefill-cost fit basis ``[1, n, p, n^2, n p, p^2]`` (scalars or arrays, broadcast together)."""
    return [np.ones_like(np.asarray(n, dtype=float)), n, p, n * n, n * p, p * p]


def _probe_pinv() -> np.ndarray:
    rows = [[1.0, n, p, n * n, n * p, p * p] for n in _PROBE_N for p in _PROBE_P]
    return np.linalg.pinv(np.array(rows))


_PINV = _probe_pinv()


@dataclass(frozen=True)
class CostSummary:
    """Fitted cost coefficients of one ``StepCost`` (see module docstring)."""

    kv0: float
    kv1: float
    fl0: float
    fl1: float
    decode_linear: bool
    decode_affine_from_tokens: int  # decode_seq_cost is affine (kv0 + kv1 c, fl0 + fl1 c) for c >= this
    prefill_kv: tuple[float, ...]
    prefill_fl: tuple[float, ...]
    kv_capacity_tokens: int
    kv_block_tokens: int
    query_tokens: int = 1          # tokens each decoding sequence puts into a step: k + 1 with MTP
    tokens_per_step: float = 1.0   # tokens a decode step emits per sequence: sum_{i<=k} a^i with MTP

    def decode_cost(self, context_tokens: float) -> tuple[float, float]:
        return (self.kv0 + self.kv1 * context_tokens, self.fl0 + self.fl1 * context_tokens)

    def prefill_cost(self, chunk: np.ndarray | float, prefix: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised (kv_read_bytes, attention_flops) of chunks of ``chunk`` tokens after ``prefix``."""
        b = _basis(chunk, prefix)
        kv = sum(c * x for c, x in zip(self.prefill_kv, b))
        fl = sum(c * x for c, x in zip(self.prefill_fl, b))
        return np.asarray(kv, dtype=float), np.asarray(fl, dtype=float)


def _fit(cost: StepCost) -> CostSummary:
    # Decode cost: a line through the two largest probe contexts, then the smallest context from
    # which every probe (powers of two) lies on it: sliding-window attention is affine beyond its window.
    ctx = [1 << j for j in range(17)]
    vals = [cost.decode_seq_cost(c) for c in ctx]
    (c_lo, lo), (c_hi, hi) = (ctx[-2], vals[-2]), (ctx[-1], vals[-1])
    kv1 = (hi[0] - lo[0]) / (c_hi - c_lo)
    fl1 = (hi[1] - lo[1]) / (c_hi - c_lo)
    kv0 = lo[0] - kv1 * c_lo
    fl0 = lo[1] - fl1 * c_lo

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1.0)

    affine_from = ctx[-2]
    for c, (kv, fl) in zip(reversed(ctx[:-2]), reversed(vals[:-2])):
        if not (close(kv0 + kv1 * c, kv) and close(fl0 + fl1 * c, fl)):
            break
        affine_from = c
    if affine_from == ctx[-2] and not (close(kv0 + kv1 * ctx[-3], vals[-3][0]) and close(fl0 + fl1 * ctx[-3], vals[-3][1])):
        affine_from = 1 << 62  # no affine tail found: exact per-sequence costs everywhere
    probes = [cost.prefill_chunk_cost(int(n), int(p)) for n in _PROBE_N for p in _PROBE_P]
    kv_coef = _PINV @ np.array([x[0] for x in probes], dtype=float)
    fl_coef = _PINV @ np.array([x[1] for x in probes], dtype=float)
    return CostSummary(
        kv0=float(kv0),
        kv1=float(kv1),
        fl0=float(fl0),
        fl1=float(fl1),
        decode_linear=affine_from <= 1,
        decode_affine_from_tokens=affine_from,
        prefill_kv=tuple(float(x) for x in kv_coef),
        prefill_fl=tuple(float(x) for x in fl_coef),
        kv_capacity_tokens=int(cost.kv_capacity_tokens),
        kv_block_tokens=int(cost.kv_block_tokens),
        query_tokens=speculation(cost)[0],
        tokens_per_step=speculation(cost)[1],
    )


def speculation(cost: StepCost) -> tuple[int, float]:
    """(query tokens per decoding sequence per step, tokens emitted per sequence per step): ``(k + 1,
    sum_{i<=k} a^i)`` for a ``SpeculativeStepCost`` with MTP, ``(1, 1.0)`` otherwise."""
    if isinstance(cost, SpeculativeStepCost):
        q = int(cost.query_tokens)
        if q > 1:
            return q, float(cost.tokens_per_step)
    return 1, 1.0


_cost_cache = IdentityCache(256)
_length_cache = IdentityCache(64)


def cost_summary(cost: StepCost) -> CostSummary:
    """Cached ``CostSummary`` of ``cost`` (26 cost-model calls the first time)."""
    return _cost_cache.get((cost,), lambda: _fit(cost))


def _levels() -> np.ndarray:
    m = 512
    mids = (np.arange(m) + 0.5) / m
    tail = np.array([1e-6, 0.995, 0.999, 0.9995, 1 - 1e-6])
    return np.unique(np.concatenate([mids, tail]))


_LEVELS = _levels()


def lengths(dist: LengthDistribution, column: int) -> np.ndarray:
    """``dist`` at the quasi-random levels of ``column`` (0 = prompt, 1 = output), as floats >= 1.

    The quantile function is evaluated on a fixed grid of ~520 levels once per distribution and
    interpolated, so an expensive ``quantile`` is called a bounded number of times.
    """

    def make() -> np.ndarray:
        values = np.array([float(dist.quantile(float(q))) for q in _LEVELS])
        values = np.maximum.accumulate(np.maximum(values, 1.0))
        out: np.ndarray = np.interp(qmc_points()[:, column], _LEVELS, values)
        return out

    return _length_cache.get((dist, column), make)


def _mean(a: np.ndarray) -> float:
    """Arithmetic mean (``sum / size``; half the overhead of ``ndarray.mean`` on small arrays)."""
    return float(a.sum()) / a.size
