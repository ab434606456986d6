"""Numerical tools of the analytic pool model: the Erlang C waiting probability, the renewal function of
gamma gaps, and a safeguarded fixed-point search."""

from __future__ import annotations

import math
from typing import Callable, Protocol, TypeVar

import numpy as np
from scipy.special import gammainc, gammaincc


class Iterate(Protocol):
    """An evaluation of ``f`` at some ``x``: ``x_new = f(x)``."""

    @property
    def x_new(self) -> float: ...


T = TypeVar("T", bound=Iterate)


#: windows of up to this many mean gaps get the exact renewal function; beyond, its asymptote (the oscillation
#: about it decays by ~exp(-2 pi^2 / k) a gap for shape k: under 1% of an arrival after 4 gaps at k = 18)
RENEWAL_EXACT_GAPS = 4.0


def renewal_count(rw: np.ndarray, shape: float) -> np.ndarray:
    """Mean number of arrivals in ``(0, w]`` after an arrival at 0, for gamma gaps of shape ``k`` and mean
    ``1 / r``, at ``rw = r w``: the renewal function ``m(w) = sum_{j >= 1} P(S_j <= w)`` with
    ``S_j ~ Gamma(j k, rate k r)``, i.e. ``sum_j P(j k, k rw)`` (regularised lower incomplete gamma), exact for
    ``rw <= RENEWAL_EXACT_GAPS``; beyond, its asymptote ``rw - (1 - 1 / k) / 2`` (Cox, Renewal Theory, 4.2:
    ``m(w) = w / mu + (sigma^2 - mu^2) / (2 mu^2) + o(1)``). Poisson (``k = 1``) is ``rw``."""
    rw = np.asarray(rw, dtype=float)
    out = np.maximum(rw - 0.5 * (1.0 - 1.0 / shape), 0.0)
    near = rw <= RENEWAL_EXACT_GAPS
    if shape == 1.0 or not near.any():
        return rw.copy() if shape == 1.0 else out
    k = round(shape)
    if 2 <= k <= RENEWAL_ERLANG_MAX_SHAPE and abs(shape - k) <= 1e-9 * k:
        m = renewal_count_erlang(rw[near], k)
        small = m < RENEWAL_ERLANG_MIN_COUNT  # where the closed form's O(1) terms cancel: the sum, few terms there
        if small.any():
            m[small] = _renewal_sum(shape * rw[near][small], shape)
        out[near] = m
        return out
    out[near] = _renewal_sum(shape * rw[near], shape)
    return out


#: integer shapes up to this use the closed form (``renewal_count_erlang``: ~k / 2 exp / cos / sin per point
#: against ~10-15 incomplete gamma functions); larger ones (hundreds of replicas) need only a few terms of the sum
RENEWAL_ERLANG_MAX_SHAPE = 16
#: below this count the closed form's absolute error (~1e-16) is not small against the count: the sum there
RENEWAL_ERLANG_MIN_COUNT = 1e-6


def _renewal_sum(x: np.ndarray, shape: float) -> np.ndarray:
    """``sum_{j >= 1} P(j k, x)`` term by term until every point's term is under 1e-9 (or 65 terms)."""
    total = np.zeros_like(x)
    j = 1
    while True:
        term = gammainc(j * shape, x)
        total += term
        if float(term.max()) < 1e-9 or j > 64:
            break
        j += 1
    return total


