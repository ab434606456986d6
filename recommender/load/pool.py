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
``x = lam (E[O] - 1) T_d0 / (1 - lam E[D])``, with ``T_d0`` the step of ``b = min(x, c - 1)`` decoders where a slot
prefills and ``min(x, c)`` in a decode pool (its prefill is the last prompt token's step; at ``c - 1`` a P/D decode
pool read 1.4% past the ceiling ``c / step(c)`` at saturation). ``step_s`` is not affine in the batch: convex where the weight
GEMMs turn compute-bound (flat to ~10 sequences on A100 TP8 int8, to ~4 on TP4 int4, then 0.5-1 ms a sequence),
concave where their efficiency saturates; so where the average below differs from the step at the mean by over
0.1%, the fixed point is solved again with ``T_d0 = E[dstep(B)]``, ``B`` gamma with mean ``b`` and variance
``D_s (1 - x / c) b`` (``StepModel.mean_dstep``, ``D_s`` below from the first solve), and ``dT/db`` is the
slope of that average.

Batch seen by a decoder. In step time, requests come in clusters: those arriving during a long
prefill step start together, like the customers of an M/G/1 busy period with service ``D``
(Takacs: ``D_cluster = E[N^2] / E[N] = (m (1 - m) + lam^2 E[D^2]) / (1 - m)^2 + 1 / (1 - m)``,
``m = lam E[D]``; shrunk towards 1 by ``ca2`` for smoother arrivals). A bigger batch makes steps
longer and so draws more arrivals per step (self-excitation with branching ratio
``beta = lam (E[O] - 1) dT/db``). The dispersion of the decoder count is
``D_s = (1 + (ca2 - 1) g) / (1 - beta) + (D_cluster - 1) / (1 - beta)^2``: renewal arrivals' GI/G/inf index
(``g = E[min(O, O') - 1] / E[O - 1]``, the overlap of two decodes) amplified as a birth-death chain whose
steps slow with the batch (linear noise approximation), plus the cluster excess amplified as a Hawkes count
(checked against the simulator; the KV headroom keeps ``D_cluster / (1 - beta)^2``, the larger).
A decoder sees ``B_seen = max(1, min(c, x + D_s (1 - x / c)))`` sequences on average (``E[B^2] / E[B]``, itself
included, compressed near the cap): itself plus ``Y`` others, ``Y`` gamma with mean ``B_seen - 1`` and variance
``D_s (1 - x / c)`` times it (a size-biased negative-binomial batch), at most ``c`` in all, and ``T_d =
E[dstep(min(1 + Y, c))]`` (``StepModel.seen_dstep``, 6 quantile nodes; ``dstep(B_seen)`` where it is affine), stretched by the prefills admitted while it
decodes (rate ``phi lam``, ``phi = min(1, (c - 1) / B)``: none with one slot) to
``T_bar = T_d / (1 - rho_D)``, ``rho_D = phi lam E_interf``. Little's law in wall time:
``B = lam (E[O] - 1) T_bar`` decoders and ``a = lam (E[own] + (E[O] - 1) T_bar)`` running.

Utilisation is the busiest of: the prefill lane ``rho_busy = lam E[max(S, M(P) + max(Pc / C, 1 / k) I)]`` (prompts
that share a step share its fixed part, the intercept ``I`` of the full-chunk expansion, but each pays its
slope part ``M(P)``, so none is credited the weight read a prompt alone hides under), the slots ``a / c``, the decode
interference ``rho_D`` and feedback ``beta``, and the KV cache ``a held / kv_capacity_tokens``. Stable
iff < 1; capacity is the rate at which it reaches 1 (what the simulator sustains under overload).
Separately, ``kv_peak = (a held + KV_HEADROOM_SD sqrt(D_s a E[ctx^2])) / kv_capacity_tokens``: vLLM
preempts rather than queues when KV runs out, so a plan must leave room for the batch's
fluctuations (the search holds ``kv_peak`` under the same cap as utilisation).

Waiting before the first chunk (FCFS): slots as G/G/c with holding time ``H = own + (O - 1) T_bar``,
with Hayward's approximation for the clustered (peaked) arrivals: ``P_w = ErlangC(c / D_cluster,
a / D_cluster)`` and ``E[W_s] = P_w E[H] D_cluster / (c - a) (ca2 + cs2_H) / 2`` (Allen-Cunneen); then
the prefill lane as G/G/1 with service ``S`` (only with c >= 2): ``E[W_l] = (1 - P_w) rho_L /
(1 - rho_L) E[S] (ca2 + cs2_S) / 2``, times Kraemer & Langenbach-Belz's ``exp(-2 (1 - rho_L) (1 - ca2)^2 /
(3 rho_L (ca2 + cs2_S)))`` for arrivals smoother than Poisson (``ca2 < 1``); both are Pollaczek-Khinchine for
Poisson arrivals and one server. The wait is 0 with probability ``(1 - P_w)(1 - (1 - P_w) rho_L)``, else exponential with the
matching mean (the exponential tail of M/G/1 waiting). An arrival that finds only decodes running
waits for the running step to end: ``U(0, T_d)`` with probability ``(1 - exp(-a) - P_w)^+ (1 - rho_L)``.
Prompts that arrive during the step a request waits for, while it waits for the lane, or during its own
earlier chunk steps ``B(P)``, join its last prefill step (vLLM fills the token budget at each step boundary),
delaying its first token by ``min(lam E[Pc] (W_lane + T_d [R > 0]) + J(B), spare budget) E_join / E[Pc]``:
``J(B)`` the tokens of the whole prompts that arrive in ``B`` (none with probability ``P(G > B)``), ``E_join``
a prompt's slope part where it fits one step (it joins a compute-bound step), else ``E[D]``. On decoders a
prompt interferes by ``E_interf = E[D] + (1 - exp(-lam E[own])) (E_join - E[D])`` (it shares its step with
another prompt when one arrives during its prefill), which sets ``rho_D`` and the TPOT window.

TPOT: the ``n = O - 1`` decode steps of a request form a window that behaves as an M/G/1 delay busy
period started by ``n T_d`` of decode work plus ``K``, the prefill work of requests that arrived
during its own lane wait and prefill (``E[K] = phi lam E[D] L``). Each request arriving in the window
adds its prefill ``D`` and, as a co-decoder, ``dT/db`` for the ``min(O' - 1, n U)`` steps it shares.
``TPOT = T_d e^{sigma_b z - sigma_b^2 / 2} + Y / n``: batch noise from decoders already running when
the window opens (variance ``D_s x`` decoders at ``dT/db``, fading with the residual holding time),
and interference ``Y``: 0 when no request arrives in the window ``w = n T_d + L_hit``, otherwise lognormal with
the remaining mean ``(n T_d rho_D + K) / (1 - rho_D)`` and busy-period variance. The arrivals after a request's
own are a renewal process started at its arrival (round-robin: gamma gaps of shape ``1 / ca2`` and rate
``phi lam``), so none comes with probability ``P(G > w)`` and the mean and variance of ``Y`` scale by
``m(w) / (phi lam w)``, ``m`` the renewal function (``queueing.renewal_count``: exact within 4 mean gaps, its
asymptote ``phi lam w - (1 - ca2) / 2`` beyond; ``exp(-phi lam w)`` and 1 for Poisson). ``L_hit`` is ``L`` plus
the time whose arrivals the fluid co-scheduling counts as joined, times the chance that such an arrival's prompt
does not fit whole into the spare budget of the request's last prefill step (``hit_window``: its remaining chunks
then run during the decode; every 32k prompt overflows an 8k-chunk step's spare). With slots saturated,
admissions are paced by departures, so interference variances shrink by ``(1 - P_w) + P_w / c``.

MTP speculative decoding (``recommender.load.summaries.speculation``: ``q = k + 1`` query tokens per decoder,
``tau`` tokens emitted per step): the model runs in decode steps, not tokens. A request's decode takes
``n = (O - 1) / tau`` steps (``recommender.load.pool_inputs``; contexts and KV stay in tokens); a decoder takes
``q`` tokens of the budget (``C = budget - q b``, slots ``min(max_num_seqs, budget / q)``); the step with ``b``
decoders is ``step_s(q b + chunk, b kv, q b fl + chunk's) + draft_s(b, mean context)``; TPOT per output token
is the per-step value over ``tau``, and ``E2E = TTFT + (O - 1) TPOT = TTFT + n x step``.

Not modelled: preemption churn (kept out of stable plans by the KV headroom), head-of-line blocking
of a long prompt without chunked prefill, KV-block sharing of prefix-cache hits between requests
(a hit saves compute only; every sequence holds its own KV). Against the simulator (toy linear and
roofline cost models, rag- and chat-like workloads) p90 / p99 agree within ~10-20% up to
utilisation ~0.7; the model is optimistic by up to ~25% in the tails at higher load.

Code: ``pool_inputs`` (the rate-independent workload arrays), ``pool_steps`` (step times and the fixed
point), ``queueing`` (Erlang C, the root finder), and here ``solve_pool``: one function per phase of a
step of the vLLM scheduler as the model sees it (``_prefill_lane``: prefill chunking; ``_decode_batch``:
decoding; ``_capacity``: the busiest resource and the KV headroom against preemption;
``_admission_wait``: admission; ``_decode_window``: a request's decode steps until it finishes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import gammainc, ndtri

from recommender.load.pool_inputs import PoolInputs
from recommender.load.pool_steps import StepIterate, StepModel
from recommender.load.protocols import Limits, StepCost
from recommender.load.queueing import erlang_c, least_root, renewal_count
from recommender.load.summaries import CostSummary, _mean, cost_summary
from recommender.load.topology import PoolKind

WAIT_SHAPE = False
KV_HEADROOM_SD = 3.0  # KV demand counted as mean + 3 standard deviations of the running batch's KV


@dataclass(frozen=True)
class PoolSolution:
    """Solved replica (fields per the module docstring); ``own`` and ``spare_tokens`` are per
    quasi-random point; ``window`` holds the TPOT model (None without decodes, or unstable)."""

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
    wait_shape: float = 1.0  # gamma shape of the wait given that it waits (1: exponential)
    resid_q: float = 0.0
    t_d: float = 0.0
    t_bar: float = 0.0
    own: np.ndarray | None = None
    lane_share: float = 0.0  # fraction of the mean queue wait spent behind other prefills (not slots)
    # co-scheduled prefill: requests that arrive while one waits join its last prefill step
    co_tokens_per_s: float = 0.0  # lam * E[Pc]
    prefill_s_per_token: float = 0.0  # marginal step time of one more prefill token
    spare_tokens: np.ndarray | None = None  # per point: budget left in its last prefill step(s)
    before_last_s: np.ndarray | float = 0.0  # per point: a chunked prompt's steps before its last one (s)
    arrival_rate_per_s: float = 0.0  # lam: requests per second at this replica
    arrival_shape: float = 1.0  # 1 / ca2: the gamma shape of the gaps between its arrivals
    rho_d: float = 0.0
    window: DecodeWindow | None = None  # TPOT model pieces (see ``tpot``)

    def ttft_wait(self, e_wait: np.ndarray, u_resid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(queue wait, step residual) per point, from ``e_wait = -ln(1 - u)`` (a unit exponential) and a
        uniform: ``W = 0`` w.p. ``1 - p``, else gamma with mean ``m = E[W] / p`` and shape ``k``
        (``wait_shape``): for ``k = 1`` exponential, ``W = m max(0, e + ln p)``; otherwise the Wilson-Hilferty
        quantile ``W = m (1 - 1 / (9 k) + z / (3 sqrt(k)))^3`` at ``z = Phi^-1(v)``, ``v = 1 - exp(-max(0, e + ln p))``
        the conditional level. ``R = T_d * max(0, u - (1 - q)) / q``."""
        w = np.zeros_like(u_resid)
        r = w
        if self.wait_p > 0.0 and self.wait_mean_s > 0.0:
            m = self.wait_mean_s / self.wait_p
            e = np.maximum(e_wait + math.log(self.wait_p), 0.0)
            k = self.wait_shape
            if k == 1.0:
                w = e * m
            else:
                z = ndtri(np.clip(-np.expm1(-e), 1e-12, 1.0 - 1e-12))
                c = 1.0 / (9.0 * k)
                w = np.where(e > 0.0, m * np.maximum(1.0 - c + z * math.sqrt(c), 0.0) ** 3, 0.0)
        if self.resid_q > 0.0:
            r = np.maximum(u_resid - (1.0 - self.resid_q), 0.0) * (self.t_d / self.resid_q)
        return w, r

    def co_scheduled(
        self, lane_wait_s: np.ndarray, resid_s: np.ndarray, u_join: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(extra TTFT, the part of the wait and of the earlier chunk steps whose arrivals did NOT join the
        request's last prefill step, the part whose arrivals the fluid counts as joined), given a uniform
        ``u_join`` per point.

        vLLM admits waiting requests at step boundaries into the remaining token budget, so a request's
        last prefill step also carries the prompts that arrived during the step it waited for (before and
        after it: the whole step, ``T_d`` when ``R > 0``) and during its lane wait, ``lam E[Pc] (W_lane +
        T_d [R > 0])`` tokens (a fluid: the lane's bulk service makes the M/G/1 wait an overstatement that
        this mean balances), and those that arrived during its own earlier chunk steps ``B(P)`` (full steps:
        nothing else fits them). Those come whole, not as a fluid: none arrives in ``B`` with probability
        ``P(G > B)`` (renewal arrivals, as in ``tpot``); otherwise (``u_join > P(G > B)``) they bring
        ``m(B) E[Pc] / P(G <= B)`` tokens. At most the spare budget joins, at ``E[D] / E[Pc]`` s a token.
        (Without ``B``, rag on 2 x b200 TP2 with a 4k budget and 4.5k-token prompts read TTFT p90 282 ms
        against 350 ms simulated: one in ten prompts has its 400-token tail step filled by a newcomer; as a
        fluid, every 32k prompt on 8 x mi300x with a 16k budget read a share of a newcomer that comes to one
        in seven, TTFT p90 +27%.) The uncovered part (for the TPOT backlog) counts the mean tokens."""
        before = self.before_last_s
        if self.spare_tokens is None or self.co_tokens_per_s <= 0.0:
            return np.zeros_like(lane_wait_s), lane_wait_s + resid_s + before, np.zeros_like(lane_wait_s)
        rate = self.co_tokens_per_s
        waited = rate * (lane_wait_s + np.where(resid_s > 0.0, self.t_d, 0.0))
        fluid = np.minimum(waited + rate * before, self.spare_tokens)
        covered = fluid / rate
        joined = waited
        if np.any(before > 0.0):
            rb = self.arrival_rate_per_s * before
            shape = self.arrival_shape
            if shape == 1.0:
                hit, come = -np.expm1(-rb), rb
            else:
                hit = gammainc(shape, shape * rb)
                come = np.maximum(hit, rb - 0.5 * (1.0 - 1.0 / shape))
            joined = waited + np.where(u_join > 1.0 - hit, come * (rate / self.arrival_rate_per_s) / np.maximum(hit, 1e-300),
                                       0.0)
        tokens = np.minimum(joined, self.spare_tokens)
        uncovered = np.maximum(lane_wait_s + resid_s + before - covered, 0.0)
        return tokens * self.prefill_s_per_token, uncovered, lane_wait_s + resid_s + before - uncovered

    def hit_window(self, inputs: PoolInputs, covered_s: np.ndarray) -> np.ndarray:
        """The part of ``covered_s`` (the time whose arrivals ``co_scheduled`` counts as joined, a fluid) whose
        arrivals still reach the request's decode window: ``covered x P(Pc' > spare)``, the chance that an
        arrival's prompt does not fit whole into the spare budget of the request's last prefill step (its
        remaining chunks then run during the request's decode)."""
        if self.spare_tokens is None or not np.any(covered_s > 0.0):
            return np.zeros_like(covered_s)
        pc = np.sort(inputs.Pc)
        over = 1.0 - np.searchsorted(pc, self.spare_tokens, side="right") / pc.size
        return covered_s * over

    @property
    def wait_total_mean_s(self) -> float:
        return self.wait_mean_s + self.resid_q * self.t_d / 2.0

    def tpot(
        self, inputs: PoolInputs, lane_sojourn_s: np.ndarray, z_base: np.ndarray, u_interf: np.ndarray,
        hit_sojourn_s: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(samples, conditional means) of TPOT per point, given each request's wait + own prefill.

        ``TPOT = T_d * exp(sigma_b z - sigma_b^2 / 2) + Y / n``: batch noise on the decode step, plus the
        interference ``Y`` in the window of ``n = O - 1`` steps. ``Y`` is 0 when no request arrives
        during the window or the request's own lane sojourn ``L`` (probability
        ``exp(-phi lam (n T_d + L))``), otherwise lognormal with the remaining mean and variance;
        ``E[Y] = (n T_d rho_D + K) / (1 - rho_D)`` with backlog ``K = phi lam E[D] L``.
        ``hit_sojourn_s`` (default ``L``): the time from the request's arrival to its first token over which
        an arrival still reaches its decode window (``L`` plus the part of the wait whose arrivals the fluid
        ``co_scheduled`` counts as joined, where they do not fit whole: ``hit_window``); the chance of a hit and
        the renewal correction of the count are taken over ``n T_d`` plus it.
        """
        win = self.window
        assert win is not None
        n = inputs.Om1
        one = 1.0 - self.rho_d
        # Arrivals after the request's own are a renewal process started at an arrival (round-robin: the
        # next one comes a whole Erlang gap later), not Poisson: in a window of w seconds none arrives with
        # probability P(G > w), and on average m(w) do (the renewal function, ``renewal_count``; exactly r w
        # for Poisson; its asymptote alone, r w - (1 - ca2) / 2, counted twice the arrivals of Erlang-18 gaps
        # in a window of 0.7 gaps, the 32k-prompt case below). Counting r w instead put
        # 15 x TP1 replicas of a 32k-prompt workload at TPOT p90 55.7 ms against 31.6 ms simulated (#31).
        # The window runs from the request's own arrival (the renewal process starts there): arrivals during its
        # wait and prefill queue behind it and prefill during its decode unless they join its last prefill step
        # whole. Only the fluid share of them (``lane_sojourn_s``) adds work; the chance of a hit and the count's
        # renewal correction are over the whole window. On 18 x TP1 mi300x with 32k prompts in 8k chunks, the
        # window from the last chunk read a hit for 6% of 450-token answers against 12% simulated (TPOT p90
        # -19%): each arrival's 32k prompt overflows the spare budget of a request's last step.
        rate, shape = win.arrival_rate_s, win.arrival_shape
        w = n * self.t_d + (lane_sojourn_s if hit_sojourn_s is None else hit_sojourn_s)
        rw = rate * w
        if shape == 1.0:
            hit = -np.expm1(-rw)
            scale: np.ndarray | float = 1.0
        else:
            hit = gammainc(shape, shape * rw)
            scale = renewal_count(rw, shape) / np.maximum(rw, 1e-300)
        backlog = win.backlog_rate_s * lane_sojourn_s
        mean_y = scale * (n * self.t_d * self.rho_d + backlog) / one
        var_y = scale * (win.interference_var_s2 + win.backlog_var_rate_s2 * lane_sojourn_s / (one * one))
        p0 = 1.0 - hit
        busy = np.maximum(hit, 1e-12)
        m1 = np.maximum(mean_y / busy, 1e-150)
        cond_var = np.maximum((var_y + mean_y * mean_y) / busy - m1 * m1, 0.0)
        s2 = np.log1p(cond_var / (m1 * m1))
        v = np.clip((u_interf - p0) / busy, 1e-12, 1.0 - 1e-12)
        y = np.where(u_interf > p0, m1 * np.exp(np.sqrt(s2) * ndtri(v) - 0.5 * s2), 0.0)
        sb = win.base_sigma
        samples = self.t_d * np.exp(sb * z_base - 0.5 * sb * sb) + y / n
        tau = inputs.tokens_per_step  # per step -> per output token (MTP: a step emits tau tokens per sequence)
        if tau != 1.0:
            return samples / tau, (self.t_d + mean_y / n) / tau
        return samples, self.t_d + mean_y / n


@dataclass(frozen=True)
class _Slots:
    """Running slots of one replica: ``c = min(max_num_seqs, max_num_batched_tokens, kv_capacity / held)``
    with ``held = mean decode context + block / 2`` KV tokens per sequence, and which limit binds."""

    c: int
    held: float
    neck: str

    @staticmethod
    def of(limits: Limits, cs: CostSummary, inp: PoolInputs) -> _Slots:
        held = inp.mean_ctx + cs.kv_block_tokens / 2.0
        seqs = max(1, min(int(limits.max_num_seqs), int(limits.max_num_batched_tokens) // cs.query_tokens))
        kv_slots = cs.kv_capacity_tokens / held
        return _Slots(int(min(seqs, kv_slots)), held, "kv_cache" if kv_slots < seqs else "max_num_seqs")


class _Lane(NamedTuple):
    """Prefill chunking at the fixed point: per point the interference ``D = own - n T_d0`` and the lane
    service ``S = D + max(Pc / C, 1 / k) T_d0`` (``k = 1 + lam (T_d0 + E[D])``); ``rho_l = lam E[S]``, which
    sets the lane's waits; ``rho_busy = lam E[S_shared] >= rho_l``, which sets its utilisation (capacity)."""

    own: np.ndarray
    n: np.ndarray | float
    delta: np.ndarray
    E_delta: float
    E_D2: float
    S: np.ndarray
    E_S: float
    rho_l: float
    rho_busy: float
    E_join: float  # a prompt's mean cost when it joins a step that already carries a prompt (s)
    E_interf: float  # a prompt's mean interference on decoders, sharing its step with another prompt or not (s)


def _prefill_lane(it: StepIterate, inp: PoolInputs, lam: float) -> _Lane:
    assert it.own is not None  # a final (arrays) evaluation
    own, n, t_d0 = it.own, it.n, it.t_d0
    delta = own - n * t_d0
    E_delta = float(_mean(delta))
    # Lane service: the prompt's own prefill work plus its share of the decode-only part of the
    # steps it rides: a full budget carries C / Pc prompts, a lightly loaded lane the k = 1 + lam T
    # prompts that arrive during one prefill step; each step pays T_d0 once.
    k_light = 1.0 + lam * (t_d0 + E_delta)
    share = np.maximum(inp.Pc / it.C, 1.0 / k_light)
    S = delta + share * t_d0
    E_S = _mean(S)
    E_busy = E_S
    if it.marginal is not None:
        # Busy time: prompts that share a step share its fixed part, not each its own roofline credit (a
        # compute-bound step of k prompts reads the weights once, not k times): a whole prompt costs at least
        # its slope part plus its share of the step's intercept (the step time is convex in its tokens).
        # Before, a P/D prefill pool of 70B int8 on L4 TP4 with 300-token prompts read 7.3 req/s of capacity
        # against 5.8 simulated. The waits keep S: the lane's queue serves such prompts together, in bulk.
        shared = np.where(inp.Pc <= it.C, np.maximum(S, it.marginal + share * it.intercept_s), S)
        E_busy = _mean(shared)
    # A prompt that joins a step already carrying another prompt pays its slope part: the step is compute-bound
    # by then, so none of its tokens hide under the decoders' weight and KV read as a lone short prompt's do
    # (qwen2.5-7b code completion on one H100 PCIe, 750-token prompts: 15.5 ms joined against 9.9 ms alone).
    # (Only a prompt that fits the C tokens left beside the decoders in one step: a longer one's full chunks are
    # compute-bound already, and ``marginal`` is its one-step expansion only where it fits.)
    E_join = _mean(np.where(inp.Pc <= it.C, np.maximum(delta, it.marginal), delta)) if it.marginal is not None else E_delta
    # On decoders, a prompt interferes by D when its step carries no other prompt, by its slope part when it
    # does: that happens with probability 1 - exp(-lam E[own]) (another arrival during its prefill).
    E_interf = E_delta + -math.expm1(-lam * _mean(own)) * (E_join - E_delta)
    return _Lane(own=own, n=n, delta=delta, E_delta=E_delta, E_D2=float(delta @ delta) / delta.size, S=S, E_S=E_S,
                 rho_l=lam * E_S, rho_busy=lam * E_busy, E_join=E_join, E_interf=E_interf)


class _Batch(NamedTuple):
    """Decoding at the fixed point (module docstring, "Batch seen by a decoder"): one more decoder's step
    time ``d_seq``, feedback ``beta``, step-clock cluster index ``d_cluster`` and decoder-count dispersion
    ``d_s``, the decode step ``t_d`` at the batch a decoder sees, the share ``phi`` of arrivals admitted
    while it decodes, interference ``rho_d``, ``t_bar = t_d / (1 - rho_d)``, decoders ``B`` and running
    requests ``a`` (Little), and slot utilisation ``a / c``."""

    d_seq: float
    beta: float
    d_cluster: float
    d_s: float
    t_d: float
    d_kv: float  # the index the KV headroom counts: D_cluster / (1 - beta)^2 (calibrated against preemptions)
    phi: float
    rho_d: float
    t_bar: float
    decoders: float
    running: float
    rho_s: float


def _decode_batch(steps: StepModel, it: StepIterate, lane: _Lane, c: int, ca2: float) -> _Batch:
    lam, decodes, E_Om1 = steps.lam, steps.decodes, steps.E_Om1
    x, b, t_d0 = float(it.x), float(it.b), float(it.t_d0)
    d_seq = steps.mean_dstep(b + 1.0) - t_d0
    beta = lam * E_Om1 * d_seq if decodes else 0.0
    # Step-clock clusters: a prefill adds D to its step, during which lam * D more requests arrive.
    m_c = lam * lane.E_delta
    one_m = max(1.0 - m_c, 1e-12)
    d_cluster = (m_c * one_m + lam * lam * lane.E_D2) / (one_m * one_m) + 1.0 / one_m
    d_cluster = 1.0 + ca2 * (d_cluster - 1.0)  # renewal arrivals (round-robin): less bunching
    # Decoder-count dispersion. Base: a birth-death population (arrivals at rate lam, each decode holding its
    # slot while steps take T(B)); renewal arrivals of squared CV ca2 give the GI/G/inf index 1 + (ca2 - 1) g
    # (g = E[min(H, H')] / E[H], the overlap of two decodes), and the load-dependent step time amplifies it by
    # 1 / (1 - beta) (linear noise approximation of the birth-death chain: its death rate B / ((O - 1) T(B))
    # has slope (1 - beta) / ((O - 1) T)). Clusters (requests arriving in one prefill step start together) add
    # their excess D_cluster - 1, which the feedback amplifies twice, 1 / (1 - beta)^2 (the Hawkes count index:
    # a longer step also gathers a bigger cluster). The whole index over (1 - beta)^2, as before, put gb200 MoE
    # at TPOT p90 +15% on 4 round-robin replicas (beta 0.33, D_cluster 1.01); a pure-decode load at beta 0.6
    # reads 2.5 against 2.7 simulated, where (1 - beta)^-2 said 6.3.
    d_0 = 1.0 + (ca2 - 1.0) * steps.inp.overlap_ratio
    d_s = d_0 / (1.0 - beta) + (d_cluster - 1.0) / (1.0 - beta) ** 2 if beta < 1.0 else math.inf
    # The KV headroom keeps the index it was calibrated with (at least d_s): a preemption costs a whole
    # recompute, so its margin stays on the conservative side.
    d_kv = max(d_cluster / (1.0 - beta) ** 2, d_s) if beta < 1.0 else math.inf
    # The batch a decoder sees (E[B^2] / E[B], compressed near the cap; at least 1: the decoder itself, whatever
    # smooth arrivals do to its variance), and the decode step averaged over its spread: the step is not affine in
    # the batch (convex where a GEMM turns compute-bound, concave where its efficiency saturates). At the mean
    # batch alone, chat-day on 2 x TP8 A100 int8 read a 9.2 ms step against 10.5 ms that the simulator's decoders
    # saw, TPOT p90 -17%: the step is flat to 10 sequences, then each one adds 0.5 ms.
    squeeze = max(0.0, 1.0 - x / c)
    b_seen = max(1.0, min(float(c), x + d_s * squeeze))
    t_d = steps.seen_dstep(b_seen, d_s * squeeze, float(c)) if decodes else steps.dstep(1.0)
    B_guess = max(lam * E_Om1 * t_d, 1e-12)
    phi = (1.0 if c >= 2 else 0.0) if not decodes else min(1.0, (c - 1.0) / B_guess)
    rho_d = phi * lam * lane.E_interf if decodes else 0.0
    t_bar = t_d / (1.0 - rho_d) if rho_d < 1.0 else math.inf
    decoders = lam * E_Om1 * t_bar if decodes else 0.0
    a = lam * (_mean(lane.own) + E_Om1 * t_bar) if decodes else lam * _mean(lane.own)
    return _Batch(d_seq=d_seq, beta=beta, d_cluster=d_cluster, d_s=d_s, t_d=t_d, d_kv=d_kv, phi=phi, rho_d=rho_d, t_bar=t_bar,
                  decoders=decoders, running=a, rho_s=a / c)


class _Capacity(NamedTuple):
    """The busiest resource: ``utilisation`` (>= 1: unstable), its name, the rate at which it reaches 1,
    and the KV cache at the running batch's mean + ``KV_HEADROOM_SD`` sd (over 1: expect preemptions)."""

    utilisation: float
    bottleneck: str
    capacity_per_s: float
    kv_peak: float
    finite: bool


def _capacity(lam: float, slots: _Slots, cs: CostSummary, inp: PoolInputs, lane: _Lane, batch: _Batch) -> _Capacity:
    a, d_s = batch.running, batch.d_kv
    # KV headroom: running KV tokens have mean a * held and variance d_s * a * E[ctx^2]; vLLM preempts
    # when they exceed the cache, so count the mean plus KV_HEADROOM_SD standard deviations.
    kv_sd = math.sqrt(max(d_s, 1.0) * a * inp.ctx2_ratio) * inp.mean_ctx if math.isfinite(d_s) else math.inf
    u_kv = a * slots.held / cs.kv_capacity_tokens
    kv_peak = (a * slots.held + KV_HEADROOM_SD * kv_sd) / cs.kv_capacity_tokens
    rho_l, rho_s, rho_d, beta = lane.rho_busy, batch.rho_s, batch.rho_d, batch.beta
    parts = (rho_l, rho_s, rho_d, beta, u_kv)
    util = max(parts)
    finite = math.isfinite(util)
    if not finite:  # report the finite evidence of overload, at least 1
        util = max([p for p in parts if math.isfinite(p)] + [1.0])
    neck = max((rho_l, "prefill"), (rho_s, slots.neck), (u_kv, "kv_cache"), (max(rho_d, beta), "decode"))[1]
    return _Capacity(util, neck, lam / util if util > 0.0 else math.inf, kv_peak, finite)


class _Wait(NamedTuple):
    """Waiting before the first chunk (module docstring, "Waiting"): P(wait) and mean wait, the share of
    it spent in the prefill lane, the probability of waiting for the running step, and ``E[H]``, ``E[H^2]``
    of the holding time ``H = own + (O - 1) T_bar`` and the probability ``p_w`` that all slots are busy."""

    wait_p: float
    wait_mean_s: float
    lane_share: float
    resid_q: float
    E_H: float
    E_H2: float
    p_w: float
    shape: float = 1.0  # gamma shape of the wait given that it waits


def _admission_wait(kind: PoolKind, lam: float, ca2: float, c: int, inp: PoolInputs, lane: _Lane, batch: _Batch) -> _Wait:
    t_bar, a, rho_l, E_Om1 = batch.t_bar, batch.running, lane.rho_l, inp.E_steps
    # holding time H = own + (O - 1) T_bar; own and O sit on independent quasi-random columns
    E_own = _mean(lane.own)
    E_H = E_own + E_Om1 * t_bar
    E_H2 = _mean(lane.own * lane.own) + 2.0 * t_bar * E_own * E_Om1 + t_bar * t_bar * inp.E_Om1_2
    # Clustered arrivals: treat clusters of d_run requests as single customers of c / d_run servers.
    d_run = min(max(batch.d_cluster, 1.0), float(c))
    p_w = erlang_c(c / d_run, a / d_run)
    w_slots = p_w * E_H * d_run / (c - a) * (ca2 + max(0.0, E_H2 / (E_H * E_H) - 1.0)) / 2.0
    p_lane = w_lane = 0.0
    S, E_S = lane.S, lane.E_S
    if c >= 2 and kind is not PoolKind.DECODE and rho_l > 0.0:
        cs2_s = max(0.0, float(S @ S) / S.size / (E_S * E_S) - 1.0)
        p_lane = (1.0 - p_w) * rho_l
        w_lane = (1.0 - p_w) * rho_l / (1.0 - rho_l) * E_S * (ca2 + cs2_s) / 2.0
        if ca2 < 1.0 and ca2 + cs2_s > 0.0:
            # Kraemer & Langenbach-Belz (1976): with arrivals smoother than Poisson (round-robin, ca2 = 1 / R) the
            # Allen-Cunneen wait overstates light traffic by exp(2 (1 - rho) (1 - ca2)^2 / (3 rho (ca2 + cs2)));
            # 4 x TP1 mi300x on 32k prompts without chunked prefill had TTFT p90 +28% against the simulator.
            w_lane *= math.exp(-2.0 * (1.0 - rho_l) * (1.0 - ca2) ** 2 / (3.0 * rho_l * (ca2 + cs2_s)))
    wait_p = 1.0 - (1.0 - p_w) * (1.0 - p_lane)
    resid_q = 0.0 if kind is PoolKind.PREFILL else max(0.0, 1.0 - math.exp(-a) - p_w) * (1.0 - rho_l)
    lane_share = w_lane / (w_lane + w_slots) if w_lane > 0.0 else 0.0
    cv2 = 1.0
    if lane_share > 0.0 and WAIT_SHAPE:
        cv2 = lane_share * _lane_wait_cv2(lam, rho_l, S) + (1.0 - lane_share)
    return _Wait(wait_p=wait_p, wait_mean_s=w_slots + w_lane, lane_share=lane_share, resid_q=resid_q, E_H=E_H, E_H2=E_H2,
                 p_w=p_w, shape=_gamma_shape(cv2))


def _lane_wait_cv2(lam: float, rho: float, S: np.ndarray) -> float:
    """Squared coefficient of variation of an M/G/1 wait given that it waits (Takacs: ``E[W] = lam E[S^2] /
    (2 (1 - rho))``, ``E[W^2] = 2 E[W]^2 + lam E[S^3] / (3 (1 - rho))``, ``P(W > 0) = rho``): ``rho E[W^2] / E[W]^2 - 1``,
    1/3 for a constant service in light traffic (the wait is then the uniform residual of one prefill), 1 for
    an exponential one or in heavy traffic."""
    E_S2, E_S3 = _mean(S * S), _mean(S * S * S)
    if rho <= 0.0 or rho >= 1.0 or E_S2 <= 0.0:
        return 1.0
    E_W = lam * E_S2 / (2.0 * (1.0 - rho))
    E_W2 = 2.0 * E_W * E_W + lam * E_S3 / (3.0 * (1.0 - rho))
    return rho * E_W2 / (E_W * E_W) - 1.0


def _gamma_shape(cv2: float) -> float:
    """The gamma shape ``1 / cv2`` of a wait whose squared coefficient of variation is ``cv2`` (in [1/4, 2])."""
    return 1.0 if cv2 == 1.0 else 1.0 / min(max(cv2, 0.25), 2.0)


@dataclass(frozen=True)
class DecodeWindow:
    """TPOT pieces of a request's window of ``n = O - 1`` decode steps (module docstring, "TPOT")."""

    interference_var_s2: np.ndarray
    backlog_rate_s: float
    backlog_var_rate_s2: float
    arrival_rate_s: float
    base_sigma: np.ndarray
    arrival_shape: float = 1.0  # 1 / ca2: the gamma shape of the gaps between arrivals at one replica


def _decode_window(lam: float, ca2: float, c: int, x: float, inp: PoolInputs, lane: _Lane, batch: _Batch, wait: _Wait) -> DecodeWindow:
    # Window of n = O - 1 steps. Interference: requests arriving in it add their prefill D and,
    # as co-decoders, d_seq per shared step for ov = min(O' - 1, n U) steps (O' - 1 ~ M).
    nn, d_seq, phi, rho_d, t_bar, t_d = inp.Om1, batch.d_seq, batch.phi, batch.rho_d, batch.t_bar, batch.t_d
    E_delta, p_w = lane.E_interf, wait.p_w
    E_D2 = lane.E_D2 * (E_delta / lane.E_delta) ** 2 if lane.E_delta > 0.0 else lane.E_D2
    E_S2 = E_D2 + 2.0 * E_delta * d_seq * inp.E_ov + d_seq * d_seq * inp.E_ov2
    # renewal arrivals with squared CV ca2: E[S^2] -> Var(S) + ca2 E[S]^2 (diffusion approximation)
    E_S2 = E_S2 - (1.0 - ca2) * (E_delta + d_seq * inp.E_ov) ** 2
    one_p = np.maximum(1.0 - (rho_d + phi * lam * d_seq * inp.E_ov), 0.05)
    # With slots saturated, admissions are paced by departures (squared CV ~ 1 / c), not Poisson.
    smooth = (1.0 - p_w) + p_w / c
    # Batch noise: decoders already running when the window opens, fading with residual holding time.
    var_b = np.zeros_like(nn)
    if x > 0.0 and d_seq > 0.0:
        tau = max(wait.E_H2 / (2.0 * wait.E_H), 1e-12)
        y = np.maximum(nn * t_bar / tau, 1e-9)
        var_b = d_seq * d_seq * batch.d_s * x * inp.ctx2_ratio * ((1.0 - np.exp(-y)) / y) ** 2
    return DecodeWindow(
        interference_var_s2=smooth * nn * t_bar * phi * lam * E_S2 / (one_p * one_p),
        backlog_rate_s=phi * lam * E_delta,
        backlog_var_rate_s2=smooth * phi * lam * (E_D2 - (1.0 - ca2) * E_delta * E_delta),
        arrival_rate_s=phi * lam,
        base_sigma=np.sqrt(np.log1p(var_b / (t_d * t_d))),
        arrival_shape=1.0 / ca2 if ca2 > 0.0 else 1.0,
    )


def solve_pool(
    cost: StepCost, limits: Limits, *, rate_per_s: float, inputs: PoolInputs, ca2: float, kind: PoolKind
) -> PoolSolution:
    """Solve one replica of a ``kind`` pool at arrival rate ``lam = rate_per_s`` (requests/s per replica)
    with renewal arrivals of squared coefficient of variation ``ca2`` (formulas in the module docstring),
    phase by phase: slots,
    the step-time fixed point (decoders per step), prefill chunking (lane), decoding (batch), the busiest
    resource (capacity, KV headroom against preemption), admission wait, and the decode window (TPOT)."""
    lam, inp = rate_per_s, inputs
    cs = cost_summary(cost)
    slots = _Slots.of(limits, cs, inp)
    c = slots.c
    if c < 1:
        return PoolSolution(False, math.inf, 0.0, math.inf, "kv_cache", 0.0)
    steps = StepModel(cost, limits, cs, inp, lam, kind is not PoolKind.PREFILL and inp.E_O > 1.0, c,
                      prefill_slot=kind is not PoolKind.DECODE)
    if steps.decodes:
        s, ok = least_root(steps.evaluate, steps.broken, float(c))
    else:
        s, ok = steps.evaluate(0.0), not steps.broken(steps.evaluate(0.0))
    it = steps.evaluate(float(s.x), arrays=True)
    lane = _prefill_lane(it, inp, lam)
    batch = _decode_batch(steps, it, lane, c, ca2)
    if steps.decodes and ok and steps.set_dispersion(batch.d_s * max(0.0, 1.0 - float(it.x) / c), float(it.b)):
        # a decode step not affine in the batch: solve again with the steps averaged over its fluctuations (longer
        # steps gather more decoders: 9.1 -> 9.6 per step on chat-day's 2 x TP8 A100 int8, 9.9 simulated), from the
        # old root (a lower bracket where the average is longer; least_root starts from 0 otherwise)
        s, ok = least_root(steps.evaluate, steps.broken, float(c), start=float(s.x), rtol=1e-4)
        it = steps.evaluate(float(s.x), arrays=True)
        lane = _prefill_lane(it, inp, lam)
        batch = _decode_batch(steps, it, lane, c, ca2)
    cap = _capacity(lam, slots, cs, inp, lane, batch)
    if not (ok and cap.finite) or cap.utilisation >= 1.0 or not math.isfinite(batch.t_bar):
        return PoolSolution(False, max(cap.utilisation, 1.0), lane.rho_busy, batch.rho_s, cap.bottleneck,
                            min(cap.capacity_per_s, lam), kv_peak=cap.kv_peak)
    wait = _admission_wait(kind, lam, ca2, c, inp, lane, batch)
    window = _decode_window(lam, ca2, c, float(it.x), inp, lane, batch, wait) if steps.decodes else None
    budget, C, b = steps.budget, float(it.C), float(it.b)
    return PoolSolution(
        True, cap.utilisation, lane.rho_busy, batch.rho_s, cap.bottleneck, cap.capacity_per_s, kv_peak=cap.kv_peak,
        running=batch.running, decoders=batch.decoders, wait_p=wait.wait_p, wait_mean_s=wait.wait_mean_s, wait_shape=wait.shape,
        resid_q=wait.resid_q, lane_share=wait.lane_share, t_d=batch.t_d, t_bar=batch.t_bar, own=lane.own,
        rho_d=batch.rho_d, co_tokens_per_s=lam * inp.E_Pc, prefill_s_per_token=max(lane.E_join / inp.E_Pc, 0.0),
        spare_tokens=np.maximum((lane.n * C if steps.chunked else max(budget - b * steps.q, 0.0)) - inp.Pc, 0.0),
        before_last_s=it.before_last, arrival_rate_per_s=lam, arrival_shape=1.0 / ca2 if ca2 > 0.0 else 1.0,
        window=window,
    )
