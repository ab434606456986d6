"""``recommend estimate``: one configuration, explained line by line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from recommender.cli import options
from recommender.cli.app import app, one_line_errors
from recommender.estimator import (EstimateRequest, checkpoint_of_flag, does_not_fit_message, estimate_conditions, serve_weights,
                                   estimate_request, pricing_for)
from recommender.errors import ConfigError
from recommender.render.estimate import estimate_json, render_bands, render_walkthrough


@app.command("estimate")
@one_line_errors
def estimate_cmd(
    model: options.Model = None,
    gpu: options.Gpu = None,
    plan: Optional[Path] = typer.Option(None, "--plan", help="Explain a plan's row instead of flags: its engine as deployed, at the workload's mean lengths and rate (`recommend --format json`)."),
    rank: int = typer.Option(1, "--rank", "-r", help="Which row of --plan."),
    tp: options.Tp = 1,
    replicas: options.Replicas = 1,
    weight_dtype: options.WeightDtype = None,
    kv_dtype: options.KvDtype = "bf16",
    checkpoint: options.Checkpoint = None,
    batch: Optional[int] = typer.Option(None, "--batch", help="Static batch: B sequences prefilled and decoded together."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Requests in flight under continuous batching, or 'max'."),
    context: Optional[int] = typer.Option(None, "--context", parser=options.tokens("--context"), help="Sequences already hold T tokens: one decode step at that point."),
    prompt_tokens: options.PromptTokens = None,
    output_tokens: options.OutputTokens = None,
    engine: options.Engine = "vllm",
    profile: options.Profile = None,
    price: Optional[float] = typer.Option(None, "--price", help="USD per GPU-hour, billed per GPU (default: whole instances of the catalog's cheapest offer)."),
    gpu_memory_utilization: options.GpuMemoryUtilization = 0.92,
    cuda_graphs: options.CudaGraphs = True,
    max_num_seqs: options.MaxNumSeqs = None,
    max_num_batched_tokens: options.MaxNumBatchedTokens = None,
    rate: Optional[float] = typer.Option(None, "--rate", help="Open-loop Poisson arrivals (requests/s): adds tail latencies under load."),
    bench: bool = typer.Option(False, "--bench", help="Predict what `vllm bench serve` reports (takes its flags below)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", help="[--bench] prompts in the run (vllm bench serve's default 1000)."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", help="[--bench] requests/s; default inf (all at once)."),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", help="[--bench] client cap on requests in flight."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="[--bench] gamma shape of the gaps: 1 = Poisson, < 1 burstier."),
    random_input_len: Optional[int] = typer.Option(None, "--random-input-len", parser=options.tokens("--random-input-len"), help="[--bench] prompt tokens (default 1024, or --prompt-tokens)."),
    random_output_len: Optional[int] = typer.Option(None, "--random-output-len", parser=options.tokens("--random-output-len"), help="[--bench] output tokens (default 128, or --output-tokens)."),
    seed: int = typer.Option(0, "--seed", help="[--bench] random seed of the simulated arrivals."),
    chunked_prefill: options.ChunkedPrefill = True,
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", parser=options.tokens("--max-model-len"), help="vLLM's --max-model-len (default: the longest request of the load)."),
    pipeline_parallel_size: int = typer.Option(1, "--pipeline-parallel-size", "-pp", help="Pipeline stages of --tp GPUs, one instance each, over the catalog offers' NIC (a model no instance holds: DeepSeek-R1 on H100 is --tp 8 -pp 2)."),
    data_parallel_size: int = typer.Option(1, "--data-parallel-size", "-dp", help="vLLM's attention data-parallel ranks per engine (each TP --tp; MoE layers span tp x dp GPUs)."),
    enable_expert_parallel: bool = typer.Option(False, "--enable-expert-parallel", "-ep", help="Experts split whole over the engine's tp x dp GPUs (vLLM's flag; MoE models)."),
    speculative_config: Optional[str] = typer.Option(None, "--speculative-config", "-sc", help='vLLM\'s JSON, e.g. \'{"method": "mtp", "num_speculative_tokens": 1}\' (k defaults to the model\'s MTP layers).'),
    acceptance_rate: Optional[float] = typer.Option(None, "--acceptance-rate", help="Per-position draft acceptance in (0, 1] (default: the model catalog's fitted value, the engine's own where measured)."),
    scheduler_poll_steps: int = typer.Option(1, "--scheduler-poll-steps", help="The engine takes new requests every N steps (SGLang's --scheduler-recv-interval, --num-continuous-decode-steps on AMD; vLLM: 1, every step): a prompt waits (N - 1) / 2 steps on average. Closed loops only."),
    shared_prefix_fraction: Optional[float] = typer.Option(None, "--shared-prefix-fraction", help="Share of each prompt the prefix cache serves, in [0, 1) (prefix caching on; with --plan: the plan workload's)."),
    fmt_name: Annotated[str, options.format_option(options.TextOrJson)] = "text",
    wide: options.Wide = False,
) -> None:
    """Explain one configuration: memory -> decode floor -> batched decode -> prefill -> capacity -> throughput -> cost."""
    fmt = options.choice(options.TextOrJson, fmt_name, "--format")
    said = ""
    ckpt = None if checkpoint is None else checkpoint_of_flag(checkpoint)
    if scheduler_poll_steps != 1 and (plan is not None or rate is not None or (bench and request_rate is not None)):
        # the poll wait is a closed loop's term (perf.steady); the open-loop model and a plan's engine have none
        raise ConfigError(f"--scheduler-poll-steps {scheduler_poll_steps}: applies to closed loops (--concurrency, or "
                          "--bench without --request-rate); the open-loop model and --plan have no poll interval; drop it")
    if plan is not None:
        if model is not None or gpu is not None:
            raise ConfigError("--plan takes the model and the GPUs from the plan; drop --model / --gpu")
        req, plan_rate, said = _plan_request(plan, rank, batch=batch, concurrency=concurrency, context=context,
                                             prompt_tokens=prompt_tokens, output_tokens=output_tokens, checkpoint=ckpt)
        rate = plan_rate if rate is None and context is None else rate  # one decode step has no arrival rate
    else:
        if model is None or gpu is None:
            raise ConfigError("give --model and --gpu (or --plan PLAN.json to explain a plan's row)")
        req = EstimateRequest(model=model, gpu=gpu, tp=tp, replicas=replicas, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                              batch=batch, concurrency=concurrency, context_tokens=context, prompt_tokens=prompt_tokens,
                              output_tokens=output_tokens, engine=engine, profile_file=profile, usd_per_gpu_hour=price,
                              gpu_memory_utilization=gpu_memory_utilization, cuda_graphs=cuda_graphs,
                              max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              dp=data_parallel_size, ep=enable_expert_parallel, speculative_config=speculative_config,
                              acceptance_rate=acceptance_rate, pp=pipeline_parallel_size, chunked_prefill=chunked_prefill,
                              max_model_len=max_model_len, checkpoint=ckpt, scheduler_poll_steps=scheduler_poll_steps)
    if shared_prefix_fraction is not None:
        req = EstimateRequest(**{**req.__dict__, "shared_prefix_fraction": shared_prefix_fraction})
    replicas = req.replicas
    if bench:
        _bench(req, num_prompts, request_rate, max_concurrency, burstiness, random_input_len, random_output_len, seed, fmt, wide)
        return
    dep, load, est = estimate_request(req)
    extra = {}
    if rate is not None:
        from recommender.estimator import under_load

        extra = under_load(dep, load, est, rate, replicas, shared_prefix_fraction=req.shared_prefix_fraction)
    cond = estimate_conditions(req, dep)
    pricing = pricing_for(dep.gpu, tp=req.tp * req.dp, replicas=replicas, usd_per_gpu_hour=req.usd_per_gpu_hour,
                          pp=req.pp)
    bands = None
    if est.fits:
        from recommender.search.estimate_bands import open_loop_bands, steady_bands

        bands = (open_loop_bands(dep, load, est, rate, replicas, shared_prefix_fraction=req.shared_prefix_fraction)
                 if rate is not None else steady_bands(dep, est))
    if fmt == "json":
        typer.echo(estimate_json(dep, load, est, extra, cond, pricing, bands, serve=serve_weights(req, dep)))
    else:
        text = ([said, ""] if said else []) + [render_walkthrough(dep, load, est, replicas, pricing, cond,
                                                                   serve=serve_weights(req, dep))]
        if extra:
            from recommender.units import fmt_seconds

            text.append(f"\nUnder load: open-loop Poisson arrivals at {rate:g} req/s over {replicas} replica(s)")
            for k, v in extra.items():
                if k == "rate_per_s" or (k.startswith("usd_") and not pricing.priced):   # no price, no cost figure
                    continue
                shown = fmt_seconds(v) if k.endswith("_s") and k != "output_tokens_per_s" and isinstance(v, float) else (
                    f"${v:,.4f}" if k.startswith("usd_per_million") else f"{v:,.2f}" if isinstance(v, float) else str(v))
                text.append(f"  {k:<18} {shown}")
        if bands is not None:
            text.append("\n" + render_bands(bands, extra or est.to_dict()))
        options.echo_fitted("\n".join(text), wide)
    if not est.fits:
        typer.echo(f"error: {does_not_fit_message(dep, est)}", err=True)
        raise typer.Exit(3)


def _plan_request(path: Path, rank: int, *, batch: Optional[int], concurrency: Optional[str], context: Optional[int],
                  prompt_tokens: Optional[int], output_tokens: Optional[int],
                  checkpoint: Optional[str] = None) -> tuple[EstimateRequest, Optional[float], str]:
    """Row ``rank`` of the plan file as a request (``render.pool_estimate``: its engine as deployed, at the price it
    pays per GPU-hour), at the workload's mean lengths and, unless the load flags say otherwise, the KV-capacity load
    (``--concurrency max``), loading the pool's checkpoint unless ``checkpoint`` (``--checkpoint``) names another;
    the workload's rate; and the line that says so, with the equivalent flags."""
    from recommender.plan import load_plan
    from recommender.render.pool_estimate import estimate_command, pool_request

    doc = load_plan(path)
    row = doc.row(rank)
    if row is None:
        raise ConfigError(f"--rank {rank}: {path} has {len(doc.rows)} plan(s)")
    if row.disaggregated:
        raise ConfigError(f"--rank {rank} of {path} is a prefill/decode plan: each pool is explained in the plan's "
                          f"report (`recommend --workload FILE --report out.html`); `recommend simulate --plan` runs it")
    (pool,) = row.pools
    w = doc.workload
    prompt = prompt_tokens or max(1, round(w.prompt_tokens.mean if w.prompt_tokens else 1))
    output = output_tokens or max(1, round(w.output_tokens.mean if w.output_tokens else 1))
    price = pool.usd_per_hour / pool.gpus if pool.usd_per_hour else None
    req = pool_request(doc, row, pool, prompt_tokens=prompt, output_tokens=output, batch=batch,
                       concurrency=concurrency if concurrency is not None or batch is not None else "max",
                       usd_per_gpu_hour=price)
    if context is not None:
        req = EstimateRequest(**{**req.__dict__, "context_tokens": context, "prompt_tokens": None, "output_tokens": None,
                                 "concurrency": None})
    if checkpoint is not None:
        req = EstimateRequest(**{**req.__dict__, "checkpoint": checkpoint})
    if doc.profile and Path(doc.profile).is_file():
        req = EstimateRequest(**{**req.__dict__, "profile_file": doc.profile})
    rate = w.arrival_rate_per_s if context is None else None
    said = f"{path} rank {rank} ({row.id}), as: {estimate_command(req)}" + (f" --rate {rate:g}" if rate else "")
    return req, rate, said


