"""The step-time half of the analytic pool model: how long one engine step takes at a mean batch, and the
fixed point in the number of decoders per step (formulas: ``recommender.load.pool``, "Steps" and "Fixed
point")."""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, cast

import numpy as np
from scipy.special import gammaincinv

from recommender.load.percentiles import IdentityCache
from recommender.load.pool_inputs import PoolInputs
from recommender.load.protocols import Limits, SpeculativeStepCost, StepCost
from recommender.load.summaries import CostSummary, _basis, _mean


SEEN_NODES = 6  # quantile nodes of the batch a decoder sees (``StepModel.seen_dstep``)
_SEEN_U = (np.arange(SEEN_NODES) + 0.5) / SEEN_NODES


class StepIterate(NamedTuple):  # NamedTuples here: built ~20 times per solve; a frozen dataclass builds 4x slower
    """The step-time model at ``x`` decoders per step (step-averaged): ``b = min(x, b_max)`` decoders in a
    step (``b_max``: ``c - 1`` where a slot prefills, ``c`` in a decode pool), the decode-only step ``t_d0`` (s), ``C`` tokens left for prefill, a prompt's own prefill time per
    point (``own``; None when every prompt takes one step and only the mean ``E_own`` is needed) over
    ``n`` chunk steps (mean ``E_n``), the prefill work on top of decode steps ``m = lam E[D]`` with
    ``E_delta = E[D]``, and the next iterate ``x_new = lam (E[O] - 1) T_d0 / (1 - m)``."""

    x: float
    b: float
    t_d0: float
    C: float
    E_own: float
    E_n: float
    own: np.ndarray | None
    n: np.ndarray | float
    m: float
    E_delta: float
    x_new: float
    # a prompt in a step shared with other prompts (arrays evaluations only): per point the slope part of its
    # affine step time (``w . basis``; meaningful where the prompt fits the ``C`` tokens), and the intercept
    marginal: np.ndarray | None = None
    intercept_s: float = 0.0
    # per point, the time of a chunked prompt's full-chunk steps before its last one (0 for a one-step prompt)
    before_last: np.ndarray | float = 0.0


