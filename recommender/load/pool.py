"""One replica of one serving pool at an arrival rate: the analytic queueing model behind ``analyze``.

Notation (per replica): arrival rate ``lam``; renewal arrivals with squared coefficient of variation
``ca2`` (1 for Poisson, ``1/R`` for Poisson routed round-robin over ``R`` replicas); ``P`` prompt
tokens, ``h`` prefix-cache hit (whole blocks of the shared prefix, at most ``P - 1``), ``Pc = P - h``
tokens to prefill, ``O`` output tokens. A running sequence holds on average
``held = E[P] + E[O^2] / (2 E[O]) + block / 2`` KV tokens (prompt plus half its output, size-biased by
output length, plus half a block of rounding); slots ``c = min(max_num_seqs, max_num_batched_tokens,
kv_capacity_tokens / held)``.

Steps. Decodes are scheduled first (vLLM v1), so with ``b`` decoders a step has ``C = budget - b``
tokens left for prefill. ``T_d0 = step_s(b, ...)`` is a decode-only step at the time-averaged decode
context; ``T_full = step_s(b + C, ...)`` a step carrying a full chunk. A step carrying a chunk takes
a time affine in (tokens, KV bytes, FLOPs) around ``T_full`` (slopes by finite differences; exact for
a linear cost model) but never less than ``T_d0`` (the roofline kink: a small chunk hides under the
memory-bound decode). A prompt that fits the budget in one step is timed exactly instead: the affine
value plus its error at ``GRID`` prompt quantiles where ``step_s`` itself is called, interpolated in
the prompt length. (Expanding around a full chunk alone put a mid-size prompt's step on the wrong
side of the attention roofline, compute-bound instead of reading the decoders' KV, and overstated
capacity by up to 58% on chat workloads.) A prompt's own prefill ``own(P)`` sums its ``n(P) = ceil(Pc / C)`` chunk steps
(one step without chunked prefill); its interference on decoders is ``D(P) = own(P) - n(P) T_d0``;
its service in the prefill lane ``S(P) = D(P) + max(Pc / C, 1 / k) T_d0``: each prefill step pays
``T_d0`` once, shared by the ``C / Pc`` prompts of a full budget or, in light traffic, by the
``k = 1 + lam (T_d0 + E[D])`` prompts that arrive during one prefill step.

Fixed point in step time, solved for ``x`` (decoders per step, step-averaged) by safeguarded secant:
prefill adds ``lam E[D]`` seconds per second on top of the decode steps, so
``x = lam (E[O] - 1) T_d0 / (1 - lam E[D])``.

Batch seen by a decoder. In step time, requests come in clusters: those arriving during a long
prefill step start together, like the customers of an M/G/1 busy period with service ``D``
(Takacs: ``D_cluster = E[N^2] / E[N] = (m (1 - m) + lam^2 E[D^2]) / (1 - m)^2 + 1 / (1 - m)``,
``m = lam E[D]``; shrunk towards 1 by ``ca2`` for smoother arrivals). A bigger batch makes steps
longer and so draws more arrivals per step (self-excitation with branching ratio
``beta = lam (E[O] - 1) dT/db``), which scales the dispersion of the decoder count to
``D_s = D_cluster / (1 - beta)^2`` (the Hawkes-process count index; checked against the simulator).
A decoder sees ``B_seen = min(c, x + D_s (1 - x / c))`` sequences (``E[B^2] / E[B]``, itself included,
compressed near the cap), ``T_d = step_s(B_seen, ...)``, stretched by the prefills admitted while it
decodes (rate ``phi lam``, ``phi = min(1, (c - 1) / B)``: none with one slot) to
``T_bar = T_d / (1 - rho_D)``, ``rho_D = phi lam E[D]``. Little's law in wall time:
``B = lam (E[O] - 1) T_bar`` decoders and ``a = lam (E[own] + (E[O] - 1) T_bar)`` running.

Utilisation is the busiest of: the prefill lane ``rho_L = lam E[S]``, the slots ``a / c``, the decode
interference ``rho_D`` and feedback ``beta``, and the KV cache ``a held / kv_capacity_tokens``. Stable
iff < 1; capacity is the rate at which it reaches 1 (what the simulator sustains under overload).
Separately, ``kv_peak = (a held + KV_HEADROOM_SD sqrt(D_s a E[ctx^2])) / kv_capacity_tokens``: vLLM
preempts rather than queues when KV runs out, so a plan must leave room for the batch's
fluctuations (the search holds ``kv_peak`` under the same cap as utilisation).

Waiting before the first chunk (FCFS): slots as G/G/c with holding time ``H = own + (O - 1) T_bar``,
with Hayward's approximation for the clustered (peaked) arrivals: ``P_w = ErlangC(c / D_cluster,
a / D_cluster)`` and ``E[W_s] = P_w E[H] D_cluster / (c - a) (ca2 + cs2_H) / 2`` (Allen-Cunneen); then
the prefill lane as G/G/1 with service ``S`` (only with c >= 2): ``E[W_l] = (1 - P_w) rho_L /
(1 - rho_L) E[S] (ca2 + cs2_S) / 2``; both are Pollaczek-Khinchine for Poisson arrivals and one
server. The wait is 0 with probability ``(1 - P_w)(1 - (1 - P_w) rho_L)``, else exponential with the
matching mean (the exponential tail of M/G/1 waiting). An arrival that finds only decodes running
waits for the running step to end: ``U(0, T_d)`` with probability ``(1 - exp(-a) - P_w)^+ (1 - rho_L)``.
Prompts that arrive during the step a request waits for, or while it waits for the lane, join its
last prefill step (vLLM fills the token budget at each step boundary), delaying its first token by
``min(lam E[Pc] (W_lane + T_d [R > 0]), spare budget) E[D] / E[Pc]``.

TPOT: the ``n = O - 1`` decode steps of a request form a window that behaves as an M/G/1 delay busy
period started by ``n T_d`` of decode work plus ``K``, the prefill work of requests that arrived
during its own lane wait and prefill (``E[K] = phi lam E[D] L``). Each request arriving in the window
adds its prefill ``D`` and, as a co-decoder, ``dT/db`` for the ``min(O' - 1, n U)`` steps it shares.
``TPOT = T_d e^{sigma_b z - sigma_b^2 / 2} + Y / n``: batch noise from decoders already running when
the window opens (variance ``D_s x`` decoders at ``dT/db``, fading with the residual holding time),
and interference ``Y``: 0 with probability ``exp(-phi lam (n T_d + L))``, otherwise lognormal with the
remaining mean ``(n T_d rho_D + K) / (1 - rho_D)`` and busy-period variance. With slots saturated,
admissions are paced by departures, so interference variances shrink by ``(1 - P_w) + P_w / c``.

Not modelled: preemption churn (kept out of stable plans by the KV headroom), head-of-line blocking
of a long prompt without chunked prefill, KV-block sharing of prefix-cache hits between requests
(a hit saves compute only; every sequence holds its own KV). Against the simulator (toy linear and
roofline cost models, rag- and chat-like workloads) p90 / p99 agree within ~10-20% up to
utilisation ~0.7; the model is optimistic by up to ~25% in the tails at higher load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import gammaincc, ndtri

from recommender.load.percentiles import IdentityCache
from recommender.load.protocols import LengthDistribution, Limits, StepCost
from recommender.load.summaries import _basis, _mean, cost_summary, lengths
from recommender.load.topology import PoolKind, PoolSpec, Traffic, prompt_tokens_in_kv

GRID = 6  # prompt-length quantile levels at which a prefill step is timed exactly
KV_HEADROOM_SD = 3.0  # KV demand counted as mean + 3 standard deviations of the running batch's KV


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
    Om1: np.ndarray  # max(O - 1, 1)
    E_Om1_2: float  # E[(O - 1)^2]
    E_ov: np.ndarray  # per point: E[min(O' - 1, n U)], steps another request's decode overlaps a window of n
    E_ov2: np.ndarray  # its second moment
    E_Pc2: float
    multi: np.ndarray  # O > 1
    grid_p: np.ndarray  # prompt lengths at GRID quantile levels (ascending), with their
    grid_pc: np.ndarray  # tokens to prefill
    grid_h: np.ndarray  # and prefix-cache hits
    grid_weights: np.ndarray  # mean over points of each grid value's linear-interpolation weight


_inputs_cache = IdentityCache(64)


def pool_inputs(
    prompt: LengthDistribution, output: LengthDistribution, *, kind: PoolKind, shared_prefix_fraction: float,
    block_tokens: int, prefix_caching: bool,
) -> PoolInputs:
    """Workload arrays for a ``kind`` pool: ``AGGREGATED``, ``PREFILL`` (O = 1) or ``DECODE`` (KV arrives,
    1 token computed); ``h`` per ``prompt_tokens_in_kv``."""

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
        nn, M = np.maximum(O - 1.0, 1.0), max(E_O - 1.0, 1e-9)
        short = nn <= M
        order = np.argsort(P, kind="stable")
        idx = np.unique(order[np.round(np.linspace(0, P.size - 1, GRID)).astype(int)])
        idx = idx[np.argsort(P[idx], kind="stable")]
        gp, keep = np.unique(P[idx], return_index=True)
        idx = idx[keep]
        return PoolInputs(
            P=P, O=O, Pc=Pc, basis=basis, E_basis=basis.mean(axis=1), E_P=E_P, E_Pc=float(_mean(Pc)), E_O=E_O,
            mean_ctx=mean_ctx, ctx2_ratio=E_ctx2 / (mean_ctx * mean_ctx), min_pc=float(Pc.min()),
            max_pc=float(Pc.max()), i_min=int(np.argmin(P)), Om1=np.maximum(O - 1.0, 1.0), multi=O > 1.0,
            E_Om1_2=_mean((O - 1.0) ** 2), E_Pc2=_mean(Pc * Pc),
            E_ov=np.where(short, nn / 2.0, M - M * M / (2.0 * nn)),
            E_ov2=np.where(short, nn * nn / 3.0, M * M - 2.0 * M**3 / (3.0 * nn)),
            grid_p=gp, grid_pc=Pc[idx], grid_h=hit[idx],
            grid_weights=np.array([_mean(np.interp(P, gp, np.eye(gp.size)[j])) for j in range(gp.size)]) if gp.size > 1
            else np.ones(1),
        )

    key = (prompt, output, kind, float(shared_prefix_fraction), int(block_tokens), bool(prefix_caching))
    return _inputs_cache.get(key, make)


def pool_inputs_of(pool: PoolSpec, traffic: Traffic, kind: PoolKind) -> PoolInputs:
    """``pool_inputs`` of ``traffic`` for ``pool`` serving as ``kind``."""
    return pool_inputs(traffic.prompt, traffic.output, kind=kind, shared_prefix_fraction=traffic.shared_prefix_fraction,
                       block_tokens=int(pool.cost.kv_block_tokens), prefix_caching=bool(pool.limits.enable_prefix_caching))


@dataclass
class PoolSolution:
    """Solved replica (fields per the module docstring); ``own`` and ``lane`` are per quasi-random point."""

    stable: bool
    utilisation: float
    rho_lane: float
    rho_slots: float
    bottleneck: str
    capacity_per_s: float
    kv_peak: float = math.inf  # KV demand at mean + KV_HEADROOM_SD sd of the running batch / capacity
    running: float = 0.0
    decoders: float = 0.0
    wait_p: float = 0.0
    wait_mean_s: float = 0.0
    resid_q: float = 0.0
    t_d: float = 0.0
    t_bar: float = 0.0
    own: np.ndarray | None = None
    lane_share: float = 0.0  # fraction of the mean queue wait spent behind other prefills (not slots)
    # co-scheduled prefill: requests that arrive while one waits join its last prefill step
    co_tokens_per_s: float = 0.0  # lam * E[Pc]
    prefill_s_per_token: float = 0.0  # marginal step time of one more prefill token
    spare_tokens: np.ndarray | None = None  # per point: budget left in its last prefill step(s)
    # TPOT model pieces (see ``tpot``)
    rho_d: float = 0.0
    backlog_rate_s: float = 0.0  # phi * lam * E[D]
    backlog_var_rate_s2: float = 0.0  # phi * lam * E[D^2]
    arrival_rate_s: float = 0.0  # phi * lam
    interference_var_s2: np.ndarray | None = None  # per point: busy-period variance of the window
    base_sigma: np.ndarray | None = None  # per point: lognormal sigma of the batch-noise factor on T_d

    def ttft_wait(self, e_wait: np.ndarray, u_resid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(queue wait, step residual) per point, from ``e_wait = -ln(1 - u)`` (a unit exponential) and a
        uniform: ``W = m * max(0, e + ln p)`` (0 w.p. 1 - p, else exponential with mean m) and
        ``R = T_d * max(0, u - (1 - q)) / q``."""
        w = np.zeros_like(u_resid)
        r = w
        if self.wait_p > 0.0 and self.wait_mean_s > 0.0:
            m = self.wait_mean_s / self.wait_p
            w = np.maximum(e_wait + math.log(self.wait_p), 0.0) * m
        if self.resid_q > 0.0:
            r = np.maximum(u_resid - (1.0 - self.resid_q), 0.0) * (self.t_d / self.resid_q)
        return w, r

    def co_scheduled(self, lane_wait_s: np.ndarray, resid_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(extra TTFT, the part of the wait whose arrivals did NOT join the request's prefill step).

        vLLM admits waiting requests at step boundaries into the remaining token budget, so a
        request's first prefill step also carries the prompts that arrived during the step it waited
        for (before and after it: the whole step, ``T_d`` when ``R > 0``) and during its lane wait:
        ``min(lam E[Pc] (W_lane + T_d [R > 0]), spare budget)`` more tokens at ``E[D] / E[Pc]`` each."""
        if self.spare_tokens is None or self.co_tokens_per_s <= 0.0:
            return np.zeros_like(lane_wait_s), lane_wait_s + resid_s
        window = lane_wait_s + np.where(resid_s > 0.0, self.t_d, 0.0)
        tokens = np.minimum(self.co_tokens_per_s * window, self.spare_tokens)
        covered = tokens / self.co_tokens_per_s
        return tokens * self.prefill_s_per_token, np.maximum(lane_wait_s + resid_s - covered, 0.0)

    @property
    def wait_total_mean_s(self) -> float:
        return self.wait_mean_s + self.resid_q * self.t_d / 2.0

    def tpot(
        self, inputs: PoolInputs, lane_sojourn_s: np.ndarray, z_base: np.ndarray, u_interf: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(samples, conditional means) of TPOT per point, given each request's wait + own prefill.

        ``TPOT = T_d * exp(sigma_b z - sigma_b^2 / 2) + Y / n``: batch noise on the decode step, plus the
        interference ``Y`` in the window of ``n = O - 1`` steps. ``Y`` is 0 when no request arrives
        during the window or the request's own lane sojourn ``L`` (probability
        ``exp(-phi lam (n T_d + L))``), otherwise lognormal with the remaining mean and variance;
        ``E[Y] = (n T_d rho_D + K) / (1 - rho_D)`` with backlog ``K = phi lam E[D] L``.
        """
        assert self.interference_var_s2 is not None and self.base_sigma is not None
        n = inputs.Om1
        one = 1.0 - self.rho_d
        backlog = self.backlog_rate_s * lane_sojourn_s
        mean_y = (n * self.t_d * self.rho_d + backlog) / one
        var_y = self.interference_var_s2 + self.backlog_var_rate_s2 * lane_sojourn_s / (one * one)
        p0 = np.exp(-self.arrival_rate_s * (n * self.t_d + lane_sojourn_s))
        busy = np.maximum(1.0 - p0, 1e-12)
        m1 = np.maximum(mean_y / busy, 1e-150)
        cond_var = np.maximum((var_y + mean_y * mean_y) / busy - m1 * m1, 0.0)
        s2 = np.log1p(cond_var / (m1 * m1))
        v = np.clip((u_interf - p0) / busy, 1e-12, 1.0 - 1e-12)
        y = np.where(u_interf > p0, m1 * np.exp(np.sqrt(s2) * ndtri(v) - 0.5 * s2), 0.0)
        sb = self.base_sigma
        samples = self.t_d * np.exp(sb * z_base - 0.5 * sb * sb) + y / n
        return samples, self.t_d + mean_y / n


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


def least_root(evaluate: Callable[[float], dict], broken: Callable[[dict], bool], cap: float) -> tuple[dict, bool]:
    """Least ``x`` in ``[0, cap]`` with ``f(x) = x`` (``f = evaluate(x)["x_new"]``, increasing), or ok=False.

    Safeguarded secant: extrapolate while below the root (for a convex ``f`` the secant undershoots,
    so iterates stay below it), regula falsi / bisection once bracketed; a ``broken`` (unstable)
    evaluation is an upper bracket, and a secant that points past it proves there is no stable root.
    """
    s = evaluate(0.0)
    if broken(s):
        return s, False
    lo, h_lo = 0.0, float(s["x_new"])
    if h_lo <= 0.0:
        return s, True
    hi, h_hi = math.inf, None
    x = h_lo
    for _ in range(60):
        s = evaluate(x)
        h = float(s["x_new"]) - x
        if broken(s) or not math.isfinite(h):
            hi, h_hi = x, None
            x_new = math.nan
        elif abs(h) <= 1e-6 * max(1.0, x):
            return s, True
        elif h > 0.0:
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


def solve_pool(cost: StepCost, limits: Limits, lam: float, inp: PoolInputs, ca2: float, mode: PoolKind) -> PoolSolution:
    """Solve one replica at arrival rate ``lam`` (formulas in the module docstring)."""
    cs = cost_summary(cost)
    step = cost.step_s
    budget = int(limits.max_num_batched_tokens)
    chunked = bool(limits.chunked_prefill)
    held = inp.mean_ctx + cs.kv_block_tokens / 2.0
    seqs = max(1, min(int(limits.max_num_seqs), budget))
    kv_slots = cs.kv_capacity_tokens / held
    c = int(min(seqs, kv_slots))
    neck_slots = "kv_cache" if kv_slots < seqs else "max_num_seqs"
    if c < 1:
        return PoolSolution(False, math.inf, 0.0, math.inf, "kv_cache", 0.0)
    kv_d, fl_d = cs.decode_cost(inp.mean_ctx) if inp.mean_ctx >= cs.decode_affine_from_tokens else cost.decode_seq_cost(int(round(inp.mean_ctx)))
    pkv = np.array(cs.prefill_kv)
    pfl = np.array(cs.prefill_fl)
    decodes = mode is not PoolKind.PREFILL and inp.E_O > 1.0
    E_Om1 = inp.E_O - 1.0
    ref_hit = float(inp.E_basis[2])

    def dstep(n: float) -> float:
        return step(n, n * kv_d, n * fl_d)

    slopes: list[float] = []

    g_kv, g_fl = cs.prefill_cost(inp.grid_pc, inp.grid_h)
    g_basis = np.array(_basis(inp.grid_pc, inp.grid_h))

    def one_step_error(b: float, C: float, w: np.ndarray, const: float) -> tuple[np.ndarray, np.ndarray]:
        """(grid points whose whole prompt fits the ``C`` tokens left, ``step_s`` minus the affine
        expansion there) for a step carrying ``b`` decoders and one whole (uncached part of a) prompt.
        The roofline kinks of the GEMMs and of attention are where an expansion around a full chunk
        goes wrong; the error is interpolated in the prompt length between ``GRID`` prompt quantiles."""
        sel = inp.grid_pc <= C
        if not sel.any():
            return sel, np.zeros(0)
        bkv, bfl = b * kv_d, b * fl_d
        exact = [step(b + float(pc), bkv + float(k), bfl + float(f))
                 for pc, k, f in zip(inp.grid_pc[sel], g_kv[sel], g_fl[sel])]
        return sel, np.asarray(exact) - (const + w @ g_basis[:, sel])

    def one_step_times(sel: np.ndarray, err: np.ndarray, affine: np.ndarray) -> np.ndarray | None:
        """Per point, the affine time of a one-step prefill corrected by the interpolated error."""
        if not sel.any():
            return None
        if err.size == 1:
            return affine + err[0]
        return affine + np.interp(inp.P, inp.grid_p[sel], err)

    def evaluate(x: float, arrays: bool = False) -> dict:  # arrays: refresh the slopes
        b = min(x, c - 1.0)
        t_d0 = dstep(b)
        C = max(1.0, budget - b)
        kv_c, fl_c = cost.prefill_chunk_cost(int(C), int(ref_hit + max(0.0, (inp.E_Pc - C) / 2.0)))
        tok0, kv0, fl0 = b + C, b * kv_d + kv_c, b * fl_d + fl_c
        t_full = step(tok0, kv0, fl0)
        if arrays or not slopes:  # finite-difference slopes: first and final evaluations only
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
            slopes[:] = [g_t, g_kv, g_fl]
        g_t, g_kv, g_fl = slopes
        const = t_full - g_t * C - g_kv * kv_c - g_fl * fl_c  # affine step time of a chunk: const + w . basis
        w = g_kv * pkv + g_fl * pfl
        w[1] += g_t
        sel, err = one_step_error(b, C, w, const)
        if not arrays and sel.all() and not (chunked and inp.max_pc > C):
            # one step each: the mean is linear in the basis means and the grid errors
            E_own = max(t_d0, const + float(w @ inp.E_basis) + float(err @ inp.grid_weights))
            return dict(x=x, b=b, t_d0=t_d0, C=C, E_own=E_own, E_n=1.0, own=None, n=1.0, **_fixed_point(E_own, 1.0, t_d0))
        affine = const + w @ inp.basis
        single = one_step_times(sel, err, affine)
        if chunked and inp.max_pc > C:
            n, full, last = _chunk_bases(inp, C)
            own = (n - 1.0) * const + w @ full + np.maximum(t_d0, const + w @ last)
            if single is not None:
                own = np.where(inp.Pc <= C, np.maximum(t_d0, single), own)
            E_n = _mean(n)
        else:
            n = 1.0
            own = np.maximum(t_d0, single if single is not None else affine)
            E_n = 1.0
        E_own = _mean(own)
        return dict(x=x, b=b, t_d0=t_d0, C=C, E_own=E_own, E_n=E_n, own=own, n=n, **_fixed_point(E_own, E_n, t_d0))

    def _fixed_point(E_own: float, E_n: float, t_d0: float) -> dict:
        E_delta = E_own - E_n * t_d0
        m = lam * E_delta  # fraction of time that is prefill work on top of the decode steps
        if decodes and m < 1.0:
            x_new = lam * E_Om1 * t_d0 / (1.0 - m)
        else:
            x_new = 0.0 if m < 1.0 else math.inf
        return dict(m=m, E_delta=E_delta, x_new=x_new)

    def lane_share(s: dict) -> float:  # scalar approximation of E[max(Pc / C, 1 / k)] T_d0 (see below)
        k = 1.0 + lam * (s["t_d0"] + s["E_delta"])
        return max(inp.E_Pc / s["C"], 1.0 / k) * s["t_d0"]

    def broken(s: dict) -> bool:
        return bool(s["m"] >= 1.0 or lam * (s["E_delta"] + lane_share(s)) >= 1.0)

    s, ok = least_root(evaluate, broken, float(c)) if decodes else (evaluate(0.0), not broken(evaluate(0.0)))
    s = evaluate(float(s["x"]), arrays=True)
    x, b, t_d0, C = float(s["x"]), float(s["b"]), float(s["t_d0"]), float(s["C"])
    own, n = s["own"], s["n"]
    delta = own - n * t_d0
    E_delta = float(_mean(delta))
    # Lane service: the prompt's own prefill work plus its share of the decode-only part of the
    # steps it rides: a full budget carries C / Pc prompts, a lightly loaded lane the k = 1 + lam T
    # prompts that arrive during one prefill step; each step pays T_d0 once.
    k_light = 1.0 + lam * (t_d0 + E_delta)
    S = delta + np.maximum(inp.Pc / C, 1.0 / k_light) * t_d0
    E_S = _mean(S)
    rho_l = lam * E_S
    # Batch seen by a decoder, interference, Little.
    d_seq = dstep(b + 1.0) - t_d0
    beta = lam * E_Om1 * d_seq if decodes else 0.0
    # Step-clock clusters: a prefill adds D to its step, during which lam * D more requests arrive.
    m_c = lam * E_delta
    one_m = max(1.0 - m_c, 1e-12)
    E_D2 = float(delta @ delta) / delta.size
    d_cluster = (m_c * one_m + lam * lam * E_D2) / (one_m * one_m) + 1.0 / one_m
    d_cluster = 1.0 + ca2 * (d_cluster - 1.0)  # renewal arrivals (round-robin): less bunching
    d_s = d_cluster / (1.0 - beta) ** 2 if beta < 1.0 else math.inf
    b_seen = min(float(c), x + d_s * max(0.0, 1.0 - x / c))  # E[B^2]/E[B], compressed near the cap
    t_d = dstep(b_seen) if decodes else dstep(1.0)
    B_guess = max(lam * E_Om1 * t_d, 1e-12)
    phi = (1.0 if c >= 2 else 0.0) if not decodes else min(1.0, (c - 1.0) / B_guess)
    rho_d = phi * lam * E_delta if decodes else 0.0
    t_bar = t_d / (1.0 - rho_d) if rho_d < 1.0 else math.inf
    decoders = lam * E_Om1 * t_bar if decodes else 0.0
    a = lam * (_mean(own) + E_Om1 * t_bar) if decodes else lam * _mean(own)
    rho_s = a / c
    # KV headroom: running KV tokens have mean a * held and variance d_s * a * E[ctx^2]; vLLM preempts
    # when they exceed the cache, so count the mean plus KV_HEADROOM_SD standard deviations.
    kv_sd = math.sqrt(max(d_s, 1.0) * a * inp.ctx2_ratio) * inp.mean_ctx if math.isfinite(d_s) else math.inf
    u_kv = a * held / cs.kv_capacity_tokens
    kv_peak = (a * held + KV_HEADROOM_SD * kv_sd) / cs.kv_capacity_tokens
    parts = (rho_l, rho_s, rho_d, beta, u_kv)
    util = max(parts)
    if not math.isfinite(util):  # report the finite evidence of overload, at least 1
        util = max([p for p in parts if math.isfinite(p)] + [1.0])
        ok = False
    neck = max((rho_l, "prefill"), (rho_s, neck_slots), (u_kv, "kv_cache"), (max(rho_d, beta), "decode"))[1]
    cap = lam / util if util > 0.0 else math.inf
    if not ok or util >= 1.0 or not math.isfinite(t_bar):
        return PoolSolution(False, max(util, 1.0), rho_l, rho_s, neck, min(cap, lam), kv_peak=kv_peak)

    # holding time H = own + (O - 1) T_bar; own and O sit on independent quasi-random columns
    E_own = _mean(own)
    E_H = E_own + E_Om1 * t_bar
    E_H2 = _mean(own * own) + 2.0 * t_bar * E_own * E_Om1 + t_bar * t_bar * inp.E_Om1_2
    # Clustered arrivals: treat clusters of d_run requests as single customers of c / d_run servers.
    d_run = min(max(d_cluster, 1.0), float(c))
    p_w = erlang_c(c / d_run, a / d_run)
    w_slots = p_w * E_H * d_run / (c - a) * (ca2 + max(0.0, E_H2 / (E_H * E_H) - 1.0)) / 2.0
    p_lane = w_lane = 0.0
    if c >= 2 and mode is not PoolKind.DECODE and rho_l > 0.0:
        cs2_s = max(0.0, float(S @ S) / S.size / (E_S * E_S) - 1.0)
        p_lane = (1.0 - p_w) * rho_l
        w_lane = (1.0 - p_w) * rho_l / (1.0 - rho_l) * E_S * (ca2 + cs2_s) / 2.0
    wait_p = 1.0 - (1.0 - p_w) * (1.0 - p_lane)
    resid_q = 0.0 if mode is PoolKind.PREFILL else max(0.0, 1.0 - math.exp(-a) - p_w) * (1.0 - rho_l)
    sol = PoolSolution(
        True, util, rho_l, rho_s, neck, cap, kv_peak=kv_peak, running=a, decoders=decoders, wait_p=wait_p,
        wait_mean_s=w_slots + w_lane, resid_q=resid_q, lane_share=w_lane / (w_lane + w_slots) if w_lane > 0.0 else 0.0, t_d=t_d, t_bar=t_bar, own=own, rho_d=rho_d,
        co_tokens_per_s=lam * inp.E_Pc, prefill_s_per_token=max(E_delta / inp.E_Pc, 0.0),
        spare_tokens=np.maximum((n * C if chunked else max(budget - b, 0.0)) - inp.Pc, 0.0),
    )
    if decodes:
        # Window of n = O - 1 steps. Interference: requests arriving in it add their prefill D and,
        # as co-decoders, d_seq per shared step for ov = min(O' - 1, n U) steps (O' - 1 ~ M).
        nn = inp.Om1
        E_S2 = E_D2 + 2.0 * E_delta * d_seq * inp.E_ov + d_seq * d_seq * inp.E_ov2
        # renewal arrivals with squared CV ca2: E[S^2] -> Var(S) + ca2 E[S]^2 (diffusion approximation)
        E_S2 = E_S2 - (1.0 - ca2) * (E_delta + d_seq * inp.E_ov) ** 2
        one_p = np.maximum(1.0 - (rho_d + phi * lam * d_seq * inp.E_ov), 0.05)
        # With slots saturated, admissions are paced by departures (squared CV ~ 1 / c), not Poisson.
        smooth = (1.0 - p_w) + p_w / c
        sol.interference_var_s2 = smooth * nn * t_bar * phi * lam * E_S2 / (one_p * one_p)
        sol.backlog_rate_s = phi * lam * E_delta
        sol.backlog_var_rate_s2 = smooth * phi * lam * (E_D2 - (1.0 - ca2) * E_delta * E_delta)
        sol.arrival_rate_s = phi * lam
        # Batch noise: decoders already running when the window opens, fading with residual holding time.
        var_b = np.zeros_like(nn)
        if x > 0.0 and d_seq > 0.0:
            tau = max(E_H2 / (2.0 * E_H), 1e-12)
            y = np.maximum(nn * t_bar / tau, 1e-9)
            var_b = d_seq * d_seq * d_s * x * inp.ctx2_ratio * ((1.0 - np.exp(-y)) / y) ** 2
        sol.base_sigma = np.sqrt(np.log1p(var_b / (t_d * t_d)))
    return sol
