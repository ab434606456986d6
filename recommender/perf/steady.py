"""Steady state of one configuration at a load, and its cost. Pure: takes a Deployment, returns numbers.

Modes (``LoadMode``):

- ``context``: sequences already hold ``context_tokens``; figures are one decode step at that point
  (the seeds' arithmetic): ``tpot_s = decode_step_s``, ``output_tokens_per_s = batch / step x replicas``.
- ``static``: ``batch`` prompts prefilled together, then decoded together (``benchmark_latency``,
  ``gptSessionBenchmark``, LMDeploy ``profile_generation``)::

      ttft = prefill(batch x prompt)          tpot = decode_step(batch, prompt + output / 2)
      e2e  = ttft + (output - 1) x tpot       output_tokens_per_s = batch x output / e2e x replicas

  The batch's prompts share each step's token budget: ``ceil(prompt / floor(budget / batch))`` steps of
  ``floor(budget / batch)`` tokens of every prompt (``StepCostModel.prefill_s``; vLLM's scheduler caps a step's
  tokens). Another engine's static-batch benchmark (``gptSessionBenchmark``, LMDeploy, gpt-fast) prefills the batch
  in one pass (``EngineLimits.static_prefill_one_pass``, set by ``perf.conditions.static_batch_limits``).

  A batch the KV cache cannot hold at its mean context runs in ``W = ceil(batch / sequences)`` waves; the mean TTFT
  then includes waiting for earlier waves: ``(W - 1) / 2 x wave_s + prefill`` and ``e2e = W x wave_s``.

- ``closed``: ``concurrency`` requests in flight under continuous batching (``vllm bench serve
  --max-concurrency N``). A request spends ``k = ceil(prompt / (budget - N + 1))`` chunked-prefill steps
  and ``output - 1`` decode steps, so a step carries ``d = N (output - 1) / L`` decodes (``L = k + output - 1``).
  Prefill steps and decode steps are priced apart (a step's time is not linear in its tokens: the GEMMs'
  roofline is convex in them, a MoE's expert touch concave): of the ``L`` steps of a request's life
  ``s_p = min(L, N k)`` carry ``c = N k / s_p`` prefill chunks each, the rest decode only::

      t_pre = step_s(d + c x chunk, ..., prefill)      t_dec = step_s(d, ...)
      tpot  = (s_p t_pre + (L - s_p) t_dec) / L        ttft = k x t_pre   (this request's chunk steps)
      e2e   = ttft + (output - 1) x tpot               output_tokens_per_s = N x output / e2e x replicas

  When those steps would hold more than the token budget (``N (prompt + output - 1) / (k + output - 1)
  > budget``), the prefill lane queues: a request's life stretches to ``N (prompt + output - 1) /
  budget`` steps and the extra steps are TTFT. Without chunked prefill each prefill runs as its own
  step and stalls the running decodes: ``tpot = decode_step + N x prefill(prompt) / (output - 1)``.

  Admission: the engine runs at most ``r = min(N, max_num_seqs, sequences the KV cache holds at the
  mean context)``; the other ``N - r`` wait in its queue. The ``r`` running requests cycle in
  ``e2e_r``, so by Little's law every request spends ``N / r x e2e_r``: ``ttft = ttft_r + (N / r - 1)
  x e2e_r``, ``tpot = tpot_r``, ``output_tokens_per_s = r x output / e2e_r``.
- ``max``: ``closed`` at the largest concurrency the KV cache and ``max_num_seqs`` allow (offline max).
- ``open`` / ``finite``: arrivals at a rate (steady state), or a run of M requests; predicted by
  ``recommender.estimator.predict`` through the queueing model or the finite-run transient.

Every TTFT (and so E2E) includes the profile's fixed ``request_overhead_s``.

Cost: ``usd_per_hour = usd_per_gpu_hour x tp x pp x replicas``;
``usd_per_million_output_tokens = usd_per_hour / (output_tokens_per_s x 3600) x 1e6``; per million
total tokens uses prompt + output tokens/s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from recommender.perf import memory as mem
from recommender.perf.moe import balance_wait_s
from recommender.perf.step import Deployment, StepCostModel, bound_of


class LoadMode(StrEnum):
    """How the configuration is loaded (module docstring). A ``StrEnum``: ``LoadMode.CLOSED == "closed"``."""

    CONTEXT = "context"    # one decode step with sequences already holding context_tokens (the seeds)
    STATIC = "static"      # batch prompts prefilled together, then decoded together
    CLOSED = "closed"      # N requests in flight under continuous batching (admission above capacity)
    MAX = "max"            # offline max: closed at the largest concurrency the engine admits
    OPEN = "open"          # open-loop arrivals at rate_per_s, steady state (the queueing model)
    FINITE = "finite"      # a run of `requests` requests at rate_per_s and/or a concurrency cap (the simulator)


@dataclass(frozen=True)
class Load:
    """What is asked of the configuration (see module docstring for modes).

    ``batch`` is the static batch or the concurrency (``closed``; the cap of a ``finite`` run, 0 =
    none). ``rate_per_s`` (open, finite: all replicas; ``inf`` = all at once), ``requests`` (finite)
    and ``burstiness`` (gamma shape of the gaps, 1 = Poisson) describe arrivals. Build one with the
    keyword-only constructors (:meth:`static`, :meth:`closed`, ...); ``mode`` may be given as a string.
    """

    mode: LoadMode
    batch: int = 1
    context_tokens: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    rate_per_s: float | None = None
    requests: int | None = None
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", LoadMode(self.mode))

    @classmethod
    def context(cls, *, batch: int, context_tokens: int) -> "Load":
        return cls(LoadMode.CONTEXT, batch, context_tokens)

    @classmethod
    def static(cls, *, batch: int, prompt_tokens: int, output_tokens: int) -> "Load":
        return cls(LoadMode.STATIC, batch, 0, prompt_tokens, output_tokens)

    @classmethod
    def closed(cls, *, concurrency: int, prompt_tokens: int, output_tokens: int) -> "Load":
        return cls(LoadMode.CLOSED, concurrency, 0, prompt_tokens, output_tokens)

    @classmethod
    def offline_max(cls, *, prompt_tokens: int, output_tokens: int) -> "Load":
        return cls(LoadMode.MAX, 1, 0, prompt_tokens, output_tokens)

    @classmethod
    def open(cls, *, rate_per_s: float, prompt_tokens: int, output_tokens: int, burstiness: float = 1.0) -> "Load":
        return cls(LoadMode.OPEN, 1, 0, prompt_tokens, output_tokens, rate_per_s, None, burstiness)

    @classmethod
    def finite(cls, *, requests: int, prompt_tokens: int, output_tokens: int, rate_per_s: float = math.inf,
               concurrency: int = 0, burstiness: float = 1.0) -> "Load":
        return cls(LoadMode.FINITE, concurrency, 0, prompt_tokens, output_tokens, rate_per_s, requests, burstiness)

    def describe(self) -> str:
        """One line: what the load is, in the words a benchmark uses."""
        req = f"{self.prompt_tokens:,} prompt + {self.output_tokens:,} output tokens"
        if self.mode == LoadMode.CONTEXT:
            return f"{self.batch} sequences each holding {self.context_tokens:,} tokens (one decode step)"
        if self.mode == LoadMode.STATIC:
            return f"static batch of {self.batch}, {req}"
        if self.mode == LoadMode.CLOSED:
            return f"closed loop at concurrency {self.batch}, {req}"
        if self.mode == LoadMode.MAX:
            return f"offline max (as many in flight as the engine admits), {req}"
        rate = "all at once" if self.rate_per_s is None or math.isinf(self.rate_per_s) else f"{self.rate_per_s:g} req/s"
        if self.mode == LoadMode.OPEN:
            return f"open loop at {rate} (burstiness {self.burstiness:g}), {req}"
        cap = f", at most {self.batch} in flight" if self.batch else ""
        return f"finite run of {self.requests:,} requests {rate}{cap} (burstiness {self.burstiness:g}), {req}"


@dataclass(frozen=True)
class Estimate:
    """Everything ``recommend estimate`` reports (SI units; per-GPU where the name says so)."""

    fits: bool
    shortfall_bytes_per_gpu: float
    weights_bytes_per_gpu: float
    weights_bytes_total: float
    kv_cache_bytes_per_token: float
    kv_cache_capacity_bytes: float
    kv_capacity_tokens: int
    max_concurrent_sequences: int
    batch: int
    decode_step_floor_s: float
    decode_step_s: float
    decode_memory_s: float
    decode_compute_s: float
    decode_allreduce_s: float
    decode_overhead_s: float
    decode_compute_floor_s: float
    bound: str
    prefill_flops: float
    prefill_compute_floor_s: float
    prefill_s: float
    tpot_s: float
    ttft_s: float
    e2e_s: float | None
    output_tokens_per_s: float
    total_tokens_per_s: float
    usd_per_hour: float
    usd_per_million_output_tokens: float
    usd_per_million_tokens: float
    gpus_total: int
    memory: mem.MemoryBreakdown = field(repr=False)
    notes: tuple[str, ...] = ()
    #: a static batch only: the sequences of one wave and the time their prompts take to prefill together (s),
    #: in steps of at most ``max_num_batched_tokens`` tokens (``StepCostModel.prefill_s``); 0 otherwise
    wave_sequences: int = 0
    wave_prefill_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("memory", "notes")}
        d["notes"] = list(self.notes)
        return d


def _usd(usd_per_hour: float, tokens_per_s: float) -> float:
    return usd_per_hour / (tokens_per_s * 3600.0) * 1e6 if tokens_per_s > 0 else math.inf


def closed_loop(cost: StepCostModel, n: int, prompt: int, output: int, budget: int, chunked: bool,
                prefix_cached: int = 0) -> tuple[float, float, float]:
    """(ttft_s, tpot_s, step_s) of ``n`` requests running under continuous batching (module docstring).

    With chunked prefill a step holds at most ``budget`` tokens. When the ``n`` running requests
    want more per step than that (``n (prompt + output - 1) / (k + output - 1) > budget``), the
    prefill lane is the bottleneck: a request's life stretches to ``L = n (prompt + output - 1) /
    budget`` steps and the ``L - (k + output - 1)`` extra steps are spent waiting for prefill (TTFT).
    """
    p = max(0, prompt - prefix_cached)
    o = max(output, 1)
    mean_ctx = prompt + o // 2
    kv_d, fl_d = cost.decode_seq_cost(mean_ctx)
    # MTP (perf.speculative): a decode step emits `tps` tokens per sequence and verifies `q` query tokens each
    tps, q = cost.tokens_per_step, cost.query_tokens
    if chunked:
        k = max(1, math.ceil(p / max(1, budget - n * q + 1))) if p else 1
        dec_steps = (o - 1) / tps
        life = k + dec_steps
        wait_steps = 0.0
        want = n * (p + q * dec_steps) / life
        if want > budget:
            stretched = n * (p + q * dec_steps) / budget
            wait_steps, life = stretched - life, stretched
        decodes = n * dec_steps / life
        chunk = p / k if k else 0
        kv_p, fl_p = cost.prefill_chunk_cost(int(round(chunk)), prefix_cached + p // 2)
        # prefill and decode steps priced apart: of the `life` steps, s_p = min(life, n k) carry prefill
        # (c = n k / s_p chunks each, >= 1), the rest decode only; the mean step is their weighted mean
        s_p = min(life, float(n * k)) if p else 0.0
        c = n * k / s_p if s_p else 0.0
        t_dec = cost.spec_step_s(decodes, decodes * kv_d, decodes * fl_d, mean_ctx)
        t_pre = (cost.spec_step_s(decodes, decodes * kv_d, decodes * fl_d, mean_ctx, c * chunk, c * kv_p, c * fl_p,
                                  prefill=True) if s_p else t_dec)
        step = (s_p * t_pre + (life - s_p) * t_dec) / life
        # a request's TTFT: its k chunk steps, and the wait for the prefill lane (average steps)
        return wait_steps * step + k * t_pre, step / tps, step
    dec = cost.decode_step_s(n, mean_ctx)
    pre = cost.prefill_s(p, 1) if p else cost.decode_step_s(1, prompt)
    tpot = dec + (n * pre / (o - 1) if o > 1 else 0.0)
    return pre + dec, tpot, dec


def poll_wait_s(poll_steps: int, step_s: float) -> float:
    """Mean wait of a request for the scheduler's next poll when it polls every ``I = poll_steps`` steps of
    ``step_s`` seconds and arrivals fall uniformly over the poll cycle: ``(I - 1) / 2 x step_s`` (0 for vLLM, I = 1)."""
    return max(poll_steps - 1, 0) / 2.0 * step_s


def admitted(dep: Deployment, cost: StepCostModel, n: int, prompt: int, output: int) -> int:
    """Requests of a closed loop at concurrency ``n`` that run at once: ``min(n, max_num_seqs, KV capacity)``.

    The KV capacity is counted at the mean context ``prompt + output / 2`` (blocks are allocated as
    sequences grow; the engine preempts and re-admits around that point)."""
    ctx = max(prompt + max(output, 1) // 2, 1)
    by_kv = mem.max_concurrent_sequences(dep.memory(), dep.stage_model, dep.kv_dtype, dep.tp, ctx, cost.kv_block_tokens)
    return max(1, min(n, dep.limits.max_num_seqs, by_kv))


def estimate(dep: Deployment, load: Load, replicas: int = 1, usd_per_gpu_hour: float = 0.0,
             shared_prefix_fraction: float = 0.0) -> Estimate:
    """Explain one configuration at one load (see module docstring).

    With data-parallel attention (``dep.dp > 1``) the ``N`` requests of a load spread over the ``dp`` attention ranks:
    one rank runs ``ceil(N / dp)`` (its own scheduler and KV cache; the MoE layers see every rank's tokens, perf.moe),
    latencies are that rank's and throughput is ``N / ceil(N / dp)`` times the rank's (offline max: ``dp`` ranks full)."""
    if dep.dp <= 1 or load.mode in (LoadMode.OPEN, LoadMode.FINITE):
        return _estimate_rank(dep, load, replicas, usd_per_gpu_hour, shared_prefix_fraction)
    per_rank = load.batch if load.mode == LoadMode.MAX else max(1, math.ceil(load.batch / dep.dp))
    r = _estimate_rank(dep, dataclasses.replace(load, batch=per_rank), replicas, usd_per_gpu_hour, shared_prefix_fraction)
    total = r.batch * dep.dp if load.mode == LoadMode.MAX else load.batch
    scale = total / r.batch
    usd_h = r.usd_per_hour * dep.dp
    out_tps, all_tps = r.output_tokens_per_s * scale, r.total_tokens_per_s * scale
    note = (f"data-parallel attention: {total} requests over {dep.dp} attention ranks of TP {dep.tp}, {r.batch} per rank "
            f"(each rank its own KV cache of {r.kv_capacity_tokens:,} tokens)")
    notes: tuple[str, ...] = (note, *r.notes)
    timeout_steps = dep.profile.dp_balance_timeout_steps
    if load.mode == LoadMode.CLOSED and timeout_steps > 0 and r.e2e_s:
        # prefill balancing across attention ranks (perf.moe.balance_wait_s): a closed loop's rank completes
        # r.batch / e2e requests per second, each replaced at once; the wait lengthens e2e, so iterate
        step = r.tpot_s * StepCostModel.build(dep).tokens_per_step
        wait, e2e0 = 0.0, r.e2e_s
        for _ in range(4):
            wait = balance_wait_s(ranks=dep.dp, rate_per_rank_per_s=r.batch / (e2e0 + wait), timeout_s=timeout_steps * step)
        out_tps *= e2e0 / (e2e0 + wait)
        all_tps *= e2e0 / (e2e0 + wait)
        notes += (f"prefill balancing over {dep.dp} attention ranks (at most {timeout_steps:g} steps of {step * 1e3:.1f} ms, "
                  f"profile dp_balance_timeout_steps) adds {wait * 1e3:.0f} ms to TTFT",)
        r = dataclasses.replace(r, ttft_s=r.ttft_s + wait, e2e_s=e2e0 + wait)
    return dataclasses.replace(r, batch=total, output_tokens_per_s=out_tps, total_tokens_per_s=all_tps, usd_per_hour=usd_h,
                               usd_per_million_output_tokens=_usd(usd_h, out_tps), usd_per_million_tokens=_usd(usd_h, all_tps),
                               gpus_total=r.gpus_total * dep.dp, notes=notes)


def _estimate_rank(dep: Deployment, load: Load, replicas: int, usd_per_gpu_hour: float,
                   shared_prefix_fraction: float) -> Estimate:
    """:func:`estimate` for one attention rank (all of a TP-only deployment)."""
    if load.mode in (LoadMode.OPEN, LoadMode.FINITE):
        raise ValueError(f"{load.mode} loads are predicted by recommender.estimator.predict (queueing model, simulator)")
    m, tp = dep.stage_model, dep.tp  # the KV one GPU holds: its pipeline stage's layers (perf.pipeline)
    memb = dep.memory()
    cost = StepCostModel.build(dep)
    notes: list[str] = []
    seq_tokens = load.context_tokens if load.mode == LoadMode.CONTEXT else load.prompt_tokens + load.output_tokens
    cap_seqs = mem.max_concurrent_sequences(memb, m, dep.kv_dtype, tp, max(seq_tokens, 1), cost.kv_block_tokens)
    batch = load.batch
    if load.mode == LoadMode.MAX:
        batch = max(1, min(dep.limits.max_num_seqs, cap_seqs))
        notes.append(f"concurrency max = min(max_num_seqs {dep.limits.max_num_seqs}, KV capacity {cap_seqs} sequences)")
    elif batch > cap_seqs and load.mode == LoadMode.CONTEXT:
        notes.append(f"batch {batch} exceeds the KV capacity of {cap_seqs} sequences at {seq_tokens} tokens: "
                     "the engine would queue or preempt")
    ctx = load.context_tokens if load.mode == LoadMode.CONTEXT else load.prompt_tokens + max(load.output_tokens, 1) // 2
    kv, fl = cost.decode_seq_cost(max(ctx, 1))
    # a closed loop above max_num_seqs or the KV capacity runs only `run` of its requests at once
    run = admitted(dep, cost, batch, load.prompt_tokens, load.output_tokens) if load.mode == LoadMode.CLOSED else batch
    parts = cost.parts(run, run * kv, run * fl)
    floor = cost.parts(run, run * kv, run * fl, floor=True)
    decode_step_s = cost.decode_step_s(run, max(ctx, 1))
    prompt = load.prompt_tokens if load.mode != LoadMode.CONTEXT else load.context_tokens
    pkv, pfl = cost.prefill_chunk_cost(max(prompt, 1), 0)
    prefill_flops = max(prompt, 1) * cost.linear_flops_per_token + pfl
    prefill_floor = prefill_flops / cost.peak_group_flops_per_s
    prefill_s = cost.prefill_s(max(prompt, 1), 1, dep.limits.max_num_batched_tokens if dep.limits.chunked_prefill else None)
    cached = int(prompt * shared_prefix_fraction)
    e2e: float | None
    wave, prefill_wave = 0, 0.0
    if load.mode == LoadMode.CONTEXT:
        tpot = decode_step_s
        ttft = prefill_s + cost.request_overhead_s
        e2e = None
        out_tps = batch / decode_step_s * replicas
        total_tps = out_tps
    elif load.mode == LoadMode.STATIC:
        # Blocks are allocated as sequences grow, so what must fit is the batch at its mean context
        # (prompt + output / 2); a larger batch runs in waves.
        cap_mean = mem.max_concurrent_sequences(memb, m, dep.kv_dtype, tp, max(ctx, 1), cost.kv_block_tokens)
        waves = max(1, math.ceil(batch / cap_mean)) if cap_mean > 0 else 1
        wave = math.ceil(batch / waves)
        if waves > 1:
            notes.append(f"static batch {batch} runs in {waves} waves of {wave} (KV holds {cap_mean} sequences at "
                         f"the mean context of {ctx} tokens)")
            decode_step_s = cost.decode_step_s(wave, max(ctx, 1))
        # the wave's prompts share each step's token budget (vLLM's scheduler); another engine's static-batch
        # benchmark runs the wave's context in one pass (EngineLimits.static_prefill_one_pass, perf.conditions)
        budget = None if dep.limits.static_prefill_one_pass else dep.limits.max_num_batched_tokens
        prefill_wave = cost.prefill_s(max(prompt, 1), wave, budget)
        wave_s = prefill_wave + (load.output_tokens - 1) * decode_step_s
        # mean over waves k = 0..W-1 of (k x wave_s + prefill): later waves wait for the earlier ones
        ttft = (waves - 1) / 2 * wave_s + prefill_wave + cost.request_overhead_s
        tpot = decode_step_s
        e2e = waves * wave_s + cost.request_overhead_s
        out_tps = batch * load.output_tokens / e2e * replicas
        total_tps = batch * (load.output_tokens + prompt) / e2e * replicas
    else:
        # admission: above max_num_seqs or the KV capacity, the rest wait in the engine's queue; the
        # running r requests cycle in e2e_r, so each of the n waits (n / r - 1) x e2e_r (Little's law)
        ttft, tpot, step = closed_loop(cost, run, prompt, load.output_tokens, dep.limits.max_num_batched_tokens,
                                       dep.limits.chunked_prefill, cached)
        # a request that arrives between two of the scheduler's polls waits for the next: (I - 1) / 2 steps on average
        ttft += cost.request_overhead_s + poll_wait_s(dep.limits.scheduler_poll_steps, step)
        e2e = ttft + (load.output_tokens - 1) * tpot
        if run < batch:
            notes.append(f"concurrency {batch} > {run} the engine runs at once (max_num_seqs "
                         f"{dep.limits.max_num_seqs}, KV at the mean context): {batch - run} wait in its queue")
            ttft += (batch / run - 1.0) * e2e
            e2e *= batch / run
        out_tps = batch * load.output_tokens / e2e * replicas
        total_tps = batch * (load.output_tokens + prompt) / e2e * replicas
    usd_per_hour = usd_per_gpu_hour * tp * dep.pp * replicas  # a pipeline's every stage is a TP group
    return Estimate(
        fits=memb.fits, shortfall_bytes_per_gpu=memb.shortfall_bytes_per_gpu,
        weights_bytes_per_gpu=memb.weights_bytes_per_gpu, weights_bytes_total=mem.weight_bytes(dep.model, dep.weight_dtype),
        kv_cache_bytes_per_token=memb.kv_cache_bytes_per_token, kv_cache_capacity_bytes=memb.kv_cache_capacity_bytes,
        kv_capacity_tokens=memb.kv_capacity_tokens, max_concurrent_sequences=cap_seqs, batch=batch,
        decode_step_floor_s=max(floor["memory_s"], floor["compute_s"]), decode_step_s=decode_step_s,
        decode_memory_s=parts["memory_s"], decode_compute_s=parts["compute_s"], decode_allreduce_s=parts["allreduce_s"],
        decode_overhead_s=parts["overhead_s"], decode_compute_floor_s=floor["compute_s"], bound=bound_of(parts),
        prefill_flops=prefill_flops, prefill_compute_floor_s=prefill_floor, prefill_s=prefill_s,
        tpot_s=tpot, ttft_s=ttft, e2e_s=e2e, output_tokens_per_s=out_tps, total_tokens_per_s=total_tps,
        usd_per_hour=usd_per_hour, usd_per_million_output_tokens=_usd(usd_per_hour, out_tps),
        usd_per_million_tokens=_usd(usd_per_hour, total_tps), gpus_total=tp * dep.pp * replicas, memory=memb,
        notes=tuple(notes), wave_sequences=wave, wave_prefill_s=prefill_wave,
    )