def renewal_count_erlang(rw: np.ndarray, k: int) -> np.ndarray:
    """The renewal function of Erlang-``k`` gaps (integer ``k >= 2``) in closed form, at ``rw = r w``.

    With ``x = k rw`` phases, ``theta_j = 2 pi j / k``, ``a_j = 1 - cos theta_j``, ``b_j = sin theta_j``:
    ``m = rw - (k - 1) / (2 k) + 1 / (2 k) sum_{j=1}^{k-1} e^{-a_j x} (cos b_j x + cot(theta_j / 2) sin b_j x)``.
    (The Laplace transform of the renewal density, ``f / (1 - f)`` with ``f = (mu / (mu + s))^k``, has its poles
    at ``s_j = mu (eps_j - 1)``, ``eps_j = e^{i theta_j}``, residues ``mu eps_j / k``; integrated, and
    ``eps / (1 - eps) = -1/2 + i cot(theta / 2) / 2``. ``k = 2``: ``rw - 1/4 + e^{-2 x} / 4``.) Terms ``j`` and
    ``k - j`` are equal, so each pair is computed once."""
    x = k * rw
    acc = np.zeros_like(x)
    for j in range(1, k // 2 + 1):
        theta = 2.0 * math.pi * j / k
        a, b = 1.0 - math.cos(theta), math.sin(theta)
        if 2 * j == k:  # theta = pi: b = 0, cot(pi / 2) = 0
            acc += np.exp(-a * x)
            continue
        bx = b * x
        acc += 2.0 * np.exp(-a * x) * (np.cos(bx) + np.sin(bx) / math.tan(theta / 2.0))
    return rw - (k - 1) / (2.0 * k) + acc / (2.0 * k)


def erlang_c(c: float, a: float) -> float:
    """Probability of waiting in M/M/c at offered load ``a`` Erlangs, for real ``c >= 1``:
    Erlang B = ``a^c e^-a / Gamma(c + 1) / Q(c + 1, a)`` (Poisson pmf / cdf at ``c`` for integer ``c``),
    Erlang C = ``c B / (c - a (1 - B))``."""
    if a <= 0.0:
        return 0.0
    if a >= c:
        return 1.0
    log_pmf = c * math.log(a) - a - math.lgamma(c + 1.0)
    if log_pmf < -700.0:
        return 0.0
    erlang_b = math.exp(log_pmf) / float(gammaincc(c + 1.0, a))
    return c * erlang_b / (c - a * (1.0 - erlang_b))


def least_root(evaluate: Callable[[float], T], broken: Callable[[T], bool], cap: float, start: float = 0.0,
               rtol: float = 1e-6) -> tuple[T, bool]:
    """Least ``x`` in ``[0, cap]`` with ``f(x) = x`` within ``rtol`` (``f = evaluate(x).x_new``, increasing), or
    ok=False; ``start``: a point known to lie at or below that root (``f(start) >= start``), where the search begins.

    Safeguarded secant: extrapolate while below the root (for a convex ``f`` the secant undershoots,
    so iterates stay below it), regula falsi / bisection once bracketed; a ``broken`` (unstable)
    evaluation is an upper bracket, and a secant that points past it proves there is no stable root.
    """
    s = evaluate(0.0) if start <= 0.0 else evaluate(start)
    if start > 0.0 and (broken(s) or not s.x_new > start):
        start, s = 0.0, evaluate(0.0)
    if broken(s):
        return s, False
    lo, h_lo = start, s.x_new - start
    if h_lo <= 0.0:
        return s, True
    hi, h_hi = math.inf, None
    x = start + h_lo
    for _ in range(60):
        s = evaluate(x)
        h = s.x_new - x
        if broken(s) or not math.isfinite(h):
            hi, h_hi = x, None
            x_new = math.nan
        elif abs(h) <= rtol * max(1.0, x):
            return s, True
        elif h > 0.0:
            if x >= cap:  # still below the line at the cap: no root in [0, cap] (every later iterate is the cap)
                return s, False
            x_new = x + h * (x - lo) / (h_lo - h) if h < h_lo else math.nan
            lo, h_lo = x, h
            if h_hi is None and math.isfinite(hi) and (not math.isfinite(x_new) or x_new >= hi):
                return s, False
        else:
            x_new = x + h * (x - lo) / (h_lo - h) if x > lo else math.nan
            hi, h_hi = x, h
        if math.isfinite(hi):
            if hi - lo <= 1e-9 * max(1.0, hi):
                return s, h_hi is not None
            if h_hi is not None and not (lo < x_new < hi):
                x_new = lo + h_lo * (hi - lo) / (h_lo - h_hi)
            if not (lo < x_new < hi) or not math.isfinite(x_new):
                x_new = 0.5 * (lo + hi)
        elif not math.isfinite(x_new) or x_new <= lo:
            x_new = 2.0 * lo + 1.0
        x = min(x_new, cap)
    return s, False
