"""``recommend estimate``: one configuration, explained line by line."""

from __future__ import annotations

from typing import Optional

import typer

from recommender.cli.app import app, one_line_errors
from recommender.estimate import EstimateRequest, conditions_of, does_not_fit_message, estimate_request, price_for
from recommender.errors import ConfigError
from recommender.render.estimate import estimate_json, render_walkthrough


@app.command("estimate")
@one_line_errors
def estimate_cmd(
    model: str = typer.Option(..., "--model", "-m", help="Catalog model id, or a path to a Hugging Face config.json."),
    gpu: str = typer.Option(..., "--gpu", "-g", help="Catalog GPU id (e.g. h100-sxm)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel GPUs per replica."),
    replicas: int = typer.Option(1, "--replicas", help="Identical replicas (data parallel)."),
    weight_dtype: Optional[str] = typer.Option(None, "--weight-dtype", help="bf16|fp16|fp8|int8|int4|fp4|mxfp4 (default: the checkpoint's)."),
    kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="KV-cache dtype: bf16|fp8."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Static batch: B sequences prefilled and decoded together."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Requests in flight under continuous batching, or 'max'."),
    context: Optional[int] = typer.Option(None, "--context", help="Sequences already hold T tokens: one decode step at that point."),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="Prompt tokens per request."),
    output_tokens: Optional[int] = typer.Option(None, "--output-tokens", help="Output tokens per request."),
    engine: str = typer.Option("vllm", "--engine", help="Efficiency profile: vllm|trtllm|sglang|lmdeploy|gpt-fast."),
    profile: Optional[str] = typer.Option(None, "--profile", help="A calibrated profile YAML (overrides --engine)."),
    price: Optional[float] = typer.Option(None, "--price", help="USD per GPU-hour (default: the catalog's)."),
    gpu_memory_utilization: float = typer.Option(0.92, "--gpu-memory-utilization", help="vLLM's memory fraction (0.33 default 0.92)."),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs", help="CUDA graphs (off = eager launches)."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Engine batch limit (default: vLLM's for this GPU)."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", help="Engine token budget per step."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Open-loop Poisson arrivals (requests/s): adds tail latencies under load."),
    fmt: str = typer.Option("text", "--format", "-f", help="text|json"),
) -> None:
    """Explain one configuration: memory -> decode floor -> batched decode -> prefill -> capacity -> throughput -> cost."""
    req = EstimateRequest(model=model, gpu=gpu, tp=tp, replicas=replicas, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                          batch=batch, concurrency=concurrency, context_tokens=context, prompt_tokens=prompt_tokens,
                          output_tokens=output_tokens, engine=engine, profile_file=profile, usd_per_gpu_hour=price,
                          gpu_memory_utilization=gpu_memory_utilization, cuda_graphs=cuda_graphs,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    if fmt not in ("text", "json"):
        raise ConfigError(f"--format {fmt!r}: must be text or json")
    dep, load, est = estimate_request(req)
    extra = {}
    if rate is not None:
        from recommender.estimate import under_load

        extra = under_load(dep, load, est, rate, replicas)
    cond = conditions_of(dep).lines()
    if fmt == "json":
        typer.echo(estimate_json(dep, load, est, extra, cond))
    else:
        typer.echo(render_walkthrough(dep, load, est, replicas, price_for(dep.gpu, price), cond))
        if extra:
            from recommender.units import fmt_seconds

            typer.echo(f"\nUnder load: open-loop Poisson arrivals at {rate:g} req/s over {replicas} replica(s)")
            for k, v in extra.items():
                if k == "rate_per_s":
                    continue
                shown = fmt_seconds(v) if k.endswith("_s") and k != "output_tokens_per_s" and isinstance(v, float) else (
                    f"{v:,.2f}" if isinstance(v, float) else str(v))
                typer.echo(f"  {k:<18} {shown}")
    if not est.fits:
        typer.echo(f"error: {does_not_fit_message(dep, est)}", err=True)
        raise typer.Exit(3)
