"""``recommend calibrate RESULTS... --out FILE``: fit an engine profile to the user's own benchmark results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from recommender import progress
from recommender.cli import options
from recommender.cli.app import app, one_line_errors
from recommender.errors import ConfigError


@app.command("calibrate")
@one_line_errors
def calibrate_cmd(
    results: List[str] = typer.Argument(..., help="`vllm bench serve --save-result` JSON files and/or CSVs in the published-measurements format."),
    out: str = typer.Option(..., "--out", "-o", help="Profile YAML to write (e.g. profiles/my-cluster.yaml); use it with --profile."),
    engine: str = typer.Option("vllm", "--engine", help="Engine the results come from; its shipped profile is the starting point."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Start from this profile YAML instead of the engine's shipped one."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Catalog model id, for JSON files whose metadata and sidecar do not say."),
    gpu: Optional[str] = typer.Option(None, "--gpu", "-g", help="GPU (catalog id or name, e.g. h100-sxm, 'H100'), when the files do not say."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor parallelism of the runs, when the files do not say."),
    data_parallel_size: Optional[int] = typer.Option(None, "--data-parallel-size", "-dp", help="vLLM's --data-parallel-size of the runs, when the files do not say (default 1)."),
    enable_expert_parallel: Optional[bool] = typer.Option(None, "--enable-expert-parallel/--no-expert-parallel", "-ep", help="Whether the runs had --enable-expert-parallel, when the files do not say (default off)."),
    weight_dtype: Optional[str] = typer.Option(None, "--weight-dtype", help="Weight dtype when not in the files (default: the checkpoint's)."),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help="KV-cache dtype when not in the files (default: auto = 16-bit)."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Server's --max-num-seqs, when not in the files (default: vLLM's for the GPU)."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", help="Server's --max-num-batched-tokens, when not in the files."),
    parameters: Optional[str] = typer.Option(None, "--parameters", help="Comma list of profile parameters to fit (default: the efficiency and overhead parameters; for rows of one MoE model, its routed-expert terms and the request overhead)."),
    held_out_by: str = typer.Option("source", "--held-out-by", help="Leave-one-group-out key: source (file or table), model, gpu, config."),
    fmt: str = typer.Option("text", "--format", "-f", help="text|json"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar on stderr."),
    wide: options.Wide = False,
) -> None:
    """Fit efficiency parameters to benchmark results; report error before/after and held-out; write a profile."""
    from recommender.calibrate.api import CalibrateRequest, calibrate
    from recommender.calibrate.report import render_text, result_json

    if quiet:
        progress.configure(quiet=True)

    if fmt not in ("text", "json"):
        raise typer.BadParameter("--format must be text or json")
    from recommender.bounded import check_replaceable
    from recommender.cli.checks import check_writable_dir

    check_replaceable(out, "--out")  # before the fit: a FIFO, device, folder or symlink is refused, never replaced
    if Path(out).is_dir():
        raise ConfigError(f"--out {out}: is a directory; give a profile file name (e.g. profiles/my-cluster.yaml)")
    try:
        check_writable_dir(str(Path(out).parent), "--out")  # before the fit, not after it
    except ConfigError as e:  # name the user's file, not only its folder
        raise ConfigError(f"--out {out}: {str(e).split(': ', 1)[-1]}") from None
    defaults = {k: v for k, v in {"model": model, "gpu": gpu, "tp": tp, "dp": data_parallel_size,
                                  "ep": enable_expert_parallel, "weight_dtype": weight_dtype,
                                  "kv_dtype": kv_dtype, "max_num_seqs": max_num_seqs,
                                  "max_num_batched_tokens": max_num_batched_tokens}.items() if v is not None}
    req = CalibrateRequest(results=tuple(results), out=out, engine=engine, profile_file=profile,
                           defaults=defaults, held_out_by=held_out_by,
                           parameters=tuple(p.strip() for p in parameters.split(",") if p.strip()) if parameters else None)
    run = calibrate(req)
    if fmt == "json":
        typer.echo(json.dumps(result_json(run.result, str(Path(out)), run.files, run.skipped, run.extra), indent=2))
    else:
        options.echo_fitted(render_text(run.result, str(Path(out)), run.files, run.skipped, conditions=run.conditions,
                                        planner_error=run.planner_error, families=run.families,
                                        classes=run.classes), wide)
