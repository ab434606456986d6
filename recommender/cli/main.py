"""The main job: ``recommend --workload FILE [--slo ...]`` -> ranked Pareto plan (the app's callback)."""

from __future__ import annotations

from typing import List, Optional

import typer

from recommender.cli.app import app, fail, one_line_errors


@app.callback(invoke_without_command=True)
@one_line_errors
def main_job(
    ctx: typer.Context,
    workload: Optional[str] = typer.Option(None, "--workload", "-w", help="Workload YAML (see examples/)."),
    slo: List[str] = typer.Option([], "--slo", help="SLO, repeatable: tpot=30ms, ttft=2s@p99, e2e=20s@p90. Units ms or s; percentile p50|p90|p95|p99|mean, default p90. Overrides the file's SLO for the same metric."),
    top: int = typer.Option(5, "--top", help="Plans to show."),
    fmt: str = typer.Option("table", "--format", "-f", help="table|json|yaml|csv"),
    plot: Optional[str] = typer.Option(None, "--plot", help="Write the Pareto front to FILE (.html, .svg, or .png with matplotlib)."),
    seed: int = typer.Option(0, "--seed", help="Sampler seed (same seed, same plan)."),
    trials: Optional[int] = typer.Option(None, "--trials", help="Optuna trials (default: policies/search.yaml)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Search time limit in seconds."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL to keep the study (sqlite:///study.db, postgresql://..., or a .log journal file)."),
    study_name: Optional[str] = typer.Option(None, "--study-name", help="Study name in --storage (default: recommend-<workload name>)."),
    workers: int = typer.Option(1, "--workers", help="Processes sharing --storage (point them at one PostgreSQL to scale out)."),
    engine: str = typer.Option("vllm", "--engine", help="Efficiency profile name."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Calibrated profile YAML (from recommend calibrate)."),
    policy: Optional[str] = typer.Option(None, "--policy", help="Search policy YAML (default policies/search.yaml)."),
    verify: Optional[int] = typer.Option(None, "--verify", help="Verify the top K plans in the discrete-event simulator (default 3; 0 = off)."),
    emit: Optional[str] = typer.Option(None, "--emit", help="Write the plan JSON and rank 1's deployment files (vllm cmd, k8s, helm) to DIR."),
    debug: bool = typer.Option(False, "--debug", help="Show the Python traceback of an unexpected error (any command)."),
) -> None:
    """Plan LLM serving deployments. Without a subcommand: the ranked Pareto plan for --workload."""
    from recommender.cli.app import set_debug

    set_debug(debug)
    if ctx.invoked_subcommand is not None:
        return
    if workload is None:
        typer.echo(ctx.get_help())
        raise fail("give --workload FILE (e.g. examples/rag.yaml) or a subcommand (estimate, deploy, simulate, replan, calibrate)", 2)
    import math
    from pathlib import Path

    from recommender.errors import ConfigError
    from recommender.profiles import resolve_profile
    from recommender.render.plan import RENDERERS
    from recommender.search import SearchSettings, recommend
    from recommender.search.policy import load_search_policy
    from recommender.workload import Slo, load_workload

    if fmt not in RENDERERS:
        raise ConfigError(f"--format {fmt!r}: use one of {', '.join(RENDERERS)}")
    if workers < 1 or top < 1:
        raise ConfigError("--workers and --top must be >= 1")
    if trials is not None and trials < 1:
        raise ConfigError(f"--trials {trials}: give a positive number of trials (or leave it out for the policy's default)")
    if seed < 0 or seed >= 2**32:
        raise ConfigError(f"--seed {seed}: give an integer from 0 to {2**32 - 1}")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"--timeout {timeout}: give a positive number of seconds")
    w = load_workload(workload).with_slos([Slo.parse(s) for s in slo])
    settings = SearchSettings(seed=seed, trials=trials, timeout_s=timeout, storage=storage,
                              study_name=study_name, workers=workers, top=top, verify=verify)
    plan = recommend(w, settings=settings, profile=resolve_profile(engine, profile), policy=load_search_policy(policy))
    typer.echo(RENDERERS[fmt](plan))
    if plot:
        from recommender.render.plot import write_plot

        write_plot(plot, plan, plan.evaluations)
        typer.echo(f"wrote {plot}", err=True)
    if emit:
        import json

        from recommender.deploy import write_deploy_files

        out = Path(emit)
        doc = plan.to_dict()
        doc["workload"]["source"] = workload
        # one set: plan.json and rank 1's files are swapped in together (never a new plan beside old files)
        paths = write_deploy_files(doc, out, rank=1, plan_name=str(out / "plan.json"),
                                   extra_files={"plan.json": json.dumps(doc, indent=2) + "\n"})
        typer.echo(f"wrote {out / 'plan.json'} and {len(paths)} deployment files to {out}", err=True)