def _chunk_bases(inp: PoolInputs, C: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunks of a prompt under a budget of ``C`` tokens: (number of chunks, summed fit basis of the
    ``n - 1`` full chunks, basis of the last chunk), per point. Full chunk k has ``C`` tokens after
    ``h + k C`` tokens, so its basis ``[1, C, p, C^2, C p, p^2]`` sums in closed form; the prefix is
    re-read by every chunk (KV bytes), which a single-chunk cost would miss."""
    Pc, h = inp.Pc, inp.basis[2]
    n = np.ceil(Pc / C)
    m = n - 1.0
    s_p = m * h + C * m * (m - 1.0) / 2.0
    s_p2 = m * h * h + h * C * m * (m - 1.0) + C * C * (m - 1.0) * m * (2.0 * m - 1.0) / 6.0
    full = np.array([m, m * C, s_p, m * C * C, C * s_p, s_p2])
    c_last = Pc - m * C
    p_last = h + m * C
    last = np.array([np.ones_like(Pc), c_last, p_last, c_last * c_last, c_last * p_last, p_last * p_last])
    return n, full, last


_grid_cache = IdentityCache(256)


def _grid_costs(cs: CostSummary, inp: PoolInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rate-independent, cached per (cost, inputs): the prefill-cost fit coefficients (KV bytes, FLOPs) as
    arrays, and the KV bytes, FLOPs and fit basis of a whole-prompt prefill at the ``GRID`` prompts."""

    def make() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        g_kv, g_fl = cs.prefill_cost(inp.grid_pc, inp.grid_h)
        out = (np.array(cs.prefill_kv), np.array(cs.prefill_fl), g_kv, g_fl, np.array(_basis(inp.grid_pc, inp.grid_h)))
        for a in out:
            a.flags.writeable = False
        return out

    return _grid_cache.get((cs, inp), make)


class StepModel:
    """Step times of one replica at arrival rate ``lam`` (module docstring, "Steps" and "Fixed point")."""

    __slots__ = ("step", "chunk_cost", "inp", "lam", "decodes", "c", "b_max", "budget", "chunked", "kv_d", "fl_d", "pkv", "pfl",
                 "E_Om1", "ref_hit", "slopes", "g_kv", "g_fl", "g_basis", "q", "draft", "index")

    def __init__(
        self, cost: StepCost, limits: Limits, cs: CostSummary, inp: PoolInputs, lam: float, decodes: bool, c: int,
        prefill_slot: bool = True,
    ) -> None:
        # The model evaluates mean (fractional) batches; step_s is arithmetic in new_tokens for every cost model.
        self.step = cast("Callable[[float, float, float], float]", cost.step_s)
        self.chunk_cost = cost.prefill_chunk_cost
        self.inp, self.lam, self.decodes, self.c = inp, lam, decodes, c
        # decoders a step holds at most: c - 1 where a slot prefills (aggregated), all c in a decode pool (its
        # "prefill" is the last prompt token's one-token step)
        self.b_max = c - 1.0 if prefill_slot else float(c)
        self.budget = int(limits.max_num_batched_tokens)
        self.chunked = bool(limits.chunked_prefill)
        if inp.mean_ctx >= cs.decode_affine_from_tokens:
            self.kv_d, self.fl_d = cs.decode_cost(inp.mean_ctx)
        else:
            self.kv_d, self.fl_d = cost.decode_seq_cost(int(round(inp.mean_ctx)))
        self.pkv, self.pfl, self.g_kv, self.g_fl, self.g_basis = _grid_costs(cs, inp)
        # MTP (``summaries.speculation``): a decoder puts q = k + 1 query tokens into a step (budget, GEMMs), its
        # attention FLOPs count q times (its KV is read once), and the step adds its draft passes draft(b)
        self.q = cs.query_tokens
        self.fl_d *= self.q
        ctx = inp.mean_ctx
        spec = cast("SpeculativeStepCost", cost) if self.q > 1 else None
        self.draft: Callable[[float], float] | None = (lambda b: spec.draft_s(b, ctx)) if spec is not None else None
        self.E_Om1 = inp.E_steps  # decode steps per request: E[O - 1] / tau
        self.ref_hit = float(inp.E_basis[2])
        self.slopes: list[float] = []  # (d step / d tokens, / d KV bytes, / d FLOPs) at a full chunk
        self.index = 0.0  # dispersion of the decoders per step (0: the decode-only step at the mean batch)

    def dstep(self, n: float) -> float:
        """A decode-only step with ``n`` sequences at the mean decode context (s); with MTP a verify step of
        ``n q`` tokens plus its draft passes."""
        if self.draft is None:
            return self.step(n, n * self.kv_d, n * self.fl_d)
        return self.step(n * self.q, n * self.kv_d, n * self.fl_d) + self.draft(n)

    def mean_dstep(self, b: float) -> float:
        """The decode-only step averaged over steps whose decoder count is gamma with mean ``b`` and variance
        ``index x b``, at most ``c`` (``dstep(b)`` while ``index`` is 0): ``dstep`` is not affine in the batch
        (convex where the GEMMs turn compute-bound, concave where their efficiency saturates), so a fluctuating
        batch's steps average away from the step at the mean."""
        if self.index <= 0.0 or b <= 1e-9:
            return self.dstep(b)
        y = gammaincinv(b / self.index, _SEEN_U) * self.index
        if not 1e-6 * b < float(y.mean()) < math.inf:  # a shape so small that the nodes underflow
            return self.dstep(b)
        y *= b / float(y.mean())
        return float(sum(self.dstep(float(v)) for v in np.minimum(y, float(self.c)))) / SEEN_NODES

    def set_dispersion(self, index: float, b: float) -> bool:
        """Average decode-only steps over batches of dispersion ``index`` (``mean_dstep``) from now on; False
        (and nothing set) when ``dstep`` is affine there (the average is the step at the mean within 0.1%)."""
        if not (index > 0.0 and math.isfinite(index)) or b <= 1e-9:
            return False
        t0 = self.dstep(b)
        self.index = index
        if abs(self.mean_dstep(b) - t0) <= 1e-3 * t0:
            self.index = 0.0
            return False
        return True

    def seen_dstep(self, b_seen: float, index: float, cap: float) -> float:
        """The decode-only step averaged over the batch ``B`` a decoder sees: itself plus ``Y`` others, ``Y``
        gamma with mean ``b_seen - 1`` and variance ``index x (b_seen - 1)`` (the size-biased count of a
        negative-binomial batch of dispersion ``index``: ``E[B^2] / E[B] - 1`` others, variance ``index`` times
        their mean), at most ``cap``; ``SEEN_NODES`` quantile midpoints, scaled to the mean (``dstep`` at the mean
        where it is affine)."""
        m = b_seen - 1.0
        if m <= 1e-9 or not 1e-9 < index < math.inf:  # no spread, or an unstable batch (index inf)
            return self.dstep(min(b_seen, cap))
        y = gammaincinv(m / index, _SEEN_U) * index
        if not 1e-6 * m < float(y.mean()) < math.inf:  # a shape so small that the nodes underflow
            return self.dstep(min(b_seen, cap))
        y *= m / float(y.mean())
        return float(sum(self.dstep(float(v)) for v in np.minimum(1.0 + y, cap))) / SEEN_NODES

    def draft_s(self, b: float) -> float:
        """The draft passes of a step with ``b`` decoders (0 without MTP)."""
        return 0.0 if self.draft is None else self.draft(b)

    def one_step_error(self, b: float, C: float, w: np.ndarray, const: float) -> tuple[np.ndarray, np.ndarray]:
        """(grid points whose whole prompt fits the ``C`` tokens left, ``step_s`` minus the affine
        expansion there) for a step carrying ``b`` decoders and one whole (uncached part of a) prompt.
        The roofline kinks of the GEMMs and of attention are where an expansion around a full chunk
        goes wrong; the error is interpolated in the prompt length between ``GRID`` prompt quantiles."""
        inp, step = self.inp, self.step
        sel = inp.grid_pc <= C
        if not sel.any():
            return sel, np.zeros(0)
        bkv, bfl, bq, dr = b * self.kv_d, b * self.fl_d, b * self.q, self.draft_s(b)
        exact = [step(bq + float(pc), bkv + float(k), bfl + float(f)) + dr
                 for pc, k, f in zip(inp.grid_pc[sel], self.g_kv[sel], self.g_fl[sel])]
        return sel, np.asarray(exact) - (const + w @ self.g_basis[:, sel])

    def one_step_times(self, sel: np.ndarray, err: np.ndarray, affine: np.ndarray) -> np.ndarray | None:
        """Per point, the affine time of a one-step prefill corrected by the interpolated error."""
        if not sel.any():
            return None
        if err.size == 1:
            out: np.ndarray = affine + err[0]
            return out
        out = affine + np.interp(self.inp.P, self.inp.grid_p[sel], err)
        return out

    def refresh_slopes(self, tok0: float, kv0: float, fl0: float, t_full: float, C: float) -> None:
        """Finite-difference slopes of ``step_s`` around a step carrying ``b`` decoders and a full chunk."""
        step = self.step
        h_t = max(1.0, C / 4.0)
        g_t = (t_full - step(tok0 - h_t, kv0, fl0)) / h_t
        if kv0 > 0.0:
            g_kv = (t_full - step(tok0, 0.75 * kv0, fl0)) / (0.25 * kv0)
        else:
            g_kv = (step(tok0, 1e9, fl0) - t_full) / 1e9
        if fl0 > 0.0:
            g_fl = (t_full - step(tok0, kv0, 0.75 * fl0)) / (0.25 * fl0)
        else:
            g_fl = (step(tok0, kv0, 1e12) - t_full) / 1e12
        self.slopes[:] = [g_t, g_kv, g_fl]

    def evaluate(self, x: float, arrays: bool = False) -> StepIterate:
        """The step-time model at ``x`` decoders per step; ``arrays``: per-point prefill times and fresh
        slopes (the slopes are otherwise those of the first evaluation)."""
        inp = self.inp
        b = min(x, self.b_max)
        t_d0 = self.mean_dstep(b)
        C = max(1.0, self.budget - b * self.q)
        kv_c, fl_c = self.chunk_cost(int(C), int(self.ref_hit + max(0.0, (inp.E_Pc - C) / 2.0)))
        tok0, kv0, fl0 = b * self.q + C, b * self.kv_d + kv_c, b * self.fl_d + fl_c
        t_full = self.step(tok0, kv0, fl0)
        if arrays or not self.slopes:  # first and final evaluations only
            self.refresh_slopes(tok0, kv0, fl0, t_full, C)
        g_t, g_kv, g_fl = self.slopes
        # affine step time of a chunk: const + w . basis (the draft passes of the step's b decoders are fixed)
        const = t_full - g_t * C - g_kv * kv_c - g_fl * fl_c + self.draft_s(b)
        w = g_kv * self.pkv + g_fl * self.pfl
        w[1] += g_t
        sel, err = self.one_step_error(b, C, w, const)
        long_prompts = self.chunked and inp.max_pc > C
        if not arrays and sel.all() and not long_prompts:
            # one step each: the mean is linear in the basis means and the grid errors
            E_own = max(t_d0, const + float(w @ inp.E_basis) + float(err @ inp.grid_weights))
            return self.iterate(x, b, t_d0, C, E_own, 1.0, None, 1.0)
        slope_part = w @ inp.basis
        affine = const + slope_part
        single = self.one_step_times(sel, err, affine)
        n: np.ndarray | float
        before: np.ndarray | float = 0.0
        if long_prompts:
            n, full, last = _chunk_bases(inp, C)
            before = (n - 1.0) * const + w @ full
            own = before + np.maximum(t_d0, const + w @ last)
            if single is not None:
                own = np.where(inp.Pc <= C, np.maximum(t_d0, single), own)
            E_n = _mean(n)
        else:
            n = 1.0
            own = np.maximum(t_d0, single if single is not None else affine)
            E_n = 1.0
        return self.iterate(x, b, t_d0, C, _mean(own), E_n, own, n)._replace(marginal=slope_part, intercept_s=const,
                                                                             before_last=before)

    def iterate(self, x: float, b: float, t_d0: float, C: float, E_own: float, E_n: float, own: np.ndarray | None,
                n: np.ndarray | float) -> StepIterate:
        """Close the fixed point: prefill adds ``m = lam E[D]`` seconds per second on top of the decode
        steps (``E[D] = E[own] - E[n] T_d0``), so ``x_new = lam (E[O] - 1) T_d0 / (1 - m)``."""
        E_delta = E_own - E_n * t_d0
        m = self.lam * E_delta  # fraction of time that is prefill work on top of the decode steps
        if self.decodes and m < 1.0:
            x_new = self.lam * self.E_Om1 * t_d0 / (1.0 - m)
        else:
            x_new = 0.0 if m < 1.0 else math.inf
        return StepIterate(x, b, t_d0, C, E_own, E_n, own, n, m, E_delta, float(x_new))

    def broken(self, s: StepIterate) -> bool:
        """Prefill alone saturates the replica, or the prefill lane (with the scalar approximation of its
        share of decode-only time, ``max(E[Pc] / C, 1 / k) T_d0``) does."""
        k = 1.0 + self.lam * (s.t_d0 + s.E_delta)
        lane_share = max(self.inp.E_Pc / s.C, 1.0 / k) * s.t_d0
        return bool(s.m >= 1.0 or self.lam * (s.E_delta + lane_share) >= 1.0)
