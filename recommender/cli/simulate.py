"""``recommend simulate``: replay seeded requests through the vLLM-like simulator, beside the analytic model.

Two ways to say what to simulate: the ``estimate`` flags (``--model --gpu --tp ...``) with a rate and
lengths (``--prompt-tokens/--output-tokens`` constants, or a ``--workload`` file's distributions), or
``--plan PLAN.json [--rank K]`` from ``recommend --format json``: the plan's own workload echo (arrival rate,
length distributions, shared prefix, as overridden when the plan was made) and, for P/D, the KV link the
row was sized with; ``--workload`` replaces the echo's lengths, rate and prefix, and plans written before
the echo carried the distributions' parameters read its ``source`` file. A row vLLM would not load (a pool's
layout splits the blocks of the block-quantized checkpoint it names) is refused in ``estimate --plan``'s line;
``--checkpoint`` replaces every pool's checkpoint, as ``deploy --checkpoint`` does. ``--trace CSV`` replays
recorded arrivals instead of Poisson ones (its first ``--requests`` rows); the analytic model beside them is Poisson
at those rows' mean rate with their lengths (the header names that rate).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from recommender.cli import options
from recommender.cli.app import app, one_line_errors
from recommender.errors import ConfigError, RecommenderError


def _length_source(workload: Optional[Path], source: str = "") -> Any:
    from recommender.workload import load_workload

    if workload is not None:
        return load_workload(workload)
    if source and Path(source).is_file():
        return load_workload(source)
    return None


def _plan_setup(plan: Path, rank: int, workload: Optional[Path], checkpoint: Optional[str] = None) -> dict[str, Any]:
    """Deployments and load of plan ``rank`` (pools rebuilt through the perf model), refused in one line where a pool
    would not load: its layout splits the blocks of the block-quantized checkpoint it names, or ``checkpoint``
    (``--checkpoint``) where given (``estimate --plan`` and ``deploy`` refuse the same row with the same line)."""
    from recommender.catalog import default_catalog
    from recommender.plan import load_plan
    from recommender.plan.rebuild import check_row_blocks, pool_models, row_kv_link
    from recommender.profiles import resolve_profile
    from recommender.search.policy import SearchPolicy

    doc = load_plan(plan)
    row = doc.row(rank)
    if row is None:
        raise ConfigError(f"--rank {rank}: {plan} has {len(doc.rows)} plan(s)")
    echo = doc.workload
    lengths = None if workload is not None else _echoed_lengths(echo)
    wl = None
    if lengths is None:
        wl = _length_source(workload, echo.source)
        if wl is None:
            raise ConfigError(f"{plan} only summarises the length distributions and its workload source "
                              f"{echo.source!r} is not readable here; pass --workload FILE.yaml")
    cat = default_catalog()
    model = cat.model(echo.model or (wl.model if wl is not None else ""))
    profile = resolve_profile(doc.engine, doc.profile if Path(doc.profile).is_file() else None)
    max_len = row.max_model_len or echo.max_model_len or (wl.max_model_len if wl is not None else 0)
    check_row_blocks(row, model=model, catalog=cat, checkpoint=checkpoint)
    models = pool_models(row, model=model, profile=profile, catalog=cat, max_model_len=max_len)
    # a data-parallel-attention replica is dp attention ranks, each its own scheduler (recommender.sizing)
    pools = [(m.pool.role.value, m.deployment, m.cost, m.ranks) for m in models]
    link = None
    if len(models) == 2:  # the KV link the row was sized with (older plans: its path's bandwidth, or the policy's)
        policy = SearchPolicy()
        link = row_kv_link(row, model, models[0].pool, models[1].pool,
                           default_bytes_per_s_per_gpu=policy.kv_transfer_bandwidth_bytes_per_s,
                           default_latency_s=policy.kv_transfer_latency_s)
    if lengths is not None:
        prompt, output = lengths
        rate = echo.arrival_rate_per_s
        if rate is None and echo.offline_requests and echo.deadline_s:
            rate = echo.offline_requests / echo.deadline_s
        frac = echo.shared_prefix_fraction
    else:
        assert wl is not None
        prompt, output, rate, frac = wl.prompt_tokens, wl.output_tokens, wl.effective_rate_per_s, wl.shared_prefix_fraction
    return {"pools": pools, "rate": rate, "prompt": prompt, "output": output, "shared_prefix_fraction": frac,
            "kv_transfer_s_per_token": 0.0, "kv_link": link, "plan_load_utilisation": row.load_utilisation,
            "plan_rate_per_s": rate,
            "percentiles": [s.percentile for s in doc.slos],
            # the row's load utilisation is at the plan's own rate, lengths and prefix: the run length uses it
            # only while none of them is overridden (simulate_cmd drops it otherwise)
            "sizing_utilisation": row.load_utilisation if workload is None else None,
            "label": f"{plan} rank {rank} ({row.id})"}


def _echoed_lengths(echo: Any) -> tuple[Any, Any] | None:
    """(prompt, output) length distributions rebuilt from the plan's workload echo, or None when the plan
    only summarises them (written before the echo carried the parameters) and they are not one length each."""
    from recommender.workload import LengthDist

    out = []
    for s in (echo.prompt_tokens, echo.output_tokens):
        if s is not None and s.min is not None and s.min == s.max:  # one length: the summary says it all
            out.append(LengthDist.constant(int(s.min)))
            continue
        if s is None or s.mean_param is None or s.min is None or s.max is None:
            return None
        out.append(LengthDist(s.dist, float(s.mean_param), float(s.std_param or 0.0), int(s.min), int(s.max),
                              samples=tuple(s.samples), weights=tuple(s.weights)))
    return out[0], out[1]


def _flag_setup(kw: dict[str, Any], workload: Optional[Path]) -> dict[str, Any]:
    """Deployment from the ``estimate`` flags; lengths from constants or a workload file."""
    from recommender.estimator import EstimateRequest, estimate_request, raise_if_not_fit
    from recommender.perf.step import StepCostModel
    from recommender.workload import LengthDist

    wl = _length_source(workload)
    if wl is None and (kw["prompt_tokens"] is None or kw["output_tokens"] is None):
        raise ConfigError("give --prompt-tokens and --output-tokens, or --workload FILE.yaml, or --plan PLAN.json")
    if kw["model"] is None or kw["gpu"] is None:
        if wl is None or kw["gpu"] is None:
            raise ConfigError("give --model and --gpu (or --plan PLAN.json)")
        kw["model"] = wl.model
    p_tok = kw["prompt_tokens"] if wl is None else int(wl.prompt_tokens.max_tokens)
    o_tok = kw["output_tokens"] if wl is None else int(wl.output_tokens.max_tokens)
    req = EstimateRequest(model=kw["model"], gpu=kw["gpu"], tp=kw["tp"], replicas=kw["replicas"],
                          weight_dtype=kw["weight_dtype"], kv_dtype=kw["kv_dtype"], prompt_tokens=p_tok, output_tokens=o_tok,
                          engine=kw["engine"], profile_file=kw["profile"], gpu_memory_utilization=kw["gpu_memory_utilization"],
                          cuda_graphs=kw["cuda_graphs"], max_num_seqs=kw["max_num_seqs"],
                          max_num_batched_tokens=kw["max_num_batched_tokens"], chunked_prefill=kw["chunked_prefill"],
                          pp=kw["pp"], checkpoint=kw.get("checkpoint"))
    dep, _, est = estimate_request(req)
    raise_if_not_fit(dep, est)
    rate = kw["rate"] if kw["rate"] is not None else (wl.effective_rate_per_s if wl is not None else None)
    prompt = wl.prompt_tokens if wl is not None else LengthDist.constant(p_tok)
    output = wl.output_tokens if wl is not None else LengthDist.constant(o_tok)
    frac = kw["shared_prefix_fraction"] if kw["shared_prefix_fraction"] is not None else (wl.shared_prefix_fraction if wl else 0.0)
    if frac > 0.0 and kw["prefix_caching"]:
        dep = _with_prefix_caching(dep)
    return {"pools": [("both", dep, StepCostModel.build(dep), kw["replicas"])], "rate": rate, "prompt": prompt,
            "output": output, "shared_prefix_fraction": frac, "kv_transfer_s_per_token": 0.0,
            "percentiles": [s.percentile for s in wl.slos] if wl is not None else [],
            "label": f"{dep.model.id} on {kw['replicas']} x {kw['tp']}{f' x PP{dep.pp}' if dep.pp > 1 else ''} {dep.gpu.id}"}


def _with_prefix_caching(dep: Any) -> Any:
    import dataclasses

    return dataclasses.replace(dep, limits=dataclasses.replace(dep.limits, enable_prefix_caching=True))


def _topology(setup: dict[str, Any]) -> Any:
    """The pools to run: a ``PoolSpec`` (aggregated) or a ``Disaggregated`` P/D topology."""
    from recommender.load import Disaggregated, PoolSpec

    pools = setup["pools"]
    if len(pools) == 1:
        _, dep, cost, reps = pools[0]
        return PoolSpec(cost=cost, limits=dep.limits, replicas=reps)
    (_, dp, cp, rp), (_, dd, cd, rd) = pools
    return Disaggregated(prefill=PoolSpec(cost=cp, limits=dp.limits, replicas=rp),
                         decode=PoolSpec(cost=cd, limits=dd.limits, replicas=rd),
                         kv_transfer_s_per_token=setup["kv_transfer_s_per_token"], kv_link=setup.get("kv_link"))


def _analyze(topology: Any, traffic: Any) -> Any:
    from recommender.load import PoolSpec, analyze, analyze_disaggregated

    return analyze(topology, traffic) if isinstance(topology, PoolSpec) else analyze_disaggregated(topology, traffic)


def _traffic(setup: dict[str, Any], rate: float) -> Any:
    from recommender.load import Traffic

    return Traffic(rate_per_s=rate, prompt=setup["prompt"], output=setup["output"],
                   shared_prefix_fraction=setup["shared_prefix_fraction"])


#: the rows a ``--trace`` replays when ``--requests`` is not given (its own arrivals: no run length to size)
TRACE_DEFAULT_ROWS = 2000


def run_length(setup: dict[str, Any], requests: int | None, warmup: int | None, trace: Optional[Path]) -> dict[str, Any]:
    """How many requests to simulate and how many to leave out as warm-up, and why (the run's ``run_length``).

    As given when the user gave ``--requests`` or ``--warmup`` (the other: ``--warmup`` 0, or the requests sized
    below); a ``--trace`` replays its first :data:`TRACE_DEFAULT_ROWS` rows. Otherwise the run is sized as
    ``recommend`` sizes a verified plan's run (``recommender.search.verify.verify_run_length``, the same rule,
    imported): enough requests that the asked percentile has ``TAIL_SAMPLES`` beyond it, stretched by the
    queue's correlation time at the fraction of capacity in use, the first ``WARMUP_FRACTION`` a warm-up, at
    most the search policy's ``verify_requests``. The fraction in use is the plan row's ``load_utilisation``
    (at the plan's own rate and lengths), else rate / the analytic model's saturation rate of these pools."""
    from recommender.search.policy import load_search_policy
    from recommender.search.verify import TAIL_SAMPLES, WARMUP_FRACTION, verify_run_length

    if requests is not None or trace is not None:
        n = requests if requests is not None else TRACE_DEFAULT_ROWS
        w = warmup or 0
        flags = [f for f, v in (("-n/--requests", requests), ("--warmup", warmup)) if v is not None]
        why = (f"as given ({', '.join(flags)})" if requests is not None
               else f"the first {n:,} rows of --trace (-n/--requests sets how many)" + (", --warmup as given" if flags else ""))
        return {"requests": n, "warmup_requests": w, "sized": False, "why": why + ("" if w else "; no warm-up")}
    pcts = list(setup.get("percentiles") or []) or ["p90"]
    rho = setup.get("sizing_utilisation")
    where = "the plan's load utilisation, rate / capacity"
    if rho is None:
        rho, where = _capacity_utilisation(setup), "rate / the analytic model's saturation rate"
    cap = load_search_policy(None).verify_requests
    n, w = verify_run_length(utilisation=rho, percentiles=pcts, max_requests=cap)
    asked, _ = verify_run_length(utilisation=rho, percentiles=pcts, max_requests=2**62)
    if warmup is not None:
        w = warmup
    rho_txt = f"{rho:.2f}" if math.isfinite(rho) else "unbounded"
    why = (f"sized as `recommend` sizes its verification runs: {TAIL_SAMPLES} requests beyond "
           f"{', '.join(dict.fromkeys(pcts))}, stretched by (1 + rho) / (1 - rho) at rho = {rho_txt} ({where}), plus "
           f"{WARMUP_FRACTION:.0%} warm-up" + (f" = {asked:,}, capped at {cap:,} (the search policy's verify_requests)"
                                               if asked > n else "")
           + ("; --warmup as given" if warmup is not None else "") + "; -n/--requests chooses another length")
    return {"requests": n, "warmup_requests": w, "sized": True, "utilisation": rho if math.isfinite(rho) else None,
            "why": why}


def _capacity_utilisation(setup: dict[str, Any]) -> float:
    """rate / the largest rate at which the analytic model of these pools is stable (as the search's
    ``load_utilisation``); inf when they cannot serve any rate."""
    from recommender.load.capacity import saturation_rate_per_s

    rate = setup["rate"]
    if rate is None:
        raise ConfigError("give --rate R (requests/s), a --workload with an arrival rate, or a --trace")
    topology = _topology(setup)
    sat = saturation_rate_per_s(lambda x: _analyze(topology, _traffic(setup, x)), rel_tol=5e-3, start_per_s=rate,
                                step=1.25)
    return rate / sat if sat > 0 else math.inf


def load_utilisation(setup: dict[str, Any], length: dict[str, Any], trace: Optional[Path]) -> float | None:
    """The simulated load's utilisation, rate / the analytic model's saturation rate of these pools (the run-length
    rule's figure): the plan row's while the run is at the plan's own rate, lengths and prefix, else the one the
    run length was sized with, else computed (:func:`_capacity_utilisation`); None for a replayed trace (its rate
    and lengths are the trace's) and for pools that cannot serve any rate."""
    if trace is not None:
        return None
    if setup.get("sizing_utilisation") is not None:
        return float(setup["sizing_utilisation"])
    rho = length["utilisation"] if length.get("sized") else _capacity_utilisation(setup)
    return rho if rho is not None and math.isfinite(rho) else None


def _run(setup: dict[str, Any], requests: int, seed: int, burstiness: float, trace: Optional[Path], warmup: int) -> tuple[Any, Any]:
    from recommender.load import PoolSpec, Replay, read_trace, simulate, simulate_disaggregated
    from recommender.workload import LengthDist

    rows = read_trace(trace) if trace is not None else None
    rate = setup["rate"]
    prompt, output = setup["prompt"], setup["output"]
    if rows is not None:
        # the simulator replays the first ``requests`` rows (all of them when there are fewer): the analytic model
        # beside it takes their rate and their lengths, not the workload's or the plan's
        rows = rows[:requests] if requests > 0 else rows
        if len(rows) > 1:
            span = rows[-1][0] - rows[0][0]
            rate = (len(rows) - 1) / span if span > 0 else rate
        if rows:
            prompt = LengthDist.empirical([max(1, r[1]) for r in rows])
            output = LengthDist.empirical([max(1, r[2]) for r in rows])
    if rate is None and rows is not None:  # a trace whose requests share one instant has no rate of its own
        raise ConfigError(f"--trace {trace}: its {len(rows)} request(s) arrive at one instant, a time span of 0 s, so it "
                          "gives no arrival rate; give --rate R (requests/s) to replay them at R, or a longer log")
    if rate is None:
        raise ConfigError("give --rate R (requests/s), a --workload with an arrival rate, or a --trace")
    setup["rate"] = rate  # what the run's header and JSON report: the rate the simulator was offered
    frac = setup["shared_prefix_fraction"]
    traffic = _traffic({**setup, "prompt": prompt, "output": output}, rate)
    load: Any = traffic if rows is None else Replay(rows=tuple(rows), shared_prefix_fraction=frac)
    topology = _topology(setup)
    run = simulate if isinstance(topology, PoolSpec) else simulate_disaggregated
    sim = run(topology, load, n_requests=requests, seed=seed, burstiness=burstiness, warmup_requests=warmup)
    return _analyze(topology, traffic), sim


def _doc(setup: dict[str, Any], ana: Any, sim: Any, length: dict[str, Any], seed: int) -> dict[str, Any]:
    def fin(v: float) -> float | None:
        return v if math.isfinite(v) else None

    lat = {m: {"analytic": {k: fin(v) for k, v in getattr(ana, f"{m}_s").to_dict().items()},
               "simulated": getattr(sim, f"{m}_s").to_dict()} for m in ("ttft", "tpot", "e2e")}
    return {
        "config": setup["label"], "rate_per_s": setup["rate"], "shared_prefix_fraction": setup["shared_prefix_fraction"],
        "requests": sim.completed, "warmup_requests": sim.warmup_requests, "seed": seed,
        "run_length": {**length, "requests": sim.completed, "warmup_requests": sim.warmup_requests},
        "plan_load_utilisation": setup.get("plan_load_utilisation"),
        # rate / capacity at the simulated rate, lengths and prefix (the plan's above is at its own): None with a trace
        "load_utilisation": setup.get("load_utilisation"),
        "plan_rate_per_s": setup.get("plan_rate_per_s"),
        "latency_s": lat,
        "analytic": {"stable": ana.stable, "utilisation": fin(ana.utilisation), "bottleneck": ana.bottleneck,
                     "mean_running_batch": fin(ana.mean_running_batch), "queue_wait_mean_s": fin(ana.queue_wait_mean_s),
                     "output_tokens_per_s": ana.output_tokens_per_s},
        "simulated": {"stable": sim.stable, "filling": sim.filling, "in_system_growth": sim.in_system_growth,
                      "waiting_growth": sim.waiting_growth, "busy_fraction": sim.busy_fraction, "mean_running_batch": sim.mean_running_batch,
                      "queue_wait_mean_s": sim.queue_wait_mean_s, "output_tokens_per_s": sim.output_tokens_per_s,
                      "requests_per_s": sim.requests_per_s, "preempted": sim.preempted, "steps": sim.steps,
                      "duration_s": sim.duration_s, "max_queue_len": max(sim.timeseries.queue_len, default=0),
                      "max_kv_usage": max(sim.timeseries.kv_usage, default=0.0)},
    }


#: the latency columns a narrow terminal hides first; p90 (the SLOs' default percentile) goes last
_SIM_DROP_ORDER = ["p95", "mean", "p50", "p99", "p90"]


def _text(doc: dict[str, Any], width: int | None = None) -> str:
    """The run's summary and its latency table, fitted to ``width`` by hiding percentiles (p95 first, p90 last)
    and naming them; an unstable analytic model's latencies read 'unbounded'."""
    from recommender.render.table import fit_table
    from recommender.units import fmt_seconds

    def s(v: float | None) -> str:
        return "unbounded" if v is None else fmt_seconds(v)

    rows = []
    for m, d in doc["latency_s"].items():
        for src in ("analytic", "simulated"):
            rows.append([m.upper(), src] + [s(d[src][k]) for k in ("mean", "p50", "p90", "p95", "p99")])
    a, sm = doc["analytic"], doc["simulated"]
    # one vocabulary: the plan's load utilisation is rate / capacity; the analytic model's figure is its busiest
    # resource; the simulator's is the share of time the engine runs a step
    util = "unstable" if not a["stable"] else f"busiest resource at {a['utilisation']:.2f} of its capacity ({a['bottleneck']})"
    plan_util, load_util = doc.get("plan_load_utilisation"), doc.get("load_utilisation")
    plan_rate = doc.get("plan_rate_per_s")
    own = f"at its own {plan_rate:.3g} req/s" if plan_rate else "at its own rate"
    if plan_util is not None and load_util == plan_util:   # the run is at the plan's own load
        util += f"; the plan's load utilisation (rate / capacity) {plan_util:.2f}"
    elif plan_util is not None and load_util is not None:
        util += (f"; load utilisation (rate / capacity) {load_util:.2f} at {doc['rate_per_s']:.3g} req/s "
                 f"(the plan's {plan_util:.2f} is {own})")
    elif plan_util is not None:   # a replayed trace, or pools that cannot serve the rate: not computed
        util += f"; the plan's load utilisation (rate / capacity) {plan_util:.2f} is {own}, not this run's"
    warm = doc.get("warmup_requests") or 0
    run = doc.get("run_length") or {}
    head = (f"{doc['config']}: {doc['requests']:,} requests at {doc['rate_per_s']:.3g} req/s, seed {doc['seed']}"
            + (f", the first {warm:,} left out as warm-up" if warm else "") + "\n"
            + (f"run length: {run['why']}\n" if run.get("why") else "")
            + f"analytic: {util}, mean running {'unbounded' if a['mean_running_batch'] is None else round(a['mean_running_batch'], 1)}\n"
            f"simulated: mean running {sm['mean_running_batch']:.1f}, engine stepping {sm['busy_fraction']:.0%} of the time, "
            f"{sm['output_tokens_per_s']:,.0f} output tok/s, {sm['preempted']} preemptions, "
            f"peak queue {sm['max_queue_len']}, peak KV {sm['max_kv_usage']:.0%}"
            + _verdict(sm))
    table, dropped = fit_table(["", "", "mean", "p50", "p90", "p95", "p99"], rows, width=width, drop_order=_SIM_DROP_ORDER)
    hidden = f"\n{', '.join(dropped)} hidden to fit {width} columns; --wide shows all." if dropped else ""
    return head + "\n\n" + table + hidden


def _verdict(sm: dict[str, Any]) -> str:
    """'' for a stable run; otherwise whether its waiting queues grew (overloaded) or the requests that piled up
    sit in still-filling batches (``SimResult.filling``: too short to tell)."""
    if sm["stable"]:
        return ""
    if sm.get("filling"):
        return ("  [not steady yet: the batches were still filling when arrivals stopped, the waiting queue was not "
                "growing; too short to judge stability: give more -n/--requests]")
    return "  [queue still growing: overloaded]"


@app.command("simulate")
@one_line_errors
def simulate_cmd(
    plan: Optional[Path] = typer.Option(None, "--plan", help="Plan JSON from `recommend --format json` (instead of the flags)."),
    rank: int = typer.Option(1, "--rank", "-r", help="Which plan of the ranking (with --plan)."),
    workload: Optional[Path] = typer.Option(None, "--workload", "-w", help="Workload YAML: length distributions, rate, shared prefix."),
    model: options.Model = None,
    gpu: options.Gpu = None,
    tp: options.Tp = 1,
    pipeline_parallel_size: int = typer.Option(1, "--pipeline-parallel-size", "-pp", help="Pipeline stages of --tp GPUs, one instance each (as `estimate -pp`)."),
    replicas: options.Replicas = 1,
    weight_dtype: options.WeightDtype = None,
    kv_dtype: options.KvDtype = "bf16",
    checkpoint: options.FlagCheckpoint = None,
    prompt_tokens: options.PromptTokens = None,
    output_tokens: options.OutputTokens = None,
    engine: options.Engine = "vllm",
    profile: options.Profile = None,
    gpu_memory_utilization: options.GpuMemoryUtilization = 0.92,
    cuda_graphs: options.CudaGraphs = True,
    max_num_seqs: options.MaxNumSeqs = None,
    max_num_batched_tokens: options.MaxNumBatchedTokens = None,
    chunked_prefill: options.ChunkedPrefill = True,
    prefix_caching: bool = typer.Option(True, "--prefix-caching/--no-prefix-caching", help="Prefix caching when the workload shares a prefix."),
    shared_prefix_fraction: Optional[float] = typer.Option(None, "--shared-prefix-fraction", help="Fraction of each prompt served from the prefix cache."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Open-loop arrivals in requests/s (default: the workload's)."),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", help="Requests to simulate (default: sized as `recommend` sizes its verification runs, recommender.search.verify: 100 requests beyond the SLO percentile (p90 without one) x (1 + rho) / (1 - rho) at the load utilisation rho (rate / capacity: the plan row's, else the analytic model's), plus 20% warm-up, between 1,000 and the search policy's verify_requests (20,000); the output's 'run length' line says which and why. With --trace: its first 2,000 rows).", show_default=False),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same run)."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape of inter-arrival gaps: 1 = Poisson, < 1 burstier."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="CSV of recorded requests (arrival, prompt, output) to replay."),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Leave the first N requests out of the percentiles (default: 20% of a sized run; 0 with -n/--requests or --trace).", show_default=False),
    timeseries: Optional[Path] = typer.Option(None, "--timeseries", help="Write queue / running / KV usage over time to this CSV."),
    fmt_name: Annotated[str, options.format_option(options.TextOrJson)] = "text",
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar on stderr."),
    wide: options.Wide = False,
) -> None:
    """Simulate requests through a vLLM-like scheduler and print simulated percentiles beside the analytic model's."""
    if quiet:
        from recommender import progress

        progress.configure(quiet=True)
    from recommender.bounded import check_request_count

    fmt = options.choice(options.TextOrJson, fmt_name, "--format")
    if requests is not None:
        check_request_count(requests, "--requests")
    if warmup is not None and warmup < 0:
        raise ConfigError(f"--warmup {warmup}: give 0 or more requests to leave out")
    if requests is not None and warmup is not None and warmup >= requests and trace is None:
        raise ConfigError(f"--requests {requests} / --warmup {warmup}: need at least one request after the warm-up")
    if timeseries is not None:  # before the run: a FIFO, device or symlink there is refused, never replaced
        from recommender.bounded import check_replaceable

        check_replaceable(timeseries, "--timeseries")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"--rate {rate}: requests per second must be > 0")
    if shared_prefix_fraction is not None and not 0.0 <= shared_prefix_fraction < 1.0:
        raise ConfigError(f"--shared-prefix-fraction {shared_prefix_fraction}: must be in [0, 1)")
    if checkpoint is not None:  # estimate's reading (none -> "": the model's own repo); with --plan, every pool's
        from recommender.estimator import check_checkpoint, checkpoint_of_flag

        checkpoint = checkpoint_of_flag(checkpoint)
        check_checkpoint(checkpoint)
    if timeseries is not None:
        from recommender.cli.checks import check_writable_file

        check_writable_file(str(timeseries), "--timeseries")  # before the run, not after it
    if plan is not None:
        setup = _plan_setup(plan, rank, workload, checkpoint)
        if rate is not None and rate != setup["rate"]:
            setup["rate"], setup["sizing_utilisation"] = rate, None  # the row's utilisation is at its own rate
        if shared_prefix_fraction is not None:
            setup["shared_prefix_fraction"], setup["sizing_utilisation"] = shared_prefix_fraction, None
    else:
        setup = _flag_setup(dict(model=model, gpu=gpu, tp=tp, pp=pipeline_parallel_size, replicas=replicas, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                 prompt_tokens=prompt_tokens, output_tokens=output_tokens, engine=engine, profile=profile,
                                 gpu_memory_utilization=gpu_memory_utilization, cuda_graphs=cuda_graphs,
                                 max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                 chunked_prefill=chunked_prefill, prefix_caching=prefix_caching,
                                 shared_prefix_fraction=shared_prefix_fraction, rate=rate, checkpoint=checkpoint), workload)
    try:
        length = run_length(setup, requests, warmup, trace)
        if length["warmup_requests"] >= length["requests"] and trace is None:
            raise ConfigError(f"--warmup {length['warmup_requests']}: the run is {length['requests']:,} requests "
                              f"({length['why']}); give fewer warm-up requests or more -n/--requests")
        ana, sim = _run(setup, length["requests"], seed, burstiness, trace, length["warmup_requests"])
        if plan is not None:
            setup["load_utilisation"] = load_utilisation(setup, length, trace)
    except RecommenderError:
        raise
    except (KeyError, TypeError, ValueError) as e:  # malformed plan rows
        raise ConfigError(f"cannot simulate this configuration: {e}") from None
    doc = _doc(setup, ana, sim, length, seed)
    if timeseries is not None:
        from recommender.atomic import atomic_write_text

        ts = sim.timeseries
        buf = io.StringIO(newline="")
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["t_s", "waiting", "running", "kv_usage"])
        w.writerows(zip(ts.t_s, ts.queue_len, ts.running, (round(k, 4) for k in ts.kv_usage)))
        atomic_write_text(Path(timeseries), buf.getvalue())
        doc["timeseries_csv"] = str(timeseries)
    if fmt == "json":
        typer.echo(json.dumps(doc, indent=2))
    else:
        options.echo_fitted(_text(doc, None if wide else options.fitted_width()), wide)