def _bench(req: EstimateRequest, num_prompts: Optional[int], request_rate: Optional[float], max_concurrency: Optional[int],
           burstiness: float, input_len: Optional[int], output_len: Optional[int], seed: int, fmt: str,
           wide: bool = False) -> None:
    """``--bench``: the run ``vllm bench serve`` would make, predicted; its result keys printed."""
    import dataclasses
    import json
    import math

    from recommender.bounded import check_request_count
    from recommender.estimator import bench_run, raise_if_not_fit
    from recommender.search.estimate_bands import finite_bands
    from recommender.workload import MAX_TOKENS
    from recommender.perf.steady import Load

    if req.batch is not None or req.concurrency is not None or req.context_tokens is not None:
        raise ConfigError("--bench takes vllm bench serve's flags (--num-prompts, --max-concurrency, --request-rate), "
                          "not --batch, --concurrency or --context")
    n = 1000 if num_prompts is None else num_prompts
    p_tok = input_len or req.prompt_tokens or 1024
    o_tok = output_len or req.output_tokens or 128
    rate = math.inf if request_rate is None else request_rate
    for name, v in (("--num-prompts", n), ("--random-input-len", p_tok), ("--random-output-len", o_tok),
                    ("--max-concurrency", max_concurrency if max_concurrency is not None else 1)):
        if v < 1:
            raise ConfigError(f"{name} {v}: must be at least 1")
    if not rate > 0:
        raise ConfigError(f"--request-rate {request_rate:g}: must be above 0 requests/s (omit it for vLLM's inf)")
    if not burstiness > 0:
        raise ConfigError(f"--burstiness {burstiness:g}: must be above 0 (1 is Poisson arrivals)")
    check_request_count(n, "--num-prompts")
    for name, v in (("--random-input-len", p_tok), ("--random-output-len", o_tok)):
        if v > MAX_TOKENS:
            raise ConfigError(f"{name} {v}: at most {MAX_TOKENS:,} tokens")
    base = dataclasses.replace(req, prompt_tokens=p_tok, output_tokens=o_tok)
    dep, _, est = estimate_request(base)
    raise_if_not_fit(dep, est)
    load = Load.finite(requests=n, prompt_tokens=p_tok, output_tokens=o_tok, rate_per_s=rate,
                       concurrency=max_concurrency or 0, burstiness=burstiness)
    res = bench_run(dep, load, replicas=req.replicas, seed=seed)
    cond = estimate_conditions(base, dep)
    bands = finite_bands(dep, load, replicas=req.replicas, seed=seed)
    if fmt == "json":
        typer.echo(json.dumps({**res, "load": load.describe(), "conditions": cond, "bands": bands.to_dict()}, indent=2))
        return
    layout = (f", tp {dep.tp}" + (f" x dp {dep.dp}" if dep.dp > 1 else "") + (f" x pp {dep.pp}" if dep.pp > 1 else "")
              + (", expert parallel" if dep.ep else "")) if dep.gpus > dep.tp or dep.ep else ""
    text = [f"Predicted `vllm bench serve` on {dep.model.id}, {req.replicas} x {dep.gpus} {dep.gpu.id} "
            f"({dep.weight_dtype} weights, {dep.kv_dtype} KV{layout}): {load.describe()}"]
    text += [f"  {c}" for c in cond]
    text.append(f"  method: {res['method']}" + (" (discrete-event simulation of every request)" if res["method"] == "simulated"
                                               else " (finite-run transient: means only)"))
    if dep.profile.first_wave_overhead_s:
        text.append(f"  cold start: the run's first requests wait {dep.profile.first_wave_overhead_s:.2f} s before the "
                    "engine serves them (profile first_wave_overhead_s: a cold server)")
    text.append("")
    for key, val in res.items():
        if key in ("method", "num_prompts", "request_rate", "burstiness", "max_concurrency"):
            continue
        text.append(f"{key:<26} {val:,.2f}" if isinstance(val, float) else f"{key:<26} {val}")
    text.append("\n" + render_bands(bands, res))
    options.echo_fitted("\n".join(text), wide)
